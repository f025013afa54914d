"""Reaching a workspace's socket sidecar: where its socket lives, a small blocking JSON-RPC
client, and starting the sidecar on demand (`shadowpoint serve --socket …`, detached).

Used by the agent hook adapters (short-lived processes), by the CLI and the MCP server
(to act through a running sidecar instead of beside it). Runs on the caller's thread;
holds no state between calls except the open connection.
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import platformdirs

from shadowpoint.errors import ShadowpointError
from shadowpoint.workspace import workspace_hash

# A Unix socket path must fit in sun_path (108 bytes on Linux, 104 on macOS).
_MAX_SOCKET_PATH = 100
SPAWN_WAIT_S = 20.0
# Started sidecars outlive this process on purpose; holding them here keeps `Popen.__del__`
# from warning that they still run.
_SPAWNED: list[subprocess.Popen[bytes]] = []


class SidecarError(ShadowpointError):
    """The sidecar answered with an error, or could not be reached; `kind` is the protocol's."""

    def __init__(self, message: str, kind: str = "internal") -> None:
        super().__init__(message)
        self.kind = kind


class SidecarUnavailableError(SidecarError):
    """Nothing listens on the socket, or the sidecar went away or could not be started."""

    def __init__(self, message: str) -> None:
        super().__init__(message, "sidecar_unavailable")


def _private_dir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    st = path.stat()
    if st.st_uid != os.getuid():
        raise SidecarUnavailableError(f"{path} belongs to another user; refusing to use it for sockets.")
    if st.st_mode & 0o077:
        os.chmod(path, 0o700)
    return path


def runtime_dir() -> Path:
    """`$XDG_RUNTIME_DIR/shadowpoint` (platformdirs' user runtime dir), or a private temp folder."""
    base = os.environ.get("XDG_RUNTIME_DIR")
    if base:
        candidate = Path(base) / "shadowpoint"
    else:
        with warnings.catch_warnings():
            # platformdirs warns on stderr when it falls back; the fallback below says it quietly
            warnings.simplefilter("ignore")
            candidate = Path(platformdirs.user_runtime_dir("shadowpoint"))
    if candidate.parent.is_dir() and len(str(candidate)) + 20 <= _MAX_SOCKET_PATH:
        return candidate
    # No runtime dir (containers, root without a login session) or too long for a socket path.
    return Path(tempfile.gettempdir()) / f"shadowpoint-{os.getuid()}"


def state_dir() -> Path:
    """Where hooks keep per-session state and their log (platformdirs' user state dir)."""
    return Path(platformdirs.user_state_dir("shadowpoint"))


def socket_path(root: str | os.PathLike[str]) -> Path:
    """The socket of the sidecar serving the workspace `root` (by its workspace hash)."""
    real = Path(os.path.realpath(os.path.expanduser(str(root))))
    return runtime_dir() / f"{workspace_hash(real)}.sock"


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


@contextlib.contextmanager
def _spawn_lock(path: Path) -> Iterator[None]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # the kernel frees it if this process dies
        yield
    finally:
        os.close(fd)


def ensure_sidecar(root: str | os.PathLike[str], *, idle_timeout_s: float | None = None,
                   log_file: Path | None = None, timeout_s: float | None = None) -> SidecarClient:
    """Connect to the sidecar of `root`, starting one (detached) if none runs.

    A file lock next to the socket makes concurrent callers (parallel hooks) start one
    sidecar, not several; the others wait for it and connect.

    Args:
        root: The workspace root.
        idle_timeout_s: Passed to a newly started sidecar (`--idle-timeout`).
        log_file: Where a newly started sidecar writes its stderr.
        timeout_s: Socket timeout of the returned connection (None: block).

    Raises:
        SidecarUnavailableError: the sidecar did not come up within `SPAWN_WAIT_S`.
    """
    path = socket_path(root)
    client = connect_live(root, timeout_s)
    if client is not None:
        return client
    _private_dir(path.parent)
    with _spawn_lock(path.with_suffix(".spawn.lock")):
        client = connect_live(root, timeout_s)
        if client is not None:
            return client
        cmd = [sys.executable, "-m", "shadowpoint", "serve", "--socket", str(path)]
        if idle_timeout_s is not None:
            cmd += ["--idle-timeout", str(idle_timeout_s)]
        err: Any = subprocess.DEVNULL
        if log_file is not None:
            log_file.parent.mkdir(parents=True, exist_ok=True)
            err = open(log_file, "ab")
        try:
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
                                    start_new_session=True, close_fds=True, cwd="/")
            _SPAWNED.append(proc)
        finally:
            if err is not subprocess.DEVNULL:
                err.close()
        deadline = time.monotonic() + SPAWN_WAIT_S
        delay = 0.01
        while time.monotonic() < deadline:
            client = connect_live(root, timeout_s)
            if client is not None:
                return client
            if proc.poll() is not None:
                # It exited: it may have lost a race to a sidecar started by other means.
                client = connect_live(root, timeout_s)
                if client is not None:
                    return client
                raise SidecarUnavailableError(f"The sidecar for {root} exited at start (status {proc.returncode}).")
            time.sleep(delay)
            delay = min(delay * 2, 0.1)
    raise SidecarUnavailableError(f"The sidecar for {root} did not start within {SPAWN_WAIT_S:.0f} s.")
