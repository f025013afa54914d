"""The `Engine` facade in-process, on real temp workspaces and real shadow repos (watcher off).

Each test drives the engine the way the sidecar does (task/start, rounds of tool events,
completion, restore…) and checks the files on disk and the snapshots in the shadow repo.
"""

from __future__ import annotations

import os
import subprocess
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, cast

import pygit2
import pytest

from shadowpoint import maintenance
from shadowpoint.engine import Engine
from shadowpoint.errors import (
    AlreadyRestoredError,
    NoFileSnapshotError,
    NothingToUndoError,
    PathOutsideWorkspaceError,
    UnknownCheckpointError,
    UnknownMessageError,
    UnknownTaskError,
)
from shadowpoint.kinds import EditRestore, RestoreMode, ToolKind
from shadowpoint.restore.plan import RestoreOp, RestorePlan
from shadowpoint.restore.safe_fs import TEMP_PREFIX
from shadowpoint.results import Checkpoint, Restore, Wire
from shadowpoint.store import shadow_repo
from shadowpoint.store.storage import remove_all_checkpoints
from shadowpoint.store.values import MODE_FILE, TreeEntry, task_ref
from shadowpoint.workspace import RepoPath
from tests.conftest import Exe, Link, make_tree, read_tree, wait_for

MakeEngine = Callable[..., Engine]
EDIT = "write_to_file"
COMMAND = "execute_command"


# ---- helpers ----------------------------------------------------------------------------------


def as_json(wire: Wire) -> dict[str, Any]:
    """A result's wire form (`to_wire()`) to index into: a JSON object, its values JSON values."""
    return cast(dict[str, Any], wire)


def wait_ready(eng: Engine, task_id: str) -> str:
    """Wait (never asserting a duration) for the background baseline; returns the state."""

    def settled() -> str:
        state = str(eng.list_checkpoints(task_id).to_wire()["state"])
        return "" if state == "initializing" else state

    return wait_for(settled, f"the baseline of {task_id} never finished")


def start(eng: Engine, task_id: str = "t1", ts: int = 0) -> None:
    eng.start_task(task_id, ts)
    assert wait_ready(eng, task_id) == "ready"


def held_copy_engine(make_engine: Any, root: Path, **changes: Any) -> tuple[Engine, Any, threading.Event]:
    """An engine on `root` (`changes`: its options) whose task "t1" is ready, its root's
    background work (the borrowed copy, the stat cache's save) held until the returned gate
    is set (never set: as if the process died first)."""
    eng: Engine = make_engine(root, **changes)
    (state,) = eng.roots.values()
    gate = threading.Event()
    state.copy_gate = gate
    start(eng)
    return eng, state, gate


def edit_round(eng: Engine, root: Path, ts: int, files: dict[str, Any], task_id: str = "t1",
               report: Iterable[str] | None = None) -> Checkpoint | None:
    """A round with one edit tool writing `files` and reporting their paths (or `report`)."""
    paths = list(files) if report is None else list(report)
    eng.begin_round(task_id)
    eng.tool_began(task_id, EDIT, ToolKind.EDIT, paths)
    make_tree(root, files)
    eng.tool_ended(task_id, EDIT, paths)
    return eng.end_round(task_id, ts)


def command_round(eng: Engine, root: Path, ts: int, files: dict[str, Any], task_id: str = "t1") -> Checkpoint:
    eng.begin_round(task_id)
    eng.tool_began(task_id, COMMAND, None, None)
    make_tree(root, files)
    eng.tool_ended(task_id, COMMAND, None)
    cp = eng.end_round(task_id, ts)
    assert cp is not None
    return cp


def git_dir(eng: Engine, index: int = 0) -> Path:
    return Path(eng.describe_roots()[index]["shadowGitDir"])


def files_of(eng: Engine, commit: str | None, index: int = 0) -> dict[str, Any]:
    """A snapshot's files, shaped like `read_tree`'s output."""
    assert commit is not None
    repo = pygit2.Repository(str(git_dir(eng, index)))
    out: dict[str, Any] = {}

    def walk(tree: Any, prefix: str) -> None:
        for e in tree:
            obj = repo[e.id]
            if e.filemode == 0o040000:
                walk(obj, prefix + e.name + "/")
            elif e.filemode == 0o120000:
                out[prefix + e.name] = Link(os.fsdecode(cast(pygit2.Blob, obj).data))
            elif e.filemode == 0o100755:
                out[prefix + e.name] = Exe(cast(pygit2.Blob, obj).data)
            else:
                out[prefix + e.name] = cast(pygit2.Blob, obj).data

    walk(repo[commit].peel(pygit2.Tree), "")
    repo.free()
    return out


def wire(eng: Engine, task_id: str = "t1") -> dict[int, dict[str, Any]]:
    return {c["ts"]: c for c in as_json(eng.list_checkpoints(task_id).to_wire())["checkpoints"]}


def git(eng: Engine, *args: str) -> str:
    env = {"PATH": os.environ["PATH"], "HOME": os.environ["HOME"]}
    return subprocess.run(["git", f"--git-dir={git_dir(eng)}", *args], capture_output=True, text=True,
                          env=env, check=True).stdout


@pytest.fixture
def ws(workspace: Path) -> Path:
    return make_tree(workspace, {"a.txt": "a0", "b.txt": "b0", "src/lib.py": "lib0", "run.sh": Exe("#!/bin/sh\n"),
                                 "link": Link("a.txt"), "debug.log": "ignored", "node_modules/x/i.js": "dep"})


BASE = {"a.txt": b"a0", "b.txt": b"b0", "src/lib.py": b"lib0", "run.sh": Exe("#!/bin/sh\n"), "link": Link("a.txt")}


# ---- baseline and rounds ----------------------------------------------------------------------


