"""`StatCache`: what the latest snapshot of one root holds, with the stat data last seen.

Maps every tracked `RepoPath` to a `FileState` (size, mtime_ns, ctime_ns, mode, inode and
the blob it hashed to), so a rescan re-hashes only files whose stat changed. Owned by one
root's state in engine.py and used under that root's lock; persisted next to the shadow
repo so a restarted sidecar does not re-hash the workspace.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import time
from dataclasses import dataclass, field
from pathlib import Path

import structlog

from shadowpoint.shadow_repo import TreeEntry
from shadowpoint.workspace import RepoPath

log = structlog.get_logger(__name__)

# Racy-clean: a file is trusted unchanged only if its mtime is strictly older than the
# moment its stat was recorded, minus a margin wider than the kernel's coarse file clock
# (a jiffy, 1-10 ms) and small clock steps; younger files are always re-hashed.
RACY_MARGIN_NS = 1_000_000_000

CACHE_VERSION = 2


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
        return cls(st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_mode, st.st_ino, checked_ns, entry)

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
        """Write atomically (temp file + rename); a failure only costs re-hashing later."""
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(tmp, "wb") as fh:
                pickle.dump((CACHE_VERSION, self.tree, self.base_commit, self.entries), fh, protocol=5)
            os.replace(tmp, path)
        except OSError as exc:
            log.warning("stat_cache.save_failed", path=str(path), reason=str(exc))
            with contextlib.suppress(OSError):
                tmp.unlink()

    @classmethod
    def load(cls, path: Path, base_commit: str | None) -> StatCache | None:
        """The saved cache if it was written for `base_commit`, else None."""
        start = time.perf_counter()
        try:
            with open(path, "rb") as fh:
                version, tree, saved_base, entries = pickle.load(fh)
        except (OSError, pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError):
            return None
        if version != CACHE_VERSION or saved_base != base_commit:
            return None
        log.debug("stat_cache.loaded", entries=len(entries), duration_ms=(time.perf_counter() - start) * 1e3)
        return cls(tree=tree, base_commit=saved_base, entries=entries)
