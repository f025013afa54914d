"""A damaged shadow repo or task folder (SPEC §7): detected, repaired or rebuilt keeping what
survives, reported (an error with a protocol kind, or a warning in the log), and never a
silent, permanent "checkpoints off": new checkpoints keep working after every kind of damage.

Damage is done between two engines on the same docs root (a restart), or under a running
engine where noted. The git CLI checks the result.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from shadowpoint.engine import Engine
from shadowpoint.errors import ShadowpointError
from shadowpoint.kinds import RestoreMode
from shadowpoint.store.checkpoints import CheckpointStore
from shadowpoint.store.values import task_ref
from tests.conftest import make_tree, read_tree
from tests.faults.support import (
    PROTOCOL_KINDS,
    blob_id,
    engine_command,
    engine_edit,
    expected_git_tree,
    fsck_problems,
    git,
    git_tree,
    lose_object,
    missing_objects,
    shadow_git_dir,
    start,
    wait_ready,
)

MakeEngine = Callable[..., Engine]
BASE = {"a.txt": "a0\n", "b.txt": "b0\n", "src/lib.py": "lib0\n"}


def _history(make_engine: MakeEngine, ws: Path) -> tuple[Engine, dict[int, dict[str, Any]]]:
    """A task with a baseline and two rounds; returns the (closed) engine and the disk at each ts."""
    make_tree(ws, BASE)
    eng = make_engine(ws)
    start(eng)
    disk = {1: read_tree(ws)}
    engine_edit(eng, ws, 2, {"a.txt": "a1\n"})
    disk[2] = read_tree(ws)
    engine_command(eng, ws, 3, lambda: make_tree(ws, {"b.txt": "b1\n", "src/new.py": "new\n"}))
    disk[3] = read_tree(ws)
    eng.close()
    return eng, disk


def _edited_back(disk: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """The workspace after a restore to ts=1 of `_history` plus one more edit of b.txt: the
    files edit tools reported (a.txt, b.txt) and those the command round changed (src/new.py,
    deleted) go back (SPEC §6, PROTOCOL 1.1 scope): the workspace of ts=1."""
    return dict(disk[1])


def _hashes(eng: Engine, task: str = "t") -> dict[int, str]:
    listing: dict[str, Any] = eng.list_checkpoints(task).to_wire()
    return {c["ts"]: c["hash"] for c in listing["checkpoints"]}


def _warned(logs: Sequence[Mapping[str, Any]], event: str) -> bool:
    return any(e["event"] == event and e["log_level"] in ("warning", "error") for e in logs)


def _checkpoints_go_on(eng: Engine, ws: Path, docs: Path, ts: int) -> str:
    """A new round commits a whole snapshot of the disk; returns its commit."""
    cp = engine_edit(eng, ws, ts, {"b.txt": f"after damage {ts}\n"})
    commit = cp.hashes[eng.first_root]
    git_dir = shadow_git_dir(docs, ws)
    assert missing_objects(git_dir, commit) == [], "the new checkpoint is whole"
    assert git_tree(git_dir, commit) == expected_git_tree(read_tree(ws))
    return commit


def _kind(exc: pytest.ExceptionInfo[ShadowpointError]) -> str:
    assert exc.value.kind in PROTOCOL_KINDS, exc.value.kind
    return exc.value.kind


# ---- the config ----------------------------------------------------------------------------------


@pytest.mark.parametrize("damage", ["empty", "truncated", "nul", "garbage"])
def test_damaged_config_is_rebuilt_and_history_kept(make_engine: MakeEngine, workspace: Path, docs: Path,
                                                    damage: str) -> None:
    old, disk = _history(make_engine, workspace)
    before = _hashes(old)
    git_dir = shadow_git_dir(docs, workspace)
    cfg = git_dir / "config"
    data = cfg.read_bytes()
    cfg.write_bytes({"empty": b"", "truncated": data[: len(data) // 3], "nul": b"\0" * len(data),
                     "garbage": b"[core\n\tworktree = \"unterminated\n\x01\x02"}[damage])

    eng = make_engine(workspace)
    with capture_logs() as logs:
        _checkpoints_go_on(eng, workspace, docs, 4)
    assert _warned(logs, "shadow_repo.repaired")
    assert {ts: h for ts, h in _hashes(eng).items() if ts in before} == before
    out = eng.restore("t", 1, RestoreMode.FILES).to_wire()
    assert out["files"] is not None
    assert read_tree(workspace) == _edited_back(disk)
    assert git(git_dir, "config", "core.worktree").stdout.decode().strip() == str(workspace)
    assert fsck_problems(git_dir) == []


# ---- missing objects -------------------------------------------------------------------------------


def test_a_lost_blob_of_an_old_checkpoint_gives_clear_errors(make_engine: MakeEngine, workspace: Path,
                                                             docs: Path) -> None:
    _old, disk = _history(make_engine, workspace)
    git_dir = shadow_git_dir(docs, workspace)
    gone = blob_id(b"a0\n")  # only the baseline holds it; a.txt is a1 on disk
    lose_object(git_dir, gone)

    eng = make_engine(workspace)
    with pytest.raises(ShadowpointError) as diff_err:
        eng.diff("t", 1, 2)
    _kind(diff_err)
    assert "missing" in str(diff_err.value) or "lost" in str(diff_err.value)
    with pytest.raises(ShadowpointError) as restore_err:
        eng.restore("t", 1, RestoreMode.FILES)
    assert _kind(restore_err) == "restore_failed"
    assert read_tree(workspace) == disk[3], "a restore that cannot read its files writes none of them"
    # what survives keeps working: the other checkpoints, and new ones
    assert eng.diff("t", 2, 3).to_wire()["files"]
    _checkpoints_go_on(eng, workspace, docs, 4)
    eng.restore("t", 2, RestoreMode.FILES)
    assert read_tree(workspace)["a.txt"] == b"a1\n"


def test_a_lost_blob_still_on_disk_is_written_again(make_engine: MakeEngine, workspace: Path, docs: Path) -> None:
    old, disk = _history(make_engine, workspace)
    before = _hashes(old)
    git_dir = shadow_git_dir(docs, workspace)
    lose_object(git_dir, blob_id(b"lib0\n"))  # every checkpoint holds it, and so does the disk

    eng = make_engine(workspace)
    with capture_logs() as logs:
        _checkpoints_go_on(eng, workspace, docs, 4)
    assert _warned(logs, "shadow_repo.objects_missing")
    # the blob came back from the disk: every earlier checkpoint is whole again
    assert fsck_problems(git_dir) == []
    for commit in before.values():
        assert missing_objects(git_dir, commit) == []
    eng.restore("t", 1, RestoreMode.FILES)
    assert read_tree(workspace) == _edited_back(disk)


def test_a_lost_pack_leaves_new_checkpoints_working(make_engine: MakeEngine, workspace: Path, docs: Path) -> None:
    make_tree(workspace, BASE)
    eng = make_engine(workspace)
    start(eng)
    engine_edit(eng, workspace, 2, {"a.txt": "a1\n"})
    eng.collect_garbage(grace_s=0)  # everything into one pack
    engine_edit(eng, workspace, 3, {"b.txt": "b1\n"})  # a loose commit on top of packed trees
    eng.close()
    git_dir = shadow_git_dir(docs, workspace)
    packs = list((git_dir / "objects" / "pack").glob("pack-*"))
    assert packs
    for p in packs:
        p.unlink()

    eng2 = make_engine(workspace)
    with capture_logs() as logs:
        assert sorted(_hashes(eng2)) == [1, 2, 3], "the task's list survives"
        for ts in (1, 2):
            with pytest.raises(ShadowpointError) as err:
                eng2.restore("t", ts, RestoreMode.FILES)
            assert _kind(err) == "restore_failed"
            with pytest.raises(ShadowpointError) as err:
                eng2.diff("t", ts)
            _kind(err)
        assert read_tree(workspace) == {"a.txt": b"a1\n", "b.txt": b"b1\n", "src/lib.py": b"lib0\n"}
        commit = _checkpoints_go_on(eng2, workspace, docs, 4)
    assert _warned(logs, "shadow_repo.objects_missing")
    # restores to a whole checkpoint work
    engine_edit(eng2, workspace, 5, {"a.txt": "a5\n"})
    eng2.restore("t", 4, RestoreMode.FILES)
    assert git_tree(git_dir, commit) == expected_git_tree(read_tree(workspace))


def test_a_lost_commit_of_the_last_checkpoint(make_engine: MakeEngine, workspace: Path, docs: Path) -> None:
    old, _disk = _history(make_engine, workspace)
    last = _hashes(old)[3]
    git_dir = shadow_git_dir(docs, workspace)
    lose_object(git_dir, last)

    eng = make_engine(workspace)
    with pytest.raises(ShadowpointError) as err:
        eng.restore("t", 3, RestoreMode.FILES)
    assert _kind(err) == "restore_failed"
    _checkpoints_go_on(eng, workspace, docs, 4)
    _checkpoints_go_on(eng, workspace, docs, 5)
    eng.restore("t", 2, RestoreMode.FILES)
    assert read_tree(workspace)["a.txt"] == b"a1\n"


def test_objects_lost_under_a_running_engine(make_engine: MakeEngine, workspace: Path, docs: Path) -> None:
    """libgit2 keeps trees in memory, so a loss is seen when a read needs a lost blob; from
    then on the root re-checks its objects from the disk and the next round repairs them."""
    make_tree(workspace, BASE)
    eng = make_engine(workspace)
    start(eng)
    engine_edit(eng, workspace, 2, {"a.txt": "a1\n"})
    git_dir = shadow_git_dir(docs, workspace)
    head_tree = git(git_dir, "rev-parse", "refs/shadowpoint/head").stdout.decode().strip()
    lose_object(git_dir, head_tree)  # the tree the next round patches
    lose_object(git_dir, blob_id(b"a0\n"))  # only the baseline holds it
    with pytest.raises(ShadowpointError) as err:
        eng.diff("t", 1, 2)
    assert _kind(err) == "unknown_checkpoint" and "lost" in str(err.value)
    with capture_logs() as logs:
        commit = _checkpoints_go_on(eng, workspace, docs, 3)
    assert _warned(logs, "shadow_repo.objects_missing")
    assert git_tree(git_dir, commit)["a.txt"] == ("100644", blob_id(b"a1\n"))
    with pytest.raises(ShadowpointError) as err:
        eng.restore("t", 1, RestoreMode.FILES)
    assert _kind(err) == "restore_failed"
    assert read_tree(workspace)["a.txt"] == b"a1\n", "nothing written by a restore that cannot complete"
    engine_edit(eng, workspace, 4, {"a.txt": "a4\n"})
    eng.restore("t", 3, RestoreMode.FILES)
    assert read_tree(workspace)["a.txt"] == b"a1\n"
    # the baseline really is damaged (the oracle sees it); the lost tree went with its round's
    # pack, commit 2 with it, so the chain restarted at 3 and fsck no longer reaches the baseline
    assert git(git_dir, "cat-file", "-e", blob_id(b"a0\n"), check=False).returncode != 0


# ---- lock files and leftovers --------------------------------------------------------------------------


def test_stale_lock_files_and_leftovers_are_cleared(make_engine: MakeEngine, workspace: Path, docs: Path) -> None:
    _old, _disk = _history(make_engine, workspace)
    git_dir = shadow_git_dir(docs, workspace)
    stale = [git_dir / "refs" / "shadowpoint" / "tasks" / "t.lock", git_dir / "refs" / "shadowpoint" / "head.lock",
             git_dir / "index.lock", git_dir / "HEAD.lock", git_dir / "config.lock", git_dir / "packed-refs.lock"]
    for f in stale:
        f.write_text("stale\n")
    (git_dir / "objects" / "gc-leftover").mkdir()
    (git_dir / "objects" / "gc-leftover" / "pack-x.pack").write_bytes(b"PACK partial")
    (git_dir / "objects" / "tmp_object_git2_aBcDeF").write_bytes(b"partial")

    eng = make_engine(workspace)
    with capture_logs() as logs:
        _checkpoints_go_on(eng, workspace, docs, 4)
    assert _warned(logs, "shadow_repo.stale_lock_removed")
    assert [f for f in stale if f.exists()] == []
    assert not (git_dir / "objects" / "gc-leftover").exists()
    assert not (git_dir / "objects" / "tmp_object_git2_aBcDeF").exists()
    assert fsck_problems(git_dir) == []


def test_stale_ref_locks_under_a_running_engine(make_engine: MakeEngine, workspace: Path, docs: Path) -> None:
    make_tree(workspace, BASE)
    eng = make_engine(workspace)
    start(eng)
    start(eng, "other")
    git_dir = shadow_git_dir(docs, workspace)
    for task in ("t", "other"):
        Path(f"{git_dir}/{task_ref(task)}.lock").write_text("stale\n")
    _checkpoints_go_on(eng, workspace, docs, 2)  # moves refs/shadowpoint/tasks/t past its stale lock
    eng.delete_task("other")  # removes its ref past the stale lock
    refs = git(git_dir, "for-each-ref", "--format=%(refname)").stdout.decode().split()
    assert task_ref("other") not in refs, "a deleted task's ref is gone, so gc can free its objects"
    assert task_ref("t") in refs


# ---- task folders ----------------------------------------------------------------------------------


def test_task_folder_deleted_under_a_running_engine(make_engine: MakeEngine, workspace: Path, docs: Path) -> None:
    make_tree(workspace, BASE)
    eng = make_engine(workspace)
    start(eng)
    engine_edit(eng, workspace, 2, {"a.txt": "a1\n"})
    shutil.rmtree(docs / "tasks" / "t")
    _checkpoints_go_on(eng, workspace, docs, 3)
    record = CheckpointStore(docs).load("t")  # task.json and its log
    assert [c.ts for c in record.checkpoints] == [1, 2, 3]


@pytest.mark.parametrize("removed", ["git_dir", "head_ref"])
def test_a_shadow_repository_without_its_head_under_a_running_engine_rescans(
        make_engine: MakeEngine, workspace: Path, docs: Path, removed: str) -> None:
    """The shadow git dir, or only its head ref, removed between two rounds (a person's
    `rm -rf`): the next round finds no snapshot, rescans and commits a whole snapshot of the
    disk. Both had committed only that round's path, every other file missing from it."""
    make_tree(workspace, BASE)
    eng = make_engine(workspace)
    start(eng)
    engine_edit(eng, workspace, 2, {"a.txt": "a1\n"})
    git_dir = shadow_git_dir(docs, workspace)
    if removed == "head_ref":
        (git_dir / "refs" / "shadowpoint" / "head").unlink()
    else:
        for _ in range(1000):  # as a person repeats `rm -rf`: the pool's thread may be making a file in there
            shutil.rmtree(git_dir, ignore_errors=True)
            if not git_dir.exists():
                break
        assert not git_dir.exists()
    commit = _checkpoints_go_on(eng, workspace, docs, 3)
    assert git_dir.is_dir() and fsck_problems(git_dir) == []
    assert git(git_dir, "rev-parse", f"{task_ref('t')}").stdout.decode().strip() == commit


