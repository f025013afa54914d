"""forked.py: a forked child's answer crosses whole, through a pipe widened for megabytes."""

from __future__ import annotations

import fcntl
import os
import select
import threading
import time
from typing import Any

import pytest

from shadowpoint.stage.forked import Forked


def _pipe_limit() -> int:
    with open("/proc/sys/fs/pipe-max-size") as fh:
        return int(fh.read())


def test_an_answer_of_megabytes_crosses_whole_through_a_widened_pipe() -> None:
    answer = bytes(range(256)) * (12 << 12)  # 12 MiB
    child = Forked.start(lambda: answer)
    assert child is not None
    assert fcntl.fcntl(child.read_fd, fcntl.F_GETPIPE_SZ) >= min(1 << 20, _pipe_limit())
    assert child.result() == answer


def test_a_child_that_fails_answers_none() -> None:
    def fail() -> bytes:
        raise RuntimeError("the child's work failed")

    child = Forked.start(fail)
    assert child is not None and child.result() is None


def test_a_whole_answer_is_taken_before_the_pipe_ends() -> None:
    """The answer is taken once its last byte is read, not when the pipe's last writer is gone:
    the end of a child forked from a big process takes the kernel milliseconds. Here a
    grandchild holds the pipe open until the answer was taken; the child is reaped anyway."""
    gate_r, gate_w = os.pipe()

    def work() -> bytes:
        if os.fork() == 0:  # the grandchild: holds the answer's pipe open until the gate opens
            os.read(gate_r, 1)
            os._exit(0)
        return b"the answer"

    child = Forked.start(work)
    assert child is not None
    answers: list[bytes | None] = []
    taker = threading.Thread(target=lambda: answers.append(child.result()))
    taker.start()
    taker.join(60)
    try:
        assert answers == [b"the answer"]
        deadline = time.monotonic() + 60
        while True:  # reaped by its thread: waitpid finds no such child
            try:
                os.waitpid(child.pid, os.WNOHANG)
            except ChildProcessError:
                break
            assert time.monotonic() < deadline, "the child was never reaped"
            time.sleep(0.01)
    finally:
        os.write(gate_w, b"x")
        os.close(gate_r)
        os.close(gate_w)
        taker.join(60)


def test_an_answer_that_fits_crosses_in_shared_memory_and_one_that_does_not_through_the_pipe(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """`shared`: the child puts an answer that fits in memory both processes share, and only
    its length crosses the pipe; a bigger one still crosses whole through the pipe."""
    read: list[int] = []
    real_read = os.read

    def counted(fd: int, n: int) -> bytes:
        chunk = real_read(fd, n)
        read.append(len(chunk))
        return chunk

    monkeypatch.setattr(os, "read", counted)
    small, big = bytes(range(256)) * 4096, bytes(range(256)) * (8 << 12)  # 1 MiB, 8 MiB
    for answer, through_pipe in ((small, False), (big, True), (b"", False)):
        read.clear()
        child = Forked.start(lambda answer=answer: answer, shared=2 << 20)  # type: ignore[misc]
        assert child is not None and child.area is not None
        assert child.result() == answer
        assert child.area is None  # let go
        assert sum(read) > len(answer) if through_pipe else sum(read) < 64  # the answer, or its length

    def fail() -> bytes:
        raise RuntimeError("the child's work failed")

    failing = Forked.start(fail, shared=1 << 20)
    assert failing is not None and failing.result() is None and failing.area is None


def test_an_answer_in_parts_crosses_part_by_part() -> None:
    """A child's work that yields its answer in parts: the caller takes each one as soon as it
    is whole (`part`), the last with `result`. Parts that fit the shared memory cross there,
    a bigger one through the pipe. The child makes its second part only after the caller took
    the first (a seam: the caller writes to a pipe the child waits on)."""
    gate_r, gate_w = os.pipe()
    first, big, last = b"first" * 1000, bytes(range(256)) * (8 << 12), b"the last part"

    def work() -> Any:
        yield first
        if not select.select([gate_r], [], [], 60)[0]:  # the caller took the first part
            raise TimeoutError("the first part was never taken")
        yield big
        yield last

    child = Forked.start(work, shared=1 << 20)
    try:
        assert child is not None
        assert child.part() == first
        os.write(gate_w, b"x")
        assert child.part() == big  # 8 MiB: through the pipe
        assert child.result() == last
        assert child.area is None and child.read_fd == -1
        child.abandon()  # ended already: nothing to kill
    finally:
        os.close(gate_r)
        os.close(gate_w)


def test_a_child_that_fails_after_a_part_answers_none_for_the_rest() -> None:
    def work() -> Any:
        yield b"a first part"
        raise RuntimeError("the child's work failed")

    child = Forked.start(work, shared=1 << 20)
    assert child is not None
    assert child.part() == b"a first part"
    assert child.result() is None and child.area is None
    with pytest.raises(ChildProcessError):
        os.waitpid(child.pid, os.WNOHANG)  # reaped
    early = Forked.start(work)
    assert early is not None
    assert early.part() == b"a first part"
    early.abandon()  # no more of it wanted: killed and reaped
    with pytest.raises(ChildProcessError):
        os.waitpid(early.pid, os.WNOHANG)
