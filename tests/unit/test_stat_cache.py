"""Unit tests for `shadowpoint.stage.stat_cache`: the racy-clean rule, the tracked set and persistence."""

from __future__ import annotations

import array
import json
import os
import pickle
import struct
import time
from pathlib import Path

import pytest

from shadowpoint.stage.stat_cache import (
    CACHE_VERSION,
    RACY_MARGIN_NS,
    StatCache,
    is_clean,
    pack_state,
    same_stat,
    stat_fields,
    state_entry,
    state_mode,
    state_of,
    state_oid,
    unknown_state,
)
from shadowpoint.store.values import MODE_EXEC, MODE_FILE, MODE_GITLINK, MODE_LINK, TreeEntry
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
    same_tick = state_of(st, E1, checked_ns=st.st_mtime_ns)
    within_margin = state_of(st, E1, checked_ns=st.st_mtime_ns + RACY_MARGIN_NS)
    later = state_of(st, E1, checked_ns=st.st_mtime_ns + RACY_MARGIN_NS + 1)
    assert not is_clean(same_tick, st)
    assert not is_clean(within_margin, st)
    assert is_clean(later, st)


def test_same_stat_ignores_only_the_racy_flag(tmp_path: Path) -> None:
    """A racy state is never clean, but its stat is still compared field by field."""
    p = tmp_path / "f"
    p.write_bytes(b"data")
    st = os.lstat(p)
    racy = state_of(st, E1, checked_ns=st.st_mtime_ns)
    assert not is_clean(racy, st) and same_stat(racy, st)
    p.write_bytes(b"other")
    assert not same_stat(racy, os.lstat(p))
    assert not same_stat(unknown_state(E1), st)


def test_any_stat_difference_is_dirty(tmp_path: Path) -> None:
    p = tmp_path / "f"
    p.write_bytes(b"data")
    st = os.lstat(p)
    fs = state_of(st, E1, checked_ns=st.st_mtime_ns + 10 * RACY_MARGIN_NS)
    assert is_clean(fs, os.lstat(p))
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns + 1))
    assert not is_clean(fs, os.lstat(p))
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))
    fs = state_of(os.lstat(p), E1, checked_ns=st.st_mtime_ns + 10 * RACY_MARGIN_NS)
    assert is_clean(fs, os.lstat(p))
    p.chmod(0o755)
    assert not is_clean(fs, os.lstat(p))
    other = stat_of(tmp_path, "g", b"data")
    assert not is_clean(fs, other)  # another inode


def test_unknown_state_is_never_clean(tmp_path: Path) -> None:
    st = stat_of(tmp_path)
    assert not is_clean(unknown_state(E1), st)


def test_set_remove_under() -> None:
    c = StatCache()
    for p in ("a/b", "a/c/d", "ab", "a.txt", "b/a", "a/b2"):
        c.set(RepoPath(p), unknown_state(E1))
    assert c.under(RepoPath("a")) == ["a/b", "a/b2", "a/c/d"]
    assert c.under(RepoPath("a/c")) == ["a/c/d"]
    assert c.under(RepoPath("zz")) == []
    c.remove(RepoPath("a/b"))
    c.set(RepoPath("a/a"), unknown_state(E2))
    assert c.under(RepoPath("a")) == ["a/a", "a/b2", "a/c/d"]
    c.remove(RepoPath("missing"))
    assert c.entry(RepoPath("a/a")) == E2
    assert c.entry(RepoPath("a/b")) is None


