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

from shadowpoint.adapters.base import EventNames, HookPlan, absolute, plan_events

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


# BeforeAgent/AfterAgent bound a turn, which is the round.
NAMES = EventNames(prompt="BeforeAgent", tool_begin="BeforeTool", tool_ends=("AfterTool",),
                   finish="AfterAgent", compact="PreCompress")


def _tool_ok(event: str, payload: Mapping[str, Any]) -> bool:
    response = payload.get("tool_response")
    return not (isinstance(response, Mapping) and response.get("error"))


def plan(payload: Mapping[str, Any]) -> HookPlan:
    """Map one hook payload of this agent to protocol calls (see `NAMES`)."""
    return plan_events(payload, NAMES, classify, _tool_ok)
