"""Agent-side events published on the round-boundary bus (frozen, slotted dataclasses).

Every entry point (sidecar, library hooks, `shadowpoint watch`) turns what the agent did
into these values and publishes them on `RoundBus`; the engine's checkpoint logic
subscribes. Plain values: safe to pass between threads.
"""

from __future__ import annotations

from dataclasses import dataclass

from shadowpoint.kinds import Role, ToolKind


@dataclass(frozen=True, slots=True)
class TaskStarted:
    task_id: str
    ts: int = 0


@dataclass(frozen=True, slots=True)
class TaskRetried:
    """`task/retry`: initialise again after a failure (or turn a disabled task back on)."""

    task_id: str


@dataclass(frozen=True, slots=True)
class RoundBegan:
    task_id: str


@dataclass(frozen=True, slots=True)
class ToolBegan:
    """Sent before the tool runs; a tool that may modify the workspace waits for the baseline."""

    task_id: str
    tool: str
    kind: ToolKind | None = None
    paths: tuple[str, ...] | None = None


@dataclass(frozen=True, slots=True)
class ToolEnded:
    """`paths` of an edit tool: the files it wrote, deleted or renamed (both names)."""

    task_id: str
    tool: str
    kind: ToolKind | None = None
    paths: tuple[str, ...] | None = None
    ok: bool = True


@dataclass(frozen=True, slots=True)
class RoundEnded:
    task_id: str
    ts: int


@dataclass(frozen=True, slots=True)
class TaskCompleted:
    task_id: str
    ts: int


@dataclass(frozen=True, slots=True)
class ContextCompacted:
    task_id: str
    ts: int


@dataclass(frozen=True, slots=True)
class MessageAdded:
    task_id: str
    ts: int
    role: Role
    text: str | None = None


Event = (
    TaskStarted | TaskRetried | RoundBegan | ToolBegan | ToolEnded | RoundEnded | TaskCompleted | ContextCompacted
    | MessageAdded
)
