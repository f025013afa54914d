"""`StatCache`: what the latest snapshot of one root holds, with the stat data last seen.

Maps every tracked `RepoPath` to a `FileState` (size, mtime_ns, ctime_ns, mode, inode and
the blob it hashed to), so a rescan re-hashes only files whose stat changed. Owned by one
root's state in engine.py and used under that root's lock; persisted next to the shadow
repo so a restarted sidecar does not re-hash the workspace.
"""

from __future__ import annotations

import array
import bisect
import functools
import itertools
import json
import operator
import os
import struct
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, TypeVar

import structlog

from shadowpoint.store.atomic import atomic_writer
from shadowpoint.store.values import MODE_EXEC, MODE_FILE, MODE_GITLINK, MODE_LINK, TreeEntry
from shadowpoint.workspace import RepoPath

log = structlog.get_logger(__name__)

# Racy-clean: a file is trusted unchanged only if its mtime is strictly older than the
# moment its stat was recorded, minus a margin wider than the kernel's coarse file clock
# (a jiffy, 1-10 ms) and small clock steps; younger files are always re-hashed.
RACY_MARGIN_NS = 1_000_000_000

CACHE_VERSION = 5
# versions 3 and 4 saved a column per stat field (version 3 each stat's check time where 4 saves
# whether it is trusted); still read
_COLUMNS_VERSION = 4
_CHECKED_VERSION = 3

# additions and removals `StatCache` sorts in one by one before it sorts anew when asked
_SORTED_EDITS_MAX = 512


# One tracked file's state: a plain `bytes` of 47, read with the functions below: size and inode
# (their low 32 bits, as git's index keeps them), mtime_ns and ctime_ns, st_mode (16 bits), a
# flags byte (the git mode's code; `_TRUSTED`: the stat is known and was not racy when recorded)
# and the raw blob id. 80 bytes with its header (a size class of Python's allocator: one byte
# more costs 16), no field objects, never tracked by the garbage collector: a bytes subclass with
# methods took 128 (874k of them at 1M files), a dataclass with an entry, a hex id and five big
# ints ~360.
FileState = bytes

_STATE = struct.Struct("<IqqHIB20s")
STATE_SIZE = _STATE.size  # bytes of a packed FileState
_STAT_PART = struct.Struct("<IqqHIB")
_FLAGS_AT = _STAT_PART.size - 1
# a state read for its inode alone: size, mtime_ns, ctime_ns and st_mode skipped (22 bytes), then
# the flags byte and the blob id (21)
_INODE_ONLY = struct.Struct("<22xI21x")
assert _INODE_ONLY.size == _STATE.size and struct.calcsize("<IqqH") == 22
_OID_AT = _STAT_PART.size
_U32 = 0xFFFF_FFFF
_TRUSTED = 0x80  # in the flags byte; the git mode's code is the low two bits
# the git modes a snapshot's file can have, by their code in a state
_GIT_MODES = (MODE_FILE, MODE_EXEC, MODE_LINK, MODE_GITLINK)
_MODE_CODES = {mode: code for code, mode in enumerate(_GIT_MODES)}


def _pack(size: int, mtime_ns: int, ctime_ns: int, st_mode: int, ino: int, trusted: int, mode: int,
          raw_oid: bytes) -> FileState:
    code = _MODE_CODES.get(mode)
    if code is None:
        raise ValueError(f"{mode:o} is not the git mode of a file")
    try:
        return _STATE.pack(size & _U32, mtime_ns, ctime_ns, st_mode, ino & _U32, code | (_TRUSTED if trusted else 0),
                           raw_oid)
    except struct.error:  # a time past the year 2262, a mode over 16 bits: hashed at each scan
        return _STATE.pack(0, 0, 0, 0, 0, code, raw_oid)


# For the hot loop that packs the states the user's index proves (`git_index.IndexProof.prove_folder`:
# its times are 32-bit seconds, every field fits): the layout, the codes of a file's git modes
# and the flag of a stat that was not racy
STATE_LAYOUT = _STATE
CODE_FILE, CODE_EXEC, CODE_LINK = _MODE_CODES[MODE_FILE], _MODE_CODES[MODE_EXEC], _MODE_CODES[MODE_LINK]
TRUSTED = _TRUSTED


