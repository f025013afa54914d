"""How the CLI and the MCP server reach a workspace's checkpoints: through the sidecar that
already serves the workspace (so a task it holds in memory is changed in one place only),
or through an in-process `Engine` when none runs. Also: finding a workspace's tasks and
naming a checkpoint by position or hash prefix.

Both backends speak the protocol's shapes (`Checkpoint`, `Diff`, `Restore` dicts): the local one
turns the engine's values into them (`to_wire()`), the remote one gets them from the sidecar. Used on
the caller's thread; the in-process engine runs its baseline on its own thread and a
counting thread (`shadowpoint-count`) estimates the baseline's size for progress bars.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import threading
import time
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

from shadowpoint.config import Settings
from shadowpoint.engine import Engine, EngineOptions
from shadowpoint.errors import (
    AmbiguousCheckpointError,
    ShadowpointError,
    UnknownCheckpointError,
    UnknownTaskError,
)
from shadowpoint.events import RoundBegan, RoundEnded, TaskStarted, ToolBegan, ToolEnded
from shadowpoint.kinds import RestoreMode, ToolKind
from shadowpoint.sidecar.client import SidecarClient, connect_live
from shadowpoint.stage.exclusions import ExclusionRules
from shadowpoint.store.checkpoints import CheckpointStore, TaskRecord
from shadowpoint.workspace import workspace_hash

SAVE_TOOL = "shadowpoint-save"


def now_ms() -> int:
    """The wall clock in integer milliseconds (the protocol's `ts`)."""
    return time.time_ns() // 1_000_000


def workspace_root(directory: str | os.PathLike[str] | None) -> Path:
    """The canonical path of a workspace folder (default: the current directory)."""
    return Path(os.path.realpath(os.path.expanduser(str(directory) if directory else os.getcwd())))


def find_workspace(directory: str | os.PathLike[str] | None, docs_dir: Path) -> Path:
    """The workspace a command run in `directory` (default: the current one) means, as git finds
    its repository: the nearest folder upwards that has checkpoints, else the nearest holding a
    `.git`, else `directory` itself. Folders that cannot be workspaces (the home folder, system
    folders: `workspace.refusal`) are passed over.
    """
    from shadowpoint.config import protected_directories
    from shadowpoint.workspace import refusal

    start = workspace_root(directory)
    chain = [start, *start.parents]
    protected = protected_directories()
    usable = [p for p in chain if refusal(p, protected, docs_dir) is None]
    for folder in usable:
        if has_checkpoints(docs_dir, folder):
            return folder
    for folder in usable:
        if os.path.lexists(folder / ".git"):
            return folder
    return start


def has_checkpoints(docs_dir: Path, root: Path) -> bool:
    """Whether `root` has a shadow repository under the docs root (it has had checkpoints)."""
    return (docs_dir / "checkpoints" / workspace_hash(root) / ".git").is_dir()


def kept_checkpoints_hint(folder: str) -> str:
    """What to do about a workspace folder that is gone (an agent's `rm -rf` of its project)
    whose checkpoints are kept: `-C` on it and `doctor` say the same."""
    quoted = shlex.quote(folder)
    return (f"its checkpoints are kept: `mkdir {quoted}`, then `shadowpoint -C {quoted} restore REF --files`, "
            "bring its files back")


def require_checkpoints(docs_dir: Path, root: Path) -> None:
    """Refuse a read-only command on a folder that has no checkpoints (no shadow repo, and no
    sidecar serving it), before an engine is opened there: opening one writes in the docs root.

    Raises:
        UnknownTaskError: the folder has no checkpoints yet.
    """
    if has_checkpoints(docs_dir, root):
        return
    live = connect_live(root)
    if live is not None:
        live.close()
        return
    raise _none_yet(root)


def _none_yet(root: Path) -> UnknownTaskError:
    return UnknownTaskError(
        f"No checkpoints for {root} yet: run `shadowpoint save` or `shadowpoint watch` there first.")


def cli_task_id(root: Path) -> str:
    """The task `shadowpoint watch` and `save` use for a workspace: `cli-<workspace hash>`."""
    return f"cli-{workspace_hash(root)}"


# ---------------------------------------------------------------------------- tasks


def _stamp(value: str) -> float:
    with contextlib.suppress(ValueError):
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    return 0.0


def last_activity(rec: TaskRecord) -> float:
    """When the task last got a checkpoint (or was created), as a POSIX timestamp. Making a fork
    is not activity in it: it shares its source's checkpoints until it gets one of its own, and
    the workspace's default task (and so what `@N` names) stays the source until then."""
    created = [] if rec.forked_from else [_stamp(rec.created_at)]
    return max([*created, *(_stamp(c.created_at) for c in rec.checkpoints)], default=0.0)


def workspace_tasks(docs_dir: Path, root: Path) -> list[TaskRecord]:
    """The tasks whose roots include `root`, most recently active first."""
    store = CheckpointStore(docs_dir)
    out = []
    for task_id in store.task_ids():
        try:
            rec = store.load(task_id)
        except ShadowpointError:
            continue
        if str(root) in rec.roots.values():
            out.append(rec)
    out.sort(key=lambda rec: (last_activity(rec), -_stamp(rec.created_at)), reverse=True)  # a tie: the older
    return out


def default_task(docs_dir: Path, root: Path, *, create: bool = False) -> str:
    """The workspace's one default task, the same for every command: its most recently active
    task; with `create`, `cli-<workspace hash>` when it has none yet (`save`, `watch`).

    Raises:
        UnknownTaskError: the workspace has no task yet (and not `create`).
    """
    tasks = workspace_tasks(docs_dir, root)
    if not tasks:
        if create:
            return cli_task_id(root)
        raise _none_yet(root)
    return tasks[0].task_id


# ---------------------------------------------------------------------------- checkpoint names

_POSITION = re.compile(r"^@?(\d{1,4})$")
_HASH = re.compile(r"^[0-9a-fA-F]{4,40}$")


def looks_like_checkpoint(ref: str) -> bool:
    """Whether `ref` has the shape of a checkpoint name (`@N`, `N`, or 5+ hex digits)."""
    ref = ref.strip()
    m = _POSITION.match(ref)
    if m and (ref.startswith("@") or len(ref) <= 4):
        return True
    return bool(_HASH.match(ref)) and len(ref) >= 5


def by_position(checkpoints: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The checkpoints newest first, each with its `position` (1 = newest), as `list` shows them."""
    ordered = sorted(checkpoints, key=lambda c: int(c["ts"]), reverse=True)
    return [{**c, "position": i} for i, c in enumerate(ordered, start=1)]


def resolve_checkpoint(checkpoints: list[dict[str, Any]], ref: str) -> dict[str, Any]:
    """The checkpoint named by `ref`: `@N` or `N` (1 to 9999, its position in `list`, 1 = newest),
    or a hash prefix of at least 5 hex digits (`@` forces a position, a longer number is a hash).

    A hash shared by several checkpoints (nothing changed between them) names the newest.

    Raises:
        UnknownCheckpointError: nothing matches.
        AmbiguousCheckpointError: the prefix matches several different commits.
    """
    listed = by_position(checkpoints)
    ref = ref.strip()
    m = _POSITION.match(ref)
    if m and (ref.startswith("@") or len(ref) <= 4):
        n = int(m.group(1))
        if 1 <= n <= len(listed):
            return listed[n - 1]
        raise UnknownCheckpointError(f"There is no checkpoint #{n}: the task has {len(listed)}.")
    if not _HASH.match(ref) or len(ref) < 5:
        raise UnknownCheckpointError(
            f"{ref!r} names no checkpoint: use its position in `shadowpoint list` (1 = newest) "
            "or a hash prefix of at least 5 hex digits.")
    prefix = ref.lower()
    matches = [c for c in listed if any(h.startswith(prefix) for h in (c.get("hashes") or {}).values())]
    commits = {h for c in matches for h in (c.get("hashes") or {}).values() if h.startswith(prefix)}
    if not matches:
        raise UnknownCheckpointError(f"No checkpoint of this task has a hash starting with {ref}.")
    if len(commits) > 1:
        raise AmbiguousCheckpointError(
            f"{ref} matches {len(commits)} commits ({', '.join(sorted(c[:10] for c in commits))}); give more digits.")
    return matches[0]


# ---------------------------------------------------------------------------- backends


@dataclass(frozen=True, slots=True)
class Progress:
    """How far a baseline is: files staged so far and the estimated total (None: not known yet)."""

    done: int | None
    total: int | None


class BaselineProgress:
    """Files a baseline has staged so far (the engine's stat caches) and an estimate of the total,
    counted by a walk with the same exclusions on a thread of its own."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._total: int | None = None
        self._stop = threading.Event()
        self._counter: threading.Thread | None = None

    def progress(self) -> Progress:
        if self._counter is None:
            self._counter = threading.Thread(target=self._count, name="shadowpoint-count", daemon=True)
            self._counter.start()
        done = sum(root.tracked_count() for root in self.engine.roots.values())
        return Progress(done, self._total)

    def _count(self) -> None:
        total = 0
        for root in self.engine.roots.values():
            for _ in ExclusionRules(root.ws.root, extra=root.extra).walk():
                total += 1
                if self._stop.is_set():
                    return
        self._total = total

    def close(self) -> None:
        self._stop.set()
        if self._counter is not None:
            self._counter.join()

    def __enter__(self) -> BaselineProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Backend(Protocol):
    """The checkpoint operations of one workspace, local or through its sidecar."""

    root: Path
    remote: bool

    def start_task(self, task_id: str, ts: int) -> dict[str, Any]:
        """`task/start`: start or resume the task; its baseline builds in the background."""
        ...

    def task_state(self, task_id: str) -> dict[str, Any]:
        """The task's `{state, error?}` (`unknown_task` when there is none)."""
        ...

    def progress(self) -> Progress:
        """How far the baseline is (unknown through a sidecar)."""
        ...

    def save(self, task_id: str, ts: int, message: str | None) -> dict[str, Any] | None:
        """A checkpoint now: one command-kind round ending at `ts` (the protocol's `Checkpoint`)."""
        ...

    def list_checkpoints(self, task_id: str) -> dict[str, Any]:
        """`checkpoint/list`: `{checkpoints, state, error?}` in message order."""
        ...

    def diff(self, task_id: str, from_ts: int, to_ts: int | None) -> dict[str, Any]:
        """`checkpoint/diff`: the protocol's `Diff` (to the workspace when `to_ts` is None)."""
        ...

    def restore(self, task_id: str, ts: int, mode: str, paths: list[str] | None = None, dry_run: bool = False,
                keep_outside_edits: bool = False) -> dict[str, Any]:
        """`checkpoint/restore` with mode files, task or both (and the 1.1 options): the protocol's `Restore`."""
        ...

    def undo_restore(self, task_id: str) -> dict[str, Any]:
        """`checkpoint/undoRestore`: walk the undo stack back one file restore."""
        ...

    def redo_restore(self, task_id: str) -> dict[str, Any]:
        """`checkpoint/redoRestore`: walk the undo stack forward one undone restore."""
        ...

    def fork(self, task_id: str, ts: int, new_task_id: str) -> dict[str, Any]:
        """`task/fork`: the fork's newest `Checkpoint`."""
        ...

    def restore_safety(self, task_id: str, n: int, paths: list[str] | None = None, dry_run: bool = False,
                       keep_outside_edits: bool = False) -> dict[str, Any]:
        """The files back to the safety checkpoint of the task's restore `n` (a `Restore`)."""
        ...

    def diff_safety(self, task_id: str, n: int) -> dict[str, Any]:
        """The `Diff` from the safety checkpoint of the task's restore `n` to the workspace."""
        ...

    def delete_task(self, task_id: str) -> None:
        """`task/delete`."""
        ...

    def messages(self, task_id: str) -> dict[int, str]:
        """Message texts by ts (for `list`)."""
        ...

    def add_message(self, task_id: str, ts: int, role: str, text: str) -> None:
        """`message/add` (a note on a checkpoint's ts)."""
        ...

    def close(self) -> None:
        """Close the engine or the connection."""
        ...


class LocalBackend:
    """An in-process engine on one workspace (no watcher: one-shot commands rescan)."""

    remote = False

    def __init__(self, root: Path, settings: Settings, *, watcher: bool = False) -> None:
        self.root = root
        options = replace(EngineOptions.from_settings(settings), watcher=watcher and settings.watcher)
        self.engine = Engine([root], options)
        self.docs_dir = options.docs_dir
        self._progress = BaselineProgress(self.engine)

    def start_task(self, task_id: str, ts: int) -> dict[str, Any]:
        return self.engine.bus.publish(TaskStarted(task_id, ts)).to_wire()

    def task_state(self, task_id: str) -> dict[str, Any]:
        return self.engine.list_checkpoints(task_id).status.to_wire()

    def progress(self) -> Progress:
        return self._progress.progress()

    def save(self, task_id: str, ts: int, message: str | None) -> dict[str, Any] | None:
        bus = self.engine.bus
        bus.publish(RoundBegan(task_id))
        bus.publish(ToolBegan(task_id, SAVE_TOOL, ToolKind.COMMAND, None))
        bus.publish(ToolEnded(task_id, SAVE_TOOL, ToolKind.COMMAND, None, True))
        cp = bus.publish(RoundEnded(task_id, ts))
        if message:
            self.add_message(task_id, ts, "assistant", message)
        return cp.to_wire() if cp is not None else None

    def add_message(self, task_id: str, ts: int, role: str, text: str) -> None:
        self.engine.add_message(task_id, ts, role, text)

    def list_checkpoints(self, task_id: str) -> dict[str, Any]:
        return self.engine.list_checkpoints(task_id).to_wire()

    def diff(self, task_id: str, from_ts: int, to_ts: int | None) -> dict[str, Any]:
        return self.engine.diff(task_id, from_ts, to_ts).to_wire()

    def restore(self, task_id: str, ts: int, mode: str, paths: list[str] | None = None, dry_run: bool = False,
                keep_outside_edits: bool = False) -> dict[str, Any]:
        return self.engine.restore(task_id, ts, RestoreMode(mode), paths, dry_run, keep_outside_edits).to_wire()

    def undo_restore(self, task_id: str) -> dict[str, Any]:
        return self.engine.undo_restore(task_id).to_wire()

    def redo_restore(self, task_id: str) -> dict[str, Any]:
        return self.engine.redo_restore(task_id).to_wire()

    def fork(self, task_id: str, ts: int, new_task_id: str) -> dict[str, Any]:
        return self.engine.fork_task(task_id, ts, new_task_id).to_wire()

    def restore_safety(self, task_id: str, n: int, paths: list[str] | None = None, dry_run: bool = False,
                       keep_outside_edits: bool = False) -> dict[str, Any]:
        return self.engine.restore_safety(task_id, n, paths, dry_run, keep_outside_edits).to_wire()

    def diff_safety(self, task_id: str, n: int) -> dict[str, Any]:
        return self.engine.diff(task_id, None, None, n).to_wire()

    def delete_task(self, task_id: str) -> None:
        self.engine.delete_task(task_id)

    def messages(self, task_id: str) -> dict[int, str]:
        return _messages(self.docs_dir, task_id)

    def close(self) -> None:
        self._progress.close()
        self.engine.close()


class RemoteBackend:
    """The sidecar already serving the workspace (a hook-started sidecar or `shadowpoint watch`)."""

    remote = True

    def __init__(self, root: Path, client: SidecarClient, docs_dir: Path) -> None:
        self.root = root
        self.client = client
        self.docs_dir = docs_dir
        self._call("initialize", {"roots": [str(root)], "client": {"name": "shadowpoint-cli"}})

    def _call(self, method: str, params: dict[str, Any]) -> Any:
        # A refusal arrives as a SidecarError carrying the protocol's `kind`, like a local error.
        return self.client.request(method, params)

    def start_task(self, task_id: str, ts: int) -> dict[str, Any]:
        result: dict[str, Any] = self._call("task/start", {"taskId": task_id, "ts": ts})
        return result

    def task_state(self, task_id: str) -> dict[str, Any]:
        state: dict[str, Any] = self._call("checkpoint/list", {"taskId": task_id})
        state.pop("checkpoints", None)
        return state

    def progress(self) -> Progress:
        return Progress(None, None)

    def save(self, task_id: str, ts: int, message: str | None) -> dict[str, Any] | None:
        self._call("round/begin", {"taskId": task_id})
        self._call("tool/begin", {"taskId": task_id, "tool": SAVE_TOOL, "kind": "command"})
        self._call("tool/end", {"taskId": task_id, "tool": SAVE_TOOL, "kind": "command"})
        result = self._call("round/end", {"taskId": task_id, "ts": ts})
        if message:
            self.add_message(task_id, ts, "assistant", message)
        cp: dict[str, Any] | None = result.get("checkpoint")
        return cp

    def add_message(self, task_id: str, ts: int, role: str, text: str) -> None:
        self._call("message/add", {"taskId": task_id, "ts": ts, "role": role, "text": text})

    def list_checkpoints(self, task_id: str) -> dict[str, Any]:
        result: dict[str, Any] = self._call("checkpoint/list", {"taskId": task_id})
        return result

    def diff(self, task_id: str, from_ts: int, to_ts: int | None) -> dict[str, Any]:
        params: dict[str, Any] = {"taskId": task_id, "from": from_ts}
        if to_ts is not None:
            params["to"] = to_ts
        result: dict[str, Any] = self._call("checkpoint/diff", params)
        return result

    def restore(self, task_id: str, ts: int, mode: str, paths: list[str] | None = None, dry_run: bool = False,
                keep_outside_edits: bool = False) -> dict[str, Any]:
        params: dict[str, Any] = {"taskId": task_id, "ts": ts, "mode": mode, "dryRun": dry_run,
                                  "keepOutsideEdits": keep_outside_edits}
        if paths is not None:
            params["paths"] = list(paths)
        result: dict[str, Any] = self._call("checkpoint/restore", params)
        return result

    def undo_restore(self, task_id: str) -> dict[str, Any]:
        result: dict[str, Any] = self._call("checkpoint/undoRestore", {"taskId": task_id})
        return result

    def redo_restore(self, task_id: str) -> dict[str, Any]:
        result: dict[str, Any] = self._call("checkpoint/redoRestore", {"taskId": task_id})
        return result

    def fork(self, task_id: str, ts: int, new_task_id: str) -> dict[str, Any]:
        result: dict[str, Any] = self._call("task/fork", {"taskId": task_id, "ts": ts, "newTaskId": new_task_id})
        checkpoint: dict[str, Any] = result["checkpoint"]
        return checkpoint

    def restore_safety(self, task_id: str, n: int, paths: list[str] | None = None, dry_run: bool = False,
                       keep_outside_edits: bool = False) -> dict[str, Any]:
        params: dict[str, Any] = {"taskId": task_id, "n": n, "dryRun": dry_run, "keepOutsideEdits": keep_outside_edits}
        if paths is not None:
            params["paths"] = list(paths)
        result: dict[str, Any] = self._call("checkpoint/restoreSafety", params)
        return result

    def diff_safety(self, task_id: str, n: int) -> dict[str, Any]:
        result: dict[str, Any] = self._call("checkpoint/diffSafety", {"taskId": task_id, "n": n})
        return result

    def delete_task(self, task_id: str) -> None:
        self._call("task/delete", {"taskId": task_id})

    def messages(self, task_id: str) -> dict[int, str]:
        return _messages(self.docs_dir, task_id)

    def close(self) -> None:
        self.client.close()


def _messages(docs_dir: Path, task_id: str) -> dict[int, str]:
    """Message texts by ts (read from the task record on disk; empty when unreadable)."""
    try:
        rec = CheckpointStore(docs_dir).load(task_id)
    except ShadowpointError:
        return {}
    return {m.ts: m.text for m in rec.messages if m.text}


def open_backend(root: Path, settings: Settings, *, prefer_sidecar: bool = True) -> Backend:
    """The sidecar serving `root` if one runs (and `prefer_sidecar`), else an in-process engine.

    Raises:
        ShadowpointError: the workspace is refused (no_workspace, protected_directory…).
    """
    docs_dir = settings.resolved_docs_dir()
    if prefer_sidecar:
        client = connect_live(root)
        if client is not None:
            try:
                return RemoteBackend(root, client, docs_dir)
            except ShadowpointError:
                client.close()
                raise
    return LocalBackend(root, settings)
