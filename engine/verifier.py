"""`WatchVerifier`: checks, off the agent's path, that a healthy watcher missed nothing (SPEC §4).

A healthy watcher is authoritative: a command round through which it recorded nothing reuses
the current snapshot without a rescan. This is what keeps that honest. A verification walks the
workspace like a rescan (the same exclusions, the stat cache's clean rule, the blob ids a rescan
would write) but writes nothing and commits nothing; a file that differs from the tracked set
(the newest snapshot) while the watcher's journal has no record of it is a change the watcher
should have reported: the watcher is marked unhealthy (rounds fall back to the rescan) and
restarted, and a later clean verification clears it.

Runs on the engine's verifier thread (`shadowpoint-verifier`), only while no round runs: it
works in slices and pauses after each one in proportion to the work done (a small share of one
core), and gives up the pass as soon as a round begins or anything stages the root.
"""

from __future__ import annotations

import enum
import hashlib
import os
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import structlog

from shadowpoint.roots import RootState
from shadowpoint.stage.blob_workers import HashedFile, read_file, snapshot_file
from shadowpoint.stage.exclusions import NAME_SEP, ExclusionRules
from shadowpoint.stage.stager import is_rules_file
from shadowpoint.stage.stat_cache import FileState, is_clean, state_entry
from shadowpoint.store.values import MODE_LINK, TreeEntry, file_entry
from shadowpoint.workspace import RepoPath, at_or_under

log = structlog.get_logger(__name__)

# Files looked at between two pauses; a slice of a 100k-file tree costs a few milliseconds.
SLICE_FILES = 2000

Pause = Callable[[float], bool]
"""Called between slices with the seconds the slice took; False ends the pass (a round began)."""


class Verdict(enum.Enum):
    CLEAN = "clean"  # the workspace is the tracked set plus what the journal recorded
    MISSED = "missed"  # changes without an event: the watcher was marked unhealthy
    INTERRUPTED = "interrupted"  # a round began, something staged, or the round ended meanwhile
    SKIPPED = "skipped"  # nothing to verify (no watcher, unhealthy for another reason, never scanned,
    # or the portable observer: never trusted, its rounds rescan)


@dataclass(frozen=True, slots=True)
class VerifyStats:
    """What one verification pass did."""

    verdict: Verdict
    examined: int = 0
    hashed: int = 0
    missed: tuple[RepoPath, ...] = ()
    duration_ms: float = 0.0


@dataclass(slots=True)
class _Pass:
    tracked: dict[RepoPath, FileState]
    differing: list[RepoPath] = field(default_factory=list)
    examined: int = 0
    hashed: int = 0


