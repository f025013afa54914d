"""Restoring with care (PROTOCOL 1.1): the scope of a task's commands, `paths`, `dryRun`,
`keepOutsideEdits` (libgit2's three-way merge), `task/fork`, the undo/redo stack and its
safety checkpoints kept by refs through garbage collection; on real shadow repos and temp
workspaces, the engine driven as the sidecar drives it.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path
from typing import Any, cast

import pygit2
import pytest

from shadowpoint.engine import Engine
from shadowpoint.errors import (
    InvalidParamsError,
    NoFileSnapshotError,
    NothingToUndoError,
    PathOutsideWorkspaceError,
    RestoreConflictError,
    RestoreFailedError,
    UnknownCheckpointError,
)
from shadowpoint.kinds import RestoreMode
from shadowpoint.store import packing
from shadowpoint.store.loose import object_id
from tests.conftest import Exe, Link, make_tree, read_tree
from tests.integration.test_engine import (
    MakeEngine,
    as_json,
    command_round,
    edit_round,
    files_of,
    git_dir,
    start,
    wire,
)

LINES = "".join(f"line {i:02d}\n" for i in range(1, 13))


def lines(**changes: str) -> str:
    out = LINES.splitlines(keepends=True)
    for key, text in changes.items():
        out[int(key[1:]) - 1] = text + "\n"
    return "".join(out)


def task_file(eng: Engine, task_id: str = "t1") -> str:
    return json.dumps(eng.store.load(task_id).to_json())  # task.json and its log


def refs(eng: Engine) -> dict[str, str]:
    repo = pygit2.Repository(str(git_dir(eng)))
    out = {name: str(repo.references[name].target) for name in repo.references if "head" not in name}
    repo.free()
    return out


def loose_objects(eng: Engine) -> set[str]:
    objects = git_dir(eng) / "objects"
    return {p.parent.name + p.name for p in objects.glob("[0-9a-f][0-9a-f]/*")}


def untouched(eng: Engine, ws: Path) -> tuple[Any, str, dict[str, str]]:
    """What a refused or dry request must leave as it is: the files, the task's record, the refs."""
    return read_tree(ws), task_file(eng), refs(eng)


@pytest.fixture
def ws(workspace: Path) -> Path:
    return make_tree(workspace, {"f.txt": LINES, "g.txt": "g0", "keep.txt": "k"})


# ---- scope ------------------------------------------------------------------------------------


def test_scope_with_a_watcher_takes_the_round_changes_not_those_between_rounds(
        make_engine: MakeEngine, ws: Path) -> None:
    eng = make_engine(ws, watcher=True)
    start(eng)
    edit_round(eng, ws, 10, {"g.txt": "g1"})
    make_tree(ws, {"keep.txt": "the person's, between rounds", "notes.md": "mine"})
    # the next round's stage picks these up too: they are still not the task's
    command_round(eng, ws, 20, {"made.txt": "by the shell", "f.txt": None})
    assert eng._task("t1").record.scope_paths(eng.first_root) == ["f.txt", "g.txt", "made.txt"]
    out = as_json(eng.restore("t1", 0, RestoreMode.FILES).to_wire())
    assert sorted(out["files"]["restored"]) == ["f.txt", "g.txt"] and out["files"]["deleted"] == ["made.txt"]
    tree = read_tree(ws)
    assert tree["keep.txt"] == b"the person's, between rounds" and tree["notes.md"] == b"mine"
    assert tree["f.txt"] == LINES.encode() and "made.txt" not in tree


def test_with_a_watcher_the_safety_checkpoint_holds_the_persons_edits_of_the_tasks_files(
        make_engine: MakeEngine, ws: Path) -> None:
    """The watcher vouches for the task's edited paths it did not record (their stat is proof
    enough, racy or not: SPEC §4); the person's edits it recorded are staged, and so are
    force-added files the rules hide from it (`build/` gets no watch)."""
    eng = make_engine(ws, watcher=True)
    start(eng)
    edit_round(eng, ws, 10, {"g.txt": "g1", "f.txt": lines(l01="task"), ".env": "TOKEN=task",
                             "build/gen.txt": "task"})
    make_tree(ws, {"g.txt": "the person's g", ".env": "TOKEN=the person's", "build/gen.txt": "the person's"})
    out = as_json(eng.restore("t1", 0, RestoreMode.FILES).to_wire())
    assert sorted(out["files"]["restored"]) == ["f.txt", "g.txt"]
    assert sorted(out["files"]["deleted"]) == [".env", "build/gen.txt"]
    safety = files_of(eng, out["files"]["safety"])
    assert safety["g.txt"] == b"the person's g" and safety[".env"] == b"TOKEN=the person's"
    assert safety["build/gen.txt"] == b"the person's"
    assert safety["f.txt"] == lines(l01="task").encode()
    assert read_tree(ws) == {"f.txt": LINES.encode(), "g.txt": b"g0", "keep.txt": b"k"}
    eng.undo_restore("t1")
    assert read_tree(ws) == {"f.txt": lines(l01="task").encode(), "g.txt": b"the person's g",
                             "keep.txt": b"k", ".env": b"TOKEN=the person's", "build/gen.txt": b"the person's"}


