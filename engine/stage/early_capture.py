"""`EarlyCapture`: the paths a baseline still being built captures before anything else (SPEC §3).

An edit tool that reports its paths waits only until the baseline holds their current content,
not for the whole scan: its `tool/begin` (engine thread) files a `CaptureRequest`; the scanner,
building the baseline on its own thread, takes the request between two files, records those
paths' content at once and pins them, so that the rest of the scan never records a later content
of them (the tool may be writing them by then). One `EarlyCapture` per root and baseline build.

`ScanHold` is a test seam: it holds the scan after a number of files, still serving requests,
until the test releases it, so that tests need no race with the scan's speed.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from shadowpoint.workspace import RepoPath


@dataclass(eq=False, slots=True)
class CaptureRequest:
    """Paths an edit tool is about to change; `done` is set once the baseline holds them."""

    paths: tuple[RepoPath, ...]
    done: threading.Event = field(default_factory=threading.Event)
    # set by the scanner: a path is a folder (the tool may change anything in it), so the
    # tool waits for the whole baseline after all
    needs_whole_scan: bool = False


class ScanHold:
    """Test seam: holds a baseline's scan after `after_files` files until `release()`."""

    def __init__(self, after_files: int) -> None:
        self.after_files = after_files
        self.reached = threading.Event()  # set when the scan stops at the hold
        self._cond = threading.Condition(threading.Lock())
        self._released = False

    def release(self) -> None:
        with self._cond:
            self._released = True
            self._cond.notify_all()

    def wake(self) -> None:
        """A request arrived: a held scan serves it."""
        with self._cond:
            self._cond.notify_all()

    def wait(self, has_work: Callable[[], bool]) -> bool:
        """Block until released (False) or `has_work()` (True)."""
        with self._cond:
            self._cond.wait_for(lambda: self._released or has_work())
            return not self._released


class EarlyCapture:
    """Requests for one root's baseline scan; `request` on any thread, the rest on the scanner's."""

    def __init__(self, hold: ScanHold | None = None, wake: threading.Event | None = None) -> None:
        """`hold`: the test seam; `wake`: set on every request (a thread serving several roots'
        requests before their scans waits on it)."""
        self._lock = threading.Lock()  # guards _pending and _finished
        self._pending: list[CaptureRequest] = []
        self._finished = False
        # read without the lock in the scan's hot loop (a plain attribute read is atomic)
        self.has_pending = False
        # paths captured early: the scan keeps their first content (scanner thread only)
        self.pinned: set[RepoPath] = set()
        self._hold = hold
        self._wake = wake

    def request(self, paths: Iterable[RepoPath]) -> CaptureRequest:
        """Ask the scan to capture `paths` first; answered at once when the scan is over."""
        req = CaptureRequest(tuple(paths))
        with self._lock:
            if self._finished:
                req.done.set()
                return req
            self._pending.append(req)
            self.has_pending = True
        if self._wake is not None:
            self._wake.set()
        if self._hold is not None:
            self._hold.wake()
        return req

    def take(self) -> list[CaptureRequest]:
        """The requests filed so far (the scanner answers each by setting its `done`)."""
        with self._lock:
            taken, self._pending = self._pending, []
            self.has_pending = False
        return taken

    def finish(self) -> None:
        """The scan is over (or failed): answer every request, now and later."""
        with self._lock:
            self._finished = True
            taken, self._pending = self._pending, []
            self.has_pending = False
        for req in taken:
            req.done.set()

    def holds_within(self, files_done: int, count: int) -> bool:
        """Whether the test seam holds the scan within its next `count` files (the scan then
        takes them one by one, as `hold_point` expects)."""
        return self._hold is not None and files_done + count >= self._hold.after_files

    def hold_point(self, files_done: int, serve: Callable[[], None]) -> None:
        """The test seam's stop: hold here once `files_done` reaches the hold, serving requests."""
        hold = self._hold
        if hold is None or files_done < hold.after_files:
            return
        hold.reached.set()
        while hold.wait(lambda: self.has_pending):
            serve()
        self._hold = None
