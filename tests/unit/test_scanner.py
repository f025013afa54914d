"""Unit tests for `shadowpoint.stage.scanner`: explicit paths vs rescan, racy-clean, skips and links.

Real files in a temp workspace and a real shadow repo; snapshots are compared with the disk
through `read_tree` (filtered by the same exclusion rules), never through the git CLI.
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from shadowpoint.stage.exclusions import ExclusionRules
from shadowpoint.stage.scanner import Scanner, SkipReason, StageOptions, StageResult, is_real_folder
from shadowpoint.stage.stager import StagePlan
from shadowpoint.stage.stat_cache import StatCache, state_entry, state_of
from shadowpoint.store.shadow_repo import ShadowRepo
from shadowpoint.store.values import MODE_EXEC, MODE_FILE, MODE_LINK, TreeEntry
from shadowpoint.workspace import RepoPath
from tests.conftest import Exe, Link, make_tree, read_tree


@dataclass
class Env:
    root: Path
    repo: ShadowRepo
    rules: ExclusionRules
    scanner: Scanner

    def stage(self, cache: StatCache, *, rescan: bool = False, watched: Any = (), forced: Any = (),
              vouched: Any = ()) -> StageResult:
        plan = StagePlan(forced=frozenset(map(RepoPath, forced)), watched=frozenset(map(RepoPath, watched)),
                         rescan=rescan, vouched=frozenset(map(RepoPath, vouched)))
        return self.scanner.stage(plan, cache)

    def snapshot(self, tree: str | None) -> dict[str, Any]:
        """A tree as `read_tree` would show the same files on disk."""
        out: dict[str, Any] = {}
        for path, entry in self.repo.list_tree(tree).items():
            data = self.repo.read_blob(entry.oid)
            if entry.mode == MODE_LINK:
                out[path] = Link(os.fsdecode(data))
            elif entry.mode == MODE_EXEC:
                out[path] = Exe(data)
            else:
                assert entry.mode == MODE_FILE
                out[path] = data
        return out

    def expected(self) -> dict[str, Any]:
        """What a snapshot of the disk must hold: every file the rules include."""
        fresh = ExclusionRules(self.root)
        return {p: v for p, v in read_tree(self.root).items() if not fresh.is_excluded(RepoPath(p), is_dir=False)}


def make_env(root: Path, tmp_path: Path, max_file_bytes: int = 100 * 1024 * 1024,
             split_min_files: int | None = None) -> Env:
    repo = ShadowRepo.open_or_init(tmp_path / "shadow" / ".git", root)
    rules = ExclusionRules(root)
    options = StageOptions(max_file_bytes=max_file_bytes, split_min_files=split_min_files)
    return Env(root, repo, rules, Scanner(root, repo, rules, options))


@pytest.fixture
def env(tmp_path: Path, workspace: Path) -> Iterator[Env]:
    e = make_env(workspace, tmp_path)
    yield e
    e.repo.close()


def assert_consistent(env: Env, cache: StatCache) -> None:
    """The tracked set and the tree it claims to mirror hold the same paths and entries."""
    listing = env.repo.list_tree(cache.tree)
    assert {p: state_entry(s) for p, s in cache.entries.items()} == listing


# ---- basics -----------------------------------------------------------------------------------


def test_baseline_snapshot_is_byte_exact_with_modes_and_links(env: Env) -> None:
    make_tree(env.root, {
        "src/a.py": "print('a')\r\n",
        "bin.dat": bytes(range(256)),
        "run.sh": Exe("#!/bin/sh\n"),
        "link": Link("src/a.py"),
        "dangling": Link("../nowhere/at/all"),
        "dirlink": Link("src"),
        "node_modules/x/index.js": "excluded",
        "debug.log": "excluded",
        ".git/config": "never",
        "nested/.git/HEAD": "nested repo",
        "nested/file.txt": "inside nested",
        "empty.txt": "",
    })
    cache = StatCache()
    res = env.stage(cache, rescan=True)
    assert res.changed and res.stats.rescan
    assert env.snapshot(res.tree) == {
        "src/a.py": b"print('a')\r\n",
        "bin.dat": bytes(range(256)),
        "run.sh": Exe("#!/bin/sh\n"),
        "link": Link("src/a.py"),
        "dangling": Link("../nowhere/at/all"),
        "dirlink": Link("src"),
        "empty.txt": b"",
    }
    assert cache.tree == res.tree
    assert_consistent(env, cache)
    # a second rescan of an unchanged tree changes nothing
    again = env.stage(cache, rescan=True)
    assert not again.changed and again.tree == res.tree


def test_empty_workspace_gives_no_tree(env: Env) -> None:
    res = env.stage(StatCache(), rescan=True)
    assert res.tree is None and not res.changed


def test_explicit_paths_touch_only_those_paths(env: Env) -> None:
    make_tree(env.root, {"a.txt": "a", "b.txt": "b"})
    cache = StatCache()
    env.stage(cache, rescan=True)
    make_tree(env.root, {"a.txt": "a2", "b.txt": "b2 behind our back"})
    res = env.stage(cache, watched=["a.txt"])
    assert env.snapshot(res.tree) == {"a.txt": b"a2", "b.txt": b"b"}
    assert res.stats.examined == 1
    assert_consistent(env, cache)


# ---- racy clean -------------------------------------------------------------------------------


def test_same_size_rewrite_within_one_tick_is_rehashed(env: Env) -> None:
    p = env.root / "f.txt"
    p.write_bytes(b"AAAA")
    cache = StatCache()
    env.stage(cache, rescan=True)
    st = os.lstat(p)
    for plan, content in (({"rescan": True}, b"BBBB"), ({"watched": ["f.txt"]}, b"CCCC")):
        p.write_bytes(content)
        os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))
        res = env.stage(cache, **plan)
        assert env.snapshot(res.tree) == {"f.txt": content}, plan
    assert_consistent(env, cache)


def test_same_size_rewrite_with_its_old_mtime_put_back_is_detected(env: Env) -> None:
    """Between two rescans a file is rewritten in place, same size, and `os.utime` puts its
    old (long past, so not racy) mtime back: only its ctime tells, and the cache keys on it
    (peers missed exactly this: t3code#9661)."""
    p, past, cache = _old_file_staged_twice(env, b"AAAA")
    before = os.lstat(p)
    while True:  # until the kernel's coarse clock gives the rewrite a new ctime (a condition, not a delay)
        with open(p, "r+b") as fh:
            fh.write(b"BBBB")
        os.utime(p, ns=(past, past))
        after = os.lstat(p)
        if after.st_ctime_ns != before.st_ctime_ns:
            break
    assert (after.st_size, after.st_mtime_ns, after.st_ino, after.st_mode) == (
        before.st_size, before.st_mtime_ns, before.st_ino, before.st_mode), "only the ctime differs"
    res = env.stage(cache, rescan=True)
    assert res.changed and res.stats.hashed == 1
    assert env.snapshot(res.tree) == {"f.txt": b"BBBB"}
    assert_consistent(env, cache)


def test_racy_entry_with_identical_stat_is_rehashed(env: Env) -> None:
    """A stat recorded in the same tick as the write cannot prove the content: hash it."""
    p = env.root / "f.txt"
    p.write_bytes(b"old!")
    cache = StatCache()
    env.stage(cache, rescan=True)
    old_entry = cache.entry(RepoPath("f.txt"))
    assert old_entry is not None
    p.write_bytes(b"new!")
    st = os.lstat(p)
    # the cache claims this very stat hashed to the old blob, observed in the write's tick
    cache.set(RepoPath("f.txt"), state_of(st, old_entry, checked_ns=st.st_mtime_ns))
    res = env.stage(cache, rescan=True)
    assert env.snapshot(res.tree) == {"f.txt": b"new!"}
    assert res.stats.hashed == 1


def test_a_vouched_racy_entry_is_trusted_only_while_its_stat_is_the_same(env: Env) -> None:
    """A path a healthy watcher vouches for (no event since its snapshot) is not hashed again
    when its stat is the recorded one, racy or not; any stat difference (a change no event
    reported) still hashes it."""
    p = env.root / "f.txt"
    p.write_bytes(b"old!")
    cache = StatCache()
    env.stage(cache, forced=["f.txt"])
    st = os.lstat(p)
    entry = cache.entry(RepoPath("f.txt"))
    assert entry is not None
    cache.set(RepoPath("f.txt"), state_of(st, entry, checked_ns=st.st_mtime_ns))  # racy: the write's tick
    assert env.stage(cache, forced=["f.txt"]).stats.hashed == 1, "racy and not vouched for: hashed"
    cache.set(RepoPath("f.txt"), state_of(st, entry, checked_ns=st.st_mtime_ns))
    res = env.stage(cache, forced=["f.txt"], vouched=["f.txt"])
    assert res.stats.hashed == 0 and not res.changed
    while os.lstat(p).st_ctime_ns == st.st_ctime_ns:  # until the coarse clock moves (a condition, not a delay)
        p.write_bytes(b"new!")
    res = env.stage(cache, forced=["f.txt"], vouched=["f.txt"])
    assert res.stats.hashed == 1 and env.snapshot(res.tree) == {"f.txt": b"new!"}
    assert_consistent(env, cache)


def _old_file_staged_twice(env: Env, content: bytes) -> tuple[Path, int, StatCache]:
    """f.txt with an mtime long past, rescanned twice: the second rescan trusts it unread."""
    p = env.root / "f.txt"
    p.write_bytes(content)
    past = os.lstat(p).st_mtime_ns - 10_000_000_000
    os.utime(p, ns=(past, past))
    cache = StatCache()
    env.stage(cache, rescan=True)
    res = env.stage(cache, rescan=True)
    assert res.stats.hashed == 0 and res.stats.examined == 1 and not res.changed
    return p, past, cache


def test_old_entry_with_identical_stat_is_trusted(env: Env) -> None:
    """The converse: an mtime well before the check is clean, so the file is not read."""
    _old_file_staged_twice(env, b"old!")


# ---- rescan vs explicit paths on a random edit sequence ---------------------------------------

NAMES = ["a.txt", "b.py", "src/c.txt", "src/d.py", "src/deep/e.md", "src/deep/f", "g/h.txt", "g", "src",
         "debug.log", "node_modules/m.js", "build/out.o", "k/l/m/n.txt", "Exe.sh"]
LINK_TARGETS = ["a.txt", "src", "../outside", "src/deep", "/etc/passwd", "nowhere"]


class Workload:
    """Random edits on a workspace; each returns the paths a precise watcher would report."""

    def __init__(self, root: Path, seed: int) -> None:
        self.root = root
        self.rng = random.Random(seed)
        self.step = 0
        self.past_ns = 1_600_000_000 * 10**9

    def _entries(self) -> list[str]:
        return sorted(p for p in read_tree(self.root))

    def _clear(self, rel: str, touched: set[str]) -> None:
        """Make room for a file at `rel`: remove a dir there and files/links where its parents go."""
        parts = rel.split("/")
        for i in range(1, len(parts)):
            parent = self.root.joinpath(*parts[:i])
            if parent.is_symlink() or parent.is_file():
                parent.unlink()
                touched.add("/".join(parts[:i]))
        p = self.root / rel
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
            touched.add(rel)
        elif p.is_symlink() or p.exists():
            p.unlink()
            touched.add(rel)

    def _stamp(self, p: Path) -> None:
        # old but distinct mtimes: the stat cache's clean path is exercised, never fooled
        self.step += 1
        t = self.past_ns + self.step * 1_000_000_000
        os.utime(p, ns=(t, t), follow_symlinks=False)

    def act(self) -> set[str]:
        rng = self.rng
        touched: set[str] = set()
        entries = self._entries()
        op = rng.choice(["write", "write", "write", "delete", "rename", "chmod", "link", "rmdir", "relink"])
        if op == "write" or not entries:
            rel = rng.choice(NAMES)
            self._clear(rel, touched)
            p = self.root / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(rng.choice([b"x", b"yy", b"zzz", b"\0bin", b"same-size-1", b"same-size-2"]))
            if rng.random() < 0.3:
                p.chmod(0o755)
            self._stamp(p)
            touched.add(rel)
        elif op == "delete":
            rel = rng.choice(entries)
            (self.root / rel).unlink()
            touched.add(rel)
        elif op == "rename":
            src = rng.choice(entries)
            dst = rng.choice(NAMES)
            if dst == src or dst.startswith(src + "/") or src.startswith(dst + "/"):
                return touched
            data_link = os.readlink(self.root / src) if (self.root / src).is_symlink() else None
            self._clear(dst, touched)
            if not os.path.lexists(self.root / src):
                return touched
            (self.root / dst).parent.mkdir(parents=True, exist_ok=True)
            os.rename(self.root / src, self.root / dst)
            touched |= {src, dst}
            assert data_link is None or os.readlink(self.root / dst) == data_link
        elif op == "chmod":
            files = [e for e in entries if not (self.root / e).is_symlink()]
            if files:
                rel = rng.choice(files)
                p = self.root / rel
                p.chmod(p.stat().st_mode ^ 0o111)
                touched.add(rel)
        elif op in ("link", "relink"):
            rel = rng.choice(entries if op == "relink" else NAMES)
            self._clear(rel, touched)
            (self.root / rel).parent.mkdir(parents=True, exist_ok=True)
            os.symlink(rng.choice(LINK_TARGETS), self.root / rel)
            touched.add(rel)
        elif op == "rmdir":
            dirs = sorted({e.rsplit("/", 1)[0] for e in entries if "/" in e})
            if dirs:
                d = rng.choice(dirs)
                if (self.root / d).is_dir() and not (self.root / d).is_symlink():
                    shutil.rmtree(self.root / d)
                    touched.add(d)
        return touched


@pytest.mark.parametrize("split", [None, 1], ids=["one-pass", "forked-half"])
@pytest.mark.parametrize("seed", range(8))
def test_rescan_and_explicit_paths_agree(tmp_path: Path, workspace: Path, seed: int, split: int | None) -> None:
    """`forked-half`: every rescan's stat pass gives half of the folders to a forked child."""
    env = make_env(workspace, tmp_path, split_min_files=split)
    try:
        agree_through_random_changes(env, seed)
    finally:
        env.repo.close()


def agree_through_random_changes(env: Env, seed: int) -> None:
    (env.root / "outside").mkdir()  # a link target that is a real folder somewhere
    wl = Workload(env.root, seed)
    for _ in range(6):
        wl.act()
    by_rescan, by_paths = StatCache(), StatCache()
    base = env.stage(by_rescan, rescan=True)
    env.stage(by_paths, rescan=True)
    assert env.snapshot(base.tree) == env.expected()
    for step in range(40):
        touched = wl.act()
        r = env.stage(by_rescan, rescan=True)
        e = env.stage(by_paths, watched=touched)
        expected = env.expected()
        assert env.snapshot(r.tree) == expected, f"rescan diverged at step {step}"
        assert env.snapshot(e.tree) == expected, f"explicit paths {sorted(touched)} diverged at step {step}"
        assert r.tree == e.tree
        assert_consistent(env, by_rescan)
        assert_consistent(env, by_paths)


def test_dir_replaced_by_file_reported_as_one_path(env: Env) -> None:
    make_tree(env.root, {"d/x": "1", "d/y": "2", "keep": "k"})
    cache = StatCache()
    env.stage(cache, rescan=True)
    shutil.rmtree(env.root / "d")
    make_tree(env.root, {"d": "now a file"})
    res = env.stage(cache, watched=["d"])
    assert env.snapshot(res.tree) == {"d": b"now a file", "keep": b"k"}
    assert_consistent(env, cache)
    # and back to a folder holding the very same files as at first
    (env.root / "d").unlink()
    make_tree(env.root, {"d/x": "1", "d/y": "2"})
    res = env.stage(cache, watched=["d"])
    assert env.snapshot(res.tree) == {"d/x": b"1", "d/y": b"2", "keep": b"k"}
    assert_consistent(env, cache)


def test_file_replaced_by_a_folder_reported_by_a_path_in_it(env: Env) -> None:
    """An edit tool reports only the file it wrote in a folder that replaced a tracked file:
    the tracked file goes from the stat cache too, so a later rescan, finding a folder there,
    does not record it as gone, which took the folder's files out of the tree."""
    make_tree(env.root, {"d/e": "a file", "keep": "k"})
    cache = StatCache()
    env.stage(cache, rescan=True)
    (env.root / "d" / "e").unlink()
    make_tree(env.root, {"d/e/a": "in a folder now"})
    res = env.stage(cache, forced=["d/e/a"])
    assert env.snapshot(res.tree) == {"d/e/a": b"in a folder now", "keep": b"k"}
    assert_consistent(env, cache)
    res = env.stage(cache, rescan=True)
    assert env.snapshot(res.tree) == {"d/e/a": b"in a folder now", "keep": b"k"}
    assert_consistent(env, cache)


def test_dir_replaced_by_symlink_reported_as_one_path(env: Env) -> None:
    make_tree(env.root, {"d/x": "1", "other/x": "1"})
    cache = StatCache()
    env.stage(cache, rescan=True)
    shutil.rmtree(env.root / "d")
    os.symlink("other", env.root / "d")
    res = env.stage(cache, forced=["d"])
    assert env.snapshot(res.tree) == {"d": Link("other"), "other/x": b"1"}
    assert_consistent(env, cache)


# ---- forced paths -----------------------------------------------------------------------------


def test_force_added_ignored_file_stays_tracked(env: Env) -> None:
    make_tree(env.root, {".gitignore": "secret.txt\n", "a.txt": "a", "secret.txt": "s1", "trace.log": "l1",
                         "node_modules/pkg/i.js": "n1"})
    cache = StatCache()
    assert set(env.snapshot(env.stage(cache, rescan=True).tree)) == {".gitignore", "a.txt"}
    env.stage(cache, forced=["secret.txt", "trace.log", "node_modules/pkg/i.js"])
    assert env.snapshot(cache.tree) == {".gitignore": b"secret.txt\n", "a.txt": b"a", "secret.txt": b"s1",
                                        "trace.log": b"l1", "node_modules/pkg/i.js": b"n1"}
    # a later rescan keeps them and sees their changes (git: ignore rules apply to untracked files)
    make_tree(env.root, {"secret.txt": "s2", "trace.log": "l2"})
    res = env.stage(cache, rescan=True)
    snap = env.snapshot(res.tree)
    assert snap["secret.txt"] == b"s2" and snap["trace.log"] == b"l2" and snap["node_modules/pkg/i.js"] == b"n1"
    # watcher paths of a tracked ignored file are staged too
    make_tree(env.root, {"secret.txt": "s3"})
    assert env.snapshot(env.stage(cache, watched=["secret.txt"]).tree)["secret.txt"] == b"s3"
    # and their deletion is noticed by a rescan
    (env.root / "secret.txt").unlink()
    shutil.rmtree(env.root / "node_modules")
    snap = env.snapshot(env.stage(cache, rescan=True).tree)
    assert set(snap) == {".gitignore", "a.txt", "trace.log"}
    assert_consistent(env, cache)


def test_watched_excluded_untracked_file_is_not_staged(env: Env) -> None:
    make_tree(env.root, {"a.txt": "a", "x.log": "log", "node_modules/y.js": "y"})
    cache = StatCache()
    res = env.stage(cache, watched=["x.log", "node_modules/y.js", "a.txt", "node_modules"])
    assert set(env.snapshot(res.tree)) == {"a.txt"}


def test_forced_directory_takes_everything_but_git_and_nested_repos(env: Env) -> None:
    make_tree(env.root, {"gen/a.log": "a", "gen/sub/b.png": "b", "gen/n/.git": "gitdir: x",
                         "gen/n/inner.txt": "nested", "gen/m/.git/HEAD": "ref", "gen/m/x": "nested too"})
    cache = StatCache()
    env.stage(cache, forced=["gen"])
    assert set(env.snapshot(cache.tree)) == {"gen/a.log", "gen/sub/b.png"}


def test_forced_nested_repo_folder_is_never_entered(env: Env) -> None:
    make_tree(env.root, {"a.txt": "a", "nested/.git/HEAD": "ref", "nested/x.txt": "theirs",
                         "sub/.git": "gitdir: ../elsewhere", "sub/y.txt": "theirs too"})
    cache = StatCache()
    res = env.stage(cache, forced=["nested", "sub"])
    assert res.tree is None and not res.changed
    res = env.stage(cache, forced=["nested", "a.txt"], watched=["sub"])
    assert set(env.snapshot(res.tree)) == {"a.txt"}


# ---- skipped files ----------------------------------------------------------------------------


def test_file_over_size_cap_is_skipped_with_warning(tmp_path: Path, workspace: Path) -> None:
    env = make_env(workspace, tmp_path, max_file_bytes=10)
    try:
        make_tree(workspace, {"small.txt": "0123456789", "big.txt": "0123456789A"})
        cache = StatCache()
        with capture_logs() as logs:
            res = env.stage(cache, rescan=True)
        assert env.snapshot(res.tree) == {"small.txt": b"0123456789"}
        assert [(s.path, s.reason) for s in res.stats.skipped] == [("big.txt", SkipReason.TOO_LARGE)]
        assert any(e["event"] == "scanner.skipped" and e["path"] == "big.txt" for e in logs)
        # a tracked file that grows past the cap leaves the snapshot, with a warning
        make_tree(workspace, {"small.txt": "0123456789XYZ"})
        res = env.stage(cache, forced=["small.txt"])
        assert res.tree is None
        assert [s.reason for s in res.stats.skipped] == [SkipReason.TOO_LARGE]
        assert_consistent(env, cache)
    finally:
        env.repo.close()


def test_fifo_is_skipped_with_warning_and_never_blocks(env: Env) -> None:
    make_tree(env.root, {"a.txt": "a", "pipe": "was a file"})
    cache = StatCache()
    env.stage(cache, rescan=True)
    (env.root / "pipe").unlink()
    os.mkfifo(env.root / "pipe")
    os.mkfifo(env.root / "new-pipe")
    for plan in ({"forced": ["pipe", "new-pipe"]}, {"rescan": True}):
        res = env.stage(cache, **plan)
        assert env.snapshot(res.tree) == {"a.txt": b"a"}
        assert {(s.path, s.reason) for s in res.stats.skipped} == {
            ("pipe", SkipReason.NOT_REGULAR), ("new-pipe", SkipReason.NOT_REGULAR)}
    assert_consistent(env, cache)


def test_vanished_explicit_path_is_a_deletion(env: Env) -> None:
    make_tree(env.root, {"a.txt": "a", "b.txt": "b"})
    cache = StatCache()
    env.stage(cache, rescan=True)
    (env.root / "a.txt").unlink()
    res = env.stage(cache, watched=["a.txt", "never-existed.txt"])
    assert env.snapshot(res.tree) == {"b.txt": b"b"}
    assert res.stats.skipped == []


# ---- symlinks ---------------------------------------------------------------------------------


def test_path_through_symlinked_dir_is_staged_as_the_link(env: Env, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    make_tree(outside, {"secret.txt": "outside data"})
    make_tree(env.root, {"real/inner.txt": "in", "lnk": Link("real"), "out": Link(str(outside))})
    cache = StatCache()
    env.stage(cache, forced=["lnk/inner.txt", "out/secret.txt"])
    assert env.snapshot(cache.tree) == {"lnk": Link("real"), "out": Link(str(outside))}
    # a dir that was tracked and becomes a link: its files leave the snapshot
    env.stage(cache, rescan=True)
    shutil.rmtree(env.root / "real")
    os.symlink(str(outside), env.root / "real")
    env.stage(cache, watched=["real/inner.txt"])
    assert env.snapshot(cache.tree) == {"lnk": Link("real"), "out": Link(str(outside)), "real": Link(str(outside))}
    assert_consistent(env, cache)


@pytest.mark.parametrize("link_at", ["a", "a/b", "a/b/c/d"])
def test_a_deep_path_through_a_symlinked_folder_is_staged_as_the_link(env: Env, tmp_path: Path,
                                                                       link_at: str) -> None:
    """Paths 4 folders deep or more have their folders checked at once (`is_real_folder`):
    a symlink at any depth of them is found all the same."""
    path = "a/b/c/d/e/f.txt"
    target = tmp_path / "outside" / link_at.replace("/", "_")
    make_tree(target, {path[len(link_at) + 1:]: "outside data"})
    make_tree(env.root, {path: "inside", "keep.txt": "k"})
    cache = StatCache()
    env.stage(cache, rescan=True)
    shutil.rmtree(env.root / link_at)
    os.symlink(target, env.root / link_at)
    res = env.stage(cache, forced=[path])
    assert env.snapshot(res.tree) == {link_at: Link(str(target)), "keep.txt": b"k"}
    assert_consistent(env, cache)


def test_a_real_folder_is_told_at_once_and_a_linked_one_is_not(tmp_path: Path) -> None:
    real = tmp_path.resolve() / "a" / "b" / "c"
    real.mkdir(parents=True)
    (tmp_path / "link").symlink_to(tmp_path / "a")
    assert is_real_folder(str(real))
    assert not is_real_folder(str(tmp_path.resolve() / "link" / "b" / "c"))  # the same folder, through a link
    assert not is_real_folder(str(real / "missing"))
    (real / "file").write_text("x")
    assert not is_real_folder(str(real / "file"))


def test_file_swapped_for_symlink_is_never_read_through(env: Env, tmp_path: Path) -> None:
    outside = tmp_path / "secret"
    outside.write_text("do not copy")
    make_tree(env.root, {"f": "plain"})
    cache = StatCache()
    env.stage(cache, rescan=True)
    (env.root / "f").unlink()
    os.symlink(outside, env.root / "f")
    res = env.stage(cache, forced=["f"])
    assert env.snapshot(res.tree) == {"f": Link(str(outside))}
    blobs = [env.repo.read_blob(e.oid) for e in env.repo.list_tree(res.tree).values()]
    assert b"do not copy" not in blobs


def test_rule_file_change_is_picked_up(env: Env) -> None:
    make_tree(env.root, {"a.txt": "a", "b.txt": "b", ".gitignore": ""})
    cache = StatCache()
    env.stage(cache, rescan=True)
    make_tree(env.root, {".gitignore": "c.txt\n", "c.txt": "c"})
    res = env.stage(cache, watched=[".gitignore", "c.txt"])
    assert set(env.snapshot(res.tree)) == {"a.txt", "b.txt", ".gitignore"}


def test_stage_stats_count_changes(env: Env) -> None:
    make_tree(env.root, {"a": "1", "b": "2"})
    cache = StatCache()
    res = env.stage(cache, rescan=True)
    assert (res.stats.examined, res.stats.hashed, res.stats.changed) == (2, 2, 2)
    make_tree(env.root, {"a": "3"})
    res = env.stage(cache, watched=["a", "b"])
    assert res.stats.changed == 1 and res.changed
    # writing back the original content is no change at all
    make_tree(env.root, {"a": "1"})
    (env.root / "c").write_text("c")
    (env.root / "c").unlink()
    res = env.stage(cache, watched=["a", "c"])
    assert res.stats.changed == 1
    assert env.snapshot(res.tree) == {"a": b"1", "b": b"2"}


def test_entry_modes(env: Env) -> None:
    make_tree(env.root, {"x": Exe("e"), "y": "f", "z": Link("y")})
    res = env.stage(StatCache(), rescan=True)
    modes = {p: e.mode for p, e in env.repo.list_tree(res.tree).items()}
    assert modes == {"x": MODE_EXEC, "y": MODE_FILE, "z": MODE_LINK}
    assert all(isinstance(e, TreeEntry) for e in env.repo.list_tree(res.tree).values())


# ---- a big fresh baseline's trees, written by a forked child -------------------------------------


def _big_tree() -> dict[str, Any]:
    tree: dict[str, Any] = {f"pkg{i % 7}/sub{i % 3}/m{i:04d}.py": f"x = {i}\n" for i in range(600)}
    tree["pkg0/run.sh"] = Exe("#!/bin/sh\n")
    tree["pkg1/link"] = Link("sub0")
    tree["top.txt"] = "top\n"
    return tree


def _trees_written_by(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, fail_in_child: bool = False) -> Path:
    """Spy on `ShadowRepo.write_subtrees_packed`: each call appends its process id and how
    many paths it got to the file returned (a forked child's memory never comes back);
    `fail_in_child`: a child dies there."""
    calls = tmp_path / "tree-writers"
    parent = os.getpid()
    real = ShadowRepo.write_subtrees_packed

    def spy(self: ShadowRepo, files: Any) -> Any:
        files = list(files)
        with open(calls, "a") as fh:
            fh.write(f"{os.getpid()} {len(files)}\n")
        if fail_in_child and os.getpid() != parent:
            os._exit(9)
        return real(self, files)

    monkeypatch.setattr(ShadowRepo, "write_subtrees_packed", spy)
    return calls


@pytest.mark.parametrize("fail_in_child", [False, True], ids=["child", "child-fails"])
def test_a_big_fresh_baseline_writes_its_trees_in_a_child(
        tmp_path: Path, workspace: Path, monkeypatch: pytest.MonkeyPatch, fail_in_child: bool) -> None:
    """A child writes the trees of about half the paths (a run of top-level folders) while
    this process writes the others; the root over both is the tree one process writes."""
    tree = _big_tree()
    make_tree(workspace, tree)
    calls = _trees_written_by(monkeypatch, tmp_path, fail_in_child)
    forked = make_env(workspace, tmp_path / "forked", split_min_files=300)
    alone = make_env(workspace, tmp_path / "alone")
    try:
        forked_cache, alone_cache = StatCache(), StatCache()
        by_child = forked.stage(forked_cache, rescan=True)
        writers = [tuple(map(int, line.split())) for line in calls.read_text().splitlines()]
        theirs = [n for pid, n in writers if pid != os.getpid()]
        mine = [n for pid, n in writers if pid == os.getpid()]
        assert len(theirs) == 1 and 0 < theirs[0] < len(tree), "no forked child wrote a run of the trees"
        # a child that died leaves its run to this process, which writes the same trees
        assert sorted(mine) == sorted([len(tree) - theirs[0]] + ([theirs[0]] if fail_in_child else []))
        here = alone.stage(alone_cache, rescan=True)
        assert by_child.tree == here.tree and by_child.tree is not None
        assert forked.snapshot(by_child.tree) == forked.expected()
        assert_consistent(forked, forked_cache)
        fsck = subprocess.run(["git", "--git-dir", str(forked.repo.git_dir), "fsck", "--strict", "--no-dangling"],
                              capture_output=True, text=True)
        assert fsck.returncode == 0, fsck.stdout + fsck.stderr
        # the next stage patches the child's trees (read back from its pack)
        (workspace / "pkg3/sub1/m0003.py").write_text("x = 'changed'\n")
        again = forked.stage(forked_cache, watched=["pkg3/sub1/m0003.py"])
        assert forked.snapshot(again.tree)["pkg3/sub1/m0003.py"] == b"x = 'changed'\n"
        assert_consistent(forked, forked_cache)
    finally:
        forked.repo.close()
        alone.repo.close()
