"""`RoundBus`: in-process publish/subscribe for round-boundary events.

Entry points publish; subscribers run synchronously on the publisher's thread, in the
order they subscribed, and the first subscriber's non-None return value is the
publisher's answer (the engine's checkpoint for `RoundEnded`, say). Observers (logs,
metrics, tests) subscribe after it and return None.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

import structlog

from shadowpoint.events import Event

log = structlog.get_logger(__name__)

E = TypeVar("E", bound=Event)
Handler = Callable[[Any], Any]


class RoundBus:
    """Routes each event to the handlers subscribed to its type."""

    def __init__(self) -> None:
        self._handlers: dict[type[Any], list[Handler]] = {}
        self._handlers_lock = threading.Lock()

    def subscribe(self, event_type: type[E], handler: Callable[[E], Any]) -> Callable[[], None]:
        """Call `handler` for every published `event_type`; returns an unsubscribe function."""
        with self._handlers_lock:
            self._handlers.setdefault(event_type, []).append(handler)

        def unsubscribe() -> None:
            with self._handlers_lock:
                handlers = self._handlers.get(event_type, [])
                if handler in handlers:
                    handlers.remove(handler)

        return unsubscribe

    def publish(self, event: Event) -> Any:
        """Deliver `event`; returns the first non-None handler result. Handler errors propagate."""
        with self._handlers_lock:
            handlers = list(self._handlers.get(type(event), ()))
        result: Any = None
        for handler in handlers:
            value = handler(event)
            if result is None:
                result = value
        log.debug("bus.published", event_type=type(event).__name__, handlers=len(handlers))
        return result