def test_baseline_is_the_first_checkpoint(make_engine: MakeEngine, ws: Path) -> None:
    eng = make_engine(ws)
    state = eng.start_task("t1", 5).to_wire()
    assert state["state"] in ("initializing", "ready")
    assert wait_ready(eng, "t1") == "ready"
    cps = as_json(eng.list_checkpoints("t1").to_wire())["checkpoints"]
    assert len(cps) == 1
    base = cps[0]
    assert (base["ts"], base["kind"], base["reused"], base["restored"]) == (5, "baseline", False, False)
    assert base["hashes"] == {"proj": base["hash"]}
    assert files_of(eng, base["hash"]) == BASE
    assert git(eng, "config", "core.worktree").strip() == str(ws)
    assert git(eng, "rev-parse", task_ref("t1")).strip() == base["hash"]


def test_edit_round_stages_only_reported_paths(make_engine: MakeEngine, ws: Path) -> None:
    eng = make_engine(ws)
    start(eng)
    make_tree(ws, {"b.txt": "changed behind the engine's back"})
    cp = edit_round(eng, ws, 10, {"a.txt": "a1", "new/deep.txt": "n1", "debug.log": "forced"})
    assert cp is not None and cp.kind == "round" and not cp.reused
    snap = files_of(eng, cp.hashes["proj"])
    # b.txt changed but was not reported: an edit-only round never scans, so it is not seen
    assert snap == {**BASE, "a.txt": b"a1", "new/deep.txt": b"n1", "debug.log": b"forced"}
    # the commit's parent is the previous checkpoint
    assert git(eng, "rev-parse", f"{cp.hashes['proj']}^").strip() == wire(eng)[0]["hash"]
    assert git(eng, "rev-parse", task_ref("t1")).strip() == cp.hashes["proj"]


def test_a_round_moves_the_task_ref_in_place(make_engine: MakeEngine, ws: Path) -> None:
    """Each round writes its commit over the task ref's file (no new file renamed over it:
    on ext4 that started a write-back every round); git reads each one."""
    eng = make_engine(ws)
    start(eng)
    ref = git_dir(eng) / task_ref("t1")
    inode = ref.stat().st_ino
    for ts in (10, 20, 30):
        cp = edit_round(eng, ws, ts, {"a.txt": f"a{ts}"})
        assert cp is not None
        assert git(eng, "rev-parse", task_ref("t1")).strip() == cp.hashes["proj"]
        assert ref.stat().st_ino == inode


def test_command_round_rescans(make_engine: MakeEngine, ws: Path) -> None:
    eng = make_engine(ws)
    start(eng)
    make_tree(ws, {"b.txt": "behind the back"})
    cp = command_round(eng, ws, 10, {"src/gen.py": "generated", "a.txt": None, "more.log": "excluded"})
    snap = files_of(eng, cp.hashes["proj"])
    expected = {**BASE, "b.txt": b"behind the back", "src/gen.py": b"generated"}
    del expected["a.txt"]
    assert snap == expected


def test_unreported_edit_tool_falls_back_to_rescan(make_engine: MakeEngine, ws: Path) -> None:
    eng = make_engine(ws)
    start(eng)
    eng.begin_round("t1")
    eng.tool_began("t1", "mystery_tool", None, None)
    make_tree(ws, {"a.txt": "mystery"})
    eng.tool_ended("t1", "mystery_tool", None)
    cp = eng.end_round("t1", 10)
    assert cp is not None
    assert files_of(eng, cp.hashes["proj"])["a.txt"] == b"mystery"


def test_read_only_round_makes_no_checkpoint(make_engine: MakeEngine, ws: Path) -> None:
    eng = make_engine(ws)
    start(eng)
    eng.begin_round("t1")
    eng.tool_began("t1", "read_file", None, ["a.txt"])
    eng.tool_ended("t1", "read_file", ["a.txt"])
    assert eng.end_round("t1", 10) is None
    assert list(wire(eng)) == [0]


def test_round_without_change_reuses_snapshot(make_engine: MakeEngine, ws: Path) -> None:
    eng = make_engine(ws)
    start(eng)
    first = edit_round(eng, ws, 10, {"a.txt": "a1"})
    commits_before = git(eng, "rev-list", "--all").split()
    again = edit_round(eng, ws, 20, {"a.txt": "a1"})
    cmd = command_round(eng, ws, 30, {})
    assert first is not None and again is not None
    assert again.reused and cmd.reused
    assert again.hashes == first.hashes == cmd.hashes
    assert git(eng, "rev-list", "--all").split() == commits_before
    w = wire(eng)
    assert [w[t]["reused"] for t in (0, 10, 20, 30)] == [False, False, True, True]


def test_paths_outside_workspace_are_refused(make_engine: MakeEngine, ws: Path, tmp_path: Path) -> None:
    eng = make_engine(ws)
    start(eng)
    eng.begin_round("t1")
    make_tree(ws, {"nested/.git/HEAD": "ref", "nested/x": "x"})
    for bad in ("../escape", "/etc/passwd", ".git/config", str(tmp_path / "x"), "nested/x", ".GIT/HEAD"):
        with pytest.raises(PathOutsideWorkspaceError):
            eng.tool_began("t1", EDIT, ToolKind.EDIT, [bad])


