"""`RoundBus`: in-process publish/subscribe for round-boundary events.

Entry points publish; subscribers run synchronously on the publisher's thread, in the
order they subscribed, and the first subscriber's non-None return value is the
publisher's answer (the engine's checkpoint for `RoundEnded`, say). Observers (logs,
metrics, tests) subscribe after it and return None. The engine subscribes first, in its
constructor, so `publish`'s overloads name the answer of each event type: the engine's.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar, cast, overload

import structlog

from shadowpoint.events import (
    ContextCompacted,
    Event,
    MessageAdded,
    RoundBegan,
    RoundEnded,
    TaskCompleted,
    TaskRetried,
    TaskStarted,
    ToolBegan,
    ToolEnded,
)

if TYPE_CHECKING:
    from shadowpoint.results import Checkpoint, TaskStatus

log = structlog.get_logger(__name__)

E = TypeVar("E", bound=Event)
Handler = Callable[[Event], object]


class RoundBus:
    """Routes each event to the handlers subscribed to its type."""

    def __init__(self) -> None:
        self._handlers: dict[type[object], list[Handler]] = {}
        self._handlers_lock = threading.Lock()

    def subscribe(self, event_type: type[E], handler: Callable[[E], object]) -> Callable[[], None]:
        """Call `handler` for every published `event_type`; returns an unsubscribe function."""
        # stored by type: `publish` hands each handler only events of the type it subscribed to
        stored = cast(Handler, handler)
        with self._handlers_lock:
            self._handlers.setdefault(event_type, []).append(stored)

        def unsubscribe() -> None:
            with self._handlers_lock:
                handlers = self._handlers.get(event_type, [])
                if stored in handlers:
                    handlers.remove(stored)

        return unsubscribe

    @overload
    def publish(self, event: TaskStarted | TaskRetried) -> TaskStatus: ...
    @overload
    def publish(self, event: RoundBegan) -> int: ...
    @overload
    def publish(self, event: RoundEnded) -> Checkpoint | None: ...
    @overload
    def publish(self, event: TaskCompleted | ContextCompacted) -> Checkpoint: ...
    @overload
    def publish(self, event: ToolBegan | ToolEnded | MessageAdded) -> None: ...

    def publish(self, event: Event) -> object:
        """Deliver `event`; returns the first non-None handler result. Handler errors propagate."""
        with self._handlers_lock:
            handlers = list(self._handlers.get(type(event), ()))
        result: object = None
        for handler in handlers:
            value = handler(event)
            if result is None:
                result = value
        log.debug("bus.published", event_type=type(event).__name__, handlers=len(handlers))
        return result
