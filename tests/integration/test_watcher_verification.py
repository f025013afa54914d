"""SPEC §4: a healthy watcher is authoritative, and checked.

A command round through which the watcher stayed healthy and recorded nothing reuses the
snapshot without a rescan. A verification scan, off the agent's path, compares the workspace
with the newest snapshot: a change made without an event (here, honestly: a file written in
place through a hard link outside the workspace, which no watch inside it sees) makes the
watcher unhealthy, and the next round rescans and includes it.

The portable observer (no flush barrier) is never trusted: its rounds rescan, so there is nothing
to verify. The tests that hold for it run on both observers (the `observer` fixture).
"""

from __future__ import annotations

import os
import subprocess
import threading
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from shadowpoint.engine import Engine
from shadowpoint.kinds import ToolKind
from shadowpoint.observe.watcher import ObserverKind, WorkspaceWatcher
from shadowpoint.results import Checkpoint
from shadowpoint.roots import RootState
from shadowpoint.verifier import Verdict
from shadowpoint.workspace import RepoPath
from tests.conftest import make_tree, wait_for

TREE = {f"pkg{i % 20:02d}/mod{i:04d}.py": f"x = {i}\n" for i in range(400)}
inotify_only = pytest.mark.parametrize("observer", ["inotify"])


def _ready(workspace: Path, make_engine: Any, observer: ObserverKind,
           notes: list[tuple[str, dict[str, Any]]] | None = None) -> Engine:
    make_tree(workspace, TREE)
    eng: Engine = make_engine(workspace, watcher=True, verify_interval_s=0, watcher_observer=observer)
    if notes is not None:
        eng.notify = lambda method, params: notes.append((method, params))
    eng.start_task("t", ts=1)
    eng.tool_began("t", "write_to_file", ToolKind.EDIT, None)  # the barrier: returns once the baseline is built
    eng.tool_ended("t", "write_to_file", None, ToolKind.EDIT)
    eng.end_round("t", 2)  # the set-up round
    return eng


def _command_round(eng: Engine, ts: int,
                   action: Any = None) -> tuple[Checkpoint | None, list[MutableMapping[str, Any]]]:
    with capture_logs() as logs:
        eng.begin_round("t")
        eng.tool_began("t", "execute_command", ToolKind.COMMAND, None)
        if action is not None:
            action()
        eng.tool_ended("t", "execute_command", None, ToolKind.COMMAND)
        cp = eng.end_round("t", ts)
    return cp, logs


def _write_behind_the_watchers_back(outside: Path, data: bytes) -> None:
    """Rewrite a file in place through its hard link outside the workspace: inotify reports the
    change to the watches on the folder of the name used, so none inside the workspace hears it."""
    with open(outside, "r+b") as fh:
        fh.write(data)
        fh.truncate()


def _file_at(eng: Engine, ts: int, path: str) -> bytes | None:
    cp = eng._task("t").record.checkpoint(ts)
    with eng.roots["proj"].locked() as root:
        entry = root.repo.lookup(root.repo.commit_tree(cp.hashes["proj"]), RepoPath(path))
        return root.repo.read_blob(entry.oid) if entry else None


@inotify_only  # trust needs the flush barrier; the portable observer's rounds rescan (test_watch_rounds.py)
def test_a_no_change_command_round_with_a_healthy_watcher_makes_no_rescan(
        workspace: Path, make_engine: Any, observer: ObserverKind) -> None:
    eng = _ready(workspace, make_engine, observer)
    assert eng.roots["proj"].watcher is not None and eng.roots["proj"].watcher.is_healthy
    cp, logs = _command_round(eng, 3, lambda: os.listdir(workspace))  # a shell command that changes nothing
    assert cp is not None and cp.reused, "SPEC §3: no change, the checkpoint reuses the current snapshot"
    assert cp.hashes == eng._task("t").record.checkpoint(1).hashes
    rounds = [e for e in logs if e["event"] == "round.checkpointed"]
    assert len(rounds) == 1 and rounds[0]["rescan"] is False and rounds[0]["paths"] == 0, rounds
    staged = [e for e in logs if e["event"] == "scanner.staged"]
    assert staged and all(e["examined"] == 0 and not e["rescan"] for e in staged), staged
    assert any(e["event"] == "stager.watcher_trusted" for e in logs)


