"""The sidecar's JSON-RPC 2.0 server: newline-delimited messages on a byte stream.

A `Server` is one connection. Its reader thread parses requests and answers lifecycle
calls itself; every request about a task goes to that task's worker thread in the `Host`,
so requests about one task take effect in the order they were sent, whichever connection
sent them, while other tasks proceed. A round's requests, when nothing else is queued or
running, run on the reader thread itself (one thread wake-up less each; `Host.submit`).
On stdio the host is private to the one connection; on a Unix socket (`socket_server.py`)
one host, with its engines and task state, is shared by every connection, so short-lived
hook processes find the task as the last one left it.
Answers and notifications go through one writer lock per connection; stdout carries
nothing but the protocol.

No input ends the process: a line that is not JSON, is nested deeper than the parser
accepts, or is longer than `MAX_LINE_BYTES` is answered with a JSON-RPC error. On stdio,
SIGTERM and SIGINT stop the reading after what the pipe already holds (read without
waiting); every request read is answered, commits included, and `serve` returns 0 as after
`shutdown` (PROTOCOL.md 1.1 "Errors and signals").
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import queue
import select
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future
from types import FrameType
from typing import TYPE_CHECKING, Any, BinaryIO, Protocol, TypeVar

import structlog

from shadowpoint import __version__
from shadowpoint.bus import RoundBus
from shadowpoint.config.plain import PlainSettings, load_plain_settings, plain_settings
from shadowpoint.engine import Engine, EngineOptions
from shadowpoint.errors import InvalidParamsError, NoWorkspaceError, ShadowpointError
from shadowpoint.events import (
    ContextCompacted,
    MessageAdded,
    RoundBegan,
    RoundEnded,
    TaskCompleted,
    TaskRetried,
    TaskStarted,
    ToolBegan,
    ToolEnded,
)
from shadowpoint.results import Checkpoint, Wire
from shadowpoint.sidecar.params import (
    DeleteAllParams,
    DiffParams,
    DiffSafetyParams,
    ForkParams,
    InitializeParams,
    MessageAddParams,
    MessageEditParams,
    NoParams,
    Params,
    RestoreParams,
    RestoreSafetyParams,
    TaskParams,
    TaskStartParams,
    ToolBeginParams,
    ToolEndParams,
    TsParams,
    parse,
)

if TYPE_CHECKING:
    from shadowpoint.config import Settings

log = structlog.get_logger(__name__)

PROTOCOL_VERSION = 1
PROTOCOL_MINOR = 1  # the "Additions of version 1.1" of PROTOCOL.md
PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
SERVER_ERROR = -32000

_STOP = object()
T = TypeVar("T")
P = TypeVar("P", bound=Params)

# A request line longer than this is dropped whole and answered -32600 (memory stays bounded).
MAX_LINE_BYTES = 64 * 1024 * 1024
_CHUNK_BYTES = 64 * 1024

# Answered on the reader thread, in arrival order (no task worker involved).
_LIFECYCLE = ("initialize", "shutdown", "history/deleteAll", "sidecar/status", "sidecar/stop")

# A round's requests: run on the reader thread when nothing else is queued or running and
# the task's baseline is built (`Host.submit`). Restores, diffs, forks and deletions, which a
# person asks for and which may take seconds, go to the task's worker, as do requests while
# a baseline builds (an edit waits there for its paths).
_INLINE = frozenset({"round/begin", "tool/begin", "tool/end", "round/end", "message/add", "checkpoint/list"})

_SETTING_NAMES = {"readOnlyTools": "read_only_tools", "extraExclusions": "extra_exclusions",
                  "maxFileBytes": "max_file_bytes", "initWarnS": "init_warn_s",
                  "initTimeoutS": "init_timeout_s", "watcher": "watcher"}


def engine_key(roots: Sequence[str], settings: PlainSettings) -> str:
    """Identity of an engine in a shared host: its canonical roots and its settings."""
    reals = [os.path.realpath(os.path.expanduser(r)) for r in roots]
    return json.dumps([reals, settings.values()], sort_keys=True, default=str)


class _Answerer(Protocol):
    def _answer(self, msg_id: Any, fn: Callable[[], Any]) -> None: ...


class _FutureAnswer:
    """Delivers a worker's result to an in-process caller (`Host.call`)."""

    def __init__(self) -> None:
        self.future: Future[Any] = Future()

    def _answer(self, msg_id: Any, fn: Callable[[], Any]) -> None:
        try:
            self.future.set_result(fn())
        except BaseException as exc:
            self.future.set_exception(exc)


