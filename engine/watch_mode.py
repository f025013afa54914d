"""Watch mode (`shadowpoint watch`): rounds defined by quiet periods instead of agent events.

`WatchLoop` installs the engine's workspace watchers with an `ActivityJournal` (a
`PathJournal` that also notes when something was last touched), then, once nothing has
changed for `debounce_s`, publishes one command-kind round on the engine's bus: the stager
takes the watcher's paths. While the watcher is unhealthy (OS watch limit, disabled), it
polls instead: a compare against the last checkpoint decides whether a round is due. The
loop runs on the caller's (main) thread; watchdog threads only record into the journal;
engine work runs through `runner` (the shared host's task worker under `watch`).
`take_over_sidecar` and `serve_watched` hand the workspace's sidecar socket to the watch process.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, TypeVar

import structlog

from shadowpoint.engine import Engine
from shadowpoint.events import RoundBegan, RoundEnded, TaskStarted, ToolBegan, ToolEnded
from shadowpoint.kinds import ToolKind
from shadowpoint.observe.journal import PathJournal
from shadowpoint.results import Checkpoint, CheckpointList, TaskStatus
from shadowpoint.stage.exclusions import RULE_FILES, ExclusionRules
from shadowpoint.stopping import StopFlag
from shadowpoint.workspace import RepoPath

if TYPE_CHECKING:
    from shadowpoint.config import Settings
    from shadowpoint.sidecar.server import Host

log = structlog.get_logger(__name__)

T = TypeVar("T")


class Runner(Protocol):
    """Runs `fn` for the task and answers its result (`Host.call`: on the task's worker)."""

    def __call__(self, task_id: str, fn: Callable[[], T], /) -> T: ...


def _inline(task_id: str, fn: Callable[[], T], /) -> T:
    return fn()


WATCH_TOOL = "shadowpoint-watch"
_TICK_S = 0.1


class ActivityJournal(PathJournal):
    """A `PathJournal` that also keeps the paths touched since the last quiet-period round.

    `add` runs on watchdog threads: it only records, under `_activity_lock` (no I/O, never
    raises on its own).
    """

    def __init__(self) -> None:
        super().__init__()
        self._activity_lock = threading.Lock()
        self._pending: set[RepoPath] = set()
        self._last_activity = 0.0

    def add(self, path: RepoPath) -> None:
        """Record `path` for the round and as activity (watchdog thread)."""
        super().add(path)
        with self._activity_lock:
            self._pending.add(path)
            self._last_activity = time.monotonic()

    def quiet_for_s(self) -> float | None:
        """Seconds since the last recorded change, None when nothing is pending."""
        with self._activity_lock:
            if not self._pending:
                return None
            return time.monotonic() - self._last_activity

    def pending_count(self) -> int:
        """How many paths were touched since the last `take_pending()`."""
        with self._activity_lock:
            return len(self._pending)

    def take_pending(self) -> set[RepoPath]:
        """The paths touched since the last call (and forget them)."""
        with self._activity_lock:
            pending, self._pending = self._pending, set()
            return pending


def install_watchers(engine: Engine) -> dict[str, ActivityJournal]:
    """Start each root's watcher with an `ActivityJournal`, before the task's baseline starts
    one of its own (the engine keeps a watcher that is already there).

    Returns:
        The journals by root name (empty when the watcher is off in the settings).
    """
    journals: dict[str, ActivityJournal] = {}
    if not engine.options.watcher:
        return journals
    for name, root in engine.roots.items():
        if root.watcher is not None:
            continue
        journal = ActivityJournal()
        root.start_watcher(engine.notify, journal)
        journals[name] = journal
    return journals


@dataclass(frozen=True, slots=True)
class WatchEvent:
    """A checkpoint the loop made: the protocol's `Checkpoint` and how many paths were touched."""

    checkpoint: Checkpoint | None
    paths: int
    reason: str


class WatchLoop:
    """Checkpoints one task of a workspace after every quiet period."""

    def __init__(self, engine: Engine, task_id: str, debounce_s: float, *,
                 runner: Runner | None = None,
                 on_checkpoint: Callable[[WatchEvent], None] | None = None,
                 poll_s: float | None = None) -> None:
        """Prepare the loop; `install()` then `start()` before `run()`.

        Args:
            engine: The engine on the workspace (its watcher setting decides watch vs poll).
            task_id: The task that gets the checkpoints.
            debounce_s: Quiet period: a round once nothing changed for this long.
            runner: Runs engine work for the task (`Host.call`); default: inline.
            on_checkpoint: Called on the loop's thread after each checkpoint.
            poll_s: Poll interval while the watcher is unhealthy (default max(10 s, 5 × debounce)).
        """
        self.engine = engine
        self.task_id = task_id
        self.debounce_s = debounce_s
        self.poll_s = poll_s if poll_s is not None else max(10.0, 5 * debounce_s)
        self._runner: Runner = runner or _inline
        self._on_checkpoint = on_checkpoint or (lambda event: None)
        self.journals: dict[str, ActivityJournal] = {}
        self._rules = {name: ExclusionRules(root.ws.root, extra=root.extra) for name, root in engine.roots.items()}
        self._last_ts = 0
        self._last_poll = time.monotonic()
        self.checkpoints = 0

    # ------------------------------------------------------------------ set-up

    def install(self) -> None:
        """Start the watchers (before the baseline, so nothing slips between)."""
        self.journals = install_watchers(self.engine)

    def start(self) -> TaskStatus:
        """Start (or resume) the task; returns its state (`initializing` while the baseline builds)."""
        return self._run(lambda: self.engine.bus.publish(TaskStarted(self.task_id, self._ts())))

    def state(self) -> CheckpointList:
        """The task's checkpoint list and state (`checkpoint/list`)."""
        return self.engine.list_checkpoints(self.task_id)

    # ------------------------------------------------------------------ loop

    @property
    def is_watching(self) -> bool:
        """True while every root's watcher is healthy (rounds by quiet period, not by polling)."""
        if not self.journals or len(self.journals) != len(self.engine.roots):
            return False
        return all(root.watcher is not None and root.watcher.is_healthy for root in self.engine.roots.values())

    def pending_paths(self) -> int:
        """How many paths changed since the last round (for the status line)."""
        return sum(j.pending_count() for j in self.journals.values())

    def run(self, stop: StopFlag) -> None:
        """Make a checkpoint after each quiet period until `stop` is set."""
        while not stop.wait(_TICK_S):
            self.tick()

    def tick(self) -> WatchEvent | None:
        """One step of the loop: checkpoint if a quiet period has just ended (or a poll found changes)."""
        if self.is_watching:
            quiet = [j.quiet_for_s() for j in self.journals.values()]
            waiting = [q for q in quiet if q is not None]
            if waiting and min(waiting) >= self.debounce_s:
                return self.checkpoint_pending("quiet period")
            return None
        if time.monotonic() - self._last_poll >= self.poll_s:
            self._last_poll = time.monotonic()
            return self._poll()
        return None

    def checkpoint_pending(self, reason: str, *, settle: bool = False) -> WatchEvent | None:
        """Checkpoint now if anything not excluded was touched since the last round.

        `settle` (the last round, at exit): first wait until the watchers have recorded every
        change made before this call, since an edit saved just before Ctrl-C may still be in
        the kernel's queue; a watcher that cannot prove it gets the round anyway (the round
        then rescans), and without watchers the workspace is compared with the last checkpoint.
        """
        if settle and not self.is_watching:
            return self._poll()
        unproven = settle and not self._settled()
        touched = 0
        for name, journal in self.journals.items():
            touched += self._relevant(name, journal.take_pending())
        if not touched and not unproven:
            return None
        return self._round(reason, touched)

    def _settled(self) -> bool:
        """True once every root's watcher has recorded the changes made before this call."""
        watchers = [root.watcher for root in self.engine.roots.values() if root.watcher is not None]
        return all([watcher.flush() for watcher in watchers])  # a list: every watcher is flushed

    def _relevant(self, name: str, paths: set[RepoPath]) -> int:
        rules = self._rules[name]
        root = self.engine.roots[name].ws.root
        count = 0
        for path in paths:
            base = path.rsplit("/", 1)[-1]
            if base in RULE_FILES:
                rules.invalidate(path)
                count += 1
                continue
            is_dir = os.path.isdir(os.path.join(root, path))
            if not rules.is_excluded(path, is_dir=is_dir):
                count += 1
        return count

    def _poll(self) -> WatchEvent | None:
        cps = [c for c in self.state().checkpoints if c.hash is not None]
        if not cps:
            return None
        diff = self._run(lambda: self.engine.diff(self.task_id, cps[-1].ts))
        if not diff.files:
            return None
        return self._round("poll", len(diff.files))

    def _round(self, reason: str, paths: int) -> WatchEvent:
        ts = self._ts()

        def work() -> Checkpoint | None:
            bus = self.engine.bus
            bus.publish(RoundBegan(self.task_id))
            bus.publish(ToolBegan(self.task_id, WATCH_TOOL, ToolKind.COMMAND, None))
            bus.publish(ToolEnded(self.task_id, WATCH_TOOL, ToolKind.COMMAND, None, True))
            return bus.publish(RoundEnded(self.task_id, ts))

        cp = self._run(work)
        self.checkpoints += 1
        event = WatchEvent(cp, paths, reason)
        log.info("watch.checkpointed", task_id=self.task_id, paths=paths, reason=reason,
                 hash=cp.hash if cp else None)
        self._on_checkpoint(event)
        return event

    def _run(self, fn: Callable[[], T]) -> T:
        return self._runner(self.task_id, fn)

    def _ts(self) -> int:
        self._last_ts = max(time.time_ns() // 1_000_000, self._last_ts + 1)
        return self._last_ts


# ---------------------------------------------------------------------------- the sidecar hand-over


def take_over_sidecar(root: Path, wait_s: float = 10.0) -> None:
    """Ask the sidecar serving `root`, when one runs, to stop, and wait (up to `wait_s`) for its
    socket to go: a hook-started sidecar hands the workspace over (its state is on disk).

    Raises:
        SidecarError: the sidecar refused (another `watch` serves the workspace).
    """
    from shadowpoint.sidecar.client import connect_live, socket_path

    live = connect_live(root)
    if live is None:
        return
    with live:
        live.request("sidecar/stop")
    deadline = time.monotonic() + wait_s
    while socket_path(root).exists() and time.monotonic() < deadline:
        time.sleep(0.05)


@contextlib.contextmanager
def serve_watched(engine: Engine, root: Path, settings: Settings, warn: Callable[[str], None]) -> Iterator[Host]:
    """A shared sidecar `Host` owning `engine`, serving the workspace's socket (and http hooks)
    on a `shadowpoint-accept` thread, so that agent hooks and other commands share the watch's
    engine; a socket that cannot be served is passed to `warn` and the watch goes on without
    it. Stops serving and closes the host (with the engine) on exit."""
    from shadowpoint.errors import SidecarRunningError
    from shadowpoint.sidecar.client import socket_path
    from shadowpoint.sidecar.server import Host
    from shadowpoint.sidecar.socket_server import SocketServer

    host = Host(settings, shared=True)
    host.owner = "watch"
    host.adopt(engine, settings)
    server: SocketServer | None = None
    try:
        server = SocketServer(socket_path(root), host, idle_timeout_s=None, http_root=str(root))
    except (SidecarRunningError, OSError) as exc:
        warn(f"not serving the sidecar socket ({exc})")
    accept = None
    if server is not None:
        accept = threading.Thread(target=server.serve_forever, name="shadowpoint-accept", daemon=True)
        accept.start()
    try:
        yield host
    finally:
        if server is not None:
            server.shutdown()
        if accept is not None:
            accept.join(5)
        host.close()