def test_a_round_of_reported_edits_does_not_take_what_changed_meanwhile(
        make_engine: MakeEngine, ws: Path) -> None:
    """Another task (or the person) writing while a round of reported edits is open: the write
    is in the checkpoint, but not in this task's scope, so its restore leaves it alone."""
    eng = make_engine(ws, watcher=True)
    start(eng)
    cp = edit_round(eng, ws, 10, {"g.txt": "g1", "keep.txt": "another task's, meanwhile"}, report=["g.txt"])
    assert cp is not None and files_of(eng, cp.hashes[eng.first_root])["keep.txt"] == b"another task's, meanwhile"
    assert eng._task("t1").record.scope_paths(eng.first_root) == ["g.txt"]
    out = as_json(eng.restore("t1", 0, RestoreMode.FILES).to_wire())
    assert out["files"]["restored"] == ["g.txt"] and out["files"]["deleted"] == []
    tree = read_tree(ws)
    assert tree["g.txt"] == b"g0" and tree["keep.txt"] == b"another task's, meanwhile"


def test_a_rescanned_round_counts_what_it_found_changed(make_engine: MakeEngine, ws: Path) -> None:
    eng = make_engine(ws)  # no watcher: every command round rescans
    start(eng)
    make_tree(ws, {"keep.txt": "changed before the round"})
    command_round(eng, ws, 10, {"made.txt": "m"})
    assert eng._task("t1").record.scope_paths(eng.first_root) == ["keep.txt", "made.txt"], (
        "PROTOCOL 1.1: a rescan cannot tell earlier outside edits apart and counts them as the task's")


# ---- keepOutsideEdits: the merges -------------------------------------------------------------


def test_clean_merge_reverts_the_task_and_keeps_the_person(make_engine: MakeEngine, ws: Path) -> None:
    eng = make_engine(ws)
    start(eng)
    edit_round(eng, ws, 10, {"f.txt": lines(l2="task 2"), "g.txt": "g1", "new.txt": "n"})
    make_tree(ws, {"f.txt": lines(l2="task 2", l11="mine 11")})
    loose_before = loose_objects(eng)
    out = as_json(eng.restore("t1", 0, RestoreMode.FILES, keep_outside_edits=True).to_wire())
    # the blobs the restore wrote went into the pack its ref's move wrote, not one loose file
    # each, but the person's f.txt that libgit2's merge had to read first
    mine = lines(l2="task 2", l11="mine 11").encode()
    assert loose_objects(eng) - loose_before == {object_id(b"blob", mine)}
    assert out["files"]["merged"] == ["f.txt"] and out["files"]["restored"] == ["g.txt"]
    assert out["files"]["deleted"] == ["new.txt"]
    tree = read_tree(ws)
    assert tree["f.txt"] == lines(l11="mine 11").encode() and tree["g.txt"] == b"g0" and "new.txt" not in tree
    # the safety checkpoint holds what was there, and undo puts it back exactly
    assert files_of(eng, out["files"]["safety"])["f.txt"] == lines(l2="task 2", l11="mine 11").encode()
    eng.undo_restore("t1")
    assert read_tree(ws)["f.txt"] == lines(l2="task 2", l11="mine 11").encode()
    assert read_tree(ws)["new.txt"] == b"n"


def test_a_file_the_task_left_alone_since_the_checkpoint_keeps_the_workspace(
        make_engine: MakeEngine, ws: Path) -> None:
    eng = make_engine(ws)
    start(eng)
    edit_round(eng, ws, 10, {"g.txt": "g1"})
    edit_round(eng, ws, 20, {"f.txt": lines(l1="task")})
    make_tree(ws, {"g.txt": "the person's g"})
    dry = as_json(eng.restore("t1", 10, RestoreMode.FILES, dry_run=True, keep_outside_edits=True).to_wire())
    assert dry["files"]["restored"] == ["f.txt"] and dry["files"]["merged"] == [] and dry["files"]["conflicts"] == []
    eng.restore("t1", 10, RestoreMode.FILES, keep_outside_edits=True)
    assert read_tree(ws)["g.txt"] == b"the person's g", "base = checkpoint: the outside edit stays"
    assert read_tree(ws)["f.txt"] == LINES.encode()


@pytest.mark.parametrize("case", ["overlap", "binary", "deleted_by_person", "created_by_task", "type_change",
                                  "file_where_a_folder_goes"])
