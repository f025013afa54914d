"""The Codex CLI adapter: a hook payload (stdin of `shadowpoint hook codex`) to protocol calls.

Codex sends Claude-shaped payloads (`session_id`, `cwd`, `hook_event_name`, `tool_name`,
`tool_input`, …). File edits go through `apply_patch`, whose patch text (in
`tool_input.command`) names every file: `*** Add File: p`, `*** Update File: p`,
`*** Delete File: p`, `*** Move to: p`. Codex has no per-batch event: a turn (`Stop`) is the
round, and it closes a tool whose end never came (Codex sends `PostToolUse` only on
success). A subagent's events carry `agent_id` under the parent's `session_id` and belong to
the parent's turn; `SubagentStart`/`SubagentStop` make no round boundary (not subscribed).
Tool names as Codex CLI 0.171.0 ships them. Pure functions, called on the sidecar's
connection threads.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from shadowpoint.adapters.base import EventNames, HookPlan, absolute, plan_events

AGENT = "codex"
PROJECT_VARS = ("CODEX_PROJECT_DIR",)

PATCH_TOOLS = frozenset({"apply_patch"})
SHELL_TOOLS = frozenset({"Bash", "shell", "shell_command", "exec_command", "write_stdin", "local_shell",
                         "unified_exec", "container.exec"})
# A subagent works while these run (its own tool events come with `agent_id`).
SUBAGENT_TOOLS = frozenset({"spawn_agent", "send_input", "resume_agent", "wait", "close_agent"})
READ_TOOLS = frozenset({"update_plan", "view_image", "web_search", "request_user_input", "tool_search",
                        "list_mcp_resources", "list_mcp_resource_templates", "read_mcp_resource"})

EVENTS: dict[str, str | None] = {
    "SessionStart": None,
    "UserPromptSubmit": None,
    "PreToolUse": None,
    "PostToolUse": None,
    "Stop": None,
    "PreCompact": None,
}

_PATCH_LINE = re.compile(r"^\*\*\* (?:Add File|Update File|Delete File|Move to): (.+?)\s*$", re.MULTILINE)
_PATCH_BEGIN = "*** Begin Patch"


def patch_paths(patch: str, cwd: str | None) -> list[str]:
    """Every path an apply_patch text adds, updates, deletes or moves to (absolute, in order)."""
    out: list[str] = []
    for match in _PATCH_LINE.finditer(patch):
        path = absolute(match.group(1), cwd)
        if path and path not in out:
            out.append(path)
    return out


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "\n".join(v for v in value if isinstance(v, str))
    return ""


def classify(tool: str, tool_input: Mapping[str, Any], cwd: str | None) -> tuple[str | None, list[str]]:
    """The protocol kind of a Codex tool and the paths it names (see `claude.classify`)."""
    if tool in PATCH_TOOLS:
        text = "\n".join(_text(tool_input.get(k)) for k in ("command", "patch", "input"))
        return "edit", patch_paths(text, cwd)
    if tool in SHELL_TOOLS:
        text = _text(tool_input.get("command") or tool_input.get("cmd"))
        if _PATCH_BEGIN in text:  # `apply_patch <<'EOF'` run through the shell
            return "edit", patch_paths(text, cwd)
        return "command", []
    if tool in SUBAGENT_TOOLS:
        return "command", []
    if tool in READ_TOOLS:
        return "read", []
    return None, []


# No per-batch event: a turn (Stop) is the round.
NAMES = EventNames(prompt="UserPromptSubmit", tool_begin="PreToolUse", tool_ends=("PostToolUse",),
                   finish=("Stop",), compact="PreCompact")
_EXIT_LINE = re.compile(r"(?:Process exited with code|Exit code:?)\s*(-?\d+)")


def _tool_ok(event: str, payload: Mapping[str, Any]) -> bool:
    """Whether the tool succeeded, as its response shows it.

    A shell's response is a JSON string (`{"output": …, "metadata": {"exit_code": n}}`) or the
    unified exec's text (`Process exited with code n`); no `success` field.
    """
    response: Any = payload.get("tool_response")
    if isinstance(response, str):
        try:
            response = json.loads(response)
        except ValueError:
            match = _EXIT_LINE.search(response)
            return match is None or int(match.group(1)) == 0
    if not isinstance(response, Mapping):
        return True
    if response.get("success") is False:
        return False
    metadata = response.get("metadata")
    code = response.get("exit_code", metadata.get("exit_code") if isinstance(metadata, Mapping) else None)
    return not (isinstance(code, int) and code != 0)


def plan(payload: Mapping[str, Any]) -> HookPlan:
    """Map one hook payload of this agent to protocol calls (see `NAMES`)."""
    return plan_events(payload, NAMES, classify, _tool_ok)
