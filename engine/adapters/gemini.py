"""The Gemini CLI adapter: a hook payload (stdin of `shadowpoint hook gemini`) to protocol calls.

Gemini CLI sends `session_id`, `cwd`, `hook_event_name`, `tool_name`, `tool_input`,
`tool_response`, `prompt`. Its file tools `write_file` and `replace` name the file in
`tool_input.file_path`; `run_shell_command` runs a command. There is no per-batch event:
`BeforeAgent`/`AfterAgent` bound a turn, which is the round. `PreCompress` fires before
every model call, before Gemini CLI decides whether to compress (`trigger: "auto"`): only a
`/compress` the user asked for (`trigger: "manual"`) is a compaction. Tool names as Gemini
CLI 0.61.0 ships them. Pure functions, called on the sidecar's connection threads.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from shadowpoint.adapters.base import EventNames, HookPlan, absolute, payload_str, plan_events, read_tools_matcher

AGENT = "gemini"
PROJECT_VARS = ("GEMINI_PROJECT_DIR",)

EDIT_TOOLS = frozenset({"write_file", "replace"})
# invoke_agent runs a subagent, whose tools may change anything.
COMMAND_TOOLS = frozenset({"run_shell_command", "invoke_agent"})
# `search_file_content` is only a legacy matcher alias of grep_search.
READ_TOOLS = frozenset({"read_file", "read_many_files", "glob", "grep_search", "search_file_content",
                        "list_directory", "google_web_search", "web_fetch", "write_todos", "ask_user",
                        "activate_skill", "get_internal_docs", "enter_plan_mode", "exit_plan_mode",
                        "list_mcp_resources", "read_mcp_resource", "update_topic", "complete_task",
                        "tracker_add_dependency", "tracker_create_task", "tracker_get_task", "tracker_list_tasks",
                        "tracker_update_task", "tracker_visualize"})
_TOOLS = read_tools_matcher(READ_TOOLS)

# Tool matchers are JavaScript regexes (read tools start nothing); PreCompress's matcher is
# compared with the trigger: only a manual /compress starts the hook.
EVENTS: dict[str, str | None] = {
    "SessionStart": None,
    "BeforeAgent": None,
    "BeforeTool": _TOOLS,
    "AfterTool": _TOOLS,
    "AfterAgent": None,
    "PreCompress": "manual",
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
                   finish=("AfterAgent",), compact="PreCompress")


def _tool_ok(event: str, payload: Mapping[str, Any]) -> bool:
    response = payload.get("tool_response")
    return not (isinstance(response, Mapping) and response.get("error"))


def plan(payload: Mapping[str, Any]) -> HookPlan:
    """Map one hook payload of this agent to protocol calls (see `NAMES`; an automatic
    PreCompress is not a compaction)."""
    if payload_str(payload, "hook_event_name") == NAMES.compact and payload_str(payload, "trigger") != "manual":
        return HookPlan(NAMES.compact, payload_str(payload, "session_id"), payload_str(payload, "cwd"), [])
    return plan_events(payload, NAMES, classify, _tool_ok)