def test_conflicts_refuse_the_whole_restore_and_write_nothing(make_engine: MakeEngine, ws: Path, case: str) -> None:
    eng = make_engine(ws)
    start(eng)
    conflicting = ["new.txt"] if case == "created_by_task" else ["f.txt"]
    if case == "file_where_a_folder_goes":
        # the task removed lib/, the person then made a file lib: the checkpoint's lib/a.py
        # cannot be written without replacing it (once replaced, and not undone)
        edit_round(eng, ws, 5, {"lib/a.py": "a"})
        edit_round(eng, ws, 10, {"lib/a.py": None, "g.txt": "g1"})
        (ws / "lib").rmdir()
        make_tree(ws, {"lib": "the person's file"})
        target = 5
        conflicting = ["lib", "lib/a.py"]
    elif case == "binary":
        make_tree(ws, {"f.txt": b"\0bin" + LINES.encode()})
        edit_round(eng, ws, 5, {"f.txt": b"\0bin" + LINES.encode()})
        edit_round(eng, ws, 10, {"f.txt": b"\0bin" + lines(l2="task").encode(), "g.txt": "g1"})
        make_tree(ws, {"f.txt": b"\0bin" + lines(l2="task", l11="mine").encode()})
        target = 5
    else:
        edit_round(eng, ws, 10, {"f.txt": lines(l5="task"), "g.txt": "g1", "new.txt": "task's"})
        target = 0
        if case == "overlap":
            make_tree(ws, {"f.txt": lines(l5="mine")})
        elif case == "deleted_by_person":
            (ws / "f.txt").unlink()
        elif case == "created_by_task":
            make_tree(ws, {"new.txt": "the person changed it"})
        else:
            (ws / "f.txt").unlink()
            make_tree(ws, {"f.txt": Link("g.txt")})
    before = untouched(eng, ws)
    dry = as_json(eng.restore("t1", target, RestoreMode.FILES, dry_run=True, keep_outside_edits=True).to_wire())
    assert dry["files"]["conflicts"] == conflicting and dry["files"]["safety"] is None
    assert untouched(eng, ws) == before, "a dry run writes nothing"
    with pytest.raises(RestoreConflictError) as info:
        eng.restore("t1", target, RestoreMode.FILES, keep_outside_edits=True)
    assert info.value.conflicts == conflicting and info.value.kind == "restore_conflict"
    assert untouched(eng, ws) == before, "a refused restore writes nothing (g.txt stays g1)"
    both = as_json(eng.restore("t1", target, RestoreMode.BOTH, keep_outside_edits=True).to_wire())
    assert both["files"] is None and both["error"]["kind"] == "restore_conflict"
    assert both["error"]["conflicts"] == conflicting and both["task"] == {"keepThrough": target}
    assert read_tree(ws) == before[0]


def test_mode_change_on_one_side_merges_with_the_content_of_the_other(make_engine: MakeEngine, ws: Path) -> None:
    eng = make_engine(ws)
    start(eng)
    edit_round(eng, ws, 10, {"f.txt": lines(l3="task")})
    os.chmod(ws / "f.txt", 0o755)  # the person makes it executable
    out = as_json(eng.restore("t1", 0, RestoreMode.FILES, keep_outside_edits=True).to_wire())
    assert out["files"]["merged"] == ["f.txt"]
    assert read_tree(ws)["f.txt"] == Exe(LINES), "the task's content change reverted, the person's mode kept"


def test_keep_outside_edits_base_after_a_restore_is_the_workspace_it_left(make_engine: MakeEngine, ws: Path) -> None:
    eng = make_engine(ws)
    start(eng)
    edit_round(eng, ws, 10, {"f.txt": lines(l2="task 2")})
    edit_round(eng, ws, 20, {"f.txt": lines(l2="task 2", l6="task 6")})
    eng.restore("t1", 10, RestoreMode.FILES)  # the task's own write: never an outside edit
    make_tree(ws, {"f.txt": lines(l2="task 2", l12="mine")})
    out = as_json(eng.restore("t1", 0, RestoreMode.FILES, keep_outside_edits=True).to_wire())
    assert out["files"]["merged"] == ["f.txt"]
    assert read_tree(ws)["f.txt"] == lines(l12="mine").encode()


def test_an_outside_edit_a_restore_left_alone_stays_the_persons_in_the_next_one(
        make_engine: MakeEngine, ws: Path) -> None:
    """The task's base after a restore is its old base with the restore's writes: an outside
    edit of a file the restore did not write is still the person's, so the next restore that
    keeps outside edits merges it instead of overwriting it (the base is not simply the
    workspace the restore left)."""
    eng = make_engine(ws)
    start(eng)
    edit_round(eng, ws, 10, {"f.txt": lines(l2="task 2"), "g.txt": "g1"})
    make_tree(ws, {"f.txt": lines(l2="task 2", l11="mine 11")})
    out = as_json(eng.restore("t1", 0, RestoreMode.FILES, paths=["g.txt"], keep_outside_edits=True).to_wire())
    assert out["files"]["restored"] == ["g.txt"] and out["files"]["merged"] == []
    assert read_tree(ws)["f.txt"] == lines(l2="task 2", l11="mine 11").encode()
    out = as_json(eng.restore("t1", 0, RestoreMode.FILES, keep_outside_edits=True).to_wire())
    assert out["files"]["merged"] == ["f.txt"]
    assert read_tree(ws)["f.txt"] == lines(l11="mine 11").encode(), "the person's line went with the task's"