def test_task_folder_deleted_while_stopped_is_rebuilt_from_the_shadow_refs(
        make_engine: MakeEngine, workspace: Path, docs: Path) -> None:
    old, disk = _history(make_engine, workspace)
    before = _hashes(old)
    shutil.rmtree(docs / "tasks" / "t")

    eng = make_engine(workspace)
    with capture_logs() as logs:
        listing: dict[str, Any] = eng.list_checkpoints("t").to_wire()
    assert _warned(logs, "task.rebuilt")
    assert {c["ts"]: c["hash"] for c in listing["checkpoints"]} == before
    assert listing["state"] == "ready"
    assert [c["kind"] for c in listing["checkpoints"]] == ["baseline", "round", "round"]
    eng.restore("t", 1, RestoreMode.FILES)
    assert read_tree(workspace) == disk[1]
    _checkpoints_go_on(eng, workspace, docs, 4)


def test_task_start_on_a_deleted_folder_keeps_the_history(make_engine: MakeEngine, workspace: Path,
                                                          docs: Path) -> None:
    old, _disk = _history(make_engine, workspace)
    before = _hashes(old)
    shutil.rmtree(docs / "tasks" / "t")
    eng = make_engine(workspace)
    eng.start_task("t", 1)
    assert wait_ready(eng, "t") == "ready"
    assert {ts: h for ts, h in _hashes(eng).items()} == before


