"""`Engine`: wires shadowpoint together for a set of workspace roots; the facade every
entry point (sidecar, library hooks, CLI) drives.

Owns one `RootState` per root (shadow repo, exclusion rules, stat cache, watcher, lock)
and one `TaskRuntime` per task (record, round recorder, baseline future), with its
collaborators: `BaselineBuilder` (baselines), `Restorer` (restores, through a `RestoreHost`),
`Maintenance` (retention, gc). Methods are called on the task's engine thread (the sidecar's
per-task worker, or the caller's thread for hooks); the baseline builds on its own thread.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import structlog

from shadowpoint.baseline import BaselineBuilder
from shadowpoint.bus import RoundBus
from shadowpoint.checkpointer import checkpoint_root
from shadowpoint.config import protected_directories
from shadowpoint.errors import (
    CheckpointsDisabledError,
    DamagedCheckpointError,
    InvalidParamsError,
    NoFileSnapshotError,
    PathOutsideWorkspaceError,
    RepoError,
    ShadowpointError,
    StorageFailedError,
    TaskMetadataError,
    UnknownCheckpointError,
    UnknownTaskError,
)
from shadowpoint.events import (
    ContextCompacted,
    MessageAdded,
    RoundBegan,
    RoundEnded,
    TaskCompleted,
    TaskRetried,
    TaskStarted,
    ToolBegan,
    ToolEnded,
)
from shadowpoint.kinds import CheckpointKind, EditRestore, RestoreMode, TaskState, ToolKind
from shadowpoint.maintenance import Maintenance
from shadowpoint.observe.rounds import RoundRecord, RoundRecorder, tool_kind
from shadowpoint.options import EngineOptions
from shadowpoint.restore.diff import TITLE_NEW, TITLE_SINCE, FileChange, by_path, file_changes
from shadowpoint.restore.restorer import RestoreHost, Restorer
from shadowpoint.results import Checkpoint, CheckpointList, Diff, KindError, Restore, TaskStatus
from shadowpoint.roots import LockedRoot, Notify, RootState
from shadowpoint.stage import stager
from shadowpoint.stage.early_capture import EarlyCapture, ScanHold
from shadowpoint.stage.scanner import StageResult
from shadowpoint.stage.stager import StagePlan
from shadowpoint.store.checkpoints import (
    CheckpointRecord,
    CheckpointStore,
    TaskRecord,
    checkpoint_or_raise,
    fork_record,
)
from shadowpoint.store.recovery import rebuild_record
from shadowpoint.store.shadow_repo import delete_task_refs, limit_mapped_memory
from shadowpoint.store.values import task_ref
from shadowpoint.verifier import VerifyStats, WatchVerifier, throttled
from shadowpoint.workspace import PathResolver, RepoPath, Workspace, open_workspaces

__all__ = ["Engine", "EngineOptions", "TaskRuntime"]


log = structlog.get_logger(__name__)


@dataclass(slots=True)
class TaskRuntime:
    """In-memory state of one task."""

    record: TaskRecord
    lock: threading.RLock = field(default_factory=threading.RLock)
    state: TaskState = TaskState.INITIALIZING
    error: KindError | None = None  # why the baseline failed
    baseline: Future[None] | None = None
    # per root: paths edit tools ask the building baseline for first (SPEC §3)
    captures: dict[str, EarlyCapture] = field(default_factory=dict)
    waiting_for_baseline: int = 0  # tool/begin calls blocked on the whole baseline now
    recorder: RoundRecorder | None = None
    round_no: int = 0
    generation: int = 0
    timers: list[threading.Timer] = field(default_factory=list)
    missed_events: str | None = None  # why hook events were lost; the next checkpoint says so


def round_changes(result: StageResult, during: frozenset[RepoPath] | None) -> list[str]:
    """What a round's staging changed that the round itself did (PROTOCOL 1.1 "Scope"): all of
    it for a rescan (it cannot tell earlier outside edits apart), else what changed under the
    paths the watcher recorded while the round was open (a folder stands for what it holds)."""
    changed = result.stats.changed_paths
    if result.stats.rescan or during is None:
        return list(changed)
    return [p for p in changed if any("/".join(p.split("/")[:i]) in during for i in range(1, p.count("/") + 2))]


@contextlib.contextmanager
def damaged_checkpoint(ts: object, root: RootState) -> Iterator[None]:
    """A checkpoint whose objects the shadow repo lost: a clear error, not an internal one; the
    root checks its objects before its next stage (the loss may reach the current snapshot)."""
    try:
        yield
    except RepoError as exc:
        root.mark_damaged()
        raise DamagedCheckpointError(
            f"The checkpoint at ts={ts} can no longer be read: the shadow repository lost objects it "
            f"needs ({exc}). Newer checkpoints are not affected.") from exc


# A background copy of borrowed blobs goes on once no request came for this long (`yield_to_rounds`)
COPY_QUIET_S = 0.3
COPY_YIELD_MAX_S = 2.0
COPY_YIELD_STEP_S = 0.05
# Pack memory libgit2 keeps mapped in an engine's process (`limit_mapped_memory`): a long-lived
# sidecar reads the trees of a collected shadow repository, spread through its biggest pack.
ENGINE_MAPPED_BYTES = 32 << 20


class Engine:
    """Checkpoints for a set of workspace roots."""

    def __init__(self, roots: Sequence[str | Path], options: EngineOptions, notify: Notify | None = None) -> None:
        self.options = options
        limit_mapped_memory(ENGINE_MAPPED_BYTES)
        self.workspaces = open_workspaces(roots, options.docs_dir, protected_directories())
        self.resolver = PathResolver(self.workspaces)
        self.roots = {ws.name: RootState(ws, options) for ws in self.workspaces}
        self.store = CheckpointStore(options.docs_dir, made_ahead=True)
        self.notify: Notify = notify or (lambda method, params: None)
        self._tasks: dict[str, TaskRuntime] = {}
        self._tasks_lock = threading.Lock()
        self._closed = False
        self.bus = RoundBus()
        self.maintenance = Maintenance(self.roots, options, closed=lambda: self._closed, pause=self.yield_to_rounds)
        self._verifiers = {name: WatchVerifier(root) for name, root in self.roots.items()}
        self._verify_lock = threading.Lock()  # one verification pass at a time
        self._verify_stop = threading.Event()
        self._verify_thread: threading.Thread | None = None
        # when a request last named a task (`_task`): background copies wait for a quiet moment
        self._last_request = time.monotonic()
        for root in self.roots.values():
            root.copy_pause = self.yield_to_rounds
        # test seam: holds every baseline scan after some files (early_capture.ScanHold)
        self.baseline_hold: ScanHold | None = None
        self._baselines = BaselineBuilder(
            self.roots, lambda: self.options, notify=lambda method, params: self.notify(method, params),
            hold=lambda: self.baseline_hold, save=self._save, warnings=self._warnings, built=self._baseline_built)
        self.restorer = Restorer(RestoreHost(
            roots=self.roots, resolver=self.resolver, store=self.store, first_root=self.first_root, task=self._task,
            wait_ready=self._baselines.wait_ready, save=self._save, append=self._append,
            resolve_paths=partial(self._resolve_paths, root_ok=True)))
        self._subscribe()

    def _subscribe(self) -> None:
        """The checkpoint logic listens on the round-boundary bus; entry points publish."""
        bus = self.bus
        bus.subscribe(TaskStarted, lambda e: self.start_task(e.task_id, e.ts))
        bus.subscribe(TaskRetried, lambda e: self.retry_task(e.task_id))
        bus.subscribe(RoundBegan, lambda e: self.begin_round(e.task_id))
        bus.subscribe(ToolBegan, lambda e: self.tool_began(e.task_id, e.tool, e.kind, e.paths))
        bus.subscribe(ToolEnded, lambda e: self.tool_ended(e.task_id, e.tool, e.paths, e.kind))
        bus.subscribe(RoundEnded, lambda e: self.end_round(e.task_id, e.ts))
        bus.subscribe(TaskCompleted, lambda e: self.complete(e.task_id, e.ts))
        bus.subscribe(ContextCompacted, lambda e: self.compacted(e.task_id, e.ts))
        bus.subscribe(MessageAdded, lambda e: self.add_message(e.task_id, e.ts, e.role, e.text))

    @property
    def first_root(self) -> str:
        return self.workspaces[0].name

    def describe_roots(self) -> list[dict[str, str]]:
        return [{"root": str(ws.root), "name": ws.name, "workspaceHash": ws.hash,
                 "shadowGitDir": str(ws.git_dir)} for ws in self.workspaces]

    # ================================================================== tasks

    def _task(self, task_id: str) -> TaskRuntime:
        self._last_request = time.monotonic()
        if not isinstance(task_id, str) or not task_id:  # a library caller's
            raise UnknownTaskError(f"Unknown task {task_id!r}.")
        with self._tasks_lock:
            rt = self._tasks.get(task_id)
        if rt is not None:
            return rt
        record = self._load_or_rebuild(task_id)
        if record is None:
            raise UnknownTaskError(f"Unknown task {task_id!r}: start it with task/start first.")
        return self._resume(task_id, record)

    def is_settled(self, task_id: str) -> bool:
        """True for a task this engine holds whose baseline is no longer building: its round
        requests do not wait for the baseline (a read, not a lock; a baseline that ends
        meanwhile only makes it true). The sidecar runs such requests on its reader thread."""
        with self._tasks_lock:
            rt = self._tasks.get(task_id)
        return rt is not None and rt.state is not TaskState.INITIALIZING

    def _load_or_rebuild(self, task_id: str) -> TaskRecord | None:
        """The task's record from its task.json, or rebuilt from the shadow refs when that file
        is gone or unreadable (kept aside, never destroyed); None for a task nobody knows.

        Before, a damaged task.json made the task unusable for good, even for task/start, and a
        deleted task folder lost every checkpoint still in the repo (tests/faults/test_damage.py).
        """
        if self.store.exists(task_id):
            try:
                return self.store.load(task_id)
            except TaskMetadataError as exc:
                aside = self.store.set_aside(task_id)
                log.warning("task.metadata_unreadable", task_id=task_id, reason=str(exc),
                            kept_as=str(aside) if aside else None)
        record = rebuild_record(task_id, self.roots, {ws.name: str(ws.root) for ws in self.workspaces})
        if record is not None:
            self.store.save(record)
        return record

    def _resume(self, task_id: str, record: TaskRecord) -> TaskRuntime:
        mine = {ws.name: str(ws.root) for ws in self.workspaces}
        if record.roots and record.roots != mine:
            raise InvalidParamsError(
                f"Task {task_id!r} belongs to the workspace {', '.join(record.roots.values())}, "
                f"not {', '.join(mine.values())}; task ids are unique per docs root.")
        rt = TaskRuntime(record)
        with self._tasks_lock:
            existing = self._tasks.get(task_id)
            if existing is not None:
                return existing
            self._tasks[task_id] = rt
        with rt.lock:
            self.restorer.recover(rt)
            if record.disabled:
                rt.state = TaskState.DISABLED
            elif record.last_snapshot() is not None:
                rt.state = TaskState.READY
                rt.round_no = len(record.checkpoints)
                # a resumed task records touched paths too (its first round rescans anyway:
                # the watcher saw nothing of what happened while no shadowpoint ran)
                for root in self.roots.values():
                    root.start_watcher(self.notify)
                self._start_verifier()
            # else: the baseline never finished (a crash); task/start or task/retry builds it,
            # never a read or a delete of the task
        return rt

    def start_task(self, task_id: str, ts: int = 0) -> TaskStatus:
        """Start (or resume) a task; its baseline builds in the background."""
        with self._tasks_lock:
            rt = self._tasks.get(task_id)
        if rt is None:
            record = self._load_or_rebuild(task_id)
            if record is not None:
                rt = self._resume(task_id, record)
        if rt is not None:
            with rt.lock:
                if rt.state is TaskState.INITIALIZING and rt.baseline is None:
                    first = rt.record.messages[0].ts if rt.record.messages else ts
                    self._baselines.begin(rt, first)
        else:
            record = TaskRecord(task_id=task_id, roots={ws.name: str(ws.root) for ws in self.workspaces})
            rt = TaskRuntime(record)
            with self._tasks_lock:
                self._tasks[task_id] = rt
            with rt.lock:
                record.add_message(ts, "user", None)
                self._baselines.begin(rt, ts)
        return self.task_state(rt)

    def wait_ready(self, task_id: str) -> TaskStatus:
        """Block until the task's baseline is built (or has failed); its state then. What a
        library caller waits on instead of polling `list_checkpoints` (each poll takes the
        GIL and the task's lock from the baseline); a round waits the same way."""
        rt = self._task(task_id)
        self._baselines.wait_ready(rt)
        return self.task_state(rt)

    def retry_task(self, task_id: str) -> TaskStatus:
        """Try the baseline again after a failure (or turn a disabled task back on)."""
        rt = self._task(task_id)
        with rt.lock:
            if rt.state in (TaskState.FAILED, TaskState.DISABLED) or (
                    rt.state is TaskState.INITIALIZING and rt.baseline is None):
                rt.record.disabled = False
                rt.record.full_write = True  # not a logged change: the next write is task.json
                ts = rt.record.messages[0].ts if rt.record.messages else 0
                if rt.record.last_snapshot() is None:
                    self._baselines.begin(rt, ts)
                else:
                    rt.state, rt.error = TaskState.READY, None
        return self.task_state(rt)

    def disable_task(self, task_id: str) -> None:
        rt = self._task(task_id)
        with rt.lock:
            rt.state = TaskState.DISABLED
            rt.record.disabled = True
            self._save(rt)

    @staticmethod
    def task_state(rt: TaskRuntime) -> TaskStatus:
        return TaskStatus(rt.state.wire, rt.error)

    def _save(self, rt: TaskRuntime) -> None:
        """Write the task's whole record (after a structural change: restores, cuts, forks)."""
        self.store.save(rt.record)

    def _append(self, rt: TaskRuntime) -> None:
        """Write what changed since the last write (messages, scope, checkpoints added by
        `TaskRecord`'s logged methods) as one line of the task's log: O(1) per round."""
        self.store.append(rt.record)

    def _baseline_built(self) -> None:
        """A baseline is built; its task is ready next. The tools that waited for it go on now:
        the background copy of borrowed blobs and the stat cache's write wait `COPY_QUIET_S`
        from here as from a request (`yield_to_rounds`). Started at once, the copy's first
        batch took the interpreter from the waiting tool's thread: 10-30 ms more on the wait
        for a 100k-file git repository's baseline."""
        self._last_request = time.monotonic()
        self._start_verifier()
        self._retain()

    def _warnings(self, root: str, result: StageResult) -> list[dict[str, str]]:
        return [{"path": self.resolver.display(self.roots[root].ws, s.path), "reason": s.reason_text}
                for s in result.stats.skipped]

    # ================================================================== rounds

    def begin_round(self, task_id: str) -> int:
        rt = self._task(task_id)
        with rt.lock:
            # While the baseline builds, its watchers may not run yet: a flush now would find
            # them stopped and leave the round unproven (a rescan at its end). No tool can
            # change files before the barrier, which waits for the watchers; the watchers'
            # part of the round opens at its first tool that may change files.
            self._open_round(rt, watch=rt.state is not TaskState.INITIALIZING)
            return rt.round_no

    def _open_round(self, rt: TaskRuntime, *, watch: bool = True) -> RoundRecorder:
        """A new round: what the watchers record from now on is the task's (its restore scope)."""
        rt.round_no += 1
        rt.recorder = recorder = RoundRecorder(rt.round_no)
        if watch:
            self._open_watch_rounds(recorder)
        return recorder

    def _open_watch_rounds(self, recorder: RoundRecorder) -> None:
        recorder.watching = True
        for root in self.roots.values():
            if root.watcher is not None:
                # events of changes made before now are recorded first (they came between rounds)
                root.watcher.flush()
                root.watcher.journal.open_round()

    def _resolve_paths(self, paths: Iterable[str] | None, *, root_ok: bool = False) -> list[tuple[str, str]]:
        """Request paths as (root name, root-relative path); `root_ok`: a root itself is ""
        (`WorkspaceResolver.resolve`)."""
        out = []
        for raw in paths or ():
            folders: dict[str, os.stat_result] = {}
            ws, rel = self.resolver.resolve(raw, folders, root_ok=root_ok)
            root = self.roots[ws.name]
            if rel and root.rules.in_nested_repo(rel, folders):
                raise PathOutsideWorkspaceError(f"{raw} is inside a nested repository, which checkpoints never touch.")
            out.append((ws.name, str(rel)))
        return out

    def tool_began(self, task_id: str, tool: str, kind: ToolKind | None, paths: Iterable[str] | None) -> None:
        rt = self._task(task_id)
        resolved_kind = tool_kind(tool, kind, self.options.read_only_tools)
        paths = list(paths or ())
        resolved = self._resolve_paths(paths) if resolved_kind is not ToolKind.READ else []
        if resolved_kind is ToolKind.EDIT and resolved:
            self._baselines.wait_for_paths(rt, resolved)  # its paths first; the rest of the baseline goes on
        elif resolved_kind is not ToolKind.READ:
            self._baselines.wait_ready(rt)  # a command (or an edit with no paths) may change anything
        with rt.lock:
            # An edit let through while the baseline builds (its paths captured) may come before
            # the baseline's watchers run; its reported paths are staged whatever they record,
            # and the watchers' part of its round opens with a later tool, after the baseline.
            building = rt.state is TaskState.INITIALIZING
            recorder = rt.recorder if rt.recorder is not None else self._open_round(rt, watch=not building)
            if not recorder.watching and resolved_kind is not ToolKind.READ and not building:
                self._open_watch_rounds(recorder)  # opened while the baseline built
            recorder.tool_began(tool, resolved_kind, resolved, paths)

    def tool_ended(self, task_id: str, tool: str, paths: Iterable[str] | None, kind: ToolKind | None = None) -> None:
        rt = self._task(task_id)
        resolved_kind = tool_kind(tool, kind, self.options.read_only_tools)
        paths = list(paths or ())
        resolved: list[tuple[str, str]] = []
        if resolved_kind is not ToolKind.READ:
            # The paths this round's begin resolved are not looked at again: they are in the
            # round already, and staging checks them as it finds them (a symlink above a path
            # stages the link). Half a round's lstats (~0.1 ms of ~1.6 ms, measured cold).
            open_round = rt.recorder
            known = open_round.known_paths(paths) if open_round is not None else None
            resolved = known if known is not None else self._resolve_paths(paths)
        with rt.lock:
            recorder = rt.recorder if rt.recorder is not None else self._open_round(rt)
            recorder.tool_ended(tool, resolved_kind, resolved)

    def end_round(self, task_id: str, ts: int) -> Checkpoint | None:
        """Close the round; one checkpoint if it held a tool that may modify the workspace."""
        cp = self._end_round(task_id, ts)
        return self.checkpoint(cp) if cp is not None else None

    def _end_round(self, task_id: str, ts: int) -> CheckpointRecord | None:
        rt = self._task(task_id)
        with rt.lock:
            rec = rt.recorder.finish() if rt.recorder is not None else None
            rt.recorder = None
            self._touch_message(rt, ts)
            if rec is None or not rec.mutating:
                self._append(rt)
                return None
            for root_name, path in rec.edited:
                rt.record.note_edited(root_name, path)
                rt.record.note_scope(root_name, [path], ts)
        if not self._baselines.wait_ready(rt):
            with rt.lock:
                self._append(rt)
            return None
        with rt.lock:
            during: dict[str, frozenset[RepoPath]] = {}
            plans = self._plans(rec, during)
            # Only a round whose changes nobody reported (a command, an edit tool without paths)
            # adds what changed while it was open to the scope (PROTOCOL 1.1 "Scope": its
            # commands' changes). A round of reported edits has its paths in the scope already;
            # taking in what changed meanwhile gave it the person's or another task's edits
            # (three tasks on one workspace: tests/faults/test_concurrency.py).
            unreported = rec.has_command or rec.has_unreported_edit
            return self._checkpoint(rt, CheckpointKind.ROUND, ts, plans, round_paths=during if unreported else None)

    def note_missed_events(self, task_id: str, reason: str) -> None:
        """Hook events of the task were lost (no sidecar listened): its next checkpoint rescans
        every root and carries a warning with `reason`, so the gap is never silent."""
        rt = self._task(task_id)
        with rt.lock:
            rt.missed_events = reason
            for root in self.roots.values():
                root.carry(StagePlan(rescan=True))

    def _plans(self, rec: RoundRecord | None,
               during: dict[str, frozenset[RepoPath]] | None = None) -> dict[str, StagePlan]:
        """Per root: edit-tool paths (forced), watcher paths, or the rescan fallback (SPEC §4).

        `rec` None is a completion: whatever changed since the last round. `during` receives,
        per watched root, the paths its watcher recorded while the round was open.
        """
        plans: dict[str, StagePlan] = {}
        for name, root in self.roots.items():
            forced = frozenset(RepoPath(p) for r, p in (rec.edited if rec else ()) if r == name)
            unknown_changes = rec is None or rec.has_command or rec.has_unreported_edit
            seen = root.watch_view()
            if seen is not None and during is not None:
                during[name] = seen[1]
            decision = stager.round_plan(forced, unknown_changes, seen[0] if seen else None, root.facts)
            if decision.rescan_because is not None and seen is not None:
                log.info("stager.rescan_fallback", root=str(root.ws.root), reasons=[decision.rescan_because])
            elif unknown_changes and seen is not None and not decision.plan.watched:
                log.debug("stager.watcher_trusted", root=str(root.ws.root), reason="a healthy watcher recorded no path")
            plans[name] = decision.plan
        return plans

    def complete(self, task_id: str, ts: int) -> Checkpoint:
        """The completion checkpoint (deduplicated against a recent one that is the same)."""
        rt = self._task(task_id)
        with rt.lock:
            self._touch_message(rt, ts)
        if not self._baselines.wait_ready(rt):
            raise CheckpointsDisabledError(f"Checkpoints are off for task {task_id}.")
        with rt.lock:
            cp = self._checkpoint(rt, CheckpointKind.COMPLETION, ts, self._plans(None), dedup_completion=True)
            return self.checkpoint(cp)

    def compacted(self, task_id: str, ts: int) -> Checkpoint:
        """A compaction checkpoint: no file snapshot (Restore Task only)."""
        rt = self._task(task_id)
        with rt.lock:
            self._touch_message(rt, ts)
            cp = CheckpointRecord(ts=ts, kind=CheckpointKind.COMPACTION, hashes={})
            rt.record.add_checkpoint(cp)
            self._append(rt)
            return self.checkpoint(cp)

    @staticmethod
    def _touch_message(rt: TaskRuntime, ts: int) -> None:
        """Record the assistant message a checkpoint is attached to (keeps a known role)."""
        known = rt.record.message(ts)
        rt.record.add_message(ts, known.role if known else "assistant", None)

    def add_message(self, task_id: str, ts: int, role: str, text: str | None) -> None:
        rt = self._task(task_id)
        with rt.lock:
            rt.record.add_message(ts, role, text)
            self._append(rt)

    def _checkpoint(self, rt: TaskRuntime, kind: CheckpointKind, ts: int, plans: dict[str, StagePlan],
                    dedup_completion: bool = False,
                    round_paths: dict[str, frozenset[RepoPath]] | None = None) -> CheckpointRecord:
        """Stage every root and record the checkpoint. `round_paths` (a round's) are the paths
        the watchers recorded while it was open: what its staging changed there joins the scope."""
        start = time.perf_counter()
        prev = rt.record.last_snapshot()
        hashes: dict[str, str] = {}
        warnings: list[dict[str, str]] = []
        reused_all = True
        stats = []
        names = list(self.roots)
        for i, (name, root) in enumerate(self.roots.items()):
            plan = root.take_carried(plans[name])
            try:
                made = checkpoint_root(root, plan, rt.record.task_id, f"{kind} checkpoint at {ts}",
                                       prev.hashes.get(name) if prev else None, hold_blobs=True,
                                       straight=kind is CheckpointKind.ROUND and self.options.straight_rounds)
                assert made is not None
                commit, result = made.commit, made.result
                reused_all = reused_all and made.reused
            except BaseException as exc:
                if isinstance(exc, RepoError):
                    root.verified = False  # check the objects it reuses before the next round
                # A commit that failed (lock timeout, repo error) must not lose its round's paths:
                # without a rescan nothing staged them again, and later checkpoints missed the
                # change (tests/faults/test_concurrency.py). The next round stages them too.
                for later in names[i:]:
                    self.roots[later].carry(plan if later == name else plans[later])
                raise
            hashes[name] = commit
            warnings.extend(self._warnings(name, result))
            stats.append(result.stats)
            if round_paths is not None:
                rt.record.note_scope(name, round_changes(result, round_paths.get(name)), ts)
        if dedup_completion and reused_all:
            recent = rt.record.timeline_ts()[-3:]
            for cp in reversed(rt.record.checkpoints):
                if cp.kind is CheckpointKind.COMPLETION and cp.ts in recent and cp.hashes == hashes:
                    log.info("checkpoint.deduplicated", task_id=rt.record.task_id, ts=cp.ts)
                    return cp
        if rt.missed_events:
            warnings.append({"path": "", "reason": f"events_missed: {rt.missed_events}; rescanned the workspace"})
            rt.missed_events = None
        cp = CheckpointRecord(ts=ts, kind=kind, hashes=hashes, reused=reused_all, warnings=warnings)
        self._add_checkpoint(rt, cp, prev, plans)
        self.maintenance.checkpointed()
        examined = changed = forced = watched = 0
        rescan = False
        for s in stats:  # a plain loop: five generators cost a cold round ~40 us (py-spy)
            examined, changed, rescan = examined + s.examined, changed + s.changed, rescan or s.rescan
        for p in plans.values():
            forced, watched = forced + len(p.forced), watched + len(p.watched)
        log.info("round.checkpointed", task_id=rt.record.task_id, kind=kind, ts=ts, reused=reused_all,
                 paths=examined, changed=changed, rescan=rescan, forced=forced, watched=watched,
                 duration_ms=round((time.perf_counter() - start) * 1e3, 2))
        return cp

    def _add_checkpoint(self, rt: TaskRuntime, cp: CheckpointRecord, prev: CheckpointRecord | None,
                        plans: dict[str, StagePlan]) -> None:
        """Add `cp` to the task and save the record. When the record cannot be written
        (`storage_failed`) the task is left as before the round: the checkpoint and its refs
        are taken back and the next round stages the round's paths again."""
        before = rt.record.timeline_mark()
        rt.record.add_checkpoint(cp)
        try:
            self._append(rt)
        except StorageFailedError:
            rt.record.take_back_checkpoint(cp, before)
            for name, root in self.roots.items():
                old = prev.hashes.get(name) if prev else None
                if old and old != cp.hashes.get(name):
                    # best effort: a ref the full disk cannot move back names an orphan commit,
                    # which the next checkpoint's ref move replaces
                    with contextlib.suppress(ShadowpointError), root.locked() as r:
                        r.repo.set_ref(task_ref(rt.record.task_id), old)
                root.carry(plans[name])
            raise

    # ================================================================== verification

    def _start_verifier(self) -> None:
        """Start the background verification of the watchers (once, if there are watchers)."""
        if not self.options.watcher or self.options.verify_interval_s <= 0:
            return
        with self._tasks_lock:
            if self._closed or self._verify_thread is not None:
                return
            thread = threading.Thread(target=self._verify_loop, name="shadowpoint-verifier", daemon=True)
            self._verify_thread = thread
            thread.start()

    def _verify_loop(self) -> None:
        pause = throttled(self.options.verify_cpu_share, self._is_idle, self._verify_stop.wait)
        while not self._verify_stop.wait(self.options.verify_interval_s):
            if self._is_idle():
                try:
                    self._verify(pause)
                except Exception:  # never fatal: the next pass tries again
                    log.exception("watcher.verification_failed")

    def _is_idle(self) -> bool:
        """True while no round is open and no baseline builds (a read, not a lock: a round that
        begins meanwhile is caught by the pass's own checks)."""
        if self._verify_stop.is_set():
            return False
        with self._tasks_lock:
            tasks = list(self._tasks.values())
        return not any(rt.recorder is not None or rt.state is TaskState.INITIALIZING for rt in tasks)

    def yield_to_rounds(self) -> None:
        """Called by a background copy or collection between batches of objects
        (`borrowed.copy_borrowed`, `ShadowRepo.collect_garbage`): wait until no round is open
        and no request came for `COPY_QUIET_S`, at most `COPY_YIELD_MAX_S` (so that a busy
        agent still sees the work end). A Python thread copying objects takes the interpreter
        from a hook's request in 5 ms slices: at 100k files that made `tool/begin` answer in
        80-100 ms instead of 2. A collection that did not yield made a sidecar's 1-file rounds
        take 10-38 ms instead of 2.3 for the 2-3 s it took at 10k files."""
        deadline = time.monotonic() + COPY_YIELD_MAX_S
        while not self._verify_stop.is_set():
            now = time.monotonic()
            if now >= deadline or (self._is_idle() and now - self._last_request >= COPY_QUIET_S):
                return
            self._verify_stop.wait(COPY_YIELD_STEP_S)

    def verify_watchers(self) -> dict[str, VerifyStats]:
        """Run one verification pass of every root's watcher now, unthrottled (SPEC §4); the
        background thread runs the same pass, throttled, while no round runs."""
        return self._verify(lambda busy_s: self._is_idle())

    def _verify(self, pause: Callable[[float], bool]) -> dict[str, VerifyStats]:
        with self._verify_lock:
            return {name: verifier.verify(pause) for name, verifier in self._verifiers.items()}

    # ================================================================== reading

    def list_checkpoints(self, task_id: str) -> CheckpointList:
        """`checkpoint/list`: the task's checkpoints in message order, and its state."""
        rt = self._task(task_id)
        with rt.lock:
            return CheckpointList(self.task_state(rt), tuple(self.checkpoint(c) for c in rt.record.checkpoints))

    def checkpoint(self, cp: CheckpointRecord) -> Checkpoint:
        """The answer for a checkpoint record: a frozen copy as it is now (its mark may change)."""
        return cp.value(self.first_root)

    def _snapshot_of(self, rt: TaskRuntime, ts: int | None) -> CheckpointRecord:
        cp = checkpoint_or_raise(rt.record, ts)
        if not cp.has_snapshot:
            raise NoFileSnapshotError(f"The checkpoint at ts={ts} has no file snapshot (Restore Task only).")
        return cp

    def diff(self, task_id: str, from_ts: int | None, to_ts: int | None = None,
             from_safety: int | None = None) -> Diff:
        """`checkpoint/diff`; `from_safety` compares the safety checkpoint of the task's restore
        number `from_safety` instead of a checkpoint (the CLI names those by hash prefix)."""
        rt = self._task(task_id)
        with rt.lock:
            old = (self._snapshot_of(rt, from_ts) if from_safety is None
                   else self.restorer.safety_record(rt, from_safety))
            new = self._snapshot_of(rt, to_ts) if to_ts is not None else None
        changes: list[FileChange] = []
        for name, root in self.roots.items():
            with root.locked() as r:
                repo = r.repo
                if new is None:
                    # the workspace as it is: what the watcher recorded since the last round
                    # (O(changes)), or a rescan when it has no healthy record
                    new_tree = r.stage(r.safety_plan(self._edited(rt, name), keep=True)).tree
                    r.set_head(new_tree)
                with damaged_checkpoint(from_ts if to_ts is None else f"{from_ts} or {to_ts}", root):
                    old_tree = self._tree(r, old.hashes.get(name))
                    if new is not None:
                        new_tree = self._tree(r, new.hashes.get(name))
                    changes.extend(file_changes(repo, old_tree, new_tree, self._displayer(root.ws)))
        return Diff(TITLE_SINCE if new is None else TITLE_NEW, by_path(changes))

    def view_changes(self, task_id: str, ts: int) -> Diff:
        """`checkpoint/viewChanges`: the completion at `ts` against the previous one (or the start)."""
        rt = self._task(task_id)
        with rt.lock:
            cp = self._snapshot_of(rt, ts)
            earlier = [c for c in rt.record.checkpoints if c.ts < cp.ts and c.has_snapshot]
            base = next((c for c in reversed(earlier) if c.kind is CheckpointKind.COMPLETION), None)
            if base is None:
                base = earlier[0] if earlier else cp
        changes: list[FileChange] = []
        for name, root in self.roots.items():
            with root.locked() as r, damaged_checkpoint(f"{base.ts} or {cp.ts}", root):
                changes.extend(file_changes(r.repo, self._tree(r, base.hashes.get(name)),
                                            self._tree(r, cp.hashes.get(name)), self._displayer(root.ws)))
        return Diff(TITLE_NEW, by_path(changes))

    def _displayer(self, ws: Workspace) -> Callable[[RepoPath], str]:
        return lambda path: self.resolver.display(ws, path)

    @staticmethod
    def _tree(root: LockedRoot, commit: str | None) -> str | None:
        repo = root.repo
        return repo.commit_tree(commit) if commit else None

    def _edited(self, rt: TaskRuntime, root_name: str) -> frozenset[RepoPath]:
        return frozenset(RepoPath(p) for p in rt.record.edited.get(root_name, ()))

    # ================================================================== restore

    def restore(self, task_id: str, ts: int, mode: RestoreMode, paths: Iterable[str] | None = None,
                dry_run: bool = False, keep_outside_edits: bool = False) -> Restore:
        """Restore files, the task, or both to the checkpoint at `ts` (PROTOCOL.md `Restore`,
        with the 1.1 options `paths`, `dryRun` and `keepOutsideEdits`)."""
        return self.restorer.restore(task_id, ts, mode, paths, dry_run, keep_outside_edits)

    def restore_safety(self, task_id: str, n: int, paths: Iterable[str] | None = None, dry_run: bool = False,
                       keep_outside_edits: bool = False) -> Restore:
        """Restore the task's files to the safety checkpoint taken before its restore number `n`."""
        return self.restorer.restore_safety(task_id, n, paths, dry_run, keep_outside_edits)

    def undo_restore(self, task_id: str) -> Restore:
        """Walk the task's undo stack back: the paths of its newest restore as they were before it."""
        return self.restorer.undo_restore(task_id)

    def redo_restore(self, task_id: str) -> Restore:
        """Walk the undo stack forward: the paths of the newest undone restore as it left them."""
        return self.restorer.redo_restore(task_id)

    def fork_task(self, task_id: str, ts: int, new_task_id: str) -> Checkpoint:
        """A new task sharing the source's snapshots up to `ts` (PROTOCOL 1.1 `task/fork`).

        Raises:
            InvalidParamsError: `new_task_id` is not a string or names a known task.
            UnknownCheckpointError: no checkpoint at or before `ts`.
        """
        if not isinstance(new_task_id, str) or not new_task_id:
            raise InvalidParamsError("`newTaskId` must be a non-empty string.")
        rt = self._task(task_id)
        if self._is_known_task(new_task_id):
            raise InvalidParamsError(f"Task {new_task_id!r} already exists; a fork needs a new task id.")
        with rt.lock:
            if not isinstance(ts, int) or isinstance(ts, bool):
                raise UnknownCheckpointError(f"No checkpoint at ts={ts!r}.")
            record = fork_record(rt.record, ts, new_task_id)
            newest = record.checkpoints[-1]
            snapshot = record.last_snapshot()
            for name, root in self.roots.items():
                commit = snapshot.hashes.get(name) if snapshot else None
                if commit:
                    with root.locked() as r:
                        r.repo.set_ref(task_ref(new_task_id), commit)
            self.store.save(record)
            rt.record.forks.append({"taskId": new_task_id, "ts": newest.ts, "createdAt": record.created_at})
            self._save(rt)
        self._resume(new_task_id, record)
        log.info("task.forked", task_id=task_id, new_task_id=new_task_id, ts=newest.ts)
        return self.checkpoint(newest)

    def _is_known_task(self, task_id: str) -> bool:
        with self._tasks_lock:
            if task_id in self._tasks:
                return True
        if self.store.exists(task_id):
            return True
        for root in self.roots.values():
            if root.ws.git_dir.is_dir():
                with root.locked() as r:
                    if r.repo.read_ref(task_ref(task_id)) is not None:
                        return True
        return False

    def edit_message(self, task_id: str, ts: int, text: str, restore: EditRestore) -> Restore:
        """Restore Chat / Restore All for an edited message."""
        return self.restorer.edit_message(task_id, ts, text, restore)

    # ================================================================== storage

    def delete_task(self, task_id: str) -> None:
        rt = self._task(task_id)
        with rt.lock:
            rt.generation += 1
            for t in rt.timers:
                t.cancel()
            with self._tasks_lock:
                self._tasks.pop(task_id, None)
            self._drop_refs(rt.record)
            self.store.delete(task_id)
        # an unreadable task.json still counts: its history must not go with the folder
        if not self.store.has_any_task():
            self.maintenance.remove_checkpoints_folder()
        else:
            self.maintenance.collect_in_background()

    def _retain(self) -> None:
        with self._tasks_lock:
            live = set(self._tasks)
        self.maintenance.retain(live)

    def delete_all(self, keep: Sequence[str]) -> None:
        keep_set = set(keep)
        ids = set(self.store.task_ids())
        with self._tasks_lock:
            ids |= set(self._tasks)
        for task_id in sorted(ids - keep_set):
            try:
                self.delete_task(task_id)
            except UnknownTaskError:
                self.store.delete(task_id)
        if not keep_set or not self.store.task_ids():
            self.maintenance.remove_checkpoints_folder()

    def _drop_refs(self, record: TaskRecord) -> None:
        for name, root in self.roots.items():
            if name not in record.roots or not root.ws.git_dir.is_dir():
                continue
            with root.locked() as r:
                delete_task_refs(r.repo, record.task_id)

    def collect_garbage(self, grace_s: float = 3600.0) -> dict[str, Any]:
        """Drop the objects no task reaches any more, in every root's shadow repo."""
        return self.maintenance.collect_now(grace_s)

    # ================================================================== lifecycle

    def close(self) -> None:
        if self._closed:
            return
        with self._tasks_lock:
            self._closed = True
        self._verify_stop.set()
        if self._verify_thread is not None:
            self._verify_thread.join()
        with self._tasks_lock:
            tasks = list(self._tasks.values())
        for rt in tasks:
            for t in rt.timers:
                t.cancel()
            if rt.baseline is not None and not rt.baseline.done():
                with contextlib.suppress(Exception):
                    rt.baseline.result(timeout=self.options.init_timeout_s)
        self.maintenance.join()
        for root in self.roots.values():
            with contextlib.suppress(Exception), root.locked() as r:
                r.close()
        self.store.close()
        self.maintenance.close()
