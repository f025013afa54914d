"""Rebuilds a task's record from the shadow repository when its `task.json` is lost or
unreadable, keeping every checkpoint that survives there.

Each checkpoint commit says "<kind> checkpoint at <ts>" and the task's ref reaches them all
along first parents, so the timeline (ts, kind, commit per root) comes back; the files the
task changed are taken from the differences between its checkpoints (what a file restore is
then scoped to). Messages' texts, restored marks and the undo record are not in the repo.
Called by `Engine` on the requesting thread; takes each root's lock.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

import structlog

from shadowpoint.errors import RepoError
from shadowpoint.kinds import CheckpointKind
from shadowpoint.roots import RootState
from shadowpoint.store.checkpoints import CheckpointRecord, TaskRecord
from shadowpoint.store.shadow_repo import ShadowRepo
from shadowpoint.store.values import task_ref

log = structlog.get_logger(__name__)

# "baseline" alone is how baselines were named before they carried their ts
_MESSAGE = re.compile(r"^(?:(baseline|round|completion) checkpoint at (-?\d+)|(baseline))\s*$", re.MULTILINE)


def parse_checkpoint_message(message: str) -> tuple[CheckpointKind, int] | None:
    """(kind, ts) of a checkpoint commit's message; None for other commits (safety checkpoints)."""
    first = message.split("\n", 1)[0]
    m = _MESSAGE.match(first)
    if m is None:
        return None
    if m.group(3):
        return CheckpointKind.BASELINE, 0
    return CheckpointKind(m.group(1)), int(m.group(2))


def rebuild_record(task_id: str, roots: Mapping[str, RootState], root_paths: dict[str, str]) -> TaskRecord | None:
    """The task's record as its shadow refs tell it, or None when no root has its ref."""
    timelines: dict[str, list[tuple[int, CheckpointKind, str]]] = {}
    edited: dict[str, list[str]] = {}
    for name, root in roots.items():
        if not (root.ws.git_dir / "objects").is_dir():
            continue
        found = _read_without_lock(root.ws.git_dir, task_id)
        if found is _UNREADABLE:
            with root.locked() as r:  # a damaged repo: opening it for real repairs it first
                found = _timeline(r.repo, task_id)
        if isinstance(found, tuple) and found[0]:
            timelines[name] = found[0]
            edited[name] = sorted(found[1])
    if not timelines:
        return None
    record = TaskRecord(task_id=task_id, roots=dict(root_paths))
    kinds: dict[int, CheckpointKind] = {}
    for points in timelines.values():
        for ts, kind, _ in points:
            kinds.setdefault(ts, kind)
    for ts in sorted(kinds):
        hashes = {}
        for name, points in timelines.items():
            # a root that did not change keeps its previous commit
            earlier = [commit for t, _, commit in points if t <= ts]
            if earlier:
                hashes[name] = earlier[-1]
        record.add_checkpoint(CheckpointRecord(ts=ts, kind=kinds[ts], hashes=hashes))
        record.add_message(ts, "user" if not record.messages else "assistant", None)
    record.edited = {name: paths for name, paths in edited.items() if paths}
    log.warning("task.rebuilt", task_id=task_id, checkpoints=len(record.checkpoints),
                hint="task.json was missing or unreadable; messages after the last checkpoint are not known")
    return record


_UNREADABLE = object()
Timeline = tuple[list[tuple[int, CheckpointKind, str]], set[str]]


def _read_without_lock(git_dir: Path, task_id: str) -> Timeline | object | None:
    """Read the history through a handle of our own, without the workspace lock: objects never
    change and a ref moves atomically, so a task/start waits on no other process's commit."""
    try:
        repo = ShadowRepo.open_existing(git_dir)
    except RepoError:
        return _UNREADABLE
    try:
        return _timeline(repo, task_id)
    except RepoError:
        return _UNREADABLE
    finally:
        repo.close()


def _timeline(repo: ShadowRepo, task_id: str) -> Timeline | None:
    """(ts, kind, commit) of each checkpoint on the task's ref, and the paths they changed."""
    tip = repo.read_ref(task_ref(task_id))
    if tip is None:
        return None
    points: list[tuple[int, CheckpointKind, str]] = []
    changed: set[str] = set()
    prev_tree: str | None = None
    for commit, message in repo.commit_chain(tip):
        parsed = parse_checkpoint_message(message)
        if parsed is None:
            continue
        tree = repo.tree_of_commit_or_none(commit)
        if points:
            try:
                for d in repo.diff_trees(prev_tree, tree):
                    changed.add(d.path)
                    if d.old_path:
                        changed.add(d.old_path)
            except RepoError:
                pass  # a damaged pair of trees: what they changed is unknown
        points.append((parsed[1], parsed[0], commit))
        prev_tree = tree
    return points, changed
