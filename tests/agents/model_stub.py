"""A scripted model server on 127.0.0.1 for the real agent programs.

It speaks the three streaming APIs the agents use: Anthropic Messages (`POST /v1/messages`,
SSE), OpenAI Responses (`POST /v1/responses`, SSE) and Gemini (`POST
/v1beta/models/M:streamGenerateContent?alt=sse`). Which reply a request gets comes from a
`Script`: the conversation's own history says how far it has got (the number of model turns
already in it), so a retry or an auxiliary request never shifts the script. Every request is
recorded together with a snapshot of the workspace taken while it is served: the disk exactly
as the model "saw" it before answering.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from tests.conftest import read_tree

# A workspace snapshot: relative path -> bytes, Exe or Link (`tests.conftest.read_tree`).
Snapshot = dict[str, Any]

@dataclass
class Served:
    """One request the stub answered."""

    api: str                  # "anthropic", "openai", "gemini"
    path: str
    body: dict[str, Any]
    main: bool                # a request of the scripted conversation (False: auxiliary)
    step: int | None          # the script step it was answered with (main requests)
    who: str                  # "main" or the name of a sub-conversation (a subagent)
    tree: Snapshot
    reply: dict[str, Any] | None = None


@dataclass(frozen=True)
class ToolCall:
    """The model calls `name` with `args` (the agent's own tool name and argument shape)."""

    name: str
    args: dict[str, Any]
    custom: bool = False      # OpenAI: a freeform (custom) tool; args["input"] is the raw text


@dataclass(frozen=True)
class Text:
    """The model answers with `text` and ends its turn."""

    text: str


Reply = ToolCall | Text


@dataclass
class Script:
    """The replies of a conversation, by step (the number of model turns already in its history).

    `subs` holds sub-conversations (a subagent's), picked by a marker string that their
    first user message contains.
    """

    steps: list[Reply]
    subs: dict[str, list[Reply]] = field(default_factory=dict)
    aux_text: str = "ok"


class ModelStub:
    """The HTTP server; `served` lists every request in arrival order."""

    def __init__(self, script: Script, workspace: Path) -> None:
        self.script = script
        self.workspace = workspace
        self.served: list[Served] = []
        self.unknown: list[str] = []
        self._lock = threading.Lock()
        self._ids = 0
        stub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                stub._not_found(self)

            def do_HEAD(self) -> None:
                stub._not_found(self)

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                stub._post(self, raw)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self._thread = threading.Thread(target=self.server.serve_forever, name="model-stub", daemon=True)

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        assert isinstance(host, str)  # an AF_INET address: (host, port)
        return f"http://{host}:{port}"

    def __enter__(self) -> ModelStub:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(timeout=30)

    def main_requests(self) -> list[Served]:
        return [s for s in self.served if s.main]

    # ------------------------------------------------------------------ dispatch

    def _next_id(self, prefix: str) -> str:
        with self._lock:
            self._ids += 1
            return f"{prefix}{self._ids:04d}"

    def _not_found(self, h: BaseHTTPRequestHandler) -> None:
        with self._lock:
            self.unknown.append(f"{h.command} {h.path}")
        body = b'{"error": {"message": "not found", "type": "not_found_error"}}'
        h.send_response(404)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)

    def _post(self, h: BaseHTTPRequestHandler, raw: bytes) -> None:
        path = h.path.split("?", 1)[0]
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            body = {}
        if path.endswith("/v1/messages/count_tokens"):
            return self._json(h, {"input_tokens": 100})
        if path.endswith("/v1/messages"):
            return self._serve(h, "anthropic", path, body)
        if path.endswith("/responses"):
            return self._serve(h, "openai", path, body)
        if ":streamGenerateContent" in path or ":generateContent" in path:
            return self._serve(h, "gemini", path, body)
        if path.endswith(":countTokens"):
            return self._json(h, {"totalTokens": 100})
        self._not_found(h)

    def _serve(self, h: BaseHTTPRequestHandler, api: str, path: str, body: dict[str, Any]) -> None:
        tree = read_tree(self.workspace)
        history = _HISTORY[api](body)
        main = history.has_tools
        who, steps = "main", self.script.steps
        for marker, sub in self.script.subs.items():
            if marker in history.first_user_text:
                who, steps = marker, sub
        step = history.model_turns if main else None
        reply: Reply
        if step is None:
            reply = Text(self.script.aux_text)
        elif step < len(steps):
            reply = steps[step]
        else:
            reply = Text("(the script has no more steps)")
        served = Served(api, path, body, main, step, who, tree)
        with self._lock:
            self.served.append(served)
        stream = api != "gemini" or ":streamGenerateContent" in path
        if api == "anthropic" and not body.get("stream"):
            stream = False
        events, whole = _WRITERS[api](self, body, reply)
        served.reply = whole
        if not stream:
            return self._json(h, whole)
        h.send_response(200)
        h.send_header("Content-Type", "text/event-stream")
        h.send_header("Cache-Control", "no-cache")
        h.send_header("Connection", "close")
        h.end_headers()
        for name, data in events:
            chunk = (f"event: {name}\n" if name else "") + f"data: {json.dumps(data)}\n\n"
            h.wfile.write(chunk.encode())
        h.wfile.flush()
        h.close_connection = True

    def _json(self, h: BaseHTTPRequestHandler, data: dict[str, Any]) -> None:
        raw = json.dumps(data).encode()
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(raw)))
        h.end_headers()
        h.wfile.write(raw)


