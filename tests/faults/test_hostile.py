"""Hostile input (SPEC §2 identity and fidelity, §6 restore safety, §7 limits; PROTOCOL.md paths).

Paths escaping the workspace or naming `.git` (and its look-alikes) are refused; odd file
names round-trip byte for byte; the user's git configuration and the workspace's
`.gitattributes` never make a program run or a byte change; files over the size cap are
reported and never lost; files vanishing mid-scan and symlinks swapped in before (or during)
a restore never make anything outside the workspace change; a workspace removed whole is
restored into its folder made again; a write through one name of a hard link is in the
snapshot under every name. Every test hashes a canary tree outside the workspace before and
after (the `canary` fixture).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import stat
import threading
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

import shadowpoint.restore.plan as restore_module
from shadowpoint.engine import Engine
from shadowpoint.errors import ShadowpointError
from shadowpoint.kinds import RestoreMode, ToolKind
from shadowpoint.restore.safe_fs import SafeWriter
from shadowpoint.stage.scanner import Scanner
from shadowpoint.workspace import RepoPath
from tests.conftest import Exe, Link, make_tree, read_tree, wait_for
from tests.faults.support import (
    SOAK,
    command_round,
    edit_round,
    engine_command,
    engine_edit,
    expected_git_tree,
    fsck_problems,
    git,
    git_tree,
    hash_tree,
    make_canary,
    shadow_git_dir,
    start,
    start_sidecar,
    temp_leftovers,
)
from tests.rpc import RpcError, SidecarProcess

MakeEngine = Callable[..., Engine]


@pytest.fixture
def canary(tmp_path: Path) -> Iterator[Path]:
    """A tree outside the workspace; it must hash the same after the test."""
    path = make_canary(tmp_path)
    before = hash_tree(path)
    yield path
    assert hash_tree(path) == before, "something outside the workspace changed"


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return Path(os.path.realpath(make_tree(tmp_path / "work" / "proj", {"src/ok.txt": "ok\n", "a.txt": "a0\n"})))


# ---- paths in tool reports -------------------------------------------------------------------------


def _refused(sc: SidecarProcess, task: str, path: str) -> list[str | None]:
    """The error kinds of tool/begin and tool/end reporting `path` (None when accepted)."""
    kinds: list[str | None] = []
    for method in ("tool/begin", "tool/end"):
        try:
            sc.call(method, {"taskId": task, "tool": "write_to_file", "kind": "edit", "paths": [path]})
            kinds.append(None)
        except RpcError as exc:
            kinds.append(exc.kind)
    return kinds


def test_paths_leaving_the_workspace_or_naming_git_are_refused(root: Path, canary: Path, tmp_path: Path,
                                                               docs: Path) -> None:
    (root / "link_out").symlink_to(canary)  # a folder link leading outside
    (root / "src" / "up").symlink_to("../../../canary")  # relative, via a subfolder
    (root / "inner").symlink_to("src")  # a link that stays inside: allowed
    (root / "nested" / ".git").mkdir(parents=True)  # a nested repository
    (root / "nested" / "file.txt").write_text("nested\n")
    (root / ".git").mkdir()
    (root / ".git" / "config").write_text("[core]\n")
    before_git = hash_tree(root / ".git")
    hostile = [
        "../outside.txt", "src/../../outside.txt", "a/b/../../../x", "..", ".", "/etc/passwd",
        str(canary / "secret.txt"), str(tmp_path / "work" / "proj-sibling" / "x"),
        "link_out/secret.txt", "link_out/sub/deep.txt", f"{root}/link_out/secret.txt", "src/up/secret.txt",
        ".git/config", ".GIT/config", ".Git/hooks/pre-commit", "src/.git/x", ".git",
        ".git\u200c/config", ".g\u200cit/config", "\ufeff.git/config", ".git\u200d",
        "git~1/config", "GIT~1/hooks/x", ".git./config", ".git /config", ".git::$INDEX_ALLOCATION/x",
        "nested/file.txt", "nested", f"{root}/nested/file.txt", "", "a\0b",
    ]
    sc = start_sidecar(root, "t", ts=1)
    try:
        sc.call("round/begin", {"taskId": "t"})
        verdicts = {p: _refused(sc, "t", p) for p in hostile}
        wrong = {p: k for p, k in verdicts.items() if k != ["path_outside_workspace"] * 2}
        assert not wrong, f"not refused with path_outside_workspace: {wrong}"
        # plain paths, a link that stays inside and odd-but-inside spellings are accepted
        for ok in ("src/ok.txt", f"{root}/a.txt", "src/./ok.txt", "src//ok.txt", "inner/ok.txt", "src/new/x.txt",
                   ".gitignore", ".github/workflows/ci.yml", "git~2/x", "x.git/y"):
            assert _refused(sc, "t", ok) == [None, None], ok
        make_tree(root, {"src/ok.txt": "ok2\n"})
        cp = sc.call("round/end", {"taskId": "t", "ts": 2})["checkpoint"]
        tree = git_tree(shadow_git_dir(docs, root), cp["hash"])
        assert not any(".git/" in p or p.startswith("nested/") for p in tree), sorted(tree)
        assert tree["src/ok.txt"] == expected_git_tree({"x": b"ok2\n"})["x"]
        assert "link_out" in tree and tree["link_out"][0] == "120000", "a link is stored as a link"
        sc.call("checkpoint/restore", {"taskId": "t", "ts": 1, "mode": "files"})
    finally:
        sc.close()
    assert not (tmp_path / "outside.txt").exists() and not (tmp_path / "work" / "outside.txt").exists()
    assert hash_tree(root / ".git") == before_git
    assert (root / "nested" / "file.txt").read_text() == "nested\n"


def test_hostile_task_ids_stay_inside_the_docs_root(root: Path, canary: Path, docs: Path, tmp_path: Path) -> None:
    ids = ["../../escape", "/abs/task", "a/b", "new\nline", "bad\udcff", ".git", "x" * 300, "con", "..", "t.lock"]
    sc = start_sidecar(root)
    try:
        for n, task in enumerate(ids):
            sc.call("task/start", {"taskId": task, "ts": 1})
            sc.wait_ready(task)
            cp = edit_round(sc, task, 2, ["a.txt"], lambda n=n: make_tree(root, {"a.txt": f"a{n}\n"}))
            listed = sc.call("checkpoint/list", {"taskId": task})["checkpoints"]
            assert [c["hash"] for c in listed][-1] == cp["hash"]
    finally:
        sc.close()
    inside = {p.resolve() for p in (docs / "tasks").iterdir()}
    assert len(inside) == len(ids), "one folder per task, all directly under tasks/"
    assert sorted(os.listdir(tmp_path)) == sorted(["canary", "docs", "home", "work"])
    assert fsck_problems(shadow_git_dir(docs, root)) == []


# ---- odd file names --------------------------------------------------------------------------------


ODD_NAMES = [b"new\nline.txt", b"bad\xff\xfe.txt", b"dir\xe9/inner.txt", b"tab\there.txt", b" lead.txt",
             b"trail .txt", b"back\\slash.txt", "\u00fcber/\u00df.txt".encode(), b'quote"d.txt', b"star*?.txt",
             b"\x01ctl.txt", b"-dash.txt", b"#hash.txt", b"!bang.txt", b"emoji\xf0\x9f\x99\x82.txt"]


def _odd_tree(version: str) -> dict[str, Any]:
    return {os.fsdecode(n): f"{version} {os.fsdecode(n)!r}\n".encode("utf-8", "surrogateescape") for n in ODD_NAMES}


def test_odd_file_names_round_trip_byte_for_byte(root: Path, canary: Path, docs: Path) -> None:
    shutil.rmtree(root / "src")
    (root / "a.txt").unlink()
    make_tree(root, _odd_tree("v0"))
    base = read_tree(root)
    git_dir = shadow_git_dir(docs, root)
    sc = start_sidecar(root, "t", ts=1)
    try:
        first = sc.call("checkpoint/list", {"taskId": "t"})["checkpoints"][0]
        assert git_tree(git_dir, first["hash"]) == expected_git_tree(base), "the baseline holds every odd name"
        # an edit round reporting them (JSON carries non-UTF-8 bytes as \\udcXX escapes)
        names = [os.fsdecode(n) for n in ODD_NAMES]
        cp = edit_round(sc, "t", 2, names, lambda: make_tree(root, _odd_tree("v1")))
        assert git_tree(git_dir, cp["hash"]) == expected_git_tree(read_tree(root))
        diff = sc.call("checkpoint/diff", {"taskId": "t", "from": 1, "to": 2})
        assert sorted(f["path"] for f in diff["files"]) == sorted(names)
        assert all(f["status"] == "modified" for f in diff["files"])
        # a command deletes some and renames one: the rescan sees it all
        def delete_and_rename() -> None:
            os.unlink(root / names[0])
            os.unlink(root / names[1])
            os.rename(root / names[2], root / "renamed\nfile")

        cp3 = command_round(sc, "t", 3, delete_and_rename)
        after3 = read_tree(root)
        assert git_tree(git_dir, cp3["hash"]) == expected_git_tree(after3)
        out = sc.call("checkpoint/restore", {"taskId": "t", "ts": 1, "mode": "files"})
        # the odd names come back and the command's rename is undone too (PROTOCOL 1.1 scope)
        assert read_tree(root) == base
        assert names[0] in out["files"]["restored"] and names[1] in out["files"]["restored"]
        assert out["files"]["deleted"] == ["renamed\nfile"]
        sc.call("checkpoint/undoRestore", {"taskId": "t"})
        assert read_tree(root) == after3
    finally:
        sc.close()
    assert fsck_problems(git_dir) == []
    assert not temp_leftovers(root)


# ---- the user's git configuration and .gitattributes ---------------------------------------------------


def _marker_script(bin_dir: Path, markers: Path, name: str) -> str:
    script = bin_dir / name
    script.write_text(f"#!/bin/sh\ntouch '{markers}/{name}'\ncat\n")
    script.chmod(0o755)
    return str(script)


def test_user_git_config_and_gitattributes_never_run_or_convert(root: Path, canary: Path, tmp_path: Path,
                                                                 docs: Path) -> None:
    home = Path(os.environ["HOME"])
    markers = tmp_path / "markers"
    markers.mkdir()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    run = {n: _marker_script(bin_dir, markers, n) for n in
           ("clean", "smudge", "process", "fsmonitor", "gpg", "pager", "ssh", "diffext", "textconv", "askpass",
            "editor", "credential")}
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    for hook in ("pre-commit", "post-commit", "commit-msg", "reference-transaction", "post-checkout",
                 "post-index-change", "pre-auto-gc", "post-rewrite"):
        _marker_script(hooks, markers, hook)
    (home / "ignore-all").write_text("*\n!*/\n")
    (home / "attrs").write_text("* filter=evil text eol=crlf\n")
    hostile = f"""[core]
