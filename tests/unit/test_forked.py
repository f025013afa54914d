"""forked.py: a forked child's answer crosses whole, through a pipe widened for megabytes."""

from __future__ import annotations

import fcntl

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