def test_an_edit_tools_end_takes_the_paths_its_begin_resolved(make_engine: MakeEngine, ws: Path,
                                                               tmp_path: Path) -> None:
    """The end of an edit tool naming the paths its begin did does not resolve them again; what
    the tool did to the folders above them is staging's to find: a folder it swapped for a
    symlink to outside is staged as that link, and nothing outside is read."""
    outside = make_tree(tmp_path / "outside", {"f.txt": "outside's secret"})
    make_tree(ws, {"d/f.txt": "d0"})
    eng = make_engine(ws)
    start(eng)
    eng.begin_round("t1")
    eng.tool_began("t1", EDIT, ToolKind.EDIT, ["d/f.txt"])
    (ws / "d" / "f.txt").unlink()
    (ws / "d").rmdir()
    (ws / "d").symlink_to(outside)
    eng.tool_ended("t1", EDIT, ["d/f.txt"])  # begin resolved it: no error now
    cp = eng.end_round("t1", 10)
    assert cp is not None
    snap = files_of(eng, as_json(cp.to_wire())["hashes"]["proj"])
    assert snap["d"] == Link(str(outside)) and "d/f.txt" not in snap
    # a path its begin did not name is resolved, and refused as before
    eng.begin_round("t1")
    eng.tool_began("t1", EDIT, ToolKind.EDIT, ["a.txt"])
    with pytest.raises(PathOutsideWorkspaceError):
        eng.tool_ended("t1", EDIT, ["d/f.txt"])
    with pytest.raises(PathOutsideWorkspaceError):
        eng.tool_ended("t1", EDIT, ["a.txt", "../escape"])


def test_warnings_are_recorded_on_the_checkpoint(make_engine: MakeEngine, ws: Path) -> None:
    eng = make_engine(ws, max_file_bytes=100)
    start(eng)
    cp = edit_round(eng, ws, 10, {"big.txt": "x" * 101, "ok.txt": "ok"})
    assert cp is not None
    assert [w.to_wire() for w in cp.warnings] == [{"path": "big.txt", "reason": "over the size cap"}]
    assert wire(eng)[10]["warnings"] == [{"path": "big.txt", "reason": "over the size cap"}]
    assert "big.txt" not in files_of(eng, cp.hashes["proj"])


# ---- completion and compaction ----------------------------------------------------------------


def test_completion_dedup_within_three_messages(make_engine: MakeEngine, ws: Path) -> None:
    eng = make_engine(ws)
    start(eng)
    edit_round(eng, ws, 10, {"a.txt": "a1"})
    c1 = eng.complete("t1", 20)
    assert c1.kind == "completion" and c1.ts == 20
    c2 = eng.complete("t1", 21)
    assert c2.ts == 20, "a completion right after an unchanged one answers the earlier one"
    assert [c.kind for c in eng.list_checkpoints("t1").checkpoints] == ["baseline", "round", "completion"]
    for ts in (22, 23, 24):
        eng.add_message("t1", ts, "user" if ts % 2 else "assistant", f"m{ts}")
    c3 = eng.complete("t1", 25)
    assert c3.ts == 25 and c3.reused and c3.hashes == c1.hashes
    # a changed workspace is never deduplicated
    make_tree(ws, {"b.txt": "b1"})
    c4 = eng.complete("t1", 26)
    assert c4.ts == 26 and not c4.reused
    assert files_of(eng, c4.hashes["proj"])["b.txt"] == b"b1"


def test_view_changes_since_previous_completion(make_engine: MakeEngine, ws: Path) -> None:
    eng = make_engine(ws)
    start(eng)
    edit_round(eng, ws, 10, {"a.txt": "a1"})
    eng.complete("t1", 20)
    edit_round(eng, ws, 30, {"b.txt": "b1"})
    eng.complete("t1", 40)
    first = as_json(eng.view_changes("t1", 20).to_wire())
    assert first["title"] == "New changes"
    assert [(f["path"], f["before"], f["after"]) for f in first["files"]] == [("a.txt", "a0", "a1")]
    second = as_json(eng.view_changes("t1", 40).to_wire())
    assert [(f["path"], f["status"]) for f in second["files"]] == [("b.txt", "modified")]


def test_diff_against_workspace_and_between_checkpoints(make_engine: MakeEngine, ws: Path) -> None:
    eng = make_engine(ws)
    start(eng)
    edit_round(eng, ws, 10, {"a.txt": "a1"})
    make_tree(ws, {"b.txt": "outside rounds", "bin.dat": b"\0\1\2"})
    d = as_json(eng.diff("t1", 0).to_wire())
    assert d["title"] == "Changes since snapshot"
    files = {f["path"]: f for f in d["files"]}
    assert set(files) == {"a.txt", "b.txt", "bin.dat"}
    assert files["bin.dat"]["binary"] and files["bin.dat"]["after"] is None
    assert files["b.txt"]["after"] == "outside rounds"
    between = as_json(eng.diff("t1", 0, 10).to_wire())
    assert between["title"] == "New changes"
    assert [f["path"] for f in between["files"]] == ["a.txt"]


def test_compaction_checkpoint_offers_task_restore_only(make_engine: MakeEngine, ws: Path) -> None:
    eng = make_engine(ws)
    start(eng)
    edit_round(eng, ws, 10, {"a.txt": "a1"})
    cp = eng.compacted("t1", 20)
    edit_round(eng, ws, 30, {"a.txt": "a3"})
    w = wire(eng)[20]
    assert (w["kind"], w["hash"], w["hashes"]) == ("compaction", None, {})
    with pytest.raises(NoFileSnapshotError):
        eng.restore("t1", 20, RestoreMode.FILES)
    with pytest.raises(NoFileSnapshotError):
        eng.diff("t1", 20)
    out = as_json(eng.restore("t1", 20, RestoreMode.BOTH).to_wire())
    assert out["files"] is None and out["error"]["kind"] == "no_file_snapshot"
    assert out["task"] == {"keepThrough": 20}
    assert (ws / "a.txt").read_text() == "a3", "files untouched"
    assert list(wire(eng)) == [0, 10, 20]
    assert cp.kind == "compaction"


# ---- restore ----------------------------------------------------------------------------------


def _three_rounds(eng: Engine, ws: Path) -> None:
    start(eng)
    edit_round(eng, ws, 10, {"a.txt": "a1"})
    edit_round(eng, ws, 20, {"a.txt": "a2", "created.txt": "c2", "src/lib.py": "lib2"})


