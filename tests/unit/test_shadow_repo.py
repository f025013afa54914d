"""Unit tests for `shadowpoint.store.shadow_repo`: tree patching, commits, isolation, gc and repair.

Real pygit2 repositories on temp dirs; the git CLI is used only as an independent witness.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import random
import subprocess
import sys
import threading
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pygit2
import pytest

from shadowpoint.errors import RepoError, ShadowRepoMismatchError
from shadowpoint.store.shadow_repo import ShadowRepo
from shadowpoint.store.values import (
    COMMITTER_EMAIL,
    COMMITTER_NAME,
    HEAD_REF,
    MODE_EXEC,
    MODE_FILE,
    MODE_LINK,
    DeltaRecord,
    TreeEntry,
    ref_component,
    task_ref,
)
from shadowpoint.workspace import RepoPath


@pytest.fixture
def repo(tmp_path: Path, workspace: Path) -> Iterator[ShadowRepo]:
    r = ShadowRepo.open_or_init(tmp_path / "shadow" / ".git", workspace)
    yield r
    r.close()


def git(repo: ShadowRepo, *args: str, check: bool = True, flush: bool = True) -> subprocess.CompletedProcess[str]:
    """The git CLI on the shadow repo; first, unless not `flush`, the handle writes the trees and
    commits it holds in memory (as it does before a ref moves: `ShadowRepo.flush`)."""
    if flush:
        repo.flush()
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env["GIT_CONFIG_NOSYSTEM"] = "1"
    return subprocess.run(
        ["git", f"--git-dir={repo.git_dir}", *args], capture_output=True, text=True, env=env, check=check
    )


def blob(repo: ShadowRepo, data: str | bytes, mode: int = MODE_FILE) -> TreeEntry:
    return TreeEntry(repo.write_blob(data.encode() if isinstance(data, str) else data), mode)


def build(repo: ShadowRepo, files: dict[str, TreeEntry]) -> str | None:
    return repo.patch_tree(None, {RepoPath(p): e for p, e in files.items()})


# ---- patch_tree -------------------------------------------------------------------------------


def test_patch_adds_modifies_and_deletes_deep_paths(repo: ShadowRepo) -> None:
    a, b, c = blob(repo, "a"), blob(repo, "b"), blob(repo, "c")
    t1 = build(repo, {"x/y/z/deep.txt": a, "x/y/other.txt": b, "top.txt": c})
    assert repo.list_tree(t1) == {"x/y/z/deep.txt": a, "x/y/other.txt": b, "top.txt": c}

    a2 = blob(repo, "a2", MODE_EXEC)
    t2 = repo.patch_tree(t1, {RepoPath("x/y/z/deep.txt"): a2, RepoPath("x/y/other.txt"): None,
                              RepoPath("p/q/r/s/new.txt"): b})
    assert repo.list_tree(t2) == {"x/y/z/deep.txt": a2, "top.txt": c, "p/q/r/s/new.txt": b}
    # the base tree is untouched
    assert repo.list_tree(t1) == {"x/y/z/deep.txt": a, "x/y/other.txt": b, "top.txt": c}
    assert repo.lookup(t2, RepoPath("x/y/z/deep.txt")) == a2
    assert repo.lookup(t2, RepoPath("x/y/other.txt")) is None
    assert repo.lookup(None, RepoPath("top.txt")) is None


def test_patch_replaces_file_by_dir_and_dir_by_file_in_one_patch(repo: ShadowRepo) -> None:
    f, g, h = blob(repo, "f"), blob(repo, "g"), blob(repo, "h")
    link = blob(repo, "target", MODE_LINK)
    base = build(repo, {"thing": f, "dir/one": g, "dir/sub/two": h, "keep": h})
    for order in (
        {"thing": None, "thing/inner.txt": g, "dir": link, "dir/one": None, "dir/sub/two": None},
        {"thing/inner.txt": g, "thing": None, "dir/sub/two": None, "dir/one": None, "dir": link},
    ):
        new = repo.patch_tree(base, {RepoPath(p): e for p, e in order.items()})
        expected = {"thing/inner.txt": g, "dir": link, "keep": h}
        assert repo.list_tree(new) == expected
        assert new == build(repo, expected)


def test_patch_setting_file_over_dir_drops_the_dir(repo: ShadowRepo) -> None:
    f, g = blob(repo, "f"), blob(repo, "g")
    base = build(repo, {"d/a": f, "d/b/c": g})
    new = repo.patch_tree(base, {RepoPath("d"): f})
    assert repo.list_tree(new) == {"d": f}
    new2 = repo.patch_tree(new, {RepoPath("d/e/f"): g})
    assert repo.list_tree(new2) == {"d/e/f": g}


def test_deleting_last_file_removes_empty_dirs(repo: ShadowRepo, tmp_path: Path) -> None:
    f, g = blob(repo, "f"), blob(repo, "g")
    base = build(repo, {"a/b/c/only.txt": f, "z.txt": g})
    new = repo.patch_tree(base, {RepoPath("a/b/c/only.txt"): None})
    assert repo.list_tree(new) == {"z.txt": g}
    assert new == build(repo, {"z.txt": g})
    # git itself sees no empty tree entry
    commit = repo.commit(new, [], "m", "t")
    out = git(repo, "ls-tree", "-r", "-t", "--name-only", commit).stdout.split()
    assert out == ["z.txt"]


def test_empty_result_is_none(repo: ShadowRepo) -> None:
    f = blob(repo, "f")
    base = build(repo, {"a/b": f, "c": f})
    assert repo.patch_tree(base, {RepoPath("a/b"): None, RepoPath("c"): None}) is None
    assert repo.patch_tree(None, {}) is None
    assert repo.patch_tree(None, {RepoPath("never/there"): None}) is None
    assert repo.list_tree(None) == {}


def test_patch_of_missing_path_is_a_no_op(repo: ShadowRepo) -> None:
    f = blob(repo, "f")
    base = build(repo, {"a/b": f})
    assert repo.patch_tree(base, {RepoPath("a/zz"): None, RepoPath("q/r"): None}) == base


def test_a_restore_patch_writes_a_new_chain_of_trees_whole(repo: ShadowRepo) -> None:
    """Without `expect_new` only the deepest new tree is looked up; the trees above it are
    written without asking (they hold it, so they are new too). Every one must be there:
    git fsck is the witness, and the same patch again changes nothing."""
    f, g = blob(repo, "f"), blob(repo, "g")
    base = build(repo, {"a/b/c/d/e/file.txt": f, "a/b/side.txt": g, "top.txt": g})
    repo.commit(base, [], "base", "t")
    merged = blob(repo, "content nobody stored before")
    new = repo.patch_tree(base, {RepoPath("a/b/c/d/e/file.txt"): merged}, expect_new=False)
    assert repo.list_tree(new) == {"a/b/c/d/e/file.txt": merged, "a/b/side.txt": g, "top.txt": g}
    commit = repo.commit(new, [], "after", "t")
    repo.set_ref(task_ref("t"), commit)
    listed = git(repo, "ls-tree", "-r", "-t", "--name-only", commit).stdout.split()
    assert listed == ["a", "a/b", "a/b/c", "a/b/c/d", "a/b/c/d/e", "a/b/c/d/e/file.txt", "a/b/side.txt",
                      "top.txt"]
    fsck = git(repo, "fsck", "--full", "--no-dangling", check=False)
    assert fsck.returncode == 0, fsck.stdout + fsck.stderr
    # putting back the old content finds every old tree held: the base tree again
    assert repo.patch_tree(new, {RepoPath("a/b/c/d/e/file.txt"): f}, expect_new=False) == base


@pytest.mark.parametrize(("old_files", "new_files", "paths", "expected"), [
    ({"a/b/f": "1", "g": "2"}, {"a/b/f": "1", "g": "2"}, [], True),
    ({"a/b/f": "1", "g": "2"}, {"a/b/f": "3", "g": "2"}, ["a/b/f"], True),
    ({"a/b/f": "1", "g": "2"}, {"a/b/f": "3", "g": "2"}, ["a/b"], False),  # a folder is no file of the list
    ({"a/b/f": "1", "g": "2"}, {"a/b/f": "3", "g": "4"}, ["a/b/f"], False),
    ({"a/b/f": "1"}, {"a/b/f": "1", "a/c/new": "5"}, ["a/c/new"], True),
    ({"a/b/f": "1", "a/c/gone": "5"}, {"a/b/f": "1"}, ["a/b/f"], False),
    ({"x": "1"}, {"x/inside": "1"}, ["x/inside"], False),  # the file x went too
    ({"x": "1"}, {"x/inside": "1"}, ["x", "x/inside"], True),
    ({}, {"n/m": "1"}, ["n/m"], True),
    ({"n/m": "1"}, {}, [], False),
])
def test_trees_differ_only_at_the_files_named(repo: ShadowRepo, old_files: dict[str, str],
                                               new_files: dict[str, str], paths: list[str], expected: bool) -> None:
    old = build(repo, {p: blob(repo, c) for p, c in old_files.items()})
    new = build(repo, {p: blob(repo, c) for p, c in new_files.items()})
    assert repo.differ_only_at(old, new, paths) is expected
    assert repo.differ_only_at(new, old, paths) is expected
    if old and new:
        # the git CLI's own list of differing files agrees, for the cases with two trees
        changed = set(git(repo, "diff-tree", "-r", "--name-only", "--no-renames", old, new).stdout.split())
        assert (changed <= set(paths)) is expected


def _random_path(rng: random.Random) -> str:
    depth = rng.randint(1, 4)
    return "/".join(rng.choice("abcde") for _ in range(depth - 1)) + ("/" if depth > 1 else "") + rng.choice(
        ["f1", "f2", "a", "b", "c"]
    )


def _apply_model(model: dict[str, TreeEntry], path: str, entry: TreeEntry | None) -> dict[str, TreeEntry | None]:
    """Apply one change to the model, returning the explicit changes (scanner style)."""
    changes: dict[str, TreeEntry | None] = {}
    if entry is None:
        if path in model:
            del model[path]
            changes[path] = None
        return changes
    parts = path.split("/")
    for i in range(1, len(parts)):  # a file where a parent dir must go
        prefix = "/".join(parts[:i])
        if prefix in model:
            del model[prefix]
            changes[prefix] = None
    for p in [p for p in model if p.startswith(path + "/")]:  # a dir where the file must go
        del model[p]
        changes[p] = None
    model[path] = entry
    changes[path] = entry
    return changes


def _random_changes(rng: random.Random, model: dict[str, TreeEntry], entries: list[TreeEntry], *,
                    most: int, p_delete: float) -> dict[str, TreeEntry | None]:
    """A few random deletes, rewrites and new paths applied to `model`; the explicit changes."""
    changes: dict[str, TreeEntry | None] = {}
    for _ in range(rng.randint(1, most)):
        if model and rng.random() < p_delete:
            path, entry = rng.choice(sorted(model)), None
        elif model and rng.random() < 0.3:
            path, entry = rng.choice(sorted(model)), rng.choice(entries)
        else:
            path, entry = _random_path(rng), rng.choice(entries)
        changes.update(_apply_model(model, path, entry))
    return changes


@pytest.mark.parametrize("seed", range(12))
def test_patch_equals_tree_built_from_scratch(repo: ShadowRepo, seed: int) -> None:
    rng = random.Random(seed)
    entries = [blob(repo, f"content {i}", rng.choice([MODE_FILE, MODE_EXEC, MODE_LINK])) for i in range(8)]
    model: dict[str, TreeEntry] = {}
    tree: str | None = None
    for _ in range(25):
        changes = _random_changes(rng, model, entries, most=6, p_delete=0.35)
        items = list(changes.items())
        rng.shuffle(items)
        tree = repo.patch_tree(tree, {RepoPath(p): e for p, e in items})
        assert repo.list_tree(tree) == model
        assert tree == build(repo, model)


# ---- commits ----------------------------------------------------------------------------------


def test_commit_carries_trailer_and_committer(repo: ShadowRepo) -> None:
    tree = build(repo, {"a": blob(repo, "a")})
    c1 = repo.commit(tree, [], "baseline", "task one ü")
    c2 = repo.commit(None, [c1], "round checkpoint at 5", "task-2")
    repo.set_ref(task_ref("task-2"), c2)
    out = git(repo, "log", "--format=%cn%n%ce%n%an%n%(trailers:only,unfold)", c2).stdout
    assert out.split("\n\n")[0].splitlines() == [
        COMMITTER_NAME, COMMITTER_EMAIL, COMMITTER_NAME, "Shadowpoint-Task: task-2"]
    assert "Shadowpoint-Task: task one ü" in out
    raw = git(repo, "cat-file", "-p", c2).stdout
    assert "gpgsig" not in raw
    assert f"parent {c1}" in raw
    # a commit without a tree gets the empty tree; commit_tree maps it back to None
    assert repo.commit_tree(c2) is None
    assert repo.commit_tree(c1) == tree
    assert git(repo, "rev-parse", f"{c2}^{{tree}}").stdout.strip() == "4b825dc642cb6eb9a060e54bf8d69288fbee4904"
    assert repo.read_ref(task_ref("task-2")) == c2


def test_commit_tree_of_commits_written_here_agrees_with_a_fresh_read(repo: ShadowRepo) -> None:
    # the handle that wrote a commit knows its tree without reading it back; another handle reads it
    tree = build(repo, {"a": blob(repo, "a"), "d/b": blob(repo, "b")})
    empty = repo.empty_tree()
    commits = [repo.commit(tree, [], "m", "t"), repo.commit(None, [], "m", "t"), repo.commit(empty, [], "m", "t")]
    repo.flush()  # on disk, as before a ref moves
    other = ShadowRepo.open_existing(repo.git_dir)
    try:
        for c in commits:
            assert repo.commit_tree(c) == other.commit_tree(c), c
        assert [repo.commit_tree(c) for c in commits] == [tree, None, None]
    finally:
        other.close()
    with pytest.raises(RepoError):
        repo.commit_tree("0" * 40)  # not held: still an error


def test_has_object_loose_packed_missing_and_malformed(repo: ShadowRepo) -> None:
    loose_blob = repo.write_blob(b"loose")
    c = repo.commit(build(repo, {"a": blob(repo, "packed")}), [], "m", "t")
    repo.set_ref(task_ref("t"), c)
    repo.collect_garbage(grace_s=0)  # packs what the ref reaches, drops the loose copies
    packed = repo.lookup(repo.commit_tree(c), RepoPath("a"))
    assert packed is not None and not _loose(repo, packed.oid).exists()
    assert repo.has_object(packed.oid) and repo.has_object(c)
    assert not repo.has_object(loose_blob)  # unreachable: collected
    again = repo.write_blob(b"loose")
    assert _loose(repo, again).exists() and repo.has_object(again)
    assert not repo.has_object("1" * 40)
    (repo.git_dir / ("probe" + "0" * 33)).write_text("x")  # objects/../probe000…: a file outside objects/
    for bad in (".." + "probe" + "0" * 33, "..", "", "AB" + "0" * 38, "g" * 40):
        assert not repo.has_object(bad), bad


def test_line_breaks_in_task_id_cannot_forge_trailers(repo: ShadowRepo) -> None:
    c = repo.commit(None, [], "m", "evil\nShadowpoint-Task: victim\r\n\nSigned-off-by: x")
    values = git(repo, "log", "-1", "--format=%(trailers:key=Shadowpoint-Task,valueonly,unfold)", c).stdout
    assert values.strip().splitlines() == ["evil Shadowpoint-Task: victim Signed-off-by: x"]
    assert git(repo, "log", "-1", "--format=%(trailers:key=Signed-off-by)", c).stdout.strip() == ""


def test_refs_set_read_list_delete(repo: ShadowRepo) -> None:
    tree = build(repo, {"a": blob(repo, "a")})
    c = repo.commit(tree, [], "m", "t")
    repo.set_ref(HEAD_REF, c)
    repo.set_ref(task_ref("weird/../id"), c)
    refs = repo.list_refs()
    assert refs[HEAD_REF] == c
    assert refs[task_ref("weird/../id")] == c
    assert git(repo, "show-ref").returncode == 0
    repo.delete_ref(HEAD_REF)
    assert repo.read_ref(HEAD_REF) is None
    repo.delete_ref(HEAD_REF)  # deleting twice is harmless


def test_object_ids_are_full_and_lowercase_and_ref_names_checked_every_time(repo: ShadowRepo) -> None:
    """A commit's tree and parents and a ref's target must be full ids (pygit2.Oid pads a short
    one with zeros: refused here), written in lowercase; a ref name found valid once is not
    asked of libgit2 again, and an invalid one is refused every time."""
    tree = build(repo, {"a": blob(repo, "a")})
    assert tree is not None
    c1 = repo.commit(tree, [], "m", "t")
    c2 = repo.commit(tree.upper(), [c1.upper()], "m", "t")
    assert git(repo, "rev-parse", f"{c2}^").stdout.strip() == c1  # read back by git: lowercase, whole
    with pytest.raises(RepoError):
        repo.commit(tree, [c1[:12]], "m", "t")
    with pytest.raises(RepoError):
        repo.set_ref(task_ref("t"), c2[:12])
    assert repo.read_ref(task_ref("t")) is None
    repo.set_ref(task_ref("t"), c2.upper())
    assert repo.read_ref(task_ref("t")) == c2
    for _ in range(2):
        with pytest.raises(RepoError, match="not a valid ref name"):
            repo.set_ref("refs/shadowpoint/bad..name", c2)


def test_set_ref_survives_a_stale_lock_file(repo: ShadowRepo) -> None:
    tree = build(repo, {"a": blob(repo, "a")})
    c = repo.commit(tree, [], "m", "t")
    lock = repo.git_dir / "refs" / "shadowpoint" / "tasks" / "t.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    lock.write_text("")
    repo.set_ref(task_ref("t"), c)  # written past the lock: the caller holds the workspace lock
    assert repo.read_ref(task_ref("t")) == c
    assert git(repo, "rev-parse", task_ref("t")).stdout.strip() == c
    repo.delete_ref(task_ref("t"))  # libgit2's delete takes the lock: the stale one is cleared
    assert repo.read_ref(task_ref("t")) is None
    assert not lock.exists()


TRICKY_IDS = ["plain", "with/slash", "with_slash", "..", "a/../b", "a_.._b", "a b", "a_b", "ünï", "x.lock",
              "-dash", ".hidden", "a" * 300, "a" * 301, "", "@{u}", "back\\slash", "A", "tab\tid", "x~1^2:3?*["]


@pytest.mark.parametrize("task_id", TRICKY_IDS)
def test_ref_component_is_a_valid_ref_name(repo: ShadowRepo, task_id: str) -> None:
    comp = ref_component(task_id)
    assert comp and "/" not in comp and ".." not in comp and not comp.endswith(".lock")
    assert git(repo, "check-ref-format", task_ref(task_id), check=False).returncode == 0
    c = repo.commit(None, [], "m", task_id)
    repo.set_ref(task_ref(task_id), c)
    assert repo.read_ref(task_ref(task_id)) == c


def test_ref_components_are_distinct() -> None:
    comps = [ref_component(t) for t in TRICKY_IDS]
    assert len(set(comps)) == len(comps)
    assert ref_component("plain") == "plain"


# ---- isolation from the user's git configuration ----------------------------------------------


ISOLATION_PROBE = r"""
import json, sys
from pathlib import Path
from typing import Any
import pygit2
from shadowpoint.store.shadow_repo import ShadowRepo
from shadowpoint.store.values import TreeEntry, MODE_FILE
from shadowpoint.workspace import RepoPath
base, workspace = Path(sys.argv[1]), Path(sys.argv[2])
plain = pygit2.init_repository(str(base / "plain"), bare=True)  # before isolation: reads user config
control = "hostile.marker" in plain.config
repo = ShadowRepo.open_or_init(base / "iso" / ".git", workspace)
cfg = pygit2.Repository(str(repo.git_dir)).config
data = b"line a\nline $Id$ b\r\nlast a"
e = TreeEntry(repo.write_blob(data), MODE_FILE)
tree = repo.patch_tree(None, {RepoPath("f.txt"): e})
c = repo.commit(tree, [], "m", "t")
print(json.dumps({
    "control": control,
    "marker": "hostile.marker" in cfg or "hostile.xdgmarker" in cfg,
    "autocrlf": cfg.get_bool("core.autocrlf"),
    "user": cfg["user.name"],
    "blob_ok": repo.read_blob(e.oid) == data and repo.read_blob(repo.list_tree(tree)["f.txt"].oid) == data,
    "commit": c,
    "blob": e.oid,
}))
"""


def test_user_git_config_has_no_effect(tmp_path: Path, workspace: Path) -> None:
    """A fresh process with a hostile HOME and XDG git config: libgit2 must not read them."""
    home = tmp_path / "hostile-home"
    home.mkdir()
    attrs = home / "global-attributes"
    attrs.write_text("* text=auto eol=crlf filter=evil ident\n")
    hostile = (
        f"[core]\n\tautocrlf = true\n\teol = crlf\n\tattributesFile = {attrs}\n\tsafecrlf = true\n"
        "\tfsmonitor = true\n\thooksPath = /nonexistent\n"
        "[filter \"evil\"]\n\tclean = sed s/a/EVIL/\n\tsmudge = sed s/a/EVIL/\n\trequired = true\n"
        "[commit]\n\tgpgSign = true\n[user]\n\tname = Hostile User\n\temail = h@example.com\n"
        "[hostile]\n\tmarker = yes\n"
    )
    (home / ".gitconfig").write_text(hostile)
    xdg = home / ".config" / "git"
    xdg.mkdir(parents=True)
    (xdg / "config").write_text(hostile.replace("marker = yes", "xdgmarker = yes"))
    (workspace / ".gitattributes").write_text("* text eol=crlf filter=evil ident\n")
    env = {"PATH": os.environ["PATH"], "HOME": str(home), "XDG_CONFIG_HOME": str(home / ".config"),
           "GIT_CONFIG_GLOBAL": str(home / ".gitconfig"), "GIT_AUTHOR_NAME": "Env Author",
           "GIT_COMMITTER_NAME": "Env Committer", "GIT_DIR": str(tmp_path / "nope")}
    out = subprocess.run([sys.executable, "-c", ISOLATION_PROBE, str(tmp_path), str(workspace)], env=env,
                         capture_output=True, text=True, check=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["control"] is True, "the probe must see the hostile config without isolation"
    assert result["marker"] is False
    assert result["autocrlf"] is False
    assert result["user"] == COMMITTER_NAME
    assert result["blob_ok"] is True
    iso = ShadowRepo(pygit2.Repository(str(tmp_path / "iso" / ".git")), tmp_path / "iso" / ".git", workspace)
    raw = git(iso, "cat-file", "commit", result["commit"]).stdout
    assert "Hostile" not in raw and "Env " not in raw and "gpgsig" not in raw
    assert f"committer {COMMITTER_NAME} <{COMMITTER_EMAIL}>" in raw
    assert subprocess.run(["git", f"--git-dir={iso.git_dir}", "cat-file", "blob", result["blob"]],
                          capture_output=True, check=True, env={"PATH": os.environ["PATH"],
                                                                "HOME": str(tmp_path)}).stdout == (
        b"line a\nline $Id$ b\r\nlast a")
    iso.close()


# ---- garbage collection -----------------------------------------------------------------------


def _exists(repo: ShadowRepo, oid: str) -> bool:
    return git(repo, "cat-file", "-e", oid, check=False).returncode == 0


def _loose(repo: ShadowRepo, oid: str) -> Path:
    return repo.git_dir / "objects" / oid[:2] / oid[2:]


def test_gc_keeps_reachable_drops_unreachable(repo: ShadowRepo) -> None:
    keep_blob = blob(repo, "kept")
    shared = blob(repo, "shared")
    t1 = build(repo, {"a/k": keep_blob, "s": shared})
    c1 = repo.commit(t1, [], "one", "t1")
    t2 = repo.patch_tree(t1, {RepoPath("b/new"): blob(repo, "second")})
    c2 = repo.commit(t2, [c1], "two", "t1")
    repo.set_ref(task_ref("t1"), c2)

    gone_blob = blob(repo, "only in the deleted task")
    tg = build(repo, {"g": gone_blob, "s": shared})
    cg = repo.commit(tg, [], "doomed", "t2")
    repo.set_ref(task_ref("t2"), cg)
    orphan = repo.write_blob(b"never referenced")
    repo.delete_ref(task_ref("t2"))

    kept, _ = repo.collect_garbage(grace_s=0)
    assert kept == len(repo.reachable_objects([c2]))
    assert t1 is not None and t2 is not None and tg is not None, "no tree is empty"
    for oid in (c1, c2, t1, t2, keep_blob.oid, shared.oid):
        assert _exists(repo, oid), oid
        assert repo.has_object(oid)
    for oid in (cg, tg, gone_blob.oid, orphan):
        assert not _exists(repo, oid), oid
        assert not repo.has_object(oid)
    fsck = git(repo, "fsck", "--full", "--no-dangling", check=False)
    assert fsck.returncode == 0, fsck.stderr + fsck.stdout
    assert repo.list_tree(repo.commit_tree(c2)) == repo.list_tree(t2)
    # the repo keeps working after gc: new objects, new commits, another gc
    c3 = repo.commit(repo.patch_tree(t2, {RepoPath("c"): blob(repo, "third")}), [c2], "three", "t1")
    repo.set_ref(task_ref("t1"), c3)
    repo.collect_garbage(grace_s=0)
    assert git(repo, "fsck", "--full", check=False).returncode == 0
    assert list((repo.git_dir / "objects" / "pack").glob("*.pack")) and len(
        list((repo.git_dir / "objects" / "pack").glob("*.pack"))) == 1


def test_gc_keeps_young_unreachable_loose_objects(repo: ShadowRepo) -> None:
    t = build(repo, {"a": blob(repo, "a")})
    c = repo.commit(t, [], "m", "t")
    repo.set_ref(task_ref("t"), c)
    young = repo.write_blob(b"young orphan")
    old = repo.write_blob(b"old orphan")
    past = time.time() - 7200
    os.utime(_loose(repo, old), (past, past))

    repo.collect_garbage(grace_s=3600)
    assert _exists(repo, young) and repo.has_object(young)
    assert not _exists(repo, old)
    assert _exists(repo, c)
    assert git(repo, "fsck", "--full", "--no-dangling", check=False).returncode == 0


def test_gc_keeps_what_a_ref_missing_at_its_first_look_reaches(repo: ShadowRepo) -> None:
    # The head is moved by removing its file and renaming the new one into place
    # (durable=False): a collection's first look at the refs, without the lock, may fall between
    # the two. What the refs reach is looked at again under the lock, before anything goes.
    c = repo.commit(build(repo, {"a": blob(repo, "task's")}), [], "m", "t")
    repo.set_ref(task_ref("t"), c)
    head_tree = build(repo, {"a": blob(repo, "task's"), "b": blob(repo, "only the head's")})
    assert head_tree is not None
    only_head = {head_tree, repo.lookup(head_tree, RepoPath("b")).oid}  # type: ignore[union-attr]
    head_file = repo.git_dir / HEAD_REF
    head_file.unlink(missing_ok=True)
    entered: list[bool] = []

    @contextlib.contextmanager
    def locked() -> Iterator[None]:
        repo.set_ref(HEAD_REF, head_tree, durable=False)  # the rename lands while the walk ran
        entered.append(True)
        yield

    repo.collect_garbage(grace_s=0, locked=locked)
    assert entered
    for oid in only_head:
        assert _exists(repo, oid), oid
    assert git(repo, "fsck", "--full", "--no-dangling", check=False).returncode == 0


def test_gc_goes_on_when_a_ref_moved_meanwhile_reaches_a_pack_written_meanwhile(repo: ShadowRepo) -> None:
    # A round during the collection's walk: its tree and commit go into the small pack its ref
    # move writes, which the collection keeps (`pack_holds` finds them there); it goes on.
    c = repo.commit(build(repo, {"a": blob(repo, "task's")}), [], "m", "t")
    repo.set_ref(task_ref("t"), c)
    orphan = repo.write_blob(b"no ref names it")
    late: list[str] = []

    @contextlib.contextmanager
    def locked() -> Iterator[None]:
        if not late:
            tree = repo.patch_tree(repo.commit_tree(c), {RepoPath("b"): blob(repo, "the round's")})
            late.append(repo.commit(tree, [c], "a round meanwhile", "t"))
            repo.set_ref(task_ref("t"), late[0])
        yield

    repo.collect_garbage(grace_s=0, locked=locked)
    assert late and repo.read_ref(task_ref("t")) == late[0]
    assert not _exists(repo, orphan), "the collection went on"
    for oid in repo.reachable_objects([late[0]]):
        assert _exists(repo, oid), oid
    assert git(repo, "fsck", "--full", "--no-dangling", check=False).returncode == 0


def test_gc_removes_loose_objects_in_batches_with_the_lock_free_between(repo: ShadowRepo,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    # A background collection yields to the agent's rounds between batches (`pause`): the
    # loose copies of packed objects go without the lock, unreachable ones a batch per hold,
    # so a round is never kept waiting for all of them.
    import shadowpoint.store.shadow_repo as shadow_repo

    monkeypatch.setattr(shadow_repo, "_PRUNE_BATCH", 2)
    kept = [blob(repo, f"kept {i}").oid for i in range(5)]
    c = repo.commit(build(repo, {f"f{i}": TreeEntry(oid, MODE_FILE) for i, oid in enumerate(kept)}), [], "m", "t")
    repo.set_ref(task_ref("t"), c)
    orphans = [repo.write_blob(f"orphan {i}".encode()) for i in range(5)]
    lock = threading.Lock()
    holds: list[str] = []

    @contextlib.contextmanager
    def locked() -> Iterator[None]:
        with lock:
            holds.append("held")
            yield

    def pause() -> None:
        assert lock.acquire(blocking=False), "a pause came while the collection held the lock"
        lock.release()
        holds.append("pause")

    repo.collect_garbage(grace_s=0, locked=locked, pause=pause)
    # 5 packed loose copies and 5 orphans, 2 a batch: pauses between, a hold per orphan batch
    assert holds.count("pause") >= 4 and holds.count("held") >= 4
    assert not any(_loose(repo, o).exists() for o in [*kept, *orphans])
    assert all(_exists(repo, o) for o in kept) and not any(_exists(repo, o) for o in orphans)
    assert git(repo, "fsck", "--full", "--no-dangling", check=False).returncode == 0


def test_gc_keeps_what_a_round_between_two_batches_reaches(repo: ShadowRepo,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    # Between two batches of unreachable objects a round may commit a tree naming one of them
    # (a blob its stat cache knew): the next batch walks the moved ref first and keeps it.
    import shadowpoint.store.shadow_repo as shadow_repo

    monkeypatch.setattr(shadow_repo, "_PRUNE_BATCH", 1)
    a = blob(repo, "a")
    c = repo.commit(build(repo, {"a": a}), [], "m", "t")
    repo.set_ref(task_ref("t"), c)
    orphans = [repo.write_blob(f"orphan {i}".encode()) for i in range(6)]
    reused: list[str] = []

    def pause() -> None:
        left = [o for o in orphans if _loose(repo, o).exists()]
        if reused or len(left) == len(orphans):
            return  # the round came already, or the removal of unreachable objects has not begun
        reused.append(left[-1])
        tree = build(repo, {"a": a, "b": TreeEntry(left[-1], MODE_FILE)})
        repo.set_ref(task_ref("t"), repo.commit(tree, [c], "round", "t"))

    repo.collect_garbage(grace_s=0, pause=pause)
    assert reused, "no pause between two batches of unreachable objects"
    assert _exists(repo, reused[0]), "the collection removed what the round's commit names"
    assert [o for o in orphans if _exists(repo, o)] == reused
    assert git(repo, "fsck", "--full", "--no-dangling", check=False).returncode == 0


def test_head_moved_without_durability_replaces_the_ref(repo: ShadowRepo) -> None:
    t1 = build(repo, {"a": blob(repo, "one")})
    t2 = build(repo, {"a": blob(repo, "two")})
    assert t1 is not None and t2 is not None
    repo.set_ref(HEAD_REF, t1, durable=False)  # no file there yet
    assert repo.read_ref(HEAD_REF) == t1
    repo.set_ref(HEAD_REF, t2, durable=False)
    assert repo.read_ref(HEAD_REF) == t2
    assert git(repo, "rev-parse", HEAD_REF).stdout.strip() == t2
    assert (repo.git_dir / HEAD_REF).read_text() == t2 + "\n"
    # what a power cut may leave of a head moved that way: an empty file, or none
    (repo.git_dir / HEAD_REF).write_bytes(b"")
    assert repo.read_ref(HEAD_REF) is None
    (repo.git_dir / HEAD_REF).unlink()
    assert repo.read_ref(HEAD_REF) is None
    # a folder in the way is damage, as for a durable move
    (repo.git_dir / HEAD_REF).mkdir()
    with pytest.raises(RepoError):
        repo.set_ref(HEAD_REF, t1, durable=False)


def test_gc_with_no_refs_empties_the_repo(repo: ShadowRepo) -> None:
    t = build(repo, {"a": blob(repo, "a")})
    c = repo.commit(t, [], "m", "t")
    kept, _ = repo.collect_garbage(grace_s=0)
    assert kept == 0
    assert not _exists(repo, c)


# ---- opening, mismatch and repair -------------------------------------------------------------


def test_reopen_keeps_objects_and_refs(tmp_path: Path, workspace: Path) -> None:
    gd = tmp_path / "s" / ".git"
    r = ShadowRepo.open_or_init(gd, workspace)
    c = r.commit(build(r, {"a": blob(r, "a")}), [], "m", "t")
    r.set_ref(HEAD_REF, c)
    r.close()
    r2 = ShadowRepo.open_or_init(gd, workspace)
    try:
        assert r2.read_ref(HEAD_REF) == c
        assert git(r2, "config", "core.worktree").stdout.strip() == str(workspace)
    finally:
        r2.close()


@pytest.mark.parametrize("name", ["plain", "with space", 'a "quoted" name', "back\\slash", "tab\there", "new\nline",
                                  "ünïcödé", "semi;colon #hash", "trailing\\"])
def test_a_new_shadow_repo_records_its_worktree_as_git_reads_it(tmp_path: Path, name: str) -> None:
    """A shadow repository is laid out whole (`ShadowRepo._create`, its config written at
    once): git reads the worktree as given, whatever the folder's name, and reopening it
    finds the same; nothing made aside is left."""
    worktree = tmp_path / name
    worktree.mkdir()
    gd = tmp_path / "s" / ".git"
    r = ShadowRepo.open_or_init(gd, worktree)
    try:
        assert git(r, "config", "core.worktree").stdout[:-1] == str(worktree)
        assert git(r, "rev-parse", "--is-bare-repository").stdout.strip() == "false"
        assert git(r, "config", "gc.auto").stdout.strip() == "0"
        c = r.commit(build(r, {"a": blob(r, "a")}), [], "m", "t")
        assert git(r, "cat-file", "-t", c).stdout.strip() == "commit"
    finally:
        r.close()
    ShadowRepo.open_or_init(gd, worktree).close()  # the same worktree: no mismatch
    assert [p.name for p in gd.parent.iterdir()] == [".git"]


def test_a_shadow_repo_that_cannot_be_laid_out_leaves_nothing(tmp_path: Path, workspace: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    real = Path.write_bytes

    def refuse(self: Path, data: Any) -> int:
        if self.name == "config":
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, data)

    monkeypatch.setattr(Path, "write_bytes", refuse)
    gd = tmp_path / "s" / ".git"
    with pytest.raises(OSError):
        ShadowRepo.open_or_init(gd, workspace)
    assert list(gd.parent.iterdir()) == []
    monkeypatch.undo()
    ShadowRepo.open_or_init(gd, workspace).close()  # made whole once there is room


def test_mismatched_worktree_is_refused(tmp_path: Path, workspace: Path) -> None:
    gd = tmp_path / "s" / ".git"
    ShadowRepo.open_or_init(gd, workspace).close()
    other = tmp_path / "other"
    other.mkdir()
    with pytest.raises(ShadowRepoMismatchError) as info:
        ShadowRepo.open_or_init(gd, other)
    assert str(workspace) in str(info.value)
    assert info.value.kind == "init_failed"
    # the recorded worktree was not rewritten
    r = ShadowRepo.open_or_init(gd, workspace)
    r.close()


@pytest.mark.parametrize("damage", ["empty", "nul", "truncated", "garbage"])
def test_damaged_config_is_repaired_keeping_objects(tmp_path: Path, workspace: Path, damage: str) -> None:
    gd = tmp_path / "s" / ".git"
    r = ShadowRepo.open_or_init(gd, workspace)
    e = blob(r, "precious")
    tree = build(r, {"p": e})
    c = r.commit(tree, [], "m", "t")
    r.set_ref(task_ref("t"), c)
    r.close()
    cfg = gd / "config"
    size = cfg.stat().st_size
    cfg.write_bytes({
        "empty": b"",
        "nul": b"\0" * size,
        "truncated": cfg.read_bytes()[: size // 3],
        "garbage": b"[core\n\tworktree = \"unterminated\n\x01\x02",
    }[damage])
    (gd / "config.lock").write_text("stale")

    r2 = ShadowRepo.open_or_init(gd, workspace)
    try:
        assert r2.read_blob(e.oid) == b"precious"
        assert r2.read_ref(task_ref("t")) == c
        assert r2.list_tree(r2.commit_tree(c)) == {"p": e}
        assert git(r2, "config", "core.worktree").stdout.strip() == str(workspace)
        assert git(r2, "config", "--bool", "core.autocrlf").stdout.strip() == "false"
        c2 = r2.commit(tree, [c], "after repair", "t")
        r2.set_ref(task_ref("t"), c2)
        assert git(r2, "fsck", "--full", check=False).returncode == 0
    finally:
        r2.close()


def test_stale_ref_lock_cleared_on_open(tmp_path: Path, workspace: Path) -> None:
    gd = tmp_path / "s" / ".git"
    ShadowRepo.open_or_init(gd, workspace).close()
    stale = gd / "refs" / "shadowpoint" / "head.lock"
    stale.parent.mkdir(parents=True, exist_ok=True)
    stale.write_text("")
    r = ShadowRepo.open_or_init(gd, workspace)
    try:
        assert not stale.exists()
    finally:
        r.close()


def test_diff_trees_reports_statuses_and_renames(repo: ShadowRepo) -> None:
    body = "\n".join(f"line {i}" for i in range(40))
    a, b = blob(repo, body), blob(repo, "b")
    old = build(repo, {"moved.txt": a, "mod.txt": b, "gone.txt": b})
    new = build(repo, {"dir/renamed.txt": a, "mod.txt": blob(repo, "b2"), "added.txt": blob(repo, "fresh")})
    deltas: dict[str, DeltaRecord] = {d.path: d for d in repo.diff_trees(old, new)}
    assert deltas["dir/renamed.txt"].status == "renamed"
    assert deltas["dir/renamed.txt"].old_path == "moved.txt"
    assert deltas["mod.txt"].status == "modified"
    assert deltas["added.txt"].status == "added" and deltas["added.txt"].old_oid is None
    assert deltas["gone.txt"].status == "deleted" and deltas["gone.txt"].new_oid is None
    assert repo.diff_trees(new, new) == []
    assert {d.status for d in repo.diff_trees(None, new)} == {"added"}


_GIT_STATUS = {"A": "added", "D": "deleted", "M": "modified", "T": "modified"}


@pytest.mark.parametrize("seed", range(10))
def test_diff_trees_without_renames_equals_git_diff_tree(repo: ShadowRepo, seed: int) -> None:
    """The pruned walk (no libgit2 diff when no rename can be found) against `git diff-tree -r`:
    adds, deletes, content and mode changes, file <-> folder and file <-> link swaps."""
    rng = random.Random(1000 + seed)
    entries = [blob(repo, f"content {i}", rng.choice([MODE_FILE, MODE_EXEC, MODE_LINK])) for i in range(8)]
    model: dict[str, TreeEntry] = {}
    tree: str | None = None
    for _ in range(12):
        before = tree
        changes = _random_changes(rng, model, entries, most=8, p_delete=0.3)
        tree = repo.patch_tree(tree, {RepoPath(p): e for p, e in changes.items()})
        ours = [(d.status, d.path, d.old_oid, d.new_oid, d.old_mode, d.new_mode)
                for d in repo.diff_trees(before, tree, renames=False)]
        empty = repo.empty_tree()
        out = git(repo, "diff-tree", "-r", "--no-renames", "-z", before or empty, tree or empty).stdout
        fields = out.split("\0")
        theirs = []
        for meta, path in zip(fields[0:-1:2], fields[1::2], strict=True):
            old_mode, new_mode, old_oid, new_oid, status = meta.lstrip(":").split(" ")
            zero = "0" * 40
            theirs.append((_GIT_STATUS[status], path, None if old_oid == zero else old_oid,
                           None if new_oid == zero else new_oid,
                           None if old_mode == "000000" else int(old_mode, 8),
                           None if new_mode == "000000" else int(new_mode, 8)))
        assert ours == theirs


def test_read_blob_loose_packed_and_damaged(repo: ShadowRepo) -> None:
    # a loose blob is read by its file (header and id checked), a packed one by libgit2
    data = os.urandom(3000) + b"text" * 5000
    loose_oid = repo.write_blob(data)
    c = repo.commit(build(repo, {"p": blob(repo, b"packed " * 1000)}), [], "m", "t")
    repo.set_ref(task_ref("t"), c)
    repo.collect_garbage(grace_s=0)
    packed = repo.lookup(repo.commit_tree(c), RepoPath("p"))
    assert packed is not None and not _loose(repo, packed.oid).exists()
    assert repo.read_blob(packed.oid) == b"packed " * 1000
    loose_oid = repo.write_blob(data)  # collected above: written loose again
    assert _loose(repo, loose_oid).exists()
    assert repo.read_blob(loose_oid) == data
    oracle = subprocess.run(["git", f"--git-dir={repo.git_dir}", "cat-file", "blob", loose_oid],
                            capture_output=True, check=True)
    assert oracle.stdout == data
    # a loose file whose bytes are another object's is damage, not that object's content
    path = _loose(repo, loose_oid)
    os.chmod(path, 0o644)
    path.write_bytes(zlib.compress(b"blob 5\0wrong"))
    with pytest.raises(RepoError):
        repo.read_blob(loose_oid)
    path.write_bytes(b"not zlib")
    with pytest.raises(RepoError):
        repo.read_blob(loose_oid)
    with pytest.raises(RepoError):
        repo.read_blob("2" * 40)


def test_read_ref_agrees_with_git(repo: ShadowRepo) -> None:
    # loose refs are read from their file; packed, symbolic and damaged ones as libgit2 reads them
    c1 = repo.commit(build(repo, {"a": blob(repo, "1")}), [], "m", "t")
    c2 = repo.commit(build(repo, {"a": blob(repo, "2")}), [c1], "m", "t")
    repo.set_ref(task_ref("packed"), c1)
    repo.set_ref(task_ref("loose"), c1)
    git(repo, "pack-refs", "--all")
    assert not (repo.git_dir / task_ref("packed")).exists()
    repo.set_ref(task_ref("loose"), c2)  # a loose ref over its packed value: the loose one counts
    for name, want in ((task_ref("packed"), c1), (task_ref("loose"), c2)):
        assert repo.read_ref(name) == want == git(repo, "rev-parse", name).stdout.strip()
    git(repo, "symbolic-ref", "refs/shadowpoint/sym", task_ref("loose"))
    assert repo.read_ref("refs/shadowpoint/sym") == c2
    (repo.git_dir / "refs" / "shadowpoint" / "bad").write_text("z" * 40 + "\n")
    assert repo.read_ref("refs/shadowpoint/bad") is None
    assert repo.read_ref("refs/shadowpoint/../../HEAD") is None
    assert repo.read_ref("refs/shadowpoint/none") is None


def test_a_shadow_repo_whose_workspace_is_gone_still_opens_and_reads(tmp_path: Path, workspace: Path) -> None:
    """libgit2 refuses a repository whose `core.worktree` is gone (a project removed whole);
    shadowpoint never uses libgit2's work tree, so it opens it as bare: the checkpoints stay
    readable for maintenance, a running engine's reopen, and a restore into the folder made
    again. A repository that is damaged otherwise still fails to open."""
    gd = tmp_path / "s" / ".git"
    r = ShadowRepo.open_or_init(gd, workspace)
    a = blob(r, "kept\n")
    c = r.commit(build(r, {"a.txt": a}), [], "m", "t")
    r.set_ref(HEAD_REF, c)
    workspace.rmdir()
    with pytest.raises(pygit2.GitError):
        pygit2.Repository(str(gd), pygit2.enums.RepositoryOpenFlag.NO_SEARCH)  # what libgit2 alone does
    r.reopen()
    assert r.read_ref(HEAD_REF) == c and r.read_blob(a.oid) == b"kept\n"
    r.close()
    other = ShadowRepo.open_existing(gd)
    try:
        assert str(other.worktree) == str(workspace)
        assert other.list_refs()[HEAD_REF] == c and other.read_blob(a.oid) == b"kept\n"
    finally:
        other.close()
    workspace.mkdir()
    (gd / "HEAD").unlink()  # damage, with the work tree there: still refused
    with pytest.raises(RepoError):
        ShadowRepo.open_existing(gd)
