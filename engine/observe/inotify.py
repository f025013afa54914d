"""The inotify specifics of the watcher on Linux: watchdog's inotify observer with its internals overridden.

`WorkspaceWatcher` (watcher.py) builds a `ShadowObserver` around an `InotifyHooks` of its own. The
overrides keep watches off skipped folders, report kernel queue overflows and watch limits, tell when
the reader has handed every event the kernel queued over (so the flush barrier can pass at once, or
queue itself behind the events still to record), carry the flush marker folder on the workspace's own
watch group (the barrier's fallback, ordered with workspace events by the kernel) and release paired
renames at once. They run on watchdog's set-up, inotify-reader and emitter threads.

They reach into private internals of watchdog, written for the versions in `SUPPORTED_WATCHDOG`.
tests/unit/test_watcher_inotify.py checks the installed version and the signature of every internal
overridden here, so an upgrade fails in that test; at run time an untested version leaves `AVAILABLE`
False and the watcher takes watchdog's stock observer (the portable path, whose rounds rescan).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import os
import struct
import termios
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import structlog
from watchdog.events import DirCreatedEvent, DirMovedEvent, FileCreatedEvent, FileSystemEvent
from watchdog.observers.api import BaseObserver, EventQueue, ObservedWatch

log = structlog.get_logger(__name__)

THREAD_PREFIX = "shadowpoint-watcher"
# The watchdog releases these overrides were written and tested for: (major, minor) pairs.
SUPPORTED_WATCHDOG: frozenset[tuple[int, int]] = frozenset({(7, 1)})
# Events held back while a scan places the watches (`_HoldingInotifyFD`): past this many the rest
# are dropped and handled as the kernel's queue overflow (the kernel's own queue holds 16,384).
HOLD_MAX_EVENTS = 65_536
# Reader batches a flush barrier waits for before it writes a marker file instead: each reads what
# the kernel queued, up to 80 KB; a steady stream of events could keep the reader busy for good.
BARRIER_BATCHES = 3


def watchdog_version() -> tuple[int, int] | None:
    """The installed watchdog's (major, minor), or None when it cannot be read (from its
    `watchdog.version` module: importlib.metadata took ~10 ms of every sidecar's start)."""
    try:
        from watchdog import version
    except ImportError:
        return None
    major, minor = getattr(version, "VERSION_MAJOR", None), getattr(version, "VERSION_MINOR", None)
    return (major, minor) if isinstance(major, int) and isinstance(minor, int) else None


class InotifyHooks(Protocol):
    """What the watch group asks of its watcher; called on the set-up and inotify threads."""

    @property
    def marker_dir(self) -> bytes:
        """The flush marker folder, watched on the same group as the workspace."""
        ...

    @property
    def deferred(self) -> bool:
        """True: the start places only the root's watch and holds every event back; a scan places
        the others (`FolderWatches`)."""
        ...

    def skips(self, path: bytes) -> bool:
        """True for a directory that gets no watch."""
        ...

    def watch_limit_hit(self, exc: OSError, path: bytes) -> None:
        """The OS watch (or instance) limit stopped a watch on `path`."""
        ...

    def overflowed(self) -> None:
        """The kernel queue overflowed: events were lost."""
        ...

    def overflow_handled(self, *, rewatched: bool) -> None:
        """The watches were rebuilt after an overflow (`rewatched`), or could not be."""
        ...

    def bookkeeping_failed(self) -> None:
        """watchdog's bookkeeping raised: events of this round may be lost."""
        ...

    def dispatch(self, event: FileSystemEvent) -> None:
        """Record `event`; called on the emitter thread, in the kernel's order."""
        ...


def read_sysctl(name: str) -> int | None:
    try:
        return int(Path("/proc/sys", *name.split(".")).read_text().strip())
    except (OSError, ValueError):
        return None


