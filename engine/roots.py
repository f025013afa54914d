"""`RootState`: one workspace root's shadow repo, exclusion rules, stat cache, watcher and
cross-process lock; `LockedRoot`: the root with its lock held, the only way to its repository.

Created by `Engine` for each root. Whatever touches the repository, the staging or the head
goes through `with root.locked() as r:` (jj's locked working copy): `r.repo`, `r.stage`,
`r.set_head`, ... exist only on the `LockedRoot` it yields, so that an access without the lock
cannot be written. Runs on the calling task's engine thread or the baseline thread.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import structlog

from shadowpoint.errors import LockTimeoutError, RepoError, ShadowpointError
from shadowpoint.observe.journal import JournalSnapshot, PathJournal
from shadowpoint.observe.watcher import WorkspaceWatcher
from shadowpoint.options import EngineOptions
from shadowpoint.stage import stager
from shadowpoint.stage.blob_workers import BlobWorkerOptions
from shadowpoint.stage.early_capture import EarlyCapture
from shadowpoint.stage.exclusions import ExclusionRules
from shadowpoint.stage.scanner import Scanner, StageOptions, StageResult
from shadowpoint.stage.stager import RootFacts, StagePlan, WatchView, staging_plan
from shadowpoint.stage.stat_cache import StatCache, state_entry, state_oid
from shadowpoint.store import borrowed
from shadowpoint.store.locking import WorkspaceLock
from shadowpoint.store.shadow_repo import ShadowRepo
from shadowpoint.store.values import HEAD_REF
from shadowpoint.workspace import RepoPath, Workspace

log = structlog.get_logger(__name__)

# How long the root's background thread tries the lock at a time (`RootState._held_in_background`).
_BACKGROUND_LOCK_TRY_S = 0.05


class _Closing(Exception):
    """The root closes: its background thread stops waiting for the lock."""

Notify = Callable[[str, dict[str, Any]], None]


@dataclass(frozen=True, slots=True)
class _Handles:
    """The open repository of a root and the scanner writing into it."""

    repo: ShadowRepo
    scanner: Scanner


class RootState:
    """One workspace root: its shadow repo, rules, stat cache and lock (repository access:
    `locked`)."""

    def __init__(self, ws: Workspace, options: EngineOptions) -> None:
        self.ws = ws
        self.options = options
        self.lock = WorkspaceLock(ws.git_dir.parent / "shadowpoint.lock", options.lock_timeout_s)
        self._handles: _Handles | None = None  # reached through `locked()` only
        self.cache = StatCache()
        extra = list(options.extra_exclusions)
        with contextlib.suppress(ValueError):
            # a docs root inside the workspace never snapshots itself
            extra.append("/" + str(options.docs_dir.resolve().relative_to(ws.root)) + "/")
        self.extra = tuple(extra)
        self.rules = ExclusionRules(ws.root, extra=self.extra)
        self.watcher: WorkspaceWatcher | None = None
        # Until this process has scanned the root once, the tracked set may miss changes made
        # while no shadowpoint ran (the watcher only sees what happens after its start).
        self.scanned = False
        # Whether the watcher was already running when the latest whole-workspace scan began: only
        # then does "the watcher recorded nothing" prove that nothing changed since (SPEC §4).
        self.watched_since_scan = False
        # Stagings so far (a verification that overlapped one gives up its verdict).
        self.stages = 0
        # Paths of a round whose commit failed, staged again with the next round's plan.
        self._carried: StagePlan | None = None
        # Whether the objects the stat cache reuses were checked to exist in this process: a
        # lost loose object or pack otherwise made every later round fail, or commit trees
        # naming blobs that no longer exist (tests/faults/test_damage.py).
        self.verified = False
        self._reopen = False
        # Tracked paths that exclusions cover (force-added by edit tools): the watcher does not
        # watch excluded folders, so a round using its paths stages these too. Without it, a
        # command changing a force-added node_modules/ file was missed (tests/property/test_model.py).
        self._excluded_tracked: set[RepoPath] = set()
        # The background thread: it copies the blobs a baseline borrowed from the user's git
        # objects (borrowed.py) and writes a stat cache left due; a test seam that holds it until
        # set, and what it calls between batches of objects (the engine's `yield_to_rounds`).
        self.copy_gate: threading.Event | None = None
        self.copy_pause: Callable[[], None] | None = None
        self._copier: threading.Thread | None = None
        self._copy_stop = threading.Event()
        # what the thread has still to do, and whether it runs (it ends under this lock)
        self._upkeep_lock = threading.Lock()
        self._copy_due = False
        self._upkeep_running = False
        self.last_copy: borrowed.CopyReport | None = None
        # A whole scan's stat cache, left for that thread to write (`save_cache_soon`).
        self._cache_due = False
        # Small packs of rounds to merge (`ShadowRepo.merge_small_packs`), by that thread too.
        self._merge_due = False

    @property
    def will_start_watcher(self) -> bool:
        """Whether `start_watcher` would start one (the options want it and none runs yet)."""
        return self.options.watcher and self.watcher is None

    def start_watcher(self, notify: Notify, journal: PathJournal | None = None, *, deferred: bool = False) -> None:
        """Start recording touched paths (before the baseline, so nothing slips between).

        Args:
            notify: sends `watcher/degraded` to the host.
            journal: a journal of the caller's (watch mode observes activity through it).
            deferred: the next stage is a rescan that places the watches as it lists the folders
                (`WorkspaceWatcher.start`); until it ends no event is recorded.
        """
        if not self.will_start_watcher:
            return
        # The watcher's threads get rules of their own: ExclusionRules caches are not shared.
        rules = ExclusionRules(self.ws.root, extra=self.extra)
        rules_lock = threading.Lock()

        def skip_dirs(path: RepoPath) -> bool:
            with rules_lock:
                return rules.is_excluded(path, is_dir=True)

        def placed() -> None:
            # the decisions cached for every folder while the watches were placed (~20 MiB at
            # 1M files, kept for good): a new folder's check reads its ancestors again
            with rules_lock:
                rules.invalidate(RepoPath(""))

        def degraded(reason: str) -> None:
            log.warning("watcher.degraded", root=str(self.ws.root), reason=reason)
            notify("watcher/degraded", {"root": str(self.ws.root), "reason": reason})

        self.watcher = WorkspaceWatcher(self.ws.root, skip_dirs=skip_dirs, on_placed=placed, on_degraded=degraded,
                                        journal=journal, observer_kind=self.options.watcher_observer)
        self.watcher.start(deferred=deferred)

    @property
    def cache_file(self) -> Path:
        return self.ws.git_dir / "shadowpoint" / "statcache.bin"

    @contextlib.contextmanager
    def locked(self) -> Iterator[LockedRoot]:
        """Hold the workspace lock (against other processes and this process's other threads;
        reentrant) and yield the root as seen under it.

        Raises:
            LockTimeoutError: another process held the lock longer than `lock_timeout_s`.
        """
        with self.lock.held():
            locked = LockedRoot(self)
            try:
                yield locked
            except BaseException:
                with contextlib.suppress(ShadowpointError):
                    self._flush()  # what the hold wrote, before another process may look (a failure logs)
                raise
            else:
                self._flush()
            finally:
                locked._released = True

    def _flush(self) -> None:
        """Write the trees and commits the shadow repo holds in memory (`ShadowRepo.flush`),
        and have the background thread merge the small packs once enough have piled up."""
        handles = self._handles
        if handles is None:
            return
        try:
            handles.repo.flush()
        except ShadowpointError as exc:
            log.warning("shadow_repo.flush_failed", root=str(self.ws.root), reason=str(exc))
            raise
        if handles.repo.merge_due:
            self._merge_due = True
            self._wake(copy=False)

    def _open(self) -> _Handles:
        """Open (or create) the shadow repo and bring the stat cache in line with it (LockedRoot)."""
        handles = self._handles
        # a head read from the git dir shows the git dir is still there: a stat of it a round less
        head = handles.repo.read_ref(HEAD_REF) if handles is not None else None
        if handles is None or (head is None and not self.ws.git_dir.is_dir()):
            if handles is not None:
                handles.repo.close()
            repo = ShadowRepo.open_or_init(self.ws.git_dir, self.ws.root)
            workers = BlobWorkerOptions() if self.options.hash_workers is None else BlobWorkerOptions(
                workers=self.options.hash_workers)
            stage_options = StageOptions(max_file_bytes=self.options.max_file_bytes, workers=workers)
            handles = self._handles = _Handles(repo, Scanner(self.ws.root, repo, self.rules, stage_options))
            head = repo.read_ref(HEAD_REF)
            loaded = StatCache.load(self.cache_file, head)
            self.cache = loaded if loaded is not None else StatCache()
            self.verified = False
            if loaded is None:
                self._reset_or_forget(repo, head)
            if borrowed.ledger_path(self.ws.git_dir).exists():
                self.start_copy()  # a copy a crash (or a close) interrupted: resume it
        else:
            handles.repo.reopen_after_collection()  # another process's gc removed packs we hold
            if head != self.cache.base_commit:
                # another process (or a crash) moved the head: mirror its tree
                self._reset_or_forget(handles.repo, head)
        if head is None:
            # No snapshot: the tracked set is empty, whatever this process scanned before. A shadow
            # repo made again after its git dir was removed under a running engine, or a head ref
            # removed, rescans: their next round had committed only that round's paths.
            self.scanned = False
        return handles

    def _reset_cache(self, repo: ShadowRepo, head: str | None) -> None:
        tree = repo.tree_of_commit_or_none(head) if head else None
        self.cache.reset_to(tree, repo.list_tree(tree), head)

    def _reset_or_forget(self, repo: ShadowRepo, head: str | None) -> None:
        """`_reset_cache`, or an empty tracked set when the head's tree is unreadable (damage):
        the next stage then rescans and writes every object again."""
        try:
            self._reset_cache(repo, head)
        except RepoError as exc:
            log.warning("shadow_repo.objects_missing", root=str(self.ws.root), reason=str(exc),
                        action="the tracked set is rebuilt from the workspace")
            self.cache.reset_to(None, {}, head)
            self.scanned = False
            self.verified = False

    def _stage(self, handles: _Handles, plan: StagePlan, capture: EarlyCapture | None,
               borrow: bool) -> StageResult:
        """`LockedRoot.stage`."""
        repo, scanner = handles.repo, handles.scanner
        if not self.verified:
            plan = self._verify(repo, plan)
        plan = staging_plan(plan, self.facts, self.watcher is not None,
                            self.excluded_tracked() if self._excluded_tracked else frozenset())
        self.stages += 1
        watcher = self.watcher
        watching = watcher is not None and watcher.is_running
        # a deferred start's watches: placed by this rescan as it lists the folders
        placer = watcher.take_placer() if watcher is not None and plan.rescan else None
        try:
            try:
                result = scanner.stage(plan, self.cache, capture, borrow=borrow, watches=placer)
            finally:
                if watcher is not None and placer is not None:
                    watcher.placed()
        except RepoError as exc:
            # Objects vanished under a running engine: repair the tracked set, try once more.
            log.warning("shadow_repo.objects_missing", root=str(self.ws.root), reason=str(exc))
            self.verified = False
            plan = self._verify(repo, StagePlan(forced=plan.forced, watched=plan.watched, rescan=True), damaged=True)
            result = self._stage_or_reset(handles, plan, capture)
        except BaseException:
            self._reset_or_forget(repo, self.cache.base_commit)
            raise
        self.scanned = True
        if result.stats.borrowed:
            # the borrowed blobs become the shadow repo's own, off the agent's path: the copy
            # reads the ledger under this lock, so it starts once the baseline's commit is done
            self.start_copy()
        if plan.rescan:
            self._excluded_tracked = set(result.stats.outside_walk)
            self.watched_since_scan = watching
        self.note_tracked(plan.forced)
        return result

    def _stage_straight(self, handles: _Handles, plan: StagePlan) -> StageResult | None:
        """`_stage` of a round's common case (`Scanner.stage_edited_files`): edit tools' paths,
        and at most the same paths recorded by the watcher, on a root this process has scanned
        and checked, with nothing the general path would add (tracked files an exclusion hides
        from the watcher). None when the plan or the root is not that case: nothing changed."""
        if plan.rescan or plan.vouched or not plan.forced or not plan.watched <= plan.forced \
                or not (self.scanned and self.verified) or (self._excluded_tracked and self.watcher is not None):
            return None
        result = handles.scanner.stage_edited_files(plan.forced, self.cache)
        if result is not None:
            self.stages += 1
            self.note_tracked(plan.forced)
        return result

    def note_tracked(self, paths: Iterable[RepoPath]) -> None:
        """Remember which of `paths` (and what lies under them) are tracked despite an exclusion."""
        entries = self.cache.entries
        for path in paths:
            # a file costs one rule check; only a reported folder is looked into
            for tracked in (path,) if path in entries else self.cache.under(path):
                if self.rules.is_excluded(tracked, is_dir=False):
                    self._excluded_tracked.add(tracked)

    def excluded_tracked(self) -> frozenset[RepoPath]:
        """Tracked paths an exclusion covers (the watcher may not see them change)."""
        entries = self.cache.entries
        self._excluded_tracked = {p for p in self._excluded_tracked if p in entries}
        return frozenset(self._excluded_tracked)

    def mark_damaged(self) -> None:
        """A read found objects missing: check (and repair) the tracked set before the next stage."""
        self.verified = False
        self._reopen = True

    def _stage_or_reset(self, handles: _Handles, plan: StagePlan, capture: EarlyCapture | None) -> StageResult:
        try:
            return handles.scanner.stage(plan, self.cache, capture)
        except BaseException:
            self._reset_or_forget(handles.repo, self.cache.base_commit)
            self.verified = False
            raise

    def _verify(self, repo: ShadowRepo, plan: StagePlan, damaged: bool = False) -> StagePlan:
        """Check that the tree and blobs the stat cache reuses exist; repair the cache if not.

        Paths whose blob is gone leave the tracked set and are force-staged from the disk (the
        blob comes back when the file still holds it, which mends older checkpoints too); a
        lost tree is rebuilt from the tracked entries (the same entries give it back: that
        mends older checkpoints too). Returns the plan to stage.
        """
        if self._reopen or damaged:
            repo.reopen()
            self._reopen = False
        entries = self.cache.entries
        lost_blobs = [p for p, st in entries.items() if not repo.has_object(state_oid(st).hex())]
        lost_trees = repo.missing_trees(self.cache.tree, limit=1)
        self.verified = True
        if not (lost_blobs or lost_trees or damaged):
            return plan
        log.warning("shadow_repo.objects_missing", root=str(self.ws.root), blobs=len(lost_blobs),
                    trees=len(lost_trees), action="rebuilding the tracked set from the workspace")
        if lost_trees:
            # the trees of the tracked set as it is, lost blobs' ids included: a tree lost with
            # the same files (one a baseline took from the user's index: borrowed.py) is whole
            # again, and so are the checkpoints that name it
            repo.patch_tree(None, {p: state_entry(st) for p, st in entries.items()})
        for path in lost_blobs:
            self.cache.remove(path)
        self.cache.tree = repo.patch_tree(None, {p: state_entry(st) for p, st in self.cache.entries.items()})
        self.scanned = False
        return StagePlan(forced=plan.forced | frozenset(lost_blobs), watched=plan.watched, rescan=True)

    @property
    def has_carried(self) -> bool:
        """True while a failed commit's paths wait for the next round."""
        return self._carried is not None

    def carry(self, plan: StagePlan) -> None:
        """Keep `plan` for the next round: its commit failed (engine thread, any lock state)."""
        self._carried = plan if self._carried is None else self._carried.merge(plan)

    def take_carried(self, plan: StagePlan) -> StagePlan:
        """`plan` plus whatever a failed commit left; clears the carried paths."""
        carried, self._carried = self._carried, None
        return plan if carried is None else carried.merge(plan)

    @property
    def facts(self) -> RootFacts:
        return RootFacts(scanned=self.scanned, watched_since_scan=self.watched_since_scan)

    def watch_view(self) -> tuple[WatchView, frozenset[RepoPath]] | None:
        """At a round's end: the watcher's record since the last round (taken: the next round
        starts afresh) and what it recorded while the round was open; None without a watcher."""
        if self.watcher is None:
            return None
        view, snap = self._take_watch(self.watcher)
        return view, snap.during

    @staticmethod
    def _take_watch(watcher: WorkspaceWatcher) -> tuple[WatchView, JournalSnapshot]:
        """The watcher's flush barrier, then its record since the last round (taken). A watcher
        whose root was gone starts again first if the root is back: the round it missed rescans,
        and the next one starts with the watcher running."""
        if not watcher.is_running:
            watcher.start_if_root_back()
        flushed = watcher.flush()
        snap = watcher.swap()
        return WatchView(flushed, snap.healthy, snap.paths, tuple(snap.reasons)), snap

    def tracked_count(self) -> int:
        """Files in the tracked set so far (a baseline's progress)."""
        return len(self.cache.entries)

    def save_cache(self) -> None:
        if self._handles is not None and self.ws.git_dir.is_dir():
            self.cache.save(self.cache_file)

    def save_cache_soon(self) -> None:
        """After a whole scan (lock held): the stat cache is written by the background thread
        (`_wake`, the one that copies borrowed blobs) at the first quiet moment, and on close
        anyway. Written on the spot, its ~30 ms at 100k files were part of every baseline,
        which a task's first command waits for; lost to a crash before then, it costs the next
        start a rescan."""
        self._cache_due = True
        self._wake(copy=False)

    def _save_due_cache(self) -> None:
        """`save_cache_soon`'s write, once no round ran for a moment (`copy_pause`, asked again
        whenever the lock was taken meanwhile); none when the root closes first (the close
        writes it)."""
        if self._cache_due:
            with self._held_in_background(between=self._pause_copy):
                if self._cache_due:
                    self._cache_due = False
                    self.save_cache()

    def _merge_due_packs(self) -> None:
        """Merge the rounds' small packs (`ShadowRepo.merge_small_packs`) at a quiet moment, as
        `_save_due_cache` writes the stat cache; a failure is logged and tried again later."""
        if self._merge_due:
            with self._held_in_background(between=self._pause_copy):
                if self._merge_due and self._handles is not None:
                    self._merge_due = False
                    try:
                        self._handles.repo.merge_small_packs()
                    except ShadowpointError as exc:
                        log.warning("shadow_repo.merge_failed", root=str(self.ws.root), reason=str(exc),
                                    action="merged with the next ones")

    @contextlib.contextmanager
    def _held_in_background(self, between: Callable[[], bool] | None = None) -> Iterator[None]:
        """The workspace lock, for the background thread: tried briefly, again and again (after
        `between()`, whose False gives up), until it is free; `_Closing` once the root closes.
        The close holds the lock while it waits for this thread, which therefore must never
        wait out the lock's own timeout (tests/integration/test_stat_cache_upkeep.py)."""
        with contextlib.ExitStack() as stack:
            while True:
                if self._copy_stop.is_set() or (between is not None and not between()):
                    raise _Closing
                try:
                    stack.enter_context(self.lock.held(timeout_s=_BACKGROUND_LOCK_TRY_S, make_folder=False))
                    break
                except LockTimeoutError:
                    continue  # a round, another process or the close holds it
                except FileNotFoundError:
                    raise _Closing from None  # the checkpoints folder was deleted: nothing to keep
            yield

    # ------------------------------------------------------------------ borrowed blobs

    def start_copy(self) -> None:
        """Copy the blobs a baseline borrowed from the user's repository into the shadow repo,
        on the background thread (nothing when no ledger is left)."""
        self._wake(copy=True)

    def _wake(self, *, copy: bool) -> None:
        """Have the background thread write a stat cache that is due (`save_cache_soon`) and,
        if `copy`, copy borrowed blobs: started unless it runs, when it takes the work on
        before it ends."""
        with self._upkeep_lock:
            self._copy_due = self._copy_due or copy
            if self._upkeep_running:
                return
            self._upkeep_running = True
            self._copy_stop.clear()
            self._copier = threading.Thread(target=self._upkeep, name=f"shadowpoint-copy:{self.ws.name}",
                                            daemon=True)
            self._copier.start()

    def _upkeep(self) -> None:
        try:
            gate = self.copy_gate
            while gate is not None and not gate.wait(0.05):
                if self._copy_stop.is_set():
                    return
            while self._upkeep_step():
                pass
        finally:
            with self._upkeep_lock:
                if self._copier is threading.current_thread():  # not a newer thread's
                    self._upkeep_running = False

    def _upkeep_step(self) -> bool:
        """One pass of the background thread; False when it ends (nothing left, or stopped:
        a copy left undone is resumed by the next open)."""
        with self._upkeep_lock:
            copy, self._copy_due = self._copy_due, False
            if not copy and not self._cache_due and not self._merge_due:
                self._upkeep_running = False
                return False
        git_dir = self.ws.git_dir
        try:
            self._save_due_cache()
            self._merge_due_packs()
            if not copy:
                return True
            borrowed.sweep_staging(git_dir)
            report = borrowed.copy_borrowed(git_dir, self.ws.root, self._held_in_background, self._pause_copy)
        except _Closing:
            return False
        except (ShadowpointError, OSError) as exc:
            log.warning("borrowed.copy_failed", root=str(self.ws.root), reason=str(exc),
                        action="the next open tries again")
            return False
        if report.stopped:
            log.info("borrowed.copy_stopped", root=str(self.ws.root), action="the next open resumes it")
            return False
        self.last_copy = report
        if report.lost:
            self.mark_damaged()  # the next stage re-hashes what is still on disk
        return not self._copy_stop.is_set()

    def _pause_copy(self) -> bool:
        """Between two batches of the copy: yield to the rounds; False (stop) once the root closes."""
        if not self._copy_stop.is_set() and self.copy_pause is not None:
            self.copy_pause()
        return not self._copy_stop.is_set()

    def wait_copied(self, timeout: float | None = None) -> bool:
        """Block until the background copy ended; True if no copy runs."""
        copier = self._copier
        if copier is not None:
            copier.join(timeout)
            return not copier.is_alive()
        return True

    def _close(self) -> None:
        self._copy_stop.set()
        self.wait_copied()
        if self.watcher is not None:
            with contextlib.suppress(Exception):
                self.watcher.stop()
            self.watcher = None
        self.save_cache()
        if self._handles is not None:
            self._handles.repo.close()
            self._handles = None

    def _forget_repo(self) -> None:
        with self._upkeep_lock:  # nothing left to write or copy (the background thread ends)
            self._cache_due = self._merge_due = self._copy_due = False
        if self._handles is not None:
            self._handles.repo.close()
        self._handles = None
        self.scanned = False
        self.watched_since_scan = False
        self.cache = StatCache()


