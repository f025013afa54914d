"""`Restorer`: file and conversation restores of a task, the undo/redo stack, message edits,
and the completion of a restore a crash interrupted.

A file restore stages the workspace (its safety checkpoint), plans (`restore.plan_restore`,
then `restore.keep_outside_edits` when asked), and, unless it is a dry run, commits the safety
checkpoint and the after-state under a ref of the task, writes a journal, applies through the
safe writer and records the restore on the task's undo stack. Called by `Engine` on the task's
engine thread, task lock held; takes each root's lock (`RootState.locked`). What it needs of the
engine is named by `RestoreHost`, which the engine passes in.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import structlog

from shadowpoint.errors import (
    AlreadyRestoredError,
    CheckpointsDisabledError,
    InvalidParamsError,
    NoFileSnapshotError,
    NothingToUndoError,
    RepoError,
    RestoreConflictError,
    RestoreFailedError,
    ShadowpointError,
    UnknownCheckpointError,
    UnknownMessageError,
)
from shadowpoint.kinds import CheckpointKind, EditRestore, RestoreMode, TaskState
from shadowpoint.restore.plan import (
    RestorePlan,
    RestoreStats,
    apply_plan,
    exactly,
    in_the_way,
    keep_outside_edits,
    keep_skipped,
    plan_restore,
    prepare_root,
    withhold,
)
from shadowpoint.restore.safe_fs import cleanup_temp_files
from shadowpoint.results import FilesRestored, KindError, Restore
from shadowpoint.roots import LockedRoot, RootState
from shadowpoint.stage.scanner import SkipReason, StageResult
from shadowpoint.stage.stat_cache import unknown_state
from shadowpoint.store.checkpoints import CheckpointRecord, CheckpointStore, checkpoint_or_raise, now_iso
from shadowpoint.store.values import MODE_TREE, TreeEntry, restore_ref, task_ref
from shadowpoint.workspace import PathResolver, RepoPath, folders_above

if TYPE_CHECKING:
    from shadowpoint.engine import TaskRuntime
    from shadowpoint.store.shadow_repo import ShadowRepo

log = structlog.get_logger(__name__)

_RESTORE_MODES = frozenset(RestoreMode)


@dataclass(frozen=True, slots=True)
class RestoreHost:
    """What a restore needs of the engine that owns it, and nothing more.

    Attributes:
        roots: the engine's roots by name (each root's lock and repository: `RootState.locked`).
        resolver: shows workspace paths as the protocol names them, resolves requested ones.
        store: the task records on disk (the restore journal).
        first_root: the name of the first root (whose safety checkpoint a restore reports).
        task: the runtime of a task id, loaded or resumed (UnknownTaskError).
        wait_ready: blocks until the task's baseline is built; False if its checkpoints are off.
        save: writes the task's whole record.
        append: writes what changed in the task's record since its last write (task.log).
        resolve_paths: requested paths as (root name, root-relative path) pairs; a root itself
            is "" (every file of that root)
            (PathOutsideWorkspaceError).
    """

    roots: Mapping[str, RootState]
    resolver: PathResolver
    store: CheckpointStore
    first_root: str
    task: Callable[[Any], TaskRuntime]
    wait_ready: Callable[[TaskRuntime], bool]
    save: Callable[[TaskRuntime], None]
    append: Callable[[TaskRuntime], None]
    resolve_paths: Callable[[Iterable[Any] | None], list[tuple[str, str]]]


@dataclass(frozen=True, slots=True)
class RestoreRequest:
    """What one file restore is asked to do (the protocol's `checkpoint/restore` options).

    Attributes:
        paths: per root, only these paths (None: the task's scope).
        dry_run: plan only; write nothing.
        keep_outside_edits: merge instead of overwriting outside edits.
        targets: per root, the tree to restore to instead of the checkpoint's (undo, redo).
        op: restore, undo or redo (for the task's history and undo stack).
        of: the restore an undo or redo acts on.
    """

    paths: dict[str, list[RepoPath]] | None = None
    dry_run: bool = False
    keep_outside_edits: bool = False
    targets: dict[str, str | None] | None = None
    op: str = "restore"
    of: int | None = None


@dataclass(slots=True)
class _RootPlan:
    plan: RestorePlan
    safety_tree: str | None
    merged: list[RepoPath] = field(default_factory=list)
    conflicts: list[RepoPath] = field(default_factory=list)
    held: list[str] = field(default_factory=list)  # why paths the plan leaves alone are left
    # what is in the way of an undo's or redo's paths, made since its restore: refused whole
    in_way: list[str] = field(default_factory=list)
    # a merged file's content in the checkpoint: the task's own part of what the merge wrote,
    # its base from now on (the person's edits in the merge stay outside edits)
    theirs: dict[RepoPath, TreeEntry | None] = field(default_factory=dict)
    after_tree: str | None = None  # the safety tree with the plan's writes (`_commit_states`)


class Restorer:
    """Restores for the tasks of one engine."""

    def __init__(self, host: RestoreHost) -> None:
        self.host = host

    def restore(self, task_id: str, ts: int, mode: RestoreMode, paths: Iterable[str] | None = None,
                dry_run: bool = False, keep_outside_edits: bool = False) -> Restore:
        rt = self.host.task(task_id)
        if mode not in _RESTORE_MODES:  # the edges check too; a library caller may pass any string
            raise InvalidParamsError(f"mode must be files, task or both, not {mode!r}.")
        mode = RestoreMode(mode)
        named = self._named_paths(paths)
        with rt.lock:
            cp = checkpoint_or_raise(rt.record, ts)
            if mode is RestoreMode.FILES:
                if not cp.has_snapshot:
                    raise NoFileSnapshotError(
                        f"The checkpoint at ts={ts} has no file snapshot: only Restore Task is possible.")
                if cp.restored and named is None:
                    raise AlreadyRestoredError(
                        f"The files are already restored to ts={ts}; save a new checkpoint first.")
            files: FilesRestored | None = None
            error: KindError | None = None
            keep_through: int | None = None
            if mode in (RestoreMode.FILES, RestoreMode.BOTH):
                request = RestoreRequest(paths=named, dry_run=dry_run, keep_outside_edits=keep_outside_edits)
                try:
                    if not cp.has_snapshot:
                        raise NoFileSnapshotError(f"The checkpoint at ts={ts} has no file snapshot.")
                    self.host.wait_ready(rt)
                    # a restore of chosen paths does not put the files at the checkpoint: no mark
                    files = self._restore_files(rt, cp, request, mark=cp if named is None else None)
                except ShadowpointError as exc:
                    if mode is RestoreMode.FILES:
                        raise
                    error = error_value(exc)
            if mode in (RestoreMode.TASK, RestoreMode.BOTH):
                keep_through = cp.ts if dry_run else self._cut(rt, cp.ts)
            if mode is not RestoreMode.FILES and not dry_run:
                self.host.save(rt)  # a files restore saved its record (and mark) already
            return Restore(files, keep_through, error)

    def _named_paths(self, paths: Iterable[str] | None) -> dict[str, list[RepoPath]] | None:
        """`paths` of a request by root (path_outside_workspace for anything else)."""
        if paths is None:
            return None
        out: dict[str, list[RepoPath]] = {name: [] for name in self.host.roots}
        for root_name, path in self.host.resolve_paths(list(paths)):
            out[root_name].append(RepoPath(path))
        return out

    def _cut(self, rt: TaskRuntime, keep_through: int) -> int:
        rt.record.cut_after(keep_through)
        rt.recorder = None
        last = rt.record.last_snapshot()
        if last is not None:
            for name, root in self.host.roots.items():
                commit = last.hashes.get(name)
                if commit:
                    with root.locked() as r:
                        r.repo.set_ref(task_ref(rt.record.task_id), commit)
        return keep_through

    # ------------------------------------------------------------------ files

    def _restore_files(self, rt: TaskRuntime, cp: CheckpointRecord, request: RestoreRequest | None = None,
                       mark: CheckpointRecord | None = None) -> FilesRestored:
        """Plan the restore on every root; unless a dry run, write it: safety checkpoint and
        after-state under a ref, journal, the safe writer, the undo stack and `mark` restored,
        in one record write."""
        request = request or RestoreRequest()
        task_id = rt.record.task_id
        with contextlib.ExitStack() as stack:
            locked = {name: stack.enter_context(root.locked()) for name, root in self.host.roots.items()}
            plans: dict[str, _RootPlan] = {}
            try:
                with contextlib.ExitStack() as held:
                    for root in locked.values():  # the safety checkpoint's blobs: in the pack of the restore's ref
                        held.enter_context(root.repo.blobs_for_ref())
                    for name, root in locked.items():
                        if (planned := self._plan_root(rt, cp, request, name, root)) is not None:
                            plans[name] = planned
                    conflicts = [self.host.resolver.display(self.host.roots[name].ws, path)
                                 for name, p in plans.items() for path in p.conflicts]
                    if request.dry_run:
                        self._head_to_safety(plans, locked)
                        return self._dry_answer(plans, conflicts)
                    if in_way := [why for p in plans.values() for why in p.in_way]:
                        more = " …" if len(in_way) > 5 else ""
                        raise RestoreFailedError(
                            f"The {request.op} cannot put back {', '.join(in_way[:5])}{more}: what is in the "
                            f"way was made after restore {request.of}, which did not touch it. Nothing was "
                            f"changed; move it aside and {request.op} again.")
                    if conflicts:
                        raise RestoreConflictError(
                            f"The restore would overwrite edits made outside the task's rounds that it cannot merge "
                            f"({', '.join(conflicts[:5])}{' …' if len(conflicts) > 5 else ''}); nothing was changed. "
                            "Restore without keeping outside edits, or name other paths.", conflicts)
                    for name, p in plans.items():  # a root that is gone: made again before anything is written
                        prepare_root(locked[name].ws.root, p.plan)
                    entry = self._commit_states(rt, cp, request, plans, locked)
            except BaseException:
                self._head_to_safety(plans, locked)
                raise
            journal = {"plans": [p.plan.to_json() for p in plans.values()], "entry": entry}
            self.host.store.write_journal(task_id, journal)
            restored: list[str] = []
            deleted: list[str] = []
            merged: list[str] = []
            errors = [why for p in plans.values() for why in p.held]
            for name, p in plans.items():
                root = locked[name]
                stats = self._apply_restore(root, p.plan, (p.safety_tree, p.after_tree))
                show = self._shower(root)
                merged_here = set(p.merged)
                restored += [show(q) for q in stats.restored if q not in merged_here]
                merged += [show(q) for q in stats.restored if q in merged_here]
                deleted += [show(q) for q in stats.deleted]
                errors += [f"{show(q)}: {why}" for q, why in stats.failed]
            # The undo stack is written before the journal goes: a kill between the two left a
            # finished restore that could not be undone (tests/faults/test_crashes.py). A partly
            # failed restore does not mark its checkpoint: it may be tried again.
            rt.record.record_restore(entry, mark.ts if mark is not None and not errors else None)
            self.host.append(rt)
            self.host.store.clear_journal(task_id)
        log.info("restore.applied", task_id=task_id, ts=cp.ts, op=request.op, restored=len(restored),
                 deleted=len(deleted), merged=len(merged), failed=len(errors))
        if errors:
            raise RestoreFailedError(f"Some files could not be restored: {'; '.join(errors[:5])}")
        safety = (entry["roots"].get(self.host.first_root, {}).get("safety")
                  or next((r["safety"] for r in entry["roots"].values()), None))
        return FilesRestored(tuple(restored), tuple(deleted), tuple(merged), safety)

    def _shower(self, root: RootState | LockedRoot) -> Callable[[RepoPath], str]:
        return lambda path: self.host.resolver.display(root.ws, path)

    def _dry_answer(self, plans: dict[str, _RootPlan], conflicts: list[str]) -> FilesRestored:
        """The `Restore.files` the same restore would answer (apply_plan's order), writing nothing."""
        restored: list[str] = []
        deleted: list[str] = []
        merged: list[str] = []
        for name, p in plans.items():
            show = self._shower(self.host.roots[name])
            merged_here = set(p.merged)
            deletes = sorted((op for op in p.plan.ops if op.entry is None), key=lambda o: o.path.count("/"),
                             reverse=True)
            deleted += [show(op.path) for op in deletes]
            for op in p.plan.ops:
                if op.entry is not None:
                    (merged if op.path in merged_here else restored).append(show(op.path))
        return FilesRestored(tuple(restored), tuple(deleted), tuple(merged), None, tuple(conflicts))

    def _plan_root(self, rt: TaskRuntime, cp: CheckpointRecord, request: RestoreRequest, name: str,
                   root: LockedRoot) -> _RootPlan | None:
        """Stage the workspace (the safety state) and plan this root's part.

        The head ref is left for the caller to move, once: a restore that goes on moves it to
        the state it leaves (its safety commit is under the restore's ref before then); every
        other way out moves it to the safety state (`_head_to_safety`). One ref write less
        (~0.1 ms of a ~3 ms restore: a rename over a file costs ext4 a write-back)."""
        named = request.paths.get(name, []) if request.paths is not None else None
        forced = frozenset(RepoPath(p) for p in rt.record.edited.get(name, ()))
        current = root.stage(root.safety_plan(forced, keep=request.dry_run))
        try:
            out = self._plan_staged(rt, cp, request, name, root, named, current)
            unsaved, occupied = in_the_way(out.plan, root.cache.entries, root.ws.root) if out else (set(), {})
            if unsaved:
                # an untracked file the restore would replace: saved first, and planned again
                # with it known (so it is named in the result, journaled, and undone)
                log.info("restore.saving_in_the_way", task_id=rt.record.task_id, paths=sorted(unsaved)[:20],
                         count=len(unsaved))
                current = root.stage(root.safety_plan(forced | unsaved, keep=request.dry_run))
                out = self._plan_staged(rt, cp, request, name, root, named, current)
                _, occupied = in_the_way(out.plan, root.cache.entries, root.ws.root) if out else (set(), {})
            if out is not None and occupied:
                self._leave_occupied(out, occupied, request, root)
        except BaseException:
            root.set_head(current.tree)  # the staged blobs stay anchored (gc)
            raise
        if out is None:
            root.set_head(current.tree)
        return out

    def _leave_occupied(self, out: _RootPlan, occupied: Mapping[RepoPath, RepoPath], request: RestoreRequest,
                        root: LockedRoot) -> None:
        """Leave alone each written path where a folder holds a file the plan keeps, and what is
        under it (`in_the_way`): a restore does the rest, an undo or redo is refused whole."""
        show = self._shower(root)
        log.info("restore.folder_in_the_way", op=request.op, paths=sorted(occupied)[:20], count=len(occupied))
        if request.targets is not None:
            out.in_way += _in_its_way(show, occupied)
            return
        out.plan, _ = withhold(out.plan, occupied)
        out.held += [
            f"{show(p)}: left as it is, since the folder there holds {show(by)}, which the restore does not "
            "delete (no snapshot holds it, or it was not named); move it aside and restore again"
            for p, by in occupied.items()]

    @staticmethod
    def _head_to_safety(plans: Mapping[str, _RootPlan], locked: Mapping[str, LockedRoot]) -> None:
        """A restore that stops after planning: each head names the state its root staged."""
        for name, p in plans.items():
            locked[name].set_head(p.safety_tree)

    def _plan_staged(self, rt: TaskRuntime, cp: CheckpointRecord, request: RestoreRequest, name: str,
                     root: LockedRoot, named: list[RepoPath] | None, current: StageResult) -> _RootPlan | None:
        """`_plan_root` once the safety state is staged as `current`."""
        repo = root.repo
        record = rt.record
        try:
            if request.targets is not None:
                if name not in request.targets:
                    return None
                target_tree = request.targets[name]
            else:
                commit = cp.hashes.get(name)
                if commit is None:
                    return None
                target_tree = repo.commit_tree(commit)
            if named is not None:  # the root itself ("") stands for every file either snapshot holds
                scope: list[RepoPath] | None = None if RepoPath("") in named else named
            elif record.has_scope():
                scope = [RepoPath(p) for p in record.scope_paths(name)]
            else:
                scope = None
            target, here = self._restore_inputs(root, target_tree, scope)
            # a file or link standing where a folder of the target goes is replaced:
            # plan_restore names it (deleted), so an undo puts it back
            for path in list(target):
                for folder in folders_above(path):
                    if (above := root.cache.entry(folder)) is not None:
                        here[folder] = above
            plan = plan_restore(name, target, here, scope)
            in_way: dict[RepoPath, RepoPath] = {}
            if named is not None and request.targets is not None:  # an undo or redo
                plan, in_way = exactly(plan, named)
            if named is not None and request.targets is None:
                newest = record.last_snapshot()
                newest_tree = self._tree_or_none(root, newest.hashes.get(name)) if newest else None
                plan = self._only_known(plan, target, root, newest_tree)
            base = self._base_entries(rt, root, name, plan) if request.keep_outside_edits else None
        except RepoError as exc:
            root.mark_damaged()
            raise RestoreFailedError(
                f"The checkpoint at ts={cp.ts} can no longer be restored: the shadow repository lost "
                f"objects it needs ({exc}). Nothing was changed.") from exc
        # files the safety checkpoint skipped (over the size cap, unreadable) are left alone
        unsaved = [s.path for s in current.stats.skipped if s.reason is not SkipReason.VANISHED]
        if request.targets is None:
            # and a file the checkpoint left out (too big then) existed then: never deleted
            plan = keep_skipped(plan, self._skipped_in(cp, root))
        plan, held = withhold(plan, unsaved)
        why = {s.path: s.reason.value for s in current.stats.skipped}
        out = _RootPlan(plan, current.tree, held=[
            f"{self.host.resolver.display(root.ws, p)}: left as it is, since the safety checkpoint could not "
            f"save what is there ({why.get(p, 'a file in its way')}); move it aside and restore again" for p in held],
            in_way=_in_its_way(self._shower(root), in_way))
        if base is not None:
            here_now = {op.path: e for op in plan.ops if (e := root.cache.entry(op.path)) is not None}
            outcome = keep_outside_edits(plan, base, here_now, repo)
            out.plan, out.merged, out.conflicts = outcome.plan, list(outcome.merged), list(outcome.conflicts)
            merged = set(outcome.merged)
            out.theirs = {op.path: op.entry for op in plan.ops if op.path in merged}
        # Every blob is checked before any file is written, so a checkpoint with lost
        # objects fails whole instead of leaving a half-restored workspace.
        lost = [op.path for op in out.plan.ops if op.entry is not None and not repo.has_object(op.entry.oid)]
        if lost:
            root.mark_damaged()
            raise RestoreFailedError(
                f"The checkpoint at ts={cp.ts} can no longer be restored: the shadow repository lost "
                f"the content of {len(lost)} file(s) ({', '.join(lost[:3])}). Nothing was changed.")
        return out

    @staticmethod
    def _tree_or_none(root: LockedRoot, commit: str | None) -> str | None:
        return root.repo.commit_tree(commit) if commit else None

    @staticmethod
    def _only_known(plan: RestorePlan, target: dict[RepoPath, TreeEntry], root: LockedRoot,
                    newest_tree: str | None) -> RestorePlan:
        """Drop deletions of named paths that neither the checkpoint nor the newest snapshot
        holds (untracked, ignored, excluded: PROTOCOL 1.1 `paths`), unless a write needs the place.
        A folder the newest snapshot has at the path of a file made since does not hold it."""
        repo = root.repo
        writes = [op.path for op in plan.ops if op.entry is not None]
        keep = []
        for op in plan.ops:
            if op.entry is None and op.path not in target and not _holds_file(repo, newest_tree, op.path) \
                    and not any(w.startswith(op.path + "/") for w in writes):
                continue
            keep.append(op)
        return RestorePlan(plan.root, tuple(keep))

    def _base_entries(self, rt: TaskRuntime, root: LockedRoot, name: str,
                      plan: RestorePlan) -> dict[RepoPath, TreeEntry | None]:
        """The task's base (its newest snapshot, or the workspace as its newest restore left it)
        for the planned paths."""
        commit = (rt.record.base or {}).get(name)
        if commit is None:
            newest = rt.record.last_snapshot()
            commit = newest.hashes.get(name) if newest else None
        tree = self._tree_or_none(root, commit)
        repo = root.repo
        return {op.path: repo.lookup(tree, op.path) for op in plan.ops}

    def _commit_states(self, rt: TaskRuntime, cp: CheckpointRecord, request: RestoreRequest,
                       plans: dict[str, _RootPlan], locked: Mapping[str, LockedRoot]) -> dict[str, Any]:
        """Commit each root's safety checkpoint and the state the restore leaves, under a ref of
        the task (before anything is written: an interrupted restore stays undoable)."""
        record = rt.record
        n = record.next_restore_n()
        prev = record.last_snapshot()
        roots: dict[str, Any] = {}
        for name, p in plans.items():
            repo = locked[name].repo
            parent = prev.hashes.get(name) if prev else None
            safety = repo.commit(p.safety_tree, [parent] if parent and repo.has_object(parent) else [],
                                 f"safety checkpoint before {request.op} {n}", record.task_id)
            writes = {op.path: op.entry for op in p.plan.ops}
            after_tree = repo.patch_tree(p.safety_tree, writes, expect_new=False)
            after = repo.commit(after_tree, [safety], f"after {request.op} {n}", record.task_id)
            p.after_tree = after_tree
            # The task's base from now on (keepOutsideEdits): its previous base with this restore's
            # writes, which are never outside edits; the person's edits the restore left stay theirs,
            # those a merge kept too (a merged file's base is its checkpoint's content: a later
            # restore keeping outside edits merges them again). When that is what the restore
            # leaves (the usual case: no outside edit kept), the after-state is the base: no
            # commit of the same tree.
            base_before = (record.base or {}).get(name) or parent
            before_tree = repo.commit_tree(base_before) if base_before else None
            own = {**writes, **p.theirs}
            base_tree = after_tree if not p.theirs and self._same_after(repo, before_tree, p.safety_tree, writes) \
                else repo.patch_tree(before_tree, own, expect_new=False)
            base = after if base_tree == after_tree else repo.commit(
                base_tree, [after], f"base after {request.op} {n}", record.task_id)
            repo.set_ref(restore_ref(record.task_id, n), base)  # reaches after and safety too
            roots[name] = {"safety": safety, "after": after, "base": base, "paths": [op.path for op in p.plan.ops]}
        entry: dict[str, Any] = {"n": n, "op": request.op, "ts": cp.ts if request.targets is None else None,
                                 "createdAt": now_iso(), "roots": roots,
                                 "paths": request.paths is not None, "keepOutsideEdits": request.keep_outside_edits}
        if request.of is not None:
            entry["of"] = request.of
        return entry

    @staticmethod
    def _same_after(repo: ShadowRepo, before: str | None, safety: str | None,
                    writes: Mapping[RepoPath, TreeEntry | None]) -> bool:
        """True when `writes` make the same tree of `before` as of `safety`: the two differ in
        no file that the writes leave alone. The usual case twice over: no outside edit (the
        trees are the same), or only outside edits to the files the restore writes (it merged
        them). Comparing the two trees reads only the folders above the differences; patching
        `before` would write a tree per folder (~0.5 ms for a file nine folders deep)."""
        return repo.differ_only_at(before, safety, writes.keys())

    @staticmethod
    def _restore_inputs(root: LockedRoot, target_tree: str | None, scope: list[RepoPath] | None
                        ) -> tuple[dict[RepoPath, TreeEntry], dict[RepoPath, TreeEntry]]:
        """The target's and the current snapshot's entries that the restore may touch, found
        in O(scope) or O(changes), never by listing the whole workspace."""
        repo = root.repo
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

    def _skipped_in(self, cp: CheckpointRecord, root: LockedRoot) -> set[RepoPath]:
        """The paths of `root` that checkpoint `cp` left out although they existed (its warnings)."""
        shown = {w.get("path") for w in cp.warnings if w.get("reason") != SkipReason.VANISHED.value}
        if not self.host.resolver.multi:
            return {RepoPath(p) for p in shown if p}
        prefix = root.ws.name + "/"
        return {RepoPath(p[len(prefix):]) for p in shown if p and p.startswith(prefix)}

    def _apply_restore(self, root: LockedRoot, plan: RestorePlan,
                       patched: tuple[str | None, str | None] | None = None) -> RestoreStats:
        """Write the plan's files, then make the head name what the workspace now holds
        (for other processes and restarts). `patched`: a tree and that tree with the plan's
        writes, when already worked out (`_mirror_restore`)."""
        stats = apply_plan(root.ws.root, root.repo, plan)
        self._mirror_restore(root, plan, patched, stats.inodes)
        root.set_head(root.cache.tree)
        return stats

    @staticmethod
    def _mirror_restore(root: LockedRoot, plan: RestorePlan, patched: tuple[str | None, str | None] | None,
                        inodes: Mapping[RepoPath, int]) -> None:
        """The tracked set now holds what the restore wrote (stat unknown: re-verified on rescan;
        the inode kept, for a hard link made to it later)."""
        changes: dict[RepoPath, TreeEntry | None] = {}
        for op in plan.ops:
            changes[op.path] = op.entry
            if op.entry is None:
                root.cache.remove(op.path)
            else:
                root.cache.set(op.path, unknown_state(op.entry, inodes.get(op.path, 0)))
        if changes:
            if patched is not None and patched[0] == root.cache.tree:
                root.cache.tree = patched[1]  # the tracked set is the safety state: its after-state
            else:
                root.cache.tree = root.repo.patch_tree(root.cache.tree, changes, expect_new=False)
            root.note_tracked(changes)

    def recover(self, rt: TaskRuntime) -> None:
        """Complete a restore that a crash interrupted (roll forward from the journal)."""
        journal = self.host.store.read_journal(rt.record.task_id)
        if not journal:
            return
        log.warning("restore.recovering", task_id=rt.record.task_id)
        for data in journal.get("plans", []):
            plan = RestorePlan.from_json(data)
            root = self.host.roots.get(plan.root)
            if root is None:
                continue
            with root.locked() as r:
                if prepare_root(root.ws.root, plan):
                    cleanup_temp_files(root.ws.root, [op.path for op in plan.ops])
                self._apply_restore(r, plan)
        entry = journal.get("entry")
        if entry is None and isinstance(journal.get("safety"), dict):
            # a journal of 1.0 (no after-state): undoable, not redoable
            safety = journal["safety"]
            entry = {"n": rt.record.next_restore_n(), "op": "restore", "ts": None, "createdAt": now_iso(), "roots": {
                p["root"]: {"safety": safety.get(p["root"]), "after": None, "paths": [op[0] for op in p["ops"]]}
                for p in journal.get("plans", [])}}
        if isinstance(entry, dict) and rt.record.restore_entry(entry.get("n", -1)) is None:
            rt.record.record_restore(entry)
            if not all(r.get("after") for r in entry["roots"].values()):
                rt.record.base = None
        self.host.save(rt)  # before the journal goes: a kill between keeps the undo record
        self.host.store.clear_journal(rt.record.task_id)

    # ------------------------------------------------------------------ safety checkpoints

    @staticmethod
    def safety_record(rt: TaskRuntime, n: int) -> CheckpointRecord:
        """The safety checkpoint taken before the task's restore `n`, shaped as a checkpoint."""
        entry = rt.record.restore_entry(n) if isinstance(n, int) else None
        if entry is None:
            raise UnknownCheckpointError(f"Task {rt.record.task_id} has no restore {n!r} (no such safety checkpoint).")
        hashes = {name: info["safety"] for name, info in entry["roots"].items() if info.get("safety")}
        return CheckpointRecord(ts=-1, kind=CheckpointKind.ROUND, hashes=hashes,
                                created_at=entry.get("createdAt") or now_iso())

    def restore_safety(self, task_id: str, n: int, paths: Iterable[str] | None, dry_run: bool,
                       keep_outside_edits: bool) -> Restore:
        """Restore the files to a safety checkpoint: the task's scope and the paths its restore
        touched (or only `paths`), as they were before that restore."""
        rt = self.host.task(task_id)
        named = self._named_paths(paths)
        with rt.lock:
            safety = self.safety_record(rt, n)
            entry = rt.record.restore_entry(n) or {}
            targets: dict[str, str | None] = {}
            scope: dict[str, list[RepoPath]] = {}
            for name, commit in safety.hashes.items():
                root = self.host.roots.get(name)
                if root is None:
                    continue
                with root.locked() as r:
                    targets[name] = r.repo.commit_tree(commit)
                touched = entry.get("roots", {}).get(name, {}).get("paths", [])
                scope[name] = named[name] if named is not None else [
                    RepoPath(p) for p in sorted(set(rt.record.scope_paths(name)) | set(touched))]
            marker = rt.record.last_snapshot() or rt.record.checkpoints[0]
            request = RestoreRequest(paths=scope, dry_run=dry_run, keep_outside_edits=keep_outside_edits,
                                     targets=targets, of=n)
            return Restore(self._restore_files(rt, marker, request))

    # ------------------------------------------------------------------ undo / redo

    def undo_restore(self, task_id: str) -> Restore:
        """Walk the undo stack back one restore: its paths as they were before it."""
        return self._step(task_id, "undo")

    def redo_restore(self, task_id: str) -> Restore:
        """Walk the undo stack forward one undone restore: its paths as it left them."""
        return self._step(task_id, "redo")

    def _step(self, task_id: str, op: str) -> Restore:
        rt = self.host.task(task_id)
        with rt.lock:
            stack = rt.record.undo_stack if op == "undo" else rt.record.redo_stack
            entry = rt.record.restore_entry(stack[-1]) if stack else None
            if entry is None:
                raise NothingToUndoError(f"Task {task_id} has no file restore to {op}.")
            side = "safety" if op == "undo" else "after"
            scope: dict[str, list[RepoPath]] = {}
            targets: dict[str, str | None] = {}
            for name, info in entry["roots"].items():
                root = self.host.roots.get(name)
                if root is None or not info.get(side):
                    continue
                with root.locked() as r:
                    try:
                        targets[name] = r.repo.commit_tree(info[side])
                    except RepoError as exc:
                        raise RestoreFailedError(
                            f"Restore {entry['n']} of task {task_id} cannot be {op}ne: its commit is lost from "
                            f"the shadow repository ({exc}).") from exc
                scope[name] = [RepoPath(p) for p in info.get("paths", [])]
            marker = rt.record.last_snapshot() or rt.record.checkpoints[0]
            request = RestoreRequest(paths=scope, targets=targets, op=op, of=entry["n"])
            # the restore's record takes entry n off its stack (`TaskRecord.record_restore`)
            return Restore(self._restore_files(rt, marker, request))

    # ------------------------------------------------------------------ messages

    def edit_message(self, task_id: str, ts: int, text: str, restore: EditRestore) -> Restore:
        rt = self.host.task(task_id)
        with rt.lock:
            msg = rt.record.message(ts) if isinstance(ts, int) else None
            if msg is None:
                raise UnknownMessageError(f"Task {task_id} has no message at ts={ts!r}.")
            if msg.text is not None and msg.text == text:
                return Restore(None, text=text)
            earlier = [t for t in rt.record.timeline_ts() if t < ts]
            keep_through = earlier[-1] if earlier else ts - 1
            files: FilesRestored | None = None
            error: KindError | None = None
            if restore == EditRestore.ALL:
                if rt.state is not TaskState.READY:
                    raise CheckpointsDisabledError(
                        f"Restore All is not available while task {task_id} shows a checkpoint error.")
                candidates = [c for c in rt.record.checkpoints if c.ts <= ts and c.has_snapshot]
                if not candidates:
                    raise UnknownCheckpointError(f"No checkpoint at or before ts={ts} to restore files to.")
                cp = candidates[-1]
                try:
                    files = self._restore_files(rt, cp)
                    rt.record.mark_restored(cp)
                except ShadowpointError as exc:
                    error = error_value(exc)
            cut = self._cut(rt, keep_through)
            self.host.save(rt)
            return Restore(files, cut, error, text)


def _holds_file(repo: ShadowRepo, tree: str | None, path: RepoPath) -> bool:
    """Whether `tree` has a file or link (not a folder) at `path`."""
    entry = repo.lookup(tree, path)
    return entry is not None and entry.mode != MODE_TREE


def _in_its_way(show: Callable[[RepoPath], str], paths: Mapping[RepoPath, RepoPath]) -> list[str]:
    """An undo's or redo's paths, each with what was made since in its way."""
    return [f"{show(p)} ({show(by)} is in its way)" for p, by in paths.items()]


def error_value(exc: ShadowpointError) -> KindError:
    """The `error` of a Restore whose file part failed."""
    conflicts = tuple(exc.conflicts) if isinstance(exc, RestoreConflictError) else None
    return KindError(exc.kind, str(exc), conflicts)
