"""`StatCache`: what the latest snapshot of one root holds, with the stat data last seen.

Maps every tracked `RepoPath` to a `FileState` (size, mtime_ns, ctime_ns, mode, inode and
the blob it hashed to), so a rescan re-hashes only files whose stat changed. Owned by one
root's state in engine.py and used under that root's lock; persisted next to the shadow
repo so a restarted sidecar does not re-hash the workspace.
"""

from __future__ import annotations

import array
import bisect
import itertools
import json
import os
import struct
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, TypeVar

import structlog

from shadowpoint.store.atomic import atomic_writer
from shadowpoint.store.values import TreeEntry
from shadowpoint.workspace import RepoPath

log = structlog.get_logger(__name__)

# Racy-clean: a file is trusted unchanged only if its mtime is strictly older than the
# moment its stat was recorded, minus a margin wider than the kernel's coarse file clock
# (a jiffy, 1-10 ms) and small clock steps; younger files are always re-hashed.
RACY_MARGIN_NS = 1_000_000_000

CACHE_VERSION = 3

# additions and removals `StatCache` sorts in one by one before it sorts anew when asked
_SORTED_EDITS_MAX = 512


# One tracked file's state packed into 76 bytes: size, mtime and ctime (each as seconds and
# nanoseconds, so that any time the kernel reports fits, past 2262 too), st_mode, inode,
# checked_ns, then the git mode and the raw blob id. As a dataclass holding an entry, a hex id
# and five big ints it took ~360 bytes per file: 30 MiB of a 100k-file sidecar's peak.
_STATE = struct.Struct("<qqIqIIQqI20s")
_STAT_PART = struct.Struct("<qqIqIIQq")
_ENTRY_MODE = struct.Struct("<I")
_MODE_AT = _STAT_PART.size
_OID_AT = _MODE_AT + _ENTRY_MODE.size
_NS = 1_000_000_000
_INT64 = range(-2**63, 2**63)


