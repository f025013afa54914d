"""A baseline of a workspace that is a git repository takes ids from the user's index (issue 14).

Real git repositories built with the git CLI on temp dirs; for each case the shadow
snapshot's blobs, read with `git --git-dir=<shadow> cat-file` (the oracle), are byte-equal to
the raw files on disk, and the taken/hashed counts show which path each file took. The
user's `.git` is never written; the borrowed blobs become the shadow repository's own.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from shadowpoint import engine as engine_mod
from shadowpoint.engine import Engine
from shadowpoint.kinds import TaskState
from shadowpoint.observe import inotify
from shadowpoint.observe.watcher import WorkspaceWatcher
from shadowpoint.stage import git_index, scanner
from shadowpoint.stage.early_capture import EarlyCapture, ScanHold
from shadowpoint.stage.exclusions import ExclusionRules
from shadowpoint.stage.forked import Forked
from shadowpoint.stage.git_index import IndexProof
from shadowpoint.stage.scanner import Scanner, StageOptions, StageResult
from shadowpoint.stage.stager import StagePlan
from shadowpoint.stage.stat_cache import StatCache
from shadowpoint.store import borrowed, shadow_repo
from shadowpoint.store.shadow_repo import ShadowRepo
from shadowpoint.workspace import RepoPath
from tests.gitrepo import backdate, git, git_dir_state, make_repo
from tests.integration.test_engine import held_copy_engine

FILES = {
    "README.md": b"# readme\n",
    "src/app.py": b"print('hi')\n",
    "src/deep/data.dat": bytes(range(256)) * 4,
    "docs/notes.txt": b"one\ntwo\n",
    "empty.txt": b"",
}


@dataclass
class Shadow:
    root: Path
    repo: ShadowRepo
    scanner: Scanner

    @property
    def git_dir(self) -> Path:
        return self.repo.git_dir

    def baseline(self) -> StageResult:
        return self.scanner.stage(StagePlan(rescan=True), StatCache(), borrow=True)

    def copy(self) -> borrowed.CopyReport:
        return borrowed.copy_borrowed(self.git_dir, self.root, contextlib.nullcontext)


@pytest.fixture
def shadow(tmp_path: Path) -> Any:
    made: list[ShadowRepo] = []

    def make(root: Path, shadow_dir: str = "shadow", **options: Any) -> Shadow:
        root = Path(os.path.realpath(root))
        repo = ShadowRepo.open_or_init(tmp_path / shadow_dir / ".git", root)
        made.append(repo)
        return Shadow(root, repo, Scanner(root, repo, ExclusionRules(root), StageOptions(**options)))

    yield make
    for repo in made:
        repo.close()


@contextlib.contextmanager
def held_baseline(sh: Shadow, after_files: int) -> Iterator[tuple[EarlyCapture, StatCache, dict[str, StageResult]]]:
    """A baseline scan on its own thread, held (`ScanHold`) once it reached `after_files` files;
    released and joined on exit, its result then in the dict under "result"."""
    hold = ScanHold(after_files=after_files)
    capture, cache = EarlyCapture(hold), StatCache()
    done: dict[str, StageResult] = {}
    scan = threading.Thread(target=lambda: done.update(
        result=sh.scanner.stage(StagePlan(rescan=True), cache, capture, borrow=True)))
    scan.start()
    try:
        assert hold.reached.wait(60), "the scan never reached the hold"
        yield capture, cache, done
    finally:
        hold.release()
        scan.join(60)


def cat_file(git_dir: Path, oid: str) -> bytes:
    """The oracle: git reads the shadow repository, and while blobs are borrowed the user's
    object store the ledger names (read-only, as the engine does)."""
    ledger = borrowed.read_ledger(git_dir)
    env = {**os.environ, "GIT_CONFIG_NOSYSTEM": "1"}
    if ledger is not None:
        env["GIT_ALTERNATE_OBJECT_DIRECTORIES"] = os.pathsep.join(ledger.alternates)
    return subprocess.run(["git", f"--git-dir={git_dir}", "cat-file", "blob", oid], check=True,
                          capture_output=True, env=env).stdout


def assert_byte_exact(sh: Shadow, tree: str | None, left_out: tuple[str, ...] = ()) -> dict[str, str]:
    """Every file of the snapshot, read by git from the shadow repo, equals the raw file; every
    file on disk is in it, but in the folders `left_out` (names at the root)."""
    listing = sh.repo.list_tree(tree)
    on_disk = {}
    for dp, dns, fns in os.walk(sh.root):
        for name in (".git", *left_out) if dp == str(sh.root) else (".git",):
            if name in dns:
                dns.remove(name)
        for n in fns:
            on_disk[os.path.relpath(os.path.join(dp, n), sh.root)] = Path(dp, n)
    assert set(listing) == set(on_disk)
    for path, entry in listing.items():
        assert cat_file(sh.git_dir, entry.oid) == on_disk[path].read_bytes(), path
    return {p: e.oid for p, e in listing.items()}


def still_borrowed(sh: Shadow) -> dict[str, str]:
    """The blobs (oid -> a path) the ledger names that the shadow repo does not hold itself:
    those read from the user's repository until the copy; {} without a ledger."""
    ledger = borrowed.read_ledger(sh.git_dir)
    if ledger is None:
        return {}
    named = borrowed.ledger_objects(sh.repo, ledger)
    lacking = set(sh.repo.own_missing(list(named)))
    return {oid: path for oid, path in named.items() if oid in lacking}


def own_objects_only(sh: Shadow, oids: list[str]) -> None:
    """The shadow repo needs the user's repository no more: no ledger, every blob its own."""
    assert not (sh.git_dir / "objects" / "info" / "alternates").exists()
    assert not borrowed.ledger_path(sh.git_dir).exists()
    assert sh.repo.own_missing(oids) == []


def folder_trees(root: Path, rev: str = "HEAD") -> dict[str, str]:
    """The oracle's ids of the user's trees at `rev`: folder ("" for the root) -> tree id."""
    out = {"": git(root, "rev-parse", f"{rev}^{{tree}}").decode().strip()}
    for line in git(root, "ls-tree", "-r", "-t", "-z", rev).split(b"\0"):
        if line:
            meta, _, path = line.partition(b"\t")
            _, kind, oid = meta.split()
            if kind == b"tree":
                out[path.decode()] = oid.decode()
    return out


def hashed_tree(tmp_path: Path, shadow: Any, root: Path) -> str | None:
    """The oracle's tree: a baseline of `root` that takes nothing from the index."""
    other: Shadow = shadow(root, "hashed")
    result = other.scanner.stage(StagePlan(rescan=True), StatCache(), borrow=False)
    assert result.stats.borrowed == 0
    return result.tree


# ---- ids taken ---------------------------------------------------------------------------------


def test_plain_committed_repo_takes_ids_and_copies_them(tmp_path: Path, shadow: Any) -> None:
    root = make_repo(tmp_path / "repo", FILES)
    sh = shadow(root)
    before = git_dir_state(root / ".git")
    result = sh.baseline()
    assert (result.stats.borrowed, result.stats.hashed) == (len(FILES), 0)
    assert sh.repo.borrowing == [str((root / ".git" / "objects").resolve())]
    assert borrowed.read_ledger(sh.git_dir) is not None
    oids = assert_byte_exact(sh, result.tree)
    # every folder's files are the index's: the snapshot is the user's commit's tree, taken whole
    assert result.tree == git(root, "rev-parse", "HEAD^{tree}").decode().strip()
    trees = folder_trees(root)
    assert set(trees.values()) <= set(still_borrowed(sh))
    report = sh.copy()
    assert report.finished and not report.lost
    assert report.copied == len(set(oids.values())) + len(set(trees.values()))
    own_objects_only(sh, [*oids.values(), *trees.values()])
    # the user's .git was never written (names, bytes, mtimes)
    assert git_dir_state(root / ".git") == before
    # and the snapshot no longer depends on it at all
    shutil.rmtree(root / ".git")
    sh.repo.reopen()
    assert assert_byte_exact(sh, result.tree) == oids


