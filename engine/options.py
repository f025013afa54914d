"""`EngineOptions`: what the engine needs from `Settings`, derived once at an entry point.

A plain frozen value passed to `Engine` and on to each root; no engine module reads the
environment or the settings object itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from shadowpoint.observe.watcher import ObserverKind
from shadowpoint.store.storage import RetentionLimits

if TYPE_CHECKING:
    from shadowpoint.config import Settings
    from shadowpoint.config.plain import PlainSettings


@dataclass(frozen=True, slots=True)
class EngineOptions:
    """What the engine needs from `Settings`, filled in once at an entry point."""

    docs_dir: Path
    read_only_tools: frozenset[str]
    extra_exclusions: tuple[str, ...] = ()
    max_file_bytes: int = 100 * 1024 * 1024
    hash_workers: int | None = None  # None: blob_workers.default_worker_count()
    init_warn_s: float = 15.0
    init_timeout_s: float = 600.0
    watcher: bool = True
    watcher_observer: ObserverKind = "inotify"
    lock_timeout_s: float = 30.0
    retention: RetentionLimits = field(default_factory=RetentionLimits)
    gc_grace_s: float = 3600.0
    # The watcher's verification scan (SPEC §4): a pass every `verify_interval_s` while no round
    # runs (0 turns it off), kept to `verify_cpu_share` of one core.
    verify_interval_s: float = 60.0
    verify_cpu_share: float = 0.05
    # A round of edit tools' tracked files staged in a straight line (`checkpoint_root`'s
    # `straight`); off only to compare the two ways (tests, benchmarks).
    straight_rounds: bool = True

    @classmethod
    def from_settings(cls, s: Settings | PlainSettings) -> EngineOptions:
        return cls(
            docs_dir=s.resolved_docs_dir(),
            read_only_tools=frozenset(s.read_only_tools),
            extra_exclusions=tuple(s.extra_exclusions),
            max_file_bytes=s.max_file_bytes,
            hash_workers=s.hash_workers,
            init_warn_s=s.init_warn_s,
            init_timeout_s=s.init_timeout_s,
            watcher=s.watcher,
            watcher_observer=s.watcher_observer,
            lock_timeout_s=s.lock_timeout_s,
            retention=RetentionLimits(s.retention_max_age_days, s.retention_max_tasks, s.retention_max_bytes),
            gc_grace_s=s.gc_grace_s,
            verify_interval_s=s.verify_interval_s,
            verify_cpu_share=s.verify_cpu_share,
        )
