"""Storage: what each workspace and task uses, retention limits, and garbage collection.

Reads `<docs-root>/checkpoints/*/.git` and `<docs-root>/tasks/*/` for `shadowpoint
storage` and the engine's retention pass; collecting garbage holds each repo's workspace
lock. Called from the CLI, or from a background thread of the engine after a task is
deleted or a baseline is built.
"""

from __future__ import annotations

import contextlib
import shutil
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import structlog

from shadowpoint.errors import ShadowpointError
from shadowpoint.store.checkpoints import CheckpointStore, TaskRecord
from shadowpoint.store.locking import WorkspaceLock, sole_user
from shadowpoint.store.shadow_repo import ShadowRepo, delete_task_refs, disk_usage, task_tips
from shadowpoint.store.values import HEAD_REF
from shadowpoint.workspace import workspace_hash

log = structlog.get_logger(__name__)

# beside the checkpoints folder: every engine holds a shared lock on it while it runs
USERS_FILE = "checkpoints.users"
PENDING_FILE = "shadowpoint-gc-pending"  # in a shadow git dir: a deleted task's objects await collection


def mark_collection_pending(git_dir: Path) -> None:
    """Note that `git_dir` holds objects a deleted task freed (cleared by `collect_garbage`)."""
    with contextlib.suppress(OSError):
        (git_dir / PENDING_FILE).touch()


def collection_pending(git_dir: Path) -> bool:
    return (git_dir / PENDING_FILE).exists()


@dataclass(frozen=True, slots=True)
class RetentionLimits:
    """Tasks beyond these are deleted, oldest first (favourites and open tasks are kept)."""

    max_age_days: float | None = None
    max_tasks: int | None = None
    max_bytes: int | None = None

    @property
    def is_unlimited(self) -> bool:
        return self.max_age_days is None and self.max_tasks is None and self.max_bytes is None


def _git_dirs(docs_dir: Path) -> list[Path]:
    root = docs_dir / "checkpoints"
    if not root.is_dir():
        return []
    return sorted(d / ".git" for d in root.iterdir() if (d / ".git" / "objects").is_dir())


def _records(docs_dir: Path) -> list[TaskRecord]:
    store = CheckpointStore(docs_dir)
    out = []
    for task_id in store.task_ids():
        with contextlib.suppress(ShadowpointError):
            out.append(store.load(task_id))
    return out


def _last_activity(rec: TaskRecord) -> datetime:
    stamps = [rec.created_at, *(c.created_at for c in rec.checkpoints)]
    parsed = []
    for s in stamps:
        with contextlib.suppress(ValueError):
            parsed.append(datetime.fromisoformat(s.replace("Z", "+00:00")))
    return max(parsed) if parsed else datetime.now(UTC)


def storage_report(docs_dir: Path, *, per_task_objects: bool = True) -> dict[str, Any]:
    """Disk use of every workspace's shadow repo and of every task.

    A task's `uniqueBytes` is the uncompressed size of the objects only its refs reach:
    what deleting it (and collecting garbage) would free, before compression.
    """
    records = _records(docs_dir)
    by_hash: dict[str, list[TaskRecord]] = {}
    for rec in records:
        for root in rec.roots.values():
            by_hash.setdefault(workspace_hash(Path(root)), []).append(rec)
    workspaces = []
    for git_dir in _git_dirs(docs_dir):
        h = git_dir.parent.name
        tasks = by_hash.get(h, [])
        entry: dict[str, Any] = {"workspaceHash": h, "shadowGitDir": str(git_dir), "bytes": disk_usage(git_dir),
                                 "worktree": None, "tasks": [], "collectionPending": collection_pending(git_dir)}
        try:
            repo = ShadowRepo.open_existing(git_dir)
        except ShadowpointError as exc:
            entry["error"] = str(exc)
            workspaces.append(entry)
            continue
        try:
            entry["worktree"] = str(repo.worktree)
            reach: dict[str, set[str]] = {}
            if per_task_objects:
                for rec in tasks:
                    reach[rec.task_id] = repo.reachable_objects(task_tips(repo, rec.task_id))
                head = repo.read_ref(HEAD_REF)
                shared = repo.reachable_objects([head]) if head else set()
            for rec in tasks:
                row: dict[str, Any] = {
                    "taskId": rec.task_id,
                    "checkpoints": len(rec.checkpoints),
                    "metadataBytes": disk_usage(CheckpointStore(docs_dir).task_dir(rec.task_id)),
                    "lastActivity": _last_activity(rec).isoformat(),
                }
                if per_task_objects:
                    others: set[str] = set(shared)
                    for other, objs in reach.items():
                        if other != rec.task_id:
                            others |= objs
                    unique = reach[rec.task_id] - others
                    row["objects"] = len(reach[rec.task_id])
                    row["uniqueBytes"] = sum(repo.object_size(o) for o in unique)
                entry["tasks"].append(row)
        finally:
            repo.close()
        workspaces.append(entry)
    total = sum(w["bytes"] for w in workspaces) + disk_usage(docs_dir / "tasks")
    return {"docsDir": str(docs_dir), "totalBytes": total, "workspaces": workspaces,
            "tasks": len(records)}