def pack_state(size: int, mtime_ns: int, ctime_ns: int, st_mode: int, ino: int, checked_ns: int,
               mode: int, raw_oid: bytes) -> FileState:
    """A state of a file whose stat was recorded at `checked_ns`. The racy-clean rule is decided
    here: only a file whose mtime is older than `checked_ns` by the margin can ever be clean. A
    field its column cannot hold (a time past the year 2262, a mode over 16 bits) makes the
    stat unknown: the file is hashed again at each scan.

    Raises:
        ValueError: `mode` is no git mode of a file.
    """
    return _pack(size, mtime_ns, ctime_ns, st_mode, ino, size >= 0 and mtime_ns < checked_ns - RACY_MARGIN_NS,
                 mode, raw_oid)


def state_of(st: os.stat_result, entry: TreeEntry, checked_ns: int) -> FileState:
    """The state of a file whose stat is `st`, hashed to `entry` at `checked_ns`."""
    return pack_state(st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_mode, st.st_ino, checked_ns,
                      entry.mode, bytes.fromhex(entry.oid))


def unknown_state(entry: TreeEntry, ino: int = 0) -> FileState:
    """A tracked path whose stat is not known: never clean until hashed again. `ino`: its
    inode when known (a file a restore wrote), so `with_inodes` finds it among hard links."""
    return _pack(0, 0, 0, 0, ino, False, entry.mode, bytes.fromhex(entry.oid))


def stat_fields(state: FileState) -> tuple[int, int, int, int, int, bool]:
    """size (low 32 bits), mtime_ns, ctime_ns, st_mode, inode (low 32 bits), trusted."""
    size, mtime_ns, ctime_ns, st_mode, ino, flags = _STAT_PART.unpack_from(state)
    return size, mtime_ns, ctime_ns, st_mode, ino, flags >= _TRUSTED


def is_clean(state: FileState, st: os.stat_result) -> bool:
    """True if `st` proves the file still holds the state's blob (racy-clean rule)."""
    return state[_FLAGS_AT] >= _TRUSTED and same_stat(state, st)


def same_stat(state: FileState, st: os.stat_result) -> bool:
    """True if `st` is the stat the state recorded, trusted or not (a racy one: recorded too
    soon after the file's last change to prove its content alone)."""
    fields: tuple[int, int, int, int, int, int] = _STAT_PART.unpack_from(state)
    size, mtime_ns, ctime_ns, st_mode, ino, _ = fields
    return (
        st.st_mtime_ns == mtime_ns
        and st.st_ctime_ns == ctime_ns
        and st.st_size & _U32 == size
        and st.st_mode == st_mode
        and st.st_ino & _U32 == ino
    )


def tree_files(paths: Iterable[str], states: Sequence[FileState]) -> Iterator[tuple[str, int, bytes]]:
    """(path, git mode, raw blob id) of each of `paths` with its state (as many), as the tree
    writers take them: the trees' loop over every file of a baseline, made by iterators in C
    (a generator's turn a file was ~0.3 us of it, ~13 ms of each writer at 100k files)."""
    modes = map(_GIT_MODES.__getitem__, map(_MODE_CODE, map(_FLAGS_BYTE, states)))
    return zip(paths, modes, map(_OID_PART, states), strict=True)


_FLAGS_BYTE = operator.itemgetter(_FLAGS_AT)
_MODE_CODE = functools.partial(operator.and_, 3)  # the git mode's code in the flags byte
_OID_PART = operator.itemgetter(slice(_OID_AT, None))


def state_mode(state: FileState) -> int:
    """The git mode of the state's blob."""
    return _GIT_MODES[state[_FLAGS_AT] & 3]


def state_oid(state: FileState) -> bytes:
    """The raw id of the state's blob."""
    return state[_OID_AT:]


def state_entry(state: FileState) -> TreeEntry:
    """The state's blob as a tree entry."""
    return TreeEntry(state[_OID_AT:].hex(), state_mode(state))