def test_reset_to_keeps_stat_only_for_unchanged_entries(tmp_path: Path) -> None:
    st = stat_of(tmp_path)
    c = StatCache()
    kept = state_of(st, E1, checked_ns=123)
    c.set(RepoPath("same"), kept)
    c.set(RepoPath("changed"), state_of(st, E1, checked_ns=123))
    c.set(RepoPath("dropped"), state_of(st, E1, checked_ns=123))
    c.reset_to("t" * 40, {RepoPath("same"): E1, RepoPath("changed"): E2, RepoPath("new"): E3}, "c" * 40)
    assert c.tree == "t" * 40 and c.base_commit == "c" * 40
    assert set(c.entries) == {"same", "changed", "new"}
    assert c.entries[RepoPath("same")] is kept
    assert c.entries[RepoPath("changed")] == unknown_state(E2)
    assert c.entries[RepoPath("new")] == unknown_state(E3)
    assert c.under(RepoPath("")) == [] and c.under(RepoPath("n")) == []


def test_save_load_round_trip(tmp_path: Path) -> None:
    st = stat_of(tmp_path)
    c = StatCache(tree="a" * 40, base_commit="b" * 40)
    c.set(RepoPath("x/y"), state_of(st, E1, checked_ns=42))
    c.set(RepoPath("ünï/\udcff"), unknown_state(E3))
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
    c.set(RepoPath("x"), unknown_state(E1))
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