class FileState(bytes):
    """Stat data of one tracked path when it was last hashed, and what it hashed to.

    Immutable and compact (a `bytes` of fixed layout, no per-field objects); the fields are
    read on demand.
    """

    __slots__ = ()

    def is_clean(self, st: os.stat_result) -> bool:
        """True if `st` proves the file still holds `entry` (racy-clean rule)."""
        size, mtime_ns, ctime_ns, st_mode, ino, checked_ns = self.stat_fields()
        return (
            st.st_size == size
            and st.st_mtime_ns == mtime_ns
            and st.st_ctime_ns == ctime_ns
            and st.st_mode == st_mode
            and st.st_ino == ino
            and mtime_ns < checked_ns - RACY_MARGIN_NS
        )

    @classmethod
    def packed(cls, size: int, mtime_ns: int, ctime_ns: int, st_mode: int, ino: int, checked_ns: int,
               mode: int, raw_oid: bytes) -> FileState:
        m_s, m_ns = divmod(mtime_ns, _NS)
        c_s, c_ns = divmod(ctime_ns, _NS)
        return cls(_STATE.pack(size, m_s, m_ns, c_s, c_ns, st_mode, ino, checked_ns, mode, raw_oid))

    @classmethod
    def of(cls, st: os.stat_result, entry: TreeEntry, checked_ns: int) -> FileState:
        return cls.packed(st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_mode, st.st_ino, checked_ns,
                          entry.mode, bytes.fromhex(entry.oid))

    @classmethod
    def unknown(cls, entry: TreeEntry) -> FileState:
        """A tracked path whose stat is not known: never clean until hashed again."""
        return cls.packed(-1, 0, 0, 0, 0, 0, entry.mode, bytes.fromhex(entry.oid))

    def stat_fields(self) -> tuple[int, int, int, int, int, int]:
        """size, mtime_ns, ctime_ns, st_mode, ino, checked_ns."""
        size, m_s, m_ns, c_s, c_ns, st_mode, ino, checked_ns = _STAT_PART.unpack_from(self)
        return size, m_s * _NS + m_ns, c_s * _NS + c_ns, st_mode, ino, checked_ns

    def saved_fields(self) -> tuple[int, int, int, int, int, int, int]:
        """The columns of the saved cache (int64 each: the stat fields, then the git mode); a
        time past what int64 nanoseconds hold is saved as an unknown stat (hashed again)."""
        fields = self.stat_fields()
        if fields[1] not in _INT64 or fields[2] not in _INT64:
            return -1, 0, 0, 0, 0, 0, self.mode
        return (*fields, self.mode)

    @property
    def size(self) -> int:
        return self.stat_fields()[0]

    @property
    def mtime_ns(self) -> int:
        return self.stat_fields()[1]

    @property
    def ctime_ns(self) -> int:
        return self.stat_fields()[2]

    @property
    def st_mode(self) -> int:
        return self.stat_fields()[3]

    @property
    def ino(self) -> int:
        return self.stat_fields()[4]

    @property
    def checked_ns(self) -> int:
        return self.stat_fields()[5]

    @property
    def mode(self) -> int:
        """The git file mode of the blob."""
        return int(_ENTRY_MODE.unpack_from(self, _MODE_AT)[0])

    @property
    def raw_oid(self) -> bytes:
        return self[_OID_AT:]

    @property
    def entry(self) -> TreeEntry:
        return TreeEntry(self[_OID_AT:].hex(), self.mode)

    def __repr__(self) -> str:
        size, mtime_ns, ctime_ns, st_mode, ino, checked_ns = self.stat_fields()
        return (f"FileState(size={size}, mtime_ns={mtime_ns}, ctime_ns={ctime_ns}, st_mode={st_mode:o}, "
                f"ino={ino}, checked_ns={checked_ns}, entry={self.entry!r})")


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
        return st.entry if st else None

    def set(self, path: RepoPath, state: FileState) -> None:
        if path not in self.entries and self._sorted is not None:
            if self._edited():
                bisect.insort(self._sorted, path)
        self.entries[path] = state

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

    def reset_to(self, tree: str | None, listing: dict[RepoPath, TreeEntry], base_commit: str | None) -> None:
        """Mirror another tree, keeping stat data of paths whose blob and mode are unchanged."""
        old = self.entries
        self.entries = {}
        for path, entry in listing.items():
            prev = old.get(path)
            self.entries[path] = prev if prev is not None and prev.entry == entry else FileState.unknown(entry)
        self.tree = tree
        self.base_commit = base_commit
        self._sorted = None

    # ------------------------------------------------------------------ persistence

    def save(self, path: Path) -> None:
        """Write atomically (temp file + rename); a failure only costs re-hashing later.

        A columnar file (a JSON header, the paths, one int64 array per stat field, the
        binary blob ids): compact while written, and nothing in it can execute when read
        back, unlike a pickle.
        """
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            # Everything is streamed in slices straight from the map (run under the root's lock,
            # so it does not change meanwhile): no list of all paths or states, no whole column
            # (~7 MiB each at 1M files, held at the moment of a baseline's peak memory).
            entries = self.entries
            header = json.dumps({"version": CACHE_VERSION, "tree": self.tree, "base": self.base_commit,
                                 "count": len(entries)}).encode() + b"\n"
            with atomic_writer(path) as fh:
                fh.write(header)
                _write_chunked(fh, (b"\0".join(os.fsencode(p) for p in part) for part in _slices(entries)), b"\0")
                fits = _times_fit(entries.values())
                for column, code in enumerate(_COLUMN_TYPES):  # the stat fields, then the git mode
                    _write_chunked(fh, (_column(part, column, code, fits).tobytes()
                                        for part in _slices(entries.values())))
                _write_chunked(fh, (b"".join(st.raw_oid for st in part) for part in _slices(entries.values())))
        except (OSError, ValueError, OverflowError, RuntimeError) as exc:  # RuntimeError: the map changed
            log.warning("stat_cache.save_failed", path=str(path), reason=str(exc))

    @classmethod
    def load(cls, path: Path, base_commit: str | None) -> StatCache | None:
        """The saved cache if it was written for `base_commit`, else None (damage included)."""
        start = time.perf_counter()
        try:
            with open(path, "rb") as fh:
                header = json.loads(fh.readline())
                if header.get("version") != CACHE_VERSION or header.get("base") != base_commit:
                    return None
                count = int(header["count"])
                raw_paths = _read_section(fh)
                paths = [RepoPath(os.fsdecode(p)) for p in raw_paths.split(b"\0")] if count else []
                size, mtime, ctime, st_mode, ino, checked, modes = (
                    _int_array(_read_section(fh), count, code) for code in _COLUMN_TYPES)
                oids = _read_section(fh)
                if len(paths) != count or len(oids) != 20 * count:
                    raise ValueError("section sizes disagree")
        except FileNotFoundError:
            return None
        except Exception as exc:  # a damaged file raises almost anything
            log.warning("stat_cache.unreadable", path=str(path), reason=repr(exc), action="re-hashing the workspace")
            return None
        entries: dict[RepoPath, FileState] = {}
        for i, p in enumerate(paths):
            entries[p] = FileState.packed(size[i], mtime[i], ctime[i], st_mode[i], ino[i], checked[i], modes[i],
                                          oids[20 * i: 20 * i + 20])
        log.debug("stat_cache.loaded", entries=len(entries), duration_ms=(time.perf_counter() - start) * 1e3)
        return cls(tree=header.get("tree"), base_commit=header.get("base"), entries=entries)