\tautocrlf = true
\teol = crlf
\tsafecrlf = true
\texcludesFile = {home}/ignore-all
\tattributesFile = {home}/attrs
\tfsmonitor = {run['fsmonitor']}
\thooksPath = {hooks}
\tsymlinks = false
\tfilemode = false
\tignorecase = true
\tpager = {run['pager']}
\tsshCommand = {run['ssh']}
\taskPass = {run['askpass']}
\teditor = {run['editor']}
\tbigFileThreshold = 1
\tcompression = 9
[filter "evil"]
\tclean = {run['clean']}
\tsmudge = {run['smudge']}
\tprocess = {run['process']}
\trequired = true
[diff]
\texternal = {run['diffext']}
[diff "evil"]
\ttextconv = {run['textconv']}
[commit]
\tgpgSign = true
[gpg]
\tprogram = {run['gpg']}
[credential]
\thelper = {run['credential']}
[user]
\tname = Not Us
\temail = hostile@example.invalid
[gc]
\tauto = 1
[init]
\tdefaultBranch = evil
"""
    (home / ".gitconfig").write_text(hostile)
    (home / ".config" / "git").mkdir(parents=True)
    (home / ".config" / "git" / "config").write_text(hostile)
    (home / ".config" / "git" / "attributes").write_text("* filter=evil\n")
    # the workspace is the user's own repository, with hostile settings of its own
    (root / ".git" / "hooks").mkdir(parents=True)
    (root / ".git" / "config").write_text(hostile)
    (root / ".git" / "info").mkdir()
    (root / ".git" / "info" / "attributes").write_text("* filter=evil\n")
    (root / ".git" / "info" / "exclude").write_text("*\n")
    for hook in os.listdir(hooks):
        shutil.copy2(hooks / hook, root / ".git" / "hooks" / hook)
    user_git = hash_tree(root / ".git")
    files = {
        ".gitattributes": "* filter=evil diff=evil\n*.txt text eol=crlf\n*.c ident\n*.bin binary\n",
        "crlf.txt": b"one\r\ntwo\r\n", "lf.txt": b"one\ntwo\n", "mixed.txt": b"a\r\nb\nc\r",
        "id.c": b"/* $Id$ */\nint x;\n", "data.blob": bytes(range(256)), "run.sh": Exe("#!/bin/sh\necho hi\n"),
        "link": Link("lf.txt"), "sub/deep.txt": b"deep\r\n",
    }
    make_tree(root, files)
    env = {"GIT_DIR": str(tmp_path / "elsewhere"), "GIT_WORK_TREE": str(canary), "GIT_INDEX_FILE": str(canary / "idx"),
           "GIT_OBJECT_DIRECTORY": str(canary / "objects"), "GIT_ALTERNATE_OBJECT_DIRECTORIES": str(canary),
           "GIT_CONFIG_GLOBAL": str(home / ".gitconfig"), "GIT_CONFIG_SYSTEM": str(home / ".gitconfig"),
           "GIT_CONFIG_PARAMETERS": "'core.autocrlf'='true' 'core.fsmonitor'='" + run["fsmonitor"] + "'",
           "GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": "filter.evil.clean", "GIT_CONFIG_VALUE_0": run["clean"],
           "GIT_EXTERNAL_DIFF": run["diffext"], "GIT_PAGER": run["pager"], "GIT_SSH_COMMAND": run["ssh"],
           "GIT_ASKPASS": run["askpass"], "GIT_EDITOR": run["editor"], "GIT_TRACE": str(canary / "trace"),
           "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    git_dir = shadow_git_dir(docs, root)
    sc = start_sidecar(root, "t", ts=1, env=env)
    try:
        base = read_tree(root)
        first = sc.call("checkpoint/list", {"taskId": "t"})["checkpoints"][0]
        assert git_tree(git_dir, first["hash"]) == expected_git_tree(base), (
            "byte-exact: no eol conversion, no ident, no filter, nothing ignored by the user's excludesFile")
        cp = edit_round(sc, "t", 2, ["crlf.txt", "id.c"],
                        lambda: make_tree(root, {"crlf.txt": b"changed\r\n", "id.c": b"$Id: old $\n"}))
        assert git_tree(git_dir, cp["hash"]) == expected_git_tree(read_tree(root))
        command_round(sc, "t", 3, lambda: make_tree(root, {"lf.txt": b"x\ny\n", "sub/deep.txt": None}))
        diff = sc.call("checkpoint/diff", {"taskId": "t", "from": 1})
        byname = {f["path"]: f for f in diff["files"]}
        assert byname["crlf.txt"]["before"] == "one\r\ntwo\r\n" and byname["crlf.txt"]["after"] == "changed\r\n"
        sc.call("checkpoint/restore", {"taskId": "t", "ts": 1, "mode": "files"})
        restored = read_tree(root)
        for path in ("crlf.txt", "id.c"):
            assert restored[path] == base[path], f"{path} restored byte for byte"
        commit = sc.call("checkpoint/list", {"taskId": "t"})["checkpoints"][-1]["hash"]
        author = git(git_dir, "cat-file", "commit", commit).stdout.decode()
        assert "shadowpoint Checkpoint" in author and "Not Us" not in author and "gpgsig" not in author
    finally:
        sc.close()
    assert sorted(os.listdir(markers)) == [], f"programs ran: {sorted(os.listdir(markers))}"
    assert hash_tree(root / ".git") == user_git, "the user's .git is never touched"
    assert not (tmp_path / "elsewhere").exists()
    assert fsck_problems(git_dir) == []


# ---- files over the size cap ----------------------------------------------------------------------------


def test_files_over_the_size_cap_are_reported_and_never_lost(root: Path, canary: Path, docs: Path) -> None:
    cap = 1000
    make_tree(root, {"big.txt": b"B" * 5000, "small.txt": b"s" * 10})
    git_dir = shadow_git_dir(docs, root)
    sc = start_sidecar(root, "t", ts=1, settings={"maxFileBytes": cap})
    try:
        base = sc.call("checkpoint/list", {"taskId": "t"})["checkpoints"][0]
        assert {w["path"]: w["reason"] for w in base["warnings"]} == {"big.txt": "over the size cap"}
        assert "big.txt" not in git_tree(git_dir, base["hash"])
        # an edit tool writes a huge file (force-added paths are capped too) and grows a small one
        cp = edit_round(sc, "t", 2, ["huge.txt", "small.txt"],
                        lambda: make_tree(root, {"huge.txt": b"H" * 2000, "small.txt": b"S" * 3000}))
        assert {w["path"]: w["reason"] for w in cp["warnings"]} == {"huge.txt": "over the size cap",
                                                                    "small.txt": "over the size cap"}
        tree = git_tree(git_dir, cp["hash"])
        assert "huge.txt" not in tree and "small.txt" not in tree
        # a restore to the baseline: the files too big to be saved first are left alone
        with pytest.raises(RpcError) as err:
            sc.call("checkpoint/restore", {"taskId": "t", "ts": 1, "mode": "files"})
        assert err.value.kind == "restore_failed" and "small.txt" in str(err.value)
        disk = read_tree(root)
        assert disk["big.txt"] == b"B" * 5000 and disk["huge.txt"] == b"H" * 2000
        assert disk["small.txt"] == b"S" * 3000, "a file the safety checkpoint could not hold is not overwritten"
    finally:
        sc.close()
    # a task that only ran commands resets every tracked file: the big ones still stay
    sc = start_sidecar(root, "cmd", ts=1, settings={"maxFileBytes": cap})
    try:
        make_tree(root, {"small.txt": b"s" * 10})
        command_round(sc, "cmd", 2, lambda: make_tree(root, {"more.txt": b"M" * 4000, "new.txt": "n"}))
        out = sc.call("checkpoint/restore", {"taskId": "cmd", "ts": 1, "mode": "files"})
        assert out["files"]["deleted"] == ["new.txt"]
        disk = read_tree(root)
        assert disk["big.txt"] == b"B" * 5000 and disk["huge.txt"] == b"H" * 2000 and disk["more.txt"] == b"M" * 4000
    finally:
        sc.close()


# ---- files vanishing mid-scan --------------------------------------------------------------------------


def test_files_vanishing_during_a_rescan(make_engine: MakeEngine, workspace: Path, canary: Path, docs: Path) -> None:
    original = {f"d{i % 30}/f{i}.txt": f"content {i}\n" * 20 for i in range(2500)}
    make_tree(workspace, original)
    eng = make_engine(workspace)
    start(eng)
    rng = random.Random(55)
    git_dir = shadow_git_dir(docs, workspace)
    for it in range(3 * SOAK):
        # every file gets new content (so the rescan reads them all) while a thread deletes some
        version = {p: f"v{it} {p}\n" * 20 for p in original}
        make_tree(workspace, version)
        victims = rng.sample(sorted(original), 400)
        stop = threading.Event()

        def delete(victims: list[str] = victims, stop: threading.Event = stop) -> None:
            for n, p in enumerate(victims):
                if stop.is_set():
                    return
                (workspace / p).unlink(missing_ok=True)
                if n % 10 == 0:
                    stop.wait(0.002)  # spread over the scan

        racer = threading.Thread(target=delete)
        racer.start()
        cp = engine_command(eng, workspace, 10 + it)
        stop.set()
        racer.join()
        tree = git_tree(git_dir, cp.hashes[eng.first_root])
        expected = expected_git_tree({p: v.encode() for p, v in version.items()})
        survivors = {p for p in original if (workspace / p).exists()}
        assert survivors <= set(tree), "every file that was never deleted is in the snapshot"
        assert set(tree) <= set(original)
        for p, entry in tree.items():
            assert entry == expected[p], f"{p}: a snapshot holds the file's content, never a torn one"
        reasons = {w.reason for w in cp.warnings}
        assert reasons <= {"vanished while being read"}, reasons
        make_tree(workspace, {p: v for p, v in version.items() if not (workspace / p).exists()})
    assert fsck_problems(git_dir) == []


def test_a_file_vanishing_between_walk_and_read_is_a_warning(make_engine: MakeEngine, workspace: Path,
                                                             canary: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    make_tree(workspace, {"keep.txt": "k\n", "gone.txt": "g\n", "d/also.txt": "a\n"})
    eng = make_engine(workspace)
    start(eng)
    real = Scanner._read_file

    def vanishing(self: Scanner, path: RepoPath) -> Any:  # the fault seam: deleted right before the read
        if path in ("gone.txt", "d/also.txt"):
            (workspace / path).unlink(missing_ok=True)
        return real(self, path)

    make_tree(workspace, {"gone.txt": "g2\n", "d/also.txt": "a2\n", "keep.txt": "k2\n"})
    monkeypatch.setattr(Scanner, "_read_file", vanishing)
    cp = engine_command(eng, workspace, 2)
    assert sorted((w.path, w.reason) for w in cp.warnings) == [
        ("d/also.txt", "vanished while being read"), ("gone.txt", "vanished while being read")]
    monkeypatch.undo()
    assert eng.list_checkpoints("t").checkpoints[-1].warnings == cp.warnings
    restored = eng.restore("t", 1, RestoreMode.FILES).to_wire()
    assert read_tree(workspace) == {"keep.txt": b"k\n", "gone.txt": b"g\n", "d/also.txt": b"a\n"}
    assert restored["files"] is not None


# ---- symlink swaps before and during a restore -----------------------------------------------------------


def test_symlink_swaps_right_before_a_restore(make_engine: MakeEngine, workspace: Path, canary: Path) -> None:
    make_tree(workspace, {"a.txt": "a0\n", "src/lib/x.py": "x0\n", "src/lib/y.py": "y0\n", "top/t.txt": "t0\n",
                          "keep.txt": "keep\n"})
    eng = make_engine(workspace)
    start(eng)
    engine_edit(eng, workspace, 2, {"a.txt": "a1\n", "src/lib/x.py": "x1\n", "top/t.txt": "t1\n"})
    # after the last round: files and folders swapped for links leading outside
    (workspace / "a.txt").unlink()
    (workspace / "a.txt").symlink_to(canary / "secret.txt")
    shutil.rmtree(workspace / "src" / "lib")
    (workspace / "src" / "lib").symlink_to(canary / "sub")
    shutil.rmtree(workspace / "top")
    (workspace / "top").symlink_to(canary)
    out = eng.restore("t", 1, RestoreMode.FILES).to_wire()
    assert out["files"] is not None
    disk = read_tree(workspace)
    assert disk["a.txt"] == b"a0\n" and disk["src/lib/x.py"] == b"x0\n" and disk["top/t.txt"] == b"t0\n"
    assert not (workspace / "src" / "lib").is_symlink() and not (workspace / "top").is_symlink()
    # undo puts the links back as links (still never followed)
    eng.undo_restore("t")
    assert os.readlink(workspace / "a.txt") == str(canary / "secret.txt")
    assert os.readlink(workspace / "top") == str(canary)
    assert not temp_leftovers(workspace)


def test_symlink_swap_during_a_restore(make_engine: MakeEngine, workspace: Path, canary: Path,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A folder swapped for a link to outside while the restore writes into it: the file lands
    in the folder the restore opened (moved aside, still inside), never outside."""
    files = {f"src/m{i}.py": f"m{i} v0\n" for i in range(20)}
    make_tree(workspace, {**files, "other/o.txt": "o0\n"})
    eng = make_engine(workspace)
    start(eng)
    engine_edit(eng, workspace, 2, {p: v.replace("v0", "v1") for p, v in files.items()})
    swapped = threading.Event()

    class Swapper:
        def before_rename(self, path: RepoPath, temp_name: str) -> None:
            if not swapped.is_set() and path.startswith("src/"):
                swapped.set()
                os.rename(workspace / "src", workspace / "moved-src")
                (workspace / "src").symlink_to(canary / "sub")

    class HookedWriter(SafeWriter):
        def __init__(self, root: Path, **_: Any) -> None:
            super().__init__(root, fault_hook=Swapper())

    monkeypatch.setattr(restore_module, "SafeWriter", HookedWriter)
    eng.restore("t", 1, RestoreMode.FILES)
    assert swapped.is_set()
    # the file being renamed went into the folder the restore had open (now moved-src); the
    # link planted in its place was replaced by a real folder for the rest, never followed
    assert not (workspace / "src").is_symlink()
    restored = {**read_tree(workspace / "moved-src"), **read_tree(workspace / "src")}
    assert restored == {p.split("/", 1)[1]: v.encode() for p, v in files.items()}
    assert not temp_leftovers(workspace)