def limit_reason(exc: OSError, where: str) -> str:
    """A message for people: which OS limit stopped the watcher and how to raise it."""
    if exc.errno == errno.EMFILE:
        knob, floor, what = "fs.inotify.max_user_instances", 1024, "inotify instance limit"
    else:
        knob, floor, what = "fs.inotify.max_user_watches", 524288, "inotify watch limit"
    current = read_sysctl(knob)
    suggested = max(floor, 2 * current) if current else floor
    return (
        f"OS {what} reached ({knob}={current if current is not None else '?'}) while watching {where}; "
        f"raise it with `sudo sysctl {knob}={suggested}` (persist it in /etc/sysctl.d/) "
        "and restart the watcher; until then rounds use the rescan"
    )



try:  # watchdog >= 7.1 on Linux; elsewhere (or an older watchdog) the generic observer is used
    from watchdog.observers.inotify import InotifyEmitter, InotifyObserver, InotifyWatchGroup
    from watchdog.observers.inotify_c import (
        InotifyConstants,
        InotifyEvent,
        InotifyFD,
        Mask,
        Watch,
        WatchDescriptor,
        inotify_add_watch,
        inotify_rm_watch,
    )
    from watchdog.observers.inotify_move_event_grouper import (
        GroupedInotifyEvent,
        InotifyMoveEventGrouper,
        PathedInotifyEvent,
    )
    from watchdog.utils.delayed_queue import DelayedQueue

    AVAILABLE = watchdog_version() in SUPPORTED_WATCHDOG
except Exception:  # ImportError, or UnsupportedLibcError/OSError raised while loading libc
    AVAILABLE = False