@pytest.mark.parametrize("damage", ["truncated", "nul", "garbage", "wrong_shape", "empty"])
def test_corrupt_task_json_is_rebuilt(make_engine: MakeEngine, workspace: Path, docs: Path, damage: str) -> None:
    old, disk = _history(make_engine, workspace)
    before = _hashes(old)
    task_file = docs / "tasks" / "t" / "task.json"
    data = task_file.read_bytes()
    bad = {"truncated": data[: len(data) // 2], "nul": b"\0" * len(data), "garbage": b"\xff\xfe{{{not json",
           "wrong_shape": json.dumps({"task_id": "t", "checkpoints": [{"nope": 1}]}).encode(), "empty": b""}[damage]
    task_file.write_bytes(bad)

    eng = make_engine(workspace)
    with capture_logs() as logs:
        eng.start_task("t", 1)
        assert wait_ready(eng, "t") == "ready"
    assert _warned(logs, "task.rebuilt")
    assert _hashes(eng) == before
    kept = [p for p in task_file.parent.iterdir() if p.name != "task.json" and p.read_bytes() == bad]
    assert kept, "the damaged file is kept aside for a person to look at, not destroyed"
    eng.restore("t", 2, RestoreMode.FILES)
    assert read_tree(workspace) == {**disk[3], "a.txt": b"a1\n"} or read_tree(workspace) == disk[2]
    _checkpoints_go_on(eng, workspace, docs, 4)


def test_a_corrupt_task_does_not_make_another_task_the_last(make_engine: MakeEngine, workspace: Path,
                                                            docs: Path) -> None:
    """Deleting the last task removes the whole checkpoints folder: an unreadable task.json
    must still count as a task, or its history went with it."""
    make_tree(workspace, BASE)
    eng = make_engine(workspace)
    start(eng, "t")
    start(eng, "other")
    eng.close()
    (docs / "tasks" / "t" / "task.json").write_bytes(b"\0\0\0")
    eng2 = make_engine(workspace)
    eng2.delete_task("other")
    assert shadow_git_dir(docs, workspace).is_dir()
    assert eng2.list_checkpoints("t").to_wire()["state"] == "ready"


# ---- the stat cache ----------------------------------------------------------------------------------


@pytest.mark.parametrize("damage", ["truncated", "nul", "garbage", "wrong_shape"])
def test_corrupt_stat_cache_is_rebuilt(make_engine: MakeEngine, workspace: Path, docs: Path, damage: str) -> None:
    old, _disk = _history(make_engine, workspace)
    cache = old.roots[old.first_root].cache_file
    data = cache.read_bytes()
    header = data.split(b"\n", 1)[0] + b"\n"  # right version and base, then nonsense
    bad = {"truncated": data[: len(data) // 2], "nul": b"\0" * len(data), "garbage": os.urandom(200),
           "wrong_shape": header + b"\x05" * 64}[damage]
    cache.write_bytes(bad)

    eng = make_engine(workspace)
    make_tree(workspace, {"src/lib.py": "lib changed by a command\n"})  # a change only a rescan finds
    with capture_logs() as logs:
        cp = engine_command(eng, workspace, 4)
    assert _warned(logs, "stat_cache.unreadable")
    commit = cp.hashes[eng.first_root]
    assert git_tree(shadow_git_dir(docs, workspace), commit) == expected_git_tree(read_tree(workspace))
    _checkpoints_go_on(eng, workspace, docs, 5)
    eng.restore("t", 2, RestoreMode.FILES)
    assert read_tree(workspace)["a.txt"] == b"a1\n"
