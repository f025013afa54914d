"""Slow and failed initialisation, retry and disable (SPEC §3, §7; PROTOCOL.md notifications)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from shadowpoint.engine import Engine
from shadowpoint.kinds import ToolKind
from tests.conftest import make_tree


def _big_tree(root: Path, n: int = 2500) -> None:
    make_tree(root, {f"d{i % 40}/f{i}.txt": f"{i}\n" * 50 for i in range(n)})


class Notes:
    def __init__(self) -> None:
        self.items: list[tuple[str, dict[str, Any]]] = []
        self.cond = threading.Condition()

    def __call__(self, method: str, params: dict[str, Any]) -> None:
        with self.cond:
            self.items.append((method, params))
            self.cond.notify_all()

    def wait_for(self, method: str, timeout: float = 60) -> dict[str, Any]:
        with self.cond:
            ok = self.cond.wait_for(lambda: any(m == method for m, _ in self.items), timeout)
            assert ok, f"no {method} notification; got {self.items}"
            return next(p for m, p in self.items if m == method)


def test_slow_initialisation_warns_then_succeeds(workspace: Path, make_engine: Any) -> None:
    _big_tree(workspace)
    notes = Notes()
    eng: Engine = make_engine(workspace, init_warn_s=0.001)
    eng.notify = notes
    assert eng.start_task("slow", ts=1).to_wire()["state"] == "initializing"
    slow = notes.wait_for("task/initSlow")
    assert slow["taskId"] == "slow" and slow["seconds"] >= 0
    eng.tool_began("slow", "write_to_file", ToolKind.EDIT, None)  # waits for the baseline
    listing: dict[str, Any] = eng.list_checkpoints("slow").to_wire()
    assert listing["state"] == "ready" and [c["kind"] for c in listing["checkpoints"]] == ["baseline"]


def test_initialisation_timeout_disables_the_task_without_paying_it_again(workspace: Path, make_engine: Any) -> None:
    _big_tree(workspace, 2500)
    notes = Notes()
    eng: Engine = make_engine(workspace, init_timeout_s=0.01)
    eng.notify = notes
    eng.start_task("late", ts=1)
    failed = notes.wait_for("task/initFailed")
    assert failed["kind"] == "init_timeout" and failed["taskId"] == "late"
    assert "took over 0.01 s;" in failed["message"], failed["message"]
    listing: dict[str, Any] = eng.list_checkpoints("late").to_wire()
    assert listing["state"] == "disabled" and listing["error"]["kind"] == "init_timeout"
    assert listing["checkpoints"] == [], "the late baseline is dropped, never half-attached"
    # rounds go on without checkpoints and without waiting
    eng.begin_round("late")
    eng.tool_began("late", "write_to_file", ToolKind.EDIT, ["d0/f0.txt"])
    (workspace / "d0/f0.txt").write_text("changed\n")
    eng.tool_ended("late", "write_to_file", ["d0/f0.txt"], ToolKind.EDIT)
    assert eng.end_round("late", 2) is None
    assert eng.list_checkpoints("late").to_wire()["checkpoints"] == []


def test_retry_after_a_failure_and_disable(workspace: Path, make_engine: Any) -> None:
    _big_tree(workspace, 2500)
    eng: Engine = make_engine(workspace, init_timeout_s=0.01)
    eng.start_task("t", ts=1)
    notes = Notes()
    eng.notify = notes
    rt = eng._task("t")
    assert rt.baseline is not None
    rt.baseline.result(timeout=60)
    assert eng.list_checkpoints("t").to_wire()["state"] == "disabled"
    # a more patient engine for the same docs root: the retry builds the baseline
    eng.options = type(eng.options)(**{**{f: getattr(eng.options, f) for f in eng.options.__dataclass_fields__},
                                       "init_timeout_s": 600.0})
    assert eng.retry_task("t").to_wire()["state"] in ("initializing", "ready")
    eng.tool_began("t", "write_to_file", ToolKind.EDIT, None)
    assert eng.list_checkpoints("t").to_wire()["state"] == "ready"
    eng.disable_task("t")
    assert eng.list_checkpoints("t").to_wire()["state"] == "disabled"
    eng.begin_round("t")
    eng.tool_began("t", "execute_command", ToolKind.COMMAND, None)
    eng.tool_ended("t", "execute_command", None, ToolKind.COMMAND)
    assert eng.end_round("t", 5) is None, "a disabled task makes no checkpoint"


def test_same_ts_round_then_completion_is_one_timeline_entry(workspace: Path, make_engine: Any) -> None:
    make_tree(workspace, {"a.txt": "a\n"})
    eng: Engine = make_engine(workspace)
    eng.start_task("t", ts=1)
    eng.begin_round("t")
    eng.tool_began("t", "write_to_file", ToolKind.EDIT, ["a.txt"])
    (workspace / "a.txt").write_text("b\n")
    eng.tool_ended("t", "write_to_file", ["a.txt"], ToolKind.EDIT)
    first = eng.end_round("t", 2)
    again = eng.complete("t", 2)
    assert first is not None and again.hashes == first.hashes
    listing: dict[str, Any] = eng.list_checkpoints("t").to_wire()
    assert [c["ts"] for c in listing["checkpoints"]] == [1, 2], (
        "back-to-back checkpoints for one message are deduplicated")
