"""The exception tree of shadowpoint; each class carries the error `kind` that the protocol
(`data.kind`) and the CLI (its exit code) report.

    ShadowpointError                      internal (the one root: nothing else is raised on purpose)
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
    │   ├── AmbiguousCheckpointError      ambiguous_checkpoint (a hash prefix naming several commits)
    │   ├── NoFileSnapshotError           no_file_snapshot
    │   ├── AlreadyRestoredError          already_restored
    │   ├── NothingToUndoError            nothing_to_undo
    │   ├── RestoreFailedError            restore_failed
    │   └── RestoreConflictError          restore_conflict (keepOutsideEdits: `conflicts` names the paths)
    ├── LockTimeoutError                  lock_timeout
    ├── StorageFailedError                storage_failed (disk full, quota, I/O error in the docs root)
    │   └── FileNotStorableError          storage_failed (one file: caught per file, left out with a warning)
    ├── RepoError                         init_failed (a libgit2 failure, translated in shadow_repo.py)
    │   └── ObjectMissingError            init_failed (an object the repo should hold is missing)
    ├── SidecarError                      internal, or the `data.kind` the sidecar answered with
    │   ├── SidecarUnavailableError       sidecar_unavailable
    │   └── SidecarRunningError           sidecar_running (another sidecar serves the socket)
    └── CliError                          internal, or the kind it is given (`cli_error`)
        ├── UsageError                    usage
        ├── ConfirmationRequiredError     confirmation_required (no terminal to ask on, no --yes)
        ├── AbortedError                  aborted (the question was answered no)
        ├── DoctorProblemsError           doctor_problems
        └── InterruptedCommandError       interrupted (Ctrl-C arrives as KeyboardInterrupt: its kind)

Entry points map `kind` to a JSON-RPC `data.kind` (sidecar) or an exit code (CLI:
`shadowpoint.cli.EXIT_CODES`); `KIND_CLASSES` names the class of every kind, and
tests/unit/test_errors.py checks it against PROTOCOL.md, the exit codes and this drawing.
A few exceptions are signals that never leave their module and are not drawn here:
`git_index.IndexDoubt` (the git index is not trusted: no ids are taken from it),
`patterns._Unmatchable`, `hook_endpoint.BadRequestError` (an HTTP status for the reply) and
`config.plain._Unproven` (a setting the plain reader hands to `Settings`).
"""

from __future__ import annotations

from shadowpoint.kinds import ErrorKind, error_kind


class ShadowpointError(Exception):
    """Root of every error shadowpoint raises on purpose."""

    kind: ErrorKind = ErrorKind.INTERNAL


class InvalidParamsError(ShadowpointError):
    kind = ErrorKind.INVALID_PARAMS


class WorkspaceError(ShadowpointError):
    kind = ErrorKind.NO_WORKSPACE


class NoWorkspaceError(WorkspaceError):
    kind = ErrorKind.NO_WORKSPACE

    def __init__(self, message: str | None = None) -> None:
        super().__init__(
            message or "No workspace detected. Please open shadowpoint in a workspace to use checkpoints."
        )


class ProtectedDirectoryError(WorkspaceError):
    kind = ErrorKind.PROTECTED_DIRECTORY


class PathOutsideWorkspaceError(WorkspaceError):
    kind = ErrorKind.PATH_OUTSIDE_WORKSPACE


class ShadowRepoMismatchError(WorkspaceError):
    kind = ErrorKind.INIT_FAILED


class TaskError(ShadowpointError):
    kind = ErrorKind.UNKNOWN_TASK


class UnknownTaskError(TaskError):
    kind = ErrorKind.UNKNOWN_TASK


class TaskMetadataError(UnknownTaskError):
    """A task folder whose `task.json` cannot be read (damaged, or another task's)."""

    kind = ErrorKind.UNKNOWN_TASK


class UnknownMessageError(TaskError):
    kind = ErrorKind.UNKNOWN_MESSAGE


class InitTimeoutError(TaskError):
    kind = ErrorKind.INIT_TIMEOUT


class InitFailedError(TaskError):
    kind = ErrorKind.INIT_FAILED


class CheckpointsDisabledError(TaskError):
    kind = ErrorKind.CHECKPOINTS_DISABLED


class CheckpointError(ShadowpointError):
    kind = ErrorKind.UNKNOWN_CHECKPOINT


class UnknownCheckpointError(CheckpointError):
    kind = ErrorKind.UNKNOWN_CHECKPOINT


class DamagedCheckpointError(UnknownCheckpointError):
    """The checkpoint is listed but the shadow repository lost objects it needs."""

    kind = ErrorKind.UNKNOWN_CHECKPOINT


class AmbiguousCheckpointError(CheckpointError):
    """A hash prefix naming several different commits."""

    kind = ErrorKind.AMBIGUOUS_CHECKPOINT