def test_folders_whose_files_are_all_the_indexs_take_its_trees(tmp_path: Path, shadow: Any) -> None:
    """The trees of the index's cache-tree are taken for the folders whose every file the walk
    proved, no more, no fewer: not above a file left out (a tracked `node_modules`, left out
    by the built-in rules), an untracked file, a changed one or a racy one; the tree is the one
    a baseline that hashes every file writes."""
    files = {f"{folder}/f{i}.txt": f"{folder} {i}\n".encode()
             for folder in ("whole", "whole/deep", "added", "changed", "racy", "app/kept", "app/other")
             for i in range(3)}
    files["node_modules/pkg/index.js"] = b"module.exports = 1\n"
    root = make_repo(tmp_path / "repo", files)
    (root / "added" / "new.txt").write_bytes(b"untracked\n")
    (root / "changed" / "f0.txt").write_bytes(b"changed after the commit\n")
    (root / "app" / "other" / "f1.txt").write_bytes(b"changed too\n")
    backdate(root, "added/new.txt", "changed/f0.txt", "app/other/f1.txt")
    os.utime(root / "racy" / "f2.txt")  # as young as the index: racy (its stat changed: not proven)
    sh = shadow(root)
    result = sh.baseline()
    assert result.tree == hashed_tree(tmp_path, shadow, root)
    trees = folder_trees(root)
    lent = still_borrowed(sh)
    taken = {folder for folder, oid in trees.items() if oid in lent}
    # the outermost whole folders; `whole/deep` comes with `whole`
    assert taken >= {"whole", "app/kept"} and trees["whole/deep"] in lent
    assert not taken & {"", "node_modules", "added", "changed", "racy", "app", "app/other"}
    assert_byte_exact(sh, result.tree, left_out=("node_modules",))
    report = sh.copy()
    assert report.finished and not report.lost
    assert borrowed.read_ledger(sh.git_dir) is None
    shutil.rmtree(root / ".git")
    sh.repo.reopen()
    assert_byte_exact(sh, result.tree, left_out=("node_modules",))


