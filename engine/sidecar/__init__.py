"""The sidecar: `shadowpoint serve`, JSON-RPC 2.0 over stdio or a Unix socket (PROTOCOL.md)."""

from __future__ import annotations

from shadowpoint.sidecar.server import Server, serve_socket, serve_stdio

__all__ = ["Server", "serve_socket", "serve_stdio"]