def test_a_version_3_cache_is_read_with_its_check_times(tmp_path: Path) -> None:
    """A cache saved by version 3 (a check time per stat where version 4 saves whether the stat
    is trusted) still loads: the racy-clean rule is decided from its check times."""
    from shadowpoint.stage import stat_cache

    old, racy = 10 * RACY_MARGIN_NS, 20 * RACY_MARGIN_NS
    paths = [b"old.txt", b"racy.txt"]
    columns = [[3, 4], [old, racy], [old, racy], [0o100644, 0o100644], [7, 8], [old + 2 * RACY_MARGIN_NS, racy],
               [MODE_FILE, MODE_EXEC]]
    header = {"version": 3, "tree": "a" * 40, "base": "b" * 40, "count": 2}
    path = tmp_path / "statcache.bin"
    with open(path, "wb") as fh:
        fh.write(json.dumps(header).encode() + b"\n")
        saved = [array.array(code, col).tobytes() for code, col in zip(stat_cache._COLUMN_TYPES, columns, strict=True)]
        for data in [b"\0".join(paths), *saved, b"\1" * 20 + b"\2" * 20]:
            fh.write(struct.pack("<Q", len(data)) + data)
    loaded = StatCache.load(path, "b" * 40)
    assert loaded is not None
    assert loaded.entries == {
        RepoPath("old.txt"): pack_state(3, old, old, 0o100644, 7, old + 2 * RACY_MARGIN_NS, MODE_FILE, b"\1" * 20),
        RepoPath("racy.txt"): pack_state(4, racy, racy, 0o100644, 8, racy, MODE_EXEC, b"\2" * 20)}
    trusted = {p: stat_fields(st)[5] for p, st in loaded.entries.items()}
    assert trusted == {"old.txt": True, "racy.txt": False}


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
        cache.set(RepoPath(f"{i}-{name}"), pack_state(i, i * 3, i * 7, 0o100644, i + 11, i * 13, entry.mode,
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
    state = pack_state(2**40 + 5, -5, 2**62, 0o120777, 2**64 - 3, 2**62 + RACY_MARGIN_NS + 1, entry.mode,
                       bytes.fromhex(entry.oid))
    # size and inode keep their low 32 bits, as git's index does; the stat was not racy: trusted
    assert stat_fields(state) == (5, -5, 2**62, 0o120777, 2**32 - 3, True)
    assert state_entry(state) == entry and state_mode(state) == MODE_EXEC
    assert state_oid(state) == bytes.fromhex(entry.oid)
    assert state_entry(unknown_state(entry)) == entry and stat_fields(unknown_state(entry))[5] is False
    assert stat_fields(pack_state(1, 10, 10, 0o100644, 1, 10 + RACY_MARGIN_NS, MODE_FILE, bytes(20)))[5] is False
    for mode in (MODE_FILE, MODE_EXEC, MODE_LINK, MODE_GITLINK):
        assert state_mode(pack_state(1, 2, 3, 4, 5, 6, mode, bytes(20))) == mode
    with pytest.raises(ValueError):
        pack_state(1, 2, 3, 4, 5, 6, 0o040000, bytes(20))  # a folder is no tracked file
    cache = StatCache(tree="a" * 40, base_commit="b" * 40)
    cache.set(RepoPath("big-inode"), state)
    cache.save(tmp_path / "c.bin")
    loaded = StatCache.load(tmp_path / "c.bin", "b" * 40)
    assert loaded is not None and loaded.entries == {RepoPath("big-inode"): state}
    # a time past 2262 (past int64 nanoseconds) or an st_mode over 16 bits: the stat is unknown
    # (the file is hashed again), the entry kept
    future = 10_413_792_000_123_456_789
    for late in (pack_state(3, future, 1, 0o100644, 9, 7, entry.mode, bytes.fromhex(entry.oid)),
                 pack_state(3, 1, -future, 0o100644, 9, 7, entry.mode, bytes.fromhex(entry.oid)),
                 pack_state(3, 1, 1, 2**16, 9, 7, entry.mode, bytes.fromhex(entry.oid))):
        assert late == unknown_state(entry)


def test_a_real_stat_is_clean_only_while_nothing_changed(tmp_path: Path) -> None:
    """`is_clean` compares size, times, mode and inode of a real file, and the racy margin."""
    f = tmp_path / "f.txt"
    f.write_text("one")
    old = time.time_ns() - 10 * RACY_MARGIN_NS
    os.utime(f, ns=(old, old))
    entry = TreeEntry("0" * 40, MODE_FILE)
    state = state_of(os.lstat(f), entry, time.time_ns())
    assert is_clean(state, os.lstat(f))
    assert not is_clean(state_of(os.lstat(f), entry, old + RACY_MARGIN_NS // 2), os.lstat(f))  # racy
    os.chmod(f, 0o755)
    assert not is_clean(state, os.lstat(f))
    os.chmod(f, 0o644)
    f.write_text("three")
    os.utime(f, ns=(old, old))
    assert not is_clean(state, os.lstat(f))


def test_under_stays_exact_through_additions_and_removals() -> None:
    """`under` keeps its order through a round's additions and removals (sorted in one by one)
    and past the number it sorts in that way (then it sorts anew): always what a filter says."""
    import random

    rng = random.Random(3)
    entry = TreeEntry("0" * 40, MODE_FILE)
    cache = StatCache()
    names = [f"{rng.choice('abc')}/{rng.choice('xyz')}/{i}" for i in range(3000)]
    for name in names[:1000]:
        cache.set(RepoPath(name), unknown_state(entry))
    for step in range(2500):
        folder = RepoPath(rng.choice(["a", "b", "a/x", "c/z"]))
        expected = sorted(p for p in cache.entries if p.startswith(folder + "/"))
        assert cache.under(folder) == expected, step
        name = RepoPath(rng.choice(names))
        if name in cache.entries and rng.random() < 0.5:
            cache.remove(name)
        else:
            cache.set(name, unknown_state(entry))


def test_a_file_state_is_one_small_object() -> None:
    """The sidecar keeps one state per tracked file (874k at 1M files): a plain bytes of 47
    (80 with its header, a size class of the allocator), no field objects, not tracked by the
    garbage collector (a bytes subclass took 128 and a dataclass ~360)."""
    import gc
    import sys

    state = pack_state(10**6, 2**61, 2**61 + 5, 0o100644, 2**40, 2**61 + 9, MODE_FILE, b"\1" * 20)
    assert type(state) is bytes and len(state) == 47 and sys.getsizeof(state) <= 80
    assert not gc.is_tracked(state)


def test_states_round_trip_and_a_version_4_cache_still_loads(tmp_path: Path) -> None:
    """`save` writes the states as they are held and `load` gives back every one, odd fields
    included; a cache saved by version 4 (a column per stat field) loads to the same states."""
    import random

    from shadowpoint.stage import stat_cache

    rng = random.Random(7)
    times = [0, -1, 1, 2**63 - 1, -(2**63), 2**62, -(2**62), time.time_ns()]
    states = [pack_state(rng.choice([-1, 0, rng.randrange(2**40)]), rng.choice(times), rng.choice(times),
                         rng.choice([0o100644, 0o100755, 0o120777]), rng.randrange(2**64),
                         rng.randrange(-(2**63), 2**63), rng.choice([MODE_FILE, MODE_EXEC, MODE_LINK]),
                         rng.randbytes(20)) for _ in range(9_000)]
    cache = StatCache(tree="a" * 40, base_commit="b" * 40)
    for i, st in enumerate(states):
        cache.set(RepoPath(f"f{i}"), st)
    cache.save(tmp_path / "c.bin")
    loaded = StatCache.load(tmp_path / "c.bin", "b" * 40)
    assert loaded is not None and loaded.entries == cache.entries
    # the same states as version 4 saved them: trusted as 0 or 1, the git mode, not its code
    columns = [[(*stat_fields(st), state_mode(st))[column] for st in states] for column in range(7)]
    header = {"version": 4, "tree": "a" * 40, "base": "b" * 40, "count": len(states)}
    old = tmp_path / "v4.bin"
    with open(old, "wb") as fh:
        fh.write(json.dumps(header).encode() + b"\n")
        saved = [array.array(code, col).tobytes() for code, col in zip(stat_cache._COLUMN_TYPES, columns, strict=True)]
        for data in [b"\0".join(f"f{i}".encode() for i in range(len(states))), *saved,
                     b"".join(state_oid(st) for st in states)]:
            fh.write(struct.pack("<Q", len(data)) + data)
    loaded = StatCache.load(old, "b" * 40)
    assert loaded is not None and loaded.entries == cache.entries


def test_a_cache_whose_states_are_cut_short_is_not_loaded(tmp_path: Path) -> None:
    cache = StatCache(tree="a" * 40, base_commit="b" * 40)
    for i in range(3):
        cache.set(RepoPath(f"f{i}"), pack_state(i, 0, 0, 0o100644, i, 10**18, MODE_FILE, bytes([i]) * 20))
    path = tmp_path / "c.bin"
    cache.save(path)
    data = path.read_bytes()
    # the states' section claims one byte less and ends a byte early
    head, _, rest = data.partition(b"\n")
    paths_len = struct.unpack("<Q", rest[:8])[0]
    states_at = 8 + paths_len
    size = struct.unpack("<Q", rest[states_at:states_at + 8])[0]
    cut = rest[:states_at] + struct.pack("<Q", size - 1) + rest[states_at + 8:-1]
    path.write_bytes(head + b"\n" + cut)
    assert StatCache.load(path, "b" * 40) is None


def test_with_inodes_finds_exactly_the_states_holding_them() -> None:
    """Only a state's inode field counts: the same four bytes in its size, times or blob id
    (here every field holds them) are no match; inodes are compared on their low 32 bits."""
    ino = 0x0ABC_DEF1
    alike = ino.to_bytes(4, "little")
    raw = alike * 5
    cache = StatCache()
    cache.set(RepoPath("a/one"), pack_state(ino, ino, ino, 0o100644, ino, 0, MODE_FILE, raw))
    cache.set(RepoPath("b/two"), pack_state(ino, ino << 32 | ino, ino, 0o100644, (1 << 32) | ino, 0, MODE_FILE, raw))
    cache.set(RepoPath("c/none"), pack_state(ino, ino << 32 | ino, ino << 32 | ino, 0o100644, ino + 1, 0, MODE_FILE,
                                             raw))
    cache.set(RepoPath("d/unknown"), unknown_state(E1))
    assert cache.with_inodes([ino]) == ["a/one", "b/two"]
    assert cache.with_inodes([ino + 1, 7]) == ["c/none"]
    assert cache.with_inodes([]) == []