def test_a_big_baseline_takes_the_root_tree_whole_or_its_walkers_write_the_trees(
        tmp_path: Path, shadow: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A baseline big enough for two tree writers takes the index's root tree when it is whole
    (no tree is written, no child forked for them). Otherwise the two processes that walked it
    wrote the trees of their folders as they finished (`_unit_trees`, `_own_trees`): no child
    is forked for the trees either, and the tree is the one hashing every file gives."""
    files = {f"d{i % 7}/s{i % 3}/f{i:03d}.txt": f"file {i}\n".encode() for i in range(300)}
    root = make_repo(tmp_path / "repo", files)
    aside: list[bool] = []
    real = Scanner._trees_aside

    def spy(self: Scanner, *args: Any) -> Any:
        child = real(self, *args)
        aside.append(child is not None)
        return child

    monkeypatch.setattr(Scanner, "_trees_aside", spy)
    whole = shadow(root, "whole", split_min_files=10).baseline()
    assert whole.tree == git(root, "rev-parse", "HEAD^{tree}").decode().strip() and aside == []
    (root / "d3" / "s1" / "untracked.txt").write_bytes(b"new\n")
    changed = shadow(root, "changed", split_min_files=10).baseline()
    assert aside == [] and changed.tree == hashed_tree(tmp_path, shadow, root)
    assert git(root, "rev-parse", "HEAD:d0").decode().strip() not in still_borrowed(shadow(root, "changed"))


def test_an_invalidated_cache_tree_is_written_around(tmp_path: Path, shadow: Any) -> None:
    """`git add` of a changed file invalidates the index's trees above it (and a malformed or
    missing cache-tree gives none): the baseline writes those, and takes the rest."""
    files = {f"{folder}/f{i}.txt": f"{folder} {i}\n".encode() for folder in ("a", "b/c", "b/d") for i in range(4)}
    root = make_repo(tmp_path / "repo", files)
    (root / "b" / "c" / "f0.txt").write_bytes(b"staged, not committed\n")
    backdate(root, "b/c/f0.txt")
    git(root, "add", "b/c/f0.txt")
    sh = shadow(root)
    result = sh.baseline()
    assert (result.stats.borrowed, result.stats.hashed) == (len(files), 0)
    assert result.tree == hashed_tree(tmp_path, shadow, root)
    lent = still_borrowed(sh)
    trees = folder_trees(root)
    assert trees["a"] in lent and trees["b/d"] in lent and trees["b"] not in lent and trees[""] not in lent
    assert_byte_exact(sh, result.tree)


def test_trees_the_user_lost_before_the_copy_are_rebuilt_from_the_files(tmp_path: Path, make_engine: Any) -> None:
    """Trees only the index named (`git write-tree`, never committed), unreachable once the
    index changed and pruned by `git gc` before the background copy: the copy reports the
    root's lost, and the root's next stage writes the trees again from the tracked files and
    hashes the files whose blobs are not its own (same files, same ids: the baseline's
    checkpoint is whole again)."""
    files = {f"{folder}/f{i}.txt": f"{folder} {i}\n".encode() for folder in ("a", "b") for i in range(3)}
    root = Path(os.path.realpath(make_repo(tmp_path / "work" / "proj", files, commit=False)))
    tree = git(root, "write-tree").decode().strip()
    eng, state, gate = held_copy_engine(make_engine, root)
    assert state.cache.tree == tree  # taken whole from the index
    git(root, "rm", "-q", "--cached", "b/f1.txt")  # the index no longer names the root's and b's trees
    git(root, "gc", "-q", "--prune=now")
    with pytest.raises(subprocess.CalledProcessError):
        git(root, "cat-file", "-e", tree)
    gate.set()
    assert state.wait_copied(60)
    report = state.last_copy
    # the root tree lost, nothing below it could be listed: the ledger goes, and the root's
    # check finds the snapshot's objects missing
    assert report is not None and report.lost == [""]
    assert not borrowed.ledger_path(state.ws.git_dir).exists()
    from tests.integration.test_engine import edit_round

    assert edit_round(eng, root, 10, {"c/new.txt": "a round after the copy\n"}) is not None
    env = {**os.environ, "GIT_CONFIG_NOSYSTEM": "1"}
    for rel, data in files.items():  # the shadow repository's own objects only
        assert subprocess.run(["git", f"--git-dir={state.ws.git_dir}", "cat-file", "blob", f"{tree}:{rel}"],
                              check=True, capture_output=True, env=env).stdout == data


def test_index_version_4(tmp_path: Path, shadow: Any) -> None:
    root = make_repo(tmp_path / "repo", FILES)
    git(root, "update-index", "--index-version", "4")
    sh = shadow(root)
    result = sh.baseline()
    assert (result.stats.borrowed, result.stats.hashed) == (len(FILES), 0)
    assert_byte_exact(sh, result.tree)


def test_symlinks_and_exec_bits(tmp_path: Path, shadow: Any) -> None:
    root = make_repo(tmp_path / "repo", {"run.sh": b"#!/bin/sh\n", "target.txt": b"t\n"}, commit=False)
    os.chmod(root / "run.sh", 0o755)
    (root / "link").symlink_to("target.txt")
    backdate(root, "run.sh", "link")
    git(root, "add", "-A")
    sh = shadow(root)
    result = sh.baseline()
    assert (result.stats.borrowed, result.stats.hashed) == (3, 0)
    listing = sh.repo.list_tree(result.tree)
    assert (listing["run.sh"].mode, listing["link"].mode) == (0o100755, 0o120000)
    assert cat_file(sh.git_dir, listing["link"].oid) == b"target.txt"


def test_staged_but_uncommitted(tmp_path: Path, shadow: Any) -> None:
    root = make_repo(tmp_path / "repo", FILES)
    (root / "README.md").write_bytes(b"# staged version\n")
    (root / "new.txt").write_bytes(b"staged, never committed\n")
    backdate(root, "README.md", "new.txt")
    git(root, "add", "README.md", "new.txt")
    (root / "src" / "app.py").write_bytes(b"print('edited after staging')\n")  # not staged
    staged = dict(line.split(b"\t")[::-1] for line in git(root, "ls-files", "-s").splitlines())
    sh = shadow(root)
    result = sh.baseline()
    assert (result.stats.borrowed, result.stats.hashed) == (len(FILES), 1)
    oids = assert_byte_exact(sh, result.tree)
    assert oids["README.md"] == staged[b"README.md"].split()[1].decode()
    assert oids["new.txt"] == staged[b"new.txt"].split()[1].decode()
    assert oids["src/app.py"] != staged[b"src/app.py"].split()[1].decode()


def test_racy_entry_is_hashed(tmp_path: Path, shadow: Any) -> None:
    root = make_repo(tmp_path / "repo", FILES)
    racy = root / "docs" / "notes.txt"
    index = root / ".git" / "index"
    # the index written within the same second as the file's last change: git's racy case
    mtime = racy.stat().st_mtime_ns
    os.utime(index, ns=(mtime, mtime))
    sh = shadow(root)
    proof_stat = racy.stat()
    result = sh.baseline()
    assert racy.stat().st_mtime_ns == proof_stat.st_mtime_ns  # its stat still matches the entry
    # every entry is now as young as the index: all of them are racy
    assert (result.stats.borrowed, result.stats.hashed) == (0, len(FILES))
    assert_byte_exact(sh, result.tree)


def test_one_racy_entry_among_old_ones(tmp_path: Path, shadow: Any) -> None:
    root = make_repo(tmp_path / "repo", FILES, commit=False)
    index = root / ".git" / "index"
    # an entry recorded half a second before the index was written: within the margin
    young = root / "docs" / "notes.txt"
    index_mtime = index.stat().st_mtime_ns
    os.utime(young, ns=(index_mtime - 500_000_000, index_mtime - 500_000_000))
    git(root, "update-index", "--refresh")
    os.utime(index, ns=(index_mtime, index_mtime))
    assert git(root, "diff", "--name-only") == b""
    sh = shadow(root)
    result = sh.baseline()
    assert (result.stats.borrowed, result.stats.hashed) == (len(FILES) - 1, 1)
    assert_byte_exact(sh, result.tree)


# ---- hashed: a conversion may be in effect -----------------------------------------------------


def test_autocrlf_in_repo_config_hashes_and_keeps_crlf(tmp_path: Path, shadow: Any) -> None:
    root = tmp_path / "repo"
    root.mkdir()
    git(root, "init", "-q")
    git(root, "config", "core.autocrlf", "true")
    (root / "dos.txt").write_bytes(b"line one\r\nline two\r\n")
    (root / "unix.txt").write_bytes(b"plain\n")
    backdate(root)
    git(root, "add", "-A")
    git(root, "commit", "-qm", "crlf")
    sh = shadow(root)
    result = sh.baseline()
    assert (result.stats.borrowed, result.stats.hashed) == (0, 2)
    oids = assert_byte_exact(sh, result.tree)
    assert cat_file(sh.git_dir, oids["dos.txt"]) == b"line one\r\nline two\r\n"
    # git itself stored the converted content: taking its id would have lost the CRs
    assert git(root, "cat-file", "blob", "HEAD:dos.txt") == b"line one\nline two\n"


@pytest.mark.parametrize("attributes", ["* text=auto\n", "*.txt eol=crlf\n", "*.c ident\n",
                                        "*.dat filter=upper\n", "*.txt working-tree-encoding=UTF-16\n"])
def test_conversion_attributes_hash_everything(tmp_path: Path, shadow: Any, attributes: str) -> None:
    files = {".gitattributes": attributes.encode(), "dos.txt": b"a\r\nb\r\n", "id.c": b"/* $Id$ */\n",
             "low.dat": b"lower case\n", "sub/plain.md": b"plain\n"}
    root = tmp_path / "repo"
    root.mkdir()
    git(root, "init", "-q")
    git(root, "config", "filter.upper.clean", "tr a-z A-Z")
    git(root, "config", "filter.upper.smudge", "cat")
    for rel, data in files.items():
        (root / rel).parent.mkdir(exist_ok=True)
        (root / rel).write_bytes(data)
    backdate(root)
    with contextlib.suppress(subprocess.CalledProcessError):  # UTF-16 re-encoding may refuse
        git(root, "add", "-A")
        git(root, "commit", "-qm", "attributes")
    sh = shadow(root)
    result = sh.baseline()
    assert (result.stats.borrowed, result.stats.hashed) == (0, len(files))
    assert_byte_exact(sh, result.tree)


def test_nested_attributes_file_takes_back_ids_already_taken(tmp_path: Path, shadow: Any) -> None:
    files = {"a.txt": b"a\r\n", "zz/.gitattributes": b"* text eol=lf\n", "zz/dos.txt": b"x\r\ny\r\n"}
    root = make_repo(tmp_path / "repo", files)
    assert git(root, "cat-file", "blob", "HEAD:zz/dos.txt") == b"x\ny\n"  # converted by git
    sh = shadow(root)
    result = sh.baseline()
    assert (result.stats.borrowed, result.stats.hashed) == (0, len(files))
    assert_byte_exact(sh, result.tree)


def test_a_borrowed_file_staged_again_with_new_content_leaves_the_ledger(tmp_path: Path, shadow: Any) -> None:
    """A blob is read from the user's repository only while the snapshot's path still holds
    the index's id: an edit tool's early capture of a file the scan may have proven already
    (its id is recorded once the walk is over) keeps the capture, hashed."""
    files = {f"m/f{i:03d}.txt": f"file {i}\n".encode() for i in range(40)}
    root = make_repo(tmp_path / "repo", files)
    sh = shadow(root)
    changed, same = sorted(files)[:2]
    with held_baseline(sh, after_files=20) as (capture, _cache, done):
        (root / changed).write_bytes(b"changed since the index, before the edit\n")
        request = capture.request([RepoPath(changed), RepoPath(same)])
        assert request.done.wait(60)
    result = done["result"]
    assert result.stats.borrowed + result.stats.hashed == len(files) and result.stats.hashed >= 1
    assert borrowed.read_ledger(sh.git_dir) is not None
    snapshot = assert_byte_exact(sh, result.tree)
    lent = still_borrowed(sh)
    assert changed not in lent.values() and snapshot[changed] not in lent
    assert all(snapshot[path] == oid for oid, path in lent.items())
    assert len(lent) == result.stats.borrowed


def test_split_index_is_doubt_and_hashes(tmp_path: Path, shadow: Any) -> None:
    root = make_repo(tmp_path / "repo", FILES)
    git(root, "update-index", "--split-index")
    sh = shadow(root)
    result = sh.baseline()
    assert (result.stats.borrowed, result.stats.hashed) == (0, len(FILES))
    assert_byte_exact(sh, result.tree)
    assert sh.repo.borrowing == [] and borrowed.read_ledger(sh.git_dir) is None


def test_skip_worktree_and_assume_valid_are_hashed(tmp_path: Path, shadow: Any) -> None:
    root = make_repo(tmp_path / "repo", FILES)
    git(root, "update-index", "--assume-unchanged", "README.md")
    git(root, "update-index", "--skip-worktree", "docs/notes.txt")
    # content changed behind git's back: the flags tell git not to look
    (root / "README.md").write_bytes(b"# edited behind git's back\n")
    sh = shadow(root)
    result = sh.baseline()
    assert (result.stats.borrowed, result.stats.hashed) == (len(FILES) - 2, 2)
    assert_byte_exact(sh, result.tree)


# ---- the user's repository loses objects before the copy --------------------------------------


def test_user_repo_gc_right_after_baseline(tmp_path: Path, shadow: Any) -> None:
    root = make_repo(tmp_path / "repo", FILES)
    (root / "staged.txt").write_bytes(b"only in the index\n")
    backdate(root, "staged.txt")
    git(root, "add", "staged.txt")
    sh = shadow(root)
    result = sh.baseline()
    assert result.stats.borrowed == len(FILES) + 1
    git(root, "gc", "-q", "--prune=now")  # loose objects packed, the loose files removed
    oids = assert_byte_exact(sh, result.tree)
    report = sh.copy()
    assert report.finished and not report.lost
    own_objects_only(sh, list(oids.values()))
    shutil.rmtree(root / ".git")
    sh.repo.reopen()
    assert assert_byte_exact(sh, result.tree) == oids


def test_borrowed_object_deleted_before_the_copy(tmp_path: Path, shadow: Any) -> None:
    root = make_repo(tmp_path / "repo", FILES)
    sh = shadow(root)
    result = sh.baseline()
    listing = sh.repo.list_tree(result.tree)
    gone = listing["src/app.py"].oid
    (root / ".git" / "objects" / gone[:2] / gone[2:]).unlink()
    changed = listing["docs/notes.txt"].oid
    (root / ".git" / "objects" / changed[:2] / changed[2:]).unlink()
    (root / "docs" / "notes.txt").write_bytes(b"changed since the baseline\n")
    report = sh.copy()
    # the file still holding the blob gives it back; the changed one is reported, never silent
    assert report.rehashed == 1 and report.lost == ["docs/notes.txt"]
    assert cat_file(sh.git_dir, gone) == b"print('hi')\n"
    assert report.finished and borrowed.read_ledger(sh.git_dir) is None


def test_a_taken_tree_whose_subtree_the_user_lost_is_reported_not_copied_in_part(tmp_path: Path, shadow: Any) -> None:
    """The root's tree taken whole from the index, one of its folders' trees gone from the
    user's objects before the copy: the copy cannot list the snapshot whole, and says which
    tree is lost (the root then checks its tracked set: `RootState._verify`) instead of
    dropping the ledger as if all was copied."""
    root = make_repo(tmp_path / "repo", FILES)
    sh = shadow(root)
    result = sh.baseline()
    assert result.tree == git(root, "rev-parse", "HEAD^{tree}").decode().strip()
    deep = git(root, "rev-parse", "HEAD:src/deep").decode().strip()
    (root / ".git" / "objects" / deep[:2] / deep[2:]).unlink()
    report = sh.copy()
    assert report.lost == ["src/deep"]  # its id was listed before it could not be read


# ---- through the engine -----------------------------------------------------------------------


def test_engine_baseline_borrows_then_copies_in_the_background(tmp_path: Path, make_engine: Any) -> None:
    root = Path(os.path.realpath(make_repo(tmp_path / "work" / "proj", FILES)))
    before = git_dir_state(root / ".git")
    _, state, gate = held_copy_engine(make_engine, root)  # the user's repository is collected first
    with state.locked() as locked:
        assert locked.repo.borrowing
    assert borrowed.ledger_path(state.ws.git_dir).exists()
    git(root, "gc", "-q", "--prune=now")
    gate.set()
    assert state.wait_copied(60)
    assert state.last_copy is not None and state.last_copy.finished
    assert state.last_copy.copied == len(FILES) + len(folder_trees(root))
    assert not borrowed.ledger_path(state.ws.git_dir).exists()
    assert git_dir_state(root / ".git") != before  # gc ran (the test's own change) ...
    shutil.rmtree(root / ".git")
    tree = state.cache.tree
    shadow_repo = ShadowRepo.open_existing(state.ws.git_dir)
    try:
        for path, entry in shadow_repo.list_tree(tree).items():
            assert cat_file(state.ws.git_dir, entry.oid) == (root / path).read_bytes()
    finally:
        shadow_repo.close()


def _copy_behind_an_open_round(tmp_path: Path, make_engine: Any, monkeypatch: pytest.MonkeyPatch
                               ) -> tuple[Engine, Any]:
    """An engine whose baseline borrowed blobs, with a round open when its copy is let go (the
    copy's yield limit an hour: only the round's end, or a close, lets it on)."""
    from shadowpoint import engine as engine_module

    monkeypatch.setattr(engine_module, "COPY_YIELD_MAX_S", 3600.0)
    root = Path(os.path.realpath(make_repo(tmp_path / "work" / "proj", FILES)))
    eng, state, gate = held_copy_engine(make_engine, root)
    eng.begin_round("t1")
    gate.set()
    return eng, state


def test_engine_copy_waits_while_a_round_is_open(tmp_path: Path, make_engine: Any,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The copy yields to the agent's rounds (a Python thread copying objects slowed every
    hook's request 40-fold at 100k files): it does not read a batch while a round is open."""
    eng, state = _copy_behind_an_open_round(tmp_path, make_engine, monkeypatch)
    root = state.ws.root
    assert not state.wait_copied(0.5)  # still waiting before its first batch
    assert borrowed.ledger_path(state.ws.git_dir).exists()
    eng.end_round("t1", 10)
    assert state.wait_copied(60)
    assert state.last_copy is not None and state.last_copy.finished
    assert state.last_copy.copied == len(FILES) + len(folder_trees(root))
    assert not borrowed.ledger_path(state.ws.git_dir).exists()


