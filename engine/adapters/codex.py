"""The Codex CLI adapter: a hook payload (stdin of `shadowpoint hook codex`) to protocol calls.

Codex sends Claude-shaped payloads (`session_id`, `cwd`, `hook_event_name`, `tool_name`,
`tool_input`, …). File edits go through `apply_patch`, whose patch text (in
`tool_input.command`) names every file: `*** Add File: p`, `*** Update File: p`,
`*** Delete File: p`, `*** Move to: p`. Codex has no per-batch event: a turn (`Stop`) is the
round. Pure functions, called on the hook process's main thread.
"""

from __future__ import annotations

import re
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

AGENT = "codex"
PROJECT_VARS = ("CODEX_PROJECT_DIR",)

PATCH_TOOLS = frozenset({"apply_patch"})
SHELL_TOOLS = frozenset({"Bash", "shell", "exec_command", "local_shell", "unified_exec", "container.exec"})
READ_TOOLS = frozenset({"update_plan", "view_image", "web_search", "read_file", "list_dir", "grep_files"})

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
        text = _text(tool_input.get("command"))
        if _PATCH_BEGIN in text:  # `apply_patch <<'EOF'` run through the shell
            return "edit", patch_paths(text, cwd)
        return "command", []
    if tool in READ_TOOLS:
        return "read", []
    return None, []


def plan(payload: Mapping[str, Any]) -> HookPlan:
    """Map one Codex hook payload to protocol calls.

    SessionStart → task/start; UserPromptSubmit → message/add (user); PreToolUse → tool/begin;
    PostToolUse → tool/end; Stop → round/end + task/complete; PreCompact → task/compacted.
    """
    event = payload_str(payload, "hook_event_name") or ""
    cwd = payload_str(payload, "cwd")
    calls: list[Call] = []
    if event == "SessionStart":
        calls = [Call("task/start", needs_ts=True)]
    elif event == "UserPromptSubmit":
        calls = prompt_calls(payload)
    elif event in ("PreToolUse", "PostToolUse"):
        response = payload.get("tool_response")
        ok = not (isinstance(response, Mapping) and response.get("success") is False)
        calls = tool_event_calls(payload, classify, ended=event == "PostToolUse", ok=ok)
    elif event == "Stop":
        calls = finish_calls()
    elif event == "PreCompact":
        calls = [Call("task/compacted", needs_ts=True)]
    return HookPlan(event, payload_str(payload, "session_id"), cwd, calls)
