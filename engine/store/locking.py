"""`WorkspaceLock`: the cross-process lock that serialises commits and restores of one
shadow repo. An OS advisory lock (`flock`): the kernel frees it when its holder dies, so
there is no stale-lock timer. Taken by the engine around every repo write; re-entrant
within one thread, with bounded retries (backoff) up to `lock_timeout`.

Also the other flocks (`flocked`, `is_flocked`, `lock_holder`): a garbage collection's busy
file and `doctor`'s look at held locks. The lean hook command (hookrun) keeps its own spawn
lock: it imports no shadowpoint module.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import structlog

from shadowpoint.errors import LockTimeoutError

log = structlog.get_logger(__name__)


class WorkspaceLock:
    """A file lock at `path`, shared by every process working on one workspace."""

    def __init__(self, path: Path, timeout_s: float = 30.0) -> None:
        self.path = path
        self.timeout_s = timeout_s
        self._thread_lock = threading.RLock()
        self._depth = 0
        self._fd: int | None = None

    @contextlib.contextmanager
    def held(self, timeout_s: float | None = None, *, make_folder: bool = True) -> Iterator[None]:
        """Hold the lock (thread lock first, then the file lock); `timeout_s`: wait this long
        instead of the lock's own timeout (a background job that tries again later).
        `make_folder`: make the lock file's folder if it is missing (a background job's hold
        does not: a folder deleted meanwhile stays deleted).

        Raises:
            LockTimeoutError: another thread or process held it for longer than the timeout.
            FileNotFoundError: `make_folder` is false and the lock file's folder is gone.
        """
        timeout = self.timeout_s if timeout_s is None else timeout_s
        if not self._thread_lock.acquire(timeout=timeout):
            raise LockTimeoutError(f"Timed out waiting for the checkpoint lock {self.path}.")
        try:
            if self._depth == 0:
                self._acquire_file(timeout, make_folder)
            self._depth += 1
            try:
                yield
            finally:
                self._depth -= 1
                if self._depth == 0:
                    self._release_file()
        finally:
            self._thread_lock.release()

    def _acquire_file(self, timeout_s: float, make_folder: bool) -> None:
        # the folder is made only when the open finds it missing: made every time (a mkdir
        # refused, then a stat), it cost every round two system calls and an exception
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except FileNotFoundError:
            if not make_folder:
                raise
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        deadline = time.monotonic() + timeout_s
        delay = 0.005
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    os.close(fd)
                    raise LockTimeoutError(
                        f"Another shadowpoint process has held {self.path} for over {timeout_s:.0f} s."
                    ) from None
                time.sleep(delay)
                delay = min(delay * 2, 0.2)
        # the holder's pid, for people and `doctor`; rewritten only when another process held
        # it last (a truncate and write cost a metadata update on every round)
        mine = f"{os.getpid()}\n".encode()
        with contextlib.suppress(OSError):
            if os.pread(fd, 32, 0) != mine:
                os.ftruncate(fd, 0)
                os.pwrite(fd, mine, 0)
        self._fd = fd

    def _release_file(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


class SharedUse:
    """A shared flock held on `path` for as long as this process uses what the path guards:
    every engine holds one on its docs root's `checkpoints.users` (storage.USERS_FILE), so
    that deleting the last task can tell whether another process still works in the
    checkpoints folder. Without it, a sidecar deleting its last task removed the shared shadow
    repository, and the workspace lock file with it, under three other sidecars still
    building their baselines (tests/faults/test_concurrency.py)."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._fd: int | None = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        fcntl.flock(self._fd, fcntl.LOCK_SH)

    @contextlib.contextmanager
    def sole(self) -> Iterator[bool]:
        """Inside, True when no other process holds a share (one that starts meanwhile waits)."""
        assert self._fd is not None, "closed"
        try:
            yield _try_exclusive(self._fd)
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_SH)  # also after a failed conversion, which may drop it

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


@contextlib.contextmanager
def sole_user(path: Path) -> Iterator[bool]:
    """For a process that holds no share of `path` (a CLI command without an engine): inside,
    True when no process holds one; one that starts meanwhile waits."""
    if not path.parent.is_dir():
        yield True
        return
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        yield _try_exclusive(fd)
    finally:
        os.close(fd)


def _try_exclusive(fd: int) -> bool:
    """Take (or convert to) an exclusive flock on `fd` if nobody else holds one; whether it did."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


@contextlib.contextmanager
def flocked(path: Path) -> Iterator[None]:
    """Hold an exclusive flock on `path` (created mode 0600), waiting while another holds it,
    until the block ends; the kernel frees it if this process dies first."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def is_flocked(path: Path) -> bool:
    """True while some process holds a flock on `path`; False when it is free or missing.

    A lock that cannot be probed (an error other than "held") counts as held: callers use
    this to decide whether removing something is safe.
    """
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)
    return False


def lock_holder(path: Path) -> str | None:
    """The pid written in a held lock file (`?` when unreadable), None when it is free or
    missing. Probes with a shared lock, so two probes never see each other."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            with contextlib.suppress(OSError):
                return os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            return "?"
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)
