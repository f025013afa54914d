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
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import structlog

log = structlog.get_logger(__name__)

_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
_LENGTH = struct.Struct("<Q")  # a message's length, before it: a cut message is none
# the first byte of a message: the part follows, or where it is in the area (`_PLACE`)
_IN_PIPE, _IN_AREA = b"P", b"A"
_PLACE = struct.Struct("<QQ")  # a part's offset and length in the area
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
    """A forked child working on its share; `result` waits for its answer (`part` for each
    part before the last, when its work gives its answer in parts)."""

    pid: int
    read_fd: int
    # memory both processes share (`start`'s `shared`): the child's answer, when it fits
    area: mmap.mmap | None = None
    _read: bytearray = field(default_factory=bytearray)  # read from the pipe, not yet taken

    @classmethod
    def start(cls, work: Callable[[], bytes | Iterable[bytes]], silence: Sequence[ModuleType] = (),
              shared: int = 0) -> Forked | None:
        """Fork a child that runs `work` and writes what it returns to a pipe; None if it could
        not be started. `work` may give its answer in parts (an iterable of bytes: a generator
        in the child), each written as soon as it is made: the caller takes them with `part`,
        the last with `result`. `silence`: modules whose `log` the child replaces by a silent
        one. `shared`: bytes of memory the two processes share, where each part that fits is
        put instead (its pages are made as the child writes them): a pipe of 1 MiB took 5-15 ms
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

    def part(self, poll: Callable[[], None] | None = None) -> bytes | None:
        """The next part of the child's answer once it is whole (not the last: `result`); None
        if the child ended without it (it is reaped then, and `result` is None too). `poll`:
        as `result`'s."""
        message = self._message(poll)
        if message is None:
            self._end(whole=False)
        return message

    def result(self, poll: Callable[[], None] | None = None) -> bytes | None:
        """The child's answer (the last part of it) once it is whole; None if it is not. `poll`
        runs every few milliseconds while the child works (a baseline serves early captures
        there).

        A whole answer is taken as soon as its last byte is read: the child is reaped on a
        thread of its own. The end of a child forked from a big process (the kernel unmapping
        what it shares with the parent) took 15-20 ms after its last byte at 100k files, on
        the caller's path when it waited for the pipe's end."""
        if self.read_fd < 0:
            return None  # ended at a `part`
        message = self._message(poll)
        self._end(whole=message is not None)
        return message

    def _message(self, poll: Callable[[], None] | None) -> bytes | None:
        """The child's next message once whole (its part: read from the pipe, or from the
        shared memory where the message places it); None if the pipe ends first."""
        data = self._read
        try:
            while True:
                if len(data) >= _LENGTH.size:
                    whole = _LENGTH.size + _LENGTH.unpack_from(data)[0]
                    if len(data) >= whole:
                        with memoryview(data) as view:  # one copy of a part of megabytes, not two
                            message = bytes(view[_LENGTH.size:whole])
                        del data[:whole]
                        return self._placed(message)
                if poll is not None:
                    poll()
                    ready, _, _ = select.select([self.read_fd], [], [], _POLL_S)
                    if not ready:
                        continue
                chunk = os.read(self.read_fd, 1 << 20)
                if not chunk:
                    return None
                data += chunk
        except OSError:
            return None

    def _placed(self, message: bytes) -> bytes | None:
        if message[:1] == _IN_PIPE:
            return message[1:]
        if message[:1] == _IN_AREA and self.area is not None:
            at, size = _PLACE.unpack_from(message, 1)
            return self.area[at:at + size]
        return None

    def _end(self, whole: bool) -> None:
        """Stop reading: the child is reaped (on a thread when its answer was whole)."""
        os.close(self.read_fd)
        self.read_fd = -1
        area, self.area = self.area, None
        if area is not None:
            area.close()
        if whole:
            threading.Thread(target=_reap, args=(self.pid,), name="shadowpoint-reap", daemon=True).start()
            return
        _, status = os.waitpid(self.pid, 0)
        log.info("forked.child_failed", status=status, answer_bytes=len(self._read))

    def abandon(self) -> None:
        """Stop waiting: the child is killed and reaped (its caller failed meanwhile, or wants
        no more of its answer); nothing when it was reaped already (its answer ended)."""
        if self.read_fd < 0:
            return
        with contextlib.suppress(OSError):
            os.kill(self.pid, signal.SIGKILL)
        with contextlib.suppress(OSError):
            os.close(self.read_fd)
        self.read_fd = -1
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


def _child_main(read_fd: int, write_fd: int, work: Callable[[], bytes | Iterable[bytes]], silence: Sequence[ModuleType],
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
        placed = 0  # how much of the shared memory the parts took
        for part in (answer,) if isinstance(answer, bytes) else answer:
            if area is not None and placed + len(part) <= len(area):
                area[placed:placed + len(part)] = part
                message = _IN_AREA + _PLACE.pack(placed, len(part))
                placed += len(part)
            else:
                message = _IN_PIPE + part
            view = memoryview(_LENGTH.pack(len(message)) + message)
            while view:
                view = view[os.write(write_fd, view):]
        code = 0
    finally:
        os._exit(code)
