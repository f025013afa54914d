"""`RootState.locked`: a root's shadow repository, staging and head are reached only through
the `LockedRoot` it yields while the workspace lock is held, and not after the block ends."""

from __future__ import annotations

from pathlib import Path

import pytest

from shadowpoint.options import EngineOptions
from shadowpoint.roots import RootState
from shadowpoint.stage.stager import StagePlan
from shadowpoint.workspace import open_workspaces
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