class _Clock:
    """The engine module's `time`, its monotonic clock moved by the test alone."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


def test_a_tool_that_waited_for_the_baseline_goes_on_before_the_copy(tmp_path: Path, make_engine: Any,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A tool that waited for a long baseline is answered first: the background copy (and the
    stat cache's write) waits a quiet moment from the baseline's end, not from the tool's
    request, which is older (at 100k files its first batch took the interpreter from the
    waiting thread for 10-30 ms)."""
    clock = _Clock()
    monkeypatch.setattr(engine_mod, "time", clock)
    root = Path(os.path.realpath(make_repo(tmp_path / "work" / "proj", FILES)))
    eng: Engine = make_engine(root)
    (state,) = eng.roots.values()
    passed: list[bool] = []
    real_yield = eng.yield_to_rounds

    def yield_to_rounds() -> None:
        real_yield()
        passed.append(True)

    monkeypatch.setattr(eng, "yield_to_rounds", yield_to_rounds)
    state.copy_pause = yield_to_rounds
    idle_seen = threading.Event()
    real_idle = eng._is_idle

    def is_idle() -> bool:
        idle = real_idle()
        if idle:
            idle_seen.set()
        return idle

    monkeypatch.setattr(eng, "_is_idle", is_idle)
    hold = eng.baseline_hold = ScanHold(after_files=1)
    eng.start_task("t1", 0)
    (rt,) = eng._tasks.values()
    waiter = threading.Thread(target=eng.wait_ready, args=("t1",))
    waiter.start()  # the tool's request, at 1000
    assert hold.reached.wait(60)
    deadline = time.monotonic() + 60
    while rt.waiting_for_baseline == 0 and time.monotonic() < deadline:
        time.sleep(0.01)  # until the tool waits (a marker, not a duration)
    clock.now += 10 * engine_mod.COPY_QUIET_S  # the baseline takes long after the request
    hold.release()
    waiter.join(60)
    assert not waiter.is_alive() and rt.state is TaskState.READY
    assert idle_seen.wait(60)  # the copy looked: the engine is idle now
    assert not passed and borrowed.ledger_path(state.ws.git_dir).exists()
    clock.now += 2 * engine_mod.COPY_QUIET_S  # quiet since the baseline's end
    assert state.wait_copied(60)
    assert passed and not borrowed.ledger_path(state.ws.git_dir).exists()


