"""The stat cache a baseline leaves is written off the agent's path, and a close never waits on it.

A task's first command waits for the whole baseline; writing the stat cache (~30 ms at 100k
files) was part of it. The baseline now leaves the write to the root's background thread (the
one that copies borrowed blobs), which writes it at the first quiet moment: these tests hold
that thread with its seam (`copy_gate`) and follow it with `wait_copied`, never with a sleep.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

from structlog.testing import capture_logs

from shadowpoint.engine import Engine
from shadowpoint.stage.stat_cache import StatCache
from shadowpoint.store.values import HEAD_REF
from tests.conftest import make_tree, read_tree
from tests.integration.test_engine import held_copy_engine, wait_ready

FILES = {f"src/mod{i:03d}.py": f"value = {i}\n" for i in range(60)} | {"README.md": "hello\n"}


def _engine_held_at_its_upkeep(make_engine: Any, workspace: Path,
                               **changes: Any) -> tuple[Engine, Any, threading.Event]:
    make_tree(workspace, FILES)
    hour_ago = time.time() - 3600
    for rel in FILES:  # not racy: a saved state can prove them unchanged
        os.utime(workspace / rel, (hour_ago, hour_ago))
    return held_copy_engine(make_engine, workspace, **changes)


def test_the_baseline_leaves_its_stat_cache_to_the_background_and_a_later_start_uses_it(
        make_engine: Any, workspace: Path) -> None:
    _eng, state, gate = _engine_held_at_its_upkeep(make_engine, workspace)
    assert not state.cache_file.exists()  # not written on the baseline's path
    gate.set()
    assert state.wait_copied(60)
    with state.locked() as root:
        head = root.repo.read_ref(HEAD_REF)
        tree = state.cache.tree
    saved = StatCache.load(state.cache_file, head)
    assert saved is not None and saved.tree == tree
    assert sorted(saved.entries) == sorted(FILES)

    # a process that did not close (a crash after the save): the next one's baseline takes
    # the saved states and hashes nothing
    later: Engine = make_engine(workspace)
    with capture_logs() as logs:
        later.start_task("t2", 1)
        assert wait_ready(later, "t2") == "ready"
    built = [e for e in logs if e["event"] == "task.baseline_built"]
    assert built and built[-1]["hashed"] == 0 and built[-1]["rescan"] is True


def test_a_close_does_not_wait_for_a_cache_save_that_wants_the_lock(make_engine: Any, workspace: Path) -> None:
    """The close holds the workspace lock while it waits for the background thread; a save
    waiting for that lock (its timeout an hour here) must give way, not hold the close."""
    eng, state, gate = _engine_held_at_its_upkeep(make_engine, workspace, lock_timeout_s=3600.0)
    tries = threading.Semaphore(0)
    pause = state.copy_pause

    def counted() -> None:
        tries.release()
        if pause is not None:
            pause()

    state.copy_pause = counted
    done: list[str] = []

    def close_holding_the_lock() -> None:
        with state.locked():  # as `Engine.close` holds it while it waits for the thread
            gate.set()
            # the thread paused, tried the lock in vain, and paused again: it is in its loop
            if tries.acquire(timeout=60) and tries.acquire(timeout=60):
                done.append("tried")
            eng.close()
            done.append("closed")

    closing = threading.Thread(target=close_holding_the_lock, daemon=True)
    closing.start()
    closing.join(120)
    assert not closing.is_alive() and done == ["tried", "closed"]
    assert state.wait_copied(0)
    assert state.cache_file.exists()  # the close wrote it itself


def test_deleting_the_last_task_while_its_upkeep_waits_leaves_no_folder_behind(
        make_engine: Any, workspace: Path) -> None:
    """A conformance run on a loaded host found `checkpoints/<hash>/shadowpoint.lock` after the
    last task's deletion (SPEC §2: the whole folder goes): the stat cache's save, due since the
    baseline, took the workspace lock once the folder was gone, and the lock made it again."""
    eng, state, gate = _engine_held_at_its_upkeep(make_engine, workspace)
    checkpoints = eng.options.docs_dir / "checkpoints"
    assert checkpoints.is_dir() and not state.cache_file.exists()
    eng.delete_task("t1")
    assert not checkpoints.exists()
    gate.set()  # the background thread goes on: nothing is left for it to write
    assert state.wait_copied(60)
    assert not checkpoints.exists(), sorted(str(p) for p in checkpoints.rglob("*"))
    assert read_tree(workspace) == {k: v.encode() for k, v in FILES.items()}, "the workspace is untouched"
