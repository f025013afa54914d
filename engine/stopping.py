"""Stopping a loop from a signal handler (`shadowpoint watch`): `StopFlag`, `SignalStop`.

Light on purpose: the CLI imports it before any engine module."""

from __future__ import annotations

import time
from typing import Protocol


class StopFlag(Protocol):
    """What a loop polls to stop: a `threading.Event`, or a `SignalStop`."""

    def is_set(self) -> bool: ...

    def wait(self, timeout: float) -> bool: ...


class SignalStop:
    """A stop flag that SIGINT and SIGTERM set. Their handler runs on the main thread between
    two bytecodes, possibly while that thread holds a lock (a `threading.Event`'s, inside its
    `wait`) or while an earlier signal's handler does: an `Event.set` there deadlocks (two
    Ctrl-C in a row, or one forwarded by a wrapper, hung `shadowpoint watch` for good). So
    `set` takes no lock, and `wait` sleeps in steps and looks at the flag."""

    def __init__(self) -> None:
        self._set = False

    def set(self) -> None:
        self._set = True

    def is_set(self) -> bool:
        return self._set

    def wait(self, timeout: float) -> bool:
        if not self._set:
            time.sleep(timeout)
        return self._set
