"""The sidecar's hook endpoint: agent hook payloads over HTTP, turned into protocol calls in-process.

Two doors lead here, both served by the socket sidecar (`socket_server.py`):
- the workspace's Unix socket, where the lean hook command (`shadowpoint.hookrun`) sends
  `POST /hook/AGENT` (the socket is the user's own, mode 0600 in a 0700 folder: no secret);
- `http://127.0.0.1:PORT/hook/claude`, where Claude Code's `type: "http"` hooks post. The port
  and a per-workspace secret live in a file only the user can read (`http_config`), and in the
  user-local `.claude/settings.local.json` that `install-hooks claude` writes. A request without
  the secret, with a `Host` other than 127.0.0.1/localhost on that port, or with any `Origin`
  (a web page) gets 403 and changes nothing.

`HookEndpoint.handle` runs the agent's adapter on the payload and dispatches the calls on one
in-process protocol connection per root, exactly as a socket client's requests (task requests
go to the task's worker, in arrival order). The answer goes back once the calls are queued, or,
before a tool that may modify the workspace, once its barrier passed. A payload that is not
JSON, lacks fields or names paths outside the workspace is logged and ignored: the agent always
gets 200. Runs on the connection threads of the socket server.
"""

from __future__ import annotations

import contextlib
import hmac
import itertools
import json
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import structlog

from shadowpoint import hookrun
from shadowpoint.adapters import AGENTS
from shadowpoint.adapters.base import Call, HookPlan
from shadowpoint.sidecar.server import Host, Server
from shadowpoint.store.atomic import write_atomic

log = structlog.get_logger(__name__)

MAX_HEADER_BYTES = 16 << 10
MAX_BODY_BYTES = 64 << 20  # a Write tool's payload carries the whole file
KEEPALIVE_IDLE_S = 30.0
BARRIER_WAIT_S = hookrun.ANSWER_TIMEOUT_S


# ---------------------------------------------------------------------------- the secret


@dataclass(frozen=True, slots=True)
class HttpConfig:
    """Where a workspace's http endpoint listens and the secret a request must carry."""

    port: int
    secret: str

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook/claude"


def http_config_path(root: str) -> Path:
    """The file holding a workspace's port and secret (mode 0600, in a 0700 folder)."""
    real = os.path.realpath(os.path.expanduser(root))
    return Path(hookrun.state_dir()) / "http" / f"{hookrun.workspace_hash(real)}.json"


