"""The sidecar: `shadowpoint serve`, JSON-RPC 2.0 over stdio or a Unix socket (PROTOCOL.md).

Names are imported lazily: hook processes import `shadowpoint.sidecar.client` on every tool
call and must not pay for the engine.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {"Host": "server", "Server": "server", "serve_stdio": "server", "SocketServer": "socket_server",
         "serve_socket": "socket_server"}

__all__ = ["Host", "Server", "SocketServer", "serve_socket", "serve_stdio"]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"shadowpoint.sidecar.{module}"), name)
