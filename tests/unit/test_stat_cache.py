"""Unit tests for `shadowpoint.stage.stat_cache`: the racy-clean rule, the tracked set and persistence."""

from __future__ import annotations

import os
import pickle
import time
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
        cache.set(RepoPath(f"{i}-{name}"), FileState.packed(i, i * 3, i * 7, 0o100644, i + 11, i * 13, entry.mode,
                                                                 bytes.fromhex(entry.oid)))
    path = tmp_path / "statcache.bin"
    cache.save(path)
    loaded = StatCache.load(path, "b" * 40)
    assert loaded is not None
    assert loaded.tree == cache.tree
    assert loaded.entries == cache.entries


def test_file_state_keeps_every_field_exactly(tmp_path: Path) -> None:
    """The packed state reads back each stat field and the entry, at their extremes too (an
    inode above 2**63, a size of -1 for unknown), also through a save and load."""
    entry = TreeEntry("0123456789abcdef0123456789abcdef01234567", MODE_EXEC)
    state = FileState.packed(-1, -5, 2**62, 0o120777, 2**64 - 3, 7, entry.mode, bytes.fromhex(entry.oid))
    assert (state.size, state.mtime_ns, state.ctime_ns, state.st_mode, state.ino, state.checked_ns) == (
        -1, -5, 2**62, 0o120777, 2**64 - 3, 7)
    assert state.entry == entry and state.mode == MODE_EXEC and state.raw_oid == bytes.fromhex(entry.oid)
    assert FileState.unknown(entry).entry == entry and FileState.unknown(entry).size == -1
    cache = StatCache(tree="a" * 40, base_commit="b" * 40)
    cache.set(RepoPath("big-inode"), state)
    cache.save(tmp_path / "c.bin")
    loaded = StatCache.load(tmp_path / "c.bin", "b" * 40)
    assert loaded is not None and loaded.entries == {RepoPath("big-inode"): state}
    # a time past 2262 is kept exactly in memory, and saved as unknown (hashed again after a load)
    future = 10_413_792_000_123_456_789
    late = FileState.packed(3, future, future + 1, 0o100644, 9, 7, entry.mode, bytes.fromhex(entry.oid))
    assert (late.mtime_ns, late.ctime_ns) == (future, future + 1)
    cache.set(RepoPath("late"), late)
    cache.save(tmp_path / "c.bin")
    loaded = StatCache.load(tmp_path / "c.bin", "b" * 40)
    assert loaded is not None and loaded.entries[RepoPath("late")] == FileState.unknown(entry)
    assert loaded.entries[RepoPath("big-inode")] == state


def test_a_real_stat_is_clean_only_while_nothing_changed(tmp_path: Path) -> None:
    """`is_clean` compares size, times, mode and inode of a real file, and the racy margin."""
    f = tmp_path / "f.txt"
    f.write_text("one")
    old = time.time_ns() - 10 * RACY_MARGIN_NS
    os.utime(f, ns=(old, old))
    entry = TreeEntry("0" * 40, MODE_FILE)
    state = FileState.of(os.lstat(f), entry, time.time_ns())
    assert state.is_clean(os.lstat(f))
    assert not FileState.of(os.lstat(f), entry, old + RACY_MARGIN_NS // 2).is_clean(os.lstat(f))  # racy
    os.chmod(f, 0o755)
    assert not state.is_clean(os.lstat(f))
    os.chmod(f, 0o644)
    f.write_text("three")
    os.utime(f, ns=(old, old))
    assert not state.is_clean(os.lstat(f))


def test_under_stays_exact_through_additions_and_removals() -> None:
    """`under` keeps its order through a round's additions and removals (sorted in one by one)
    and past the number it sorts in that way (then it sorts anew): always what a filter says."""
    import random

    rng = random.Random(3)
    entry = TreeEntry("0" * 40, MODE_FILE)
    cache = StatCache()
    names = [f"{rng.choice('abc')}/{rng.choice('xyz')}/{i}" for i in range(3000)]
    for name in names[:1000]:
        cache.set(RepoPath(name), FileState.unknown(entry))
    for step in range(2500):
        folder = RepoPath(rng.choice(["a", "b", "a/x", "c/z"]))
        expected = sorted(p for p in cache.entries if p.startswith(folder + "/"))
        assert cache.under(folder) == expected, step
        name = RepoPath(rng.choice(names))
        if name in cache.entries and rng.random() < 0.5:
            cache.remove(name)
        else:
            cache.set(name, FileState.unknown(entry))


def test_a_file_state_is_one_small_object() -> None:
    """The sidecar keeps one state per tracked file (874k at 1M files): one object of 76 bytes
    of data (125 with its headers), with no field objects of its own (the dataclass with an
    entry, a hex id and five big ints took ~360 bytes)."""
    import sys

    state = FileState.packed(10**6, 2**61, 2**61 + 5, 0o100644, 2**40, 2**61 + 9, MODE_FILE, b"\1" * 20)
    assert len(state) == 76 and sys.getsizeof(state) <= 128


def test_saved_columns_read_in_c_equal_saved_fields(tmp_path: Path) -> None:
    """`save` reads its columns with `struct` a slice at a time; what it writes equals the
    per-state `saved_fields` (the rule the load reads back), times at both edges included, and
    a time past int64 nanoseconds anywhere sends the whole save the per-state way."""
    import random

    from shadowpoint.stage import stat_cache

    rng = random.Random(7)
    edge = stat_cache._SAFE_S * 1_000_000_000
    times = [0, -1, 1, edge + 999_999_999, -edge, 2**62, -(2**62), time.time_ns()]
    states = [FileState.packed(rng.choice([-1, 0, rng.randrange(2**40)]), rng.choice(times), rng.choice(times),
                               rng.choice([0o100644, 0o100755, 0o120777]), rng.randrange(2**64),
                               rng.randrange(-(2**63), 2**63), rng.choice([MODE_FILE, MODE_EXEC]),
                               rng.randbytes(20)) for _ in range(9_000)]
    assert stat_cache._times_fit(states)
    for column, code in enumerate(stat_cache._COLUMN_TYPES):
        assert list(stat_cache._column(states, column, code, True)) == [st.saved_fields()[column] for st in states]
    beyond = FileState.packed(1, (stat_cache._SAFE_S + 1) * 1_000_000_000, 0, 0o100644, 1, 1, MODE_FILE, bytes(20))
    assert not stat_cache._times_fit([*states, beyond])
    cache = StatCache(tree="a" * 40, base_commit="b" * 40)
    for i, st in enumerate([*states, beyond]):
        cache.set(RepoPath(f"f{i}"), st)
    cache.save(tmp_path / "c.bin")
    loaded = StatCache.load(tmp_path / "c.bin", "b" * 40)
    assert loaded is not None
    assert loaded.entries[RepoPath("f0")] == states[0]
    assert loaded.entries[RepoPath(f"f{len(states)}")].stat_fields() == beyond.stat_fields()
