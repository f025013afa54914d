"""`BaselineBuilder`: builds a task's baseline (the first checkpoint: every root scanned, or for
a later task of a root whose watcher stayed healthy, staged from its record, and committed) on
a thread of its own, with the slow and timeout timers, the watchers started
before the scan, and the barriers tool calls wait on (the whole baseline, or only the paths an
edit tool is about to change, which the building scan captures first: SPEC §3).

Owned by `Engine`, one per engine. `begin` runs on the task's engine thread with the task's
lock held; the build on `shadowpoint-baseline:<task>`, the watchers' start on
`shadowpoint-watcher-start`, the timers on `shadowpoint-init-timer:<task>`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from functools import partial
from typing import TYPE_CHECKING

import structlog

from shadowpoint.checkpointer import checkpoint_root
from shadowpoint.errors import InitFailedError, InitTimeoutError, ShadowpointError
from shadowpoint.kinds import CheckpointKind, ErrorKind, TaskState
from shadowpoint.options import EngineOptions
from shadowpoint.results import KindError
from shadowpoint.roots import LockedRoot, Notify, RootState
from shadowpoint.stage.early_capture import EarlyCapture, ScanHold
from shadowpoint.stage.scanner import StageResult
from shadowpoint.store.checkpoints import CheckpointRecord
from shadowpoint.workspace import RepoPath

if TYPE_CHECKING:
    from shadowpoint.engine import TaskRuntime

log = structlog.get_logger(__name__)

# what a failed baseline reports as itself (any other error is reported as init_failed)
INIT_ERROR_KINDS = (ErrorKind.INIT_FAILED, ErrorKind.INIT_TIMEOUT, ErrorKind.LOCK_TIMEOUT, ErrorKind.STORAGE_FAILED)


class BaselineBuilder:
    """Builds the baselines of one engine's tasks and lets tool calls wait for them."""

    def __init__(self, roots: Mapping[str, RootState], options: Callable[[], EngineOptions], *, notify: Notify,
                 hold: Callable[[], ScanHold | None], save: Callable[[TaskRuntime], None],
                 warnings: Callable[[str, StageResult], list[dict[str, str]]], built: Callable[[], None]) -> None:
        """
        Args:
            roots: the engine's roots, by name.
            options: the engine's current options (the timers' delays).
            notify: sends `task/initSlow`, `task/initFailed` (and the watchers' notices) to the host.
            hold: the test seam holding every baseline scan after some files (`early_capture.ScanHold`).
            save: writes the task's whole record.
            warnings: a root's skipped paths as checkpoint warnings.
            built: called once a baseline is built, before the task is ready (the engine starts its
                verifier, applies retention, and keeps its background work off the waiting tool).
        """
        self.roots = roots
        self._options = options
        self._notify = notify
        self._hold = hold
        self._save = save
        self._warnings = warnings
        self._built = built

    def begin(self, rt: TaskRuntime, ts: int) -> None:
        """Start building the task's baseline at `ts` (task lock held): a new generation, so a
        build already running is dropped."""
        rt.generation += 1
        gen = rt.generation
        rt.state, rt.error = TaskState.INITIALIZING, None
        fut: Future[None] = Future()
        rt.baseline = fut
        requested = threading.Event()
        captures = {name: EarlyCapture(self._hold(), requested) for name in self.roots}
        rt.captures = captures
        self._start_timers(rt, gen, fut)
        task_id = rt.record.task_id

        def build() -> None:
            try:
                self._build(rt, ts, gen, captures, requested)
            except ShadowpointError as exc:
                with rt.lock:
                    if rt.generation == gen:
                        self._fail(rt, exc if exc.kind in INIT_ERROR_KINDS else InitFailedError(str(exc)))
            except Exception as exc:  # a bug or an OS error: the task reports it, never silently off
                log.exception("task.init_failed", task_id=task_id)
                with rt.lock:
                    if rt.generation == gen:
                        self._fail(rt, InitFailedError(f"Checkpoint initialisation failed: {exc}"))
            finally:
                for capture in captures.values():
                    capture.finish()
                for t in rt.timers:
                    t.cancel()
                if not fut.done():
                    fut.set_result(None)

        threading.Thread(target=build, name=f"shadowpoint-baseline:{task_id}", daemon=True).start()

    def _start_timers(self, rt: TaskRuntime, gen: int, fut: Future[None]) -> None:
        """A notice when the build is slow; at the timeout the task's checkpoints go off."""
        task_id = rt.record.task_id
        options = self._options()
        started = time.monotonic()

        def slow() -> None:
            if not fut.done():
                self._notify("task/initSlow", {"taskId": task_id, "seconds": _seconds(time.monotonic() - started)})
                log.warning("task.init_slow", task_id=task_id, hint="the repository may be large")

        def timeout() -> None:
            if fut.done():
                return
            with rt.lock:
                if rt.generation != gen or rt.state is not TaskState.INITIALIZING:
                    return
                rt.generation += 1  # the build's result is dropped: no timeout paid on every round
                self._fail(rt, InitTimeoutError(
                    f"Checkpoint initialisation took over {_seconds(self._options().init_timeout_s):g} s; "
                    "checkpoints are off for this task (task/retry tries again)."))
            if not fut.done():
                fut.set_result(None)

        for delay, fn in ((options.init_warn_s, slow), (options.init_timeout_s, timeout)):
            timer = threading.Timer(delay, fn)
            timer.daemon = True
            timer.name = f"shadowpoint-init-timer:{task_id}"
            timer.start()
            rt.timers.append(timer)

    def _fail(self, rt: TaskRuntime, exc: ShadowpointError) -> None:
        rt.state = TaskState.FAILED
        kind = exc.kind if exc.kind in INIT_ERROR_KINDS else ErrorKind.INIT_FAILED
        rt.error = KindError(kind, str(exc))
        self._notify("task/initFailed", {"taskId": rt.record.task_id, "kind": kind, "message": str(exc)})
        log.error("task.init_failed", task_id=rt.record.task_id, kind=kind, reason=str(exc))

    def _build(self, rt: TaskRuntime, ts: int, gen: int, captures: dict[str, EarlyCapture],
               requested: threading.Event) -> None:
        start = time.perf_counter()
        hashes: dict[str, str] = {}
        warnings: list[dict[str, str]] = []
        hashed = taken = 0
        rescanned = False

        def wanted() -> bool:
            with rt.lock:
                return rt.generation == gen  # not deleted or restarted meanwhile

        try:
            self._start_watchers(captures, requested)
            for name, root in self.roots.items():
                # the whole scan, or what a healthy watcher recorded since the root's latest
                # snapshot (`LockedRoot.baseline_plan`); on a git repository, a scan takes the
                # ids the user's index proves unchanged
                capture = captures[name]
                made = checkpoint_root(root, partial(LockedRoot.baseline_plan, capture=capture), rt.record.task_id,
                                       f"baseline checkpoint at {ts}", None, capture=capture,
                                       borrow=True, wanted=wanted, save_cache=True)
                if made is None:
                    return
                commit, result = made.commit, made.result
                hashes[name] = commit
                warnings.extend(self._warnings(name, result))
                hashed += result.stats.hashed
                taken += result.stats.borrowed
                rescanned = rescanned or result.stats.rescan
        finally:
            for root in self.roots.values():
                if root.watcher is not None:
                    root.watcher.placed()  # a root whose scan never ran: its watches by a walk
        self._built()
        with rt.lock:
            if rt.generation != gen:
                return
            cp = CheckpointRecord(ts=ts, kind=CheckpointKind.BASELINE, hashes=hashes, warnings=warnings)
            rt.record.add_checkpoint(cp)
            rt.state, rt.error = TaskState.READY, None
            self._save(rt)
        log.info("task.baseline_built", task_id=rt.record.task_id, hashed=hashed, borrowed=taken, rescan=rescanned,
                 duration_ms=round((time.perf_counter() - start) * 1e3, 1))

    def _start_watchers(self, captures: dict[str, EarlyCapture], requested: threading.Event) -> None:
        """Start every root's watcher before the baseline's scan (so that nothing slips between),
        serving meanwhile what edit tools ask for (the first edit waits only for its paths, SPEC
        §3). The start is deferred: the scan places the watches as it lists each folder, before
        listing it (`WorkspaceWatcher.start`), rather than a walk of their own first."""
        started = threading.Event()

        def start_all() -> None:
            try:
                for root in self.roots.values():
                    root.start_watcher(self._notify, deferred=True)
            finally:
                started.set()
                requested.set()

        starter = threading.Thread(target=start_all, name="shadowpoint-watcher-start", daemon=True)
        starter.start()
        try:
            while not started.is_set():
                requested.wait()
                requested.clear()
                for name, capture in captures.items():
                    if capture.has_pending:
                        with self.roots[name].locked() as root:
                            root.capture_early(capture)
        finally:
            starter.join()

    def wait_ready(self, rt: TaskRuntime) -> bool:
        """Block until the baseline is built (the barrier). False if checkpoints are off."""
        fut = rt.baseline
        if rt.state is TaskState.INITIALIZING and fut is not None:
            with rt.lock:
                rt.waiting_for_baseline += 1
            try:
                fut.result()
            finally:
                with rt.lock:
                    rt.waiting_for_baseline -= 1
        return rt.state is TaskState.READY

    def wait_for_paths(self, rt: TaskRuntime, paths: list[tuple[str, str]]) -> None:
        """An edit tool about to change `paths`: wait until the baseline holds their current
        content, which a baseline still building captures first (SPEC §3), not for all of it."""
        fut = rt.baseline
        if rt.state is not TaskState.INITIALIZING or fut is None or fut.done():
            self.wait_ready(rt)
            return
        start = time.perf_counter()
        requests = [rt.captures[name].request(RepoPath(p) for r, p in paths if r == name)
                    for name in sorted({r for r, _ in paths})]
        for req in requests:
            req.done.wait()
        if any(req.needs_whole_scan for req in requests):
            self.wait_ready(rt)
        log.info("task.paths_captured", task_id=rt.record.task_id, paths=len(paths),
                 wait_ms=round((time.perf_counter() - start) * 1e3, 2))


def _seconds(value: float) -> float:
    """A duration as a person reads it: tenths from 10 s on, else hundredths (a setting below a
    second showed as "0 s")."""
    return round(value, 1 if value >= 10 else 2)
