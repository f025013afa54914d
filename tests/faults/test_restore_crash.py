"""A sidecar killed (SIGKILL) in the middle of a multi-file restore: the next start leaves
the workspace exactly as before the restore or exactly as the checkpoint, with no torn file.

Each kill lands by construction: the restoring sidecar pauses before renaming its N-th file
into place (`paused_sidecar`, at `SafeWriter._move_into_place`), the test waits for its
marker, then kills it; N is drawn from the whole range of the restore's writes.
"""

from __future__ import annotations

import random
import shutil
from pathlib import Path

from tests.conftest import make_tree, read_tree
from tests.faults.paused_sidecar import ARGV, PausePoint
from tests.rpc import SidecarProcess

FILES = 1500
ATTEMPTS = 6


def _versions(tag: str) -> dict[str, str]:
    # every file of one version carries its version tag on every line: a torn file shows both
    return {f"src/m{i // 100:02d}/f{i:04d}.txt": f"{tag} {i}\n" * 200 for i in range(FILES)}


def _start(root: Path, task: str, pause: PausePoint | None = None) -> SidecarProcess:
    sc = SidecarProcess(env=pause.env(), argv=ARGV) if pause else SidecarProcess()
    sc.call("initialize", {"roots": [str(root)], "settings": {"watcher": False}})
    sc.call("task/start", {"taskId": task, "ts": 1000})
    sc.wait_ready(task)
    return sc


def test_kill_during_restore_is_completed_on_next_start(tmp_path: Path) -> None:
    rng = random.Random(7)
    root = make_tree(tmp_path / "work" / "proj", _versions("old"))
    before_state = None
    outcomes = []
    # renamed into place before the kill: the first and the last write, and draws between
    landed = [0, FILES - 1, *rng.sample(range(1, FILES - 1), ATTEMPTS - 2)]
    for attempt, renamed in enumerate(landed):
        task = f"crash-{attempt}"
        if attempt:
            make_tree(root, _versions("old"))
        pause = PausePoint("shadowpoint.restore.safe_fs:SafeWriter._move_into_place", after=renamed,
                           marker=str(tmp_path / f"paused-{attempt}"), arm=str(tmp_path / f"arm-{attempt}"))
        sc = _start(root, task, pause)
        paths = sorted(_versions("x"))
        sc.call("round/begin", {"taskId": task})
        sc.call("tool/begin", {"taskId": task, "tool": "write_to_file", "paths": paths})
        make_tree(root, _versions("new"))
        sc.call("tool/end", {"taskId": task, "tool": "write_to_file", "paths": paths})
        sc.call("round/end", {"taskId": task, "ts": 2000})
        before_state = read_tree(root)
        checkpoint_state = {p: v.encode() for p, v in _versions("old").items()}

        Path(pause.arm or "").touch()  # the renames of the restore count, nothing before
        sc.send("checkpoint/restore", {"taskId": task, "ts": 1000, "mode": "files"})
        pause.wait(sc.proc)
        sc.kill()

        at_kill = read_tree(root)
        torn = [p for p, data in at_kill.items() if b"old" in data and b"new" in data]
        assert not torn, f"a file is never torn, even mid-restore: {torn[:3]}"
        olds = sum(1 for p, data in at_kill.items() if data.startswith(b"old") and ".shadowpoint-tmp-" not in p)
        assert olds == renamed, f"killed with exactly {renamed} files renamed into place, found {olds}"

        again = _start(root, task)  # task/start on a known task completes the interrupted restore
        after = read_tree(root)
        again.close()
        leftovers = [p for p in after if ".shadowpoint-tmp-" in p]
        assert not leftovers, leftovers
        assert after in (before_state, checkpoint_state), (
            "after the restart the workspace is exactly before the restore or exactly the checkpoint")
        outcomes.append("completed" if after == checkpoint_state else "untouched")
    assert len(outcomes) == ATTEMPTS
    assert "completed" in outcomes, outcomes  # a journal written before the first rename completes it


def test_a_killed_restore_into_a_removed_workspace_is_completed_on_next_start(tmp_path: Path) -> None:
    """The restore of a workspace removed whole makes its folder again; killed after its first
    file, the next start completes it into that folder."""
    files = {f"d{i % 3}/f{i}.txt": f"v {i}\n" for i in range(12)}
    root = make_tree(tmp_path / "work" / "proj", files)
    pause = PausePoint("shadowpoint.restore.safe_fs:SafeWriter._move_into_place", after=1,
                       marker=str(tmp_path / "paused"), arm=str(tmp_path / "arm"))
    sc = _start(root, "gone", pause)
    sc.call("round/begin", {"taskId": "gone"})
    sc.call("tool/begin", {"taskId": "gone", "tool": "execute_command", "kind": "command"})
    shutil.rmtree(root)
    sc.call("tool/end", {"taskId": "gone", "tool": "execute_command", "kind": "command"})
    assert sc.call("round/end", {"taskId": "gone", "ts": 2000})["checkpoint"]["hash"]
    Path(pause.arm or "").touch()
    sc.send("checkpoint/restore", {"taskId": "gone", "ts": 1000, "mode": "files"})
    pause.wait(sc.proc)
    sc.kill()
    assert len([p for p in read_tree(root) if ".shadowpoint-tmp-" not in p]) == 1, "killed after one file"
    again = _start(root, "gone")
    try:
        assert read_tree(root) == {p: v.encode() for p, v in files.items()}
        assert sorted(again.call("checkpoint/undoRestore", {"taskId": "gone"})["files"]["deleted"]) == sorted(files)
    finally:
        again.close()