def test_a_change_without_an_event_is_found_by_the_verification_and_the_next_round_rescans(
        workspace: Path, make_engine: Any, tmp_path: Path, observer: ObserverKind) -> None:
    notes: list[tuple[str, dict[str, Any]]] = []
    eng = _ready(workspace, make_engine, observer, notes)
    outside = tmp_path / "elsewhere" / "alias.py"
    outside.parent.mkdir()
    os.link(workspace / "pkg03/mod0003.py", outside)
    _write_behind_the_watchers_back(outside, b"x = 'changed behind its back'\n")
    watcher = eng.roots["proj"].watcher
    assert watcher is not None
    if observer == "portable":
        # never trusted: the round rescans and finds the change at once; nothing to verify
        cp, _ = _command_round(eng, 3)
        assert cp is not None and _file_at(eng, 3, "pkg03/mod0003.py") == b"x = 'changed behind its back'\n"
        assert eng.verify_watchers()["proj"].verdict is Verdict.SKIPPED
        assert watcher.is_healthy and not notes
        return
    # the watcher heard nothing: trusted, the round misses the change (what verification is for)
    cp, _ = _command_round(eng, 3)
    assert cp is not None and cp.reused and _file_at(eng, 3, "pkg03/mod0003.py") == b"x = 3\n"

    with capture_logs() as logs:
        outcome = eng.verify_watchers()["proj"]
    assert outcome.verdict is Verdict.MISSED and outcome.missed == ("pkg03/mod0003.py",), outcome
    assert [e["path"] for e in logs if e["event"] == "watcher.change_missed"] == ["pkg03/mod0003.py"]
    degraded = [p for m, p in notes if m == "watcher/degraded"]
    assert len(degraded) == 1 and "pkg03/mod0003.py" in degraded[0]["reason"], notes
    assert degraded[0]["root"] == str(workspace)
    assert not watcher.is_healthy

    cp, logs = _command_round(eng, 4)
    rounds = [e for e in logs if e["event"] == "round.checkpointed"]
    assert rounds[0]["rescan"] is True, "an unhealthy watcher: the rescan fallback"
    assert cp is not None and not cp.reused
    assert _file_at(eng, 4, "pkg03/mod0003.py") == b"x = 'changed behind its back'\n"

    # restarted (in the background) and verified again: healthy, rounds trust it again
    wait_for(lambda: watcher.generation >= 2 and watcher.is_running, "the watcher was never restarted")
    assert eng.verify_watchers()["proj"].verdict is Verdict.CLEAN
    assert watcher.is_healthy
    _command_round(eng, 5)  # the round the recovery happened in is still unhealthy
    cp, logs = _command_round(eng, 6)
    assert cp is not None and cp.reused
    assert [e["rescan"] for e in logs if e["event"] == "round.checkpointed"] == [False]


def test_changes_the_watcher_heard_are_not_misses(workspace: Path, make_engine: Any, observer: ObserverKind) -> None:
    eng = _ready(workspace, make_engine, observer)
    (workspace / "node_modules/dep").mkdir(parents=True)
    eng.begin_round("t")  # force-add a file in an excluded, unwatched folder
    eng.tool_began("t", "write_to_file", ToolKind.EDIT, ["node_modules/dep/index.js"])
    (workspace / "node_modules/dep/index.js").write_text("v1\n")
    eng.tool_ended("t", "write_to_file", ["node_modules/dep/index.js"], ToolKind.EDIT)
    eng.end_round("t", 3)
    # between rounds: a person edits, deletes and creates files; an unwatched tracked file changes
    (workspace / "pkg01/mod0001.py").write_text("edited by a person\n")
    (workspace / "pkg02/mod0002.py").unlink()
    (workspace / "pkg04/brand_new.py").write_text("new\n")
    (workspace / "node_modules/dep/index.js").write_text("v2\n")
    outcome = eng.verify_watchers()["proj"]
    if observer == "inotify":
        assert outcome.verdict is Verdict.CLEAN and outcome.examined >= len(TREE), outcome
    else:
        assert outcome.verdict is Verdict.SKIPPED, outcome  # never trusted, so never verified
    watcher = eng.roots["proj"].watcher
    assert watcher is not None and watcher.is_healthy
    _command_round(eng, 4)
    assert _file_at(eng, 4, "pkg01/mod0001.py") == b"edited by a person\n"
    assert _file_at(eng, 4, "node_modules/dep/index.js") == b"v2\n"
    assert _file_at(eng, 4, "pkg02/mod0002.py") is None and _file_at(eng, 4, "pkg04/brand_new.py") == b"new\n"


