"""What `Engine`'s public methods answer: frozen, slotted values, and their wire form.

The engine returns these; the edges (the sidecar, the CLI's in-process backend, the MCP server
through it) turn them into PROTOCOL.md's JSON with `to_wire()`, one method per result type, so
the protocol's field names (`createdAt`, `keepThrough`, `oldPath`) live here and nowhere in the
engine. Plain values, no I/O: safe to pass between threads.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeAlias

from shadowpoint.kinds import CheckpointKind, ErrorKind, TaskState

if TYPE_CHECKING:
    from shadowpoint.restore.diff import FileChange

__all__ = ["Checkpoint", "CheckpointList", "Diff", "FilesRestored", "KindError", "Restore", "SkipWarning",
           "TaskStatus", "Wire"]

Wire: TypeAlias = "dict[str, object]"
"""A JSON object as the protocol writes it (what `json.dumps` is given)."""


@dataclass(frozen=True, slots=True)
class KindError:
    """An error reported inside a result (`task/start`'s `error`, `Restore.error`)."""

    kind: ErrorKind
    message: str
    conflicts: tuple[str, ...] | None = None  # restore_conflict: the paths (PROTOCOL 1.1)

    def to_wire(self) -> Wire:
        out: Wire = {"kind": self.kind.value, "message": self.message}
        if self.conflicts is not None:
            out["conflicts"] = list(self.conflicts)
        return out


@dataclass(frozen=True, slots=True)
class TaskStatus:
    """`task/start`, `task/retry`: the task's state (as the protocol shows it) and its init error."""

    state: TaskState
    error: KindError | None = None

    def to_wire(self) -> Wire:
        out: Wire = {"state": self.state.value}
        if self.error is not None:
            out["error"] = self.error.to_wire()
        return out


@dataclass(frozen=True, slots=True)
class SkipWarning:
    """A file a snapshot left out, and why (over the size cap, unreadable, vanished…)."""

    path: str
    reason: str

    def to_wire(self) -> Wire:
        return {"path": self.path, "reason": self.reason}


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """PROTOCOL.md `Checkpoint`: a task's checkpoint as it was when it was answered."""

    ts: int
    kind: CheckpointKind
    hash: str | None  # the first root's commit; None without a snapshot
    hashes: Mapping[str, str]  # every root's commit by name; empty without a snapshot
    reused: bool
    restored: bool
    created_at: str
    warnings: tuple[SkipWarning, ...] = ()

    def to_wire(self) -> Wire:
        return {
            "ts": self.ts,
            "kind": self.kind.value,
            "hash": self.hash,
            "hashes": dict(self.hashes),
            "reused": self.reused,
            "restored": self.restored,
            "createdAt": self.created_at,
            "warnings": [w.to_wire() for w in self.warnings],
        }


@dataclass(frozen=True, slots=True)
class CheckpointList:
    """`checkpoint/list`: the task's checkpoints in message order, and its state."""

    status: TaskStatus
    checkpoints: tuple[Checkpoint, ...]

    def to_wire(self) -> Wire:
        out = self.status.to_wire()
        out["checkpoints"] = [c.to_wire() for c in self.checkpoints]
        return out


@dataclass(frozen=True, slots=True)
class Diff:
    """PROTOCOL.md `Diff`: a title and the changed files."""

    title: str
    files: tuple[FileChange, ...]

    def to_wire(self) -> Wire:
        return {"title": self.title, "files": [f.to_wire() for f in self.files]}


@dataclass(frozen=True, slots=True)
class FilesRestored:
    """`Restore.files`: what a file restore wrote (or, in a dry run, would write)."""

    restored: tuple[str, ...]
    deleted: tuple[str, ...]
    merged: tuple[str, ...]
    safety: str | None  # the safety checkpoint; None in a dry run
    conflicts: tuple[str, ...] | None = None  # a dry run's conflicting paths (PROTOCOL 1.1)

    def to_wire(self) -> Wire:
        out: Wire = {"restored": list(self.restored), "deleted": list(self.deleted), "merged": list(self.merged)}
        if self.conflicts is not None:
            out["conflicts"] = list(self.conflicts)
        out["safety"] = self.safety
        return out


@dataclass(frozen=True, slots=True)
class Restore:
    """PROTOCOL.md `Restore` (and `message/edit`'s, which adds `text`)."""

    files: FilesRestored | None
    keep_through: int | None = None  # `task: {keepThrough}`: the conversation was cut after it
    error: KindError | None = None  # the file part failed (mode both, Restore All)
    text: str | None = None  # message/edit's answer only

    def to_wire(self) -> Wire:
        out: Wire = {
            "files": self.files.to_wire() if self.files is not None else None,
            "task": {"keepThrough": self.keep_through} if self.keep_through is not None else None,
        }
        if self.text is not None:
            out["text"] = self.text
        if self.error is not None:
            out["error"] = self.error.to_wire()
        return out