def test_restore_files_only_the_edited_paths(make_engine: MakeEngine, ws: Path) -> None:
    eng = make_engine(ws)
    _three_rounds(eng, ws)
    make_tree(ws, {"b.txt": "user's own change", "untracked.txt": "user's file"})
    out = as_json(eng.restore("t1", 10, RestoreMode.FILES).to_wire())
    assert out["task"] is None
    assert sorted(out["files"]["restored"]) == ["a.txt", "src/lib.py"]
    assert out["files"]["deleted"] == ["created.txt"]
    assert read_tree(ws) == {**BASE, "a.txt": b"a1", "b.txt": b"user's own change",
                             "untracked.txt": b"user's file", "debug.log": b"ignored",
                             "node_modules/x/i.js": b"dep"}
    w = wire(eng)
    assert w[10]["restored"] and list(w) == [0, 10, 20], "the conversation stays"
    # the safety checkpoint holds the state just before the restore
    safety = files_of(eng, out["files"]["safety"])
    assert safety["a.txt"] == b"a2" and safety["b.txt"] == b"user's own change"
    assert out["files"]["safety"] not in {c["hash"] for c in w.values()}
    with pytest.raises(AlreadyRestoredError):
        eng.restore("t1", 10, RestoreMode.FILES)
    # a new checkpoint clears the mark
    edit_round(eng, ws, 30, {"a.txt": "a3"})
    assert not any(c["restored"] for c in wire(eng).values())
    eng.restore("t1", 10, RestoreMode.FILES)
    assert (ws / "a.txt").read_text() == "a1"


def test_restore_after_commands_only_resets_what_they_changed(make_engine: MakeEngine, ws: Path) -> None:
    eng = make_engine(ws)
    start(eng)
    command_round(eng, ws, 10, {"a.txt": "a1", "b.txt": None, "made.txt": "m", "x.log": "ignored log"})
    make_tree(ws, {"src/lib.py": "after the checkpoint"})
    out = as_json(eng.restore("t1", 0, RestoreMode.FILES).to_wire())
    assert sorted(out["files"]["deleted"]) == ["made.txt"]
    assert sorted(out["files"]["restored"]) == ["a.txt", "b.txt"], "PROTOCOL 1.1 Scope: the rounds' changes"
    tree = read_tree(ws)
    assert tree["src/lib.py"] == b"after the checkpoint", "changed while no round was open: not the task's"
    assert tree["x.log"] == b"ignored log", "an ignored file the snapshot does not hold is left alone"
    assert tree["debug.log"] == b"ignored"


def test_restore_of_a_task_with_no_record_resets_every_tracked_file(make_engine: MakeEngine, ws: Path) -> None:
    eng = make_engine(ws)
    start(eng)
    command_round(eng, ws, 10, {"a.txt": "a1", "b.txt": None, "made.txt": "m"})
    make_tree(ws, {"src/lib.py": "after the checkpoint"})
    rt = eng._task("t1")
    rt.record.scope, rt.record.edited = {}, {}  # what it changed is lost (SPEC §6: git reset --hard)
    out = as_json(eng.restore("t1", 0, RestoreMode.FILES).to_wire())
    assert sorted(out["files"]["deleted"]) == ["made.txt"]
    assert sorted(out["files"]["restored"]) == ["a.txt", "b.txt", "src/lib.py"]
    assert {k: v for k, v in read_tree(ws).items() if k in BASE} == BASE


def test_restore_task_and_both(make_engine: MakeEngine, ws: Path) -> None:
    eng = make_engine(ws)
    _three_rounds(eng, ws)
    for ts in (11, 12):
        eng.add_message("t1", ts, "user", f"m{ts}")
    out = as_json(eng.restore("t1", 10, RestoreMode.TASK).to_wire())
    assert out == {"files": None, "task": {"keepThrough": 10}}
    assert list(wire(eng)) == [0, 10]
    assert (ws / "a.txt").read_text() == "a2", "task-only restore leaves files"
    with pytest.raises(UnknownCheckpointError):
        eng.restore("t1", 20, RestoreMode.FILES)
    out = as_json(eng.restore("t1", 0, RestoreMode.BOTH).to_wire())
    assert out["task"] == {"keepThrough": 0}
    assert sorted(out["files"]["restored"]) == ["a.txt", "src/lib.py"]
    assert (ws / "a.txt").read_text() == "a0" and not (ws / "created.txt").exists()
    assert list(wire(eng)) == [0]
    # the task keeps working after being cut back to its baseline
    cp = edit_round(eng, ws, 50, {"a.txt": "a5"})
    assert cp is not None and files_of(eng, cp.hashes["proj"])["a.txt"] == b"a5"
    assert git(eng, "rev-parse", f"{cp.hashes['proj']}^").strip() == wire(eng)[0]["hash"]


def test_undo_restore_puts_back_exactly_the_restored_paths(make_engine: MakeEngine, ws: Path) -> None:
    eng = make_engine(ws)
    _three_rounds(eng, ws)
    with pytest.raises(NothingToUndoError):
        eng.undo_restore("t1")
    before = read_tree(ws)
    eng.restore("t1", 0, RestoreMode.FILES)
    assert (ws / "a.txt").read_text() == "a0"
    make_tree(ws, {"b.txt": "edited after the restore"})
    out = as_json(eng.undo_restore("t1").to_wire())
    assert out["task"] is None
    assert sorted(out["files"]["restored"]) == ["a.txt", "created.txt", "src/lib.py"]
    assert read_tree(ws) == {**before, "b.txt": b"edited after the restore"}
    with pytest.raises(NothingToUndoError):
        eng.undo_restore("t1")


