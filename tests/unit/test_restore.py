"""Unit tests for `shadowpoint.restore.plan`: pure planning, and applying plans on real temp dirs."""

from __future__ import annotations

import json
import os
import random
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shadowpoint.errors import RestoreFailedError
from shadowpoint.restore.plan import (
    RestoreOp,
    RestorePlan,
    RestoreStats,
    apply_plan,
    exactly,
    in_the_way,
    plan_restore,
    raise_if_failed,
)
from shadowpoint.stage.exclusions import ExclusionRules
from shadowpoint.stage.scanner import Scanner, StageOptions
from shadowpoint.stage.stager import StagePlan
from shadowpoint.stage.stat_cache import StatCache
from shadowpoint.store.shadow_repo import ShadowRepo
from shadowpoint.store.values import MODE_EXEC, MODE_FILE, TreeEntry
from shadowpoint.workspace import RepoPath
from tests.conftest import Exe, Link, make_tree, read_tree


def E(n: int, mode: int = MODE_FILE) -> TreeEntry:
    return TreeEntry(f"{n:040x}", mode)


def entries(d: dict[str, TreeEntry]) -> dict[RepoPath, TreeEntry]:
    return {RepoPath(k): v for k, v in d.items()}


def ops(plan: RestorePlan) -> dict[str, TreeEntry | None]:
    return {op.path: op.entry for op in plan.ops}


# ---- planning ---------------------------------------------------------------------------------


TARGET = entries({"a": E(1), "b": E(2), "src/c": E(3), "src/sub/d": E(4), "same": E(5), "mode": E(6)})
CURRENT = entries({"a": E(10), "src/c": E(3), "src/sub/d": E(40), "same": E(5), "new": E(7),
                   "src/new": E(8), "srcx/f": E(9), "mode": E(6, MODE_EXEC)})


def test_scope_none_resets_every_tracked_path() -> None:
    plan = plan_restore("root", TARGET, CURRENT, None)
    assert plan.root == "root"
    assert ops(plan) == {"a": E(1), "b": E(2), "src/sub/d": E(4), "new": None, "src/new": None, "srcx/f": None,
                         "mode": E(6)}
    assert [op.path for op in plan.ops] == sorted(op.path for op in plan.ops)


def test_scope_limits_to_listed_paths() -> None:
    plan = plan_restore("r", TARGET, CURRENT, [RepoPath("a"), RepoPath("new"), RepoPath("same"),
                                               RepoPath("not/anywhere")])
    assert ops(plan) == {"a": E(1), "new": None}


def test_scope_directory_covers_files_below_it_only() -> None:
    plan = plan_restore("r", TARGET, CURRENT, [RepoPath("src")])
    assert ops(plan) == {"src/sub/d": E(4), "src/new": None}  # not srcx/f, not src/c (unchanged)
    plan = plan_restore("r", TARGET, CURRENT, [RepoPath("src/sub")])
    assert ops(plan) == {"src/sub/d": E(4)}


def test_unchanged_paths_produce_no_op() -> None:
    assert plan_restore("r", TARGET, TARGET, None).ops == ()
    assert plan_restore("r", TARGET, TARGET, list(TARGET)).ops == ()
    assert plan_restore("r", {}, {}, None).ops == ()
    assert plan_restore("r", TARGET, CURRENT, []).ops == ()


def test_mode_only_change_is_an_op() -> None:
    plan = plan_restore("r", entries({"x": E(1, MODE_EXEC)}), entries({"x": E(1)}), None)
    assert ops(plan) == {"x": E(1, MODE_EXEC)}


def test_in_the_way_finds_what_a_write_would_replace_that_the_safety_state_lacks(tmp_path: Path) -> None:
    """Files and links (a link to a folder included: the writer never follows one) to save;
    a folder at the written path holding a file (at any depth) that the plan does not delete,
    with that file; nothing else: an empty folder, or one of files the plan deletes, is the
    writer's to remove, a saved path the plan's."""
    ws = make_tree(tmp_path / "ws", {"file_at_path": "x", "file_above": "a build output", "real/dir/keep": "k",
                                     "link_above": Link("real"), "saved": "s", "empty_dir/sub/": None,
                                     "deep/a/b": "b", "built/sub/x.o": "x", "built/sub/gone.o": "g",
                                     "tracked/a": "a", "tracked/sub/b": "b", "linked/to": Link("../real")})
    writes = ["file_at_path", "file_above/x/y", "link_above/dir/new", "real/dir/new", "empty_dir",
              "saved/x", "nothing/here/at/all", "deep/a/b/c", "deep/a/new", "built", "tracked", "linked"]
    deletions = ["real/dir/keep", "built/sub/gone.o", "tracked/a", "tracked/sub/b"]  # replace nothing
    plan = RestorePlan("r", tuple(sorted((*(RestoreOp(RepoPath(p), E(1)) for p in writes),
                                          *(RestoreOp(RepoPath(p), None) for p in deletions)),
                                         key=lambda op: op.path)))
    found, occupied = in_the_way(plan, {"saved", "tracked/a", "tracked/sub/b", "built/sub/gone.o"}, ws)
    assert found == {"file_at_path", "file_above", "link_above", "deep/a/b"}
    assert occupied == {"built": "built/sub/x.o", "linked": "linked/to"}


