"""`RootState`: one workspace root's shadow repo, exclusion rules, stat cache, watcher and
cross-process lock.

Created by `Engine` for each root; every method that touches the repo or the cache runs
with `lock.held()` on the calling task's engine thread or the baseline thread.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import structlog

from shadowpoint.exclusions import ExclusionRules
from shadowpoint.journal import PathJournal
from shadowpoint.locking import WorkspaceLock
from shadowpoint.options import EngineOptions
from shadowpoint.scanner import Scanner, StageOptions, StagePlan, StageResult
from shadowpoint.shadow_repo import HEAD_REF, ShadowRepo
from shadowpoint.stat_cache import StatCache
from shadowpoint.watcher import WorkspaceWatcher
from shadowpoint.workspace import RepoPath, Workspace, is_git_component

log = structlog.get_logger(__name__)

Notify = Callable[[str, dict[str, Any]], None]


class RootState:
    """One workspace root: its shadow repo, rules, stat cache and lock."""

    def __init__(self, ws: Workspace, options: EngineOptions) -> None:
        self.ws = ws
        self.options = options
        self.lock = WorkspaceLock(ws.git_dir.parent / "shadowpoint.lock", options.lock_timeout_s)
        self.repo: ShadowRepo | None = None
        self.cache = StatCache()
        extra = list(options.extra_exclusions)
        with contextlib.suppress(ValueError):
            # a docs root inside the workspace never snapshots itself
            extra.append("/" + str(options.docs_dir.resolve().relative_to(ws.root)) + "/")
        self.extra = tuple(extra)
        self.rules = ExclusionRules(ws.root, extra=self.extra)
        self.scanner: Scanner | None = None
        self.watcher: WorkspaceWatcher | None = None
        # Until this process has scanned the root once, the tracked set may miss changes made
        # while no shadowpoint ran (the watcher only sees what happens after its start).
        self.scanned = False

    def start_watcher(self, notify: Notify, journal: PathJournal | None = None) -> None:
        """Start recording touched paths (before the baseline, so nothing slips between).

        Args:
            notify: sends `watcher/degraded` to the host.
            journal: a journal of the caller's (watch mode observes activity through it).
        """
        if not self.options.watcher or self.watcher is not None:
            return
        # The watcher's threads get rules of their own: ExclusionRules caches are not shared.
        rules = ExclusionRules(self.ws.root, extra=self.extra)
        rules_lock = threading.Lock()

        def skip_dirs(path: RepoPath) -> bool:
            with rules_lock:
                return rules.is_excluded(path, is_dir=True)

        def degraded(reason: str) -> None:
            log.warning("watcher.degraded", root=str(self.ws.root), reason=reason)
            notify("watcher/degraded", {"root": str(self.ws.root), "reason": reason})

        self.watcher = WorkspaceWatcher(self.ws.root, skip_dirs=skip_dirs, on_degraded=degraded, journal=journal)
        self.watcher.start()

    @property
    def cache_file(self) -> Path:
        return self.ws.git_dir / "shadowpoint" / "statcache.pickle"

    def open(self) -> ShadowRepo:
        """Open (or create) the shadow repo and bring the stat cache in line with it. Lock held."""
        if self.repo is None or not self.ws.git_dir.is_dir():
            if self.repo is not None:
                self.repo.close()
            self.repo = ShadowRepo.open_or_init(self.ws.git_dir, self.ws.root)
            self.scanner = Scanner(self.ws.root, self.repo, self.rules,
                                   StageOptions(max_file_bytes=self.options.max_file_bytes))
            head = self.repo.read_ref(HEAD_REF)
            loaded = StatCache.load(self.cache_file, head)
            self.cache = loaded if loaded is not None else StatCache()
            if loaded is None:
                self.reset_cache(head)
        else:
            head = self.repo.read_ref(HEAD_REF)
            if head != self.cache.base_commit:
                # another process (or a crash) moved the head: mirror its tree
                self.reset_cache(head)
        return self.repo

    def reset_cache(self, head: str | None) -> None:
        assert self.repo is not None
        tree = self.repo.tree_of_commit_or_none(head) if head else None
        self.cache.reset_to(tree, self.repo.list_tree(tree), head)

    def stage(self, plan: StagePlan) -> StageResult:
        """Stage `plan` into the cache's tree (lock held)."""
        self.open()
        assert self.scanner is not None
        if not self.scanned and not plan.rescan:
            plan = StagePlan(forced=plan.forced, watched=plan.watched, rescan=True)
        try:
            result = self.scanner.stage(plan, self.cache)
            self.scanned = True
            return result
        except BaseException:
            self.reset_cache(self.cache.base_commit)
            raise

    def set_head(self, tree: str | None) -> None:
        """Point the head ref at the tracked set's tree (lock held).

        The head names a tree, not a commit: it anchors every blob the stat cache may reuse
        (so garbage collection keeps them) without keeping any task's history alive.
        """
        assert self.repo is not None
        target = self.repo.tree_or_empty(tree)
        if target != self.cache.base_commit:
            self.repo.set_ref(HEAD_REF, target)
            self.cache.base_commit = target

    def tracked_count(self) -> int:
        """Files in the tracked set so far (a baseline's progress)."""
        return len(self.cache.entries)

    def save_cache(self) -> None:
        if self.repo is not None and self.ws.git_dir.is_dir():
            self.cache.save(self.cache_file)

    def close(self) -> None:
        if self.watcher is not None:
            with contextlib.suppress(Exception):
                self.watcher.stop()
            self.watcher = None
        self.save_cache()
        if self.repo is not None:
            self.repo.close()
            self.repo = None

    def forget_repo(self) -> None:
        """The checkpoints folder was deleted: drop handles, start afresh next time."""
        if self.repo is not None:
            self.repo.close()
        self.repo = None
        self.scanned = False
        self.scanner = None
        self.cache = StatCache()


def is_rules_file(path: RepoPath) -> bool:
    name = path.rsplit("/", 1)[-1]
    return name in (".gitignore", ".gitattributes", ".gitmodules") or is_git_component(name)