def test_restore_undo_redo_are_log_lines_that_a_reload_replays(make_engine: MakeEngine, ws: Path) -> None:
    """A file restore, its undo and its redo each add one line to task.log (task.json is not
    rewritten); the record read back from disk equals the one in memory after each."""
    from shadowpoint.store.checkpoints import LOG_FILE, TASK_FILE, CheckpointStore

    eng = make_engine(ws)
    _three_rounds(eng, ws)
    folder = eng.store.task_dir("t1")
    task_json = (folder / TASK_FILE).read_bytes()
    lines = (folder / LOG_FILE).read_bytes().count(b"\n")
    steps: tuple[Callable[[], Restore], ...] = (lambda: eng.restore("t1", 0, RestoreMode.FILES),
                                                lambda: eng.undo_restore("t1"), lambda: eng.redo_restore("t1"))
    for step in steps:
        step()
        assert (folder / TASK_FILE).read_bytes() == task_json
        assert (folder / LOG_FILE).read_bytes().count(b"\n") == lines + 1
        lines += 1
        memory = eng._task("t1").record
        disk = CheckpointStore(eng.options.docs_dir).load("t1")
        assert disk.to_json() == memory.to_json()
        assert [c.restored for c in disk.checkpoints] == [c.restored for c in memory.checkpoints]
    record = eng._task("t1").record
    assert [e["op"] for e in record.restores] == ["restore", "undo", "redo"]
    assert record.undo_stack == [1] and record.redo_stack == []
    assert (ws / "a.txt").read_text() == "a0"  # redone: as the restore left it


def test_restore_of_unknown_checkpoint_or_task(make_engine: MakeEngine, ws: Path) -> None:
    eng = make_engine(ws)
    start(eng)
    with pytest.raises(UnknownCheckpointError):
        eng.restore("t1", 999, RestoreMode.FILES)
    with pytest.raises(UnknownCheckpointError):
        eng.restore("t1", "0", RestoreMode.FILES)  # type: ignore[arg-type]  # a ts of the wrong type, on purpose
    with pytest.raises(UnknownTaskError):
        eng.restore("nope", 0, RestoreMode.FILES)
    with pytest.raises(UnknownTaskError):
        eng.list_checkpoints("nope")


# ---- message edit -----------------------------------------------------------------------------


def test_message_edit_chat_and_all(make_engine: MakeEngine, ws: Path) -> None:
    eng = make_engine(ws)
    start(eng)
    eng.add_message("t1", 5, "user", "first ask")
    edit_round(eng, ws, 10, {"a.txt": "a1"})
    eng.add_message("t1", 15, "user", "second ask")
    edit_round(eng, ws, 20, {"a.txt": "a2"})
    eng.add_message("t1", 25, "user", "third ask")
    edit_round(eng, ws, 30, {"a.txt": "a3"})

    same = eng.edit_message("t1", 25, "third ask", EditRestore.ALL).to_wire()
    assert same == {"files": None, "task": None, "text": "third ask"}
    assert (ws / "a.txt").read_text() == "a3" and list(wire(eng)) == [0, 10, 20, 30]
    with pytest.raises(UnknownMessageError):
        eng.edit_message("t1", 26, "x", EditRestore.CHAT)

    chat = eng.edit_message("t1", 25, "third, edited", EditRestore.CHAT).to_wire()
    assert chat["files"] is None and chat["task"] == {"keepThrough": 20}
    assert (ws / "a.txt").read_text() == "a3"
    assert list(wire(eng)) == [0, 10, 20]

    edit_round(eng, ws, 40, {"a.txt": "a4"})
    everything = as_json(eng.edit_message("t1", 15, "second, edited", EditRestore.ALL).to_wire())
    assert everything["task"] == {"keepThrough": 10}
    assert everything["files"]["restored"] == ["a.txt"]
    assert (ws / "a.txt").read_text() == "a1"
    assert list(wire(eng)) == [0, 10]


# ---- tasks and storage ------------------------------------------------------------------------


def test_two_tasks_share_one_shadow_repo(make_engine: MakeEngine, ws: Path) -> None:
    eng = make_engine(ws)
    start(eng, "t1")
    start(eng, "t2", 100)
    c1 = edit_round(eng, ws, 10, {"a.txt": "from t1"}, task_id="t1")
    c2 = edit_round(eng, ws, 110, {"b.txt": "from t2"}, task_id="t2")
    assert c1 is not None and c2 is not None
    snap2 = files_of(eng, c2.hashes["proj"])
    assert snap2["a.txt"] == b"from t1" and snap2["b.txt"] == b"from t2"
    assert len(list((eng.options.docs_dir / "checkpoints").iterdir())) == 1
    for tid in ("t1", "t2"):
        trailers = git(eng, "log", "--format=%(trailers:key=Shadowpoint-Task,valueonly)", task_ref(tid)).split()
        assert trailers and set(trailers) == {tid}
    # restoring t1 touches only what t1 edited
    out = as_json(eng.restore("t1", 0, RestoreMode.FILES).to_wire())
    assert out["files"]["restored"] == ["a.txt"]
    assert (ws / "a.txt").read_text() == "a0" and (ws / "b.txt").read_text() == "from t2"
    eng.delete_task("t1")
    assert not eng.store.task_dir("t1").exists()
    with pytest.raises(subprocess.CalledProcessError):
        git(eng, "rev-parse", "--verify", task_ref("t1"))
    with pytest.raises(UnknownTaskError):
        eng.list_checkpoints("t1")
    # t2 keeps its history and keeps working
    assert files_of(eng, wire(eng, "t2")[110]["hash"])["b.txt"] == b"from t2"
    c3 = edit_round(eng, ws, 120, {"b.txt": "more"}, task_id="t2")
    assert c3 is not None and files_of(eng, c3.hashes["proj"])["b.txt"] == b"more"
    eng.delete_task("t2")
    assert not (eng.options.docs_dir / "checkpoints").exists()
    # a later task starts afresh
    start(eng, "t3")
    assert files_of(eng, wire(eng, "t3")[0]["hash"])["b.txt"] == b"more"