def test_engine_never_writes_the_user_git_dir(tmp_path: Path, make_engine: Any) -> None:
    root = Path(os.path.realpath(make_repo(tmp_path / "work" / "proj", FILES)))
    before = git_dir_state(root / ".git")
    eng: Engine = make_engine(root)
    (state,) = eng.roots.values()
    eng.start_task("t1", 0)
    from tests.integration.test_engine import wait_ready

    assert wait_ready(eng, "t1") == "ready"
    assert state.wait_copied(60)
    assert state.last_copy is not None and state.last_copy.finished
    eng.close()
    assert git_dir_state(root / ".git") == before


def test_interrupted_copy_resumes_on_next_open(tmp_path: Path, make_engine: Any) -> None:
    root = Path(os.path.realpath(make_repo(tmp_path / "work" / "proj", FILES)))
    eng, state, _ = held_copy_engine(make_engine, root)  # the gate never set: the process "dies" first
    eng.close()
    git_dir = state.ws.git_dir
    assert borrowed.ledger_path(git_dir).exists()
    eng2: Engine = make_engine(root)
    (state2,) = eng2.roots.values()
    with state2.locked() as locked:
        locked.open()  # finds the ledger and copies
    assert state2.wait_copied(60)
    assert state2.last_copy is not None and state2.last_copy.finished
    assert not borrowed.ledger_path(git_dir).exists()


def test_a_ledger_of_blobs_from_an_earlier_version_is_copied_on_next_open(tmp_path: Path, make_engine: Any) -> None:
    """A baseline's ledger is one line for its tree, not one per file; one that an earlier
    version wrote (a line per borrowed blob) is still copied by the next open."""
    root = Path(os.path.realpath(make_repo(tmp_path / "work" / "proj", FILES)))
    eng, state, _ = held_copy_engine(make_engine, root)  # the gate never set: the process "dies" first
    with state.locked() as locked:
        listing = locked.repo.list_tree(locked.cache.tree)
    eng.close()
    git_dir = state.ws.git_dir
    ledger = borrowed.read_ledger(git_dir)
    assert ledger is not None and ledger.items == {} and len(ledger.trees) == 1
    assert len(borrowed.ledger_path(git_dir).read_text().splitlines()) == 2  # the alternate, the tree
    # the same blobs as an earlier version named them: one line each, no tree
    borrowed.ledger_path(git_dir).write_text("".join(borrowed._lines(
        ledger.alternates[0], ((e.oid, p) for p, e in listing.items()))))
    eng2: Engine = make_engine(root)
    (state2,) = eng2.roots.values()
    with state2.locked() as locked:
        locked.open()
        oids = sorted({e.oid for e in listing.values()})
        assert locked.repo.own_missing(oids) == oids  # nothing copied yet: the copy is the test
    assert state2.wait_copied(60)
    assert state2.last_copy is not None and state2.last_copy.finished
    assert state2.last_copy.copied == len(oids)
    assert not borrowed.ledger_path(git_dir).exists()
    with state2.locked() as locked:
        assert locked.repo.own_missing(oids) == []


