"""The domain's names: tool kinds, restore modes, task states, checkpoint kinds and error kinds.

Every value is the protocol's own string (PROTOCOL.md), so a member goes onto the wire and into
`task.json` as it is (`StrEnum` members are `str`s) and a string read back compares equal to
its member. Imported by the engine, the edges (sidecar, CLI, hooks, MCP) and `errors`; nothing
but the standard library, so the lean hook command may import it too.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

__all__ = ["CheckpointKind", "EditRestore", "ErrorKind", "RestoreMode", "Role", "TaskState", "ToolKind",
           "error_kind"]


class ToolKind(StrEnum):
    """What a tool may do to the workspace (PROTOCOL.md `tool/begin`'s `kind`)."""

    READ = "read"
    EDIT = "edit"
    COMMAND = "command"


class RestoreMode(StrEnum):
    """`checkpoint/restore`'s `mode`: the files, the conversation (the task), or both."""

    FILES = "files"
    TASK = "task"
    BOTH = "both"


class EditRestore(StrEnum):
    """`message/edit`'s `restore`: the conversation only, or the conversation and the files."""

    CHAT = "chat"
    ALL = "all"


class TaskState(StrEnum):
    """A task's state in the engine; `FAILED` is internal and goes onto the wire as `DISABLED`."""

    INITIALIZING = "initializing"
    READY = "ready"
    DISABLED = "disabled"
    FAILED = "failed"

    @property
    def wire(self) -> TaskState:
        """The state as PROTOCOL.md shows it (`initializing`, `ready` or `disabled`)."""
        return TaskState.DISABLED if self is TaskState.FAILED else self


class CheckpointKind(StrEnum):
    """PROTOCOL.md `Checkpoint.kind`."""

    BASELINE = "baseline"
    ROUND = "round"
    COMPLETION = "completion"
    COMPACTION = "compaction"

    @property
    def has_snapshot(self) -> bool:
        """Whether a checkpoint of this kind holds a file snapshot (a compaction does not)."""
        return self is not CheckpointKind.COMPACTION


Role = Literal["user", "assistant"]
"""`message/add`'s `role`."""


class ErrorKind(StrEnum):
    """Every error kind: PROTOCOL.md's "Error kinds", and those only the CLI reports (exit codes).

    `errors.py` gives each its class (`KIND_CLASSES`); tests/unit/test_errors.py checks both lists.
    """

    INTERNAL = "internal"
    # PROTOCOL.md
    NO_WORKSPACE = "no_workspace"
    PROTECTED_DIRECTORY = "protected_directory"
    PATH_OUTSIDE_WORKSPACE = "path_outside_workspace"
    UNKNOWN_TASK = "unknown_task"
    UNKNOWN_CHECKPOINT = "unknown_checkpoint"
    UNKNOWN_MESSAGE = "unknown_message"
    NO_FILE_SNAPSHOT = "no_file_snapshot"
    ALREADY_RESTORED = "already_restored"
    NOTHING_TO_UNDO = "nothing_to_undo"
    INIT_TIMEOUT = "init_timeout"
    INIT_FAILED = "init_failed"
    CHECKPOINTS_DISABLED = "checkpoints_disabled"
    LOCK_TIMEOUT = "lock_timeout"
    RESTORE_FAILED = "restore_failed"
    INVALID_PARAMS = "invalid_params"
    STORAGE_FAILED = "storage_failed"
    RESTORE_CONFLICT = "restore_conflict"
    # the command line and the sidecar's client only
    AMBIGUOUS_CHECKPOINT = "ambiguous_checkpoint"
    SIDECAR_UNAVAILABLE = "sidecar_unavailable"
    SIDECAR_RUNNING = "sidecar_running"
    USAGE = "usage"
    CONFIRMATION_REQUIRED = "confirmation_required"
    ABORTED = "aborted"
    DOCTOR_PROBLEMS = "doctor_problems"
    INTERRUPTED = "interrupted"


def error_kind(value: str) -> ErrorKind:
    """The member for a kind read from the wire; `INTERNAL` for one this version does not know."""
    try:
        return ErrorKind(value)
    except ValueError:
        return ErrorKind.INTERNAL
