"""Unit tests for `shadowpoint.stage.stat_cache`: the racy-clean rule, the tracked set and persistence."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

from shadowpoint.stage.stat_cache import CACHE_VERSION, RACY_MARGIN_NS, FileState, StatCache
from shadowpoint.store.values import MODE_EXEC, MODE_FILE, TreeEntry
from shadowpoint.workspace import RepoPath

E1 = TreeEntry("1" * 40, MODE_FILE)
E2 = TreeEntry("2" * 40, MODE_FILE)
E3 = TreeEntry("3" * 40, MODE_EXEC)


def stat_of(tmp_path: Path, name: str = "f", data: bytes = b"data") -> os.stat_result:
    p = tmp_path / name
    p.write_bytes(data)
    return os.lstat(p)


def test_clean_only_when_mtime_older_than_check_minus_margin(tmp_path: Path) -> None:
    st = stat_of(tmp_path)
    same_tick = FileState.of(st, E1, checked_ns=st.st_mtime_ns)
    within_margin = FileState.of(st, E1, checked_ns=st.st_mtime_ns + RACY_MARGIN_NS)
    later = FileState.of(st, E1, checked_ns=st.st_mtime_ns + RACY_MARGIN_NS + 1)
    assert not same_tick.is_clean(st)
    assert not within_margin.is_clean(st)
    assert later.is_clean(st)


def test_any_stat_difference_is_dirty(tmp_path: Path) -> None:
    p = tmp_path / "f"
    p.write_bytes(b"data")
    st = os.lstat(p)
    fs = FileState.of(st, E1, checked_ns=st.st_mtime_ns + 10 * RACY_MARGIN_NS)
    assert fs.is_clean(os.lstat(p))
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns + 1))
    assert not fs.is_clean(os.lstat(p))
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))
    fs = FileState.of(os.lstat(p), E1, checked_ns=st.st_mtime_ns + 10 * RACY_MARGIN_NS)
    assert fs.is_clean(os.lstat(p))
    p.chmod(0o755)
    assert not fs.is_clean(os.lstat(p))
    other = stat_of(tmp_path, "g", b"data")
    assert not fs.is_clean(other)  # another inode


def test_unknown_state_is_never_clean(tmp_path: Path) -> None:
    st = stat_of(tmp_path)
    assert not FileState.unknown(E1).is_clean(st)


def test_set_remove_under() -> None:
    c = StatCache()
    for p in ("a/b", "a/c/d", "ab", "a.txt", "b/a", "a/b2"):
        c.set(RepoPath(p), FileState.unknown(E1))
    assert c.under(RepoPath("a")) == ["a/b", "a/b2", "a/c/d"]
    assert c.under(RepoPath("a/c")) == ["a/c/d"]
    assert c.under(RepoPath("zz")) == []
    c.remove(RepoPath("a/b"))
    c.set(RepoPath("a/a"), FileState.unknown(E2))
    assert c.under(RepoPath("a")) == ["a/a", "a/b2", "a/c/d"]
    c.remove(RepoPath("missing"))
    assert c.entry(RepoPath("a/a")) == E2
    assert c.entry(RepoPath("a/b")) is None


def test_reset_to_keeps_stat_only_for_unchanged_entries(tmp_path: Path) -> None:
    st = stat_of(tmp_path)
    c = StatCache()
    kept = FileState.of(st, E1, checked_ns=123)
    c.set(RepoPath("same"), kept)
    c.set(RepoPath("changed"), FileState.of(st, E1, checked_ns=123))
    c.set(RepoPath("dropped"), FileState.of(st, E1, checked_ns=123))
    c.reset_to("t" * 40, {RepoPath("same"): E1, RepoPath("changed"): E2, RepoPath("new"): E3}, "c" * 40)
    assert c.tree == "t" * 40 and c.base_commit == "c" * 40
    assert set(c.entries) == {"same", "changed", "new"}
    assert c.entries[RepoPath("same")] is kept
    assert c.entries[RepoPath("changed")] == FileState.unknown(E2)
    assert c.entries[RepoPath("new")] == FileState.unknown(E3)
    assert c.under(RepoPath("")) == [] and c.under(RepoPath("n")) == []


def test_save_load_round_trip(tmp_path: Path) -> None:
    st = stat_of(tmp_path)
    c = StatCache(tree="a" * 40, base_commit="b" * 40)
    c.set(RepoPath("x/y"), FileState.of(st, E1, checked_ns=42))
    c.set(RepoPath("ünï/\udcff"), FileState.unknown(E3))
    path = tmp_path / "deep" / "cache.pickle"
    c.save(path)
    loaded = StatCache.load(path, "b" * 40)
    assert loaded is not None
    assert loaded.tree == c.tree and loaded.base_commit == c.base_commit
    assert loaded.entries == c.entries
    assert loaded.under(RepoPath("x")) == ["x/y"]
    assert [p.name for p in path.parent.iterdir()] == ["cache.pickle"]  # no temp file left


def test_load_refuses_other_base_commit(tmp_path: Path) -> None:
    c = StatCache(tree="a" * 40, base_commit="b" * 40)
    c.set(RepoPath("x"), FileState.unknown(E1))
    path = tmp_path / "cache.pickle"
    c.save(path)
    assert StatCache.load(path, "c" * 40) is None
    assert StatCache.load(path, None) is None
    c2 = StatCache(tree=None, base_commit=None)
    c2.save(path)
    assert StatCache.load(path, None) is not None
    assert StatCache.load(path, "b" * 40) is None


def test_load_of_missing_corrupt_or_old_cache_is_none(tmp_path: Path) -> None:
    path = tmp_path / "cache.pickle"
    assert StatCache.load(path, None) is None
    path.write_bytes(b"\0garbage")
    assert StatCache.load(path, None) is None
    path.write_bytes(b"")
    assert StatCache.load(path, None) is None
    path.write_bytes(pickle.dumps((CACHE_VERSION - 1, None, None, {})))
    assert StatCache.load(path, None) is None
    path.write_bytes(pickle.dumps(("not a tuple of four",)))
    assert StatCache.load(path, None) is None


def test_save_failure_is_not_raised(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    StatCache().save(blocker / "sub" / "cache.pickle")  # parent is a file: logged, not raised
    assert blocker.read_text() == "x"


def test_save_load_round_trip_of_many_entries_written_in_slices(tmp_path: Path) -> None:
    """Paths and blob ids are streamed in slices of 4096: a cache spanning several slices
    (odd names included) reads back entry for entry."""
    cache = StatCache(tree="a" * 40, base_commit="b" * 40)
    odd = ["new\nline.txt", "caf\u00e9.md", os.fsdecode(b"bad\xff.bin"), "sp ace/x"]
    for i in range(10_001):
        name = odd[i % len(odd)] if i % 997 == 0 else f"dir{i % 37}/file{i}.py"
        entry = TreeEntry(f"{i:040x}", MODE_EXEC if i % 5 == 0 else MODE_FILE)
        cache.set(RepoPath(f"{i}-{name}"), FileState(i, i * 3, i * 7, 0o100644, i + 11, i * 13, entry))
    path = tmp_path / "statcache.bin"
    cache.save(path)
    loaded = StatCache.load(path, "b" * 40)
    assert loaded is not None
    assert loaded.tree == cache.tree
    assert loaded.entries == cache.entries
