"""The one routine that turns a stage plan into a checkpoint of one root: stage, commit on
the task's previous snapshot, move the task's ref and the head, all under the workspace lock.
The baseline and every round go through it; what a failure leaves to the next round (the
plan carried) is the caller's, which knows the other roots' plans.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass

from shadowpoint.roots import LockedRoot, RootState
from shadowpoint.stage.early_capture import EarlyCapture
from shadowpoint.stage.scanner import StageResult
from shadowpoint.stage.stager import StagePlan
from shadowpoint.store.values import task_ref


@dataclass(frozen=True, slots=True)
class RootCheckpoint:
    commit: str
    reused: bool  # the staged tree equals the parent's: the parent is the checkpoint
    result: StageResult


def checkpoint_root(root: RootState, plan: StagePlan | Callable[[LockedRoot], StagePlan], task_id: str, message: str,
                    parent: str | None,
                    *, capture: EarlyCapture | None = None, borrow: bool = False,
                    wanted: Callable[[], bool] | None = None, save_cache: bool = False,
                    hold_blobs: bool = False, straight: bool = False) -> RootCheckpoint | None:
    """Stage `plan` in `root` and commit it on `parent` (the task's previous snapshot of this
    root, None for a baseline); the task's ref moves to the commit, the head to its tree.
    `plan` may be decided under the same lock hold, from the locked root (a baseline's).

    `capture`: a baseline's early captures, finished once the root is scanned (its edits wait
    no more); `borrow`: a baseline may take blob ids from the user's git index; `wanted`: asked
    before the ref moves, None as its answer when false (a task deleted or restarted meanwhile);
    `save_cache`: after a whole scan (a baseline's), have the stat cache written at the next quiet
    moment (`RootState.save_cache_soon`); `hold_blobs`: the blobs staged go into the small pack
    the task ref's move writes (`ShadowRepo.blobs_for_ref`), not one loose file each (a round's
    few; a baseline's, many and read in its workers, stay loose); `straight`: a round's plan of
    edit tools' tracked files is staged in a straight line when it can be
    (`LockedRoot.stage_straight`), the same outcome in fewer steps.

    Raises:
        whatever staging or committing raised (LockTimeoutError, RepoError, StorageFailedError):
        nothing moved; the caller carries the plan to the next round.
    """
    with root.locked() as r, r.repo.blobs_for_ref() if hold_blobs else contextlib.nullcontext():
        if callable(plan):
            plan = plan(r)
        result = r.stage_straight(plan) if straight else None
        if result is None:
            try:
                result = r.stage(plan, capture, borrow=borrow)
            finally:
                if capture is not None:
                    capture.finish()
        repo = r.repo
        # libgit2 refuses a commit whose parent is missing (a lost object): the chain then
        # restarts here rather than every later round failing
        parent_ok = parent is not None and repo.has_object(parent)
        if parent is not None and parent_ok and repo.tree_of_commit_or_none(parent) == result.tree:
            commit, reused = parent, True
        else:
            commit = repo.commit(result.tree, [parent] if parent is not None and parent_ok else [], message, task_id)
            reused = False
            if wanted is not None and not wanted():
                return None
            repo.set_ref(task_ref(task_id), commit, in_place=True)
        r.set_head(result.tree)
        if save_cache and result.stats.rescan:
            r.save_cache_soon()
        return RootCheckpoint(commit, reused, result)