class NoFileSnapshotError(CheckpointError):
    kind = ErrorKind.NO_FILE_SNAPSHOT


class AlreadyRestoredError(CheckpointError):
    kind = ErrorKind.ALREADY_RESTORED


class NothingToUndoError(CheckpointError):
    kind = ErrorKind.NOTHING_TO_UNDO


class RestoreFailedError(CheckpointError):
    kind = ErrorKind.RESTORE_FAILED


class RestoreConflictError(CheckpointError):
    """A restore keeping outside edits found files it cannot merge; nothing was written."""

    kind = ErrorKind.RESTORE_CONFLICT

    def __init__(self, message: str, conflicts: list[str]) -> None:
        super().__init__(message)
        self.conflicts = conflicts


class LockTimeoutError(ShadowpointError):
    kind = ErrorKind.LOCK_TIMEOUT


class StorageFailedError(ShadowpointError):
    """The shadow repository or the task data could not be written (disk full, quota, I/O
    error); the request changed nothing and the round's paths are kept for the next one."""

    kind = ErrorKind.STORAGE_FAILED


class FileNotStorableError(StorageFailedError):
    """One file's blob cannot be stored (beyond the file system's or the process's file-size
    limit); the scanner leaves the file out with a warning, the other files are committed."""

    kind = ErrorKind.STORAGE_FAILED


class RepoError(ShadowpointError):
    kind = ErrorKind.INIT_FAILED


class ObjectMissingError(RepoError):
    """A commit, tree or blob the shadow repository should hold is missing (damage)."""

    kind = ErrorKind.INIT_FAILED


class SidecarError(ShadowpointError):
    """The sidecar answered with an error, or could not be reached; `kind` is the protocol's."""

    def __init__(self, message: str, kind: str | None = None) -> None:
        super().__init__(message)
        if kind is not None:
            self.kind = error_kind(kind)


class SidecarUnavailableError(SidecarError):
    """Nothing listens on the socket, or the sidecar went away or could not be started."""

    kind = ErrorKind.SIDECAR_UNAVAILABLE

    def __init__(self, message: str) -> None:
        super().__init__(message)


class SidecarRunningError(SidecarError):
    """Another live sidecar already serves this socket."""

    kind = ErrorKind.SIDECAR_RUNNING

    def __init__(self, message: str) -> None:
        super().__init__(message)


class CliError(ShadowpointError):
    """An error for the command line: one line on stderr, the exit code of its `kind` (which
    may be any kind: one the sidecar answered with is relayed as it came, one this version
    does not know as `internal`)."""

    def __init__(self, message: str, kind: str | None = None) -> None:
        super().__init__(message)
        if kind is not None:
            self.kind = error_kind(kind)


class UsageError(CliError):
    """Bad arguments."""

    kind = ErrorKind.USAGE


class ConfirmationRequiredError(CliError):
    """A destructive command without a terminal to ask on and without --yes."""

    kind = ErrorKind.CONFIRMATION_REQUIRED


class AbortedError(CliError):
    """The person answered no: a calm line, nothing changed."""

    kind = ErrorKind.ABORTED


class DoctorProblemsError(CliError):
    """`doctor` found problems."""

    kind = ErrorKind.DOCTOR_PROBLEMS


class InterruptedCommandError(CliError):
    """Ctrl-C outside `watch` (Python raises KeyboardInterrupt; the CLI reports this kind)."""

    kind = ErrorKind.INTERRUPTED


# The class of every kind: where several classes share one, the general one a caller raises.
KIND_CLASSES: dict[ErrorKind, type[ShadowpointError]] = {
    cls.kind: cls
    for cls in (
        ShadowpointError, InvalidParamsError, NoWorkspaceError, ProtectedDirectoryError,
        PathOutsideWorkspaceError, UnknownTaskError, UnknownMessageError, InitTimeoutError,
        InitFailedError, CheckpointsDisabledError, UnknownCheckpointError, AmbiguousCheckpointError,
        NoFileSnapshotError, AlreadyRestoredError, NothingToUndoError, RestoreFailedError,
        RestoreConflictError, LockTimeoutError, StorageFailedError, SidecarUnavailableError,
        SidecarRunningError, UsageError, ConfirmationRequiredError, AbortedError, DoctorProblemsError,
        InterruptedCommandError,
    )
}


def cli_error(message: str, kind: str) -> CliError:
    """The `CliError` for `kind`: its own class for a kind only the command line has, else a
    `CliError` carrying `kind` (an engine's or the sidecar's, reported with its exit code)."""
    cls = KIND_CLASSES.get(error_kind(kind))
    if cls is not None and issubclass(cls, CliError):
        return cls(message)
    return CliError(message, kind)
