"""Library hooks for agents written in Python: round and tool boundaries as context managers.

`Checkpoints` opens an engine on one or more roots; `TaskHooks` publishes the task's events
on the engine's bus from one worker thread per task, so events keep their order while the
caller never waits on a commit: a round's checkpoint arrives as a `Future`. Only a tool
that may modify the workspace waits, for the baseline and for the previous round's staging.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import ParamSpec, TypeVar

import structlog

from shadowpoint.config import Settings, load_settings
from shadowpoint.engine import Engine, EngineOptions
from shadowpoint.events import (
    ContextCompacted,
    Event,
    MessageAdded,
    RoundBegan,
    RoundEnded,
    TaskCompleted,
    TaskStarted,
    ToolBegan,
    ToolEnded,
)
from shadowpoint.kinds import RestoreMode, Role, ToolKind
from shadowpoint.logs import configure_logging
from shadowpoint.observe.rounds import tool_kind
from shadowpoint.results import Checkpoint, Diff, Restore
from shadowpoint.store.shadow_repo import isolate_libgit2

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")


class Checkpoints:
    """Checkpoints for a set of workspace roots, for a Python agent.

    Example:
        with Checkpoints(["/path/to/project"]) as cps:
            task = cps.task("task-1", ts=1000)
            with task.round(ts=2000) as rnd:
                with task.tool("write_to_file", paths=["app.py"]):
                    Path("/path/to/project/app.py").write_text("print(2)\\n")
            print(rnd.checkpoint.result().hashes)
    """

    def __init__(self, roots: Sequence[str | Path], *, settings: Settings | None = None,
                 options: EngineOptions | None = None) -> None:
        isolate_libgit2()
        if not structlog.is_configured():
            # structlog's default prints to stdout, which an agent may own: warnings to stderr
            configure_logging("warning", cache_loggers=False)
        opts = options or EngineOptions.from_settings(settings or load_settings())
        self.engine = Engine(list(roots), opts)
        self._tasks: dict[str, TaskHooks] = {}

    def task(self, task_id: str, ts: int = 0) -> TaskHooks:
        """Start (or resume) a task; its baseline builds in the background."""
        hooks = self._tasks.get(task_id)
        if hooks is None:
            hooks = self._tasks[task_id] = TaskHooks(self.engine, task_id)
            hooks.queue(lambda: self.engine.bus.publish(TaskStarted(task_id, ts))).result()
        return hooks

    def close(self) -> None:
        """Flush every pending commit, then close the engine."""
        for hooks in self._tasks.values():
            hooks.close()
        self.engine.close()

    def __enter__(self) -> Checkpoints:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class RoundHandle:
    """The round in progress; `checkpoint` resolves once its commit is written."""

    def __init__(self) -> None:
        self.checkpoint: Future[Checkpoint | None] = Future()


class ToolCall:
    """The tool in progress; `report()` adds the paths it wrote, deleted or renamed."""

    def __init__(self, paths: Sequence[str]) -> None:
        self.paths: list[str] = list(paths)

    def report(self, *paths: str) -> None:
        self.paths.extend(paths)


class TaskHooks:
    """Round and tool boundaries of one task, published in order from one worker thread."""

    def __init__(self, engine: Engine, task_id: str) -> None:
        self.engine = engine
        self.task_id = task_id
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"shadowpoint-hooks:{task_id}")

    def publish(self, event: Event) -> Future[object]:
        """Queue `event` behind the task's earlier events; the future holds the engine's answer
        (`RoundBus.publish` names its type for each event type)."""
        bus = self.engine.bus

        def run() -> object:
            return bus.publish(event)

        return self.queue(run)

    def queue(self, fn: Callable[[], T]) -> Future[T]:
        """Run `fn` on the task's worker, after every event queued before."""
        return self._executor.submit(fn)

    def message(self, ts: int, role: Role, text: str | None = None) -> None:
        """Record a message of the conversation (`user` or `assistant`)."""
        bus = self.engine.bus
        self.queue(lambda: bus.publish(MessageAdded(self.task_id, ts, role, text)))

    @contextlib.contextmanager
    def round(self, ts: int) -> Iterator[RoundHandle]:
        """One round of tool calls; on exit its checkpoint is committed in the background."""
        handle = RoundHandle()
        bus = self.engine.bus
        self.queue(lambda: bus.publish(RoundBegan(self.task_id)))
        try:
            yield handle
        finally:
            fut = self.queue(lambda: bus.publish(RoundEnded(self.task_id, ts)))
            _chain(fut, handle.checkpoint)

    @contextlib.contextmanager
    def tool(self, name: str, kind: ToolKind | None = None, paths: Sequence[str] = ()) -> Iterator[ToolCall]:
        """One tool call. Blocks before a tool that may modify the workspace until the baseline
        (and the previous round's staging) is done; paths of edit tools are force-added."""
        call = ToolCall(paths)
        bus = self.engine.bus
        began = self.queue(lambda: bus.publish(ToolBegan(self.task_id, name, kind, tuple(paths) or None)))
        mutating = tool_kind(name, kind, self.engine.options.read_only_tools) is not ToolKind.READ
        if mutating:
            began.result()  # the barrier; also surfaces a refused path before the tool runs
        ok = False
        try:
            yield call
            ok = True
        finally:
            event = ToolEnded(self.task_id, name, kind, tuple(call.paths) or None, ok)
            ended = self.queue(lambda: bus.publish(event))
            if mutating:
                ended.result()

    def wrap_tool(self, name: str, kind: ToolKind | None = None,
                  paths: Callable[..., Sequence[str]] | None = None) -> Callable[[Callable[P, R]], Callable[P, R]]:
        """Decorator form of `tool()`; `paths(*args, **kwargs)` names the files the call touches."""

        def decorate(fn: Callable[P, R]) -> Callable[P, R]:
            @functools.wraps(fn)
            def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
                with self.tool(name, kind, paths(*args, **kwargs) if paths else ()):
                    return fn(*args, **kwargs)

            return wrapper

        return decorate

    def complete(self, ts: int) -> Future[Checkpoint]:
        """The completion checkpoint (for View Changes)."""
        bus = self.engine.bus
        return self.queue(lambda: bus.publish(TaskCompleted(self.task_id, ts)))

    def compacted(self, ts: int) -> Future[Checkpoint]:
        """A compaction checkpoint (no file snapshot: Restore Task only)."""
        bus = self.engine.bus
        return self.queue(lambda: bus.publish(ContextCompacted(self.task_id, ts)))

    def checkpoints(self) -> tuple[Checkpoint, ...]:
        """The task's checkpoints in message order (after every queued event)."""
        return self.queue(lambda: self.engine.list_checkpoints(self.task_id)).result().checkpoints

    def diff(self, from_ts: int, to_ts: int | None = None) -> Diff:
        """The changes from the checkpoint at `from_ts` to the one at `to_ts` (None: the workspace)."""
        return self.queue(lambda: self.engine.diff(self.task_id, from_ts, to_ts)).result()

    def restore(self, ts: int, mode: RestoreMode = RestoreMode.FILES, *, paths: Sequence[str] | None = None,
                dry_run: bool = False, keep_outside_edits: bool = False) -> Restore:
        """Restore files, the task, or both (the protocol's `Restore`: `.to_wire()`).

        Args:
            ts: The checkpoint's ts.
            mode: "files", "task" or "both".
            paths: Only these paths (whatever the task's scope).
            dry_run: Write nothing; answer what the restore would do (with `conflicts`).
            keep_outside_edits: Merge the edits made outside the task's rounds instead of
                overwriting them (`restore_conflict` when they overlap).
        """
        return self.queue(
            lambda: self.engine.restore(self.task_id, ts, mode, paths, dry_run, keep_outside_edits)).result()

    def undo_restore(self) -> Restore:
        """Walk the undo stack back one file restore."""
        return self.queue(lambda: self.engine.undo_restore(self.task_id)).result()

    def redo_restore(self) -> Restore:
        """Walk the undo stack forward one undone file restore."""
        return self.queue(lambda: self.engine.redo_restore(self.task_id)).result()

    def fork(self, ts: int, new_task_id: str) -> Checkpoint:
        """`task/fork`: a new task sharing this one's snapshots up to `ts`; its newest checkpoint."""
        return self.queue(lambda: self.engine.fork_task(self.task_id, ts, new_task_id)).result()

    def close(self) -> None:
        self._executor.shutdown(wait=True)


def _chain(source: Future[R], target: Future[R]) -> None:
    def done(f: Future[R]) -> None:
        exc = f.exception()
        if exc is not None:
            target.set_exception(exc)
        else:
            target.set_result(f.result())

    source.add_done_callback(done)