_T = TypeVar("_T")

# array type codes of the saved columns: size, mtime_ns, ctime_ns, st_mode, ino, checked_ns and
# the git mode; the inode unsigned (older files wrote it signed: the same bytes below 2**63)
_COLUMN_TYPES = "qqqqQqq"
# Each saved column's fields in a packed state (`_STATE`'s layout): read by `struct` in C for a
# slice of states at a time, where a call of `saved_fields` per state and column took ~0.65 s
# of a 100k-file baseline's end (the first command of a task waits for it)
_SAVED_COLUMNS = (struct.Struct("<q68x"), struct.Struct("<8xqI56x"), struct.Struct("<20xqI44x"),
                  struct.Struct("<32xI40x"), struct.Struct("<36xQ32x"), struct.Struct("<44xq24x"),
                  struct.Struct("<52xI20x"))
_TIMES = (_SAVED_COLUMNS[1], _SAVED_COLUMNS[2])  # (seconds, nanoseconds) of mtime and ctime
_SAFE_S = 9_223_372_035  # a time within this many seconds of 1970 fits int64 nanoseconds


def _times_fit(states: Iterable[FileState]) -> bool:
    """True if every state's times fit the saved int64 nanoseconds (else `saved_fields`' rule
    for the few that do not: see `_column`)."""
    for part in _slices(states):
        data = b"".join(part)
        for layout in _TIMES:
            seconds = [s for s, _ in layout.iter_unpack(data)]
            if seconds and (max(seconds) > _SAFE_S or min(seconds) < -_SAFE_S):
                return False
    return True


def _column(states: list[FileState], column: int, code: str, fits: bool) -> array.array[int]:
    """Column `column` of `FileState.saved_fields` for `states`: read in C when `fits` (see
    `_times_fit`), else state by state."""
    if not fits:
        return array.array(code, (st.saved_fields()[column] for st in states))
    rows = _SAVED_COLUMNS[column].iter_unpack(b"".join(states))
    return array.array(code, [s * _NS + ns for s, ns in rows] if column in (1, 2) else [v for (v,) in rows])


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