class LockedRoot:
    """A root whose workspace lock this thread holds (`RootState.locked`): its shadow
    repository, its staging and its head. Valid only inside the `with` block that made it."""

    __slots__ = ("_handles", "_released", "state")

    def __init__(self, state: RootState) -> None:
        self.state = state
        self._handles: _Handles | None = None
        self._released = False

    @property
    def ws(self) -> Workspace:
        return self.state.ws

    @property
    def cache(self) -> StatCache:
        return self.state.cache

    def open(self) -> ShadowRepo:
        """The shadow repo, opened (or created) on the first use under this hold and brought in
        line with other processes' collections and head moves; the stat cache follows it."""
        return self._opened().repo

    @property
    def repo(self) -> ShadowRepo:
        """`open()`: the shadow repository."""
        return self._opened().repo

    def _opened(self) -> _Handles:
        if self._released:
            raise RuntimeError(f"the lock of {self.state.ws.root} was released: reach its repository "
                               "inside `with root.locked() as r:`")
        handles = self._handles
        if handles is None or self.state._handles is not handles:
            handles = self._handles = self.state._open()
        return handles

    def reset_cache(self, head: str | None) -> None:
        """Make the tracked set mirror the tree of commit `head` (None: empty)."""
        self.state._reset_cache(self.open(), head)

    def stage(self, plan: StagePlan, capture: EarlyCapture | None = None, borrow: bool = False) -> StageResult:
        """Stage `plan` into the cache's tree; `capture`: a baseline's early paths; `borrow`: a
        baseline may take ids from the user's git index (the copy then starts by itself)."""
        return self.state._stage(self._opened(), plan, capture, borrow)

    def stage_straight(self, plan: StagePlan) -> StageResult | None:
        """`stage` of a round's common case in a straight line, or None when `plan` is not that
        case and `stage` must take it (`RootState._stage_straight`)."""
        return self.state._stage_straight(self._opened(), plan)

    def capture_early(self, capture: EarlyCapture) -> None:
        """Before the baseline's scan: record now the paths edit tools asked for."""
        self._opened().scanner.capture(capture, self.state.cache)

    def set_head(self, tree: str | None) -> None:
        """Point the head ref at the tracked set's tree.

        The head names a tree, not a commit: it anchors every blob the stat cache may reuse
        (so garbage collection keeps them) without keeping any task's history alive. It is
        moved without waiting for its bytes to reach the disk (`durable=False`): a head that a
        power cut empties or removes reads as none, and the next stage rescans (the stat cache
        is saved under the head it was made for, so it is not trusted either).
        """
        repo = self.open()
        target = repo.tree_or_empty(tree)
        if target != self.cache.base_commit:
            repo.set_ref(HEAD_REF, target, durable=False)
            self.cache.base_commit = target

    def safety_plan(self, forced: frozenset[RepoPath], *, keep: bool = False) -> StagePlan:
        """What a safety checkpoint stages: with a healthy watcher only what it recorded since
        the last round (O(changes)), else a rescan.

        `keep` leaves the recorded paths and health to the next round too (a compare with the
        workspace: without it, a following command round found nothing recorded and rescanned).
        """
        state = self.state
        watch = None
        if state.watcher is not None and state.scanned:
            watch, snap = state._take_watch(state.watcher)
            if keep:
                state.watcher.journal.put_back(snap)
            elif snap.opened:
                state.watcher.journal.open_round()  # a round is still open: what follows is its own
        entries, rules = state.cache.entries, state.rules

        def reported(path: RepoPath) -> bool:  # tracked, and no rule hides it (or a folder above) from the watcher
            return path in entries and not rules.is_excluded(path, is_dir=False)

        return stager.safety_plan(forced, watch, state.facts, reported)

    def baseline_plan(self, capture: EarlyCapture | None) -> StagePlan:
        """What a task's baseline stages on this root (SPEC §4). The whole scan for a root this
        process has not scanned yet (a new or reopened shadow repo) or whose watcher cannot
        vouch for it; otherwise, a healthy watcher being authoritative, what it recorded since
        the root's latest snapshot, O(changes): every later task of a running sidecar or watch
        (a 100k-file baseline took a 0.6 s rescan). Paths an edit tool's capture pinned keep
        the content captured (their later changes are the task's first round's)."""
        state = self.state
        watcher = state.watcher
        if watcher is None or not state.scanned or not watcher.is_running:
            return StagePlan(rescan=True)
        plan = self.safety_plan(frozenset())
        if plan.rescan or capture is None or not capture.pinned:
            return plan
        return replace(plan, watched=plan.watched - capture.pinned)

    def note_tracked(self, paths: Iterable[RepoPath]) -> None:
        """`RootState.note_tracked`."""
        self.state.note_tracked(paths)

    def mark_damaged(self) -> None:
        """`RootState.mark_damaged`."""
        self.state.mark_damaged()

    def save_cache_soon(self) -> None:
        """`RootState.save_cache_soon`."""
        self.state.save_cache_soon()

    def close(self) -> None:
        """Stop the root's watcher and background copy, save the cache, close the repository."""
        self.state._close()
        self._handles = None

    def forget_repo(self) -> None:
        """The checkpoints folder was deleted: drop handles, start afresh next time."""
        self.state._forget_repo()
        self._handles = None