def test_a_link_in_a_checkpoint_is_restored_as_a_link(make_engine: MakeEngine, workspace: Path,
                                                      canary: Path) -> None:
    make_tree(workspace, {"exit": Link(str(canary)), "rel": Link("../../canary/secret.txt"), "f.txt": "f\n"})
    eng = make_engine(workspace)
    start(eng)

    def replace_the_links() -> None:
        os.unlink(workspace / "exit")
        os.unlink(workspace / "rel")
        make_tree(workspace, {"exit/inside.txt": "now a folder\n", "exit/debug.log": "untracked, ignored\n",
                              "rel": "now a file\n"})

    engine_command(eng, workspace, 2, replace_the_links)
    # an ignored file the snapshot does not hold is in the way of the link: refused, kept
    with pytest.raises(ShadowpointError) as err:
        eng.restore("t", 1, RestoreMode.FILES)
    assert err.value.kind == "restore_failed" and "exit" in str(err.value)
    assert (workspace / "exit" / "debug.log").read_text() == "untracked, ignored\n"
    assert os.readlink(workspace / "rel") == "../../canary/secret.txt", "the other paths were restored"
    os.unlink(workspace / "exit" / "debug.log")
    eng.restore("t", 1, RestoreMode.FILES)
    assert os.readlink(workspace / "exit") == str(canary)
    assert stat.S_ISLNK(os.lstat(workspace / "rel").st_mode)
    assert read_tree(workspace) == {"exit": Link(str(canary)), "rel": Link("../../canary/secret.txt"), "f.txt": b"f\n"}