@dataclass(slots=True)
class StatCache:
    """The tracked set of one root: the tree of its latest snapshot, plus stat data."""

    tree: str | None = None
    base_commit: str | None = None
    entries: dict[RepoPath, FileState] = field(default_factory=dict)
    # the tracked paths in order, for `under`: kept up to date through a round's few additions
    # and removals (re-sorting 100k paths after each round that made a file cost ~40 ms); a
    # staging that changes many paths drops it, and the next `under` sorts once
    _sorted: list[RepoPath] | None = None
    _edits: int = 0

    def entry(self, path: RepoPath) -> TreeEntry | None:
        st = self.entries.get(path)
        return state_entry(st) if st else None

    def set(self, path: RepoPath, state: FileState) -> None:
        if path not in self.entries and self._sorted is not None:
            if self._edited():
                bisect.insort(self._sorted, path)
        self.entries[path] = state

    def set_many(self, items: Iterable[tuple[RepoPath, FileState]]) -> None:
        """`set` for many paths (a baseline's share); the sorted order is made again when asked for."""
        self.entries.update(items)
        self._sorted = None

    def remove(self, path: RepoPath) -> None:
        if self.entries.pop(path, None) is not None and self._sorted is not None:
            if self._edited():
                del self._sorted[bisect.bisect_left(self._sorted, path)]

    def _edited(self) -> bool:
        """Count one edit of the order; False (and the order dropped) past the cheap number."""
        self._edits += 1
        if self._edits > _SORTED_EDITS_MAX:
            self._sorted = None
            return False
        return True

    def under(self, directory: RepoPath) -> list[RepoPath]:
        """Tracked paths strictly below `directory` (bisect over a lazily sorted key list)."""
        if self._sorted is None:
            self._sorted = sorted(self.entries)
            self._edits = 0
        prefix = directory + "/"
        i = bisect.bisect_left(self._sorted, prefix)
        out = []
        while i < len(self._sorted) and self._sorted[i].startswith(prefix):
            out.append(self._sorted[i])
            i += 1
        return out

    def with_inodes(self, inodes: Iterable[int]) -> list[RepoPath]:
        """The tracked paths whose state holds one of `inodes` (their low 32 bits), in order: the
        states joined and their inodes read in C (~20 ms at 100k files, however many inodes are
        asked for; unpacking each state took ~60, a search per inode ~10 each)."""
        wanted = {ino & _U32 for ino in inodes}
        states = b"".join(self.entries.values())
        if len(states) != STATE_SIZE * len(self.entries):  # never: every state is packed whole
            raise ValueError("a state of the stat cache is not of its layout")
        found = [path for path, (ino,) in zip(self.entries, _INODE_ONLY.iter_unpack(states), strict=True)
                 if ino in wanted]
        return sorted(found)

    def reset_to(self, tree: str | None, listing: dict[RepoPath, TreeEntry], base_commit: str | None) -> None:
        """Mirror another tree, keeping stat data of paths whose blob and mode are unchanged."""
        old = self.entries
        self.entries = {}
        for path, entry in listing.items():
            prev = old.get(path)
            self.entries[path] = prev if prev is not None and state_entry(prev) == entry else unknown_state(entry)
        self.tree = tree
        self.base_commit = base_commit
        self._sorted = None

    # ------------------------------------------------------------------ persistence

    def save(self, path: Path) -> None:
        """Write atomically (temp file + rename); a failure only costs re-hashing later.

        A JSON header, the paths (NUL-separated), then the states as they are held (`_STATE`'s
        little-endian layout, 47 bytes each): written and read back without a call per field
        (a column per field cost ~0.25 s of a 100k-file baseline's end, which the first
        command of a task waits for), and nothing in it can execute when read back, unlike a
        pickle.
        """
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            # Everything is streamed in slices straight from the map (run under the root's lock,
            # so it does not change meanwhile): no list of all paths or states (~7 MiB each at
            # 1M files, held at the moment of a baseline's peak memory).
            entries = self.entries
            header = json.dumps({"version": CACHE_VERSION, "tree": self.tree, "base": self.base_commit,
                                 "count": len(entries)}).encode() + b"\n"
            with atomic_writer(path) as fh:
                fh.write(header)
                _write_chunked(fh, (b"\0".join(os.fsencode(p) for p in part) for part in _slices(entries)), b"\0")
                _write_chunked(fh, (b"".join(part) for part in _slices(entries.values())))
        except (OSError, ValueError, OverflowError, RuntimeError) as exc:  # RuntimeError: the map changed
            log.warning("stat_cache.save_failed", path=str(path), reason=str(exc))

    @classmethod
    def load(cls, path: Path, base_commit: str | None) -> StatCache | None:
        """The saved cache if it was written for `base_commit`, else None (damage included)."""
        start = time.perf_counter()
        try:
            with open(path, "rb") as fh:
                header = json.loads(fh.readline())
                version = header.get("version")
                if (version not in (CACHE_VERSION, _COLUMNS_VERSION, _CHECKED_VERSION)
                        or header.get("base") != base_commit):
                    return None
                count = int(header["count"])
                raw_paths = _read_section(fh)
                paths = [RepoPath(os.fsdecode(p)) for p in raw_paths.split(b"\0")] if count else []
                if len(paths) != count:
                    raise ValueError("section sizes disagree")
                if version == CACHE_VERSION:
                    states = _read_section(fh)
                    if len(states) != _STATE.size * count:
                        raise ValueError("section sizes disagree")
                    size = _STATE.size
                    entries = {p: states[i: i + size] for p, i in zip(paths, range(0, len(states), size), strict=True)}
                else:
                    entries = _read_columns(fh, paths, version)
        except FileNotFoundError:
            return None
        except Exception as exc:  # a damaged file raises almost anything
            log.warning("stat_cache.unreadable", path=str(path), reason=repr(exc), action="re-hashing the workspace")
            return None
        log.debug("stat_cache.loaded", entries=len(entries), duration_ms=(time.perf_counter() - start) * 1e3)
        return cls(tree=header.get("tree"), base_commit=header.get("base"), entries=entries)