def blob_id(data: bytes) -> str:
    """The git object id of a blob holding `data` (what `write_blob` would answer)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data, usedforsecurity=False).hexdigest()


class WatchVerifier:
    """Verifies one root's watcher against its tracked set; one instance per root, one thread."""

    def __init__(self, root: RootState) -> None:
        self.root = root
        # rules of its own (ExclusionRules caches are not shared between threads), whose walks
        # keep nothing: a second set of every folder's listing would grow the process by ~70 MiB
        # at 1M files, to save a pass that runs seldom and throttled some seconds of reading
        self.rules = ExclusionRules(root.ws.root, extra=root.extra)

    def verify(self, pause: Pause) -> VerifyStats:
        """One pass: compare the workspace with the tracked set; mark the watcher on a miss."""
        start = time.perf_counter()
        root, watcher = self.root, self.root.watcher
        if watcher is None or not watcher.has_flush_barrier or not root.scanned or root.has_carried or not (
                watcher.is_healthy or watcher.has_missed_change):
            return VerifyStats(Verdict.SKIPPED)
        journal = watcher.journal
        generation, swaps = watcher.generation, journal.swaps
        with root.locked() as r:
            r.open()  # the tracked set mirrors the head (another process may have moved it)
            stages = root.stages
            # the live map, not a copy (~40 MiB at 1M files): a stage meanwhile discards the pass
            run = _Pass(root.cache.entries)
        if not self._walk(run, pause):
            return VerifyStats(Verdict.INTERRUPTED, run.examined, run.hashed)
        # every event for a change made before this point is in the journal once the barrier passed
        flushed = watcher.flush()
        recorded = journal.current_paths()
        if not flushed or journal.swaps != swaps or root.stages != stages or any(map(is_rules_file, recorded)):
            return VerifyStats(Verdict.INTERRUPTED, run.examined, run.hashed)
        missed = tuple(p for p in run.differing if not at_or_under(p, recorded))
        duration_ms = round((time.perf_counter() - start) * 1e3, 1)
        if missed:
            if not watcher.has_missed_change:
                for path in missed[:20]:
                    log.warning("watcher.change_missed", root=str(root.ws.root), path=path)
                watcher.report_missed(list(missed))
            verdict = Verdict.MISSED
        else:
            watcher.verified(generation)
            verdict = Verdict.CLEAN
        log.info("watcher.verification_finished", root=str(root.ws.root), verdict=verdict.value,
                 examined=run.examined, hashed=run.hashed, missed=len(missed), duration_ms=duration_ms)
        return VerifyStats(verdict, run.examined, run.hashed, missed, duration_ms)

    def _walk(self, run: _Pass, pause: Pause) -> bool:
        """Note every path that differs from the tracked set; False if `pause` ended the pass."""
        tracked = run.tracked
        base = os.path.join(self.root.ws.root, "")
        reached = in_slice = 0
        slice_start = time.perf_counter()
        for prefix, joined, _ in self.rules.walk_folders(keep=False):
            names = joined.split(NAME_SEP)
            for name in names:
                path = RepoPath(prefix + name)
                known = tracked.get(path)
                reached += known is not None
                self._compare(run, path, base + path, known)
            in_slice += len(names)
            if in_slice >= SLICE_FILES:
                if not pause(time.perf_counter() - slice_start):
                    return False
                slice_start, in_slice = time.perf_counter(), 0
        if reached != len(tracked):
            return self._look_outside_walk(run, base, pause)
        return pause(time.perf_counter() - slice_start)

    def _look_outside_walk(self, run: _Pass, base: str, pause: Pause) -> bool:
        """Compare the tracked paths the walk did not reach: deleted, or tracked despite an
        exclusion (force-added; rounds look at those themselves, the watcher has no watch where
        they live). Which ones those are is not kept (a set of the walked paths took ~30 MiB at
        1M files): every tracked path is looked at again, an lstat each; one the walk compared
        is clean or already noted. False if `pause` ended the pass."""
        tracked = run.tracked
        noted = set(run.differing)
        slice_start = time.perf_counter()
        for i, path in enumerate(list(tracked), 1):
            if i % SLICE_FILES == 0:
                if not pause(time.perf_counter() - slice_start):
                    return False
                slice_start = time.perf_counter()
            known = tracked.get(path)  # None: staged meanwhile (the pass is then discarded)
            if known is None or path in noted:
                continue
            full = base + path
            try:
                if is_clean(known, os.lstat(full)):
                    continue
            except OSError:
                pass
            if not self.rules.is_excluded(path, is_dir=False):
                self._compare(run, path, full, known)
        return pause(time.perf_counter() - slice_start)

    def _compare(self, run: _Pass, path: RepoPath, full: str, known: FileState | None) -> None:
        run.examined += 1
        try:
            st = os.lstat(full)
        except OSError:
            if known is not None:
                run.differing.append(path)
            return
        if known is not None and is_clean(known, st):
            return
        entry = self._entry(run, full, st)
        if entry != (state_entry(known) if known is not None else None):
            run.differing.append(path)

    def _entry(self, run: _Pass, full: str, st: os.stat_result) -> TreeEntry | None:
        """What a rescan would record for the file: its tree entry, None where it would leave it
        out (over the cap, unreadable, not a regular file)."""
        max_bytes = self.root.options.max_file_bytes
        run.hashed += 1
        if stat.S_ISLNK(st.st_mode):
            try:
                return TreeEntry(blob_id(os.fsencode(os.readlink(full))), MODE_LINK)
            except OSError:
                return None
        if not stat.S_ISREG(st.st_mode) or st.st_size > max_bytes:
            return None
        outcome = snapshot_file(lambda: read_file(full, max_bytes), max_bytes, blob_id)
        if not isinstance(outcome, HashedFile):
            return None
        return file_entry(outcome.oid, outcome.stat.st_mode)




def throttled(share: float, keep_going: Callable[[], bool], wait: Callable[[float], bool]) -> Pause:
    """A `Pause` that keeps a pass to about `share` of one core: after a slice that took `t` s it
    waits `t * (1 / share - 1)` s, through `wait` (an Event's wait: True ends the pass early), and
    ends the pass when `keep_going()` turns False (a round began)."""
    factor = 1.0 / share - 1.0

    def pause(busy_s: float) -> bool:
        if not keep_going():
            return False
        if wait(busy_s * factor):
            return False
        return keep_going()

    return pause
