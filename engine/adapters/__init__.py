"""Agent adapters: `shadowpoint hook AGENT` payloads → protocol calls, and `install-hooks`.

One module per agent (`claude`, `codex`, `gemini`), each with `plan(payload)`, its
`EVENTS` and `PROJECT_VARS`; `base.run_hook` sends a plan to the workspace's sidecar;
`install` merges the hook entries into the agent's settings file.
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


AGENTS: dict[str, AgentSpec] = {
    m.AGENT: AgentSpec(m.AGENT, m.plan, m.EVENTS, m.PROJECT_VARS) for m in (claude, codex, gemini)
}

__all__ = ["AGENTS", "AgentSpec"]
