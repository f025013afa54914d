"""The exception tree of shadowpoint; each class carries the protocol's error `kind`.

    ShadowpointError                      (kind: internal)
    ├── InvalidParamsError                invalid_params
    ├── WorkspaceError
    │   ├── NoWorkspaceError              no_workspace
    │   ├── ProtectedDirectoryError       protected_directory
    │   ├── PathOutsideWorkspaceError     path_outside_workspace
    │   └── ShadowRepoMismatchError       init_failed (hash collision or moved workspace)
    ├── TaskError
    │   ├── UnknownTaskError              unknown_task
    │   │   └── TaskMetadataError         unknown_task (task.json unreadable: rebuilt from the shadow refs)
    │   ├── UnknownMessageError           unknown_message
    │   ├── InitTimeoutError              init_timeout
    │   ├── InitFailedError               init_failed
    │   └── CheckpointsDisabledError      checkpoints_disabled
    ├── CheckpointError
    │   ├── UnknownCheckpointError        unknown_checkpoint
    │   │   └── DamagedCheckpointError    unknown_checkpoint (its objects are gone from the shadow repo)
    │   ├── NoFileSnapshotError           no_file_snapshot
    │   ├── AlreadyRestoredError          already_restored
    │   ├── NothingToUndoError            nothing_to_undo
    │   ├── RestoreFailedError            restore_failed
    │   └── RestoreConflictError          restore_conflict (keepOutsideEdits: `conflicts` names the paths)
    ├── LockTimeoutError                  lock_timeout
    ├── StorageFailedError                storage_failed (disk full, quota, I/O error in the docs root)
    │   └── FileNotStorableError          storage_failed (one file: caught per file, left out with a warning)
    └── RepoError                         init_failed (a libgit2 failure, translated in shadow_repo.py)
        └── ObjectMissingError            init_failed (an object the repo should hold is missing)

Entry points map `kind` to a JSON-RPC `data.kind` (sidecar) or an exit code (CLI).
"""

from __future__ import annotations


class ShadowpointError(Exception):
    """Root of every error shadowpoint raises on purpose."""

    kind: str = "internal"


class InvalidParamsError(ShadowpointError):
    kind = "invalid_params"


class WorkspaceError(ShadowpointError):
    kind = "no_workspace"


class NoWorkspaceError(WorkspaceError):
    kind = "no_workspace"

    def __init__(self, message: str | None = None) -> None:
        super().__init__(
            message or "No workspace detected. Please open shadowpoint in a workspace to use checkpoints."
        )


class ProtectedDirectoryError(WorkspaceError):
    kind = "protected_directory"


class PathOutsideWorkspaceError(WorkspaceError):
    kind = "path_outside_workspace"


class ShadowRepoMismatchError(WorkspaceError):
    kind = "init_failed"


class TaskError(ShadowpointError):
    kind = "unknown_task"


class UnknownTaskError(TaskError):
    kind = "unknown_task"


class TaskMetadataError(UnknownTaskError):
    """A task folder whose `task.json` cannot be read (damaged, or another task's)."""

    kind = "unknown_task"


class UnknownMessageError(TaskError):
    kind = "unknown_message"


class InitTimeoutError(TaskError):
    kind = "init_timeout"


class InitFailedError(TaskError):
    kind = "init_failed"


class CheckpointsDisabledError(TaskError):
    kind = "checkpoints_disabled"


class CheckpointError(ShadowpointError):
    kind = "unknown_checkpoint"


class UnknownCheckpointError(CheckpointError):
    kind = "unknown_checkpoint"


class DamagedCheckpointError(UnknownCheckpointError):
    """The checkpoint is listed but the shadow repository lost objects it needs."""

    kind = "unknown_checkpoint"


class NoFileSnapshotError(CheckpointError):
    kind = "no_file_snapshot"


class AlreadyRestoredError(CheckpointError):
    kind = "already_restored"


class NothingToUndoError(CheckpointError):
    kind = "nothing_to_undo"


class RestoreFailedError(CheckpointError):
    kind = "restore_failed"


class RestoreConflictError(CheckpointError):
    """A restore keeping outside edits found files it cannot merge; nothing was written."""

    kind = "restore_conflict"

    def __init__(self, message: str, conflicts: list[str]) -> None:
        super().__init__(message)
        self.conflicts = conflicts


class LockTimeoutError(ShadowpointError):
    kind = "lock_timeout"


class StorageFailedError(ShadowpointError):
    """The shadow repository or the task data could not be written (disk full, quota, I/O
    error); the request changed nothing and the round's paths are kept for the next one."""

    kind = "storage_failed"


class FileNotStorableError(StorageFailedError):
    """One file's blob cannot be stored (beyond the file system's or the process's file-size
    limit); the scanner leaves the file out with a warning, the other files are committed."""

    kind = "storage_failed"


class RepoError(ShadowpointError):
    kind = "init_failed"


class ObjectMissingError(RepoError):
    """A commit, tree or blob the shadow repository should hold is missing (damage)."""

    kind = "init_failed"