def test_the_persons_edit_a_merge_kept_stays_the_persons_in_the_next_restore(
        make_engine: MakeEngine, ws: Path) -> None:
    """A merged file's base after the restore is its content in the checkpoint (the task's part
    of what the merge wrote), not the merge: the person's lines in it stay outside edits, so a
    restore to a later checkpoint that keeps outside edits merges them again."""
    eng = make_engine(ws)
    start(eng)
    edit_round(eng, ws, 10, {"f.txt": lines(l1="task 1")})
    make_tree(ws, {"f.txt": lines(l1="task 1", l9="mine 9")})
    out = as_json(eng.restore("t1", 0, RestoreMode.FILES, keep_outside_edits=True).to_wire())
    assert out["files"]["merged"] == ["f.txt"] and read_tree(ws)["f.txt"] == lines(l9="mine 9").encode()
    out = as_json(eng.restore("t1", 10, RestoreMode.FILES, keep_outside_edits=True).to_wire())
    assert out["files"]["merged"] == ["f.txt"] and out["files"]["restored"] == []
    assert read_tree(ws)["f.txt"] == lines(l1="task 1", l9="mine 9").encode(), "the person's line was lost"
    # undo walks it back exactly; a restore without keepOutsideEdits is as in 1.0
    eng.undo_restore("t1")
    assert read_tree(ws)["f.txt"] == lines(l9="mine 9").encode()
    edit_round(eng, ws, 20, {"f.txt": lines(l1="task 1b", l9="mine 9")})
    eng.restore("t1", 0, RestoreMode.FILES)
    assert read_tree(ws)["f.txt"] == LINES.encode()

def test_a_merge_back_to_the_checkpoint_takes_its_tree_as_the_base(make_engine: MakeEngine, ws: Path) -> None:
    """The usual keep-mine restore goes back to a checkpoint the task's base differs from only
    at the restored files: its base is the checkpoint's tree itself (no tree written), which is
    what patching the old base with the restore's own entries gives."""
    eng = make_engine(ws)
    start(eng)
    edit_round(eng, ws, 10, {"f.txt": lines(l1="task 1"), "deep/er/g.txt": "task"})
    make_tree(ws, {"f.txt": lines(l1="task 1", l9="mine 9"), "notes.md": "the person's new file"})
    packs = set((git_dir(eng) / "objects" / "pack").glob("*.idx"))
    out = as_json(eng.restore("t1", 0, RestoreMode.FILES, keep_outside_edits=True).to_wire())
    assert out["files"]["merged"] == ["f.txt"] and out["files"]["deleted"] == ["deep/er/g.txt"]
    record = eng._task("t1").record
    (entry,) = record.restores[-1]["roots"].values()
    repo = pygit2.Repository(str(git_dir(eng)))
    base_tree = repo[entry["base"]].peel(pygit2.Tree)
    assert base_tree.id == repo[record.checkpoint(0).hashes[eng.first_root]].peel(pygit2.Tree).id
    (new_pack,) = set((git_dir(eng) / "objects" / "pack").glob("*.idx")) - packs
    assert str(base_tree.id) not in packing.pack_objects(new_pack), "the base's trees were written again"
    assert "f.txt" in base_tree and "notes.md" not in base_tree and "deep" not in base_tree
    assert repo[entry["after"]].peel(pygit2.Tree)["notes.md"], "the workspace's state keeps the person's file"
    repo.free()
    # and it works as a base: the person's line is still theirs in the next merge
    edit_round(eng, ws, 20, {"f.txt": lines(l2="task 2", l9="mine 9")})
    make_tree(ws, {"f.txt": lines(l2="task 2", l9="mine 9", l12="mine 12")})
    out = as_json(eng.restore("t1", 0, RestoreMode.FILES, keep_outside_edits=True).to_wire())
    assert out["files"]["merged"] == ["f.txt"]
    assert read_tree(ws)["f.txt"] == lines(l12="mine 12").encode()  # line 9 was in the task's round 20


def test_keep_outside_edits_on_a_compaction_checkpoint_is_no_file_snapshot(make_engine: MakeEngine, ws: Path) -> None:
    eng = make_engine(ws)
    start(eng)
    edit_round(eng, ws, 10, {"g.txt": "g1"})
    eng.compacted("t1", 20)
    before = untouched(eng, ws)
    with pytest.raises(NoFileSnapshotError):
        eng.restore("t1", 20, RestoreMode.FILES, keep_outside_edits=True)
    with pytest.raises(NoFileSnapshotError):
        eng.restore("t1", 20, RestoreMode.FILES, dry_run=True, keep_outside_edits=True)
    assert untouched(eng, ws) == before


# ---- paths, bad input -------------------------------------------------------------------------