def test_json_surrogates_reach_the_disk_unchanged(root: Path, canary: Path) -> None:
    """The wire form of a non-UTF-8 name (\\udcXX) names exactly those bytes on disk."""
    name = os.fsdecode(b"raw\xff\xfe.bin")
    line = json.dumps({"p": name})
    assert "\\udcff" in line and json.loads(line)["p"] == name
    sc = start_sidecar(root, "t", ts=1)
    try:
        cp = edit_round(sc, "t", 2, [name], lambda: (root / name).write_bytes(b"\x00\x01"))
        diff = sc.call("checkpoint/diff", {"taskId": "t", "from": 1, "to": 2})
        assert [f["path"] for f in diff["files"]] == [name]
        assert diff["files"][0]["binary"] is True
        sc.call("checkpoint/restore", {"taskId": "t", "ts": 1, "mode": "files"})
        assert not (root / name).exists()
        sc.call("checkpoint/undoRestore", {"taskId": "t"})
        assert (root / os.fsencode(name).decode("utf-8", "surrogateescape")).read_bytes() == b"\x00\x01"
        assert os.fsencode(name) in os.listdir(os.fsencode(root))
        assert cp["hash"]
    finally:
        sc.close()


# ---- a workspace removed whole -------------------------------------------------------------------------