@inotify_only  # verification runs only for a watcher with a flush barrier
def test_a_miss_is_found_once_while_tracked_files_lie_outside_the_walk(
        workspace: Path, make_engine: Any, tmp_path: Path, observer: ObserverKind) -> None:
    """A force-added file in an excluded folder makes the tracked set larger than the walk: the
    pass then looks at every tracked path again. A change without an event is reported once,
    and the excluded file (which rounds look at themselves) is never a miss, changed or not."""
    eng = _ready(workspace, make_engine, observer)
    (workspace / "node_modules/dep").mkdir(parents=True)
    eng.begin_round("t")
    eng.tool_began("t", "write_to_file", ToolKind.EDIT, ["node_modules/dep/index.js"])
    (workspace / "node_modules/dep/index.js").write_text("v1\n")
    eng.tool_ended("t", "write_to_file", ["node_modules/dep/index.js"], ToolKind.EDIT)
    eng.end_round("t", 3)
    assert eng.verify_watchers()["proj"].verdict is Verdict.CLEAN
    for name, data in (("pkg07/mod0007.py", b"changed behind its back\n"), ("node_modules/dep/index.js", b"v2\n")):
        outside = tmp_path / name.replace("/", "_")
        os.link(workspace / name, outside)
        _write_behind_the_watchers_back(outside, data)
    outcome = eng.verify_watchers()["proj"]
    assert outcome.verdict is Verdict.MISSED and outcome.missed == ("pkg07/mod0007.py",), outcome
    cp, _ = _command_round(eng, 4)  # the rescan fallback takes both
    assert cp is not None and _file_at(eng, 4, "pkg07/mod0007.py") == b"changed behind its back\n"
    assert _file_at(eng, 4, "node_modules/dep/index.js") == b"v2\n"


@inotify_only  # verification runs only for a watcher with a flush barrier
def test_the_verification_gives_way_to_a_round(
        workspace: Path, make_engine: Any, tmp_path: Path, observer: ObserverKind) -> None:
    eng = _ready(workspace, make_engine, observer)
    outside = tmp_path / "alias.py"
    os.link(workspace / "pkg05/mod0005.py", outside)
    _write_behind_the_watchers_back(outside, b"changed\n")
    eng.begin_round("t")  # a round is open: the pass yields at once, decides nothing
    assert eng.verify_watchers()["proj"].verdict is Verdict.INTERRUPTED
    watcher = eng.roots["proj"].watcher
    assert watcher is not None and watcher.is_healthy
    eng.end_round("t", 3)


@inotify_only  # verification runs only for a watcher with a flush barrier
def test_the_background_verification_degrades_the_watcher(
        workspace: Path, make_engine: Any, tmp_path: Path, observer: ObserverKind) -> None:
    degraded = threading.Event()
    make_tree(workspace, TREE)
    eng = make_engine(workspace, watcher=True, verify_interval_s=0.05, verify_cpu_share=0.5, watcher_observer=observer)
    eng.notify = lambda method, params: degraded.set() if method == "watcher/degraded" else None
    eng.start_task("t", ts=1)
    eng.tool_began("t", "write_to_file", ToolKind.EDIT, None)
    eng.tool_ended("t", "write_to_file", None, ToolKind.EDIT)
    eng.end_round("t", 2)
    outside = tmp_path / "alias.py"
    os.link(workspace / "pkg06/mod0006.py", outside)
    _write_behind_the_watchers_back(outside, b"changed behind its back\n")
    assert degraded.wait(60), "the background verification never found the change"
    _, logs = _command_round(eng, 3)
    assert [e["rescan"] for e in logs if e["event"] == "round.checkpointed"] == [True]
    assert _file_at(eng, 3, "pkg06/mod0006.py") == b"changed behind its back\n"


def _hold_watcher_start(monkeypatch: pytest.MonkeyPatch, cls: Any = WorkspaceWatcher,
                        name: str = "start") -> threading.Event:
    """The seam: the baseline's watcher (made, not started) starts only once the event is set;
    `RootState.start_watcher` instead holds a baseline at its watchers' start even when they
    already run (captures are served meanwhile)."""
    go = threading.Event()
    start = getattr(cls, name)

    def held_start(self: Any, *args: Any, **kwargs: Any) -> None:
        assert go.wait(60)
        start(self, *args, **kwargs)

    monkeypatch.setattr(cls, name, held_start)
    return go


