"""Unit tests for `shadowpoint.store.locking`: cross-process exclusion, crashed holders, re-entrancy.

Other processes are real subprocesses holding the lock through `WorkspaceLock` itself.
"""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from shadowpoint.errors import LockTimeoutError
from shadowpoint.store.locking import WorkspaceLock

HOLDER = """
import sys
from pathlib import Path
from shadowpoint.store.locking import WorkspaceLock
lock = WorkspaceLock(Path(sys.argv[1]), timeout_s=30)
with lock.held():
    print("held", flush=True)
    sys.stdin.read()  # hold until stdin closes (or we are killed)
print("released", flush=True)
"""


class Holder:
    """A subprocess that holds the lock until released or killed."""

    def __init__(self, path: Path) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(path)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line.strip() == "held", line

    def release(self) -> None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.close()
        assert self.proc.stdout.readline().strip() == "released"
        assert self.proc.wait() == 0

    def kill(self) -> None:
        os.kill(self.proc.pid, signal.SIGKILL)
        assert self.proc.wait() == -signal.SIGKILL

    def close(self) -> None:
        if self.proc.poll() is None:
            self.kill()
        for f in (self.proc.stdin, self.proc.stdout):
            if f is not None:
                f.close()


@pytest.fixture
def lock_path(tmp_path: Path) -> Path:
    return tmp_path / "checkpoints" / "123" / "shadowpoint.lock"


@pytest.fixture
def holder(lock_path: Path) -> Iterator[Holder]:
    h = Holder(lock_path)
    yield h
    h.close()


def is_free(path: Path) -> bool:
    """Whether another open file description could take the lock now."""
    fd = os.open(path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)
    return True


def test_second_process_times_out(holder: Holder, lock_path: Path) -> None:
    lock = WorkspaceLock(lock_path, timeout_s=0.3)
    with pytest.raises(LockTimeoutError) as info, lock.held():
        pytest.fail("acquired a lock another process holds")
    assert info.value.kind == "lock_timeout"
    assert str(lock_path) in str(info.value)
    assert lock_path.read_text().strip() == str(holder.proc.pid)
    # a failed attempt leaves the lock usable once the holder lets go
    holder.release()
    with lock.held():
        assert lock_path.read_text().strip() == str(os.getpid())


def test_waiter_gets_the_lock_when_holder_releases(holder: Holder, lock_path: Path) -> None:
    lock = WorkspaceLock(lock_path, timeout_s=60)
    acquired = threading.Event()
    done = threading.Event()

    def wait_for_it() -> None:
        with lock.held():
            acquired.set()
        done.set()

    t = threading.Thread(target=wait_for_it, name="shadowpoint-test-waiter")
    t.start()
    try:
        assert not acquired.wait(0.3), "acquired while another process held the lock"
    finally:
        holder.release()
    t.join(60)
    assert acquired.is_set() and done.is_set()


def test_killed_holder_frees_the_lock(holder: Holder, lock_path: Path) -> None:
    assert not is_free(lock_path)
    holder.kill()
    assert is_free(lock_path)
    # the pid of the dead holder is still written in the file: no stale-lock logic needed
    lock = WorkspaceLock(lock_path, timeout_s=5)
    with lock.held():
        assert not is_free(lock_path)
        assert lock_path.read_text().strip() == str(os.getpid())
    assert is_free(lock_path)


def test_reentrant_within_one_thread(lock_path: Path) -> None:
    lock = WorkspaceLock(lock_path, timeout_s=0.3)
    with lock.held():
        assert not is_free(lock_path)
        with lock.held(), lock.held():
            assert not is_free(lock_path)
        assert not is_free(lock_path), "the inner release must not free the outer hold"
    assert is_free(lock_path)


def test_other_thread_waits_then_times_out(lock_path: Path) -> None:
    lock = WorkspaceLock(lock_path, timeout_s=0.2)
    errors: list[BaseException] = []

    def other() -> None:
        try:
            with lock.held():
                errors.append(AssertionError("the other thread got in"))
        except LockTimeoutError as exc:
            errors.append(exc)

    with lock.held():
        t = threading.Thread(target=other, name="shadowpoint-test-other")
        t.start()
        t.join(30)
    assert len(errors) == 1 and isinstance(errors[0], LockTimeoutError)


def test_two_lock_objects_in_one_process_exclude_each_other(lock_path: Path) -> None:
    a = WorkspaceLock(lock_path, timeout_s=0.2)
    b = WorkspaceLock(lock_path, timeout_s=0.2)
    with a.held(), pytest.raises(LockTimeoutError), b.held():
        pytest.fail("two engines of one process held the lock together")
    with b.held():
        assert not is_free(lock_path)


def test_exception_inside_releases(lock_path: Path) -> None:
    lock = WorkspaceLock(lock_path, timeout_s=0.2)
    with pytest.raises(RuntimeError), lock.held():
        raise RuntimeError("boom")
    assert is_free(lock_path)
    with lock.held():
        pass
    # no file descriptor is leaked per acquisition
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(20):
        with lock.held():
            pass
    assert len(os.listdir("/proc/self/fd")) == before


def test_a_hold_that_makes_no_folder_finds_a_deleted_one_gone(tmp_path: Path) -> None:
    """A background job's hold (`make_folder=False`) never makes the checkpoints folder again
    after the last task's deletion removed it; a round's hold makes it as always."""
    path = tmp_path / "checkpoints" / "0123" / "shadowpoint.lock"
    lock = WorkspaceLock(path, timeout_s=1)
    with pytest.raises(FileNotFoundError):
        with lock.held(make_folder=False):
            pass
    assert not (tmp_path / "checkpoints").exists()
    with lock.held():
        assert path.is_file()
    with lock.held(make_folder=False):  # there now: held as any other
        pass
