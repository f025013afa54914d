"""The watch's last round at exit (`shadowpoint watch`, Ctrl-C): a change saved just before
it is in the last checkpoint, although its event may still be on its way through the watcher.

The event's way is held open with a seam (the loop's journal blocks in `add` until the test lets
it go), so the test does not depend on how fast the watcher's threads run.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from shadowpoint.engine import Engine
from shadowpoint.watch_mode import ActivityJournal, WatchLoop
from shadowpoint.workspace import RepoPath
from tests.conftest import make_tree, wait_for


class _Gate:
    """Holds the journal's `add` for one path until opened: the event has reached the watcher's
    handler but is not recorded yet."""

    def __init__(self, journal: ActivityJournal, path: str) -> None:
        self.reached = threading.Event()
        self.open = threading.Event()
        original = journal.add
        gated = path

        def add(path: RepoPath) -> None:
            if path == gated:
                self.reached.set()
                self.open.wait(30)
            original(path)

        journal.add = add  # type: ignore[method-assign]  # the seam: this journal's add, held


def _ready(loop: WatchLoop, eng: Engine, task: str) -> int:
    """Start the loop's task; the baseline's ts once it is built."""
    loop.install()
    loop.start()
    wait_for(lambda: loop.state().to_wire()["state"] != "initializing")
    [baseline] = [c for c in loop.state().checkpoints if c.hash]
    return baseline.ts


def test_exit_round_waits_for_an_edit_still_in_the_watchers_queue(workspace: Path, make_engine: Any) -> None:
    make_tree(workspace, {"a.txt": "one\n", "b.txt": "two\n"})
    eng: Engine = make_engine(workspace, watcher=True)
    loop = WatchLoop(eng, "w", 0.3)
    base = _ready(loop, eng, "w")
    [name] = loop.journals
    gate = _Gate(loop.journals[name], "a.txt")
    flushing = threading.Event()
    watcher = eng.roots[name].watcher
    assert watcher is not None
    flush = watcher.flush

    def flush_seen(*args: Any, **kwargs: Any) -> bool:
        flushing.set()
        return flush(*args, **kwargs)

    watcher.flush = flush_seen  # type: ignore[method-assign]  # the seam: this watcher's flush, seen
    (workspace / "a.txt").write_text("saved just before Ctrl-C\n")
    assert gate.reached.wait(30), "the watcher never saw the edit"
    result: list[Any] = []
    last = threading.Thread(target=lambda: result.append(loop.checkpoint_pending("exit", settle=True)))
    last.start()
    # open the gate once the exit round waits for the watcher (or returned without waiting)
    wait_for(lambda: flushing.is_set() or not last.is_alive())
    gate.open.set()
    last.join(60)
    assert not last.is_alive()
    [event] = result
    assert event is not None and event.checkpoint is not None, "the exit made no checkpoint: the edit is missing"
    diff: dict[str, Any] = eng.diff("w", base, event.checkpoint.ts).to_wire()
    files = {f["path"]: f for f in diff["files"]}
    assert set(files) == {"a.txt"} and files["a.txt"]["after"] == "saved just before Ctrl-C\n"


def test_exit_round_with_nothing_changed_makes_no_checkpoint(workspace: Path, make_engine: Any) -> None:
    make_tree(workspace, {"a.txt": "one\n"})
    eng = make_engine(workspace, watcher=True)
    loop = WatchLoop(eng, "w", 0.3)
    _ready(loop, eng, "w")
    assert loop.checkpoint_pending("exit", settle=True) is None
    assert [c.kind for c in loop.state().checkpoints if c.hash] == ["baseline"]


def test_exit_round_without_a_watcher_compares_with_the_last_checkpoint(workspace: Path, make_engine: Any) -> None:
    make_tree(workspace, {"a.txt": "one\n"})
    eng = make_engine(workspace, watcher=False)
    loop = WatchLoop(eng, "w", 0.3)
    base = _ready(loop, eng, "w")
    assert not loop.is_watching
    (workspace / "a.txt").write_text("polled\n")
    event = loop.checkpoint_pending("exit", settle=True)
    assert event is not None and event.checkpoint is not None and event.reason == "poll"
    files = {f["path"] for f in eng.diff("w", base, event.checkpoint.ts).to_wire()["files"]}
    assert files == {"a.txt"}