@inotify_only
def test_a_first_edit_let_through_before_the_watcher_runs_leaves_its_round_trusted(
        workspace: Path, make_engine: Any, observer: ObserverKind, monkeypatch: pytest.MonkeyPatch) -> None:
    """SPEC §3: an edit waits only for its paths, which the baseline captures even before its
    watcher runs. Its reported paths are staged whatever the watcher recorded; the round must
    not be marked unproven by a flush of a watcher that has not started (a rescan at its end)."""
    make_tree(workspace, TREE)
    eng = make_engine(workspace, watcher=True, verify_interval_s=0, watcher_observer=observer)
    go = _hold_watcher_start(monkeypatch)
    eng.start_task("t", ts=1)
    with capture_logs() as logs:
        eng.tool_began("t", "write_to_file", ToolKind.EDIT, ["pkg02/mod0002.py"])  # captured; the watcher is held
        (workspace / "pkg02/mod0002.py").write_text("x = 'edited'\n")
        eng.tool_ended("t", "write_to_file", ["pkg02/mod0002.py"], ToolKind.EDIT)
        go.set()
        cp = eng.end_round("t", 2)
    assert cp is not None and not cp.reused
    rounds = [e for e in logs if e["event"] == "round.checkpointed"]
    assert len(rounds) == 1 and rounds[0]["rescan"] is False, rounds
    assert _file_at(eng, 1, "pkg02/mod0002.py") == b"x = 2\n", "the baseline holds the bytes from before the edit"
    assert _file_at(eng, 2, "pkg02/mod0002.py") == b"x = 'edited'\n"
    # the watcher runs now: the next command round is trusted to it
    cp3, logs3 = _command_round(eng, 3, lambda: (workspace / "made.txt").write_text("made\n"))
    assert cp3 is not None and _file_at(eng, 3, "made.txt") == b"made\n"
    assert [e["rescan"] for e in logs3 if e["event"] == "round.checkpointed"] == [False]


@inotify_only
def test_a_round_begun_while_the_baseline_builds_is_trusted_from_its_first_tool(
        workspace: Path, make_engine: Any, observer: ObserverKind, monkeypatch: pytest.MonkeyPatch) -> None:
    """round/begin right after task/start (a library hook or a protocol client sends it; the
    agents' hooks open rounds with tool/begin) comes before the baseline's watcher runs. The
    round's watcher part opens at its first tool that may change files, after the barrier, so
    its command is trusted to the watcher: no rescan, and its changes are the round's."""
    make_tree(workspace, TREE)
    eng = make_engine(workspace, watcher=True, verify_interval_s=0, watcher_observer=observer)
    begun = _hold_watcher_start(monkeypatch)  # the watcher starts only once the round has begun
    eng.start_task("t", ts=1)
    with capture_logs() as logs:
        eng.begin_round("t")
        begun.set()
        eng.tool_began("t", "execute_command", ToolKind.COMMAND, None)  # the barrier: the whole baseline
        (workspace / "pkg01/mod0001.py").write_text("x = 'by the command'\n")
        (workspace / "made.txt").write_text("made\n")
        eng.tool_ended("t", "execute_command", None, ToolKind.COMMAND)
        cp = eng.end_round("t", 2)
    assert cp is not None and not cp.reused
    rounds = [e for e in logs if e["event"] == "round.checkpointed"]
    assert len(rounds) == 1 and rounds[0]["rescan"] is False and rounds[0]["paths"] == 2, rounds
    assert not [e for e in logs if e["event"] == "stager.rescan_fallback"]
    assert _file_at(eng, 1, "pkg01/mod0001.py") == b"x = 1\n" and _file_at(eng, 1, "made.txt") is None
    assert _file_at(eng, 2, "pkg01/mod0001.py") == b"x = 'by the command'\n"
    assert _file_at(eng, 2, "made.txt") == b"made\n"
    assert {f["path"] for f in eng.diff("t", 1, 2).to_wire()["files"]} == {"pkg01/mod0001.py", "made.txt"}


