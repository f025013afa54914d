"""`Restorer`: file and conversation restores of a task, undo, message edits, and the
completion of a restore a crash interrupted.

Each file restore takes a safety checkpoint, writes a journal, plans (`restore.plan_restore`)
and applies through the safe writer, then names the restored workspace by the head ref.
Called by `Engine` on the task's engine thread, task lock held; takes each root's lock.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

import structlog

from shadowpoint.checkpoints import CheckpointRecord, checkpoint_or_raise
from shadowpoint.errors import (
    AlreadyRestoredError,
    CheckpointsDisabledError,
    InvalidParamsError,
    NoFileSnapshotError,
    NothingToUndoError,
    RestoreFailedError,
    ShadowpointError,
    UnknownCheckpointError,
    UnknownMessageError,
)
from shadowpoint.restore import RestorePlan, RestoreStats, apply_plan, plan_restore
from shadowpoint.roots import RootState
from shadowpoint.safe_fs import cleanup_temp_files
from shadowpoint.scanner import StagePlan
from shadowpoint.shadow_repo import TreeEntry, safety_ref, task_ref
from shadowpoint.stat_cache import FileState
from shadowpoint.workspace import RepoPath

if TYPE_CHECKING:
    from shadowpoint.engine import Engine, TaskRuntime

log = structlog.get_logger(__name__)


class Restorer:
    """Restores for the tasks of one engine."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def restore(self, task_id: str, ts: Any, mode: str) -> dict[str, Any]:
        rt = self.engine._task(task_id)
        if mode not in ("files", "task", "both"):
            raise InvalidParamsError(f"mode must be files, task or both, not {mode!r}.")
        with rt.lock:
            cp = checkpoint_or_raise(rt.record, ts)
            if mode == "files":
                if not cp.has_snapshot:
                    raise NoFileSnapshotError(
                        f"The checkpoint at ts={ts} has no file snapshot: only Restore Task is possible.")
                if cp.restored:
                    raise AlreadyRestoredError(
                        f"The files are already restored to ts={ts}; save a new checkpoint first.")
            out: dict[str, Any] = {"files": None, "task": None}
            if mode in ("files", "both"):
                try:
                    if not cp.has_snapshot:
                        raise NoFileSnapshotError(f"The checkpoint at ts={ts} has no file snapshot.")
                    self.engine._wait_ready(rt)
                    out["files"] = self._restore_files(rt, cp)
                    cp.restored = True
                except ShadowpointError as exc:
                    if mode == "files":
                        raise
                    out["error"] = {"kind": exc.kind, "message": str(exc)}
            if mode in ("task", "both"):
                out["task"] = {"keepThrough": self._cut(rt, cp.ts)}
            self.engine._save(rt)
            return out

    def _cut(self, rt: TaskRuntime, keep_through: int) -> int:
        rt.record.cut_after(keep_through)
        rt.recorder = None
        last = rt.record.last_snapshot()
        if last is not None:
            for name, root in self.engine.roots.items():
                commit = last.hashes.get(name)
                if commit:
                    with root.lock.held():
                        root.open().set_ref(task_ref(rt.record.task_id), commit)
        return keep_through

    def _restore_files(self, rt: TaskRuntime, cp: CheckpointRecord,
                       scope_override: dict[str, list[str]] | None = None,
                       target_override: dict[str, str | None] | None = None) -> dict[str, Any]:
        """Safety checkpoint, journal, then the safe writer; marks nothing itself."""
        task_id = rt.record.task_id
        restored: list[str] = []
        deleted: list[str] = []
        errors: list[str] = []
        safety_hashes: dict[str, str] = {}
        undo: dict[str, Any] = {}
        prev = rt.record.last_snapshot()
        locks = [root.lock.held() for root in self.engine.roots.values()]
        with contextlib.ExitStack() as stack:
            for lk in locks:
                stack.enter_context(lk)
            plans: dict[str, RestorePlan] = {}
            for name, root in self.engine.roots.items():
                repo = root.open()
                edited = (scope_override or rt.record.edited).get(name)
                any_edits = any(rt.record.edited.values()) if scope_override is None else True
                current = root.stage(StagePlan(rescan=True, forced=frozenset(RepoPath(p) for p in edited or ())))
                parent = prev.hashes.get(name) if prev else None
                safety = repo.commit(current.tree, [parent] if parent and repo.has_object(parent) else [],
                                     "safety checkpoint before restore", task_id)
                repo.set_ref(safety_ref(task_id), safety)
                root.set_head(current.tree)
                safety_hashes[name] = safety
                if target_override is not None:
                    target_tree = target_override.get(name)
                else:
                    commit = cp.hashes.get(name)
                    if commit is None:
                        continue
                    target_tree = repo.commit_tree(commit)
                target = repo.list_tree(target_tree)
                scope = [RepoPath(p) for p in edited or ()] if any_edits else None
                plans[name] = plan_restore(name, target, {p: s.entry for p, s in root.cache.entries.items()}, scope)
            journal = {"plans": [p.to_json() for p in plans.values()], "safety": safety_hashes}
            self.engine.store.write_journal(task_id, journal)
            for name, plan in plans.items():
                root = self.engine.roots[name]
                stats = self._apply_restore(root, plan, safety_hashes[name], task_id)
                restored += [self.engine.resolver.display(root.ws, p) for p in stats.restored]
                deleted += [self.engine.resolver.display(root.ws, p) for p in stats.deleted]
                errors += [f"{self.engine.resolver.display(root.ws, p)}: {why}" for p, why in stats.failed]
                undo[name] = {"safety": safety_hashes[name], "paths": [op.path for op in plan.ops]}
            self.engine.store.clear_journal(task_id)
        rt.record.last_restore = undo
        log.info("restore.applied", task_id=task_id, ts=cp.ts, restored=len(restored), deleted=len(deleted),
                 failed=len(errors))
        if errors:
            raise RestoreFailedError(f"Some files could not be restored: {'; '.join(errors[:5])}")
        return {"restored": restored, "deleted": deleted, "safety": safety_hashes[self.engine.first_root]}

    def _apply_restore(self, root: RootState, plan: RestorePlan, safety: str | None, task_id: str) -> RestoreStats:
        """Write the plan's files, then make the head name what the workspace now holds
        (for other processes and restarts). Lock held."""
        repo = root.open()
        stats = apply_plan(root.ws.root, repo, plan)
        self._mirror_restore(root, plan)
        root.set_head(root.cache.tree)
        root.save_cache()
        return stats

    @staticmethod
    def _mirror_restore(root: RootState, plan: RestorePlan) -> None:
        """The tracked set now holds what the restore wrote (stat unknown: re-verified on rescan)."""
        changes: dict[RepoPath, TreeEntry | None] = {}
        for op in plan.ops:
            changes[op.path] = op.entry
            if op.entry is None:
                root.cache.remove(op.path)
            else:
                root.cache.set(op.path, FileState.unknown(op.entry))
        if changes:
            assert root.repo is not None
            root.cache.tree = root.repo.patch_tree(root.cache.tree, changes)

    def recover(self, rt: TaskRuntime) -> None:
        """Complete a restore that a crash interrupted (roll forward from the journal)."""
        journal = self.engine.store.read_journal(rt.record.task_id)
        if not journal:
            return
        log.warning("restore.recovering", task_id=rt.record.task_id)
        for data in journal.get("plans", []):
            plan = RestorePlan.from_json(data)
            root = self.engine.roots.get(plan.root)
            if root is None:
                continue
            with root.lock.held():
                cleanup_temp_files(root.ws.root, [op.path for op in plan.ops])
                self._apply_restore(root, plan, (journal.get("safety") or {}).get(plan.root), rt.record.task_id)
        safety = journal.get("safety") or {}
        rt.record.last_restore = {
            p["root"]: {"safety": safety.get(p["root"]), "paths": [op[0] for op in p["ops"]]}
            for p in journal.get("plans", [])
        }
        self.engine.store.clear_journal(rt.record.task_id)
        self.engine._save(rt)

    def undo_restore(self, task_id: str) -> dict[str, Any]:
        rt = self.engine._task(task_id)
        with rt.lock:
            undo = rt.record.last_restore
            if not undo:
                raise NothingToUndoError(f"Task {task_id} has no file restore to undo.")
            scope: dict[str, list[str]] = {}
            targets: dict[str, str | None] = {}
            for name, info in undo.items():
                root = self.engine.roots.get(name)
                if root is None or not info.get("safety"):
                    continue
                with root.lock.held():
                    targets[name] = root.open().commit_tree(info["safety"])
                scope[name] = list(info.get("paths", []))
            marker = rt.record.last_snapshot() or rt.record.checkpoints[0]
            files = self._restore_files(rt, marker, scope_override=scope, target_override=targets)
            rt.record.last_restore = None
            self.engine._save(rt)
            return {"files": files, "task": None}

    def edit_message(self, task_id: str, ts: Any, text: Any, restore: str) -> dict[str, Any]:
        rt = self.engine._task(task_id)
        with rt.lock:
            msg = rt.record.message(ts) if isinstance(ts, int) else None
            if msg is None:
                raise UnknownMessageError(f"Task {task_id} has no message at ts={ts!r}.")
            if msg.text is not None and msg.text == text:
                return {"files": None, "task": None, "text": text}
            earlier = [t for t in rt.record.timeline_ts() if t < ts]
            keep_through = earlier[-1] if earlier else ts - 1
            out: dict[str, Any] = {"files": None, "task": None, "text": text}
            if restore == "all":
                if rt.state != "ready":
                    raise CheckpointsDisabledError(
                        f"Restore All is not available while task {task_id} shows a checkpoint error.")
                candidates = [c for c in rt.record.checkpoints if c.ts <= ts and c.has_snapshot]
                if not candidates:
                    raise UnknownCheckpointError(f"No checkpoint at or before ts={ts} to restore files to.")
                cp = candidates[-1]
                try:
                    out["files"] = self._restore_files(rt, cp)
                    cp.restored = True
                except ShadowpointError as exc:
                    out["error"] = {"kind": exc.kind, "message": str(exc)}
            out["task"] = {"keepThrough": self._cut(rt, keep_through)}
            self.engine._save(rt)
            return out