def test_close_stops_a_waiting_copy_and_the_next_open_resumes_it(tmp_path: Path, make_engine: Any,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A sidecar told to stop does not first copy every borrowed blob (at 100k files that kept
    `sidecar/stop` and SIGTERM waiting for tens of seconds): the copy ends at its next batch."""
    eng, state = _copy_behind_an_open_round(tmp_path, make_engine, monkeypatch)
    assert not state.wait_copied(0.2)  # the copy waits behind the open round ...
    closing = threading.Thread(target=eng.close)
    closing.start()
    closing.join(60)
    assert not closing.is_alive()  # ... and the close ends it
    git_dir = state.ws.git_dir
    assert state.last_copy is None and borrowed.ledger_path(git_dir).exists()
    eng2: Engine = make_engine(state.ws.root)
    (state2,) = eng2.roots.values()
    with state2.locked() as locked:
        locked.open()
    assert state2.wait_copied(60)
    assert state2.last_copy is not None and state2.last_copy.finished
    assert not borrowed.ledger_path(git_dir).exists()


# ---- a baseline split between this process and a forked child ----------------------------------

# 80 index entries: "a/" holds half of them, so the forked child walks exactly "a/"
SPLIT_FILES = {
    **{f"a/x{i:02d}.txt": f"a {i}\n".encode() for i in range(30)},
    **{f"a/deep/y{i:02d}.txt": f"deep {i}\n".encode() for i in range(10)},
    **{f"b/z{i:02d}.txt": f"b {i}\n".encode() for i in range(25)},
    **{f"c/w{i:02d}.txt": f"c {i}\n".encode() for i in range(10)},
    **{f"r{i}.txt": f"r {i}\n".encode() for i in range(5)},
}


@pytest.fixture
def forks(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The units each forked baseline child was given (the fork itself is real)."""
    given: list[str] = []
    real = Scanner._split

    def spy(self: Scanner, run: Any) -> Any:
        part = real(self, run)
        if part is not None:
            given.extend(sorted(part.units))
        return part

    monkeypatch.setattr(Scanner, "_split", spy)
    return given


def split_and_whole(tmp_path: Path, shadow: Any, files: dict[str, bytes],
                    change: Any = None) -> tuple[StageResult, StageResult, Shadow, StatCache, StatCache]:
    root = make_repo(tmp_path / "repo", files)
    if change is not None:
        change(root)
    split, whole = shadow(root, "split", split_min_files=10), shadow(root, "whole", split_min_files=None)
    split_cache, whole_cache = StatCache(), StatCache()
    split_result = split.scanner.stage(StagePlan(rescan=True), split_cache, borrow=True)
    whole_result = whole.scanner.stage(StagePlan(rescan=True), whole_cache, borrow=True)
    return split_result, whole_result, split, split_cache, whole_cache


def test_a_split_baseline_takes_what_one_process_takes(tmp_path: Path, shadow: Any, forks: list[str]) -> None:
    def change(root: Path) -> None:
        (root / "a/x03.txt").write_bytes(b"changed after the commit\n")  # the child's: hashed here
        (root / "a/new.txt").write_bytes(b"untracked\n")
        (root / "a/x04.txt").unlink()
        (root / "b/z01.txt").write_bytes(b"changed too\n")  # this process's own

    split, whole, sh, split_cache, whole_cache = split_and_whole(tmp_path, shadow, SPLIT_FILES, change)
    assert forks == ["a"]
    assert split.tree == whole.tree
    assert (split.stats.borrowed, split.stats.hashed) == (whole.stats.borrowed, whole.stats.hashed) == (77, 3)
    assert split_cache.entries == whole_cache.entries
    oids = assert_byte_exact(sh, split.tree)
    lent = still_borrowed(sh)
    assert sorted(p for p in lent.values() if p in oids) == sorted(
        p for p in SPLIT_FILES if p not in ("a/x03.txt", "a/x04.txt", "b/z01.txt"))
    assert oids["a/new.txt"] not in lent


@pytest.fixture
def taken_units(monkeypatch: pytest.MonkeyPatch) -> list[set[str]]:
    """The folders whose tree, written by a split baseline's walkers, each baseline took."""
    taken: list[set[str]] = []
    real = Scanner._taken_units

    def spy(run: Any, ordered: Any) -> Any:
        found = real(run, ordered)
        taken.append(set(found))
        return found

    monkeypatch.setattr(Scanner, "_taken_units", staticmethod(spy))
    return taken


@pytest.mark.parametrize(("changed", "taken"), [((), {"a", "b", "c"}), (("b/z01.txt",), {"a", "b", "c"}),
                                                (("a/deep/y03.txt",), {"b", "c"})])
def test_the_trees_the_walkers_wrote_are_taken_where_their_files_are_unchanged(
        tmp_path: Path, shadow: Any, forks: list[str], taken_units: list[set[str]], changed: tuple[str, ...],
        taken: set[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """The child writes the trees of its units once it walked them and this process those of
    its own folders (the root's tree is not the index's: a tracked `node_modules` is left
    out). A file the index does not prove in the child's unit leaves the unit to this process
    (it hashes the file: "a"); in this process's own folders it is hashed before their trees
    are written ("b"). The tree is the one hashing every file gives, and one process's."""
    monkeypatch.setattr(scanner, "PACKED_TREES_MIN", 10)  # a big baseline's ways at 81 files
    files = {**SPLIT_FILES, "node_modules/m/index.js": b"x\n"}

    def change(root: Path) -> None:
        for path in changed:
            (root / path).write_bytes(b"changed after the commit\n")
            backdate(root, path)

    split, whole, sh, split_cache, whole_cache = split_and_whole(tmp_path, shadow, files, change)
    assert forks == ["a"] and taken_units[0] == taken
    assert split.tree == whole.tree == hashed_tree(tmp_path, shadow, sh.root)
    assert split_cache.entries == whole_cache.entries
    assert_byte_exact(sh, split.tree, left_out=("node_modules",))


def test_this_process_records_the_childs_files_while_the_child_writes_its_trees(
        tmp_path: Path, shadow: Any, forks: list[str], taken_units: list[set[str]],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The child gives its files as soon as its walk is over, and the trees of its units after
    them: this process records the files while the child writes the trees (~20 ms of a 100k-file
    baseline's end). The seam: the child's trees wait for a marker this process leaves once it
    took the files (a child that gave everything at the end would wait in vain, fail, and
    leave its folders and their trees to this process). Its trees are still taken."""
    monkeypatch.setattr(scanner, "PACKED_TREES_MIN", 10)  # a big baseline's ways at 81 files
    marker = tmp_path / "the child's files taken"
    real_take, real_trees = Scanner._take_share, Scanner._unit_trees

    def take(self: Scanner, *args: Any) -> Any:
        found = real_take(self, *args)
        marker.write_text("taken\n")
        return found

    def trees(self: Scanner, *args: Any) -> Any:  # in the child
        deadline = time.monotonic() + 60
        while not marker.exists():
            if time.monotonic() > deadline:
                raise TimeoutError("this process never took the files")
            time.sleep(0.01)
        return real_trees(self, *args)

    monkeypatch.setattr(Scanner, "_take_share", take)
    monkeypatch.setattr(Scanner, "_unit_trees", trees)
    files = {**SPLIT_FILES, "node_modules/m/index.js": b"x\n"}
    split, whole, sh, _, _ = split_and_whole(tmp_path, shadow, files)
    assert forks == ["a"] and taken_units[0] == {"a", "b", "c"}
    assert split.tree == whole.tree == hashed_tree(tmp_path, shadow, sh.root)
    assert split.stats.borrowed == len(SPLIT_FILES)


def test_an_edit_asked_for_while_this_process_writes_its_trees_is_captured_then(
        tmp_path: Path, shadow: Any, forks: list[str], taken_units: list[set[str]],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """SPEC §3 while this process writes its own folders' trees (the child still works): an
    edit tool's request is served from within the trees, not after them (at 1M files they take
    ~1 s). The captured path is pinned, so its folder's tree, written before, is not taken."""
    monkeypatch.setattr(scanner, "PACKED_TREES_MIN", 10)
    monkeypatch.setattr(shadow_repo, "_POLL_FOLDERS", 1)
    files = {**SPLIT_FILES, "node_modules/m/index.js": b"x\n"}
    root = make_repo(tmp_path / "repo", files)
    sh = shadow(root, split_min_files=10)
    capture, cache = EarlyCapture(), StatCache()
    asked: list[Any] = []
    real = ShadowRepo.write_folder_trees

    def trees(self: ShadowRepo, tops: Any, listed: Any, poll: Any = None) -> Any:
        if poll is not None and not asked:  # this process's own trees
            (root / "b" / "z03.txt").write_bytes(b"the person's edit, before the tool's\n")
            asked.append(capture.request([RepoPath("b/z03.txt")]))
        found = real(self, tops, listed, poll)
        if asked:
            assert asked[0].done.is_set(), "the request waited for the trees"
        return found

    monkeypatch.setattr(ShadowRepo, "write_folder_trees", trees)
    result = sh.scanner.stage(StagePlan(rescan=True), cache, capture, borrow=True)
    assert forks == ["a"] and len(asked) == 1 and asked[0].done.is_set()
    assert "b" not in taken_units[0] and {"a", "c"} <= taken_units[0]
    assert result.tree == hashed_tree(tmp_path, shadow, sh.root)
    listing = sh.repo.list_tree(result.tree)
    assert cat_file(sh.git_dir, listing["b/z03.txt"].oid) == b"the person's edit, before the tool's\n"


def test_an_edit_asked_for_within_a_big_folder_is_served_between_two_slices(
        tmp_path: Path, shadow: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """SPEC §3 in a fresh baseline's folder proven a slice at a time (`_prove_listed`): a
    request filed while one slice is proven is served before the next, and both its paths keep
    the content they had then: one the index proved in that slice, one it cannot prove (changed
    since the index), which is walked after the capture."""
    monkeypatch.setattr(scanner, "_PROVE_SLICE", 4)
    files = {f"big/f{i:02}.txt": f"{i}\n".encode() for i in range(12)}
    root = make_repo(tmp_path / "repo", files)
    (root / "big/f10.txt").write_bytes(b"the person's change, before the task\n")
    sh = shadow(root)
    capture, cache = EarlyCapture(), StatCache()
    asked: list[Any] = []
    served: list[bool] = []
    real = IndexProof.prove_folder

    def prove_folder(self: IndexProof, prefix: str, names: Any, *args: Any) -> list[int]:
        if prefix == "big/":
            if not asked:  # the first slice, f00 to f03
                asked.append(capture.request([RepoPath("big/f01.txt"), RepoPath("big/f10.txt")]))
            elif not served:
                served.append(asked[0].done.is_set())
                (root / "big/f01.txt").write_bytes(b"the tool's edit\n")
                (root / "big/f10.txt").write_bytes(b"the tool's edit too\n")
        return real(self, prefix, names, *args)

    monkeypatch.setattr(IndexProof, "prove_folder", prove_folder)
    result = sh.scanner.stage(StagePlan(rescan=True), cache, capture, borrow=True)
    assert served == [True], "the request waited for the folder's end"
    listing = sh.repo.list_tree(result.tree)
    assert cat_file(sh.git_dir, listing["big/f01.txt"].oid) == files["big/f01.txt"]
    assert cat_file(sh.git_dir, listing["big/f10.txt"].oid) == b"the person's change, before the task\n"
    assert cat_file(sh.git_dir, listing["big/f11.txt"].oid) == files["big/f11.txt"]
    assert len(listing) == len(files)
    assert result.stats.borrowed == len(files) - 2


def test_a_failed_child_leaves_its_folders_to_this_process(tmp_path: Path, shadow: Any, forks: list[str],
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    def crash(*_args: Any) -> bytes:
        raise MemoryError("the child ran out")

    monkeypatch.setattr(Scanner, "_share_in_child", crash)
    split, whole, sh, split_cache, whole_cache = split_and_whole(tmp_path, shadow, SPLIT_FILES)
    assert forks == ["a"]
    assert split.tree == whole.tree and split_cache.entries == whole_cache.entries
    assert split.stats.borrowed == len(SPLIT_FILES)
    assert_byte_exact(sh, split.tree)


def test_a_conversion_attribute_in_the_childs_folders_hashes_every_file(tmp_path: Path, shadow: Any,
                                                                         forks: list[str]) -> None:
    files = {**SPLIT_FILES, "a/deep/.gitattributes": b"*.txt text eol=crlf\n"}
    split, whole, sh, _, _ = split_and_whole(tmp_path, shadow, files)
    assert forks == ["a"]
    assert split.tree == whole.tree
    assert (split.stats.borrowed, split.stats.hashed) == (0, len(files))
    assert_byte_exact(sh, split.tree)
    assert still_borrowed(sh) == {}  # no blob is read from the user's repository


def test_an_edit_captured_while_the_child_scans_keeps_its_old_bytes(tmp_path: Path, shadow: Any,
                                                                     forks: list[str]) -> None:
    """SPEC §3 with the split: the capture is served here while the child walks "a/"; the
    child's answer for the captured file never replaces it. The file differs from the index
    before the scan, so the child gives it back to be hashed here, after the edit."""
    root = make_repo(tmp_path / "repo", SPLIT_FILES)
    (root / "a/x07.txt").write_bytes(b"the person's own change, before the task\n")
    sh = shadow(root, split_min_files=10)
    # held after this process's first files: the child runs meanwhile
    with held_baseline(sh, after_files=3) as (capture, _, done):
        request = capture.request([RepoPath("a/x07.txt"), RepoPath("a/deep/y01.txt")])
        assert request.done.wait(60)
        (root / "a/x07.txt").write_bytes(b"the edit tool's new bytes\n")
        (root / "a/deep/y01.txt").unlink()
    assert forks == ["a"]
    listing = sh.repo.list_tree(done["result"].tree)
    assert cat_file(sh.git_dir, listing["a/x07.txt"].oid) == b"the person's own change, before the task\n"
    assert cat_file(sh.git_dir, listing["a/deep/y01.txt"].oid) == SPLIT_FILES["a/deep/y01.txt"]
    assert len(listing) == len(SPLIT_FILES)


@pytest.fixture
def forked_pids(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The process id of each child `Forked.start` forks (the fork itself is real)."""
    pids: list[int] = []
    real_start = Forked.start

    def start(*args: Any, **kwargs: Any) -> Forked | None:
        child = real_start(*args, **kwargs)
        if child is not None:
            pids.append(child.pid)
        return child

    monkeypatch.setattr(Forked, "start", start)
    return pids


@pytest.mark.parametrize("failing", ["_scan_folders", "_take_share"])
def test_a_baseline_that_fails_here_leaves_no_child_behind(tmp_path: Path, shadow: Any, forks: list[str],
                                                            forked_pids: list[int], failing: str,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """This process fails while it walks its part, or while it takes the child's files (the
    child then still writes its trees): the child is killed and reaped either way."""
    started = forked_pids

    def full_disk(*_args: Any) -> Any:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Scanner, failing, full_disk)
    root = make_repo(tmp_path / "repo", SPLIT_FILES)
    sh = shadow(root, split_min_files=10)
    with pytest.raises(OSError):
        sh.baseline()
    assert forks == ["a"] and len(started) == 1
    with pytest.raises(ChildProcessError):
        os.waitpid(started[0], os.WNOHANG)  # reaped: no zombie, no process left working


# ---- the index read in both processes of a split, and the watches placed by the scan ---------------


def _proof_fields(proof: IndexProof | None) -> Any:
    assert proof is not None
    return (proof.git_dir, proof.objects_dir, proof.body, proof.entries, proof.racy_before_ns, proof.version,
            proof.extensions)


def test_an_open_index_is_read_as_it_was_when_opened(tmp_path: Path) -> None:
    """The child of a split reads the index through the parent's descriptor: the same file,
    even when git has renamed a new index over its path meanwhile."""
    root = make_repo(tmp_path / "repo", FILES)
    fd = git_index.open_index(root / ".git" / "index")
    try:
        before = IndexProof.load(root)
        (root / "added.txt").write_text("new\n")
        git(root, "add", "added.txt")  # git writes index.lock and renames it over the index
        through_fd = IndexProof.load(root, fd=fd)
    finally:
        os.close(fd)
    assert _proof_fields(through_fd) == _proof_fields(before)
    after = IndexProof.load(root)
    assert after is not None and "added.txt" in after.entries and "added.txt" not in _proof_fields(before)[3]


def test_a_child_that_finds_no_part_leaves_it_to_this_process(tmp_path: Path, shadow: Any, forks: list[str],
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """The child reads the index itself; one that finds it in doubt (or no part to walk)
    answers so, and this process walks the part it gave it."""
    pid = os.getpid()
    real_read = IndexProof.read.__func__  # type: ignore[attr-defined]

    def read(cls: type[IndexProof], *args: Any, **kwargs: Any) -> Any:
        if os.getpid() != pid:
            return "doubted in the child"
        return real_read(cls, *args, **kwargs)

    monkeypatch.setattr(IndexProof, "read", classmethod(read))
    split, whole, sh, split_cache, whole_cache = split_and_whole(tmp_path, shadow, SPLIT_FILES)
    assert forks == ["a"]
    assert split.tree == whole.tree and split_cache.entries == whole_cache.entries
    assert split.stats.borrowed == len(SPLIT_FILES)  # this process's proof took the child's part too
    assert_byte_exact(sh, split.tree)


def _watched(watcher: WorkspaceWatcher) -> set[str]:
    observer = watcher._observer
    assert isinstance(observer, inotify.ShadowObserver) and observer.group is not None
    marker = observer.group.hooks.marker_dir
    return {os.fsdecode(p) for p in observer.group._active_callbacks_by_path if p != marker}


def _deferred_watcher(root: Path) -> WorkspaceWatcher:
    rules = ExclusionRules(root)
    watcher = WorkspaceWatcher(root, skip_dirs=lambda rel: rules.is_excluded(rel, is_dir=True))
    watcher.start(deferred=True)
    return watcher


def test_a_split_baselines_watches_are_those_of_a_walk(tmp_path: Path, shadow: Any, forks: list[str],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A deferred start's watches are placed by the scan, the child's share by the child (and
    taken over here): the same folders a start that walks the tree watches."""
    # four more files in b: "a" alone (40 of the 85 paths walked) falls short of half by more
    # than the halving's slack, so the child's part takes "nested" too
    files = {**SPLIT_FILES, **{f"b/more{i}.txt": b"m\n" for i in range(4)},
             "nested/.git/HEAD": b"ref: refs/heads/main\n", "nested/n.txt": b"n\n", "node_modules/m/index.js": b"x\n"}
    root = Path(os.path.realpath(make_repo(tmp_path / "repo", files)))
    adopted: list[int] = []
    real_adopt = inotify.FolderWatches.adopt

    def adopt(self: Any, placed: list[tuple[int, bytes]], refused: Any, spent_ms: float = 0.0) -> None:
        adopted.append(len(placed))
        real_adopt(self, placed, refused, spent_ms)

    monkeypatch.setattr(inotify.FolderWatches, "adopt", adopt)
    deferred = _deferred_watcher(root)
    walked = WorkspaceWatcher(root, skip_dirs=deferred._skip_dirs)
    try:
        assert _watched(deferred) == {str(root)}  # only the root's until the scan
        placer = deferred.take_placer()
        assert placer is not None and deferred.take_placer() is None
        sh = shadow(root, split_min_files=10)
        sh.scanner.stage(StagePlan(rescan=True), StatCache(), borrow=True, watches=placer)
        assert placer.finished
        deferred.placed()
        walked.start()
        # the child's units: a (a and a/deep: its watches) and nested, whose one indexed path
        # brings its share nearest the aim (a nested repository: the walks leave it out)
        assert forks == ["a", "nested"] and adopted == [2]
        assert _watched(deferred) == _watched(walked)
        assert {str(root / "a" / "deep"), str(root / "b")} <= _watched(deferred)
        assert not any("nested" in p or "node_modules" in p for p in _watched(deferred))
    finally:
        deferred.stop()
        walked.stop()


def _exited(pid: int) -> bool:
    """The child is done (a zombie until the scan reaps it)."""
    with open(f"/proc/{pid}/stat") as fh:
        return fh.read().rsplit(")", 1)[1].split()[0] == "Z"


def test_a_change_in_the_childs_folders_during_the_scan_is_recorded(tmp_path: Path, shadow: Any,
                                                                     forked_pids: list[int]) -> None:
    """An event of a watch the child placed reaches this process before the watch is taken
    over: it is held with every other event and handled, in order, once the scan ends."""
    root = Path(os.path.realpath(make_repo(tmp_path / "repo", SPLIT_FILES)))
    children = forked_pids
    watcher = _deferred_watcher(root)
    try:
        placer = watcher.take_placer()
        sh = shadow(root, split_min_files=10)
        hold = ScanHold(after_files=3)
        done: dict[str, StageResult] = {}
        scan = threading.Thread(target=lambda: done.update(result=sh.scanner.stage(
            StagePlan(rescan=True), StatCache(), EarlyCapture(hold), borrow=True, watches=placer)))
        scan.start()
        try:
            assert hold.reached.wait(60)
            assert len(children) == 1
            deadline = time.monotonic() + 60
            while not _exited(children[0]):  # its watches placed, its answer in the pipe
                assert time.monotonic() < deadline, "the child never finished"
                time.sleep(0.01)
            (root / "a" / "deep" / "y02.txt").write_bytes(b"changed while the scan was held\n")
            (root / "late.txt").write_bytes(b"made in the root, watched from the start\n")
        finally:
            hold.release()
            scan.join(60)
        watcher.placed()
        assert watcher.flush()
        snap = watcher.swap()
        assert snap.healthy
        assert {RepoPath("a/deep/y02.txt"), RepoPath("late.txt")} <= set(snap.paths)
    finally:
        watcher.stop()


def test_a_scan_that_fails_leaves_every_watch_placed(tmp_path: Path, shadow: Any, forks: list[str],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    root = Path(os.path.realpath(make_repo(tmp_path / "repo", SPLIT_FILES)))

    def full_disk(*_args: Any) -> Any:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Scanner, "_scan_folders", full_disk)
    watcher = _deferred_watcher(root)
    walked = WorkspaceWatcher(root, skip_dirs=watcher._skip_dirs)
    try:
        placer = watcher.take_placer()
        assert placer is not None
        with pytest.raises(OSError):
            shadow(root, split_min_files=10).scanner.stage(StagePlan(rescan=True), StatCache(), borrow=True,
                                                           watches=placer)
        assert placer.finished  # abandoned: the watches were placed by a walk
        watcher.placed()
        walked.start()
        assert _watched(watcher) == _watched(walked) and len(_watched(walked)) > 3
        (root / "a" / "x01.txt").write_bytes(b"after\n")
        assert watcher.flush()
        assert RepoPath("a/x01.txt") in watcher.swap().paths
    finally:
        watcher.stop()
        walked.stop()


def test_engine_baseline_with_a_watcher_takes_ids_and_places_its_watches(
        tmp_path: Path, make_engine: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    root = Path(os.path.realpath(make_repo(tmp_path / "work" / "proj", FILES)))
    placers: list[Any] = []
    real_stage = Scanner.stage

    def stage(self: Scanner, *args: Any, **kwargs: Any) -> StageResult:
        placers.append(kwargs.get("watches"))
        return real_stage(self, *args, **kwargs)

    monkeypatch.setattr(Scanner, "stage", stage)
    eng: Engine = make_engine(root, watcher=True)
    (state,) = eng.roots.values()
    eng.start_task("t1", 0)
    from tests.integration.test_engine import wait_ready

    assert wait_ready(eng, "t1") == "ready"
    assert placers and placers[0] is not None and placers[0].finished
    assert state.watcher is not None and state.watcher.is_healthy
    assert _watched(state.watcher) == {str(root), str(root / "src"), str(root / "src" / "deep"), str(root / "docs")}
    assert state.wait_copied(60)
    assert state.last_copy is not None and state.last_copy.copied == len(FILES) + len(folder_trees(root))
    assert_byte_exact_engine(state)


def assert_byte_exact_engine(state: Any) -> None:
    shadow_repo = ShadowRepo.open_existing(state.ws.git_dir)
    try:
        listing = shadow_repo.list_tree(state.cache.tree)
        assert sorted(listing) == sorted(FILES)
        for path, entry in listing.items():
            assert cat_file(state.ws.git_dir, entry.oid) == (state.ws.root / path).read_bytes()
    finally:
        shadow_repo.close()
