"""Restore: `RestorePlan` (which paths get which content) and carrying it out safely.

Planning is pure (trees in, a plan out) so tests can inspect it; applying goes through
`SafeWriter` (never libgit2's checkout), path by path, each file written to a temporary
name and renamed. The engine writes a journal before applying so a crash is completed on
the next start. Runs on the task's engine thread under the root's lock.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Container, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from shadowpoint.errors import RestoreFailedError, ShadowpointError
from shadowpoint.restore.safe_fs import SafeWriter, make_root_again
from shadowpoint.store.shadow_repo import ShadowRepo
from shadowpoint.store.values import MODE_EXEC, MODE_LINK, TreeEntry
from shadowpoint.workspace import RepoPath, at_or_under, folders_above

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class RestoreOp:
    """Put `path` back to `entry`, or delete it when `entry` is None."""

    path: RepoPath
    entry: TreeEntry | None


@dataclass(frozen=True, slots=True)
class RestorePlan:
    """The file work of one restore on one root; nothing is written until `apply_plan`."""

    root: str
    ops: tuple[RestoreOp, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "root": self.root,
            "ops": [[op.path, op.entry.oid if op.entry else None, int(op.entry.mode) if op.entry else None]
                    for op in self.ops],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RestorePlan:
        ops = tuple(
            RestoreOp(RepoPath(p), TreeEntry(oid, mode) if oid else None) for p, oid, mode in data["ops"]
        )
        return cls(str(data["root"]), ops)


@dataclass(slots=True)
class RestoreStats:
    restored: list[RepoPath] = field(default_factory=list)
    deleted: list[RepoPath] = field(default_factory=list)
    failed: list[tuple[RepoPath, str]] = field(default_factory=list)
    inodes: dict[RepoPath, int] = field(default_factory=dict)  # of the regular files written


def plan_restore(
    root: str,
    target: Mapping[RepoPath, TreeEntry],
    current: Mapping[RepoPath, TreeEntry],
    scope: Iterable[RepoPath] | None,
) -> RestorePlan:
    """Plan a restore of one root from the `current` snapshot to the `target` one.

    Args:
        root: the root's name.
        target: the checkpoint's files.
        current: the files as they are now (the safety snapshot just taken).
        scope: the paths edit tools reported over the task (only those are touched, with
            what lies under a reported directory); None to reset every file either
            snapshot tracks (a task that changed files only through commands).
    """
    if scope is None:
        paths = set(target) | set(current)
    else:
        wanted = set(scope)
        prefixes = tuple(p + "/" for p in wanted)
        paths = {p for p in wanted if p in target or p in current}
        if prefixes:
            paths |= {p for p in (*target, *current) if p.startswith(prefixes)}
    ops = []
    for path in sorted(paths):
        want = target.get(path)
        have = current.get(path)
        if want == have:
            continue
        ops.append(RestoreOp(path, want))
    # A write below a path that is now a file or a link replaces that entry (the safe writer
    # makes it a folder). Planned as a deletion it is named in the result and journaled, and
    # an undo brings it back; before, undo could not restore a swapped-in link (test_hostile.py).
    planned = {op.path for op in ops}
    for op in list(ops):
        if op.entry is None:
            continue
        for ancestor in folders_above(op.path):
            if ancestor in current and ancestor not in planned:
                ops.append(RestoreOp(ancestor, None))
                planned.add(ancestor)
    ops.sort(key=lambda op: op.path)
    return RestorePlan(root, tuple(ops))


def in_the_way(plan: RestorePlan, saved: Container[str],
               workspace: Path) -> tuple[set[RepoPath], dict[RepoPath, RepoPath]]:
    """What stands on disk in the way of a write of `plan` that the plan does not account for.

    Returns two things:
    - the untracked files and links (ignored, excluded, or made since the last round) at a
      path the plan writes, or standing where a folder of a written path must go. The safe
      writer replaces both, so the restore saves them first (a safety state with them forced)
      and an undo brings them back: a restore never destroys what it did not save.
    - each written path where a folder stands holding a file the plan does not delete (one
      no snapshot holds, or a named restore leaves alone), with that file. The writer would
      refuse there, after the plan's other writes; the restore leaves such a path alone
      instead, and an undo is refused whole. Such a file is never deleted to make room: a
      restore never touches an ignored or excluded file no snapshot holds (SPEC §6).

    `saved`: the paths the safety state holds. Only writes to paths the safety state lacks
    are looked at (lstat, in `workspace`), top down, up to the first thing that is not a
    folder: a tracked path's folders were folders when it was staged. A place that cannot be
    looked at is left to the writer (the write fails there too).
    """
    found: set[RepoPath] = set()
    occupied: dict[RepoPath, RepoPath] = {}
    folders: set[str] = set()
    deleted: set[str] | None = None
    for op in plan.ops:
        if op.entry is None or op.path in saved:
            continue
        for path in (*folders_above(op.path), op.path):
            if path in folders:
                continue
            if path in saved:
                break  # the plan replaces it as a tracked entry (`plan_restore`)
            try:
                st = os.lstat(workspace / path)
            except OSError:
                break  # nothing there (or no way in): nothing below it to lose either
            if stat.S_ISDIR(st.st_mode):
                folders.add(path)
                if path == op.path:
                    if deleted is None:
                        deleted = {o.path for o in plan.ops if o.entry is None}
                    if (kept := _kept_in(workspace, op.path, deleted)) is not None:
                        occupied[op.path] = kept
                continue
            found.add(path)
            break
    return found, occupied


def _kept_in(workspace: Path, folder: RepoPath, deleted: Container[str]) -> RepoPath | None:
    """A file or link (at any depth) in the folder `folder` that is not in `deleted`, if any.
    Symlinked folders are not followed; a folder that cannot be read is passed over (the
    writer refuses there, or finds it empty)."""
    stack = [folder]
    while stack:
        current = stack.pop()
        try:
            with os.scandir(workspace / current) as it:
                entries = list(it)
        except OSError:
            continue
        for dirent in entries:
            child = RepoPath(f"{current}/{dirent.name}")
            if dirent.is_dir(follow_symlinks=False):
                stack.append(child)
            elif child not in deleted:
                return child
    return None


def exactly(plan: RestorePlan, paths: Iterable[RepoPath]) -> tuple[RestorePlan, dict[RepoPath, RepoPath]]:
    """The ops of `plan` at `paths` only: an undo or redo puts back exactly the paths its
    restore touched (PROTOCOL `checkpoint/undoRestore`), and nothing made since then.

    `plan` was made with `paths` as its scope, where a folder stands for what is under it; a
    path the restore wrote as a file can be a folder now. A write is left out (returned with
    the path in its way) when what stands there is none of `paths`: files in a folder at the
    path, or a file where a folder of it goes. Deleting them would lose work no restore
    touched, and the writer would refuse the folder (and replace the file).
    """
    exact = set(paths)
    others = [op.path for op in plan.ops if op.path not in exact]
    if not others:
        return plan, {}
    others_set = set(others)
    keep: list[RestoreOp] = []
    held: dict[RepoPath, RepoPath] = {}
    for op in plan.ops:
        if op.path not in exact:
            continue
        if op.entry is not None:
            below = op.path + "/"
            by = next((f for f in folders_above(op.path) if f in others_set), None) or \
                next((o for o in others if o.startswith(below)), None)
            if by is not None:
                held[op.path] = by
                continue
        keep.append(op)
    return RestorePlan(plan.root, tuple(keep)), held


def keep_skipped(plan: RestorePlan, skipped_then: Iterable[RepoPath]) -> RestorePlan:
    """Drop deletions of paths the target checkpoint left out although they existed (over
    the size cap, unreadable), and of the paths under such a path (a folder it could not
    read): absent from its tree, they were not absent from the disk."""
    skipped = set(skipped_then)
    if not skipped:
        return plan
    kept = (op for op in plan.ops if op.entry is not None or not at_or_under(op.path, skipped))
    return RestorePlan(plan.root, tuple(kept))

def withhold(plan: RestorePlan, unsaved: Iterable[RepoPath]) -> tuple[RestorePlan, list[RepoPath]]:
    """Drop the ops that would overwrite content the safety checkpoint could not keep (a file
    over the size cap or unreadable, at the path or standing where a folder must go).

    Returns the plan that may run and the paths left alone. A restore must stay undoable: it
    never destroys what it could not save first.
    """
    blocked = set(unsaved)
    if not blocked:
        return plan, []
    keep: list[RestoreOp] = []
    held: list[RepoPath] = []
    for op in plan.ops:
        if at_or_under(op.path, blocked):
            held.append(op.path)
        else:
            keep.append(op)
    return RestorePlan(plan.root, tuple(keep)), held


@dataclass(frozen=True, slots=True)
class MergeOutcome:
    """A plan after keeping outside edits: merged files and the paths that conflict."""

    plan: RestorePlan
    merged: tuple[RepoPath, ...]
    conflicts: tuple[RepoPath, ...]


BINARY_SNIFF_BYTES = 8192  # as git and the protocol's `binary`: a NUL in the first 8 KiB


def keep_outside_edits(plan: RestorePlan, base: Mapping[RepoPath, TreeEntry | None],
                       current: Mapping[RepoPath, TreeEntry], repo: ShadowRepo) -> MergeOutcome:
    """Rework `plan` so that the outside edits (base → workspace) stay (PROTOCOL 1.1).

    Per planned path, with base B (the task's newest state), ours O (the workspace) and theirs
    T (the checkpoint): B == O restores as planned; B == T keeps the workspace (no op); else a
    three-way merge of the contents, listed in `merged`. A deletion on one side and a change on
    the other, a binary or link side, a type or mode change on both sides, or overlapping
    changes are conflicts. Merged blobs are written to `repo` (objects only).
    """
    ops: list[RestoreOp] = []
    merged: list[RepoPath] = []
    conflicts: list[RepoPath] = []
    for op in plan.ops:
        b, o, t = base.get(op.path), current.get(op.path), op.entry
        if b == o:
            ops.append(op)
            continue
        if b == t:
            continue
        entry = _merge(repo, op.path, b, o, t)
        if entry is None:
            conflicts.append(op.path)
        elif entry != o:
            ops.append(RestoreOp(op.path, entry))
            merged.append(op.path)
    # A file the workspace keeps (the person's, where the checkpoint has a folder) cannot stay
    # under a write below it, which would replace it: both sides changed that place, a conflict.
    kept = {op.path for op in plan.ops if op.entry is None} - {op.path for op in ops} - set(conflicts)
    if kept:
        blocked = {op.path: above for op in ops if op.entry is not None
                   for above in folders_above(op.path) if above in kept}
        ops = [op for op in ops if op.path not in blocked]
        conflicts = sorted({*conflicts, *blocked, *blocked.values()})
    return MergeOutcome(RestorePlan(plan.root, tuple(ops)), tuple(merged), tuple(conflicts))


def _merge(repo: ShadowRepo, path: RepoPath, b: TreeEntry | None, o: TreeEntry | None,
           t: TreeEntry | None) -> TreeEntry | None:
    """The merged entry of three differing sides, or None for a conflict."""
    if b is None or o is None or t is None:
        return None  # deleted (or added) on one side and changed on the other
    if MODE_LINK in (b.mode, o.mode, t.mode):
        return None  # a link's target is no text to merge; a type change on one side is a conflict too
    if o.mode != b.mode and t.mode != b.mode and o.mode != t.mode:
        return None
    mode = o.mode if o.mode != b.mode else t.mode
    if b.oid == o.oid or b.oid == t.oid or o.oid == t.oid:
        # only the mode differs on one side: the content comes from the side that changed it
        oid = t.oid if b.oid == o.oid else o.oid
        return TreeEntry(oid, mode)
    if any(b"\0" in repo.read_blob(e.oid)[:BINARY_SNIFF_BYTES] for e in (b, o, t)):
        return None
    data = repo.merge_file(path, b, o, t)
    if data is None:
        return None
    return TreeEntry(repo.write_blob(data), mode)


def prepare_root(workspace_root: Path, plan: RestorePlan) -> bool:
    """Whether `plan` has a root to work in. A root that is gone (removed with everything in
    it) is made again when the plan writes a file (`make_root_again`); with deletions only,
    there is nothing left to delete.

    Raises:
        NoWorkspaceError: the plan writes and the root cannot be opened or made again.
    """
    if any(op.entry is not None for op in plan.ops):
        make_root_again(workspace_root)
        return True
    return os.path.lexists(workspace_root)


def apply_plan(workspace_root: Path, repo: ShadowRepo, plan: RestorePlan) -> RestoreStats:
    """Carry out `plan` with the safe writer; per-path failures are collected, not raised.

    Deletions run first (deepest first) so a directory that replaces a file, or a file
    that replaces a directory, finds its place free.
    """
    stats = RestoreStats()
    if not prepare_root(workspace_root, plan):
        return stats
    deletes = sorted((op for op in plan.ops if op.entry is None), key=lambda o: o.path.count("/"), reverse=True)
    writes = [op for op in plan.ops if op.entry is not None]
    with SafeWriter(workspace_root) as writer:
        for op in deletes:
            try:
                if writer.remove(op.path):
                    stats.deleted.append(op.path)
            except ShadowpointError as exc:
                stats.failed.append((op.path, str(exc)))
        for op in writes:
            assert op.entry is not None
            try:
                data = repo.read_blob(op.entry.oid)
                if op.entry.mode == MODE_LINK:
                    writer.write_symlink(op.path, data)
                else:
                    executable = op.entry.mode == MODE_EXEC
                    stats.inodes[op.path] = writer.write_file(op.path, data, executable=executable)
                stats.restored.append(op.path)
            except ShadowpointError as exc:
                stats.failed.append((op.path, str(exc)))
    if stats.failed:
        log.warning("restore.failed", root=plan.root, failed=len(stats.failed), first=stats.failed[0][1])
    return stats


def raise_if_failed(stats: RestoreStats) -> None:
    if stats.failed:
        path, why = stats.failed[0]
        more = f" (and {len(stats.failed) - 1} more)" if len(stats.failed) > 1 else ""
        raise RestoreFailedError(f"Could not restore {path}: {why}{more}")