def test_exactly_keeps_an_undo_to_its_paths() -> None:
    """Ops under one of the paths (a folder now) are dropped; a write with one of them in its
    way (under it, or a file where its folder goes) is left out, with it."""
    ops = [RestoreOp(RepoPath(p), E(1) if write else None) for p, write in [
        ("lib", False), ("lib/a.py", True), ("out", True), ("out/x", False), ("src", False), ("src/new", False),
        ("z", True)]]
    plan = RestorePlan("r", tuple(ops))
    kept, held = exactly(plan, [RepoPath(p) for p in ("lib/a.py", "out", "src", "z")])
    assert [op.path for op in kept.ops] == ["src", "z"]
    assert held == {"lib/a.py": "lib", "out": "out/x"}
    assert exactly(plan, [op.path for op in ops]) == (plan, {})


def test_plan_json_round_trip() -> None:
    plan = plan_restore("räk", TARGET, CURRENT, None)
    again = RestorePlan.from_json(json.loads(json.dumps(plan.to_json())))
    assert again == plan


def test_raise_if_failed() -> None:
    raise_if_failed(RestoreStats())
    with pytest.raises(RestoreFailedError, match=r"a/b.*boom.*and 1 more"):
        raise_if_failed(RestoreStats(failed=[(RepoPath("a/b"), "boom"), (RepoPath("c"), "bang")]))


# ---- applying ---------------------------------------------------------------------------------


@pytest.fixture
def repo(tmp_path: Path, workspace: Path) -> Iterator[ShadowRepo]:
    r = ShadowRepo.open_or_init(tmp_path / "shadow" / ".git", workspace)
    yield r
    r.close()


def snap(repo: ShadowRepo, root: Path) -> dict[RepoPath, TreeEntry]:
    """The workspace's files as tree entries (what the engine plans from)."""
    cache = StatCache()
    scanner = Scanner(root, repo, ExclusionRules(root), StageOptions())
    return repo.list_tree(scanner.stage(StagePlan(rescan=True), cache).tree)


def restore_to(repo: ShadowRepo, root: Path, target: dict[RepoPath, TreeEntry],
               scope: list[RepoPath] | None = None) -> RestoreStats:
    return apply_plan(root, repo, plan_restore("r", target, snap(repo, root), scope))


def test_apply_restores_content_modes_links_and_deletes_created(repo: ShadowRepo, workspace: Path) -> None:
    original: dict[str, Any] = {
        "a.txt": b"alpha", "run.sh": Exe("#!/bin/sh\necho\n"), "plain.sh": b"not exec",
        "link": Link("a.txt"), "far": Link("../../elsewhere"), "d/e/f.txt": b"deep",
    }
    make_tree(workspace, original)
    target = snap(repo, workspace)
    make_tree(workspace, {"a.txt": "changed", "run.sh": "now plain", "plain.sh": Exe("now exec"),
                          "link": Link("run.sh"), "far": "a file now", "d/e/f.txt": None,
                          "created.txt": "new", "newdir/x/y.txt": "new deep"})
    stats = restore_to(repo, workspace, target)
    assert read_tree(workspace) == original
    assert not (workspace / "newdir").exists(), "emptied folders are pruned"
    assert stats.failed == []
    assert sorted(stats.deleted) == ["created.txt", "newdir/x/y.txt"]
    assert sorted(stats.restored) == ["a.txt", "d/e/f.txt", "far", "link", "plain.sh", "run.sh"]
    assert os.path.islink(workspace / "link") and os.readlink(workspace / "link") == "a.txt"


def test_apply_swaps_file_and_dir(repo: ShadowRepo, workspace: Path) -> None:
    make_tree(workspace, {"x": "file", "y/inner": "in y"})
    target = snap(repo, workspace)
    (workspace / "x").unlink()
    shutil.rmtree(workspace / "y")
    make_tree(workspace, {"x/inner": "x is a dir", "y": "y is a file"})
    stats = restore_to(repo, workspace, target)
    assert stats.failed == []
    assert read_tree(workspace) == {"x": b"file", "y/inner": b"in y"}


