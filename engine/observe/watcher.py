"""`WorkspaceWatcher`: one watchdog observer per workspace root, recording touched paths into a `PathJournal`.

The engine thread calls start/flush/swap/stop. Watchdog's threads (named `shadowpoint-watcher*:<root
name>`) run the recording handler, which only normalises paths and adds them to the journal, and, on
Linux, the inotify overrides of inotify.py, which call back into `_InotifyHooks` below to keep
watches off skipped folders and report queue overflows and watch limits.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Literal

import structlog
from watchdog.events import (
    DirCreatedEvent,
    DirDeletedEvent,
    DirModifiedEvent,
    DirMovedEvent,
    FileAttribEvent,
    FileClosedEvent,
    FileCreatedEvent,
    FileDeletedEvent,
    FileModifiedEvent,
    FileMovedEvent,
    FileSystemEvent,
    FileSystemEventHandler,
    FileSystemMovedEvent,
)
from watchdog.observers import Observer
from watchdog.observers.api import BaseObserver

from shadowpoint.observe import inotify
from shadowpoint.observe.journal import JournalSnapshot, PathJournal
from shadowpoint.store.loose import FilePool
from shadowpoint.workspace import RepoPath

log = structlog.get_logger(__name__)

_THREAD_PREFIX = inotify.THREAD_PREFIX
_MARKER_PREFIX = "flush-"
MARKER_POOL_SIZE = 8  # files made ahead for the flush markers (one per flush)
_STOP_JOIN_TIMEOUT_S = 10.0
# A problem that a restart alone does not clear: the verification scan found a change the watcher
# never reported; only a clean verification after a restart clears it (SPEC §4).
MISSED_CHANGE = "missed_change"
# Which observer watches a root: shadowpoint's inotify observer (inotify.py, Linux), or
# watchdog's stock `Observer`, as on macOS and Windows (FSEvents, ReadDirectoryChangesW; on Linux
# the stock inotify observer). The portable one has no flush barrier, so its rounds rescan.
ObserverKind = Literal["inotify", "portable"]
UNPROVEN_ROUND = ("the portable observer has no flush barrier and cannot prove it saw every change "
                  "of the round; the round rescans")

# Only what can change a file's content, mode or existence. The default mask also subscribes to
# "opened"/"closed-no-write": the recursive set-up alone then queues ~35,000 "directory opened"
# events on a 100,000-file tree, overflows the kernel queue (16,384) and watchdog re-walks and
# overflows again in a loop (issue 3, "Measured pitfalls"). Directory "modified" events are left
# out too: they name the parent folder, which the stager would expand into its whole content.
_EVENT_FILTER: list[type[FileSystemEvent]] = [
    FileCreatedEvent,
    FileModifiedEvent,
    FileAttribEvent,  # chmod +x: snapshots keep the executable bit
    FileClosedEvent,
    FileDeletedEvent,
    FileMovedEvent,
    DirCreatedEvent,
    DirDeletedEvent,
    DirMovedEvent,
]


def _has_git_component(rel: str) -> bool:
    """True if any component of the POSIX path `rel` is `.git`, in any case."""
    return ".git" in rel.lower() and any(part.lower() == ".git" for part in rel.split("/"))


class _RecordingHandler(FileSystemEventHandler):
    """Turns watchdog events into journal entries; never raises. Runs on the emitter thread
    (inotify: `_InotifyHooks.dispatch`) or on the observer thread (the portable observer)."""

    def __init__(self, root: str, journal: PathJournal, on_marker: Callable[[str], None]) -> None:
        super().__init__()
        self._root = root
        self._prefix = root if root.endswith(os.sep) else root + os.sep
        self._journal = journal
        self._on_marker = on_marker
        # Set by the watcher before each observer start; a plain attribute read is atomic.
        self.marker_prefix: str | None = None

    def dispatch(self, event: FileSystemEvent) -> None:
        # A handler exception would kill the thread it runs on (and with it all watching).
        try:
            if isinstance(event, DirModifiedEvent):
                return
            self._record(os.fsdecode(event.src_path))
            if isinstance(event, FileSystemMovedEvent) and event.dest_path:
                self._record(os.fsdecode(event.dest_path))
        except Exception:
            with contextlib.suppress(Exception):
                log.exception("watcher.handler_failed", root=self._root)
            with contextlib.suppress(Exception):
                self._journal.mark_unhealthy("watcher handler failed; events of this round may be lost")

    def _record(self, path: str) -> None:
        marker = self.marker_prefix
        if marker is not None and path.startswith(marker):
            self._on_marker(path[len(marker) :])
            return
        if marker is not None and path.startswith(os.path.dirname(marker) + os.sep):
            return  # anything else in the marker folder is none of the workspace's
        if not path.startswith(self._prefix):
            return  # the root itself, or a stale watch outside it
        rel = path[len(self._prefix) :]
        if os.sep != "/":
            rel = rel.replace(os.sep, "/")
        if rel and not _has_git_component(rel):
            self._journal.add(RepoPath(rel))


class _InotifyHooks:
    """`inotify.InotifyHooks` for one watcher; called on the set-up and inotify threads."""

    def __init__(self, watcher: WorkspaceWatcher, root: str, marker_dir: str, *, deferred: bool = False) -> None:
        self._watcher = watcher
        self._root_prefix = os.fsencode(root.rstrip("/") + "/")
        self.marker_dir = os.fsencode(marker_dir)
        self.deferred = deferred
        self.skipped_dirs = 0

    def skips(self, path: bytes) -> bool:
        """True for a directory that gets no watch: `.git`, the marker folder, or `skip_dirs`."""
        if path == self.marker_dir:
            return True
        if not path.startswith(self._root_prefix):
            return False
        rel = path[len(self._root_prefix) :]
        # Events under `.git` are dropped anyway: a watch there would only spend the budget.
        if os.path.basename(rel).lower() == b".git" or self._watcher._skips(RepoPath(os.fsdecode(rel))):
            self.skipped_dirs += 1
            return True
        return False

    def watch_limit_hit(self, exc: OSError, path: bytes) -> None:
        self._watcher._degrade("watch_limit", inotify.limit_reason(exc, os.fsdecode(path)))

    def overflowed(self) -> None:
        self._watcher._overflowed()

    def overflow_handled(self, *, rewatched: bool) -> None:
        self._watcher._overflow_handled(rewatched=rewatched)

    def bookkeeping_failed(self) -> None:
        self._watcher._journal.mark_unhealthy("inotify bookkeeping failed; events of this round may be lost")

    def dispatch(self, event: FileSystemEvent) -> None:
        self._watcher._handler.dispatch(event)


class WorkspaceWatcher:
    """Records the paths touched under one workspace root, round by round.

    Health: a failure to start, the OS watch limit, a kernel queue overflow or a dead watchdog
    thread make the watcher unhealthy; each unhealthy period calls `on_degraded(reason)` once and
    makes `swap()` report `healthy=False` for every round it touches. An overflow recovers by itself
    (watches are rebuilt); a dead thread triggers a restart in the background; a watch limit lasts
    until `restart()` (after the limit is raised).

    A verification scan (verifier.py) that finds a change the watcher should have reported calls
    `report_missed()`: the watcher is unhealthy and restarted, and stays unhealthy until
    `verified()` reports a clean verification that began after that restart.

    Rounds are observed from `start()` on: start the watcher before building the baseline.

    The portable observer (`observer_kind="portable"`, and wherever the inotify one is unavailable)
    delivers events asynchronously, with no barrier ordered with them and no overflow signal: no
    round boundary can prove it saw every change, so `flush()` fails and every snapshot it swaps out
    is unhealthy, and the stager rescans (SPEC §4). It still records paths (watch mode's activity,
    a round's scope) and reports a failed start and dead threads.
    """

    def __init__(
        self,
        root: Path,
        *,
        skip_dirs: Callable[[RepoPath], bool] | None = None,
        on_placed: Callable[[], None] | None = None,
        on_degraded: Callable[[str], None] | None = None,
        journal: PathJournal | None = None,
        observer_kind: ObserverKind = "inotify",
    ) -> None:
        """Prepare a watcher; nothing is watched before `start()`.

        Args:
            root: The workspace root (events are reported relative to it).
            skip_dirs: Returns True for a folder not worth an OS watch (excluded folders, nested
                repositories); changes below it are not recorded. Called on the set-up and inotify
                threads, so it may stat but must be quick. `.git` folders are always skipped.
            on_placed: Called after each start (or restart) has placed the watches: what
                `skip_dirs` cached for every folder can go (later calls are for new folders only).
            on_degraded: Called with a reason each time the watcher turns unhealthy. Called on
                whichever thread noticed (possibly a watchdog thread): keep it short, never block.
            journal: The journal to record into; a fresh one by default.
            observer_kind: "inotify" (the default; on systems without it, or with a watchdog release
                the overrides were not written for, the portable observer is used) or "portable"
                (watchdog's stock observer: no skipped folders, no flush barrier, every round rescans).
        """
        self._root = os.path.abspath(root)
        self._label = Path(self._root).name or self._root
        self._skip_dirs = skip_dirs
        self._on_placed = on_placed
        self._on_degraded = on_degraded
        self._journal = journal if journal is not None else PathJournal()
        self._portable = observer_kind == "portable" or not inotify.AVAILABLE
        if observer_kind == "inotify" and self._portable:
            log.info("watcher.inotify_unavailable", root=self._root, platform=sys.platform,
                     watchdog=inotify.watchdog_version())
        self._handler = _RecordingHandler(self._root, self._journal, self._marker_seen)
        # Serialises start/stop/restart; held across watch set-up I/O on purpose (nothing else waits on it
        # except a concurrent lifecycle call).
        self._lifecycle_lock = threading.RLock()
        self._observer: BaseObserver | None = None
        self._hooks: _InotifyHooks | None = None
        self._placer: inotify.FolderWatches | None = None  # a deferred start's, until taken
        self._placing: inotify.FolderWatches | None = None  # taken, until `placed()`
        self._marker_dir: str | None = None
        self._marker_pool: FilePool | None = None
        self._running = False
        self._root_gone = False  # the last start failed because the root was not there
        # Guards `_stopping` and `_restart_thread`. Separate from `_lifecycle_lock` because watchdog
        # threads schedule restarts, and stop() holds the lifecycle lock while it joins them.
        self._restart_lock = threading.Lock()
        self._stopping = False
        self._restart_thread: threading.Thread | None = None
        # Guards `_problems` and `_notified` (health state machine).
        self._health_lock = threading.Lock()
        self._problems: dict[str, str] = {}
        self._notified = False
        # Guards the flush barrier counters.
        self._flush_cond = threading.Condition(threading.Lock())
        self._flush_requested = 0
        self._flush_seen = 0
        self._overflows = 0
        self._generation = 0  # observers started so far
        self._missed_generation = 0  # the observer that missed a change (MISSED_CHANGE)

    # ----------------------------------------------------------------------------------- lifecycle

    def start(self, *, deferred: bool = False) -> None:
        """Place the watches and start the observer threads. Never raises.

        `deferred` (the inotify observer only): place only the root's watch and hold every event
        back; the scan that follows places the others as it lists the folders (`take_placer()`,
        then its `finish()`). Meanwhile nothing is recorded, so the caller scans right away.

        A failure (missing root, OS limits) leaves the watcher unhealthy and calls `on_degraded`.
        Starting a running watcher does nothing.
        """
        with self._lifecycle_lock:
            if self._running:
                return
            with self._restart_lock:
                self._stopping = False
            with self._health_lock:
                # Problems of the previous observer; the new set-up finds any that still hold. The
                # journal stays degraded until the start succeeds. A missed change is cleared by
                # a verification only.
                self._problems = {k: v for k, v in self._problems.items() if k == MISSED_CHANGE}
            started_ns = time.perf_counter_ns()
            try:
                self._start_observer(deferred=deferred and not self._portable)
            except Exception as exc:
                if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EMFILE):
                    reason = inotify.limit_reason(exc, self._root)
                else:
                    reason = f"watcher could not start on {self._root}: {exc}"
                self._root_gone = not os.path.isdir(self._root)
                self._degrade("start_failed", reason)
                return
            self._running = True
            self._root_gone = False
            observer, hooks = self._observer, self._hooks
            if hooks is not None and hooks.deferred and isinstance(observer, inotify.ShadowObserver):
                self._placer = observer.folder_watches(hooks)
            if self._placer is None:
                self._log_started((time.perf_counter_ns() - started_ns) / 1e6)
        self._recover_if_clear()

    def take_placer(self) -> inotify.FolderWatches | None:
        """A deferred start's placer of the watches, once (None: the watches are placed)."""
        with self._lifecycle_lock:
            placer, self._placer = self._placer, None
            if placer is None:
                return None
            self._placing = placer
            return placer

    def placed(self) -> None:
        """The deferred start's watches are placed: the taken placer's `finish()` or `abandon()`
        was called (an untaken placer is abandoned here: every watch placed by a walk)."""
        untaken = self.take_placer()
        if untaken is not None:
            untaken.abandon()
        with self._lifecycle_lock:
            placer, self._placing = self._placing, None
            if placer is None or not self._running:
                return
            # the time spent placing them (the folders' listing is the scan's)
            self._log_started(placer.spent_ms, placed_by_scan=True)

    def _log_started(self, duration_ms: float, *, placed_by_scan: bool = False) -> None:
        log.info(
            "watcher.started",
            root=self._root,
            watches=self.watch_count,
            # folders the scan left out are not counted as skipped here
            skipped_dirs=self._hooks.skipped_dirs if self._hooks is not None and not placed_by_scan else None,
            observer="portable" if self._portable else "inotify",
            backend=type(self._observer).__name__,
            duration_ms=round(duration_ms, 1),
            placed_by_scan=placed_by_scan,
        )
        if self._on_placed is not None:
            self._on_placed()

    def stop(self) -> None:
        """Stop watching and join every watcher thread (including a pending restart)."""
        with self._restart_lock:
            self._stopping = True
            restart_thread = self._restart_thread
        if restart_thread is not None and restart_thread is not threading.current_thread():
            restart_thread.join()
        with self._lifecycle_lock:
            was_running = self._running
            self._running = False
            self._stop_observer()
            if self._marker_pool is not None:
                self._marker_pool.close()
                self._marker_pool = None
            if self._marker_dir is not None:
                shutil.rmtree(self._marker_dir, ignore_errors=True)
                self._marker_dir = None
        if was_running:
            # A round spanning a stop/start missed events: mark it, without calling on_degraded.
            self._degrade("stopped", "watcher was stopped during this round", notify=False)
            log.info("watcher.stopped", root=self._root)

    def start_if_root_back(self) -> bool:
        """Start again a watcher that could not start because its root was gone (a task that
        removed its whole project), once the root is there again (made by the agent or by a
        restore); a watcher stopped for any other reason is left alone (a watch limit waits for
        `restart()`). Returns whether it runs."""
        with self._lifecycle_lock:
            if self._running or self._stopping or not self._root_gone or not os.path.isdir(self._root):
                return self._running
            log.info("watcher.root_back", root=self._root)
            self.restart()
            return self._running

    def restart(self) -> None:
        """Replace the observer with a fresh one (new watches). Never raises.

        Use after the OS watch limit was raised; a dead observer is restarted automatically. Called
        from a watchdog thread (e.g. inside `on_degraded`), the restart runs in the background.
        """
        observer = self._observer
        if observer is not None and threading.current_thread() in _worker_threads(observer):
            self._schedule_restart()
            return
        with self._lifecycle_lock:
            if self._stopping:
                return
            self._running = False
            self._stop_observer()
            self.start()

    def _start_observer(self, *, deferred: bool = False) -> None:
        hooks: _InotifyHooks | None = None
        if self._portable:
            # No marker folder: a second watch is a second emitter (or stream) whose events are not
            # ordered with the workspace's, so a marker proves nothing; see UNPROVEN_ROUND.
            self._handler.marker_prefix = None
            if self._skip_dirs is not None:
                log.info("watcher.skip_unsupported", root=self._root)
            observer: BaseObserver = Observer()
            observer.name = f"{_THREAD_PREFIX}:{self._label}"
        else:
            if self._marker_dir is None or not os.path.isdir(self._marker_dir):
                self._marker_dir = tempfile.mkdtemp(prefix="shadowpoint-flush-")
                if self._marker_pool is not None:
                    self._marker_pool.close()
                # markers are renamed from files made ahead: a rename costs a tenth of a create;
                # made in an unwatched folder of their own, they make no event until renamed
                ahead = Path(self._marker_dir) / "ahead"
                ahead.mkdir(exist_ok=True)
                self._marker_pool = FilePool(ahead, size=MARKER_POOL_SIZE)
            self._handler.marker_prefix = os.path.join(self._marker_dir, _MARKER_PREFIX)
            hooks = _InotifyHooks(self, self._root, self._marker_dir, deferred=deferred)
            observer = inotify.ShadowObserver(hooks, self._label)
        try:
            observer.schedule(self._handler, self._root, recursive=True, event_filter=_EVENT_FILTER)
            if hooks is None:
                for emitter in observer.emitters:
                    emitter.name = f"{_THREAD_PREFIX}-emitter:{self._label}"
            observer.start()
        except BaseException:
            self._shutdown(observer)
            raise
        self._observer, self._hooks = observer, hooks
        with self._flush_cond:
            self._generation += 1
            self._flush_cond.notify_all()

    def _stop_observer(self) -> None:
        observer, self._observer, self._hooks = self._observer, None, None
        self._placer = self._placing = None  # a deferred start's: its events go with the observer
        if observer is not None:
            self._shutdown(observer)

    def _shutdown(self, observer: BaseObserver) -> None:
        try:
            observer.stop()  # stops and joins the emitters and the inotify thread, even if the observer died
        except Exception:
            log.exception("watcher.stop_failed", root=self._root)
        if observer.ident is not None:  # join() raises on a thread that never started
            observer.join(_STOP_JOIN_TIMEOUT_S)
        leftovers = [t.name for t in _worker_threads(observer) if t.is_alive()]
        if leftovers:
            log.error("watcher.stop_timed_out", root=self._root, threads=leftovers)

    def _schedule_restart(self) -> None:
        with self._restart_lock:
            if self._stopping or (self._restart_thread is not None and self._restart_thread.is_alive()):
                return
            thread = threading.Thread(target=self.restart, name=f"{_THREAD_PREFIX}-restart:{self._label}", daemon=True)
            self._restart_thread = thread
            thread.start()

    # ------------------------------------------------------------------------------------- rounds

    @property
    def journal(self) -> PathJournal:
        """The journal this watcher records into."""
        return self._journal

    @property
    def is_healthy(self) -> bool:
        """True while running with every watch in place and every watchdog thread alive."""
        with self._health_lock:
            if self._problems:
                return False
        observer = self._observer
        return self._running and observer is not None and _all_alive(observer)

    @property
    def has_flush_barrier(self) -> bool:
        """True for the inotify observer, whose passed `flush()` proves a round complete; False for
        the portable one, whose rounds all rescan (nothing of it is trusted, so nothing to verify)."""
        return not self._portable

    @property
    def is_running(self) -> bool:
        """True between a successful `start()` and `stop()` (healthy or not)."""
        return self._running

    @property
    def watch_count(self) -> int | None:
        """OS watches placed on the workspace (inotify only; None elsewhere or when stopped)."""
        observer = self._observer
        if inotify.AVAILABLE and isinstance(observer, inotify.ShadowObserver):
            group = observer.group
            return group.watch_count if group is not None else None
        return None

    def flush(self, timeout_s: float = 2.0) -> bool:
        """Wait until every event for a change made before this call has been recorded.

        Once the reader has handed the emitter every event the kernel queued (waiting for its
        batches if need be), passes at once, or waits for the emitter to reach a barrier queued
        behind the events it has still to record (`ShadowObserver.barrier`). Else writes a marker
        file into a private folder watched on the same inotify instance and the same watch group
        as the workspace, and waits for its event: the kernel queue and watchdog's pipeline are
        FIFO, so every earlier workspace event has been recorded by then.

        Args:
            timeout_s: How long to wait, in all.

        Returns:
            True once the barrier passed; False on timeout, overflow, when not running, or always
            with the portable observer (the current round is then marked unhealthy).
        """
        self._check_alive()
        marker_prefix = self._handler.marker_prefix
        observer = self._observer
        if not self._running or observer is None or not _all_alive(observer):
            self._journal.mark_unhealthy("flush failed: watcher not running")
            return False
        if self._portable or marker_prefix is None:
            self._journal.mark_unhealthy(UNPROVEN_ROUND)
            return False
        with self._flush_cond:
            self._flush_requested += 1
            seq, overflows, generation = self._flush_requested, self._overflows, self._generation
        marker = f"{marker_prefix}{seq}"
        deadline = time.monotonic() + timeout_s
        queued = (observer.barrier(os.fsencode(marker), timeout_s)
                  if inotify.AVAILABLE and isinstance(observer, inotify.ShadowObserver) else None)
        if queued is True:
            return True
        if queued is None:
            pool = self._marker_pool
            made_ahead = pool.take() if pool is not None else None
            try:
                try:
                    if made_ahead is None:
                        raise FileNotFoundError
                    os.rename(made_ahead, marker)  # one IN_MOVED_TO event naming the marker
                except FileNotFoundError:
                    os.close(os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600))
            except OSError as exc:
                self._journal.mark_unhealthy(f"flush failed: cannot write marker ({exc})")
                log.warning("watcher.flush_failed", root=self._root, error=str(exc))
                return False
        with self._flush_cond:
            # An overflow or a restart loses the marker; the round is unhealthy anyway, so stop waiting.
            passed = self._flush_cond.wait_for(
                lambda: self._flush_seen >= seq or self._overflows != overflows or self._generation != generation,
                max(0.0, deadline - time.monotonic()),
            )
            passed = self._flush_seen >= seq
        if queued is None:
            with contextlib.suppress(OSError):
                os.unlink(marker)
        if not passed:
            with self._flush_cond:
                interrupted = self._overflows != overflows or self._generation != generation
            if interrupted:
                self._journal.mark_unhealthy("flush interrupted: events were lost or the watcher restarted")
                log.warning("watcher.flush_interrupted", root=self._root)
            else:
                self._journal.mark_unhealthy(f"flush barrier not reached within {timeout_s} s")
                log.warning("watcher.flush_timed_out", root=self._root, timeout_s=timeout_s)
        return passed

    def swap(self) -> JournalSnapshot:
        """End the current round: return its paths and health and start a fresh one.

        Call `flush()` first so that changes made before the round's end are in it.

        Returns:
            The round's snapshot; `healthy` is False if the watcher was not running or unhealthy
            at any moment of the round.
        """
        self._check_alive()
        if not self._running:
            self._journal.mark_unhealthy("watcher not running")
        if self._portable:
            # also without a flush: events still on their way may belong to this round
            self._journal.mark_unhealthy(UNPROVEN_ROUND)
        return self._journal.swap()

    # ------------------------------------------------------------------------------- verification

    @property
    def generation(self) -> int:
        """How many observers this watcher started so far (a restart starts a new one)."""
        with self._flush_cond:
            return self._generation

    @property
    def has_missed_change(self) -> bool:
        """True from `report_missed()` until a verification after a restart cleared it."""
        with self._health_lock:
            return MISSED_CHANGE in self._problems

    def report_missed(self, paths: list[RepoPath]) -> None:
        """A verification scan found `paths` changed with no event: unhealthy, and restart.

        Args:
            paths: The paths that differ from the snapshot and that the journal never recorded.
        """
        example = paths[0] if paths else "?"
        more = f" and {len(paths) - 1} more" if len(paths) > 1 else ""
        reason = (f"the verification scan found {example}{more} changed without a watcher event; "
                  "rounds use the rescan until the restarted watcher is verified again")
        with self._flush_cond:
            self._missed_generation = self._generation
        self._degrade(MISSED_CHANGE, reason)
        self._schedule_restart()

    def verified(self, generation: int) -> bool:
        """A verification that began under observer `generation` found nothing missed.

        Clears a missed change when that observer was started after it (a restart, then a clean
        check). Returns True if the watcher recovered from a missed change.
        """
        with self._flush_cond:
            restarted = generation > self._missed_generation
        with self._health_lock:
            if MISSED_CHANGE not in self._problems or not restarted:
                return False
        log.info("watcher.verified", root=self._root, generation=generation)
        self._recover(MISSED_CHANGE)
        return True

    # ------------------------------------------------------------------------------------- health

    def _skips(self, rel: RepoPath) -> bool:
        if self._skip_dirs is None:
            return False
        try:
            return bool(self._skip_dirs(rel))
        except Exception:
            log.exception("watcher.skip_dirs_failed", root=self._root, path=rel)
            return False

    def _marker_seen(self, name: str) -> None:
        try:
            seq = int(name)
        except ValueError:
            return
        with self._flush_cond:
            if seq > self._flush_seen:
                self._flush_seen = seq
                self._flush_cond.notify_all()

    def _overflowed(self) -> None:
        with self._flush_cond:
            self._overflows += 1
            self._flush_cond.notify_all()
        queued = inotify.read_sysctl("fs.inotify.max_queued_events")
        self._degrade(
            "queue_overflow",
            f"kernel event queue overflowed (fs.inotify.max_queued_events={queued}); events were lost, "
            "rebuilding the watches",
        )

    def _overflow_handled(self, *, rewatched: bool) -> None:
        if rewatched:
            self._recover("queue_overflow")
        else:
            self._schedule_restart()

    def _check_alive(self) -> None:
        # Skip the check while a lifecycle call is under way: it replaces the observer.
        if not self._lifecycle_lock.acquire(blocking=False):
            return
        try:
            observer = self._observer
            if not self._running or observer is None:
                return
            dead = [t.name for t in _worker_threads(observer) if not t.is_alive()]
        finally:
            self._lifecycle_lock.release()
        if dead:
            with self._health_lock:
                known = "observer_died" in self._problems
            if not known:
                self._degrade("observer_died", f"watcher thread(s) died: {', '.join(dead)}; restarting")
            self._schedule_restart()

    def _degrade(self, kind: str, reason: str, *, notify: bool = True) -> None:
        with self._health_lock:
            is_new = kind not in self._problems
            self._problems[kind] = reason
            self._journal.mark_degraded(reason)
            first = notify and not self._notified
            if first:
                self._notified = True
        if not notify or not is_new:
            return  # e.g. one watch-limit failure per folder created later: said once is enough
        log.warning("watcher.degraded", root=self._root, kind=kind, reason=reason)
        if first and self._on_degraded is not None:
            try:
                self._on_degraded(reason)
            except Exception:
                log.exception("watcher.on_degraded_failed", root=self._root)

    def _recover(self, kind: str) -> None:
        with self._health_lock:
            self._problems.pop(kind, None)
        self._recover_if_clear()

    def _recover_if_clear(self) -> None:
        with self._health_lock:
            if self._problems or not self._running:
                return
            self._notified = False
            recovered = self._journal.mark_recovered()
        if recovered:
            log.info("watcher.recovered", root=self._root)


def _worker_threads(observer: BaseObserver) -> list[threading.Thread]:
    """The observer thread and every thread it owns (emitters, the inotify reader)."""
    if inotify.AVAILABLE and isinstance(observer, inotify.ShadowObserver):
        return observer.worker_threads
    return [observer, *observer.emitters]


def _all_alive(observer: BaseObserver) -> bool:
    return all(t.is_alive() for t in _worker_threads(observer))