def test_paths_take_folders_and_leave_unknown_files_alone(make_engine: MakeEngine, ws: Path) -> None:
    eng = make_engine(ws)
    start(eng)
    edit_round(eng, ws, 10, {"src/a.py": "a1", "src/b.py": "b1", "g.txt": "g1"})
    make_tree(ws, {"src/untracked.py": "the person's new file"})
    out = as_json(eng.restore("t1", 0, RestoreMode.FILES, paths=["src"]).to_wire())
    assert sorted(out["files"]["deleted"]) == ["src/a.py", "src/b.py"] and out["files"]["restored"] == []
    tree = read_tree(ws)
    assert tree["src/untracked.py"] == b"the person's new file", "neither snapshot holds it: left alone"
    assert tree["g.txt"] == b"g1"
    assert not wire(eng)[0]["restored"], "a restore limited by paths does not mark the checkpoint restored"


@pytest.mark.parametrize("root", [".", "./", "ABS", "ABS/"])
def test_paths_naming_the_root_take_every_file_either_snapshot_holds(make_engine: MakeEngine, ws: Path,
                                                                     root: str) -> None:
    """The root is a folder too: the files under it, whatever the task's scope (keep.txt was
    changed between rounds, by the person: out of the scope, in the paths)."""
    eng = make_engine(ws)
    start(eng)
    edit_round(eng, ws, 10, {"src/a.py": "a1", "g.txt": "g1"})
    make_tree(ws, {"keep.txt": "the person's", "untracked.txt": "new, in no snapshot"})
    named = [root.replace("ABS", str(ws))]
    plan = as_json(eng.restore("t1", 0, RestoreMode.FILES, paths=named, dry_run=True).to_wire())["files"]
    assert sorted(plan["restored"]) == ["g.txt", "keep.txt"] and plan["deleted"] == ["src/a.py"]
    out = as_json(eng.restore("t1", 0, RestoreMode.FILES, paths=named).to_wire())["files"]
    assert (sorted(out["restored"]), out["deleted"]) == (sorted(plan["restored"]), plan["deleted"])
    tree = read_tree(ws)
    assert tree["g.txt"] == b"g0" and tree["keep.txt"] == b"k" and "src/a.py" not in tree
    assert tree["untracked.txt"] == b"new, in no snapshot", "neither snapshot holds it: left alone"
    assert not wire(eng)[0]["restored"], "a restore limited by paths does not mark the checkpoint restored"
    eng.undo_restore("t1")
    assert read_tree(ws)["keep.txt"] == b"the person's" and read_tree(ws)["src/a.py"] == b"a1"


def test_naming_an_excluded_folder_does_not_make_its_files_tracked(make_engine: MakeEngine, ws: Path) -> None:
    """A named path neither snapshot holds is left alone, and stays untracked: the safety
    checkpoint of a restore of `paths=["node_modules"]` once took every file under it in, and
    the next whole restore deleted them (tests/property/test_model.py found it)."""
    eng = make_engine(ws)
    start(eng)
    make_tree(ws, {"node_modules/dep/index.js": "the installed dependency"})
    command_round(eng, ws, 10, {"g.txt": "g1"})
    out = as_json(eng.restore("t1", 0, RestoreMode.FILES, paths=["node_modules", "g.txt"]).to_wire())["files"]
    assert (out["restored"], out["deleted"]) == (["g.txt"], [])
    assert "node_modules/dep/index.js" not in files_of(eng, out["safety"])
    command_round(eng, ws, 20, {"g.txt": "g2"})
    out = as_json(eng.restore("t1", 0, RestoreMode.FILES).to_wire())["files"]
    assert (out["restored"], out["deleted"]) == (["g.txt"], [])
    assert read_tree(ws)["node_modules/dep/index.js"] == b"the installed dependency"


@pytest.mark.parametrize("watcher", [False, True], ids=["rescan", "watcher"])
@pytest.mark.parametrize("where", ["at_the_path", "where_a_folder_goes"])
def test_an_untracked_file_a_restore_replaces_is_saved_first_and_undone(
        make_engine: MakeEngine, ws: Path, watcher: bool, where: str) -> None:
    """The task's build made `gen` (a file or a folder) and the task then ignored it; a file
    the person or a later build put there is excluded, so no snapshot holds it. A restore to
    the checkpoint with the old `gen` writes over it: the restore's safety checkpoint takes
    it in first, the result names it, and the undo brings it back (it was lost, unsaved)."""
    old = {"gen/out.txt": "built then"} if where == "where_a_folder_goes" else {"gen": "built then"}
    make_tree(ws, old)
    eng = make_engine(ws, watcher=watcher)
    start(eng)
    command_round(eng, ws, 10, {".gitignore": "gen\n", **{p: None for p in old}})
    if where == "where_a_folder_goes":
        (ws / "gen").rmdir()
    command_round(eng, ws, 20, {"gen": b"\x7fELF the person's build"})
    assert "gen" not in files_of(eng, wire(eng)[20]["hash"]), "ignored: no snapshot holds it"
    before = read_tree(ws)
    plan = as_json(eng.restore("t1", 0, RestoreMode.FILES, dry_run=True).to_wire())["files"]
    assert read_tree(ws) == before, "a dry run writes nothing"
    out = as_json(eng.restore("t1", 0, RestoreMode.FILES).to_wire())["files"]
    assert (sorted(out["restored"]), sorted(out["deleted"])) == (sorted(plan["restored"]), sorted(plan["deleted"]))
    if where == "where_a_folder_goes":
        assert (out["restored"], out["deleted"]) == (["gen/out.txt"], [".gitignore", "gen"])
    else:
        assert (out["restored"], out["deleted"]) == (["gen"], [".gitignore"])
    assert files_of(eng, out["safety"])["gen"] == b"\x7fELF the person's build", "saved before it was replaced"
    assert read_tree(ws) == {"f.txt": LINES.encode(), "g.txt": b"g0", "keep.txt": b"k",
                             **{p: v.encode() for p, v in old.items()}}
    eng.undo_restore("t1")
    assert read_tree(ws) == before


