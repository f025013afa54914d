"""The Claude Code adapter: a hook payload (stdin of `shadowpoint hook claude`) to protocol calls.

Claude Code runs the hook command for each configured event with a JSON payload
(`session_id`, `transcript_path`, `cwd`, `hook_event_name`, `tool_name`, `tool_input`,
`tool_response`, `prompt`, …). `PostToolBatch` fires once a batch of parallel tool calls
has resolved, before the next model call: an exact round boundary. Pure functions, called
on the hook process's main thread.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from shadowpoint.adapters.base import EventNames, HookPlan, absolute, plan_events

AGENT = "claude"
PROJECT_VARS = ("CLAUDE_PROJECT_DIR",)

# Edit tools and the tool_input key naming the file they write.
EDIT_TOOLS: dict[str, str] = {"Write": "file_path", "Edit": "file_path", "MultiEdit": "file_path",
                              "NotebookEdit": "notebook_path"}
# Tools that may change anything without naming it (a subagent runs tools of its own).
COMMAND_TOOLS = frozenset({"Bash", "Task", "Agent"})
READ_TOOLS = frozenset({"Read", "Glob", "Grep", "LS", "WebFetch", "WebSearch", "TodoWrite", "NotebookRead",
                        "BashOutput", "KillShell", "KillBash", "ExitPlanMode", "ListMcpResourcesTool",
                        "ReadMcpResourceTool"})

# Events `install-hooks claude` subscribes to, with the matcher for tool events.
EVENTS: dict[str, str | None] = {
    "SessionStart": None,
    "UserPromptSubmit": None,
    "PreToolUse": "*",
    "PostToolUse": "*",
    "PostToolUseFailure": "*",
    "PostToolBatch": None,
    "Stop": None,
    "PreCompact": None,
}


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


# PostToolBatch ends a round; Stop also sends round/end first, closing a round whose
# PostToolBatch never came (older versions).
NAMES = EventNames(prompt="UserPromptSubmit", tool_begin="PreToolUse",
                   tool_ends=("PostToolUse", "PostToolUseFailure"), round_end="PostToolBatch",
                   finish="Stop", compact="PreCompact")


def _tool_ok(event: str, payload: Mapping[str, Any]) -> bool:
    return event == "PostToolUse"


def plan(payload: Mapping[str, Any]) -> HookPlan:
    """Map one hook payload of this agent to protocol calls (see `NAMES`)."""
    return plan_events(payload, NAMES, classify, _tool_ok)
