"""observe/inotify.py overrides private internals of watchdog: this file pins them down.

A watchdog upgrade that renames, re-signs or restructures any internal the overrides rely on fails
here, by name, instead of as lost events, a flush barrier that never passes, or a dead inotify thread
at run time. After such a failure: read watchdog's change, adapt the override, then update the table
below and `SUPPORTED_WATCHDOG`.
"""

from __future__ import annotations

import dataclasses
import inspect
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

from shadowpoint.observe import inotify as watcher_inotify

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="inotify exists on Linux only")

# Every watchdog callable an override replaces, extends or calls, with its signature in the
# watchdog release the overrides were written for.
SIGNATURES = {
    "watchdog.utils.delayed_queue:DelayedQueue.__init__": "(self, delay: 'Seconds') -> 'None'",
    "watchdog.utils.delayed_queue:DelayedQueue.get": "(self) -> 'T | None'",
    "watchdog.observers.inotify_move_event_grouper:InotifyMoveEventGrouper.__init__": "(self) -> 'None'",
    "watchdog.observers.inotify_move_event_grouper:InotifyMoveEventGrouper.discard_pending_events":
        "(self) -> 'None'",
    "watchdog.observers.inotify:InotifyWatchGroup._activate": "(self) -> 'None'",
    "watchdog.observers.inotify:InotifyWatchGroup._add_all_callbacks": "(self, path: 'bytes') -> 'None'",
    "watchdog.observers.inotify:InotifyWatchGroup._add_callback": "(self, path: 'bytes') -> 'None'",
    "watchdog.observers.inotify:InotifyWatchGroup._move_watches":
        "(self, move_src_path: 'bytes', move_dst_path: 'bytes') -> 'bool'",
    "watchdog.observers.inotify:InotifyWatchGroup._remove_callbacks":
        "(self, wds: 'list[WatchDescriptor]') -> 'None'",
    "watchdog.observers.inotify:InotifyWatchGroup.on_event": "(self, event: 'InotifyEvent') -> 'None'",
    "watchdog.observers.inotify:InotifyWatchGroup.read_event": "(self) -> 'GroupedInotifyEvent | None'",
    "watchdog.observers.inotify:InotifyWatchGroup.on_watch_deleted": "(self, wd: 'WatchDescriptor') -> 'None'",
    "watchdog.observers.inotify:InotifyWatchGroup.on_queue_overflow": "(self) -> 'None'",
    "watchdog.observers.inotify_c:InotifyFD.add_callback":
        "(self, path: 'bytes', mask: 'Mask', callback: 'WatchCallback', id_: 'CallbackId') -> 'WatchDescriptor'",
    "watchdog.observers.inotify_c:InotifyFD.handle_event": "(self, event: 'InotifyEvent') -> 'None'",
    # the reader's loop (`run`, replaced) polls (`_check_inotify_fd`, extended) right before its one read
    "watchdog.observers.inotify_c:InotifyFD.run": "(self) -> 'None'",
    "watchdog.observers.inotify_c:InotifyFD._check_inotify_fd": "(self) -> 'bool'",
    "watchdog.observers.inotify_c:InotifyFD.read_events":
        "(self, *, event_buffer_size: 'int' = 81920) -> 'list[InotifyEvent]'",
    "watchdog.utils:BaseThread.should_keep_running": "(self) -> 'bool'",
    "watchdog.observers.inotify:InotifyEmitter.__init__":
        "(self, event_queue: 'EventQueue', watch: 'ObservedWatch', *, timeout: 'Seconds' = 1.0, "
        "event_filter: 'list[type[FileSystemEvent]] | None' = None, inotify_fd: 'InotifyFD | None' = None) "
        "-> 'None'",
    "watchdog.observers.inotify:InotifyEmitter.on_thread_start": "(self) -> 'None'",
    "watchdog.observers.inotify:InotifyEmitter.queue_events":
        "(self, timeout: 'Seconds', *, full_events: 'bool' = False) -> 'None'",
    "watchdog.observers.inotify:InotifyEmitter.build_and_queue_event":
        "(self, event: 'GroupedInotifyEvent', *, full_events: 'bool' = False) -> 'None'",
    "watchdog.observers.inotify:InotifyEmitter._decode_path": "(self, path: 'bytes') -> 'bytes | str'",
    "watchdog.observers.inotify:InotifyEmitter.get_event_mask_from_filter": "(self) -> 'Mask'",
    "watchdog.observers.inotify:InotifyObserver.__init__":
        "(self, *, timeout: 'Seconds' = 1.0, generate_full_events: 'bool' = False) -> 'None'",
    "watchdog.observers.inotify:InotifyObserver.on_thread_stop": "(self) -> 'None'",
    "watchdog.observers.api:BaseObserver.__init__":
        "(self, emitter_class: 'type[EventEmitter]', *, timeout: 'Seconds' = 1.0, **kwargs: 'Any') -> 'None'",
}

