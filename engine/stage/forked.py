"""Work done by a forked child of this process, answered through a pipe (the second core).

A scan's hot loops (lstat, pattern decisions, the index proof) are Python code that holds the
GIL: two threads take turns and are slower than one. A forked child holds everything this
process held at the fork by copy-on-write, does its share, and writes its answer (bytes) to a
pipe, or to memory both processes share when the caller made some and it fits. Used by a
rescan's stat pass (`stat_pass`) and a git repository's baseline (`scanner`).

The child is careful with what it inherits: only the forking thread exists there, so it
takes no lock another thread may have held (no logging: the modules it runs get a silent
`log`), never returns into the parent's stack, never flushes the parent's buffers (the
sidecar's stdout), and leaves with `os._exit`. Nothing depends on it: a child that cannot be
started, dies, or answers anything but a whole answer gives None, and the caller does the
work itself.
"""

from __future__ import annotations

import contextlib
import fcntl
import gc
import mmap
import os
import select
import signal
import struct
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import structlog

log = structlog.get_logger(__name__)

_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
_LENGTH = struct.Struct("<Q")  # the answer's length, before it: a cut answer is no answer
# the first byte of what crosses the pipe: the answer follows, or its length (it is in the area)
_IN_PIPE, _IN_AREA = b"P", b"A"
_POLL_S = 0.005  # while waiting, how often the caller's `poll` runs
_PIPE_BYTES = 1 << 20  # Linux's default fs.pipe-max-size


def _ignore(*_args: Any, **_kwargs: Any) -> None:
    return None


class _SilentLog:
    """A module's `log` in the child: every call does nothing (a log call would take the
    writer's lock, which another thread of the parent may have held at the fork)."""

    def __getattr__(self, _name: str) -> Callable[..., None]:
        return _ignore


@dataclass(slots=True)
class Forked:
    """A forked child working on its share; `result` waits for its answer."""

    pid: int
    read_fd: int
    # memory both processes share (`start`'s `shared`): the child's answer, when it fits
    area: mmap.mmap | None = None

    @classmethod
    def start(cls, work: Callable[[], bytes], silence: Sequence[ModuleType] = (), shared: int = 0) -> Forked | None:
        """Fork a child that runs `work` and writes what it returns to a pipe; None if it could
        not be started. `silence`: modules whose `log` the child replaces by a silent one.
        `shared`: bytes of memory the two processes share, where an answer that fits is put
        instead (its pages are made as the child writes them): a pipe of 1 MiB took 5-15 ms
        of turns between them for a 4 MB answer."""
        # Blocked on this thread across the fork: a signal that lands in the child before it
        # drops this process's handlers would run them there (and write to their wake-up fd).
        old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, _SIGNALS)
        try:
            area = mmap.mmap(-1, shared) if shared > 0 else None
            read_fd, write_fd = os.pipe()
            _widen(write_fd)
            try:
                pid = os.fork()
            except OSError as exc:
                os.close(read_fd)
                os.close(write_fd)
                if area is not None:
                    area.close()
                log.info("forked.fork_failed", error=str(exc))
                return None
            if pid == 0:
                _child_main(read_fd, write_fd, work, silence, area)  # never returns
            os.close(write_fd)
            return cls(pid, read_fd, area)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)

    def result(self, poll: Callable[[], None] | None = None) -> bytes | None:
        """The child's answer once it is whole; None if it is not. `poll` runs every few
        milliseconds while the child works (a baseline serves early captures there).

        A whole answer is taken as soon as its last byte is read: the child is reaped on a
        thread of its own. The end of a child forked from a big process (the kernel unmapping
        what it shares with the parent) took 15-20 ms after its last byte at 100k files, on
        the caller's path when it waited for the pipe's end."""
        data = bytearray()
        whole = -1  # the answer's length with its own, once read
        try:
            while whole < 0 or len(data) < whole:
                if poll is not None:
                    poll()
                    ready, _, _ = select.select([self.read_fd], [], [], _POLL_S)
                    if not ready:
                        continue
                chunk = os.read(self.read_fd, 1 << 20)
                if not chunk:
                    break
                data += chunk
                if whole < 0 and len(data) >= _LENGTH.size:
                    whole = _LENGTH.size + _LENGTH.unpack_from(data)[0]
        except OSError:
            whole = -1
        finally:
            os.close(self.read_fd)
        area, self.area = self.area, None
        try:
            if whole < 0 or len(data) != whole:
                _, status = os.waitpid(self.pid, 0)
                log.info("forked.child_failed", status=status, answer_bytes=len(data))
                return None
            threading.Thread(target=_reap, args=(self.pid,), name="shadowpoint-reap", daemon=True).start()
            if data[_LENGTH.size:_LENGTH.size + 1] == _IN_AREA and area is not None:
                (size,) = _LENGTH.unpack_from(data, _LENGTH.size + 1)
                return area[:size]
            return bytes(memoryview(data)[_LENGTH.size + 1:])
        finally:
            if area is not None:
                area.close()

    def abandon(self) -> None:
        """Stop waiting: the child is killed and reaped (its caller failed meanwhile)."""
        with contextlib.suppress(OSError):
            os.kill(self.pid, signal.SIGKILL)
        with contextlib.suppress(OSError):
            os.close(self.read_fd)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.pid, 0)
        if self.area is not None:
            self.area.close()
            self.area = None


def _reap(pid: int) -> None:
    """Wait for a child that gave its whole answer (no zombie is left behind)."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)


def _widen(fd: int) -> None:
    """Let the pipe hold `_PIPE_BYTES` (Linux): an answer of megabytes (a split baseline's
    child answers ~5 MB at 100k files) crosses in fewer turns of the two processes than through
    64 KiB."""
    setpipe = getattr(fcntl, "F_SETPIPE_SZ", None)
    if setpipe is not None:
        with contextlib.suppress(OSError):  # above the user's limit (fs.pipe-max-size): as it is
            fcntl.fcntl(fd, setpipe, _PIPE_BYTES)


def _child_main(read_fd: int, write_fd: int, work: Callable[[], bytes], silence: Sequence[ModuleType],
                area: mmap.mmap | None) -> None:
    """The forked child: only this thread exists here."""
    code = 70
    try:
        gc.disable()  # a collection would touch, and so copy, every object of the parent
        signal.set_wakeup_fd(-1)
        for sig in _SIGNALS:
            signal.signal(sig, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _SIGNALS)
        os.close(read_fd)
        for module in silence:
            module.log = _SilentLog()  # type: ignore[attr-defined]
        answer = work()
        if area is not None and len(answer) <= len(area):
            area[:len(answer)] = answer
            message = _IN_AREA + _LENGTH.pack(len(answer))
        else:
            message = _IN_PIPE + answer
        view = memoryview(_LENGTH.pack(len(message)) + message)
        while view:
            view = view[os.write(write_fd, view):]
        code = 0
    finally:
        os._exit(code)