_T = TypeVar("_T")

# array type codes of the columns of versions 3 and 4: size, mtime_ns, ctime_ns, st_mode, inode,
# trusted (0 or 1; version 3: checked_ns) and the git mode
_COLUMN_TYPES = "qqqqQqq"


def _read_columns(fh: BinaryIO, paths: list[RepoPath], version: int) -> dict[RepoPath, FileState]:
    """The states of a cache saved by version 3 or 4, after its paths."""
    count = len(paths)
    size, mtime, ctime, st_mode, ino, trusted, modes = (
        _int_array(_read_section(fh), count, code) for code in _COLUMN_TYPES)
    oids = _read_section(fh)
    if len(oids) != 20 * count:
        raise ValueError("section sizes disagree")
    pack = pack_state if version == _CHECKED_VERSION else _pack
    return {p: pack(size[i], mtime[i], ctime[i], st_mode[i], ino[i], trusted[i], modes[i], oids[20 * i: 20 * i + 20])
            for i, p in enumerate(paths)}


def _slices(items: Iterable[_T], size: int = 4096) -> Iterator[list[_T]]:
    it = iter(items)
    while part := list(itertools.islice(it, size)):
        yield part


def _write_chunked(fh: BinaryIO, chunks: Iterator[bytes], separator: bytes = b"") -> None:
    """One section written piece by piece (`separator` between pieces); the length is filled in
    at the end."""
    start = fh.tell()
    fh.write(struct.pack("<Q", 0))
    size = 0
    for i, chunk in enumerate(chunks):
        if i and separator:
            fh.write(separator)
            size += len(separator)
        fh.write(chunk)
        size += len(chunk)
    end = fh.tell()
    fh.seek(start)
    fh.write(struct.pack("<Q", size))
    fh.seek(end)


def _read_section(fh: BinaryIO) -> bytes:
    (size,) = struct.unpack("<Q", fh.read(8))
    data = fh.read(size)
    if len(data) != size:
        raise ValueError("truncated stat cache")
    return data


def _int_array(data: bytes, count: int, code: str = "q") -> array.array[int]:
    arr = array.array(code)
    arr.frombytes(data)
    if len(arr) != count:
        raise ValueError("truncated stat cache column")
    return arr
