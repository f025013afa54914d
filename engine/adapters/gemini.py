"""The Gemini CLI adapter: a hook payload (stdin of `shadowpoint hook gemini`) to protocol calls.

Gemini CLI sends `session_id`, `cwd`, `hook_event_name`, `tool_name`, `tool_input`,
`tool_response`, `prompt`. Its file tools `write_file` and `replace` name the file in
`tool_input.file_path`; `run_shell_command` runs a command. There is no per-batch event:
`BeforeAgent`/`AfterAgent` bound a turn, which is the round. Pure functions, called on the
hook process's main thread.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from shadowpoint.adapters.base import (
    Call,
    HookPlan,
    absolute,
    finish_calls,
    payload_str,
    prompt_calls,
    tool_event_calls,
)

AGENT = "gemini"
PROJECT_VARS = ("GEMINI_PROJECT_DIR",)

EDIT_TOOLS = frozenset({"write_file", "replace", "edit"})
COMMAND_TOOLS = frozenset({"run_shell_command"})
READ_TOOLS = frozenset({"read_file", "read_many_files", "glob", "search_file_content", "grep", "list_directory",
                        "google_web_search", "web_fetch", "save_memory", "write_todos"})

EVENTS: dict[str, str | None] = {
    "SessionStart": None,
    "BeforeAgent": None,
    "BeforeTool": ".*",
    "AfterTool": ".*",
    "AfterAgent": None,
    "PreCompress": None,
}


def classify(tool: str, tool_input: Mapping[str, Any], cwd: str | None) -> tuple[str | None, list[str]]:
    """The protocol kind of a Gemini CLI tool and the paths it names (see `claude.classify`)."""
    if tool in EDIT_TOOLS:
        path = absolute(tool_input.get("file_path") or tool_input.get("absolute_path"), cwd)
        return "edit", [path] if path else []
    if tool in COMMAND_TOOLS:
        return "command", []
    if tool in READ_TOOLS:
        return "read", []
    return None, []


def plan(payload: Mapping[str, Any]) -> HookPlan:
    """Map one Gemini CLI hook payload to protocol calls.

    SessionStart → task/start; BeforeAgent → message/add (user); BeforeTool → tool/begin;
    AfterTool → tool/end; AfterAgent → round/end + task/complete; PreCompress → task/compacted.
    """
    event = payload_str(payload, "hook_event_name") or ""
    cwd = payload_str(payload, "cwd")
    calls: list[Call] = []
    if event == "SessionStart":
        calls = [Call("task/start", needs_ts=True)]
    elif event == "BeforeAgent":
        calls = prompt_calls(payload)
    elif event in ("BeforeTool", "AfterTool"):
        response = payload.get("tool_response")
        ok = not (isinstance(response, Mapping) and response.get("error"))
        calls = tool_event_calls(payload, classify, ended=event == "AfterTool", ok=ok)
    elif event == "AfterAgent":
        calls = finish_calls()
    elif event == "PreCompress":
        calls = [Call("task/compacted", needs_ts=True)]
    return HookPlan(event, payload_str(payload, "session_id"), cwd, calls)
