"""Rounds staged from the watcher: no rescan when the watcher saw the change, and the
watcher and the rescan always agree on the tree.

Each test runs on both observers (the `observer` fixture). The portable one cannot prove a round
complete, so its rounds rescan: the checkpoints must hold the same contents either way.
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from shadowpoint.config import Settings
from shadowpoint.engine import Engine, EngineOptions
from shadowpoint.kinds import ToolKind
from shadowpoint.observe.watcher import ObserverKind
from tests.conftest import make_tree


def _wait_ready(eng: Engine, task: str) -> None:
    eng.tool_began(task, "write_to_file", ToolKind.EDIT, None)  # the barrier: returns once the baseline is built
    eng.tool_ended(task, "write_to_file", None, ToolKind.EDIT)


def _command_round(eng: Engine, task: str, ts: int, action: Any) -> Any:
    eng.begin_round(task)
    eng.tool_began(task, "execute_command", ToolKind.COMMAND, None)
    action()
    eng.tool_ended(task, "execute_command", None, ToolKind.COMMAND)
    return eng.end_round(task, ts)


def test_command_round_in_a_20k_workspace_is_staged_from_the_watcher(
        workspace: Path, make_engine: Any, observer: ObserverKind) -> None:
    tree = {f"pkg{i % 200:03d}/mod{i:05d}.py": f"x = {i}\n" for i in range(20_000)}
    make_tree(workspace, tree)
    eng = make_engine(workspace, watcher=True, watcher_observer=observer)
    eng.start_task("big", ts=1)
    _wait_ready(eng, "big")
    eng.end_round("big", 2)  # closes the set-up round: its journal holds nothing of ours
    with capture_logs() as logs:
        cp = _command_round(eng, "big", 3, lambda: (workspace / "pkg007/mod00007.py").write_text("x = 'changed'\n"))
    assert cp is not None and not cp.reused
    rounds = [e for e in logs if e["event"] == "round.checkpointed"]
    assert len(rounds) == 1
    if observer == "inotify":
        assert rounds[0]["rescan"] is False, f"the watcher recorded the change: no rescan; got {rounds[0]}"
        assert rounds[0]["watched"] >= 1 and rounds[0]["paths"] <= 5, rounds[0]
    else:
        assert rounds[0]["rescan"] is True, f"no flush barrier: the round cannot be proven, it rescans; {rounds[0]}"
    changed = {f["path"]: f for f in eng.diff("big", 1, 3).to_wire()["files"]}
    assert set(changed) == {"pkg007/mod00007.py"} and changed["pkg007/mod00007.py"]["after"] == "x = 'changed'\n"
    assert eng.diff("big", 3).to_wire()["files"] == [], "the watcher's checkpoint equals a full rescan of the workspace"


def _random_action(rng: random.Random, root: Path, step: int) -> Any:
    files = sorted(p for p in root.rglob("*") if p.is_file() and ".git" not in p.parts)
    choice = rng.choice(["edit", "create", "delete", "rename", "mkdir_tree", "rmdir_tree", "shell", "chmod", "dirmove"])

    def act() -> None:
        if choice == "edit" and files:
            rng.choice(files).write_text(f"edit {step}\n")
        elif choice == "create":
            p = root / f"d{rng.randrange(5)}" / f"new{step}.txt"
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(f"new {step}\n")
        elif choice == "delete" and files:
            rng.choice(files).unlink()
        elif choice == "rename" and files:
            src = rng.choice(files)
            src.rename(src.with_name(f"renamed{step}{src.suffix}"))
        elif choice == "mkdir_tree":
            base = root / f"tree{step}" / "deep"
            base.mkdir(parents=True)
            for i in range(3):
                (base / f"f{i}.py").write_text(f"{step} {i}\n")
        elif choice == "rmdir_tree":
            dirs = sorted(p for p in root.iterdir() if p.is_dir() and p.name.startswith(("tree", "d")))
            if dirs:
                shutil.rmtree(rng.choice(dirs))
        elif choice == "shell":
            subprocess.run(["sh", "-c", f"echo shell{step} > sh{step % 3}.txt; echo log > run{step}.log"],
                           cwd=root, check=True)
        elif choice == "chmod" and files:
            p = rng.choice(files)
            os.chmod(p, 0o755 if not os.stat(p).st_mode & 0o100 else 0o644)
        elif choice == "dirmove":
            dirs = sorted(p for p in root.iterdir() if p.is_dir() and p.name.startswith(("tree", "d")))
            if dirs:
                src = rng.choice(dirs)
                src.rename(root / f"moved{step}")

    return act


def test_watcher_and_rescan_agree_on_a_random_sequence(tmp_path: Path, make_engine: Any,
                                                       observer: ObserverKind) -> None:
    rng = random.Random(1234)
    base = {f"d{i % 5}/f{i}.txt": f"{i}\n" for i in range(60)}
    base[".gitignore"] = "*.log\n"
    watched_ws = make_tree(tmp_path / "w" / "proj", base)
    scanned_ws = make_tree(tmp_path / "s" / "proj", base)
    watched = make_engine(watched_ws, watcher=True, watcher_observer=observer)
    scanned = make_engine(scanned_ws, watcher=False)
    pairs = ((watched, watched_ws, "by-watcher"), (scanned, scanned_ws, "by-rescan"))
    for eng, _, task in pairs:
        eng.start_task(task, ts=1)
        _wait_ready(eng, task)
    for step in range(40):
        seed = rng.random()
        for eng, root, task in pairs:
            action = _random_action(random.Random(seed), root, step)
            cp = _command_round(eng, task, 10 + step, action)
            assert cp is not None
        with watched.roots["proj"].locked() as w, scanned.roots["proj"].locked() as s:
            wt = w.repo.list_tree(w.cache.tree)
            st = s.repo.list_tree(s.cache.tree)
        assert wt == st, f"step {step}: watcher and rescan disagree: {set(wt) ^ set(st)}"
        assert watched.diff("by-watcher", 10 + step).to_wire()["files"] == []


def test_the_watcher_observer_setting_reaches_the_watcher(
        workspace: Path, make_engine: Any, observer: ObserverKind, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHADOWPOINT_WATCHER_OBSERVER", observer)
    chosen = EngineOptions.from_settings(Settings()).watcher_observer
    make_tree(workspace, {"a.txt": "a\n"})
    eng = make_engine(workspace, watcher=True, watcher_observer=chosen)
    eng.start_task("t", ts=1)
    _wait_ready(eng, "t")
    watcher = eng.roots["proj"].watcher
    assert chosen == observer and watcher is not None and watcher.is_healthy
    assert watcher.has_flush_barrier is (observer == "inotify")


def test_a_killed_observer_degrades_to_rescan_with_nothing_missed(
        workspace: Path, make_engine: Any, observer: ObserverKind) -> None:
    make_tree(workspace, {"a.txt": "a\n", "b.txt": "b\n"})
    notes: list[tuple[str, dict[str, Any]]] = []
    eng = make_engine(workspace, watcher=True, watcher_observer=observer)
    eng.notify = lambda method, params: notes.append((method, params))
    eng.start_task("t", ts=1)
    _wait_ready(eng, "t")
    watcher = eng.roots["proj"].watcher
    assert watcher is not None and watcher.is_healthy
    watcher._observer.stop()  # the observer dies behind the engine's back
    watcher._observer.join()
    with capture_logs() as logs:
        cp = _command_round(eng, "t", 2, lambda: (workspace / "b.txt").write_text("changed while blind\n"))
    assert cp is not None and not cp.reused
    rounds = [e for e in logs if e["event"] == "round.checkpointed"]
    assert rounds and rounds[0]["rescan"] is True, rounds
    assert {f["path"] for f in eng.diff("t", 1, 2).to_wire()["files"]} == {"b.txt"}
    assert any(m == "watcher/degraded" for m, _ in notes), notes


def test_a_compare_with_the_workspace_uses_the_watcher_and_leaves_its_paths_to_the_round(
        workspace: Path, make_engine: Any, observer: ObserverKind) -> None:
    make_tree(workspace, {f"pkg{i % 40:02d}/mod{i:04d}.py": f"x = {i}\n" for i in range(2_000)})
    eng = make_engine(workspace, watcher=True, watcher_observer=observer)
    trusted = observer == "inotify"  # the portable observer has no flush barrier: it rescans
    eng.start_task("t", ts=1)
    _wait_ready(eng, "t")
    eng.end_round("t", 2)
    (workspace / "pkg03/mod0003.py").write_text("x = 'by a command'\n")  # nobody reported it
    with capture_logs() as logs:
        files = eng.diff("t", 1).to_wire()["files"]
    assert [(f["path"], f["after"]) for f in files] == [("pkg03/mod0003.py", "x = 'by a command'\n")]
    staged = [e for e in logs if e["event"] == "scanner.staged"]
    assert staged and any(e["rescan"] for e in staged) is not trusted, f"the watcher knew the change: {staged}"
    # the compare looked, it did not consume: the next command round still finds the path recorded
    with capture_logs() as logs:
        cp = _command_round(eng, "t", 3, lambda: None)
    rounds = [e for e in logs if e["event"] == "round.checkpointed"]
    assert cp is not None and rounds[0]["rescan"] is not trusted, rounds
    assert rounds[0]["watched"] >= 1 or not trusted, rounds
    changed = {f["path"]: f for f in eng.diff("t", 1, 3).to_wire()["files"]}
    assert set(changed) == {"pkg03/mod0003.py"}
