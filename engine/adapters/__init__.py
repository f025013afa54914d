"""Agent adapters: `shadowpoint hook AGENT` payloads → protocol calls, and `install-hooks`.

One module per agent (`claude`, `codex`, `gemini`), each with `plan(payload)`, its
`EVENTS` (and Claude Code's `HTTP_EVENTS`) and `PROJECT_VARS`; the sidecar's hook endpoint
runs the plans; `install` merges the hook entries into the agent's settings file, `health`
says whether they are installed, current and trusted.
"""

from __future__ import annotations

from dataclasses import dataclass

from shadowpoint.adapters import claude, codex, gemini
from shadowpoint.adapters.base import Adapter


@dataclass(frozen=True, slots=True)
class AgentSpec:
    """What the CLI needs to know of one agent."""

    name: str
    plan: Adapter
    events: dict[str, str | None]
    project_vars: tuple[str, ...]
    http_events: frozenset[str] = frozenset()  # events sent as http hooks to the sidecar


AGENTS: dict[str, AgentSpec] = {
    m.AGENT: AgentSpec(m.AGENT, m.plan, m.EVENTS, m.PROJECT_VARS, getattr(m, "HTTP_EVENTS", frozenset()))
    for m in (claude, codex, gemini)
}

__all__ = ["AGENTS", "AgentSpec"]
