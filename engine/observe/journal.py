"""`PathJournal`: the workspace paths touched during the current round, and whether they can be trusted.

The watcher's handler (a watchdog thread) adds paths and health marks; the engine thread calls
`swap()` at each round end to take the round's `JournalSnapshot` and start a fresh round. Every
method is thread-safe: one lock, `_journal_lock`, guards the current round and the health state.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from shadowpoint.workspace import RepoPath

# A handler failing on every event of a burst would otherwise grow the list without bound.
_MAX_REASONS = 16


@dataclass(frozen=True, slots=True)
class JournalSnapshot:
    """What the watcher recorded during one round.

    Attributes:
        paths: Every path created, modified, deleted or moved (source and destination) during the
            round; a directory path stands for everything under it.
        healthy: False if the watcher was unhealthy at any moment of the round (even if it recovered
            later): `paths` may then be incomplete and the round needs the rescan fallback.
        reasons: Why the round is unhealthy, oldest first, without duplicates; empty when healthy.
        during: The paths recorded while a round of a task was open (`open_round()` to the swap):
            the task's own changes. The rest of `paths` changed between rounds (not the task's).
        opened: Whether `open_round()` was called since the previous swap.
    """

    paths: frozenset[RepoPath]
    healthy: bool
    reasons: tuple[str, ...]
    during: frozenset[RepoPath] = frozenset()
    opened: bool = False


class _Round:
    """The mutable state of the current round; only touched under `_journal_lock`."""

    __slots__ = ("before_open", "opened", "paths", "reasons")

    def __init__(self, reasons: list[str]) -> None:
        self.paths: set[RepoPath] = set()
        self.reasons = reasons
        # paths recorded before `open_round()`: changes made between rounds
        self.before_open: set[RepoPath] = set()
        self.opened = False

    def add_reason(self, reason: str) -> None:
        if reason not in self.reasons and len(self.reasons) < _MAX_REASONS:
            self.reasons.append(reason)


class PathJournal:
    """Paths touched in the current round, swapped out whole at the round's end.

    Two kinds of health marks exist. `mark_unhealthy()` spoils the current round only (one lost
    event, a flush that timed out). `mark_degraded()` says the watcher itself is unhealthy: the
    current round and every round that starts before `mark_recovered()` are unhealthy.
    """

    def __init__(self) -> None:
        self._journal_lock = threading.Lock()
        self._round = _Round([])
        self._degraded_reason: str | None = None
        self._swaps = 0

    def add(self, path: RepoPath) -> None:
        """Record that `path` was touched in the current round.

        Args:
            path: A root-relative POSIX path (a directory path covers its contents).
        """
        with self._journal_lock:
            self._round.paths.add(path)

    def open_round(self) -> None:
        """A round of a task opened: paths recorded from now on are the task's (`during`).

        What was recorded since the last swap happened between rounds. Calling it again while
        the round is open changes nothing.
        """
        with self._journal_lock:
            current = self._round
            if not current.opened:
                current.before_open |= current.paths
                current.paths = set()
                current.opened = True

    def put_back(self, snap: JournalSnapshot) -> None:
        """Return a swapped-out round to the current one (a compare that must not consume it),
        keeping which paths were recorded during an open round."""
        with self._journal_lock:
            current = self._round
            if snap.opened and not current.opened:
                current.before_open |= current.paths
                current.paths = set()
                current.opened = True
            current.before_open |= snap.paths - snap.during
            current.paths |= snap.during
            for reason in snap.reasons:
                current.add_reason(reason)

    def mark_unhealthy(self, reason: str) -> None:
        """Mark the current round unhealthy (its paths may be incomplete); later rounds are unaffected.

        Args:
            reason: Why, for people and logs (e.g. "flush timed out after 2.0 s").
        """
        with self._journal_lock:
            self._round.add_reason(reason)

    def mark_degraded(self, reason: str) -> bool:
        """Mark the watcher unhealthy until `mark_recovered()`: this round and the next ones.

        Args:
            reason: Why the watcher is unhealthy.

        Returns:
            True if the journal was not degraded before this call (a healthy → unhealthy transition).
        """
        with self._journal_lock:
            was_healthy = self._degraded_reason is None
            self._degraded_reason = reason
            self._round.add_reason(reason)
        return was_healthy

    def mark_recovered(self) -> bool:
        """Mark the watcher healthy again.

        The current round stays unhealthy (events may have been lost earlier in it); the round that
        the next `swap()` starts is healthy unless the watcher degrades again before then.

        Returns:
            True if the journal was degraded before this call.
        """
        with self._journal_lock:
            was_degraded = self._degraded_reason is not None
            self._degraded_reason = None
        return was_degraded

    @property
    def is_degraded(self) -> bool:
        """True between `mark_degraded()` and `mark_recovered()`."""
        with self._journal_lock:
            return self._degraded_reason is not None

    @property
    def swaps(self) -> int:
        """How many rounds `swap()` ended so far (a reader of the current round checks it did not change)."""
        with self._journal_lock:
            return self._swaps

    def current_paths(self) -> frozenset[RepoPath]:
        """The paths the current round recorded so far, without ending it."""
        with self._journal_lock:
            return frozenset(self._round.paths | self._round.before_open)

    def swap(self) -> JournalSnapshot:
        """End the current round and start a fresh one, atomically.

        The current round is replaced, not copied, under the lock, so a concurrent `add()` lands
        either in the returned snapshot or in the next round, never in both and never in neither.
        The fresh round starts unhealthy if the watcher is degraded at this moment.

        Returns:
            The finished round's paths and health.
        """
        with self._journal_lock:
            old = self._round
            carried = [self._degraded_reason] if self._degraded_reason is not None else []
            self._round = _Round(carried)
            self._swaps += 1
        # `old` is unreachable for writers now, so freezing it needs no lock.
        during = frozenset(old.paths) if old.opened else frozenset()
        return JournalSnapshot(paths=frozenset(old.paths | old.before_open), healthy=not old.reasons,
                               reasons=tuple(old.reasons), during=during, opened=old.opened)
