"""`SocketServer`: the sidecar on a Unix socket, one shared `Host` for every connection.

`shadowpoint serve --socket PATH` (started on demand by the hook command) and
`shadowpoint watch` run it. The accept loop runs on the caller's thread (serve) or on a
thread of its own (watch); each connection gets a reader thread (`shadowpoint-conn:N`);
task requests go to the host's per-task workers. A connection whose first byte starts an
HTTP request is a hook (`hook_endpoint.py`); the workspace's Claude Code http hooks come in
on 127.0.0.1 through `HttpListener` (`shadowpoint-http`), started once the workspace has an
http secret. The socket is created mode 0600; the server exits after an idle period without
connections, on SIGTERM/SIGINT, or on `sidecar/stop`.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import signal
import socket
import threading
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

import structlog

from shadowpoint.errors import SidecarRunningError
from shadowpoint.sidecar.hook_endpoint import HookEndpoint, HttpConfig, load_http_config, looks_like_http, serve_http
from shadowpoint.sidecar.server import Host, Server

if TYPE_CHECKING:
    from shadowpoint.config import Settings
    from shadowpoint.config.plain import PlainSettings

log = structlog.get_logger(__name__)

DEFAULT_IDLE_TIMEOUT_S = 30 * 60.0
_ACCEPT_POLL_S = 0.25


def _is_live(path: Path) -> bool:
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(2.0)
    try:
        probe.connect(str(path))
        return True
    except OSError:
        return False
    finally:
        probe.close()


class HttpListener:
    """Claude Code's http hooks for one workspace, on 127.0.0.1 at the port of its http secret."""

    def __init__(self, root: str, config: HttpConfig, endpoint: HookEndpoint, host: Host) -> None:
        """Bind 127.0.0.1:`config.port`.

        Raises:
            OSError: the port is taken.
        """
        self.root = root
        self.config = config
        self.endpoint = endpoint
        self.host = host
        self._sock = socket.create_server(("127.0.0.1", config.port), backlog=64)
        self._sock.settimeout(_ACCEPT_POLL_S)
        self.thread = threading.Thread(target=self._accept, name="shadowpoint-http", daemon=True)
        self.thread.start()
        log.info("sidecar.http_listening", port=config.port, root=root)

    def _accept(self) -> None:
        while not self.host.stop_requested.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), name="shadowpoint-http-conn", daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        self.host.connection_opened()
        try:
            serve_http(conn, self.endpoint, root=self.root, config=self.config)
        except Exception:
            log.exception("sidecar.http_failed")
        finally:
            self.host.connection_closed()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._sock.close()