class _TaskWorker:
    """One thread running the requests of one task, in order (from any connection).

    A request may also run on the thread that read it (`Host.submit` with `inline`) when
    nothing is queued or running; `running` is held by whichever thread runs one of the
    task's requests, so a request queued meanwhile (another connection's) waits for it.
    """

    def __init__(self, host: Host, task_id: str) -> None:
        self.queue: queue.Queue[Any] = queue.Queue()
        self.host = host
        self.running = threading.Lock()
        self.thread = threading.Thread(target=self._run, name=f"shadowpoint-task:{task_id}", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while True:
            item = self.queue.get()
            if item is _STOP:
                return
            if isinstance(item, threading.Event):
                with self.running:  # after a request running on its reader's thread
                    item.set()
                continue
            conn, msg_id, fn = item
            try:
                with self.running:
                    conn._answer(msg_id, fn)
            finally:
                self.host._request_done()

    def stop(self) -> None:
        self.queue.put(_STOP)
        self.thread.join()


class Host:
    """The engines and task workers of one sidecar process.

    Private to one connection on stdio (`initialize` replaces the engine); shared by every
    connection on a socket (`initialize` with the same roots and settings finds the same
    engine, so task state survives between hook invocations).
    """

    def __init__(self, settings: Settings | PlainSettings | None = None, *, shared: bool = False) -> None:
        self.settings = plain_settings(settings) if settings is not None else load_plain_settings()
        self.shared = shared
        self.owner: str | None = None  # "watch" when `shadowpoint watch` owns this host
        self.stop_requested = threading.Event()
        self._lock = threading.Lock()  # guards every dict and counter below
        self._engines: dict[str, Engine] = {}
        self._listeners: dict[str, set[Server]] = {}
        self._workers: dict[str, _TaskWorker] = {}
        self._connections = 0
        self._busy = 0
        self._last_active = time.monotonic()

    # ------------------------------------------------------------------ engines

    def adopt(self, engine: Engine, settings: Settings | PlainSettings) -> None:
        """Serve an engine created elsewhere (`shadowpoint watch`) to this host's connections."""
        key = engine_key([str(ws.root) for ws in engine.workspaces], plain_settings(settings))
        with self._lock:
            self._engines[key] = engine

    def open_engine(self, roots: list[str], settings: PlainSettings, conn: Server) -> Engine:
        """The engine for `roots` (created on first use); `conn` receives its notifications."""
        key = engine_key(roots, settings)
        with self._lock:
            engine = self._engines.get(key) if self.shared else None
        if engine is None:
            # Built before the old one goes: a refused `initialize` leaves the previous engine.
            engine = Engine(roots, EngineOptions.from_settings(settings),
                            notify=lambda method, params: self._broadcast(key, method, params))
            old: list[Engine] = []
            with self._lock:
                existing = self._engines.get(key) if self.shared else None
                if existing is not None:  # another connection won the race
                    old.append(engine)
                    engine = existing
                else:
                    if not self.shared:
                        old.extend(self._engines.values())
                        self._engines.clear()
                        self._listeners.clear()
                    self._engines[key] = engine
            if old and not self.shared:
                self.stop_workers()
            for stale in old:
                stale.close()
        with self._lock:
            for listeners in self._listeners.values():
                listeners.discard(conn)
            self._listeners.setdefault(key, set()).add(conn)
        return engine

    def _broadcast(self, key: str, method: str, params: dict[str, Any]) -> None:
        with self._lock:
            conns = list(self._listeners.get(key, ()))
        for conn in conns:
            conn.notify(method, params)

    def forget(self, conn: Server) -> None:
        """`conn` closed: it gets no more notifications."""
        with self._lock:
            for listeners in self._listeners.values():
                listeners.discard(conn)

    # ------------------------------------------------------------------ workers

    def call(self, task_id: str, fn: Callable[[], T]) -> T:
        """Run `fn` on the task's worker, after the requests already queued for the task."""
        answer = _FutureAnswer()
        self.submit(task_id, answer, None, fn)
        result: T = answer.future.result()
        return result

    def submit(self, task_id: str, conn: _Answerer, msg_id: Any, fn: Callable[[], Any], *,
               inline: bool = False) -> None:
        """Queue `fn` on the task's worker (created on first use); `conn` gets the answer.

        `inline`: run it on this thread instead, before returning, when nothing else in this
        host is queued or running. A request handed to a worker thread waited 70-300 us for
        that thread to wake on a 2-core VM, and a round is four requests; on the reader's own
        thread it starts at once. The caller passes it only for requests that do not wait for
        a baseline: while one runs here, this connection reads nothing more.
        """
        with self._lock:
            worker = self._workers.get(task_id)
            if worker is None:
                worker = self._workers[task_id] = _TaskWorker(self, task_id)
            self._busy += 1
            here = inline and self._busy == 1
            if not here:
                worker.queue.put((conn, msg_id, fn))
        if here:
            try:
                with worker.running:
                    conn._answer(msg_id, fn)
            finally:
                self._request_done()

    def _request_done(self) -> None:
        with self._lock:
            self._busy -= 1
            self._last_active = time.monotonic()

    def flush(self, timeout_s: float | None = None) -> None:
        """Wait until every request queued so far has run (the workers keep running)."""
        with self._lock:
            workers = list(self._workers.values())
        marks = []
        for w in workers:
            mark = threading.Event()
            w.queue.put(mark)
            marks.append(mark)
        for mark in marks:
            mark.wait(timeout_s)

    def stop_workers(self) -> None:
        """Run what is queued, then stop and join every task worker."""
        with self._lock:
            workers, self._workers = list(self._workers.values()), {}
        for w in workers:
            w.stop()

    # ------------------------------------------------------------------ idleness

    def connection_opened(self) -> None:
        """Count a new connection (the sidecar is not idle while one is open)."""
        with self._lock:
            self._connections += 1
            self._last_active = time.monotonic()

    def connection_closed(self) -> None:
        """A connection ended: the idle clock starts again."""
        with self._lock:
            self._connections -= 1
            self._last_active = time.monotonic()

    def idle_for_s(self) -> float:
        """Seconds since the last connection or request ended; 0 while any is open or running."""
        with self._lock:
            if self._connections > 0 or self._busy > 0:
                return 0.0
            return time.monotonic() - self._last_active

    def status(self) -> dict[str, Any]:
        """`sidecar/status`: pid, version, owner, connections, requests running, engines and roots."""
        with self._lock:
            return {"pid": os.getpid(), "serverVersion": __version__, "shared": self.shared, "owner": self.owner,
                    "connections": self._connections, "busy": self._busy, "engines": len(self._engines),
                    "roots": sorted({str(ws.root) for e in self._engines.values() for ws in e.workspaces})}

    def close(self) -> None:
        """Flush, stop the workers and close every engine (pending commits are written first)."""
        self.stop_workers()
        with self._lock:
            engines = list(self._engines.values())
            self._engines.clear()
            self._listeners.clear()
        for engine in engines:
            with contextlib.suppress(Exception):
                engine.close()


class Server:
    """A JSON-RPC 2.0 endpoint over a pair of byte streams (one connection)."""

    # Whether a round's requests may run on the reading thread (`_INLINE`); not for a connection
    # whose caller does not wait for every answer (the hook endpoint's).
    runs_inline = True

    def __init__(self, reader: BinaryIO, writer: BinaryIO, settings: Settings | PlainSettings | None = None,
                 host: Host | None = None) -> None:
        self.reader = reader
        self.writer = writer
        self.host = host or Host(settings)
        self.settings = self.host.settings
        self.engine: Engine | None = None
        self._write_lock = threading.Lock()
        self._shut_down = False
        self._handler_table: dict[str, Handler] | None = None  # built at the first request

    # ------------------------------------------------------------------ wire

    def _send(self, msg: dict[str, Any]) -> None:
        line = json.dumps(msg, ensure_ascii=True, separators=(",", ":")).encode() + b"\n"
        with self._write_lock:
            try:
                self.writer.write(line)
                self.writer.flush()
            except (BrokenPipeError, OSError, ValueError):
                log.info("sidecar.write_failed")  # the client went away (a hook that did not wait)

    def notify(self, method: str, params: dict[str, Any]) -> None:
        """Send a JSON-RPC notification on this connection."""
        self._send({"jsonrpc": "2.0", "method": method, "params": params})

    def _error(self, msg_id: Any, code: int, message: str, kind: str | None = None,
               conflicts: list[str] | None = None) -> None:
        err: dict[str, Any] = {"code": code, "message": message}
        if kind:
            err["data"] = {"kind": kind}
            if conflicts is not None:
                err["data"]["conflicts"] = list(conflicts)  # restore_conflict (PROTOCOL 1.1)
        self._send({"jsonrpc": "2.0", "id": msg_id, "error": err})

    def _answer(self, msg_id: Any, fn: Callable[[], Any]) -> None:
        try:
            result = fn()
        except ShadowpointError as exc:
            code = INVALID_PARAMS if exc.kind == "invalid_params" else SERVER_ERROR
            log.info("sidecar.request_refused", kind=exc.kind, reason=str(exc))
            if msg_id is not None:
                self._error(msg_id, code, str(exc), exc.kind, getattr(exc, "conflicts", None))
            return
        except Exception as exc:
            log.exception("sidecar.request_failed")
            if msg_id is not None:
                self._error(msg_id, INTERNAL_ERROR, f"Internal error: {exc}", "internal")
            return
        if msg_id is not None:
            self._send({"jsonrpc": "2.0", "id": msg_id, "result": result})

    # ------------------------------------------------------------------ loop

    def serve(self, chunks: Iterable[bytes] | None = None) -> int:
        """Answer the requests in `chunks` (default: everything `reader` gives) until their end;
        returns the exit status."""
        lines = _LineSplitter()
        for chunk in _read_chunks(self.reader) if chunks is None else chunks:
            for line in lines.feed(chunk):
                self._handle_line(line)
        for line in lines.end():
            self._handle_line(line)
        if self.host.shared:
            self.host.forget(self)
        else:
            self.host.close()
        return 0

    def _handle_line(self, raw: bytes | None) -> None:
        """One request line (None: one over `MAX_LINE_BYTES`); never raises."""
        if raw is None:
            self._error(None, INVALID_REQUEST, f"Invalid request: a line over {MAX_LINE_BYTES} bytes")
            return
        line = raw.strip()
        if not line:
            return
        try:
            msg = json.loads(line.decode("utf-8", "surrogateescape"))
        except RecursionError:
            self._error(None, PARSE_ERROR, "Parse error: nested deeper than the sidecar accepts")
            return
        except ValueError as exc:
            self._error(None, PARSE_ERROR, f"Parse error: {exc}")
            return
        try:
            self._dispatch(msg)
        except Exception as exc:  # no input may end the process (PROTOCOL.md 1.1)
            log.exception("sidecar.dispatch_failed")
            msg_id = msg.get("id") if isinstance(msg, dict) else None
            self._error(msg_id if _is_valid_id(msg_id) else None, INTERNAL_ERROR, f"Internal error: {exc}",
                        "internal")

    def _dispatch(self, msg: Any) -> None:
        if not isinstance(msg, dict):
            what = "a batch (array), which this sidecar does not take" if isinstance(msg, list) else "not an object"
            self._error(None, INVALID_REQUEST, f"Invalid request: {what}")
            return
        msg_id = msg.get("id")
        if not _is_valid_id(msg_id):
            self._error(None, INVALID_REQUEST, "Invalid request: `id` must be a string, a number or null")
            return
        if msg.get("jsonrpc") != "2.0" or not isinstance(msg.get("method"), str):
            self._error(msg_id, INVALID_REQUEST, "Invalid request")
            return
        method: str = msg["method"]
        params = msg.get("params", {})
        if params is None:
            params = {}
        if not isinstance(params, dict):
            self._error(msg_id, INVALID_PARAMS, "params must be an object", "invalid_params")
            return
        if self._handler_table is None:
            self._handler_table = self._handlers()  # ~10 us a request when built each time
        handler = self._handler_table.get(method)
        if handler is None:
            if msg_id is not None:
                self._error(msg_id, METHOD_NOT_FOUND, f"Method not found: {method}")
            return
        if method in _LIFECYCLE:
            self._answer(msg_id, lambda: handler(params))
            return
        task_id = params.get("taskId")
        if not isinstance(task_id, str) or not task_id:
            self._answer(msg_id, lambda: parse(TaskParams, params))  # answers the field's invalid_params
            return
        inline = (self.runs_inline and method in _INLINE and self.engine is not None
                  and self.engine.is_settled(task_id))
        self.host.submit(task_id, self, msg_id, lambda: handler(params), inline=inline)

    # ------------------------------------------------------------------ methods

    def _handlers(self) -> dict[str, Handler]:
        eng, bus = self._eng, self._bus
        # `eng` as the third argument looks for the engine before the params are read: a request
        # that reads or restores answers no_workspace before a wrong field, as it always did;
        # the events (and message/edit) check their fields first.
        return {
            "initialize": _method(InitializeParams, self._initialize),
            "shutdown": _method(NoParams, self._shutdown),
            "sidecar/status": _method(NoParams, lambda q: self.host.status()),
            "sidecar/stop": _method(NoParams, self._stop),
            "task/start": _method(TaskStartParams, lambda q: bus().publish(TaskStarted(q.task_id, q.ts)).to_wire()),
            "task/retry": _method(TaskParams, lambda q: bus().publish(TaskRetried(q.task_id)).to_wire(), eng),
            "task/disable": _method(TaskParams, lambda q: eng().disable_task(q.task_id), eng),
            "round/begin": _method(TaskParams, lambda q: {"round": bus().publish(RoundBegan(q.task_id))}),
            "tool/begin": _method(ToolBeginParams, lambda q: bus().publish(
                ToolBegan(q.task_id, q.tool, q.kind, q.paths))),
            "tool/end": _method(ToolEndParams, lambda q: bus().publish(
                ToolEnded(q.task_id, q.tool, q.kind, q.paths, q.ok))),
            "round/end": _method(TsParams, lambda q: _checkpoint(bus().publish(RoundEnded(q.task_id, q.ts)))),
            "task/complete": _method(TsParams, lambda q: _checkpoint(bus().publish(TaskCompleted(q.task_id, q.ts)))),
            "task/compacted": _method(TsParams, lambda q: _checkpoint(
                bus().publish(ContextCompacted(q.task_id, q.ts)))),
            "message/add": _method(MessageAddParams, lambda q: bus().publish(
                MessageAdded(q.task_id, q.ts, q.role, q.text))),
            "checkpoint/list": _method(TaskParams, lambda q: eng().list_checkpoints(q.task_id).to_wire(), eng),
            "checkpoint/diff": _method(DiffParams, lambda q: eng().diff(q.task_id, q.from_ts, q.to).to_wire(), eng),
            "checkpoint/viewChanges": _method(TsParams, lambda q: eng().view_changes(q.task_id, q.ts).to_wire(), eng),
            "checkpoint/restore": _method(RestoreParams, lambda q: eng().restore(
                q.task_id, q.ts, q.restore_mode, q.paths, q.dry_run, q.keep_outside_edits).to_wire(), eng),
            "task/fork": _method(ForkParams, lambda q: _checkpoint(eng().fork_task(q.task_id, q.ts, q.new_task_id)),
                                 eng),
            "checkpoint/undoRestore": _method(TaskParams, lambda q: eng().undo_restore(q.task_id).to_wire(), eng),
            # not in PROTOCOL.md: the CLI's `redo` and safety checkpoints through a running sidecar
            "checkpoint/redoRestore": _method(TaskParams, lambda q: eng().redo_restore(q.task_id).to_wire(), eng),
            "checkpoint/restoreSafety": _method(RestoreSafetyParams, lambda q: eng().restore_safety(
                q.task_id, q.n, q.paths, q.dry_run, q.keep_outside_edits).to_wire(), eng),
            "checkpoint/diffSafety": _method(DiffSafetyParams, lambda q: eng().diff(
                q.task_id, None, None, q.n).to_wire(), eng),
            "message/edit": _method(MessageEditParams, lambda q: eng().edit_message(
                q.task_id, q.ts, q.text, q.restore).to_wire()),
            "task/delete": _method(TaskParams, lambda q: eng().delete_task(q.task_id), eng),
            "history/deleteAll": _method(DeleteAllParams, self._delete_all),
        }

    def _bus(self) -> RoundBus:
        return self._eng().bus

    def _eng(self) -> Engine:
        if self.engine is None:
            raise NoWorkspaceError("No workspace: send initialize first.")
        return self.engine

    def _initialize(self, q: InitializeParams) -> Wire:
        overrides = {_SETTING_NAMES[key]: value for key, value in q.settings.items() if key in _SETTING_NAMES}
        settings = _overridden(self.settings, overrides) if overrides else self.settings
        engine = self.host.open_engine(q.roots, settings, self)
        self.engine = engine
        return {
            "protocolVersion": PROTOCOL_VERSION,
            "protocolMinor": PROTOCOL_MINOR,
            "serverVersion": __version__,
            "roots": engine.describe_roots(),
            "readOnlyTools": sorted(engine.options.read_only_tools),
        }

    def _shutdown(self, q: NoParams) -> None:
        if self.host.shared:
            # Other connections share the engine: write what is pending, keep serving.
            self.host.flush()
            return
        self.host.close()
        self.engine = None
        self._shut_down = True
        log.info("sidecar.shut_down")

    def _stop(self, q: NoParams) -> None:
        if not self.host.shared:
            raise InvalidParamsError("sidecar/stop is for a socket sidecar; on stdio send shutdown.")
        if self.host.owner is not None:
            raise InvalidParamsError(
                f"This sidecar belongs to `shadowpoint {self.host.owner}` (pid {os.getpid()}); stop that instead.")
        self.host.flush()
        self.host.stop_requested.set()
        log.info("sidecar.stop_requested")

    def _delete_all(self, q: DeleteAllParams) -> None:
        if self.host.shared:
            self.host.flush()
        else:
            self.host.stop_workers()
        self._eng().delete_all(q.keep_favorites)


Handler = Callable[[dict[str, Any]], object]


def _method(model: type[P], fn: Callable[[P], object], before: Callable[[], object] | None = None) -> Handler:
    """A method's handler: `before` (the engine's presence), then its params parsed as `model`,
    then `fn` with them."""

    def handle(params: dict[str, Any]) -> object:
        if before is not None:
            before()
        return fn(parse(model, params))

    return handle


def _checkpoint(cp: Checkpoint | None) -> Wire:
    """The `{checkpoint}` answer of round/end, task/complete, task/compacted and task/fork."""
    return {"checkpoint": cp.to_wire() if cp is not None else None}


def _is_valid_id(value: Any) -> bool:
    """A JSON-RPC id this server echoes: a string, a finite number or null (never a structure)."""
    if value is None or isinstance(value, str):
        return True
    if isinstance(value, bool):
        return False
    return isinstance(value, int) or (isinstance(value, float) and math.isfinite(value))


def _read_chunks(reader: BinaryIO) -> Iterator[bytes]:
    while chunk := reader.readline(_CHUNK_BYTES):
        yield chunk


class _LineSplitter:
    """Cuts a byte stream into request lines; a line over `MAX_LINE_BYTES` comes out as None."""

    def __init__(self) -> None:
        self._buf = bytearray()
        self._too_long = False  # inside a line already over the limit: drop until its end

    def feed(self, chunk: bytes) -> list[bytes | None]:
        out: list[bytes | None] = []
        start = 0
        while (end := chunk.find(b"\n", start)) >= 0:
            out.append(self._take(chunk[start:end]))
            start = end + 1
        self._keep(chunk[start:])
        return out

    def end(self) -> list[bytes | None]:
        """The last line, when the input ended without a newline."""
        if self._too_long or self._buf.strip():
            return [self._take(b"")]
        return []

    def _take(self, tail: bytes) -> bytes | None:
        self._keep(tail)
        line = None if self._too_long else bytes(self._buf)
        self._buf.clear()
        self._too_long = False
        return line

    def _keep(self, part: bytes) -> None:
        if self._too_long:
            return
        if len(self._buf) + len(part) > MAX_LINE_BYTES:
            self._too_long = True
            self._buf.clear()
        else:
            self._buf += part


class _SignalledInput:
    """stdin as chunks until its end or SIGTERM/SIGINT; after a signal, what the pipe already
    holds is read without waiting, and nothing after it (main thread only)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.signal: int | None = None
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)

    def __enter__(self) -> _SignalledInput:
        self._old_wakeup = signal.set_wakeup_fd(self._wake_w)
        self._old_handlers = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._old_handlers.items():
            signal.signal(sig, handler)
        signal.set_wakeup_fd(self._old_wakeup)
        os.close(self._wake_r)
        os.close(self._wake_w)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        # only a flag: the handler may run while the main thread holds any lock (a logger's)
        if self.signal is None:
            self.signal = signum

    def chunks(self) -> Iterator[bytes]:
        poller = select.poll()
        poller.register(self.fd, select.POLLIN)
        poller.register(self._wake_r, select.POLLIN)
        while self.signal is None:
            ready = {fd for fd, _ in poller.poll()}
            if self._wake_r in ready:
                with contextlib.suppress(OSError):
                    os.read(self._wake_r, 512)
            if self.signal is not None:
                break
            if self.fd in ready:
                chunk = os.read(self.fd, _CHUNK_BYTES)
                if not chunk:
                    return
                yield chunk
        # Signalled: the requests already written to the pipe are taken, without waiting.
        log.info("sidecar.signalled", signal=signal.Signals(self.signal).name)
        os.set_blocking(self.fd, False)
        while True:
            try:
                chunk = os.read(self.fd, _CHUNK_BYTES)
            except OSError:  # BlockingIOError: the pipe is empty
                return
            if not chunk:
                return
            yield chunk


def _overridden(settings: PlainSettings, overrides: dict[str, Any]) -> PlainSettings:
    """`settings` with an `initialize`'s overrides, checked by `Settings` (pydantic is imported
    only here: a sidecar whose clients send no overrides never imports it).

    Raises:
        InvalidParamsError: a value `Settings` refuses.
    """
    from shadowpoint.config.settings import Settings

    try:
        return plain_settings(Settings.model_validate(settings.values() | overrides))
    except ValueError as exc:
        raise InvalidParamsError(f"Invalid settings: {exc}") from exc


def serve_stdio(settings: Settings | PlainSettings | None = None) -> int:
    """Serve on stdin/stdout. Anything else that writes to fd 1 is sent to stderr instead.

    SIGTERM and SIGINT end the reading after what stdin already holds; every request read
    is answered (commits included) and the status is 0, as after `shutdown`.
    """
    proto_out = os.fdopen(os.dup(1), "wb", buffering=0)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    reader = os.fdopen(os.dup(0), "rb")
    server = Server(reader, proto_out, settings)
    try:
        if threading.current_thread() is not threading.main_thread():
            return server.serve()  # signal handlers belong to the main thread
        with _SignalledInput(reader.fileno()) as signalled:
            return server.serve(signalled.chunks())
    finally:
        with contextlib.suppress(OSError):
            reader.close()
        with contextlib.suppress(OSError):
            proto_out.close()