@pytest.mark.parametrize("watcher", [False, True], ids=["rescan", "watcher"])
def test_a_workspace_removed_whole_is_restored_into_its_folder_made_again(root: Path, canary: Path,
                                                                          watcher: bool) -> None:
    """An agent that runs `rm -rf` on its own project (the folder itself, not its contents):
    the round records every file deleted, and a restore makes the root folder again (only it)
    and writes every file back; a dry run writes nothing, not even the folder."""
    make_tree(root, {"tools/run.sh": Exe(b"#!/bin/sh\n"), "link": Link("a.txt")})
    before = read_tree(root)
    sc = start_sidecar(root, "t", ts=1, settings={"watcher": watcher})
    try:
        gone = command_round(sc, "t", 2, lambda: shutil.rmtree(root))
        assert gone["hash"] and not gone["reused"]
        dry = sc.call("checkpoint/restore", {"taskId": "t", "ts": 1, "mode": "files", "dryRun": True})
        assert sorted(dry["files"]["restored"]) == sorted(before) and dry["files"]["safety"] is None
        assert not os.path.lexists(root), "a dry run makes nothing"
        done = sc.call("checkpoint/restore", {"taskId": "t", "ts": 1, "mode": "files"})
        assert sorted(done["files"]["restored"]) == sorted(before) and done["files"]["deleted"] == []
        assert read_tree(root) == before
        assert stat.S_IMODE(os.stat(root).st_mode) & 0o700 == 0o700
        # the rounds go on in the folder made again, and the restore can itself be undone
        edit_round(sc, "t", 3, ["new.txt"], lambda: (root / "new.txt").write_text("new\n"))
        diff = sc.call("checkpoint/diff", {"taskId": "t", "from": 1})
        assert [(f["path"], f["status"]) for f in diff["files"]] == [("new.txt", "added")]
        sc.call("checkpoint/undoRestore", {"taskId": "t"})
        assert read_tree(root) == {"new.txt": b"new\n"}, "undo puts back the emptied folder (and the new file)"
    finally:
        sc.close()


