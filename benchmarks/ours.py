"""Our side of the benchmarks: the engine driven in-process through its public API.

`OurEngine` wraps one `Engine` on one root with a docs dir of its own, hands out rising
message timestamps and times only the engine's calls (never the benchmark's own file
writes). Used on the runner's main thread; the engine builds baselines on its own thread.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from shadowpoint.config import DEFAULT_READ_ONLY_TOOLS
from shadowpoint.engine import Engine, EngineOptions
from shadowpoint.kinds import RestoreMode, ToolKind
from shadowpoint.results import Checkpoint
from shadowpoint.store.loose import live_pools

EDIT_TOOL = "write_to_file"
COMMAND_TOOL = "execute_command"
# the engine's background packs, and each root's thread that writes a baseline's stat cache
# and copies borrowed blobs (it waits for a quiet moment: up to ~0.3 s here)
BACKGROUND_THREAD_PREFIXES = ("shadowpoint-gc", "shadowpoint-copy")


class NotReadyError(RuntimeError):
    """A task's baseline ended in an error state."""


@dataclasses.dataclass(slots=True)
class BackgroundWaits:
    """Time spent waiting, outside every timing, for the engine's background threads
    (`BACKGROUND_THREAD_PREFIXES`; `packs` counts every one joined)."""

    packs: int = 0
    seconds: float = 0.0

    def settle(self) -> None:
        """Join every running background pack and stat cache write or blob copy of any engine
        in this process, then write back dirty pages (sync).

        The engine packs loose objects in a background thread every so many checkpoints; a
        timed operation (ours or the rival's) running beside it would measure the pack too.
        Likewise the kernel's writeback of what the previous operation wrote (the 100k
        baselines leave ~1.5 GB of dirty pages): measured here, a 1-file probe commit took
        3.5 ms during it and 1.1 ms after. Both sides settle before every timed operation.
        And the engine's file pools are filled (loose.py): the sidecar refills its pool in the
        time between an agent's rounds, which a loop of rounds one right after the other lacks.
        """
        for t in threading.enumerate():
            if t.name.startswith(BACKGROUND_THREAD_PREFIXES) and t.is_alive():
                start = time.perf_counter()
                t.join()
                self.packs += 1
                self.seconds += time.perf_counter() - start
        for pool in live_pools():  # the files a round's objects go into, made between rounds
            pool.fill()
        os.sync()

    def to_json(self) -> dict[str, Any]:
        return {"packs_waited_for": self.packs, "seconds": round(self.seconds, 3)}


def engine_options(docs_dir: Path, *, watcher: bool) -> EngineOptions:
    """Options for a benchmark engine; fields this engine version lacks are left out."""
    wanted: dict[str, Any] = {
        "docs_dir": docs_dir,
        "read_only_tools": frozenset(DEFAULT_READ_ONLY_TOOLS),
        "watcher": watcher,
        # a 1M-file baseline may take longer than the defaults; the bench reports it anyway
        "init_warn_s": 24 * 3600.0,
        "init_timeout_s": 24 * 3600.0,
    }
    known = {f.name for f in dataclasses.fields(EngineOptions)}
    return EngineOptions(**{k: v for k, v in wanted.items() if k in known})