@pytest.mark.parametrize("watcher", [False, True], ids=["rescan", "watcher"])
def test_a_named_file_made_where_the_newest_snapshot_has_a_folder_is_left_alone(
        make_engine: MakeEngine, ws: Path, watcher: bool) -> None:
    """The newest snapshot has a folder `gen`; a file `gen` was made since. A restore of
    `paths: ["gen"]` to a checkpoint without either leaves the file alone: neither snapshot
    holds it (PROTOCOL 1.1 `paths`). The folder at that path once counted as holding it."""
    eng = make_engine(ws, watcher=watcher)
    start(eng)
    command_round(eng, ws, 10, {"gen/x": "in the newest snapshot"})
    make_tree(ws, {"gen/x": None})
    (ws / "gen").rmdir()
    make_tree(ws, {"gen": "made since"})
    out = as_json(eng.restore("t1", 0, RestoreMode.FILES, paths=["gen"]).to_wire())["files"]
    assert (out["restored"], out["deleted"]) == ([], [])
    assert read_tree(ws)["gen"] == b"made since"


@pytest.mark.parametrize("watcher", [False, True], ids=["rescan", "watcher"])
@pytest.mark.parametrize("named", [False, True], ids=["whole", "named"])
def test_a_folder_where_a_restore_writes_a_file_is_left_whole_and_the_undo_keeps_it(
        make_engine: MakeEngine, ws: Path, watcher: bool, named: bool) -> None:
    """The task's `gen` was a file; a later build made `gen/` a folder, which the task
    ignored. A restore to the file's checkpoint (whole, or of `paths: ["gen"]`) does not
    touch the folder's files, which no snapshot holds (SPEC §6): `gen` is left as it is,
    named in the error, before any write, and the rest is restored. The undo of that restore
    puts back exactly its paths: it once deleted the folder's files, no longer ignored once
    the restore had removed `.gitignore`, because `gen` was one of them."""
    make_tree(ws, {"gen": "built then"})
    eng = make_engine(ws, watcher=watcher)
    start(eng)
    command_round(eng, ws, 10, {".gitignore": "gen\n", "gen": None})
    command_round(eng, ws, 20, {"gen/x.o": b"\x7fELF x", "gen/sub/y.o": b"\x7fELF y", "g.txt": "g2"})
    assert not any(p.startswith("gen") for p in files_of(eng, wire(eng)[20]["hash"])), "ignored"
    before = read_tree(ws)
    paths = ["gen"] if named else None
    plan = as_json(eng.restore("t1", 0, RestoreMode.FILES, paths=paths, dry_run=True).to_wire())["files"]
    assert "gen" not in plan["restored"] and not any(p.startswith("gen/") for p in plan["deleted"])
    with pytest.raises(RestoreFailedError, match=r"gen: left as it is, since the folder there holds gen/"):
        eng.restore("t1", 0, RestoreMode.FILES, paths=paths)
    after = read_tree(ws)
    assert {p: v for p, v in after.items() if p.startswith("gen")} == \
        {p: v for p, v in before.items() if p.startswith("gen")}, "the folder is left whole"
    assert after["g.txt"] == (b"g2" if named else b"g0") and (".gitignore" in after) == named
    eng.undo_restore("t1")
    assert read_tree(ws) == before


@pytest.mark.parametrize("watcher", [False, True], ids=["rescan", "watcher"])
def test_an_undo_puts_back_exactly_its_paths_or_nothing(make_engine: MakeEngine, ws: Path, watcher: bool) -> None:
    """A restore deleted `out` and `lib/a.py`; then a folder `out/` and a file `lib` were made.
    The undo cannot put the two back without deleting them, which it did not touch (PROTOCOL
    `undoRestore`: exactly its paths): it is refused whole, naming both, and writes nothing.
    Moved aside, the undo goes through. (It once deleted `out/x`, saved only in its own safety
    checkpoint, which no undo or redo reaches.)"""
    eng = make_engine(ws, watcher=watcher)
    start(eng)
    command_round(eng, ws, 10, {"out": "out file", "lib/a.py": "a"})
    out = as_json(eng.restore("t1", 0, RestoreMode.FILES).to_wire())["files"]
    assert sorted(out["deleted"]) == ["lib/a.py", "out"]
    command_round(eng, ws, 20, {"out/x": "made after the restore", "lib": "a file, made after"})
    before = read_tree(ws)
    with pytest.raises(RestoreFailedError, match=r"lib/a\.py \(lib is in its way\), out \(out/x is in its way\)"):
        eng.undo_restore("t1")
    assert read_tree(ws) == before, "nothing was changed"
    make_tree(ws, {"out/x": None, "lib": None})
    (ws / "out").rmdir()
    undone = as_json(eng.undo_restore("t1").to_wire())["files"]
    assert sorted(undone["restored"]) == ["lib/a.py", "out"] and undone["deleted"] == []
    assert read_tree(ws)["out"] == b"out file" and read_tree(ws)["lib/a.py"] == b"a"