class SocketServer:
    """Accepts connections on a Unix socket and serves each on its own thread."""

    def __init__(self, path: Path, host: Host, idle_timeout_s: float | None = DEFAULT_IDLE_TIMEOUT_S,
                 http_root: str | None = None) -> None:
        """Bind `path` (mode 0600, its folder 0700); nothing is accepted before `serve_forever()`.

        Args:
            path: The Unix socket.
            host: The shared engine host.
            idle_timeout_s: Exit after this long without connections (None: never).
            http_root: The workspace whose http hooks to serve on 127.0.0.1 (when it has a secret).

        Raises:
            SidecarRunningError: a live sidecar already listens on `path`.
        """
        self.path = path
        self.host = host
        self.idle_timeout_s = idle_timeout_s
        self.stop = host.stop_requested
        # set by SIGTERM/SIGINT: a plain flag, since an Event's `set` takes a lock, and a signal
        # handler may interrupt this thread while it holds it (or another signal's handler)
        self.signalled = False
        self.hooks = HookEndpoint(host)
        self._http: dict[str, HttpListener] = {}
        self._http_lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._threads_lock = threading.Lock()
        self._conns: set[socket.socket] = set()
        self._sock = self._bind()
        self._inode = os.stat(path).st_ino
        if http_root is not None:
            self.ensure_http(http_root)

    def ensure_http(self, root: str) -> None:
        """Serve `root`'s http hooks if it has an http secret and no listener yet."""
        key = os.path.realpath(root)
        with self._http_lock:
            listener = self._http.get(key)
            if listener is not None and listener.config == load_http_config(root):
                return
            config = load_http_config(root)
            if config is None:
                return
            if listener is not None:
                listener.close()  # `install-hooks` made a new secret or port
            try:
                self._http[key] = HttpListener(root, config, self.hooks, self.host)
            except OSError as exc:
                self._http.pop(key, None)
                log.warning("sidecar.http_unavailable", port=config.port, root=root, reason=str(exc))

    def _bind(self) -> socket.socket:
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        if self.path.exists() or self.path.is_symlink():
            if _is_live(self.path):
                raise SidecarRunningError(f"A shadowpoint sidecar already listens on {self.path}.")
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()  # left by a sidecar that died
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)
        try:
            sock.bind(str(self.path))
        except OSError as exc:
            sock.close()
            if exc.errno == errno.EADDRINUSE:
                raise SidecarRunningError(f"A shadowpoint sidecar already listens on {self.path}.") from exc
            raise
        finally:
            os.umask(old)
        os.chmod(self.path, 0o600)
        sock.listen(64)
        sock.settimeout(_ACCEPT_POLL_S)
        log.info("sidecar.listening", socket=str(self.path), pid=os.getpid())
        return sock

    def serve_forever(self) -> None:
        """Accept until stopped or idle for `idle_timeout_s`, then stop accepting."""
        counter = itertools.count(1)
        try:
            while not self.stop.is_set() and not self.signalled:
                if self.idle_timeout_s is not None and self.host.idle_for_s() >= self.idle_timeout_s:
                    log.info("sidecar.idle_exit", idle_timeout_s=self.idle_timeout_s)
                    break
                try:
                    conn, _ = self._sock.accept()
                except TimeoutError:
                    continue
                except OSError:
                    if self.stop.is_set() or self.signalled:
                        break
                    raise
                conn.settimeout(None)
                self.host.connection_opened()
                t = threading.Thread(target=self._serve_conn, args=(conn,),
                                     name=f"shadowpoint-conn:{next(counter)}", daemon=True)
                with self._threads_lock:
                    self._threads = [x for x in self._threads if x.is_alive()]
                    self._threads.append(t)
                    self._conns.add(conn)
                t.start()
        finally:
            self._close_listener()

    def _serve_conn(self, conn: socket.socket) -> None:
        try:
            if looks_like_http(conn.recv(1, socket.MSG_PEEK)):
                serve_http(conn, self.hooks, root=None, config=None, on_hook=self.ensure_http)
                return
            with conn, conn.makefile("rb") as r, conn.makefile("wb") as w:
                Server(r, w, host=self.host).serve()
        except (BrokenPipeError, ConnectionResetError):
            # a client that does not wait for its answers (a hook) may close first: normal
            log.debug("sidecar.connection_closed_early")
        except Exception:
            log.exception("sidecar.connection_failed")
        finally:
            with self._threads_lock:
                self._conns.discard(conn)
            self.host.connection_closed()

    def _close_listener(self) -> None:
        with self._http_lock:
            for listener in self._http.values():
                listener.close()
        with contextlib.suppress(OSError):
            self._sock.close()
        with contextlib.suppress(OSError):
            if os.stat(self.path).st_ino == self._inode:  # never remove a successor's socket
                self.path.unlink()

    def shutdown(self, join_timeout_s: float = 10.0) -> None:
        """Stop accepting, end open connections, and join their threads. Only their reading
        is shut: a connection's thread sees the end of its requests, while an answer it is still
        writing (`sidecar/stop`'s own, which set `stop`) reaches its client."""
        self.stop.set()
        with self._threads_lock:
            conns = list(self._conns)
            threads = list(self._threads)
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RD)
        for t in threads:
            t.join(join_timeout_s)


def serve_socket(path: str, settings: Settings | PlainSettings | None = None,
                 idle_timeout_s: float | None = DEFAULT_IDLE_TIMEOUT_S, http_root: str | None = None) -> int:
    """Serve the protocol on a Unix socket with one shared engine host; returns the exit status.

    Exits 0 after `idle_timeout_s` without connections or requests, on SIGTERM/SIGINT, or on
    `sidecar/stop`; pending commits are written first.

    Raises:
        SidecarRunningError: another live sidecar already serves `path`.
    """
    host = Host(settings, shared=True)
    server = SocketServer(Path(path), host, idle_timeout_s, http_root)

    def on_signal(signum: int, frame: FrameType | None) -> None:
        server.signalled = True  # the accept loop looks every _ACCEPT_POLL_S; shutdown() sets stop

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
    try:
        server.serve_forever()
    finally:
        server.shutdown()
        host.close()
        log.info("sidecar.exited")
    return 0