# The watch group's dataclass fields the overrides read or write (_ShadowWatchGroup adds its own).
WATCH_GROUP_FIELDS = {
    "_inotify_fd", "path", "event_mask", "is_recursive", "follow_symlink", "_move_event_grouper", "_lock",
    "_id", "_is_active", "_active_callbacks_by_watch", "_active_callbacks_by_path",
}


def _resolve(name: str) -> Any:
    module, _, qualname = name.partition(":")
    obj: Any = __import__(module, fromlist=["_"])
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def test_the_installed_watchdog_is_a_release_the_overrides_were_written_for() -> None:
    version = watcher_inotify.watchdog_version()

    assert version in watcher_inotify.SUPPORTED_WATCHDOG, (
        f"watchdog {version} is installed; the inotify overrides were written for "
        f"{sorted(watcher_inotify.SUPPORTED_WATCHDOG)}: review observe/inotify.py against its changes")
    assert watcher_inotify.AVAILABLE, "on Linux with a supported watchdog the overrides must be in use"


def test_the_dependency_pin_admits_only_supported_releases() -> None:
    pyproject = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    pin = next(d for d in pyproject["project"]["dependencies"] if d.startswith("watchdog"))

    # one minor release at a time: the bounds of the pin are the supported (major, minor)
    assert pin == "watchdog>=7.1,<7.2"
    assert watcher_inotify.SUPPORTED_WATCHDOG == {(7, 1)}


@pytest.mark.parametrize("name", sorted(SIGNATURES))
def test_every_overridden_internal_keeps_its_signature(name: str) -> None:
    assert str(inspect.signature(_resolve(name))) == SIGNATURES[name]


def test_the_internal_state_the_overrides_touch_is_there(tmp_path: Path) -> None:
    from watchdog.observers.api import EventQueue, ObservedWatch
    from watchdog.observers.inotify import InotifyEmitter, InotifyObserver, InotifyWatchGroup
    from watchdog.observers.inotify_c import InotifyFD
    from watchdog.observers.inotify_move_event_grouper import InotifyMoveEventGrouper, PathedInotifyEvent
    from watchdog.utils.delayed_queue import DelayedQueue

    assert WATCH_GROUP_FIELDS <= {f.name for f in dataclasses.fields(InotifyWatchGroup)}
    assert PathedInotifyEvent._fields == ("ev", "path")

    queue: DelayedQueue[str] = DelayedQueue(0.5)
    queue.put("x", delay=True)
    assert (queue.delay, queue._closed, len(queue._queue[0])) == (0.5, False, 3)  # (element, put time, delay)
    assert queue._queue[0][0] == "x" and queue._queue[0][2] is True
    assert hasattr(queue._not_empty, "wait")

    grouper = InotifyMoveEventGrouper()
    assert isinstance(grouper._queue, DelayedQueue) and grouper.delay == grouper._queue.delay
    grouper.close()

    fd = InotifyFD()
    try:
        assert isinstance(fd._inotify_fd, int)
        emitter = InotifyEmitter(EventQueue(), ObservedWatch(tmp_path, recursive=True), inotify_fd=fd)
        assert emitter._inotify_fd is fd and emitter._inotify is None  # set by on_thread_start
        assert hasattr(emitter._lock, "acquire")  # what `queue_events` holds to read `_inotify`
    finally:
        fd.close()

    observer = InotifyObserver()  # starts its reader thread in the constructor, as ShadowObserver does
    try:
        assert isinstance(observer._inotify_fd, InotifyFD) and observer._inotify_fd.is_alive()
    finally:
        observer.stop()  # on_thread_stop stops and joins the reader
    assert not observer._inotify_fd.is_alive()
