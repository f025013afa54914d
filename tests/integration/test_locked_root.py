"""`RootState.locked`: a root's shadow repository, staging and head are reached only through
the `LockedRoot` it yields while the workspace lock is held, and not after the block ends."""

from __future__ import annotations

from pathlib import Path

import pytest

from shadowpoint.options import EngineOptions
from shadowpoint.roots import RootState
from shadowpoint.stage.stager import StagePlan
from shadowpoint.store import shadow_repo
from shadowpoint.store.shadow_repo import ShadowRepo
from shadowpoint.store.values import HEAD_REF
from shadowpoint.workspace import RepoPath, open_workspaces
from tests.conftest import make_tree


def test_the_repository_is_reached_only_under_the_lock(workspace: Path, options: EngineOptions) -> None:
    make_tree(workspace, {"a.txt": "a", "src/b.py": "b"})
    root = RootState(open_workspaces([workspace], options.docs_dir, {})[0], options)
    try:
        assert not hasattr(root, "repo") and not hasattr(root, "stage") and not hasattr(root, "set_head")
        with root.locked() as r:
            result = r.stage(StagePlan(rescan=True))
            r.set_head(result.tree)
            assert set(r.repo.list_tree(result.tree)) == {"a.txt", "src/b.py"}
        with root.locked() as again:
            assert set(again.repo.list_tree(again.cache.tree)) == {"a.txt", "src/b.py"}
        with pytest.raises(RuntimeError, match="was released"):
            r.open()
    finally:
        with root.locked() as r:
            r.close()


def test_letting_go_of_the_lock_writes_what_the_hold_made_and_small_packs_get_merged(
        workspace: Path, options: EngineOptions, monkeypatch: pytest.MonkeyPatch) -> None:
    """Trees and commits are held in memory until a ref moves (`ShadowRepo.flush`); a hold
    that moved none still leaves them on disk for other processes. After MERGE_PACKS_AT packs
    the background thread merges them into one, which another process reads whole."""
    monkeypatch.setattr(shadow_repo, "MERGE_PACKS_AT", 3)
    make_tree(workspace, {"a.txt": "a", "src/b.py": "b"})
    root = RootState(open_workspaces([workspace], options.docs_dir, {})[0], options)
    try:
        with root.locked() as r:
            result = r.stage(StagePlan(rescan=True))
            commit = r.repo.commit(result.tree, [], "no ref moves", "t")
            git_dir = r.repo.git_dir
        other = ShadowRepo.open_existing(git_dir)  # what another process sees on disk
        try:
            assert set(other.list_tree(other.commit_tree(commit))) == {"a.txt", "src/b.py"}
        finally:
            other.close()
        pack_dir = git_dir / "objects" / "pack"
        for n in range(2):  # with the first hold's, 3 packs: the merge is due when the last hold ends
            (workspace / "src" / f"n{n}.py").write_text(str(n))
            with root.locked() as r:
                result = r.stage(StagePlan(forced=frozenset({RepoPath(f"src/n{n}.py")})))
                r.set_head(result.tree)
        assert root.wait_copied(timeout=60), "the background merge did not end"
        assert len(list(pack_dir.glob("*.idx"))) == 1
        other = ShadowRepo.open_existing(git_dir)
        try:
            assert set(other.list_tree(other.read_ref(HEAD_REF))) == {"a.txt", "src/b.py", "src/n0.py", "src/n1.py"}
            assert other.has_object(commit)
        finally:
            other.close()
    finally:
        with root.locked() as r:
            r.close()