def test_bad_input_is_refused_and_writes_nothing(make_engine: MakeEngine, ws: Path, tmp_path: Path) -> None:
    eng = make_engine(ws)
    start(eng)
    edit_round(eng, ws, 10, {"g.txt": "g1"})
    start(eng, "t2", 15)
    before = untouched(eng, ws)
    outside = tmp_path / "outside.txt"
    outside.write_text("not the workspace's")
    for bad in ([str(outside)], ["../outside.txt"], [".git/config"]):
        with pytest.raises(PathOutsideWorkspaceError):
            eng.restore("t1", 0, RestoreMode.FILES, paths=bad)
        with pytest.raises(PathOutsideWorkspaceError):
            eng.restore("t1", 0, RestoreMode.FILES, paths=bad, dry_run=True)
    for ts in (5, 999, "10", None):
        with pytest.raises(UnknownCheckpointError):
            # "10" and None are not ints: a ts of the wrong type, on purpose
            eng.restore("t1", ts, RestoreMode.FILES, keep_outside_edits=True)  # type: ignore[arg-type]
    for new_id in ("t1", "t2", ""):
        with pytest.raises(InvalidParamsError):
            eng.fork_task("t1", 10, new_id)
    with pytest.raises(UnknownCheckpointError):
        eng.fork_task("t1", -1, "t3")
    assert untouched(eng, ws) == before and outside.read_text() == "not the workspace's"
    assert not eng.store.exists("t3")


# ---- dry run = real run -----------------------------------------------------------------------


NAMES = ["f.txt", "g.txt", "keep.txt", "a/x.txt", "a/y.txt", "b/z.txt", "n.txt"]