def test_the_last_task_keeps_the_checkpoints_folder_while_another_engine_uses_it(
        make_engine: MakeEngine, ws: Path) -> None:
    """Deleting the last task on record removed the whole folder under another process still
    building its first task (no record yet): its shadow repo and the lock file went with it
    (three sidecars and a fourth deleting tasks: tests/faults/test_concurrency.py)."""
    eng = make_engine(ws)
    docs = eng.options.docs_dir
    start(eng, "t1")
    other = make_engine(ws)  # another engine (a flock share per engine, as per process)
    eng.delete_task("t1")
    assert (docs / "checkpoints").is_dir(), "another engine uses the folder: it stays"
    start(other, "t2")
    cp = edit_round(other, ws, 10, {"a.txt": "the other's"}, task_id="t2")
    assert cp is not None and files_of(other, cp.hashes["proj"])["a.txt"] == b"the other's"
    assert not remove_all_checkpoints(docs), "the CLI's way refuses too while an engine runs"
    other.delete_task("t2")
    assert (docs / "checkpoints").is_dir()
    eng.close()  # now `other` is the only user
    start(other, "t3")
    other.delete_task("t3")
    assert not (docs / "checkpoints").exists()


def test_delete_all_keeps_favorites(make_engine: MakeEngine, ws: Path) -> None:
    eng = make_engine(ws)
    for tid in ("t1", "t2", "fav"):
        start(eng, tid)
    eng.delete_all(["fav"])
    assert eng.store.task_ids() == ["fav"]
    assert (eng.options.docs_dir / "checkpoints").is_dir()
    assert list(wire(eng, "fav")) == [0]
    edit_round(eng, ws, 10, {"a.txt": "still works"}, task_id="fav")
    eng.delete_all([])
    assert eng.store.task_ids() == []
    assert not (eng.options.docs_dir / "checkpoints").exists()
    with pytest.raises(UnknownTaskError):
        eng.list_checkpoints("fav")


def _task_with_unique_blob(eng: Engine, ws: Path) -> str:
    start(eng, "keep")
    start(eng, "gone")
    cp = edit_round(eng, ws, 10, {"only-gone.txt": "unique content of the deleted task"}, task_id="gone")
    assert cp is not None
    (ws / "only-gone.txt").unlink()
    edit_round(eng, ws, 20, {"only-gone.txt": None}, task_id="gone")
    return git(eng, "rev-parse", f"{cp.hashes['proj']}:only-gone.txt").strip()


def test_gc_after_delete_keeps_other_tasks_whole(make_engine: MakeEngine, ws: Path) -> None:
    eng = make_engine(ws)
    _task_with_unique_blob(eng, ws)
    keep_base = wire(eng, "keep")[0]["hash"]
    eng.delete_task("gone")
    eng.collect_garbage(grace_s=0)
    git(eng, "fsck", "--full")
    assert files_of(eng, keep_base) == BASE
    c = edit_round(eng, ws, 30, {"a.txt": "after gc"}, task_id="keep")
    assert c is not None and files_of(eng, c.hashes["proj"])["a.txt"] == b"after gc"
    eng.restore("keep", 0, RestoreMode.FILES)
    assert (ws / "a.txt").read_text() == "a0"


def test_gc_after_delete_frees_objects_only_that_task_reached(make_engine: MakeEngine, ws: Path) -> None:
    eng = make_engine(ws)
    blob = _task_with_unique_blob(eng, ws)
    eng.delete_task("gone")
    eng.collect_garbage(grace_s=0)
    env = {"PATH": os.environ["PATH"], "HOME": os.environ["HOME"]}
    assert subprocess.run(["git", f"--git-dir={git_dir(eng)}", "cat-file", "-e", blob], env=env,
                          capture_output=True).returncode != 0


@pytest.mark.parametrize("upkeep", [True, False], ids=["upkeep", "deletion"])
def test_closing_stops_an_upkeep_collection_and_completes_a_deletions(make_engine: MakeEngine, workspace: Path,
                                                                      monkeypatch: pytest.MonkeyPatch,
                                                                      upkeep: bool) -> None:
    # A collection that only packs loose objects stops at its next pause when the engine closes
    # (a sidecar's exit waited minutes for one at 100k files); one freeing a deletion completes.
    monkeypatch.setattr(shadow_repo, "_PRUNE_BATCH", 100)  # pauses between removals of 100 loose copies
    make_tree(workspace, {f"f{i:03}.txt": f"file {i}\n" for i in range(600)})
    eng = make_engine(workspace)
    start(eng, "t")
    objects = git_dir(eng) / "objects"

    def loose() -> int:
        return sum(len(os.listdir(objects / d)) for d in os.listdir(objects) if len(d) == 2)

    before = loose()
    assert before >= 600, "the baseline's blobs are loose"
    inside = threading.Event()

    def pause() -> None:  # the engine's yield to rounds, held until the close began
        inside.set()
        wait_for(lambda: eng._closed, "the engine did not begin to close", 60)

    eng.maintenance._pause = pause
    eng.maintenance.collect_in_background(upkeep=upkeep)
    assert inside.wait(60)
    eng.close()  # joins the collection
    assert not list(objects.glob("gc-*")), "the staging folder went"
    if upkeep:
        assert 0 < loose() < before, "stopped in the removal of the loose copies"
    else:
        assert loose() == 0
    git(eng, "fsck", "--full")
    again = make_engine(workspace)
    assert files_of(again, wire(again, "t")[0]["hash"]) == read_tree(workspace)


