"""Rounds staged in a straight line (`EngineOptions.straight_rounds`) against rounds staged the
general way, through the engine: two engines with docs roots of their own on one workspace,
each round run by both on the same disk, their snapshots compared with the git CLI as oracle.

The script mixes the common case (tracked files edited, made executable) with every way out
of it (a new file, a deleted one, an ignore file, a folder turned into a symlink, a file over
the size cap, a folder reported): the two engines must agree on every tree and every warning,
and the straight one must have taken its own case (a spy counts it), with or without a watcher.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from shadowpoint.engine import Engine
from shadowpoint.kinds import ToolKind
from shadowpoint.stage.scanner import Scanner
from tests.conftest import make_tree

Step = tuple[str, list[str], Callable[[Path], object], bool]  # name, reported paths, the edit, straight?


def _tree(engine: Engine, commit: str) -> str:
    git_dir = engine.describe_roots()[0]["shadowGitDir"]
    return subprocess.run(["git", "--git-dir", git_dir, "rev-parse", f"{commit}^{{tree}}"],
                          capture_output=True, text=True, check=True).stdout.strip()


def _round(engine: Engine, ts: int, paths: list[str], edit: Callable[[], object] | None) -> dict[str, Any]:
    engine.begin_round("t")
    engine.tool_began("t", "write_to_file", ToolKind.EDIT, paths)
    if edit is not None:
        edit()
    engine.tool_ended("t", "write_to_file", paths)
    cp = engine.end_round("t", ts)
    assert cp is not None and cp.hash
    return {"tree": _tree(engine, cp.hash), "warnings": sorted((w.path, w.reason) for w in cp.warnings)}


def _steps() -> list[Step]:
    def folder_to_link(root: Path) -> None:
        shutil.copytree(root / "lib", root / "lib-copy", symlinks=True)
        shutil.rmtree(root / "lib")
        (root / "lib").symlink_to("lib-copy")
        (root / "lib-copy/x.py").write_text("through a link\n")

    return [
        ("edit", ["a.txt"], lambda r: (r / "a.txt").write_text("a2\n"), True),
        ("mode and content", ["run.sh"], lambda r: ((r / "run.sh").chmod(0o755), (r / "run.sh").write_text("v2\n")),
         True),
        ("two deep files", ["src/p/q/r/s/deep.py", "src/p/top.py"],
         lambda r: ((r / "src/p/q/r/s/deep.py").write_text("d2\n"), (r / "src/p/top.py").write_text("t2\n")), True),
        ("a new file", ["new.txt"], lambda r: (r / "new.txt").write_text("new\n"), False),
        ("the new file edited", ["new.txt"], lambda r: (r / "new.txt").write_text("new2\n"), True),
        ("reported, unchanged", ["a.txt"], lambda r: None, True),
        ("deleted", ["b.txt"], lambda r: (r / "b.txt").unlink(), False),
        ("ignore file", [".gitignore"], lambda r: (r / ".gitignore").write_text("*.tmp\n"), False),
        ("folder now a link", ["lib/x.py"], folder_to_link, False),
        ("over the cap", ["big.bin"], lambda r: (r / "big.bin").write_bytes(b"x" * 5000), False),
        ("a folder reported", ["src/p"], lambda r: (r / "src/p/top.py").write_text("t3\n"), False),
        ("back to the common case", ["src/p/q/r/s/deep.py"], lambda r: (r / "src/p/q/r/s/deep.py").write_text("d3\n"),
         True),
    ]


@pytest.mark.parametrize("watcher", [False, True])
def test_straight_rounds_make_the_same_snapshots(workspace: Path, tmp_path: Path, make_engine: Any,
                                                   monkeypatch: pytest.MonkeyPatch, watcher: bool) -> None:
    make_tree(workspace, {"a.txt": "a\n", "b.txt": "b\n", "run.sh": "v1\n", "src/p/q/r/s/deep.py": "d\n",
                          "src/p/top.py": "t\n", "lib/x.py": "x\n", ".gitignore": "", "big.bin": b"small"})
    straight = make_engine(workspace, docs_dir=tmp_path / "docs-straight", max_file_bytes=4096, watcher=watcher)
    general = make_engine(workspace, docs_dir=tmp_path / "docs-general", max_file_bytes=4096, watcher=watcher,
                          straight_rounds=False)
    taken: list[str] = []
    original = Scanner.stage_edited_files

    def spy(self: Scanner, paths: Any, cache: Any) -> Any:
        result = original(self, paths, cache)
        if result is not None:
            taken.append(",".join(sorted(paths)))
        return result

    monkeypatch.setattr(Scanner, "stage_edited_files", spy)
    for engine in (straight, general):
        engine.start_task("t", ts=1_000)
        assert engine.wait_ready("t").state == "ready"
    for i, (name, paths, edit, expect_straight) in enumerate(_steps()):
        before = len(taken)
        ours = _round(straight, 2_000 + i, paths, lambda edit=edit: edit(workspace))  # type: ignore[misc]
        theirs = _round(general, 2_000 + i, paths, None)  # the same disk, left as the edit made it
        assert ours == theirs, name
        assert (len(taken) > before) == expect_straight, name
    # the general engine never went straight; the last snapshot holds what the disk holds
    assert all(len(t) for t in taken) and len(taken) == sum(s[3] for s in _steps())
    listing = subprocess.run(["git", "--git-dir", straight.describe_roots()[0]["shadowGitDir"], "ls-tree", "-r",
                              "--name-only", ours["tree"]], capture_output=True, text=True, check=True).stdout.split()
    assert "src/p/q/r/s/deep.py" in listing and "b.txt" not in listing and "big.bin" not in listing