def _random_change(rng: random.Random, root: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in rng.sample(NAMES, rng.randint(1, 3)):
        if rng.random() < 0.25 and (root / name).exists():
            out[name] = None
        elif name == "f.txt" and (root / name).exists():
            text = (root / name).read_text().splitlines(keepends=True) or ["\n"]
            text[rng.randrange(len(text))] = f"changed {rng.random()}\n"
            out[name] = "".join(text)
        else:
            out[name] = f"{name} {rng.random()}\n" * rng.randint(1, 3)
    return out


@pytest.mark.parametrize("seed", range(6))
def test_dry_run_answers_exactly_what_the_restore_does(make_engine: MakeEngine, ws: Path, seed: int) -> None:
    rng = random.Random(seed)
    eng = make_engine(ws)
    start(eng)
    for ts in range(10, 70, 10):
        change = _random_change(rng, ws)
        if rng.random() < 0.5:
            edit_round(eng, ws, ts, change)
        else:
            command_round(eng, ws, ts, change)
        if rng.random() < 0.4:
            make_tree(ws, _random_change(rng, ws))  # outside edits between rounds
    for _ in range(4):
        target = rng.choice([c["ts"] for c in wire(eng).values()])
        options: dict[str, Any] = {"keep_outside_edits": rng.random() < 0.5}
        if rng.random() < 0.4:
            options["paths"] = rng.sample([*NAMES, "a"], 2)
        if wire(eng)[target]["restored"] and "paths" not in options:
            continue
        before = untouched(eng, ws)
        dry = as_json(eng.restore("t1", target, RestoreMode.FILES, dry_run=True, **options).to_wire())["files"]
        assert untouched(eng, ws) == before, "a dry run writes nothing"
        try:
            real = as_json(eng.restore("t1", target, RestoreMode.FILES, **options).to_wire())["files"]
        except RestoreConflictError as exc:
            assert dry["conflicts"] and sorted(exc.conflicts) == sorted(dry["conflicts"])
            assert untouched(eng, ws) == before
            continue
        assert dry["conflicts"] == []
        for key in ("restored", "deleted", "merged"):
            assert sorted(dry[key]) == sorted(real[key]), (seed, target, options, key, dry, real)
        if rng.random() < 0.5:
            make_tree(ws, _random_change(rng, ws))


# ---- fork -------------------------------------------------------------------------------------


def test_fork_and_restore_across_both_lines_survive_deleting_either(make_engine: MakeEngine, ws: Path) -> None:
    eng = make_engine(ws)
    start(eng)
    edit_round(eng, ws, 10, {"g.txt": "g1"})
    command_round(eng, ws, 20, {"made.txt": "by the shell"})
    edit_round(eng, ws, 30, {"g.txt": "g3"})
    first_attempt = read_tree(ws)
    cp = eng.fork_task("t1", 25, "t1-fork")
    assert cp.ts == 20 and cp.hashes == wire(eng)[20]["hashes"]
    fork = eng._task("t1-fork").record
    assert fork.scope_paths(eng.first_root) == ["g.txt", "made.txt"] and (
        fork.forked_from is not None and fork.forked_from["taskId"] == "t1")
    eng.restore("t1-fork", 20, RestoreMode.FILES)
    assert read_tree(ws)["g.txt"] == b"g1" and read_tree(ws)["made.txt"] == b"by the shell"
    edit_round(eng, ws, 40, {"g.txt": "fork 4", "f.txt": lines(l1="fork")}, task_id="t1-fork")
    second_attempt = read_tree(ws)
    eng.restore("t1", 30, RestoreMode.FILES)
    assert read_tree(ws)["g.txt"] == b"g3" and read_tree(ws)["f.txt"] == lines(l1="fork").encode(), (
        "f.txt is not in the source's scope: left alone")
    eng.delete_task("t1")
    for _ in range(2):
        eng.collect_garbage(grace_s=0)
    eng.restore("t1-fork", 40, RestoreMode.FILES)
    assert read_tree(ws) == second_attempt
    eng.restore("t1-fork", 0, RestoreMode.FILES)
    assert read_tree(ws)["g.txt"] == b"g0" and "made.txt" not in read_tree(ws)
    assert first_attempt["g.txt"] == b"g3"


# ---- undo / redo ------------------------------------------------------------------------------


def test_undo_and_redo_walk_a_chain_of_restores_exactly_through_gc(make_engine: MakeEngine, ws: Path) -> None:
    eng = make_engine(ws)
    start(eng)
    for ts in range(10, 60, 10):
        edit_round(eng, ws, ts, {"g.txt": f"g{ts}", f"f{ts}.txt": "x", "f.txt": lines(l1=f"t{ts}")})
    states = [read_tree(ws)]
    safeties = []
    for i, target in enumerate([0, 30, 10, 40, 20, 50]):
        make_tree(ws, {"mine.txt": f"outside {i}"})
        out = as_json(eng.restore("t1", target, RestoreMode.FILES, paths=["g.txt"] if i == 3 else None).to_wire())
        safeties.append(out["files"]["safety"])
        states.append(read_tree(ws))
        eng.collect_garbage(grace_s=0)
    for walk, expected in ((eng.undo_restore, reversed(states[:-1])), (eng.redo_restore, states[1:])):
        for state in expected:
            walk("t1")
            eng.collect_garbage(grace_s=0)
            assert {k: v for k, v in read_tree(ws).items() if k != "mine.txt"} == {
                k: v for k, v in state.items() if k != "mine.txt"}
        with pytest.raises(NothingToUndoError):
            walk("t1")
    rec = eng._task("t1").record
    assert len(rec.restores) == 18 and len({e["n"] for e in rec.restores}) == 18
    for entry in rec.restores:  # every safety checkpoint and after-state survives gc
        for info in entry["roots"].values():
            assert files_of(eng, info["safety"]) is not None and files_of(eng, info["after"]) is not None
    assert safeties[0] in {e["roots"][eng.first_root]["safety"] for e in rec.restores}
    # a new restore after undos drops the redo stack
    eng.undo_restore("t1")
    eng.restore("t1", 0, RestoreMode.FILES)
    with pytest.raises(NothingToUndoError):
        eng.redo_restore("t1")
    record = json.loads(task_file(eng))
    assert record["redo_stack"] == [] and len(record["undo_stack"]) == 6


@pytest.mark.parametrize("dry_run", [True, False])
def test_a_restore_that_stops_after_staging_anchors_what_it_staged(make_engine: MakeEngine, ws: Path,
                                                                  dry_run: bool) -> None:
    """The safety state a dry run or a refused restore staged is what the engine tracks from
    then on: the head ref names it (a collection keeps its blobs; other processes mirror it)."""
    eng = make_engine(ws)
    start(eng)
    edit_round(eng, ws, 10, {"f.txt": lines(l5="task")})
    make_tree(ws, {"f.txt": lines(l5="mine")})
    if dry_run:
        dry = eng.restore("t1", 0, RestoreMode.FILES, dry_run=True, keep_outside_edits=True)
        assert as_json(dry.to_wire())["files"]["conflicts"]
    else:
        with pytest.raises(RestoreConflictError):
            eng.restore("t1", 0, RestoreMode.FILES, keep_outside_edits=True)
    (root,) = eng.roots.values()
    repo = pygit2.Repository(str(git_dir(eng)))
    try:
        head = repo.references["refs/shadowpoint/head"].peel(pygit2.Tree)
        assert str(head.id) == root.cache.tree
        assert cast(pygit2.Blob, repo[head["f.txt"].id]).data == lines(l5="mine").encode()
    finally:
        repo.free()
