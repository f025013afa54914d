"""kill -9 of the sidecar while it writes a task's record: at a round's log append, in the
middle of one (a torn line), and between a compaction of the record (task.json of the next
generation) and the removal of the log it replaces (SPEC §9 "nothing is lost").

Kills land by construction (`paused_sidecar.PausePoint`), never after a sleep."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from shadowpoint.store.checkpoints import LOG_FILE, CheckpointStore
from tests.conftest import make_tree
from tests.faults.paused_sidecar import ARGV, PausePoint
from tests.faults.support import edit_round, git_tree, shadow_git_dir, start_sidecar
from tests.rpc import SidecarProcess

APPEND = "shadowpoint.store.checkpoints:append_line"
DROP_LOG = "shadowpoint.store.checkpoints:drop_log"


def _paused(root: Path, tmp_path: Path, name: str, target: str, task: str) -> tuple[SidecarProcess, PausePoint]:
    point = PausePoint(target, 0, marker=str(tmp_path / f"paused-{name}"), arm=str(tmp_path / f"arm-{name}"))
    return start_sidecar(root, task, ts=1, env=point.env(), argv=ARGV), point


def _listed(sc: SidecarProcess, task: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = sc.call("checkpoint/list", {"taskId": task})["checkpoints"]
    return out


def _log(docs: Path, task: str) -> bytes:
    path = CheckpointStore(docs).task_dir(task) / LOG_FILE
    return path.read_bytes() if path.exists() else b""


def test_kill_at_the_append_and_mid_line(tmp_path: Path, docs: Path) -> None:
    root = make_tree(tmp_path / "work" / "proj", {"a.txt": "a0\n", "b.txt": "b0\n"})
    git_dir = shadow_git_dir(docs, root)
    sc, point = _paused(root, tmp_path, "append", APPEND, "t")
    acked = [edit_round(sc, "t", ts, ["a.txt"], lambda ts=ts: (root / "a.txt").write_text(f"a{ts}\n"))
             for ts in (2, 3, 4)]
    before = _listed(sc, "t")
    assert _log(docs, "t").count(b"\n") >= 3, "the rounds were appended to the log"
    Path(point.arm or "").touch()
    sc.call("round/begin", {"taskId": "t"})
    sc.call("tool/begin", {"taskId": "t", "tool": "write_to_file", "kind": "edit", "paths": ["b.txt"]})
    (root / "b.txt").write_text("b5\n")
    sc.call("tool/end", {"taskId": "t", "tool": "write_to_file", "kind": "edit", "paths": ["b.txt"]})
    sc.send("round/end", {"taskId": "t", "ts": 5})
    point.wait(sc.proc)
    sc.kill()

    # what a kill inside the write would have left: half of a line
    log_path = CheckpointStore(docs).task_dir("t") / LOG_FILE
    whole = log_path.read_bytes()
    assert whole.endswith(b"\n")
    with open(log_path, "ab") as fh:
        fh.write(b'{"g":1,"ops":[{"op":"msg","ts":5,"role":"assis')

    sc = start_sidecar(root, "t", ts=1)
    try:
        assert _listed(sc, "t") == before, "the acknowledged checkpoints, nothing of the killed round"
        cp = edit_round(sc, "t", 6, ["a.txt"], lambda: (root / "a.txt").write_text("a6\n"))
        assert git_tree(git_dir, cp["hash"])["b.txt"] is not None  # the killed round's edit is held
        assert [c["ts"] for c in _listed(sc, "t")] == [1, 2, 3, 4, 6]
        assert {c["hash"] for c in acked} <= {c["hash"] for c in _listed(sc, "t")}
    finally:
        sc.close()
    log = _log(docs, "t")
    assert log.startswith(whole) and log.endswith(b"\n") and b"assis\n" not in log and b'"assis{' not in log, (
        "the torn line was cut off before the next append")
    record = CheckpointStore(docs).load("t")
    assert [c.ts for c in record.checkpoints] == [1, 2, 3, 4, 6]


def test_kill_between_compaction_and_log_removal(tmp_path: Path, docs: Path) -> None:
    """A restore of files and task rewrites task.json (its cut is structural; the file restore's
    record and mark are a log line, then in task.json); killed before the log goes, the log's
    older lines (which would clear the mark) are not applied again."""
    root = make_tree(tmp_path / "work" / "proj", {"a.txt": "a0\n"})
    sc, point = _paused(root, tmp_path, "compaction", DROP_LOG, "t")
    for ts in (2, 3):
        edit_round(sc, "t", ts, ["a.txt"], lambda ts=ts: (root / "a.txt").write_text(f"a{ts}\n"))
    (root / "a.txt").write_text("a person's edit\n")
    before = [c["ts"] for c in _listed(sc, "t")]
    Path(point.arm or "").touch()
    sc.send("checkpoint/restore", {"taskId": "t", "ts": 3, "mode": "both"})  # cuts nothing after 3
    point.wait(sc.proc)
    sc.kill()
    assert _log(docs, "t").count(b"\n") >= 2, "the stale log is still there (the kill came before its removal)"
    assert (root / "a.txt").read_text() == "a3\n"

    sc = start_sidecar(root, "t", ts=1)
    try:
        listed = _listed(sc, "t")
        assert [c["ts"] for c in listed] == before
        assert [c["ts"] for c in listed if c["restored"]] == [3], "the restore's mark survived the stale lines"
        cp = edit_round(sc, "t", 4, ["a.txt"], lambda: (root / "a.txt").write_text("a4\n"))
        assert cp["ts"] == 4
        assert [c["ts"] for c in _listed(sc, "t")] == [*before, 4]
    finally:
        sc.close()
    record = CheckpointStore(docs).load("t")
    assert [c.ts for c in record.checkpoints] == [*before, 4] and not any(c.restored for c in record.checkpoints)
