"""Library hooks: rounds and tools as context managers, checkpoints as futures."""

from __future__ import annotations

from pathlib import Path

import pytest

from shadowpoint.engine import EngineOptions
from shadowpoint.errors import PathOutsideWorkspaceError
from shadowpoint.hooks import Checkpoints
from shadowpoint.kinds import RestoreMode
from tests.conftest import make_tree


def test_round_and_tool_context_managers_checkpoint_each_round(workspace: Path, options: EngineOptions) -> None:
    make_tree(workspace, {"app.py": "print(1)\n", "README.md": "r\n"})
    with Checkpoints([workspace], options=options) as cps:
        task = cps.task("lib-task", ts=1000)
        with task.round(ts=2000) as rnd:
            with task.tool("write_to_file", paths=["app.py"]):
                (workspace / "app.py").write_text("print(2)\n")
            with task.tool("read_file", paths=["README.md"]):
                pass
        first = rnd.checkpoint.result(timeout=60)
        assert first is not None and first.kind == "round" and not first.reused

        with task.round(ts=3000) as rnd2:
            with task.tool("execute_command") as call:
                (workspace / "made.txt").write_text("by a command\n")
                call.report()  # a command reports nothing: the round rescans
        second = rnd2.checkpoint.result(timeout=60)
        assert second is not None and second.hashes != first.hashes

        with task.round(ts=4000) as rnd3:
            with task.tool("read_file", paths=["app.py"]):
                pass
        assert rnd3.checkpoint.result(timeout=60) is None

        diff = task.diff(1000)
        files = {f.path: f for f in diff.files}
        assert set(files) == {"app.py", "made.txt"}
        assert files["app.py"].after == "print(2)\n"
        assert [c.ts for c in task.checkpoints()] == [1000, 2000, 3000]

        res = task.restore(1000, RestoreMode.FILES)
        assert res.files is not None and "app.py" in res.files.restored
        assert (workspace / "app.py").read_text() == "print(1)\n"


def test_decorated_tool_reports_its_paths(workspace: Path, options: EngineOptions) -> None:
    make_tree(workspace, {".gitignore": "gen/\n", "a.txt": "a\n"})
    with Checkpoints([workspace], options=options) as cps:
        task = cps.task("deco", ts=1)

        @task.wrap_tool("write_to_file", paths=lambda rel, text: [rel])
        def write(rel: str, text: str) -> None:
            target = workspace / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)

        with task.round(ts=2) as rnd:
            write("gen/out.py", "generated\n")
        cp = rnd.checkpoint.result(timeout=60)
        assert cp is not None
        changed = {f.path for f in task.diff(1, 2).files}
        assert changed == {"gen/out.py"}, "an edit tool's path is force-added past .gitignore"


def test_path_outside_is_refused_before_the_tool_runs(workspace: Path, options: EngineOptions) -> None:
    make_tree(workspace, {"a.txt": "a\n"})
    with Checkpoints([workspace], options=options) as cps:
        task = cps.task("t", ts=1)
        ran = False
        with pytest.raises(PathOutsideWorkspaceError), task.round(ts=2):
            with task.tool("write_to_file", paths=["../escape.txt"]):
                ran = True
        assert not ran


def test_library_restore_options_fork_undo_and_redo(workspace: Path, options: EngineOptions) -> None:
    make_tree(workspace, {"app.py": "".join(f"line {i}\n" for i in range(10)), "b.txt": "b1\n"})
    with Checkpoints([workspace], options=options) as cps:
        task = cps.task("lib-task", ts=1000)
        with task.round(ts=2000) as rnd:
            with task.tool("write_to_file", paths=["app.py", "b.txt"]):
                (workspace / "app.py").write_text("task\n" + "".join(f"line {i}\n" for i in range(10)))
                (workspace / "b.txt").write_text("b2\n")
        assert rnd.checkpoint.result(timeout=60) is not None
        with open(workspace / "app.py", "a") as f:
            f.write("mine\n")  # outside any round
        dry = task.restore(1000, RestoreMode.FILES, dry_run=True, keep_outside_edits=True)
        assert dry.files is not None and dry.files.merged == ("app.py",) and dry.files.safety is None
        assert (workspace / "b.txt").read_text() == "b2\n"
        res = task.restore(1000, RestoreMode.FILES, paths=["b.txt"])
        assert res.files is not None and res.files.restored == ("b.txt",)
        assert (workspace / "app.py").read_text().endswith("mine\n")
        res = task.restore(1000, RestoreMode.FILES, keep_outside_edits=True)
        assert res.files is not None and res.files.merged == ("app.py",)
        assert (workspace / "app.py").read_text() == "".join(f"line {i}\n" for i in range(10)) + "mine\n"
        task.undo_restore()
        task.undo_restore()
        assert (workspace / "b.txt").read_text() == "b2\n"
        task.redo_restore()
        assert (workspace / "b.txt").read_text() == "b1\n"
        forked = task.fork(2000, "lib-fork")
        assert forked.ts == 2000 and [c.ts for c in cps.task("lib-fork").checkpoints()] == [1000, 2000]