# ---------------------------------------------------------------------- history readers


@dataclass(frozen=True)
class History:
    has_tools: bool
    model_turns: int
    first_user_text: str


def _texts(value: Any) -> Iterator[str]:
    """Every string inside a JSON value."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _texts(v)
    elif isinstance(value, list):
        for v in value:
            yield from _texts(v)


def _anthropic_history(body: dict[str, Any]) -> History:
    messages = body.get("messages") or []
    first: dict[str, Any] = next((m for m in messages if m.get("role") == "user"), {})
    return History(bool(body.get("tools")), sum(1 for m in messages if m.get("role") == "assistant"),
                   "\n".join(_texts(first.get("content"))))


_OPENAI_MODEL_ITEMS = {"function_call", "custom_tool_call", "local_shell_call"}


def _openai_history(body: dict[str, Any]) -> History:
    items = body.get("input") or []
    if isinstance(items, str):
        items = [{"type": "message", "role": "user", "content": items}]
    turns = sum(1 for i in items if i.get("type") in _OPENAI_MODEL_ITEMS
                or (i.get("type") == "message" and i.get("role") == "assistant"))
    users = [i for i in items if i.get("type", "message") == "message" and i.get("role") == "user"]
    return History(bool(body.get("tools")), turns, "\n".join(_texts(users[-1:])))


def _gemini_history(body: dict[str, Any]) -> History:
    contents = body.get("contents") or []
    tools = body.get("tools") or []
    has = any(t.get("functionDeclarations") for t in tools if isinstance(t, dict))
    first: dict[str, Any] = next((c for c in contents if c.get("role") == "user"), {})
    return History(has, sum(1 for c in contents if c.get("role") == "model"), "\n".join(_texts(first)))


_HISTORY: dict[str, Callable[[dict[str, Any]], History]] = {
    "anthropic": _anthropic_history, "openai": _openai_history, "gemini": _gemini_history}


# ---------------------------------------------------------------------- reply writers

Events = list[tuple[str | None, dict[str, Any]]]


def _anthropic_reply(stub: ModelStub, body: dict[str, Any], reply: Reply) -> tuple[Events, dict[str, Any]]:
    model = body.get("model") or "claude-sonnet-4-5"
    msg_id = stub._next_id("msg_stub")
    usage = {"input_tokens": 100, "output_tokens": 10, "cache_creation_input_tokens": 0,
             "cache_read_input_tokens": 0}
    if isinstance(reply, Text):
        block: dict[str, Any] = {"type": "text", "text": reply.text}
        start: dict[str, Any] = {"type": "text", "text": ""}
        delta: dict[str, Any] = {"type": "text_delta", "text": reply.text}
        stop = "end_turn"
    else:
        tool_id = stub._next_id("toolu_stub")
        block = {"type": "tool_use", "id": tool_id, "name": reply.name, "input": reply.args}
        start = {"type": "tool_use", "id": tool_id, "name": reply.name, "input": {}}
        delta = {"type": "input_json_delta", "partial_json": json.dumps(reply.args)}
        stop = "tool_use"
    whole = {"id": msg_id, "type": "message", "role": "assistant", "model": model, "content": [block],
             "stop_reason": stop, "stop_sequence": None, "usage": usage}
    events: Events = [
        ("message_start", {"type": "message_start", "message": {**whole, "content": [], "stop_reason": None}}),
        ("content_block_start", {"type": "content_block_start", "index": 0, "content_block": start}),
        ("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta}),
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        ("message_delta", {"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None},
                           "usage": {"output_tokens": 10}}),
        ("message_stop", {"type": "message_stop"}),
    ]
    return events, whole


def _openai_reply(stub: ModelStub, body: dict[str, Any], reply: Reply) -> tuple[Events, dict[str, Any]]:
    resp_id = stub._next_id("resp_stub")
    item_id = stub._next_id("item_stub")
    if isinstance(reply, Text):
        item: dict[str, Any] = {"type": "message", "id": item_id, "role": "assistant", "status": "completed",
                                "content": [{"type": "output_text", "text": reply.text, "annotations": []}]}
    elif reply.custom:
        item = {"type": "custom_tool_call", "id": item_id, "status": "completed",
                "call_id": stub._next_id("call_stub"), "name": reply.name, "input": reply.args["input"]}
    else:
        item = {"type": "function_call", "id": item_id, "status": "completed",
                "call_id": stub._next_id("call_stub"), "name": reply.name, "arguments": json.dumps(reply.args)}
    usage = {"input_tokens": 100, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 10,
             "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 110}
    response: dict[str, Any] = {"id": resp_id, "object": "response", "status": "in_progress",
                                "model": body.get("model"), "output": []}
    done = {**response, "status": "completed", "output": [item], "usage": usage}
    events: Events = [
        ("response.created", {"type": "response.created", "response": response}),
        ("response.output_item.added", {"type": "response.output_item.added", "output_index": 0,
                                        "item": {**item, "status": "in_progress"}}),
        ("response.output_item.done", {"type": "response.output_item.done", "output_index": 0, "item": item}),
        ("response.completed", {"type": "response.completed", "response": done}),
    ]
    return events, done


def _gemini_reply(stub: ModelStub, body: dict[str, Any], reply: Reply) -> tuple[Events, dict[str, Any]]:
    config = body.get("generationConfig") or {}
    if isinstance(reply, Text) and config.get("responseMimeType") == "application/json":
        # An auxiliary structured request (Gemini CLI's next-speaker or loop checks).
        part: dict[str, Any] = {"text": json.dumps({"reasoning": "the turn is done", "next_speaker": "user"})}
    elif isinstance(reply, Text):
        part = {"text": reply.text}
    else:
        part = {"functionCall": {"name": reply.name, "args": reply.args}}
    whole = {"candidates": [{"content": {"role": "model", "parts": [part]}, "finishReason": "STOP", "index": 0}],
             "usageMetadata": {"promptTokenCount": 100, "candidatesTokenCount": 10, "totalTokenCount": 110},
             "modelVersion": "gemini-2.5-pro", "responseId": stub._next_id("gem_stub")}
    return [(None, whole)], whole


_WRITERS: dict[str, Callable[[ModelStub, dict[str, Any], Reply], tuple[Events, dict[str, Any]]]] = {
    "anthropic": _anthropic_reply, "openai": _openai_reply, "gemini": _gemini_reply}
