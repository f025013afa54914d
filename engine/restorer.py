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
    RepoError,
    RestoreFailedError,
    ShadowpointError,
    UnknownCheckpointError,
    UnknownMessageError,
)
from shadowpoint.restore import RestorePlan, RestoreStats, apply_plan, keep_skipped, plan_restore, withhold
from shadowpoint.roots import RootState
from shadowpoint.safe_fs import cleanup_temp_files
from shadowpoint.scanner import SkipReason
from shadowpoint.shadow_repo import MODE_TREE, TreeEntry, safety_ref, task_ref
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
                    out["files"] = self._restore_files(rt, cp, mark=cp)
                except ShadowpointError as exc:
                    if mode == "files":
                        raise
                    out["error"] = {"kind": exc.kind, "message": str(exc)}
            if mode in ("task", "both"):
                out["task"] = {"keepThrough": self._cut(rt, cp.ts)}
            if mode != "files":
                self.engine._save(rt)  # a files restore saved its record (and mark) already
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
                       target_override: dict[str, str | None] | None = None,
                       keep_undo: bool = True, mark: CheckpointRecord | None = None) -> dict[str, Any]:
        """Safety checkpoint, journal, then the safe writer; marks `mark` restored in the same
        record write as the undo record."""
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
                current = root.stage(root.safety_plan(frozenset(RepoPath(p) for p in edited or ())))
                parent = prev.hashes.get(name) if prev else None
                safety = repo.commit(current.tree, [parent] if parent and repo.has_object(parent) else [],
                                     "safety checkpoint before restore", task_id)
                repo.set_ref(safety_ref(task_id), safety)
                root.set_head(current.tree)
                safety_hashes[name] = safety
                try:
                    if target_override is not None:
                        target_tree = target_override.get(name)
                    else:
                        commit = cp.hashes.get(name)
                        if commit is None:
                            continue
                        target_tree = repo.commit_tree(commit)
                    scope = [RepoPath(p) for p in edited or ()] if any_edits else None
                    target, here = self._restore_inputs(root, target_tree, scope)
                    # a file or link standing where a folder of the target goes is replaced:
                    # plan_restore names it (deleted), so an undo puts it back
                    for path in list(target):
                        parts = path.split("/")
                        for i in range(1, len(parts)):
                            above = root.cache.entry(RepoPath("/".join(parts[:i])))
                            if above is not None:
                                here[RepoPath("/".join(parts[:i]))] = above
                except RepoError as exc:
                    root.mark_damaged()
                    raise RestoreFailedError(
                        f"The checkpoint at ts={cp.ts} can no longer be restored: the shadow repository lost "
                        f"objects it needs ({exc}). Nothing was changed.") from exc
                plans[name] = plan_restore(name, target, here, scope)
                # files the safety checkpoint skipped (over the size cap, unreadable) are left alone
                unsaved = [s.path for s in current.stats.skipped if s.reason is not SkipReason.VANISHED]
                if target_override is None:
                    # and a file the checkpoint left out (too big then) existed then: never deleted
                    plans[name] = keep_skipped(plans[name], self._skipped_in(cp, root))
                plans[name], held = withhold(plans[name], unsaved)
                why = {s.path: s.reason.value for s in current.stats.skipped}
                errors += [f"{self.engine.resolver.display(root.ws, p)}: left as it is, since the safety checkpoint "
                           f"could not save what is there ({why.get(p, 'a file in its way')}); move it aside and "
                           "restore again" for p in held]
                # Every blob is checked before any file is written, so a checkpoint with lost
                # objects fails whole instead of leaving a half-restored workspace.
                lost = [op.path for op in plans[name].ops if op.entry is not None and not repo.has_object(op.entry.oid)]
                if lost:
                    root.mark_damaged()
                    raise RestoreFailedError(
                        f"The checkpoint at ts={cp.ts} can no longer be restored: the shadow repository lost "
                        f"the content of {len(lost)} file(s) ({', '.join(lost[:3])}). Nothing was changed.")
            journal = {"plans": [p.to_json() for p in plans.values()], "safety": safety_hashes}
            self.engine.store.write_journal(task_id, journal)
            for name, plan in plans.items():
                root = self.engine.roots[name]
                stats = self._apply_restore(root, plan, safety_hashes[name], task_id)
                restored += [self.engine.resolver.display(root.ws, p) for p in stats.restored]
                deleted += [self.engine.resolver.display(root.ws, p) for p in stats.deleted]
                errors += [f"{self.engine.resolver.display(root.ws, p)}: {why}" for p, why in stats.failed]
                undo[name] = {"safety": safety_hashes[name], "paths": [op.path for op in plan.ops]}
            # The undo record is saved before the journal goes: a kill between the two left a
            # finished restore that could not be undone (tests/faults/test_crashes.py).
            rt.record.last_restore = undo if keep_undo else None
            if mark is not None and not errors:
                mark.restored = True  # a partly failed restore may be tried again
            self.engine._save(rt)
            self.engine.store.clear_journal(task_id)
        log.info("restore.applied", task_id=task_id, ts=cp.ts, restored=len(restored), deleted=len(deleted),
                 failed=len(errors))
        if errors:
            raise RestoreFailedError(f"Some files could not be restored: {'; '.join(errors[:5])}")
        return {"restored": restored, "deleted": deleted, "safety": safety_hashes[self.engine.first_root]}

    @staticmethod
    def _restore_inputs(root: RootState, target_tree: str | None, scope: list[RepoPath] | None
                        ) -> tuple[dict[RepoPath, TreeEntry], dict[RepoPath, TreeEntry]]:
        """The target's and the current snapshot's entries that the restore may touch, found
        in O(scope) or O(changes), never by listing the whole workspace (lock held)."""
        repo = root.open()
        cache = root.cache
        target: dict[RepoPath, TreeEntry] = {}
        here: dict[RepoPath, TreeEntry] = {}
        if scope is None:
            # reset every tracked file: only what differs between the two trees matters
            for d in repo.diff_trees(cache.tree, target_tree, renames=False):
                for path, oid, mode in ((d.path, d.new_oid, d.new_mode), (d.old_path or d.path, None, None)):
                    if oid is not None and mode is not None:
                        target[path] = TreeEntry(oid, mode)
                    known = cache.entry(path)
                    if known is not None:
                        here[path] = known
            return target, here
        for path in scope:
            want = repo.lookup(target_tree, path)
            if want is not None and want.mode == MODE_TREE:
                target.update(repo.list_tree(want.oid, prefix=path + "/"))
            elif want is not None:
                target[path] = want
            known = cache.entry(path)
            if known is not None:
                here[path] = known
            for below in cache.under(path):
                entry = cache.entry(below)
                if entry is not None:
                    here[below] = entry
        return target, here

    def _skipped_in(self, cp: CheckpointRecord, root: RootState) -> set[RepoPath]:
        """The paths of `root` that checkpoint `cp` left out although they existed (its warnings)."""
        shown = {w.get("path") for w in cp.warnings if w.get("reason") != SkipReason.VANISHED.value}
        if not self.engine.resolver.multi:
            return {RepoPath(p) for p in shown if p}
        prefix = root.ws.name + "/"
        return {RepoPath(p[len(prefix):]) for p in shown if p and p.startswith(prefix)}

    def _apply_restore(self, root: RootState, plan: RestorePlan, safety: str | None, task_id: str) -> RestoreStats:
        """Write the plan's files, then make the head name what the workspace now holds
        (for other processes and restarts). Lock held."""
        repo = root.open()
        stats = apply_plan(root.ws.root, repo, plan)
        self._mirror_restore(root, plan)
        root.set_head(root.cache.tree)
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
            root.note_tracked(changes)

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
        self.engine._save(rt)  # before the journal goes: a kill between keeps the undo record
        self.engine.store.clear_journal(rt.record.task_id)

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
                    try:
                        targets[name] = root.open().commit_tree(info["safety"])
                    except RepoError as exc:
                        raise RestoreFailedError(
                            f"The last restore of task {task_id} cannot be undone: its safety checkpoint "
                            f"is lost from the shadow repository ({exc}).") from exc
                scope[name] = list(info.get("paths", []))
            marker = rt.record.last_snapshot() or rt.record.checkpoints[0]
            files = self._restore_files(rt, marker, scope_override=scope, target_override=targets, keep_undo=False)
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

