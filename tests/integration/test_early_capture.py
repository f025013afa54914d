"""SPEC §3: the first edit waits only for its paths. While the baseline still builds, an edit
tool's paths are captured first (their content before the tool runs) and kept at that content;
a command still waits for the whole baseline. The scan is held in its middle by a seam
(`ScanHold`), so nothing here races the scan's speed."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from shadowpoint.engine import Engine
from shadowpoint.kinds import ToolKind
from shadowpoint.stage.early_capture import ScanHold
from tests.conftest import make_tree, wait_for

FILES = 20_000
SMALL = 2_000  # the tests of who waits need no big tree


def _tree(files: int = FILES) -> dict[str, str]:
    return {f"pkg{i % 100:02d}/mod{i:05d}.py": f"x = {i}\n" for i in range(files)}


def _held_engine(workspace: Path, make_engine: Any, files: int = SMALL) -> tuple[Engine, ScanHold]:
    make_tree(workspace, _tree(files))
    eng = make_engine(workspace, hash_workers=0)
    hold = ScanHold(after_files=files // 4)
    eng.baseline_hold = hold
    eng.start_task("t", ts=1)
    assert hold.reached.wait(120), "the baseline scan never reached the hold"
    return eng, hold


def _tree_of(eng: Engine, ts: int) -> dict[str, Any]:
    cp = eng._task("t").record.checkpoint(ts)
    assert cp is not None
    with eng.roots["proj"].locked() as root:
        listing = root.repo.list_tree(root.repo.commit_tree(cp.hashes["proj"]))
        return {p: root.repo.read_blob(e.oid) for p, e in listing.items()}


def test_an_edit_during_the_baseline_is_captured_first_with_its_old_bytes(workspace: Path, make_engine: Any) -> None:
    eng, hold = _held_engine(workspace, make_engine, FILES)
    rt = eng._task("t")
    # the scan is held: what it recorded so far is stable; edit one file it has not reached yet,
    # delete another one, and create a file
    walked = set(eng.roots["proj"].cache.entries)
    assert FILES // 4 - 1 <= len(walked) < FILES
    edited, deleted = sorted(set(_tree()) - walked)[:2]
    targets = [edited, deleted, "pkg00/new_file.py"]
    eng.begin_round("t")
    eng.tool_began("t", "apply_patch", ToolKind.EDIT, targets)  # returns while the baseline is held
    assert rt.state == "initializing" and rt.baseline is not None and not rt.baseline.done(), (
        "SPEC §3: the edit's tool/begin returned before the whole baseline")
    (workspace / edited).write_text("x = 'edited'\n")
    (workspace / deleted).unlink()
    (workspace / "pkg00/new_file.py").write_text("new\n")
    eng.tool_ended("t", "apply_patch", targets, ToolKind.EDIT)
    ended: dict[str, Any] = {}
    closer = threading.Thread(target=lambda: ended.update(cp=eng.end_round("t", 2)))
    closer.start()
    hold.release()
    closer.join(120)
    assert not closer.is_alive()
    base = _tree_of(eng, 1)
    assert base[edited] == _tree()[edited].encode(), "the baseline holds the bytes from before the edit"
    assert base[deleted] == _tree()[deleted].encode(), "a file the edit deleted is in the baseline"
    assert "pkg00/new_file.py" not in base, "a file the edit created is not in the baseline"
    assert len(base) == FILES, "the rest of the scan went on: every other file is in the baseline"
    cp = ended["cp"]
    assert cp is not None and not cp.reused
    after = _tree_of(eng, 2)
    assert after[edited] == b"x = 'edited'\n" and after["pkg00/new_file.py"] == b"new\n"
    assert deleted not in after
    diff: dict[str, Any] = eng.diff("t", 1, 2).to_wire()
    assert {f["path"] for f in diff["files"]} == set(targets)


def test_a_command_waits_for_the_whole_baseline(workspace: Path, make_engine: Any) -> None:
    eng, hold = _held_engine(workspace, make_engine)
    rt = eng._task("t")
    returned = threading.Event()

    def command() -> None:
        eng.tool_began("t", "execute_command", ToolKind.COMMAND, None)
        returned.set()

    worker = threading.Thread(target=command)
    worker.start()
    wait_for(lambda: rt.waiting_for_baseline == 1, "the command's tool/begin never waited for the baseline")
    # an edit with paths is served by the held scan meanwhile; the command is still waiting
    eng.tool_began("t", "write_to_file", ToolKind.EDIT, ["pkg07/mod00007.py"])
    assert not returned.is_set() and rt.waiting_for_baseline == 1 and not rt.baseline.done()  # type: ignore[union-attr]
    hold.release()
    worker.join(120)
    assert returned.is_set() and rt.state == "ready"


def test_an_edit_of_a_folder_waits_for_the_whole_baseline(workspace: Path, make_engine: Any) -> None:
    eng, hold = _held_engine(workspace, make_engine)
    rt = eng._task("t")
    returned = threading.Event()

    def edit_a_folder() -> None:
        eng.tool_began("t", "write_to_file", ToolKind.EDIT, ["pkg05"])
        returned.set()

    worker = threading.Thread(target=edit_a_folder)
    worker.start()
    wait_for(lambda: rt.waiting_for_baseline == 1, "an edit of a folder may change anything in it: it waits")
    assert not returned.is_set()
    hold.release()
    worker.join(120)
    assert returned.is_set() and rt.state == "ready"


def test_read_tools_never_wait(workspace: Path, make_engine: Any) -> None:
    eng, hold = _held_engine(workspace, make_engine)
    eng.tool_began("t", "read_file", None, ["pkg01/mod00001.py"])
    eng.tool_ended("t", "read_file", ["pkg01/mod00001.py"], None)
    assert eng._task("t").state == "initializing"
    hold.release()
    assert eng.end_round("t", 2) is None


def test_an_edit_while_the_watcher_starts_is_captured_before_the_scan(
        workspace: Path, make_engine: Any, monkeypatch: Any) -> None:
    """Placing the watches takes seconds on a big tree; the edit does not wait for them."""
    make_tree(workspace, _tree(SMALL))
    from shadowpoint.roots import RootState

    go_on = threading.Event()
    real_start = RootState.start_watcher

    def slow_start(self: RootState, *args: Any, **kwargs: Any) -> None:
        assert go_on.wait(60)  # held until the edit's paths were captured
        real_start(self, *args, **kwargs)

    monkeypatch.setattr(RootState, "start_watcher", slow_start)
    eng = make_engine(workspace, watcher=True, hash_workers=0, verify_interval_s=0)
    eng.start_task("t", ts=1)
    eng.begin_round("t")
    eng.tool_began("t", "write_to_file", ToolKind.EDIT, ["pkg03/mod00003.py"])  # returns, watcher not started
    assert eng.roots["proj"].watcher is None and eng._task("t").state == "initializing"
    (workspace / "pkg03/mod00003.py").write_text("x = 'edited'\n")
    go_on.set()
    eng.tool_ended("t", "write_to_file", ["pkg03/mod00003.py"], ToolKind.EDIT)
    assert eng.end_round("t", 2) is not None
    assert _tree_of(eng, 1)["pkg03/mod00003.py"] == b"x = 3\n", "the baseline holds the bytes before the edit"
    assert len(_tree_of(eng, 1)) == SMALL
    assert _tree_of(eng, 2)["pkg03/mod00003.py"] == b"x = 'edited'\n"