def _tree_matches_workspace(eng: Engine, commit: str, workspace: Path) -> None:
    """The oracle: git reads the commit's tree into a scratch index and finds nothing to report
    against the workspace (every file byte-exact, none missing, none extra)."""
    git_dir = eng.roots["proj"].ws.git_dir
    env = {**os.environ, "GIT_INDEX_FILE": str(workspace.parent / "oracle-index"), "GIT_CONFIG_NOSYSTEM": "1"}
    git = ["git", f"--git-dir={git_dir}", f"--work-tree={workspace}"]
    subprocess.run([*git, "read-tree", commit], env=env, check=True)
    subprocess.run([*git, "update-index", "-q", "--refresh"], env=env, check=False, capture_output=True)
    for check in (["diff-files", "--name-status"], ["ls-files", "--others"]):
        out = subprocess.run([*git, *check], env=env, check=True, capture_output=True, text=True).stdout
        assert out == "", (check, out)


@inotify_only
def test_a_later_tasks_baseline_is_what_the_healthy_watcher_recorded(
        workspace: Path, make_engine: Any, observer: ObserverKind) -> None:
    """SPEC §4: a healthy watcher is authoritative, for a new task too. The engine's second
    task (a second agent session while the sidecar runs) takes the first task's state and what
    the watcher recorded since: the person's edits between the sessions, no rescan of the
    workspace. Its baseline is byte-exact against the workspace (git as oracle)."""
    eng = _ready(workspace, make_engine, observer)
    (workspace / "pkg00/mod0000.py").write_text("x = 'edited between sessions'\n")
    (workspace / "pkg03/new.py").write_text("made between sessions\n")
    (workspace / "pkg01/mod0001.py").unlink()
    with capture_logs() as logs:
        eng.start_task("t2", ts=10)
        eng.tool_began("t2", "execute_command", ToolKind.COMMAND, None)  # waits for the whole baseline
    staged = [e for e in logs if e["event"] == "scanner.staged"]
    assert [(e["rescan"], e["examined"], e["changed"]) for e in staged] == [(False, 2, 3)], staged
    baseline = eng._task("t2").record.checkpoint(10)
    assert baseline is not None
    _tree_matches_workspace(eng, baseline.hashes["proj"], workspace)
    # and its first command round is trusted to the watcher as before
    eng.tool_ended("t2", "execute_command", None, ToolKind.COMMAND)
    (workspace / "pkg04/late.py").write_text("after the baseline\n")
    with capture_logs() as logs2:
        cp = eng.end_round("t2", 11)
    assert cp is not None and [e["rescan"] for e in logs2 if e["event"] == "round.checkpointed"] == [False]
    _tree_matches_workspace(eng, cp.hashes["proj"], workspace)


@inotify_only
def test_a_later_tasks_baseline_keeps_an_early_captured_file_at_its_captured_bytes(
        workspace: Path, make_engine: Any, observer: ObserverKind, monkeypatch: pytest.MonkeyPatch) -> None:
    """SPEC §3 with the watcher's baseline: an edit let through once its path is captured, and
    done before the baseline takes what the watcher recorded, is not in the baseline (it holds
    the bytes from before the edit), and is in the edit's round. The seam holds the baseline
    after its watchers' start, while captures are served."""
    eng = _ready(workspace, make_engine, observer)
    go = _hold_watcher_start(monkeypatch, RootState, "start_watcher")
    (workspace / "pkg05/mod0005.py").write_text("x = 'a person, before the session'\n")
    eng.start_task("t2", ts=10)
    eng.tool_began("t2", "write_to_file", ToolKind.EDIT, ["pkg02/mod0002.py"])  # captured; the baseline is held
    (workspace / "pkg02/mod0002.py").write_text("x = 'edited by the agent'\n")
    eng.roots["proj"].watcher.flush()  # type: ignore[union-attr]  # the watcher has recorded the edit
    go.set()
    eng.tool_ended("t2", "write_to_file", ["pkg02/mod0002.py"], ToolKind.EDIT)
    cp = eng.end_round("t2", 11)
    task = eng._task("t2").record
    baseline = task.checkpoint(10)
    assert baseline is not None and cp is not None
    with eng.roots["proj"].locked() as root:
        def content(commit: str, path: str) -> bytes | None:
            entry = root.repo.lookup(root.repo.commit_tree(commit), RepoPath(path))
            return root.repo.read_blob(entry.oid) if entry else None

        assert content(baseline.hashes["proj"], "pkg02/mod0002.py") == b"x = 2\n", "the bytes from before the edit"
        assert content(baseline.hashes["proj"], "pkg05/mod0005.py") == b"x = 'a person, before the session'\n"
        assert content(cp.hashes["proj"], "pkg02/mod0002.py") == b"x = 'edited by the agent'\n"