if AVAILABLE:

    @dataclass(frozen=True)
    class _Barrier:
        """A flush barrier queued straight behind the events already read from the kernel (see
        `ShadowObserver.barrier`): the emitter reports `marker` when it gets this far."""

        marker: bytes

    class _PromptDelayedQueue(DelayedQueue[GroupedInotifyEvent]):
        """Watchdog's delay queue, but a head held for move pairing is released as soon as it is paired.

        The stock `get()` sleeps the full 0.5 s behind every IN_MOVED_FROM even when its IN_MOVED_TO
        arrived a microsecond later, so every rename (editors' atomic saves) delayed all later events,
        and the flush barrier, by 0.5 s. Waiting on the condition wakes on the pair's `put()`.
        """

        def __init__(self, delay: float) -> None:
            super().__init__(delay)
            # The emitter took an event and has not come back for the next: it may be handling it.
            self.busy = False

        def idle(self) -> bool:
            """Nothing queued and nothing taken still being handled. Hold `_lock`."""
            return not self._queue and not self.busy

        def pass_or_enqueue(self, barrier: _Barrier) -> bool:
            """True when idle; else `barrier` goes at the end of the queue (False)."""
            with self._not_empty:
                if self.idle():
                    return True
                self._queue.append((barrier, time.monotonic(), False))  # type: ignore[arg-type]
                self._not_empty.notify()
                return False

        def get(self) -> GroupedInotifyEvent | None:
            with self._not_empty:
                self.busy = False  # the one emitter is back: what it took last is handled
                while True:
                    if self._closed:
                        return None
                    if not self._queue:
                        self._not_empty.wait()
                        continue
                    head, insert_time, delay = self._queue[0]
                    time_left = insert_time + self.delay - time.monotonic() if delay else 0.0
                    if time_left > 0:
                        self._not_empty.wait(time_left)
                        continue
                    self._queue.popleft()
                    self.busy = True
                    return head

    class _PromptMoveGrouper(InotifyMoveEventGrouper):
        def __init__(self) -> None:
            super().__init__()
            self._queue = _PromptDelayedQueue(self.delay)

    @dataclass
    class _ShadowWatchGroup(InotifyWatchGroup):
        """A recursive watch group that skips folders, reports limits and overflows, and carries the
        flush marker folder as one more watch, so that marker events travel the same ordered path
        (kernel queue → this group → one emitter → handler) as workspace events."""

        hooks: InotifyHooks = field(kw_only=True)
        _move_event_grouper: InotifyMoveEventGrouper = field(default_factory=_PromptMoveGrouper, init=False)
        _limit_hit: bool = field(default=False, init=False)

        @property
        def watch_count(self) -> int:
            """Watches in the workspace (the marker folder's own watch is not counted)."""
            return max(0, len(self._active_callbacks_by_watch) - 1)

        def _activate(self) -> None:
            with self._lock:
                if self.is_active:
                    return
                if self.hooks.deferred:
                    self._add_callback(self.path)  # the root's own; a scan places the others
                else:
                    self._add_all_callbacks(self.path)
                self._add_marker_watch()
                self._is_active = True

        def _add_marker_watch(self) -> None:
            # Only what makes a marker appear: removing it after its flush, and the files made
            # ahead of it in a folder of their own, make no event to handle while the flush's
            # caller goes on (~0.1 ms of its next steps, the interpreter's while they were handled).
            marker = self.hooks.marker_dir
            mask = Mask(self.event_mask & (InotifyConstants.IN_MOVED_TO | InotifyConstants.IN_CREATE
                                           | InotifyConstants.IN_DELETE_SELF))
            wd = self._inotify_fd.add_callback(marker, mask, self._callback, self._id)
            self._active_callbacks_by_path[marker] = wd
            self._active_callbacks_by_watch[wd] = marker

        def _add_all_callbacks(self, path: bytes) -> None:
            # Replaces watchdog's os.walk: prunes skipped folders (no watch below them) and reads
            # the symlink bit from the directory entry instead of one lstat per folder.
            if path != self.path and self.hooks.skips(path):
                return
            self._add_callback(path)
            if not self.is_recursive or not os.path.isdir(path):
                return
            stack = [path]
            while stack and not self._limit_hit:
                try:
                    with os.scandir(stack.pop()) as entries:
                        for entry in entries:
                            try:
                                if not entry.is_dir(follow_symlinks=self.follow_symlink):
                                    continue
                            except OSError:
                                continue
                            if self.hooks.skips(entry.path):
                                continue
                            self._add_callback(entry.path)
                            stack.append(entry.path)
                except OSError:
                    continue  # vanished or unreadable meanwhile, as os.walk would ignore it

        def _add_callback(self, path: bytes) -> None:
            try:
                wd = self._inotify_fd.add_callback(path, self.event_mask, self._callback, self._id)
            except OSError as exc:
                if path == self.path:
                    raise
                if exc.errno in (errno.ENOSPC, errno.EMFILE):
                    self._limit_hit = True
                    self.hooks.watch_limit_hit(exc, path)
                return  # a descendant vanished or became unreadable during set-up
            self._active_callbacks_by_path[path] = wd
            self._active_callbacks_by_watch[wd] = path

        def _move_watches(self, move_src_path: bytes, move_dst_path: bytes) -> bool:
            moved = super()._move_watches(move_src_path, move_dst_path)
            if moved and self.hooks.skips(move_dst_path):
                # A folder renamed to a skipped name (e.g. into node_modules) gives its watches back.
                prefix = move_dst_path + b"/"
                wds = [
                    wd
                    for path, wd in self._active_callbacks_by_path.items()
                    if path == move_dst_path or path.startswith(prefix)
                ]
                self._remove_callbacks(wds)
            return moved

        def forget_tree(self, path: bytes) -> None:
            """Drop the watches at and below `path`, a folder that left the watched tree."""
            # Watchdog keeps them (its TODO): they would spend the budget and report events of a
            # folder outside the workspace under its old paths. A folder moved back meanwhile keeps them.
            with self._lock:
                if not self.is_active or os.path.lexists(path):
                    return
                prefix = path + b"/"
                wds = []
                for watched, wd in list(self._active_callbacks_by_path.items()):
                    if watched != path and not watched.startswith(prefix):
                        continue
                    now = self._active_callbacks_by_watch.get(wd)
                    if now is not None and now != path and not now.startswith(prefix):
                        # The folder moved to a place watched meanwhile (`mkdir n && mv d n/m`
                        # before `n`'s watch was placed: the move's two halves never paired), and
                        # the walk of that place took the same watch under the new path. Only the
                        # old name goes: removing the watch lost every event below the new path.
                        del self._active_callbacks_by_path[watched]
                    else:
                        wds.append(wd)
                self._remove_callbacks(wds)

        def on_event(self, event: InotifyEvent) -> None:
            # An exception here would kill the inotify thread and silently end all watching.
            try:
                if not self._marker_passed(event):
                    super().on_event(event)
            except Exception:
                with contextlib.suppress(Exception):
                    log.exception("watcher.inotify_failed", event=repr(event))
                self.hooks.bookkeeping_failed()

        def _marker_passed(self, event: InotifyEvent) -> bool:
            """Report a flush marker here, on the inotify thread, when nothing is ahead of it:
            no event queued and none the emitter is still handling, so every event before the
            marker is recorded. Waking the emitter for it was one thread hop of the barrier's
            three (~0.1-0.2 ms of a restore). Only this thread queues events (`on_event`, under
            the group's lock), so none can get ahead of the marker meanwhile."""
            if event.is_directory or not (event.is_moved_to or event.is_create):
                return False
            with self._lock:
                if not self.is_active or self._active_callbacks_by_watch.get(event.wd) != self.hooks.marker_dir:
                    return False
                queue = self._move_event_grouper._queue
                assert isinstance(queue, _PromptDelayedQueue)
                with queue._lock:
                    if not queue.idle():
                        return False
                path = self._build_event_source_path(event)
                if path is None:
                    return False
                self.hooks.dispatch(FileCreatedEvent(os.fsdecode(path)))
            return True

        def on_watch_deleted(self, wd: Any) -> None:
            try:
                super().on_watch_deleted(wd)
            except Exception:
                with contextlib.suppress(Exception):
                    log.exception("watcher.inotify_failed", wd=wd)
                self.hooks.bookkeeping_failed()

        def on_queue_overflow(self) -> None:
            # Watchdog rebuilds the watches but tells nobody: events were lost, so report it, and
            # re-add the marker watch that the rebuild drops.
            self.hooks.overflowed()
            rewatched = False
            with self._lock:
                if not self.is_active:
                    return
                self._move_event_grouper.discard_pending_events()
                # The marker keeps its watch: a flush during the rebuild must still get its event.
                marker_wd = self._active_callbacks_by_path.get(self.hooks.marker_dir)
                self._remove_callbacks([wd for wd in self._active_callbacks_by_watch if wd != marker_wd])
                self._limit_hit = False
                try:
                    self._add_all_callbacks(self.path)
                    if marker_wd is None:
                        self._add_marker_watch()
                    rewatched = not self._limit_hit
                except OSError:
                    with contextlib.suppress(Exception):
                        log.exception("watcher.rewatch_failed", root=os.fsdecode(self.path))
            self.hooks.overflow_handled(rewatched=rewatched)

    class _ShadowEmitter(InotifyEmitter):
        """Builds a `_ShadowWatchGroup`, does not walk moved folders for synthetic events, and hands
        its events to the hooks' handler itself."""

        def __init__(
            self,
            event_queue: EventQueue,
            watch: ObservedWatch,
            *,
            timeout: float,
            event_filter: list[type[FileSystemEvent]] | None = None,
            inotify_fd: InotifyFD,
            hooks: InotifyHooks,
            label: str,
        ) -> None:
            super().__init__(event_queue, watch, timeout=timeout, event_filter=event_filter, inotify_fd=inotify_fd)
            self.name = f"{THREAD_PREFIX}-emitter:{label}"
            self._hooks = hooks
            self.group: _ShadowWatchGroup | None = None

        def on_thread_start(self) -> None:
            self.group = _ShadowWatchGroup(
                self._inotify_fd,
                os.fsencode(self.watch.path),
                is_recursive=self.watch.is_recursive,
                event_mask=self.get_event_mask_from_filter(),
                follow_symlink=self.watch.follow_symlink,
                hooks=self._hooks,
            )
            self._inotify = self.group

        def queue_events(self, timeout: float, *, full_events: bool = False) -> None:
            # watchdog's read, without its error log when the thread is stopping: its stop
            # closes the group (`on_thread_stop`) while this thread may still be in or before a
            # read, which watchdog logged as "queue_events() called when the thread is
            # inactive" at nearly every watcher's stop
            with self._lock:
                group = self._inotify
            if group is None:
                return
            event = group.read_event()
            if event is None:
                return
            with self._lock:
                if self._inotify is not None:
                    self.build_and_queue_event(event, full_events=full_events)

        def queue_event(self, event: FileSystemEvent) -> None:
            # Recorded here, not through the observer's queue and thread: one thread wake-up less
            # for every event and for the flush barrier's marker (~0.1 ms of its ~0.5 ms, more on a
            # busy machine). The order stays the kernel's: one emitter serves the whole group.
            if self._event_filter is None or any(isinstance(event, cls) for cls in self._event_filter):
                self._hooks.dispatch(event)

        def build_and_queue_event(self, event: GroupedInotifyEvent, *, full_events: bool = False) -> None:
            if isinstance(event, _Barrier):  # every event queued before it is recorded
                self._hooks.dispatch(FileCreatedEvent(os.fsdecode(event.marker)))
                return
            # The recorded folder path covers its content; the stock emitter would also walk the
            # moved tree on this thread and queue one synthetic event per entry inside it.
            if not isinstance(event, PathedInotifyEvent):
                move_from, move_to = event
                if move_from.ev.is_directory:
                    src, dest = self._decode_path(move_from.path), self._decode_path(move_to.path)
                    self.queue_event(DirMovedEvent(src, dest))
                    return
            elif event.ev.is_moved_to and event.ev.is_directory:
                self.queue_event(DirCreatedEvent(self._decode_path(event.path)))
                return
            elif event.ev.is_moved_from and event.ev.is_directory and self.group is not None:
                # Unpaired after the pairing delay: moved out of the tree or into a skipped folder.
                self.group.forget_tree(event.path)
            super().build_and_queue_event(event, full_events=full_events)

    class _HoldingInotifyFD(InotifyFD):
        """An inotify instance whose events can be held back while a scan places the watches, some
        of them in a forked child whose watch descriptors this process learns only from its answer
        (an event of an unknown descriptor is dropped). `release()` then handles the held events,
        in the kernel's order, before any later one: the flush barrier's marker stays behind every
        workspace event before it."""

        def __init__(self, *, hold: bool) -> None:
            super().__init__()
            self._hold_lock = threading.Lock()
            self._held: list[InotifyEvent] | None = [] if hold else None
            self._held_overflow = False
            # Open from the moment the reader's poll returns until every event it then read is
            # handled: while closed, no event is between the kernel's queue and the group's.
            # `batch_closed` (on `batch_lock`) is notified as each closes; `batches` counts them.
            self.batch_lock = threading.Lock()
            self.batch_closed = threading.Condition(self.batch_lock)
            self._batch_open = False
            self.batches = 0

        @property
        def fileno(self) -> int:
            return self._inotify_fd

        def _check_inotify_fd(self) -> bool:
            ready = super()._check_inotify_fd()
            with self.batch_lock:
                self._batch_open = True
            return ready

        def run(self) -> None:
            # watchdog's loop, with the batch closed once its events are handled
            while self.should_keep_running():
                try:
                    for event in self.read_events():
                        self.handle_event(event)
                finally:
                    with self.batch_closed:
                        self._batch_open = False
                        self.batches += 1
                        self.batch_closed.notify_all()

        def next_batch_closed(self, deadline: float) -> bool:
            """Wait until the reader closes one more batch (False: `deadline`, a monotonic time,
            came first). Hold `batch_lock`."""
            closed = self.batches
            return self.batch_closed.wait_for(lambda: self.batches != closed, deadline - time.monotonic())

        @property
        def holding(self) -> bool:
            with self._hold_lock:
                return self._held is not None

        def all_handed_over(self) -> bool:
            """True when every event the kernel queued so far has been handled (`handle_event`):
            no batch read and not yet handled, nothing held, nothing left to read. Hold
            `batch_lock`: the reader cannot start a batch meanwhile."""
            if self._batch_open or self.holding:
                return False
            try:
                pending = fcntl.ioctl(self._inotify_fd, termios.FIONREAD, b"\0" * 4)
            except OSError:  # closed meanwhile
                return False
            count: int = struct.unpack("i", pending)[0]
            return count == 0

        def handle_event(self, event: InotifyEvent) -> None:
            with self._hold_lock:
                held = self._held
                if held is not None:
                    if len(held) < HOLD_MAX_EVENTS:
                        held.append(event)
                    else:  # as the kernel does when its queue is full: one overflow, at the end
                        self._held_overflow = True
                    return
            super().handle_event(event)

        def release(self) -> bool:
            """Handle the held events and stop holding; False if handling one raised (events
            may have been lost)."""
            ok = True
            with self._hold_lock:  # the reader waits for the lock, so later events come after
                held, self._held = self._held, None
                if held is None:
                    return True
                if self._held_overflow:
                    held.append(InotifyEvent(WatchDescriptor(-1), Mask(InotifyConstants.IN_Q_OVERFLOW), 0, b""))
                for event in held:
                    try:
                        super().handle_event(event)
                    except Exception:
                        ok = False
                        with contextlib.suppress(Exception):
                            log.exception("watcher.inotify_failed", event=repr(event))
            return ok

    class FolderWatches:
        """The watches of a deferred start, placed by the scan that lists the folders anyway:
        each before its folder is listed, so a change made after the listing has an event. A
        baseline's scan then reads the tree once instead of twice (the watches' own walk was
        ~0.25 s of a 100k-file git repository's first wait).

        A forked child of the scan places the watches of its share on the same inotify instance
        (`add` in a child records them) and answers them (`placed`); this process `adopt`s them.
        `finish()` hands the held events over; `abandon()` (a scan that failed or never ran)
        places every watch the usual way first.
        """

        def __init__(self, fd: _HoldingInotifyFD, group: _ShadowWatchGroup, hooks: InotifyHooks) -> None:
            self._fd = fd
            self._group = group
            self._hooks = hooks
            self._pid = os.getpid()
            self._placed: list[tuple[int, bytes]] = []  # a child's: (descriptor, folder)
            self._refused: tuple[int, bytes] | None = None  # a child's: the limit's errno, where
            self._spent_ns = 0
            self.finished = False

        @property
        def spent_ms(self) -> float:
            """Time spent placing watches, here and in the children whose watches were adopted."""
            return self._spent_ns / 1e6

        def add(self, folder: str) -> None:
            """Watch `folder` (absolute), before it is listed."""
            started = time.perf_counter_ns()
            path = os.fsencode(folder)
            group = self._group
            if os.getpid() == self._pid:
                with group._lock:
                    if not (group._limit_hit or self.finished or path in group._active_callbacks_by_path):
                        group._add_callback(path)
            elif self._refused is None:
                # a forked child: the instance is shared, watchdog's bookkeeping is not
                wd = inotify_add_watch(self._fd.fileno, path, group.event_mask)
                if wd >= 0:
                    self._placed.append((wd, path))
                else:
                    err = ctypes.get_errno()
                    if err in (errno.ENOSPC, errno.EMFILE):
                        self._refused = (err, path)
            self._spent_ns += time.perf_counter_ns() - started

        def drop(self, folder: str) -> None:
            """`folder` turned out to be excluded once listed (a nested repository): unwatched."""
            path = os.fsencode(folder)
            group = self._group
            if os.getpid() == self._pid:
                with group._lock:
                    wd = group._active_callbacks_by_path.get(path)
                    if wd is not None and path != group.path:
                        group._remove_callbacks([wd])
                return
            for i in range(len(self._placed) - 1, -1, -1):
                if self._placed[i][1] == path:
                    inotify_rm_watch(self._fd.fileno, WatchDescriptor(self._placed.pop(i)[0]))
                    break

        def placed(self) -> tuple[list[tuple[int, bytes]], tuple[int, bytes] | None, float]:
            """In a child: the watches it placed, the limit that stopped it (errno, folder) if
            one did, and the time it spent."""
            return self._placed, self._refused, self.spent_ms

        def adopt(self, placed: list[tuple[int, bytes]], refused: tuple[int, bytes] | None,
                  spent_ms: float = 0.0) -> None:
            """Take over the watches a child placed (what its `placed()` answered)."""
            self._spent_ns += round(spent_ms * 1e6)
            group, fd = self._group, self._fd
            with group._lock:
                if self.finished or not group.is_active:
                    return
                with fd._lock:
                    for raw_wd, path in placed:
                        wd = WatchDescriptor(raw_wd)
                        watch = fd._watch_for_wd.get(wd)
                        if watch is None:
                            watch = fd._watch_for_wd[wd] = Watch(wd, group.event_mask, path)
                        watch.callbacks[group._id] = group._callback
                        group._active_callbacks_by_watch[wd] = path
                        group._active_callbacks_by_path[path] = wd
                if refused is not None and not group._limit_hit:
                    group._limit_hit = True
                    err, path = refused
                    self._hooks.watch_limit_hit(OSError(err, os.strerror(err)), path)

        def finish(self) -> None:
            """Every folder is watched: handle the held events, then the later ones as they come."""
            with self._group._lock:
                self.finished = True
            if not self._fd.release():
                self._hooks.bookkeeping_failed()

        def abandon(self) -> None:
            """The scan did not place them all: walk the tree for the watches it missed, then
            `finish`."""
            group = self._group
            with group._lock:
                if group.is_active and not group._limit_hit:
                    try:
                        group._add_all_callbacks(group.path)
                    except OSError:
                        with contextlib.suppress(Exception):
                            log.exception("watcher.rewatch_failed", root=os.fsdecode(group.path))
                        self._hooks.bookkeeping_failed()
            self.finish()

    class ShadowObserver(InotifyObserver):
        """An inotify observer with its own inotify instance and `_ShadowEmitter`s, threads named."""

        def __init__(self, hooks: InotifyHooks, label: str) -> None:
            # InotifyObserver.__init__ hard-codes its emitter class; these are its three steps.
            self._inotify_fd = _HoldingInotifyFD(hold=hooks.deferred)
            self._inotify_fd.name = f"{THREAD_PREFIX}-inotify:{label}"
            self._inotify_fd.start()
            try:
                BaseObserver.__init__(self, _ShadowEmitter, inotify_fd=self._inotify_fd, hooks=hooks, label=label)
            except BaseException:
                self._inotify_fd.stop()
                self._inotify_fd.join()
                raise
            self.name = f"{THREAD_PREFIX}:{label}"

        @property
        def group(self) -> _ShadowWatchGroup | None:
            for emitter in self.emitters:
                if isinstance(emitter, _ShadowEmitter):
                    return emitter.group
            return None

        @property
        def worker_threads(self) -> list[threading.Thread]:
            return [self, self._inotify_fd, *self.emitters]

        def barrier(self, marker: bytes, timeout_s: float) -> bool | None:
            """A flush barrier without a marker file: True if every event the kernel queued
            before this call is recorded already (the usual case between an agent's steps: no
            thread hop, no file); False if `marker` was queued behind the events the emitter has
            still to record, and is reported as a marker event when it is reached. Events still
            in the kernel's queue or being read are waited for, batch by batch (up to
            `BARRIER_BATCHES` of them, within `timeout_s`). None when that did not do, or while a
            scan holds the events back: the caller then writes a marker file, which the kernel
            orders behind every event before it.

            Sound because the kernel queues an event within the system call that made the change,
            and only the reader, whose batch is closed while this holds `batch_lock`, moves events
            from the kernel's queue into the group's (FIONREAD reads 0 when none is left)."""
            fd, group = self._inotify_fd, self.group
            if group is None or not isinstance(fd, _HoldingInotifyFD) or fd.holding:
                return None
            deadline = time.monotonic() + timeout_s
            with fd.batch_closed:
                for _ in range(BARRIER_BATCHES):
                    if fd.all_handed_over():
                        with group._lock:
                            if not group.is_active:
                                return None
                            queue = group._move_event_grouper._queue
                            assert isinstance(queue, _PromptDelayedQueue)
                            return queue.pass_or_enqueue(_Barrier(marker))
                    if not fd.next_batch_closed(deadline):
                        return None
            return None

        def folder_watches(self, hooks: InotifyHooks) -> FolderWatches | None:
            """The placer of a deferred start's watches (None: its group is gone)."""
            group = self.group
            if group is None or not isinstance(self._inotify_fd, _HoldingInotifyFD):
                return None
            return FolderWatches(self._inotify_fd, group, hooks)

