"""`shadowpoint watch` stops on SIGINT/SIGTERM through a handler that takes no lock.

A signal handler runs on the main thread between two bytecodes: while that thread holds a
lock (an Event's, inside its `wait`), or while an earlier signal's handler is half-way. A
handler that called `threading.Event.set` then waited for a lock its own thread held: two
Ctrl-C back to back hung the watch for good. Here the interrupted thread is simulated by a
thread that holds the stop object's own lock, if it has one, and runs the handler.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from shadowpoint.cli import serve


@pytest.fixture
def handlers() -> Iterator[None]:
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)


@pytest.mark.usefixtures("handlers")
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_the_handler_takes_no_lock_its_thread_may_hold(signum: int) -> None:
    stop = serve._stop_on_signals()
    handler: Any = signal.getsignal(signum)
    assert callable(handler)
    held = getattr(stop, "_cond", None)  # a threading.Event's lock, were it one

    def interrupted_thread() -> None:
        with held if held is not None else contextlib.nullcontext():
            handler(signum, None)  # as if the signal landed here
            handler(signum, None)  # and again, during the first one's effects

    t = threading.Thread(target=interrupted_thread, daemon=True)
    t.start()
    t.join(10)
    assert not t.is_alive(), "the signal handler waited for a lock its own thread holds"
    assert stop.is_set() and stop.wait(0.01)
