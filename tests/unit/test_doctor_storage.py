"""`doctor`'s storage check counts task folders, not the engine's folders beside them."""

from __future__ import annotations

from pathlib import Path

from shadowpoint.sidecar.doctor import check_docs
from shadowpoint.store.checkpoints import CheckpointStore


def test_storage_check_leaves_out_the_file_pool(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    (docs / "tasks" / "t1").mkdir(parents=True)
    (docs / "tasks" / "t1" / "task.json").write_text("{}")
    store = CheckpointStore(docs, made_ahead=True)  # a live engine's store: tasks/.file-pool
    try:
        assert store.pool is not None
        store.pool.fill()
        assert (docs / "tasks" / ".file-pool").is_dir()
        check = check_docs(docs)
        assert "1 task folder(s)" in " ".join(check["details"])
    finally:
        store.close()
    assert not (docs / "tasks" / ".file-pool").exists()  # closed: its files and folder are gone