def test_a_restore_never_makes_the_parents_of_a_removed_workspace(root: Path, canary: Path,
                                                                  tmp_path: Path) -> None:
    """The root's parent gone too (an unmounted drive, a moved tree) is no place to write: the
    restore is refused with `no_workspace` and makes nothing; nor is the root made through a
    link put where its parent was. Once the parent is back, the restore works."""
    before = read_tree(root)
    sc = start_sidecar(root, "t", ts=1)
    try:
        command_round(sc, "t", 2, lambda: shutil.rmtree(root.parent))
        with pytest.raises(RpcError) as err:
            sc.call("checkpoint/restore", {"taskId": "t", "ts": 1, "mode": "files"})
        assert err.value.kind == "no_workspace" and str(root) in str(err.value)
        assert not os.path.lexists(root.parent)
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir()
        root.parent.symlink_to(elsewhere)
        with pytest.raises(RpcError) as err:
            sc.call("checkpoint/restore", {"taskId": "t", "ts": 1, "mode": "files"})
        assert err.value.kind == "no_workspace" and "leads to" in str(err.value)
        assert list(elsewhere.iterdir()) == [], "nothing made through the link"
        root.parent.unlink()
        root.parent.mkdir()
        sc.call("checkpoint/restore", {"taskId": "t", "ts": 1, "mode": "files"})
        assert read_tree(root) == before
        assert sorted(sc.call("checkpoint/undoRestore", {"taskId": "t"})["files"]["deleted"]) == sorted(before)
    finally:
        sc.close()