def test_no_upkeep_collection_starts_while_one_runs(make_engine: MakeEngine, workspace: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    # A collection yielding to a quick succession of rounds outlasts 25 of them: the next
    # upkeep check must not start a second one packing the same objects beside it.
    monkeypatch.setattr(maintenance, "AUTO_PACK_LOOSE", -1)  # any repository is due
    make_tree(workspace, {f"f{i:02}.txt": f"file {i}\n" for i in range(40)})
    eng = make_engine(workspace)
    start(eng, "t")
    inside, release = threading.Event(), threading.Event()

    def pause() -> None:  # the engine's yield to rounds, held until the checks are done
        inside.set()
        assert release.wait(60)

    def collections() -> int:
        return sum(t.name == "shadowpoint-gc" and t.is_alive() for t in threading.enumerate())

    eng.maintenance._pause = pause
    monkeypatch.setattr(shadow_repo, "_PRUNE_BATCH", 10)
    for _ in range(maintenance.AUTO_PACK_EVERY):
        eng.maintenance.checkpointed()
    assert inside.wait(60) and collections() == 1
    for _ in range(2 * maintenance.AUTO_PACK_EVERY):
        eng.maintenance.checkpointed()
    assert collections() == 1
    release.set()
    eng.maintenance.join()
    assert collections() == 0


# ---- restart and recovery ---------------------------------------------------------------------


def test_restart_resumes_task_and_keeps_working(make_engine: MakeEngine, ws: Path) -> None:
    eng = make_engine(ws)
    _three_rounds(eng, ws)
    before = wire(eng)
    eng.close()

    eng2 = make_engine(ws)
    assert eng2.start_task("t1", 0).to_wire()["state"] == "ready"
    assert wire(eng2) == before
    # changes made while no engine ran are seen by the first round of the new process…
    make_tree(ws, {"b.txt": "changed while no engine ran"})
    cp = edit_round(eng2, ws, 30, {"a.txt": "a3"})
    assert cp is not None
    snap = files_of(eng2, cp.hashes["proj"])
    assert snap["a.txt"] == b"a3" and snap["b.txt"] == b"changed while no engine ran"
    assert git(eng2, "rev-parse", f"{cp.hashes['proj']}^").strip() == before[20]["hash"]
    # …and later edit-only rounds stage only their reported paths again
    make_tree(ws, {"b.txt": "behind the back"})
    cp = edit_round(eng2, ws, 40, {"a.txt": "a4"})
    assert cp is not None
    snap = files_of(eng2, cp.hashes["proj"])
    assert snap["a.txt"] == b"a4" and snap["b.txt"] == b"changed while no engine ran"
    eng2.restore("t1", 10, RestoreMode.FILES)
    assert (ws / "a.txt").read_text() == "a1" and not (ws / "created.txt").exists()


def test_restart_on_a_call_other_than_start(make_engine: MakeEngine, ws: Path) -> None:
    eng = make_engine(ws)
    _three_rounds(eng, ws)
    eng.close()
    eng2 = make_engine(ws)
    cp = edit_round(eng2, ws, 30, {"b.txt": "b3"})
    assert cp is not None and list(wire(eng2)) == [0, 10, 20, 30]


def test_restore_journal_left_behind_is_completed_on_resume(make_engine: MakeEngine, ws: Path) -> None:
    eng = make_engine(ws)
    _three_rounds(eng, ws)
    w = wire(eng)
    base_files = pygit2.Repository(str(git_dir(eng)))
    a0 = str(base_files.revparse_single(f"{w[0]['hash']}:a.txt").id)
    lib0 = str(base_files.revparse_single(f"{w[0]['hash']}:src/lib.py").id)
    base_files.free()
    eng.close()

    # a crash in the middle of a restore to the baseline: created.txt already deleted,
    # a temporary file left next to a.txt, lib.py not written yet
    (ws / "created.txt").unlink()
    (ws / f"{TEMP_PREFIX}crash").write_text("partial")
    plan = RestorePlan("proj", (
        RestoreOp(RepoPath("a.txt"), TreeEntry(a0, MODE_FILE)),
        RestoreOp(RepoPath("created.txt"), None),
        RestoreOp(RepoPath("src/lib.py"), TreeEntry(lib0, MODE_FILE)),
    ))
    eng.store.write_journal("t1", {"plans": [plan.to_json()], "safety": {"proj": w[20]["hash"]}})

    eng2 = make_engine(ws)
    eng2.start_task("t1", 0)
    assert eng2.store.read_journal("t1") is None
    assert (ws / "a.txt").read_text() == "a0"
    assert (ws / "src" / "lib.py").read_text() == "lib0"
    assert not (ws / "created.txt").exists()
    assert not (ws / f"{TEMP_PREFIX}crash").exists(), "the crashed writer's temporary file is gone"
    # the completed restore can be undone like any other
    eng2.undo_restore("t1")
    assert (ws / "a.txt").read_text() == "a2" and (ws / "created.txt").read_text() == "c2"
    assert (ws / "src" / "lib.py").read_text() == "lib2"


def test_second_engine_sees_restored_content(make_engine: MakeEngine, ws: Path) -> None:
    one = make_engine(ws)
    two = make_engine(ws)
    _three_rounds(one, ws)
    start(two, "t2", 100)
    one.restore("t1", 0, RestoreMode.FILES)
    assert (ws / "a.txt").read_text() == "a0"
    cp = edit_round(two, ws, 110, {"b.txt": "b from t2"}, task_id="t2")
    assert cp is not None
    assert files_of(two, cp.hashes["proj"])["a.txt"] == b"a0"


def test_crash_after_restore_keeps_restored_content(options: Any, ws: Path) -> None:
    eng = Engine([ws], options)
    _three_rounds(eng, ws)
    eng.restore("t1", 0, RestoreMode.FILES)
    for root in eng.roots.values():  # crash: nothing is flushed, locks die with the process
        with root.locked() as locked:
            locked.repo.close()
    eng.store.close()  # its file-pool thread dies with the process too
    eng2 = Engine([ws], options)
    try:
        cp = edit_round(eng2, ws, 30, {"b.txt": "b3"})
        assert cp is not None
        assert files_of(eng2, cp.hashes["proj"])["a.txt"] == b"a0"
    finally:
        eng2.close()


# ---- several roots ----------------------------------------------------------------------------


def test_two_roots_one_checkpoint(make_engine: MakeEngine, tmp_path: Path) -> None:
    r1 = make_tree(tmp_path / "one" / "app", {"x.txt": "x0"})
    r2 = make_tree(tmp_path / "two" / "app", {"y.txt": "y0"})
    eng = make_engine(r1, r2)
    names = [r["name"] for r in eng.describe_roots()]
    assert names == ["app", "app-2"]
    start(eng)
    cp = edit_round(eng, r1, 10, {"x.txt": "x1"}, report=["app/x.txt"])
    assert cp is not None and set(cp.hashes) == {"app", "app-2"}
    assert cp.hashes["app-2"] == wire(eng)[0]["hashes"]["app-2"], "an unchanged root keeps its commit"
    make_tree(r2, {"y.txt": "y1"})
    with pytest.raises(PathOutsideWorkspaceError):
        eng.tool_began("t1", EDIT, ToolKind.EDIT, ["y.txt"])
    c2 = edit_round(eng, r2, 20, {"y.txt": "y1"}, report=["app-2/y.txt"])
    assert c2 is not None and files_of(eng, c2.hashes["app-2"], 1) == {"y.txt": b"y1"}
    out = as_json(eng.restore("t1", 0, RestoreMode.FILES).to_wire())
    assert sorted(out["files"]["restored"]) == ["app-2/y.txt", "app/x.txt"]
    assert (r1 / "x.txt").read_text() == "x0" and (r2 / "y.txt").read_text() == "y0"
    d = as_json(eng.diff("t1", 0, 20).to_wire())
    assert sorted(f["path"] for f in d["files"]) == ["app-2/y.txt", "app/x.txt"]


# ---- awkward task ids and damaged repos -------------------------------------------------------


@pytest.mark.parametrize("task_id", ["a/../b", "../../escape", "tâche ünï", "x.lock", ".."])
def test_awkward_task_ids_work_end_to_end(make_engine: MakeEngine, ws: Path, task_id: str) -> None:
    eng = make_engine(ws)
    start(eng, task_id)
    cp = edit_round(eng, ws, 10, {"a.txt": "a1"}, task_id=task_id)
    assert cp is not None and not cp.reused
    assert git(eng, "rev-parse", task_ref(task_id)).strip() == cp.hashes["proj"]
    eng.restore(task_id, 0, RestoreMode.FILES)
    assert (ws / "a.txt").read_text() == "a0"
    assert eng.store.task_dir(task_id).parent == eng.options.docs_dir / "tasks"
    assert eng.store.task_ids() == [task_id]
    eng.delete_task(task_id)
    assert eng.store.task_ids() == []


def test_damaged_shadow_config_is_repaired_on_restart(make_engine: MakeEngine, ws: Path) -> None:
    eng = make_engine(ws)
    _three_rounds(eng, ws)
    before = wire(eng)
    eng.close()
    config = git_dir(eng) / "config"
    config.write_bytes(b"\0" * config.stat().st_size)
    (git_dir(eng) / "refs" / "shadowpoint" / "head.lock").write_text("stale")
    eng2 = make_engine(ws)
    assert wire(eng2) == before
    cp = edit_round(eng2, ws, 30, {"a.txt": "a3"})
    assert cp is not None
    assert git(eng2, "config", "core.worktree").strip() == str(ws)
    eng2.restore("t1", 10, RestoreMode.FILES)
    assert (ws / "a.txt").read_text() == "a1"


def test_root_given_through_a_symlink(make_engine: MakeEngine, ws: Path, tmp_path: Path) -> None:
    alias = tmp_path / "alias-of-proj"
    alias.symlink_to(ws)
    eng = make_engine(alias)
    assert eng.describe_roots()[0]["root"] == str(ws)
    start(eng)
    cp = edit_round(eng, ws, 10, {"a.txt": "via alias"}, report=[str(alias / "a.txt")])
    assert cp is not None and files_of(eng, cp.hashes["proj"])["a.txt"] == b"via alias"
    assert as_json(eng.restore("t1", 0, RestoreMode.FILES).to_wire())["files"]["restored"] == ["a.txt"]
    assert (ws / "a.txt").read_text() == "a0"


def test_nested_repository_reported_by_an_edit_tool_is_never_touched(make_engine: MakeEngine, ws: Path) -> None:
    make_tree(ws, {"vendored/.git/HEAD": "ref: refs/heads/main\n", "vendored/lib.c": "theirs"})
    eng = make_engine(ws)
    start(eng)
    eng.begin_round("t1")
    try:
        eng.tool_began("t1", EDIT, ToolKind.EDIT, ["vendored"])
    except PathOutsideWorkspaceError:
        pass  # refusing the nested repository itself is fine too
    make_tree(ws, {"vendored/new.c": "their new file", "a.txt": "a1"})
    eng.tool_ended("t1", EDIT, ["a.txt"])
    cp = eng.end_round("t1", 10)
    assert cp is not None
    assert not any(p.startswith("vendored") for p in files_of(eng, cp.hashes["proj"]))
    eng.restore("t1", 0, RestoreMode.FILES)
    assert read_tree(ws)["vendored/new.c"] == b"their new file"
    assert read_tree(ws)["vendored/lib.c"] == b"theirs"
    assert (ws / "a.txt").read_text() == "a0"