class OurEngine:
    """One engine on one workspace root."""

    def __init__(self, root: Path, docs_dir: Path, *, watcher: bool = False,
                 background: BackgroundWaits | None = None) -> None:
        self.root = root
        self.background = background if background is not None else BackgroundWaits()
        self.docs_dir = docs_dir
        self.watcher_requested = watcher
        self.eng = Engine([root], engine_options(docs_dir, watcher=watcher))
        self._ts = itertools.count(1_000)
        self.baseline_ts: dict[str, int] = {}
        self._started: dict[str, float] = {}  # perf_counter at task/start (first_edit)
        # a pyinstrument Profiler (`--profile`), running only inside the timed engine calls
        self.profiler: Any = None

    @contextlib.contextmanager
    def _profiled(self) -> Iterator[None]:
        if self.profiler is None:
            yield
            return
        self.profiler.start()
        try:
            yield
        finally:
            self.profiler.stop()

    def next_ts(self) -> int:
        return next(self._ts) * 1_000

    @property
    def shadow_git_dir(self) -> Path:
        return Path(self.eng.describe_roots()[0]["shadowGitDir"])

    def start(self, task: str) -> float:
        """Start `task` and wait until its baseline is ready; seconds from start to ready."""
        ts = self.next_ts()
        self.baseline_ts[task] = ts
        self.background.settle()
        start = time.perf_counter()
        self.eng.start_task(task, ts=ts)
        self.wait_ready(task)
        return time.perf_counter() - start

    def wait_ready(self, task: str) -> None:
        """Until `task`'s baseline is built, blocked on it (`Engine.wait_ready`), as a round
        waits. Polling `list_checkpoints` with a growing interval (to 2% of the wait) added up
        to that much slack to every baseline's figure and took the GIL from its threads at each
        poll (a 1M-file baseline polled every 2 ms took 380-413 s, one polled every 0.1 s 240 s)."""
        status = self.eng.wait_ready(task)
        if status.state != "ready":
            raise NotReadyError(f"task {task}: {status.state} {status.error}")

    def baseline_hash(self, task: str) -> str:
        for cp in self.eng.list_checkpoints(task).checkpoints:
            if cp.kind == "baseline":
                return str(cp.hash)
        raise NotReadyError(f"task {task} has no baseline checkpoint")

    def last_checkpoint(self, task: str) -> dict[str, Any]:
        cps = [cp for cp in self.eng.list_checkpoints(task).checkpoints if cp.hash]
        return dict(cps[-1].to_wire())

    def edit_round(self, task: str, paths: Sequence[str], write: Callable[[], object]) -> tuple[float, Checkpoint]:
        """A round with one edit tool that wrote `paths`; engine time only (the write excluded)."""
        self.background.settle()
        with self._profiled():
            t0 = time.perf_counter()
            self.eng.begin_round(task)
            self.eng.tool_began(task, EDIT_TOOL, ToolKind.EDIT, list(paths))
            t1 = time.perf_counter()
        write()
        with self._profiled():
            t2 = time.perf_counter()
            self.eng.tool_ended(task, EDIT_TOOL, list(paths))
            cp = self.eng.end_round(task, self.next_ts())
            t3 = time.perf_counter()
        if cp is None:
            raise NotReadyError(f"task {task}: an edit round made no checkpoint")
        return (t1 - t0) + (t3 - t2), cp

    def command_round(self, task: str, write: Callable[[], None] | None) -> tuple[float, Checkpoint]:
        """A round that ran one shell command (which may have changed files through `write`)."""
        self.background.settle()
        with self._profiled():
            t0 = time.perf_counter()
            self.eng.begin_round(task)
            self.eng.tool_began(task, COMMAND_TOOL, ToolKind.COMMAND, None)
            t1 = time.perf_counter()
        if write is not None:
            write()
        with self._profiled():
            t2 = time.perf_counter()
            self.eng.tool_ended(task, COMMAND_TOOL, None)
            cp = self.eng.end_round(task, self.next_ts())
            t3 = time.perf_counter()
        if cp is None:
            raise NotReadyError(f"task {task}: a command round made no checkpoint")
        return (t1 - t0) + (t3 - t2), cp

    def first_edit(self, task: str, path: str) -> tuple[float, bool]:
        """Start `task` and open a round whose edit tool reports `path`: seconds from task/start
        to its tool/begin returning, and whether the baseline was still building then."""
        ts = self.next_ts()
        self.baseline_ts[task] = ts
        self.background.settle()
        with self._profiled():
            start = time.perf_counter()
            self.eng.start_task(task, ts=ts)
            self.eng.begin_round(task)
            self.eng.tool_began(task, EDIT_TOOL, ToolKind.EDIT, [path])
            seconds = time.perf_counter() - start
        self._started[task] = start
        building = self.eng.list_checkpoints(task).status.state == "initializing"
        return seconds, building

    def finish_first_edit(self, task: str, path: str) -> float:
        """Close the round `first_edit` opened (waits for the baseline); seconds since task/start."""
        self.eng.tool_ended(task, EDIT_TOOL, [path])
        if self.eng.end_round(task, self.next_ts()) is None:
            raise NotReadyError(f"task {task}: the first edit made no checkpoint")
        return time.perf_counter() - self._started[task]

    def file_in_baseline(self, task: str, path: str) -> bytes | None:
        commit = self.baseline_hash(task)
        with next(iter(self.eng.roots.values())).locked() as root:
            repo = root.repo
            entry = repo.lookup(repo.commit_tree(commit), path)  # type: ignore[arg-type]
            return repo.read_blob(entry.oid) if entry is not None else None

    def diff(self, task: str, from_ts: int) -> tuple[float, dict[str, Any]]:
        self.background.settle()
        with self._profiled():
            start = time.perf_counter()
            out = self.eng.diff(task, from_ts).to_wire()
            return time.perf_counter() - start, out

    def restore_files(self, task: str, ts: int, keep_outside_edits: bool = False) -> tuple[float, dict[str, Any]]:
        self.background.settle()
        with self._profiled():
            start = time.perf_counter()
            out = self.eng.restore(task, ts, RestoreMode.FILES, keep_outside_edits=keep_outside_edits).to_wire()
            return time.perf_counter() - start, out

    def has_watcher(self) -> bool:
        """True when the engine attached a file watcher to its root (not part of the API yet)."""
        roots = getattr(self.eng, "roots", {})
        return any(getattr(r, "watcher", None) is not None for r in roots.values())

    def close(self) -> None:
        self.eng.close()