def test_the_watcher_starts_again_once_a_removed_workspace_is_back(make_engine: MakeEngine, workspace: Path,
                                                                   canary: Path) -> None:
    """The watcher cannot watch a root that is gone, and rounds rescan meanwhile; once the root
    is back (the agent's `git clone` into the same folder, or a restore), the next rescan
    starts the watcher again before it walks, and the rounds after it are the watcher's."""
    make_tree(workspace, {"a.txt": "a\n", "d/b.txt": "b\n"})
    eng = make_engine(workspace, watcher=True)
    start(eng)
    watcher = eng.roots["proj"].watcher
    assert watcher is not None and watcher.is_running
    with capture_logs() as logs:
        engine_command(eng, workspace, 2, lambda: shutil.rmtree(workspace))
        # the watcher's threads end with the root; its own restart finds the root gone
        wait_for(lambda: any(e["event"] == "watcher.degraded" and e.get("kind") == "start_failed" for e in logs),
                 "the watcher never tried to start again")
        assert not watcher.is_running
        back = {"a.txt": b"a again\n", "e/c.txt": b"c\n"}
        cp = engine_command(eng, workspace, 3, lambda: make_tree(workspace, back))
        assert [e["event"] for e in logs if e["event"] == "watcher.root_back"] == ["watcher.root_back"]
        assert watcher.is_running and watcher.is_healthy
        assert cp.hashes == eng.list_checkpoints("t").checkpoints[-1].hashes
        assert eng.diff("t", 3).to_wire()["files"] == [], "the round found the root as it is back"
        del logs[:]
        engine_command(eng, workspace, 4, lambda: (workspace / "e/c.txt").write_text("c2\n"))
    rounds = [e for e in logs if e["event"] == "round.checkpointed"]
    assert len(rounds) == 1 and rounds[0]["rescan"] is False, f"the watcher recorded the change: {rounds}"
    changed = eng.diff("t", 3, 4).to_wire()["files"]
    assert [(f["path"], f["after"]) for f in changed] == [("e/c.txt", "c2\n")]


