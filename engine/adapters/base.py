"""What every agent adapter shares: the `Call` plan a hook payload turns into.

An adapter (`claude.py`, `codex.py`, `gemini.py`) is a pure function from a hook payload
to a `HookPlan`. The sidecar's hook endpoint (`shadowpoint.sidecar.hook_endpoint`, on its
connection threads) runs it on every payload the hooks deliver, fills in `taskId` and
timestamps, queues the calls and waits only where the agent must wait (the baseline
barrier before a mutating tool).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class Call:
    """One protocol request of a hook (without `taskId`, which the runner adds).

    Attributes:
        method: The protocol method (`tool/begin`, `round/end`, …).
        params: Its parameters.
        needs_ts: The runner adds a fresh `ts` (milliseconds, strictly increasing per task).
        wait: The hook waits for the answer before the agent goes on (a mutating tool's barrier).
    """

    method: str
    params: dict[str, Any] = field(default_factory=dict)
    needs_ts: bool = False
    wait: bool = False


@dataclass(frozen=True, slots=True)
class HookPlan:
    """What one hook invocation asks of the sidecar.

    Attributes:
        event: The agent's event name (for the log).
        task_id: The task (the agent's session id), None when the payload has none.
        cwd: The agent's working directory from the payload.
        calls: The requests, in order; empty when the event needs nothing (a read tool).
        waiting_subagents: +1 when the parent starts a tool that waits for a subagent, -1
            when it ends (the endpoint counts them per task).
        subagent_round_end: `calls` is a subagent's batch end: it ends a round only while no
            parent tool waits for a subagent (a background subagent's own round).
    """

    event: str
    task_id: str | None
    cwd: str | None
    calls: list[Call]
    waiting_subagents: int = 0
    subagent_round_end: bool = False


Adapter = Callable[[Mapping[str, Any]], HookPlan]


def absolute(path: Any, cwd: str | None) -> str | None:
    """A tool's path made absolute against the agent's cwd (None for a non-string)."""
    if not isinstance(path, str) or not path:
        return None
    if os.path.isabs(path) or not cwd:
        return path
    return os.path.normpath(os.path.join(cwd, path))


def tool_calls(tool: str, kind: str | None, paths: list[str], *, ended: bool, ok: bool = True) -> list[Call]:
    """`tool/begin` (a barrier unless the tool only reads) or `tool/end`; nothing for read tools."""
    if kind == "read":
        return []
    params: dict[str, Any] = {"tool": tool}
    if kind is not None:
        params["kind"] = kind
    if paths:
        params["paths"] = paths
    if ended:
        params["ok"] = ok
        return [Call("tool/end", params)]
    return [Call("tool/begin", params, wait=True)]


Classifier = Callable[[str, Mapping[str, Any], "str | None"], "tuple[str | None, list[str]]"]


def prompt_calls(payload: Mapping[str, Any]) -> list[Call]:
    """The user's prompt as a timeline message (every agent's "prompt submitted" event)."""
    params: dict[str, Any] = {"role": "user"}
    prompt = payload.get("prompt")
    if isinstance(prompt, str):
        params["text"] = prompt
    return [Call("message/add", params, needs_ts=True)]


def tool_event_calls(payload: Mapping[str, Any], classify: Classifier, *, ended: bool, ok: bool = True) -> list[Call]:
    """tool/begin or tool/end for a tool event, its kind and paths from the agent's `classify`."""
    tool = payload_str(payload, "tool_name") or "unknown"
    tool_input = payload.get("tool_input")
    kind, paths = classify(tool, tool_input if isinstance(tool_input, Mapping) else {}, payload_str(payload, "cwd"))
    return tool_calls(tool, kind, paths, ended=ended, ok=ok)


def finish_calls() -> list[Call]:
    """round/end first (it closes a round whose end event never came), then the completion."""
    return [Call("round/end", needs_ts=True), Call("task/complete", needs_ts=True)]


@dataclass(frozen=True, slots=True)
class EventNames:
    """How one agent names the round-boundary events (None: the agent has no such event)."""

    prompt: str
    tool_begin: str
    tool_ends: tuple[str, ...]
    finish: tuple[str, ...]
    compact: str
    round_end: str | None = None
    start: str = "SessionStart"
    subagent_tools: frozenset[str] = frozenset()  # parent tools that run a subagent


def plan_events(payload: Mapping[str, Any], names: EventNames, classify: Classifier,
                tool_ok: Callable[[str, Mapping[str, Any]], bool]) -> HookPlan:
    """Map one hook payload to protocol calls through the agent's event names.

    start → task/start; prompt → message/add (user); tool_begin → tool/begin (a barrier for
    mutating tools); tool_ends → tool/end (`tool_ok(event, payload)` says whether it
    succeeded); round_end → round/end; finish → round/end + task/complete; compact →
    task/compacted. A subagent's events (with `agent_id`, under the parent's `session_id`)
    belong to the round of the parent's tool that waits for it: its tools are the parent's
    round's tools, its stops end nothing, and its batch ends end a round only when no parent
    tool waits (a background subagent, `subagent_round_end`).
    """
    event = payload_str(payload, "hook_event_name") or ""
    subagent = payload_str(payload, "agent_id") is not None
    calls: list[Call] = []
    waiting = 0
    if event == names.start:
        calls = [Call("task/start", needs_ts=True)]
    elif event == names.prompt:
        calls = prompt_calls(payload)
    elif event == names.tool_begin or event in names.tool_ends:
        ended = event != names.tool_begin
        calls = tool_event_calls(payload, classify, ended=ended, ok=not ended or tool_ok(event, payload))
        tool_input = payload.get("tool_input")
        background = isinstance(tool_input, Mapping) and tool_input.get("run_in_background") is True
        if not subagent and not background and payload_str(payload, "tool_name") in names.subagent_tools:
            waiting = -1 if ended else 1
    elif event == names.round_end:
        calls = [Call("round/end", needs_ts=True)]
    elif event in names.finish and not subagent:
        calls = finish_calls()
    elif event == names.compact:
        calls = [Call("task/compacted", needs_ts=True)]
    return HookPlan(event, payload_str(payload, "session_id"), payload_str(payload, "cwd"), calls,
                    waiting_subagents=waiting, subagent_round_end=subagent and event == names.round_end)


def payload_str(payload: Mapping[str, Any], key: str) -> str | None:
    """`payload[key]` if it is a non-empty string, else None."""
    value = payload.get(key)
    return value if isinstance(value, str) and value else None


def read_tools_matcher(read_tools: frozenset[str]) -> str:
    """A hook matcher (JavaScript regex) for every tool except `read_tools`: they start nothing."""
    names = "|".join(sorted(read_tools))
    return f"^(?!(?:{names})$).*"
