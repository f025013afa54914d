"""`StatCache`: what the latest snapshot of one root holds, with the stat data last seen.

Maps every tracked `RepoPath` to a `FileState` (size, mtime_ns, ctime_ns, mode, inode and
the blob it hashed to), so a rescan re-hashes only files whose stat changed. Owned by one
root's state in engine.py and used under that root's lock; persisted next to the shadow
repo so a restarted sidecar does not re-hash the workspace.
"""

from __future__ import annotations

import array
import json
import os
import struct
import time
from collections.abc import Iterator
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


@dataclass(frozen=True, slots=True)
class FileState:
    """Stat data of one tracked path when it was last hashed, and what it hashed to."""

    size: int
    mtime_ns: int
    ctime_ns: int
    st_mode: int
    ino: int
    checked_ns: int
    entry: TreeEntry

    def is_clean(self, st: os.stat_result) -> bool:
        """True if `st` proves the file still holds `entry` (racy-clean rule)."""
        return (
            st.st_size == self.size
            and st.st_mtime_ns == self.mtime_ns
            and st.st_ctime_ns == self.ctime_ns
            and st.st_mode == self.st_mode
            and st.st_ino == self.ino
            and st.st_mtime_ns < self.checked_ns - RACY_MARGIN_NS
        )

    @classmethod
    def of(cls, st: os.stat_result, entry: TreeEntry, checked_ns: int) -> FileState:
        return cls(st.st_size, st.st_mtime_ns, st.st_ctime_ns, _shared(st.st_mode), st.st_ino, checked_ns, entry)

    @classmethod
    def unknown(cls, entry: TreeEntry) -> FileState:
        """A tracked path whose stat is not known: never clean until hashed again."""
        return cls(-1, 0, 0, 0, 0, 0, entry)


@dataclass(slots=True)
class StatCache:
    """The tracked set of one root: the tree of its latest snapshot, plus stat data."""

    tree: str | None = None
    base_commit: str | None = None
    entries: dict[RepoPath, FileState] = field(default_factory=dict)
    _sorted: list[RepoPath] | None = None

    def entry(self, path: RepoPath) -> TreeEntry | None:
        st = self.entries.get(path)
        return st.entry if st else None

    def set(self, path: RepoPath, state: FileState) -> None:
        if path not in self.entries:
            self._sorted = None
        self.entries[path] = state

    def remove(self, path: RepoPath) -> None:
        if self.entries.pop(path, None) is not None:
            self._sorted = None

    def under(self, directory: RepoPath) -> list[RepoPath]:
        """Tracked paths strictly below `directory` (bisect over a lazily sorted key list)."""
        import bisect

        if self._sorted is None:
            self._sorted = sorted(self.entries)
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
            paths = list(self.entries)
            states = [self.entries[p] for p in paths]
            header = json.dumps({"version": CACHE_VERSION, "tree": self.tree, "base": self.base_commit,
                                 "count": len(paths)}).encode() + b"\n"
            with atomic_writer(path) as fh:
                fh.write(header)
                # paths and ids are streamed in slices: joined whole, their bytes copies added
                # ~15 MB to the peak memory of a 100k-file baseline (saved right after it)
                _write_chunked(fh, (b"\0".join(os.fsencode(p) for p in part) for part in _slices(paths)), b"\0")
                for name in _INT_FIELDS:
                    _write_section(fh, array.array("q", (getattr(st, name) for st in states)).tobytes())
                _write_section(fh, array.array("q", (int(st.entry.mode) for st in states)).tobytes())
                _write_chunked(fh, (bytes.fromhex("".join(st.entry.oid for st in part)) for part in _slices(states)))
        except (OSError, ValueError) as exc:
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
                columns = [_int_array(_read_section(fh), count) for _ in _INT_FIELDS]
                modes = _int_array(_read_section(fh), count)
                oids = _read_section(fh)
                if len(paths) != count or len(oids) != 20 * count:
                    raise ValueError("section sizes disagree")
        except FileNotFoundError:
            return None
        except Exception as exc:  # a damaged file raises almost anything
            log.warning("stat_cache.unreadable", path=str(path), reason=repr(exc), action="re-hashing the workspace")
            return None
        entries: dict[RepoPath, FileState] = {}
        size, mtime, ctime, st_mode, ino, checked = columns
        for i, p in enumerate(paths):
            entry = TreeEntry(oids[20 * i: 20 * i + 20].hex(), modes[i])
            entries[p] = FileState(size[i], mtime[i], ctime[i], _shared(st_mode[i]), ino[i], checked[i], entry)
        log.debug("stat_cache.loaded", entries=len(entries), duration_ms=(time.perf_counter() - start) * 1e3)
        return cls(tree=header.get("tree"), base_commit=header.get("base"), entries=entries)


_T = TypeVar("_T")

_MODES: dict[int, int] = {}


def _shared(mode: int) -> int:
    """The one int object kept for this st_mode: a tree has a handful of distinct modes, and an
    int per file cost 28 bytes x 100k files of the sidecar's peak memory."""
    return _MODES.setdefault(mode, mode)

_INT_FIELDS = ("size", "mtime_ns", "ctime_ns", "st_mode", "ino", "checked_ns")


def _write_section(fh: BinaryIO, data: bytes) -> None:
    fh.write(struct.pack("<Q", len(data)))
    fh.write(data)


def _slices(items: list[_T], size: int = 4096) -> Iterator[list[_T]]:
    for i in range(0, len(items), size):
        yield items[i:i + size]


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


def _int_array(data: bytes, count: int) -> array.array[int]:
    arr = array.array("q")
    arr.frombytes(data)
    if len(arr) != count:
        raise ValueError("truncated stat cache column")
    return arr