# ---- hard links ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("watcher", [True, False], ids=["watcher", "rescan"])
def test_a_write_through_one_hard_link_is_in_the_snapshot_under_every_name(make_engine: MakeEngine,
                                                                           workspace: Path, canary: Path,
                                                                           watcher: bool) -> None:
    """Two names of one file: a write through one changes both, but the watcher's event (and
    an edit tool's report) names only the one written. Every checkpoint holds the new content
    under both names, as a rescan (and git) sees them."""
    make_tree(workspace, {"run.sh": "v1\n", "other.txt": "o\n"})
    eng = make_engine(workspace, watcher=watcher)
    start(eng)
    engine_command(eng, workspace, 2, lambda: os.link(workspace / "run.sh", workspace / "alias.sh"))

    def append(name: str, text: str) -> None:
        with open(workspace / name, "a") as fh:
            fh.write(text)

    for ts, name, text, by_edit in ((3, "alias.sh", "v2\n", False), (4, "run.sh", "v3\n", True),
                                    (5, "alias.sh", "v4\n", True)):
        if by_edit:
            eng.begin_round("t")
            eng.tool_began("t", "write_to_file", ToolKind.EDIT, [name])
            append(name, text)
            eng.tool_ended("t", "write_to_file", [name])
            cp = eng.end_round("t", ts)
        else:
            cp = engine_command(eng, workspace, ts, partial(append, name, text))
        assert cp is not None
        content = (workspace / "run.sh").read_bytes()
        tree = git_tree(shadow_git_dir(eng.options.docs_dir, workspace), cp.hashes[eng.first_root])
        assert tree["run.sh"] == tree["alias.sh"] == expected_git_tree({"x": content})["x"], f"round {ts}"
        assert eng.diff("t", ts).to_wire()["files"] == [], f"round {ts} holds what a rescan finds"

    # a file a restore wrote (a new inode, its stat not yet known) linked again, and written
    # through the new name alone: the restored name's inode was not known, so it was missed
    eng.restore("t", 3, RestoreMode.FILES, paths=["run.sh"])
    eng.begin_round("t")
    eng.tool_began("t", "write_to_file", ToolKind.EDIT, ["again.sh"])
    os.link(workspace / "run.sh", workspace / "again.sh")
    append("again.sh", "v5\n")
    eng.tool_ended("t", "write_to_file", ["again.sh"])
    cp = eng.end_round("t", 6)
    assert cp is not None
    tree = git_tree(shadow_git_dir(eng.options.docs_dir, workspace), cp.hashes[eng.first_root])
    assert tree["run.sh"] == tree["again.sh"] == expected_git_tree({"x": b"v1\nv2\nv5\n"})["x"]
    assert eng.diff("t", 6).to_wire()["files"] == [], "round 6 holds what a rescan finds"
