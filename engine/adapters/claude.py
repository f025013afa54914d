"""The Claude Code adapter: a hook payload (an http hook's body, or the lean command's stdin) to
protocol calls.

Claude Code sends each configured event a JSON payload (`session_id`, `transcript_path`,
`cwd`, `hook_event_name`, `tool_name`, `tool_input`, `tool_response`, `prompt`, and
`agent_id` when a subagent runs the tool). `PostToolBatch` fires once a batch of parallel
tool calls has resolved, before the next model call: an exact round boundary. Pure
functions, called on the sidecar's connection threads.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from shadowpoint.adapters.base import EventNames, HookPlan, absolute, plan_events, read_tools_matcher

AGENT = "claude"
PROJECT_VARS = ("CLAUDE_PROJECT_DIR",)

# Edit tools and the tool_input key naming the file they write (Claude Code 2.1.332's tools:
# MultiEdit has no tool schema any more).
EDIT_TOOLS: dict[str, str] = {"Write": "file_path", "Edit": "file_path", "NotebookEdit": "notebook_path"}
# Tools that may change anything without naming it (a subagent runs tools of its own, which
# arrive with `agent_id` and belong to the round of the Agent/Task call).
COMMAND_TOOLS = frozenset({"Bash", "Task", "Agent", "EnterWorktree", "ExitWorktree"})
# Tools that change no file of the workspace (names as Claude Code 2.1.332 ships them; LS,
# NotebookRead, BashOutput and KillBash are gone, KillShell/KillBash are aliases of TaskStop).
READ_TOOLS = frozenset({"Read", "Glob", "Grep", "LSP", "WebFetch", "WebSearch", "ToolSearch", "Skill",
                        "AskUserQuestion", "TodoWrite", "TaskCreate", "TaskGet", "TaskList", "TaskUpdate",
                        "TaskStop", "KillShell", "Monitor", "EnterPlanMode", "ExitPlanMode", "CronList",
                        "ReadNotifications", "ListMcpResourcesTool", "ReadMcpResourceTool",
                        "ReadMcpResourceDirTool", "RefreshMcpTools"})
_TOOLS = read_tools_matcher(READ_TOOLS)

# Events `install-hooks claude` subscribes to, with the matcher for tool events: read tools
# start nothing. SessionStart (it starts the sidecar; Claude Code runs no http hook there) and
# UserPromptSubmit (once a turn: it starts the sidecar again if it went away) are commands
# (the bash client, which posts to the http endpoint and leaves starting the sidecar to the
# Python client), every other event is an http hook to the sidecar (`HTTP_EVENTS`).
EVENTS: dict[str, str | None] = {
    "SessionStart": None,
    "UserPromptSubmit": None,
    "PreToolUse": _TOOLS,
    "PostToolUse": _TOOLS,
    "PostToolUseFailure": _TOOLS,
    "PostToolBatch": None,
    "Stop": None,
    "StopFailure": None,
    "PreCompact": None,
}
HTTP_EVENTS = frozenset(EVENTS) - {"SessionStart", "UserPromptSubmit"}


def classify(tool: str, tool_input: Mapping[str, Any], cwd: str | None) -> tuple[str | None, list[str]]:
    """The protocol kind of a Claude Code tool and the paths it names.

    Returns:
        (kind, paths): kind is `read`, `edit`, `command`, or None for an unknown tool (an MCP
        tool, say), which the engine treats as an edit without reported paths (rescan).
    """
    if tool in EDIT_TOOLS:
        path = absolute(tool_input.get(EDIT_TOOLS[tool]), cwd)
        return "edit", [path] if path else []
    if tool in COMMAND_TOOLS:
        return "command", []
    if tool in READ_TOOLS:
        return "read", []
    return None, []


# PostToolBatch ends a round; Stop (or StopFailure, sent instead when an API error ends the
# turn) also sends round/end first, closing a round whose PostToolBatch never came.
NAMES = EventNames(prompt="UserPromptSubmit", tool_begin="PreToolUse",
                   tool_ends=("PostToolUse", "PostToolUseFailure"), round_end="PostToolBatch",
                   finish=("Stop", "StopFailure"), compact="PreCompact",
                   subagent_tools=frozenset({"Agent", "Task"}))


def _tool_ok(event: str, payload: Mapping[str, Any]) -> bool:
    return event == "PostToolUse"


def plan(payload: Mapping[str, Any]) -> HookPlan:
    """Map one hook payload of this agent to protocol calls (see `NAMES`)."""
    return plan_events(payload, NAMES, classify, _tool_ok)
