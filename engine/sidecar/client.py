"""Reaching a workspace's socket sidecar: where its socket lives and a small blocking JSON-RPC
client.

Used by the CLI and the MCP server (to act through a running sidecar instead of beside it);
the hooks start sidecars with the lean `shadowpoint.hookrun`, which also says where sockets
live. Runs on the caller's thread; holds no state between calls except the open connection.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import socket
from pathlib import Path
from typing import Any

from shadowpoint import hookrun
from shadowpoint.errors import SidecarError, SidecarUnavailableError


def runtime_dir() -> Path:
    """Where sockets live (`shadowpoint.hookrun.runtime_dir`: the lean hook command agrees)."""
    return Path(hookrun.runtime_dir())


def state_dir() -> Path:
    """Where hooks keep per-session state, their log and the http secrets (the user state dir)."""
    return Path(hookrun.state_dir())


def socket_path(root: str | os.PathLike[str]) -> Path:
    """The socket of the sidecar serving the workspace `root` (by its workspace hash)."""
    return Path(hookrun.socket_path(os.fspath(root)))


class SidecarClient:
    """One connection to a socket sidecar; requests may be pipelined, answers matched by id."""

    def __init__(self, path: Path, timeout_s: float | None = None) -> None:
        """Connect to `path`.

        Raises:
            SidecarUnavailableError: nothing listens there.
        """
        self.path = path
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.settimeout(5.0)
        try:
            self._sock.connect(str(path))
        except OSError as exc:
            self._sock.close()
            raise SidecarUnavailableError(f"No sidecar listens on {path} ({exc.strerror or exc}).") from None
        self._sock.settimeout(timeout_s)
        self._reader = self._sock.makefile("rb")
        self._ids = itertools.count(1)
        self._answers: dict[int, dict[str, Any]] = {}
        self.notifications: list[dict[str, Any]] = []

    def send(self, method: str, params: dict[str, Any] | None = None) -> int:
        """Send a request without waiting; returns its id (for `wait`)."""
        msg_id = next(self._ids)
        msg = {"jsonrpc": "2.0", "id": msg_id, "method": method, "params": params or {}}
        self._sock.sendall(json.dumps(msg, ensure_ascii=True, separators=(",", ":")).encode() + b"\n")
        return msg_id

    def wait(self, msg_id: int) -> Any:
        """The result of request `msg_id`.

        Raises:
            SidecarError: the sidecar answered with an error (its `data.kind`), or closed.
        """
        while msg_id not in self._answers:
            line = self._reader.readline()
            if not line:
                raise SidecarUnavailableError(f"The sidecar on {self.path} closed the connection.")
            msg = json.loads(line.decode("utf-8", "surrogateescape"))
            if "id" in msg and msg["id"] is not None and "method" not in msg:
                self._answers[int(msg["id"])] = msg
            else:
                self.notifications.append(msg)
        msg = self._answers.pop(msg_id)
        if "error" in msg:
            err = msg["error"]
            kind = (err.get("data") or {}).get("kind") or "internal"
            raise SidecarError(str(err.get("message", "sidecar error")), kind)
        return msg.get("result")

    def request(self, method: str, params: dict[str, Any] | None = None) -> Any:
        """Send a request and wait for its result."""
        return self.wait(self.send(method, params))

    def close(self) -> None:
        """Close the connection (requests not yet answered still run in the sidecar)."""
        with contextlib.suppress(OSError):
            self._reader.close()
        with contextlib.suppress(OSError):
            self._sock.close()

    def __enter__(self) -> SidecarClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def connect_live(root: str | os.PathLike[str], timeout_s: float | None = None) -> SidecarClient | None:
    """A connection to the sidecar already serving `root`, or None when none runs."""
    path = socket_path(root)
    if not path.exists():
        return None
    try:
        return SidecarClient(path, timeout_s)
    except SidecarUnavailableError:
        return None
