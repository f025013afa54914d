"""A sidecar killed (SIGKILL) in the middle of a multi-file restore: the next start leaves
the workspace exactly as before the restore or exactly as the checkpoint, with no torn file."""

from __future__ import annotations

import random
import time
from pathlib import Path

from tests.conftest import make_tree, read_tree
from tests.rpc import SidecarProcess

FILES = 1500
ATTEMPTS = 6


def _versions(tag: str) -> dict[str, str]:
    # every file of one version carries its version tag on every line: a torn file shows both
    return {f"src/m{i // 100:02d}/f{i:04d}.txt": f"{tag} {i}\n" * 200 for i in range(FILES)}


def _start(root: Path, task: str) -> SidecarProcess:
    sc = SidecarProcess()
    sc.call("initialize", {"roots": [str(root)], "settings": {"watcher": False}})
    sc.call("task/start", {"taskId": task, "ts": 1000})
    sc.wait_ready(task)
    return sc


def test_kill_during_restore_is_completed_on_next_start(tmp_path: Path) -> None:
    rng = random.Random(7)
    root = make_tree(tmp_path / "work" / "proj", _versions("old"))
    before_state = None
    outcomes = []
    mid_restore = 0
    for attempt in range(ATTEMPTS):
        task = f"crash-{attempt}"
        if attempt:
            make_tree(root, _versions("old"))
        sc = _start(root, task)
        paths = sorted(_versions("x"))
        sc.call("round/begin", {"taskId": task})
        sc.call("tool/begin", {"taskId": task, "tool": "write_to_file", "paths": paths})
        make_tree(root, _versions("new"))
        sc.call("tool/end", {"taskId": task, "tool": "write_to_file", "paths": paths})
        sc.call("round/end", {"taskId": task, "ts": 2000})
        before_state = read_tree(root)
        checkpoint_state = {p: v.encode() for p, v in _versions("old").items()}

        if attempt == 0:
            # measure how long a whole restore takes, to aim the kills inside it
            t0 = time.monotonic()
            sc.call("checkpoint/restore", {"taskId": task, "ts": 1000, "mode": "files"})
            duration = time.monotonic() - t0
            sc.close()
            assert read_tree(root) == checkpoint_state
            outcomes.append("measured")
            continue
        sc.send("checkpoint/restore", {"taskId": task, "ts": 1000, "mode": "files"})
        time.sleep(rng.uniform(0.55, 0.95) * duration)
        sc.kill()

        at_kill = read_tree(root)
        torn = [p for p, data in at_kill.items() if b"old" in data and b"new" in data]
        assert not torn, f"a file is never torn, even mid-restore: {torn[:3]}"
        olds = sum(1 for data in at_kill.values() if data.startswith(b"old"))
        if 0 < olds < FILES:
            mid_restore += 1  # the kill landed while files were being written

        again = _start(root, task)  # task/start on a known task completes the interrupted restore
        after = read_tree(root)
        again.close()
        leftovers = [p for p in after if ".shadowpoint-tmp-" in p]
        assert not leftovers, leftovers
        assert after in (before_state, checkpoint_state), (
            "after the restart the workspace is exactly before the restore or exactly the checkpoint")
        outcomes.append("completed" if after == checkpoint_state else "untouched")
    assert len(outcomes) == ATTEMPTS
    assert mid_restore >= 1, f"no kill landed in the middle of the file writes ({outcomes}); aim better"