def load_http_config(root: str) -> HttpConfig | None:
    """The workspace's http endpoint, or None when `install-hooks claude` never made one."""
    try:
        data = json.loads(http_config_path(root).read_text(encoding="utf-8"))
        return HttpConfig(int(data["port"]), str(data["secret"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def ensure_http_config(root: str) -> HttpConfig:
    """The workspace's http endpoint, made (a free port, a new secret) when it has none."""
    existing = load_http_config(root)
    if existing is not None:
        return existing
    config = HttpConfig(_free_port(), secrets.token_urlsafe(32))
    path = http_config_path(root)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(path.parent, 0o700)
    write_atomic(path, json.dumps({"port": config.port, "secret": config.secret, "root": root}).encode(), perm=0o600)
    return config


# ---------------------------------------------------------------------------- HTTP


@dataclass(frozen=True, slots=True)
class HttpRequest:
    """One parsed request: header names lower-cased."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes


class BadRequestError(Exception):
    """The bytes are not an HTTP/1.1 request we accept (answered 400 or 413)."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status


def looks_like_http(first: bytes) -> bool:
    """True when a connection's first byte starts an HTTP request (JSON-RPC starts with `{`)."""
    return first[:1].isupper()


def read_request(reader: BinaryIO) -> HttpRequest | None:
    """The next request on a connection; None at a clean end of input.

    Raises:
        BadRequestError: a malformed or oversized request.
    """
    line = reader.readline(MAX_HEADER_BYTES)
    while line in (b"\r\n", b"\n"):
        line = reader.readline(MAX_HEADER_BYTES)
    if not line:
        return None
    parts = line.decode("latin-1").split()
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise BadRequestError(400, "not an HTTP/1.x request line")
    headers: dict[str, str] = {}
    total = len(line)
    while True:
        raw = reader.readline(MAX_HEADER_BYTES)
        total += len(raw)
        if total > MAX_HEADER_BYTES:
            raise BadRequestError(431, "headers too large")
        if raw in (b"\r\n", b"\n", b""):
            break
        name, sep, value = raw.decode("latin-1").partition(":")
        if not sep:
            raise BadRequestError(400, "malformed header line")
        headers[name.strip().lower()] = value.strip()
    if "transfer-encoding" in headers:
        raise BadRequestError(400, "chunked bodies are not accepted")
    try:
        length = int(headers.get("content-length", "0"))
    except ValueError:
        raise BadRequestError(400, "bad Content-Length") from None
    if length < 0 or length > MAX_BODY_BYTES:
        raise BadRequestError(413, "body too large")
    body = reader.read(length) if length else b""
    if len(body) != length:
        return None  # the client went away mid-body
    return HttpRequest(parts[0], parts[1], headers, body)


_REASONS = {200: "OK", 400: "Bad Request", 403: "Forbidden", 404: "Not Found", 405: "Method Not Allowed",
            413: "Payload Too Large", 431: "Request Header Fields Too Large", 500: "Internal Server Error"}


def write_response(writer: BinaryIO, status: int, *, close: bool, note: str | None = None) -> None:
    """An empty-bodied answer (an empty body is a hook's "nothing to say"); `note` in a header."""
    extra = ""
    if note:
        text = note.encode("ascii", "backslashreplace").decode("ascii").replace("\r", " ").replace("\n", " ")
        extra = f"{hookrun.NOTE_HEADER}: {text[:2000]}\r\n"
    head = (f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}\r\nContent-Length: 0\r\n{extra}"
            f"Connection: {'close' if close else 'keep-alive'}\r\n\r\n")
    writer.write(head.encode("ascii"))
    writer.flush()


# ---------------------------------------------------------------------------- dispatch


class _NullWriter:
    """Where the in-process connection's notifications go (a hook has nobody listening)."""

    def write(self, data: bytes) -> int:
        return len(data)

    def flush(self) -> None:
        return None


class _HookConnection(Server):
    """An in-process protocol connection: requests dispatched like a client's, answers to futures.

    Its requests always go to the task's worker: a hook's calls are queued under the
    endpoint's lock, and most are not waited for (run on the hook's thread, a round's end
    would hold the hook's answer and every other hook's calls)."""

    runs_inline = False

    def __init__(self, host: Host) -> None:
        super().__init__(_NullWriter(), _NullWriter(), host=host)  # type: ignore[arg-type]
        self._ids = itertools.count(1)
        self._pending: dict[int, Future[dict[str, Any]]] = {}
        self._pending_lock = threading.Lock()

    def _send(self, msg: dict[str, Any]) -> None:
        msg_id = msg.get("id")
        with self._pending_lock:
            fut = self._pending.pop(msg_id, None) if isinstance(msg_id, int) else None
        if fut is not None:
            fut.set_result(msg)

    def call(self, method: str, params: dict[str, Any], *, answer: bool) -> Future[dict[str, Any]] | None:
        """Dispatch one request; with `answer` a future of its JSON-RPC answer."""
        msg: dict[str, Any] = {"jsonrpc": "2.0", "method": method, "params": params}
        fut: Future[dict[str, Any]] | None = None
        if answer:
            msg["id"] = next(self._ids)
            fut = Future()
            with self._pending_lock:
                self._pending[msg["id"]] = fut
        self._dispatch(msg)
        return fut

    def note_missed(self, task_id: str, reason: str) -> None:
        """Behind the requests already queued: the task's next checkpoint rescans and says why."""
        engine = self.engine
        if engine is not None:
            self.host.submit(task_id, self, None, lambda: engine.note_missed_events(task_id, reason))
            log.warning("hook.events_missed", task_id=task_id, reason=reason)


class HookEndpoint:
    """Hook payloads → protocol calls on the shared host (one in-process connection per root)."""

    def __init__(self, host: Host) -> None:
        self.host = host
        self._lock = threading.Lock()  # guards the three dicts below
        self._conns: dict[str, _HookConnection] = {}
        self._last_ts: dict[str, int] = {}
        self._started: set[str] = set()
        self._waiting: dict[str, int] = {}  # per task: parent tools waiting for a subagent

    def _conn(self, root: str) -> tuple[_HookConnection | None, str | None]:
        """The initialized connection for `root`, or None and why `initialize` refused it."""
        with self._lock:
            conn = self._conns.get(root)
        if conn is not None:
            return conn, None
        conn = _HookConnection(self.host)
        fut = conn.call("initialize", {"roots": [root], "client": {"name": "shadowpoint-hooks"}}, answer=True)
        assert fut is not None
        answer = fut.result()
        if "error" in answer:
            return None, str(answer["error"].get("message"))
        with self._lock:
            return self._conns.setdefault(root, conn), None

    def _counts(self, plan: HookPlan) -> bool:
        """Keep the count of parent tools waiting for a subagent; False for a batch end that ends nothing."""
        assert plan.task_id is not None
        with self._lock:
            waiting = max(0, self._waiting.get(plan.task_id, 0) + plan.waiting_subagents)
            self._waiting[plan.task_id] = waiting
        return not (plan.subagent_round_end and waiting > 0)

    def _dispatch(self, conn: _HookConnection, task_id: str, calls: list[Call],
                  missed: str | None, via_http: bool) -> list[tuple[str, Future[dict[str, Any]]]]:
        """Stamp (`taskId`, strictly increasing `ts`) and queue the calls; the futures to wait for.

        Under the lock, so that the order of `ts` is the order on the task's worker, and a task
        new to this process gets its `task/start` before any other hook's calls.
        """
        waits: list[tuple[str, Future[dict[str, Any]]]] = []
        with self._lock:
            new = task_id not in self._started
            self._started.add(task_id)
            if new and calls[0].method != "task/start":
                calls = [Call("task/start", needs_ts=True), *calls]
                if via_http:
                    missed = missed or "the sidecar was not running; hook events may have been missed"
            last = self._last_ts.get(task_id, 0)
            for i, call in enumerate(calls):
                params = {"taskId": task_id, **call.params}
                if call.needs_ts:
                    last = max(time.time_ns() // 1_000_000, last + 1)
                    params["ts"] = last
                fut = conn.call(call.method, params, answer=call.wait)
                if fut is not None:
                    waits.append((call.method, fut))
                if i == 0 and missed:
                    conn.note_missed(task_id, missed)
            self._last_ts[task_id] = last
        return waits

    def handle(self, agent: str, raw: bytes, root: str, *, missed: str | None = None,
               via_http: bool = False) -> str | None:
        """Turn one hook payload into protocol calls for the workspace `root`; never raises.

        Args:
            agent: `claude`, `codex` or `gemini`.
            raw: The payload as the agent sent it.
            root: The workspace (the lean command's session root, or this sidecar's http root).
            missed: Why events of this session may have been lost (the next checkpoint rescans
                and carries a warning).
            via_http: The agent posted directly: a session new to this process, seen first at
                an event other than its start, has lost events while no sidecar listened.

        Returns:
            Why the payload (or one of its calls) was refused, for the hook's log; None when
            all went well.
        """
        try:
            return self._handle(agent, raw, root, missed, via_http)
        except Exception as exc:
            log.exception("hook.failed", agent=agent, root=root)
            return f"internal error: {exc!r}"

    def _handle(self, agent: str, raw: bytes, root: str, missed: str | None, via_http: bool) -> str | None:
        try:
            payload = json.loads(raw.decode("utf-8", "surrogateescape") or "{}")
        except ValueError as exc:
            return _refused(agent, None, f"not JSON: {exc}")
        spec = AGENTS.get(agent)
        if spec is None or not isinstance(payload, dict):
            return _refused(agent, None, "not a JSON object")
        plan = spec.plan(payload)
        if not plan.calls:
            return None
        if plan.task_id is None:
            return _refused(agent, plan.event, "the payload has no session_id")
        conn, refusal = self._conn(root)
        if conn is None:
            return _refused(agent, plan.event, refusal or "the workspace was refused")
        if not self._counts(plan):
            return None  # a foreground subagent's batch: the round of the parent's tool goes on
        waits = self._dispatch(conn, plan.task_id, list(plan.calls), missed, via_http)
        notes = []
        for method, fut in waits:
            answer = fut.result(timeout=BARRIER_WAIT_S)
            if "error" in answer:
                kind = (answer["error"].get("data") or {}).get("kind")
                notes.append(f"{method} refused ({kind}): {answer['error'].get('message')}")
                log.info("hook.call_refused", agent=agent, hook_event=plan.event, method=method, kind=kind,
                         reason=answer["error"].get("message"))
        return "; ".join(notes) or None


def _refused(agent: str, event: str | None, reason: str) -> str:
    log.info("hook.payload_refused", agent=agent, hook_event=event, reason=reason)
    return f"{event or 'payload'}: {reason}"


# ---------------------------------------------------------------------------- serving a connection


def _agent_of(path: str) -> str | None:
    prefix = "/hook/"
    if not path.startswith(prefix):
        return None
    agent = path[len(prefix):].split("?", 1)[0]
    return agent if agent in AGENTS else None


def _refusal(request: HttpRequest, config: HttpConfig | None) -> str | None:
    """Why a request on the TCP port is refused (403), or None when it may go on."""
    if config is None:
        return "no secret configured"
    if "origin" in request.headers:
        return "a request with an Origin header (a web page) is refused"
    if request.headers.get("host", "").lower() not in (f"127.0.0.1:{config.port}", f"localhost:{config.port}"):
        return f"foreign Host header {request.headers.get('host')!r}"
    given = request.headers.get("authorization", "")
    if not hmac.compare_digest(given.encode("utf-8", "replace"), f"Bearer {config.secret}".encode()):
        return "missing or wrong secret"
    return None


def serve_http(conn: socket.socket, endpoint: HookEndpoint, *, root: str | None, config: HttpConfig | None,
               on_hook: Callable[[str], None] | None = None) -> None:
    """Serve HTTP requests on one accepted connection until it closes.

    Args:
        conn: The connection (Unix socket: trusted by its file mode; TCP: `config` decides).
        endpoint: Where hook payloads go.
        root: The workspace of a TCP listener; None on the Unix socket, whose requests name it.
        config: The TCP listener's port and secret; None on the Unix socket.
        on_hook: Called with the root of each accepted Unix-socket hook (starts the http listener).
    """
    trusted = config is None
    conn.settimeout(KEEPALIVE_IDLE_S)
    with conn, conn.makefile("rb") as reader, conn.makefile("wb") as writer:
        while True:
            try:
                request = read_request(reader)
            except BadRequestError as exc:
                log.info("hook.request_refused", status=exc.status, reason=str(exc))
                write_response(writer, exc.status, close=True)
                return
            except (TimeoutError, OSError):
                return
            if request is None:
                return
            close = request.headers.get("connection", "").lower() == "close"
            status, note = _serve_one(request, endpoint, root, config, trusted, on_hook)
            try:
                write_response(writer, status, close=close, note=note if trusted else None)
            except OSError:
                return  # the hook went away without its answer: nothing to tell it
            if close:
                return


def _serve_one(request: HttpRequest, endpoint: HookEndpoint, root: str | None, config: HttpConfig | None,
               trusted: bool, on_hook: Callable[[str], None] | None) -> tuple[int, str | None]:
    """The status of one request and a note for the hook's log."""
    if not trusted:
        reason = _refusal(request, config)
        if reason is not None:
            log.warning("hook.request_forbidden", reason=reason, path=request.path)
            return 403, None
    elif "origin" in request.headers:
        return 403, None
    agent = _agent_of(request.path)
    if agent is None:
        return 404, None
    if request.method != "POST":
        return 405, None
    if root is None:
        try:
            root = os.fsdecode(bytes.fromhex(request.headers.get(hookrun.ROOT_HEADER.lower(), "")))
        except ValueError:
            root = ""
        if not os.path.isabs(root):
            return 200, _refused(agent, None, "no workspace root in the request")
        if on_hook is not None:
            with contextlib.suppress(Exception):
                on_hook(root)
    missed = request.headers.get(hookrun.MISSED_HEADER.lower()) or None
    return 200, endpoint.handle(agent, request.body, root, missed=missed, via_http=not trusted)
