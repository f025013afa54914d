"""The sidecar's JSON-RPC 2.0 server: newline-delimited messages on a byte stream.

The reader thread parses requests and answers lifecycle calls itself; every request about
a task is queued on that task's worker thread, so requests about one task take effect in
the order they were sent while other tasks proceed. Answers and notifications go through
one writer lock; stdout carries nothing but the protocol.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import socket
import sys
import threading
from collections.abc import Callable
from typing import Any, BinaryIO

import structlog

from shadowpoint import __version__
from shadowpoint.config import Settings, load_settings
from shadowpoint.engine import Engine, EngineOptions
from shadowpoint.errors import InvalidParamsError, NoWorkspaceError, ShadowpointError
from shadowpoint.events import (
    ContextCompacted,
    Event,
    MessageAdded,
    RoundBegan,
    RoundEnded,
    TaskCompleted,
    TaskStarted,
    ToolBegan,
    ToolEnded,
)

log = structlog.get_logger(__name__)

PROTOCOL_VERSION = 1
PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
SERVER_ERROR = -32000

_STOP = object()


def _str(params: dict[str, Any], key: str, *, optional: bool = False) -> Any:
    value = params.get(key)
    if value is None and optional:
        return None
    if not isinstance(value, str) or (not value and not optional):
        raise InvalidParamsError(f"`{key}` must be a non-empty string.")
    return value


def _int(params: dict[str, Any], key: str, *, default: int | None = None) -> int:
    value = params.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool):
        raise InvalidParamsError(f"`{key}` must be an integer (milliseconds).")
    return value


def _paths(params: dict[str, Any], key: str = "paths") -> tuple[str, ...] | None:
    value = params.get(key)
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(p, str) for p in value):
        raise InvalidParamsError(f"`{key}` must be a list of strings.")
    return tuple(value)


def _kind(params: dict[str, Any]) -> str | None:
    kind = params.get("kind")
    if kind is not None and kind not in ("read", "edit", "command"):
        raise InvalidParamsError("`kind` must be read, edit or command.")
    return kind


class _TaskWorker:
    """One thread running the requests of one task, in order."""

    def __init__(self, server: Server, task_id: str) -> None:
        self.queue: queue.Queue[Any] = queue.Queue()
        self.thread = threading.Thread(target=self._run, name=f"shadowpoint-task:{task_id}", daemon=True)
        self.server = server
        self.thread.start()

    def _run(self) -> None:
        while True:
            item = self.queue.get()
            if item is _STOP:
                return
            msg_id, fn = item
            self.server._answer(msg_id, fn)

    def stop(self) -> None:
        self.queue.put(_STOP)
        self.thread.join()


class Server:
    """A JSON-RPC 2.0 endpoint over a pair of byte streams."""

    def __init__(self, reader: BinaryIO, writer: BinaryIO, settings: Settings | None = None) -> None:
        self.reader = reader
        self.writer = writer
        self.settings = settings or load_settings()
        self.engine: Engine | None = None
        self._write_lock = threading.Lock()
        self._workers: dict[str, _TaskWorker] = {}
        self._shut_down = False

    # ------------------------------------------------------------------ wire

    def _send(self, msg: dict[str, Any]) -> None:
        line = json.dumps(msg, ensure_ascii=True, separators=(",", ":")).encode() + b"\n"
        with self._write_lock:
            try:
                self.writer.write(line)
                self.writer.flush()
            except (BrokenPipeError, OSError, ValueError):
                log.warning("sidecar.write_failed")

    def notify(self, method: str, params: dict[str, Any]) -> None:
        self._send({"jsonrpc": "2.0", "method": method, "params": params})

    def _error(self, msg_id: Any, code: int, message: str, kind: str | None = None) -> None:
        err: dict[str, Any] = {"code": code, "message": message}
        if kind:
            err["data"] = {"kind": kind}
        self._send({"jsonrpc": "2.0", "id": msg_id, "error": err})

    def _answer(self, msg_id: Any, fn: Callable[[], Any]) -> None:
        try:
            result = fn()
        except ShadowpointError as exc:
            code = INVALID_PARAMS if exc.kind == "invalid_params" else SERVER_ERROR
            log.info("sidecar.request_refused", kind=exc.kind, reason=str(exc))
            if msg_id is not None:
                self._error(msg_id, code, str(exc), exc.kind)
            return
        except Exception as exc:
            log.exception("sidecar.request_failed")
            if msg_id is not None:
                self._error(msg_id, INTERNAL_ERROR, f"Internal error: {exc}", "internal")
            return
        if msg_id is not None:
            self._send({"jsonrpc": "2.0", "id": msg_id, "result": result})

    # ------------------------------------------------------------------ loop

    def serve(self) -> int:
        """Read requests until end of input; returns the exit status."""
        for raw in self.reader:
            line = raw.strip()
            if not line:
                continue
            try:
                msg = json.loads(line.decode("utf-8", "surrogateescape"))
            except (ValueError, UnicodeDecodeError) as exc:
                self._error(None, PARSE_ERROR, f"Parse error: {exc}")
                continue
            self._dispatch(msg)
        self._drain()
        if self.engine is not None:
            self.engine.close()
        return 0

    def _dispatch(self, msg: Any) -> None:
        if not isinstance(msg, dict) or msg.get("jsonrpc") != "2.0" or not isinstance(msg.get("method"), str):
            self._error(msg.get("id") if isinstance(msg, dict) else None, INVALID_REQUEST, "Invalid request")
            return
        msg_id = msg.get("id")
        method: str = msg["method"]
        params = msg.get("params", {})
        if params is None:
            params = {}
        if not isinstance(params, dict):
            self._error(msg_id, INVALID_PARAMS, "params must be an object", "invalid_params")
            return
        handler = self._handlers().get(method)
        if handler is None:
            if msg_id is not None:
                self._error(msg_id, METHOD_NOT_FOUND, f"Method not found: {method}")
            return
        if method in ("initialize", "shutdown", "history/deleteAll"):
            self._answer(msg_id, lambda: handler(params))
            return
        task_id = params.get("taskId")
        if not isinstance(task_id, str) or not task_id:
            self._answer(msg_id, lambda: _str(params, "taskId"))
            return
        worker = self._workers.get(task_id)
        if worker is None:
            worker = self._workers[task_id] = _TaskWorker(self, task_id)
        worker.queue.put((msg_id, lambda: handler(params)))

    def _drain(self) -> None:
        workers, self._workers = self._workers, {}
        for w in workers.values():
            w.stop()

    # ------------------------------------------------------------------ methods

    def _handlers(self) -> dict[str, Callable[[dict[str, Any]], Any]]:
        return {
            "initialize": self._initialize,
            "shutdown": self._shutdown,
            "task/start": lambda p: self._publish(TaskStarted(_str(p, "taskId"), _int(p, "ts", default=0))),
            "task/retry": lambda p: self._eng().retry_task(_str(p, "taskId")),
            "task/disable": lambda p: self._eng().disable_task(_str(p, "taskId")),
            "round/begin": lambda p: {"round": self._publish(RoundBegan(_str(p, "taskId")))},
            "tool/begin": lambda p: self._publish(ToolBegan(
                _str(p, "taskId"), _str(p, "tool"), _kind(p), _paths(p))),
            "tool/end": lambda p: self._publish(ToolEnded(
                _str(p, "taskId"), _str(p, "tool"), _kind(p), _paths(p), p.get("ok") is not False)),
            "round/end": lambda p: {"checkpoint": self._eng().checkpoint_wire(
                self._publish(RoundEnded(_str(p, "taskId"), _int(p, "ts"))))},
            "task/complete": lambda p: {"checkpoint": self._eng().checkpoint_wire(
                self._publish(TaskCompleted(_str(p, "taskId"), _int(p, "ts"))))},
            "task/compacted": lambda p: {"checkpoint": self._eng().checkpoint_wire(
                self._publish(ContextCompacted(_str(p, "taskId"), _int(p, "ts"))))},
            "message/add": self._message_add,
            "checkpoint/list": lambda p: self._eng().list_checkpoints(_str(p, "taskId")),
            "checkpoint/diff": lambda p: self._eng().diff(_str(p, "taskId"), _int(p, "from"), p.get("to")),
            "checkpoint/viewChanges": lambda p: self._eng().view_changes(_str(p, "taskId"), _int(p, "ts")),
            "checkpoint/restore": lambda p: self._eng().restore(_str(p, "taskId"), _int(p, "ts"),
                                                                 _str(p, "mode")),
            "checkpoint/undoRestore": lambda p: self._eng().undo_restore(_str(p, "taskId")),
            "message/edit": self._message_edit,
            "task/delete": lambda p: self._eng().delete_task(_str(p, "taskId")),
            "history/deleteAll": self._delete_all,
        }

    def _publish(self, event: Event) -> Any:
        return self._eng().bus.publish(event)

    def _eng(self) -> Engine:
        if self.engine is None:
            raise NoWorkspaceError("No workspace: send initialize first.")
        return self.engine

    def _initialize(self, p: dict[str, Any]) -> dict[str, Any]:
        roots = p.get("roots")
        if not isinstance(roots, list) or not all(isinstance(r, str) for r in roots):
            raise InvalidParamsError("`roots` must be a list of absolute paths.")
        overrides = p.get("settings") or {}
        if not isinstance(overrides, dict):
            raise InvalidParamsError("`settings` must be an object.")
        names = {"readOnlyTools": "read_only_tools", "extraExclusions": "extra_exclusions",
                 "maxFileBytes": "max_file_bytes", "initWarnS": "init_warn_s",
                 "initTimeoutS": "init_timeout_s", "watcher": "watcher"}
        data = self.settings.model_dump()
        for key, value in overrides.items():
            if key in names:
                data[names[key]] = value
        try:
            settings = Settings.model_validate(data)
        except ValueError as exc:
            raise InvalidParamsError(f"Invalid settings: {exc}") from exc
        engine = Engine(roots, EngineOptions.from_settings(settings), notify=self.notify)
        if self.engine is not None:
            self._drain()
            self.engine.close()
        self.engine = engine
        return {
            "protocolVersion": PROTOCOL_VERSION,
            "serverVersion": __version__,
            "roots": engine.describe_roots(),
            "readOnlyTools": sorted(engine.options.read_only_tools),
        }

    def _shutdown(self, p: dict[str, Any]) -> None:
        self._drain()
        if self.engine is not None:
            self.engine.close()
            self.engine = None
        self._shut_down = True
        log.info("sidecar.shut_down")

    def _message_add(self, p: dict[str, Any]) -> None:
        role = _str(p, "role")
        if role not in ("user", "assistant"):
            raise InvalidParamsError("`role` must be user or assistant.")
        text = p.get("text")
        if text is not None and not isinstance(text, str):
            raise InvalidParamsError("`text` must be a string.")
        self._publish(MessageAdded(_str(p, "taskId"), _int(p, "ts"), role, text))

    def _message_edit(self, p: dict[str, Any]) -> dict[str, Any]:
        restore = _str(p, "restore")
        if restore not in ("chat", "all"):
            raise InvalidParamsError("`restore` must be chat or all.")
        text = p.get("text")
        if not isinstance(text, str):
            raise InvalidParamsError("`text` must be a string.")
        return self._eng().edit_message(_str(p, "taskId"), _int(p, "ts"), text, restore)

    def _delete_all(self, p: dict[str, Any]) -> None:
        keep = p.get("keepFavorites", [])
        if not isinstance(keep, list) or not all(isinstance(k, str) for k in keep):
            raise InvalidParamsError("`keepFavorites` must be a list of task ids.")
        self._drain()
        self._eng().delete_all(keep)


def serve_stdio(settings: Settings | None = None) -> int:
    """Serve on stdin/stdout. Anything else that writes to fd 1 is sent to stderr instead."""
    proto_out = os.fdopen(os.dup(1), "wb", buffering=0)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    reader = os.fdopen(os.dup(0), "rb")
    server = Server(reader, proto_out, settings)
    try:
        return server.serve()
    finally:
        with contextlib.suppress(OSError):
            proto_out.close()


def serve_socket(path: str, settings: Settings | None = None) -> int:
    """Serve one connection at a time on a Unix socket (mode 0600)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        sock.bind(path)
    finally:
        os.umask(old)
    sock.listen(8)
    log.info("sidecar.listening", socket=path)
    try:
        while True:
            conn, _ = sock.accept()
            with conn, conn.makefile("rb") as r, conn.makefile("wb") as w:
                server = Server(r, w, settings)
                server.serve()
    finally:
        sock.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