def collect_garbage(docs_dir: Path, *, grace_s: float = 3600.0, lock_timeout_s: float = 300.0,
                    only: Iterable[Path] | None = None,
                    locks: Mapping[Path, WorkspaceLock] | None = None,
                    progress: Callable[[Path, int, int], None] | None = None,
                    pause: Callable[[], None] | None = None) -> dict[str, Any]:
    """Drop unreachable objects from every shadow repo (or those in `only`).

    The long part (reachability, writing the packs) runs without the workspace lock; it is
    held only to remove packs and objects. `locks` gives the lock objects of this process's
    engine (a second flock on the same file in one process would conflict). `progress(git
    dir, objects written, objects to write)` follows each repo's packing. A repo's "pending"
    mark (`mark_collection_pending`) is cleared when its collection completes. `pause` is
    called between batches of objects (`ShadowRepo.collect_garbage`).
    """
    out: dict[str, Any] = {}
    wanted = {Path(p) for p in only} if only is not None else None
    for git_dir in _git_dirs(docs_dir):
        if wanted is not None and git_dir not in wanted:
            continue
        lock = (locks or {}).get(git_dir) or WorkspaceLock(git_dir.parent / "shadowpoint.lock", lock_timeout_s)
        start = time.perf_counter()
        repo = ShadowRepo.open_existing(git_dir)
        step = None if progress is None else (lambda done, total, g=git_dir: progress(g, done, total))
        try:
            kept, freed = repo.collect_garbage(grace_s, locked=lock.held, progress=step, pause=pause)
        finally:
            repo.close()
        with contextlib.suppress(OSError):
            (git_dir / PENDING_FILE).unlink()
        out[git_dir.parent.name] = {"kept": kept, "freedBytes": freed,
                                    "durationMs": round((time.perf_counter() - start) * 1e3, 1)}
    return out


def apply_retention(docs_dir: Path, limits: RetentionLimits, *, protect: Iterable[str] = ()) -> list[str]:
    """Delete the oldest tasks beyond the limits (never those in `protect`); returns their ids.

    Deleting a task removes its folder and its refs; objects are freed by the next
    `collect_garbage`.
    """
    if limits.is_unlimited:
        return []
    keep = set(protect)
    records = sorted(_records(docs_dir), key=_last_activity)
    victims: list[TaskRecord] = []
    now = datetime.now(UTC)
    if limits.max_age_days is not None:
        victims += [r for r in records if (now - _last_activity(r)).total_seconds() > limits.max_age_days * 86400]
    remaining = [r for r in records if r not in victims]
    if limits.max_tasks is not None and len(remaining) > limits.max_tasks:
        victims += remaining[: len(remaining) - limits.max_tasks]
        remaining = remaining[len(remaining) - limits.max_tasks:]
    if limits.max_bytes is not None:
        total = sum(disk_usage(g) for g in _git_dirs(docs_dir))
        for rec in list(remaining):
            if total <= limits.max_bytes or len(remaining) <= 1:
                break
            victims.append(rec)
            remaining.remove(rec)
            total -= _estimate(rec, docs_dir)
    deleted = []
    for rec in victims:
        if rec.task_id in keep:
            continue
        delete_task_storage(docs_dir, rec)
        deleted.append(rec.task_id)
    if deleted:
        log.info("storage.retention_applied", deleted=len(deleted))
    return deleted


def _estimate(rec: TaskRecord, docs_dir: Path) -> int:
    report = storage_report(docs_dir)
    for ws in report["workspaces"]:
        for t in ws["tasks"]:
            if t["taskId"] == rec.task_id:
                return int(t.get("uniqueBytes", 0))
    return 0


def delete_task_storage(docs_dir: Path, rec: TaskRecord) -> list[Path]:
    """Remove a task's refs from its shadow repos and its folder (the repos stay).

    Fast whatever the repo's size: the objects it alone reached stay until the next
    `collect_garbage` (each repo is marked pending). Returns the shadow git dirs touched.
    """
    touched: list[Path] = []
    for root in rec.roots.values():
        git_dir = docs_dir / "checkpoints" / workspace_hash(Path(root)) / ".git"
        if not git_dir.is_dir():
            continue
        with WorkspaceLock(git_dir.parent / "shadowpoint.lock").held():
            try:
                repo = ShadowRepo.open_existing(git_dir)
            except ShadowpointError:
                continue
            try:
                delete_task_refs(repo, rec.task_id)
            finally:
                repo.close()
            mark_collection_pending(git_dir)
            touched.append(git_dir)
    CheckpointStore(docs_dir).delete(rec.task_id)
    return touched


def remove_all_checkpoints(docs_dir: Path) -> bool:
    """Remove the checkpoints folder, unless a running engine (a sidecar, `watch`) uses it:
    its shadow repositories may hold a task whose record is not written yet. True if removed."""
    with sole_user(docs_dir / USERS_FILE) as sole:
        if not sole:
            log.info("storage.checkpoints_kept", docs_dir=str(docs_dir), reason="another process uses them")
            return False
        shutil.rmtree(docs_dir / "checkpoints", ignore_errors=True)
        return True