def test_apply_collects_failures_without_raising(repo: ShadowRepo, workspace: Path) -> None:
    make_tree(workspace, {"blocked": "was a file", "ok.txt": "ok", "other.txt": "o"})
    target = snap(repo, workspace)
    (workspace / "blocked").unlink()
    make_tree(workspace, {"blocked/user-data.txt": "must survive", "ok.txt": "changed", "other.txt": "changed"})
    # only the paths the task reported: the user's folder is not in scope, so it stays
    plan = plan_restore("r", target, snap(repo, workspace), [RepoPath("blocked"), RepoPath("ok.txt"),
                                                            RepoPath("other.txt")])
    plan = RestorePlan(plan.root, tuple(op for op in plan.ops if op.path != "blocked/user-data.txt"))
    stats = apply_plan(workspace, repo, plan)
    assert [p for p, _ in stats.failed] == ["blocked"]
    assert "blocked" not in stats.restored
    assert sorted(stats.restored) == ["ok.txt", "other.txt"]
    assert read_tree(workspace) == {"blocked/user-data.txt": b"must survive", "ok.txt": b"ok", "other.txt": b"o"}
    with pytest.raises(RestoreFailedError, match="blocked"):
        raise_if_failed(stats)


def test_apply_replaces_a_tree_of_empty_folders(repo: ShadowRepo, workspace: Path) -> None:
    make_tree(workspace, {"b": "was a file"})
    target = snap(repo, workspace)
    (workspace / "b").unlink()
    (workspace / "b" / "d" / "e").mkdir(parents=True)  # files deleted, their folders left behind
    stats = restore_to(repo, workspace, target)
    assert stats.failed == []
    assert read_tree(workspace) == {"b": b"was a file"}


def test_apply_with_missing_blob_fails_that_path_only(repo: ShadowRepo, workspace: Path) -> None:
    make_tree(workspace, {"a": "a"})
    plan = RestorePlan("r", (RestoreOp(RepoPath("ghost"), E(123)),
                             RestoreOp(RepoPath("b"), TreeEntry(repo.write_blob(b"bee"), MODE_FILE))))
    stats = apply_plan(workspace, repo, plan)
    assert [p for p, _ in stats.failed] == ["ghost"]
    assert read_tree(workspace) == {"a": b"a", "b": b"bee"}


def test_apply_never_writes_through_a_symlinked_parent(repo: ShadowRepo, workspace: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    make_tree(outside, {"f.txt": "outside original"})
    make_tree(workspace, {"sub/f.txt": "inside"})
    target = snap(repo, workspace)
    shutil.rmtree(workspace / "sub")
    os.symlink(outside, workspace / "sub")
    stats = restore_to(repo, workspace, target)
    assert (outside / "f.txt").read_text() == "outside original"
    assert read_tree(outside) == {"f.txt": b"outside original"}
    assert stats.failed == []
    assert read_tree(workspace) == {"sub/f.txt": b"inside"}


def test_apply_deletes_links_not_their_targets(repo: ShadowRepo, workspace: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    make_tree(outside, {"keep.txt": "keep"})
    make_tree(workspace, {"a": "a"})
    target = snap(repo, workspace)
    os.symlink(outside, workspace / "lnk")
    os.symlink(outside / "keep.txt", workspace / "flnk")
    stats = restore_to(repo, workspace, target)
    assert sorted(stats.deleted) == ["flnk", "lnk"]
    assert read_tree(outside) == {"keep.txt": b"keep"}
    assert read_tree(workspace) == {"a": b"a"}


def test_apply_never_touches_git_dirs(repo: ShadowRepo, workspace: Path) -> None:
    make_tree(workspace, {".git/config": "user repo", "a": "a"})
    plan = RestorePlan("r", (RestoreOp(RepoPath(".git/config"), None), RestoreOp(RepoPath("a"), None)))
    stats = apply_plan(workspace, repo, plan)
    assert (workspace / ".git" / "config").read_text() == "user repo"
    assert [p for p, _ in stats.failed] == [".git/config"]
    assert stats.deleted == ["a"]


@pytest.mark.parametrize("seed", range(6))
def test_restore_round_trip_random(repo: ShadowRepo, workspace: Path, seed: int) -> None:
    rng = random.Random(seed)
    names = ["a", "b/c", "b/d/e", "f/g", "h", "b"]
    contents: list[Any] = [b"1", b"22", b"\0\x01bin", Exe("x"), Link("a"), Link("../out")]

    def mutate() -> None:
        for _ in range(rng.randint(1, 6)):
            name = rng.choice(names)
            p = workspace / name
            for i in range(1, name.count("/") + 1):  # a file in the way of a parent folder
                parent = workspace.joinpath(*name.split("/")[:i])
                if parent.is_symlink() or parent.is_file():
                    parent.unlink()
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            if rng.random() < 0.3:
                if p.is_symlink() or p.is_file():
                    p.unlink()
                continue
            make_tree(workspace, {name: rng.choice(contents)})

    mutate()
    mutate()
    expected = read_tree(workspace)
    target = snap(repo, workspace)
    for _ in range(4):
        mutate()
        stats = restore_to(repo, workspace, target)
        assert stats.failed == []
        assert read_tree(workspace) == expected
