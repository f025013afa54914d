"""kill -9 of the sidecar at seeded random points of a baseline, a round's commit, a restore
and a garbage collection (SPEC §6, §7, §9 "nothing is lost").

After every kill a new sidecar starts on the same docs root, and then:
- `git fsck --full` finds no missing or broken object reachable from any ref;
- every checkpoint answered before the kill still resolves, and its tree (read by
  `git ls-tree`) is what the workspace held at that round;
- no lock file blocks new checkpoints: a new round succeeds and snapshots the disk;
- no `.shadowpoint-tmp-*` entry is left in the workspace, nor a gc staging folder in the repo;
- an interrupted restore left the workspace exactly as before it or exactly as the checkpoint.

Every kill lands by construction, whatever the machine's speed or load: the sidecar that is
killed pauses at a chosen call (`paused_sidecar.PausePoint`: the N-th file hashed, the
commit, the ref move, the record, the N-th file renamed into place, the pack write, ...), the
test waits for its marker and kill -9s it there. The points rotate over the iterations, N
is seeded-random.

Iterations are bounded for CI; `SHADOWPOINT_SOAK=N` multiplies them.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from tests.conftest import make_tree, read_tree
from tests.faults.paused_sidecar import ARGV, PausePoint
from tests.faults.support import (
    SOAK,
    edit_round,
    expected_git_tree,
    fsck_problems,
    git_tree,
    has_object,
    shadow_git_dir,
    start_sidecar,
    temp_leftovers,
)
from tests.rpc import SidecarProcess

FILES = 600
RESTORE_FILES = 500
ENV = {"SHADOWPOINT_GC_GRACE_S": "0"}  # garbage collection really deletes: a broken one shows


def _paths(n: int = FILES) -> list[str]:
    return [f"src/d{i % 24:02d}/f{i:04d}.txt" for i in range(n)]


def _version(tag: str, paths: list[str] | None = None) -> dict[str, str]:
    # a tag on every line: a torn file shows two tags
    return {p: f"{tag} {p}\n" * 24 for p in (paths or _paths())}


class Acked:
    """Checkpoints answered before a kill, with the workspace they must hold."""

    def __init__(self) -> None:
        self.items: list[tuple[str, int, str, dict[str, Any]]] = []

    def add(self, task: str, cp: dict[str, Any], tree: dict[str, Any]) -> None:
        assert cp["hash"], cp
        self.items.append((task, cp["ts"], cp["hash"], tree))

    def drop_task(self, task: str) -> None:
        self.items = [i for i in self.items if i[0] != task]

    def check(self, git_dir: Path) -> None:
        missing = [i[:3] for i in self.items if not has_object(git_dir, i[2])]
        assert not missing, f"acknowledged checkpoints are gone: {missing}"
        # the full tree of the newest ones (older ones were compared when they were newest)
        for task, ts, commit, tree in self.items[-3:]:
            assert git_tree(git_dir, commit) == expected_git_tree(tree), (
                f"acknowledged checkpoint {task}@{ts} no longer holds the workspace of that round")


def _check_repo(git_dir: Path, root: Path, acked: Acked) -> None:
    problems = fsck_problems(git_dir)
    assert not problems, f"git fsck after the kill: {problems[:10]}"
    acked.check(git_dir)
    assert not temp_leftovers(root), temp_leftovers(root)[:5]
    staging = list((git_dir / "objects").glob("gc-*"))
    assert not staging, f"garbage collection staging left behind: {staging}"


def _new_round_works(sc: SidecarProcess, task: str, ts: int, root: Path, git_dir: Path, acked: Acked) -> None:
    """No lock blocks checkpoints and the new one holds exactly the disk."""
    probe = "src/probe.txt"
    cp = edit_round(sc, task, ts, [probe], lambda: make_tree(root, {probe: f"probe {ts}\n"}))
    tree = read_tree(root)
    assert git_tree(git_dir, cp["hash"]) == expected_git_tree(tree)
    listed = {c["ts"]: c["hash"] for c in sc.call("checkpoint/list", {"taskId": task})["checkpoints"]}
    assert listed[ts] == cp["hash"]
    acked.add(task, cp, tree)


def _listed(sc: SidecarProcess, task: str) -> dict[int, str]:
    return {c["ts"]: c["hash"] for c in sc.call("checkpoint/list", {"taskId": task})["checkpoints"]}


def _answered(sc: SidecarProcess, mid: int) -> dict[str, Any] | None:
    """The answer to `mid` if the sidecar wrote it before it died (call after `kill`, which
    reads its output to the end)."""
    with sc._cond:
        msg = sc._answers.get(mid)
    if msg is None:
        return None
    assert "error" not in msg, msg
    result: dict[str, Any] = msg["result"]
    return result


def _paused(root: Path, tmp_path: Path, name: str, target: str, after: int = 0,
            task: str | None = None) -> tuple[SidecarProcess, PausePoint]:
    """A sidecar that will pause at `target` once the returned point's `arm` file exists."""
    point = PausePoint(target, after, marker=str(tmp_path / f"paused-{name}"), arm=str(tmp_path / f"arm-{name}"))
    return start_sidecar(root, task, ts=1, env={**ENV, **point.env()}, argv=ARGV), point


def _kill_there(sc: SidecarProcess, point: PausePoint) -> None:
    point.wait(sc.proc)
    sc.kill()


HASHED = "shadowpoint.stage.scanner:Scanner._record_file"  # the scanner records one hashed file
COMMIT = "shadowpoint.store.shadow_repo:ShadowRepo.commit"
REF = "shadowpoint.store.shadow_repo:ShadowRepo.set_ref"
RECORD = "shadowpoint.store.checkpoints:CheckpointStore.append"  # a round's record: one log line


def test_kill_during_baseline(tmp_path: Path, docs: Path) -> None:
    rng = random.Random(101)
    root = make_tree(tmp_path / "work" / "proj", _version("v0"))
    git_dir = shadow_git_dir(docs, root)
    acked = Acked()
    iterations = 8 * SOAK
    sc = start_sidecar(root, "first", ts=1, env=ENV)
    acked.add("first", _listed_first(sc, "first"), read_tree(root))
    sc.close()
    # the N-th file of the scan recorded (files hashed by the blob workers too), the commit, the ref
    points = [HASHED, COMMIT, REF]
    for it in range(iterations):
        # change half the files so the baseline really hashes and writes objects
        make_tree(root, _version(f"b{it}", rng.sample(_paths(), FILES // 2)))
        task = f"base-{it}"
        target = points[it % len(points)]
        # the stat cache keeps the unchanged half: the changed half is hashed
        after = rng.randrange(FILES // 2) if target == HASHED else 0
        sc, point = _paused(root, tmp_path, f"base-{it}", target, after)
        Path(point.arm or "").touch()
        sc.call("task/start", {"taskId": task, "ts": 1})
        point.wait(sc.proc)
        assert sc.call("checkpoint/list", {"taskId": task})["state"] == "initializing"
        sc.kill()

        _check_repo(git_dir, root, acked)
        sc = start_sidecar(root, task, ts=1, env=ENV)  # builds the baseline again if it never finished
        listing = sc.call("checkpoint/list", {"taskId": task})
        assert listing["state"] == "ready" and listing["checkpoints"][0]["kind"] == "baseline"
        base_tree = read_tree(root)
        assert git_tree(git_dir, listing["checkpoints"][0]["hash"]) == expected_git_tree(base_tree)
        acked.add(task, listing["checkpoints"][0], base_tree)
        _new_round_works(sc, task, 50, root, git_dir, acked)
        sc.close()  # its background work (a merge of small packs) done: fsck reads a still repository
        _check_repo(git_dir, root, acked)


def _listed_first(sc: SidecarProcess, task: str) -> dict[str, Any]:
    cp: dict[str, Any] = sc.call("checkpoint/list", {"taskId": task})["checkpoints"][0]
    return cp


def test_kill_during_round_commit(tmp_path: Path, docs: Path) -> None:
    rng = random.Random(202)
    root = make_tree(tmp_path / "work" / "proj", _version("v0"))
    git_dir = shadow_git_dir(docs, root)
    acked = Acked()
    task = "rounds"
    sc = start_sidecar(root, task, ts=1, env=ENV)
    acked.add(task, _listed_first(sc, task), read_tree(root))
    for kind, ts in (("edit", 2), ("command", 3)):  # one whole round of each kind
        acked.add(task, _big_round(sc, root, task, ts, kind, f"m{ts}"), read_tree(root))
    sc.close()
    ts = 10
    iterations = 10 * SOAK
    # the N-th file staged, the tree, the commit, the task ref, the task record
    # (5 points, 2 kinds: ten iterations kill each kind of round at each point)
    points = [HASHED, "shadowpoint.store.shadow_repo:ShadowRepo.patch_tree", COMMIT, REF, RECORD]
    for it in range(iterations):
        kind = ("edit", "command")[it % 2]
        target = points[it % len(points)]
        after = rng.randrange(FILES) if target == HASHED else 0
        ts += 10
        sc, point = _paused(root, tmp_path, f"round-{it}", target, after, task=task)
        Path(point.arm or "").touch()
        mid = _big_round(sc, root, task, ts, kind, f"r{it}", wait=False)
        _kill_there(sc, point)
        assert _answered(sc, mid) is None, f"killed at {target} before the round's answer"

        _check_repo(git_dir, root, acked)
        sc = start_sidecar(root, task, ts=1, env=ENV)
        listed = _listed(sc, task)
        for t, _ts, commit, _tree in acked.items:
            if t == task:
                assert listed.get(_ts) == commit, f"checkpoint at {_ts} lost from the task's list"
        ts += 1
        _new_round_works(sc, task, ts, root, git_dir, acked)  # the first round after a start rescans
        sc.close()  # its background work (a merge of small packs) done: fsck reads a still repository
        _check_repo(git_dir, root, acked)


def _big_round(sc: SidecarProcess, root: Path, task: str, ts: int, kind: str, tag: str, wait: bool = True) -> Any:
    """Rewrite every file in an edit or a command round; returns the checkpoint, or the
    id of the round/end request not yet answered."""
    paths = _paths()
    sc.call("round/begin", {"taskId": task})
    tool = "write_to_file" if kind == "edit" else "execute_command"
    reported = paths if kind == "edit" else None
    sc.call("tool/begin", {"taskId": task, "tool": tool, "kind": kind, "paths": reported})
    make_tree(root, _version(tag))
    sc.call("tool/end", {"taskId": task, "tool": tool, "kind": kind, "paths": reported})
    mid = sc.send("round/end", {"taskId": task, "ts": ts})
    return sc.wait(mid)["checkpoint"] if wait else mid


def test_kill_during_restore(tmp_path: Path, docs: Path) -> None:
    rng = random.Random(303)
    paths = _paths(RESTORE_FILES)  # fewer files: each kill still lands between two of them (pause points)
    root = make_tree(tmp_path / "work" / "proj", _version("old", paths))
    git_dir = shadow_git_dir(docs, root)
    acked = Acked()
    task = "restores"
    sc = start_sidecar(root, task, ts=1, env=ENV)
    acked.add(task, _listed_first(sc, task), read_tree(root))
    old = read_tree(root)
    ts = 10
    cp = edit_round(sc, task, ts, paths, lambda: make_tree(root, _version("new", paths)))
    acked.add(task, cp, read_tree(root))
    sc.call("checkpoint/restore", {"taskId": task, "ts": 1, "mode": "files"})  # one whole restore
    assert read_tree(root) == old
    sc.close()
    iterations = 8 * SOAK
    # before its journal (nothing written), before the N-th file is renamed into place, before
    # the journal is cleared (every file written)
    points = ["shadowpoint.store.checkpoints:CheckpointStore.write_journal", MOVED, MOVED,
              "shadowpoint.store.checkpoints:CheckpointStore.clear_journal"]
    for it in range(iterations):
        target = points[it % len(points)]
        after = rng.randrange(1, RESTORE_FILES) if target == MOVED else 0
        sc, point = _paused(root, tmp_path, f"restore-{it}", target, after, task=task)
        ts += 10
        cp = edit_round(sc, task, ts, paths, lambda it=it: make_tree(root, _version(f"new{it}", paths)))
        before = read_tree(root)
        acked.add(task, cp, before)
        Path(point.arm or "").touch()
        sc.send("checkpoint/restore", {"taskId": task, "ts": 1, "mode": "files"})
        _kill_there(sc, point)
        at_kill = {p: v for p, v in read_tree(root).items() if ".shadowpoint-tmp-" not in p}
        torn = [p for p, data in at_kill.items() if isinstance(data, bytes) and data.count(b"\n") and
                len({line.split(b" ")[0] for line in data.splitlines()}) > 1]
        assert not torn, f"a file is never torn, even mid-restore: {torn[:3]}"
        restored = sum(1 for p in paths if at_kill.get(p) == old[p])
        want = {MOVED: after, "shadowpoint.store.checkpoints:CheckpointStore.clear_journal": len(paths)}.get(target, 0)
        assert restored == want, f"killed at {target} with {want} files restored, found {restored}"

        problems = fsck_problems(git_dir)
        assert not problems, problems[:10]
        acked.check(git_dir)
        sc = start_sidecar(root, task, ts=1, env=ENV)  # resuming the task completes the restore
        after_restart = read_tree(root)
        assert after_restart in (before, old), "exactly before the restore, or exactly the checkpoint"
        assert not temp_leftovers(root)
        if after_restart == old:
            # the completed restore can be undone, back to the state before it
            sc.call("checkpoint/undoRestore", {"taskId": task})
            assert read_tree(root) == before
        _new_round_works(sc, task, ts + 1, root, git_dir, acked)
        sc.close()  # its background work (a merge of small packs) done: fsck reads a still repository
        _check_repo(git_dir, root, acked)


MOVED = "shadowpoint.restore.safe_fs:SafeWriter._move_into_place"  # before one file is renamed into place


def test_kill_during_garbage_collection(tmp_path: Path, docs: Path) -> None:
    root = make_tree(tmp_path / "work" / "proj", _version("k0"))
    git_dir = shadow_git_dir(docs, root)
    acked = Acked()
    keep = "keeper"
    paths = _paths()
    sc = start_sidecar(root, keep, ts=1, env=ENV)
    acked.add(keep, _listed_first(sc, keep), read_tree(root))
    ts = 10
    iterations = 6 * SOAK
    # the pack about to be written (in its staging folder); written and installed, old packs
    # removed, no loose object removed yet; the packed loose objects removed, unreachable ones
    # not yet; all removed but the empty folders and the staging folder not yet
    points = ["pygit2:PackBuilder.write", "shadowpoint.store.shadow_repo:ShadowRepo.reopen",
              "shadowpoint.store.shadow_repo:ShadowRepo._prune_unreachable",
              "shadowpoint.store.shadow_repo:ShadowRepo._remove_empty_fanout"]
    point: PausePoint | None = None
    for it in range(iterations + 1):
        if it:
            sc, point = _paused(root, tmp_path, f"gc-{it}", points[it % len(points)], task=keep)
        victim = f"victim-{it}"
        sc.call("task/start", {"taskId": victim, "ts": 1})
        sc.wait_ready(victim)
        # objects only the victim reaches: its round's content, overwritten before the keeper's round
        edit_round(sc, victim, 5, paths, lambda it=it: make_tree(root, _version(f"victim{it}")))
        ts += 10
        cp = edit_round(sc, keep, ts, paths, lambda it=it: make_tree(root, _version(f"keep{it}")))
        acked.add(keep, cp, read_tree(root))
        loose_before = _loose(git_dir)
        if point is None:
            sc.call("task/delete", {"taskId": victim})  # answers at once; the collection runs in the background
            sc.close()  # waits for the background collection: one whole collection
            assert _loose(git_dir) < loose_before, "the collection packed the loose objects"
            continue
        Path(point.arm or "").touch()
        sc.call("task/delete", {"taskId": victim})
        _kill_there(sc, point)
        assert list((git_dir / "objects").glob("gc-*")), "killed inside the collection (its staging folder)"

        problems = fsck_problems(git_dir)
        assert not problems, f"git fsck after a kill during gc: {problems[:10]}"
        acked.check(git_dir)
        sc = start_sidecar(root, keep, ts=1, env=ENV)
        listed = _listed(sc, keep)
        for _t, _ts, commit, _tree in acked.items:
            assert listed.get(_ts) == commit
        ts += 1
        _new_round_works(sc, keep, ts, root, git_dir, acked)
        sc.close()  # its background work (a merge of small packs) done: fsck reads a still repository
        _check_repo(git_dir, root, acked)


def _loose(git_dir: Path) -> int:
    objects = git_dir / "objects"
    return sum(len(list(d.iterdir())) for d in objects.iterdir() if len(d.name) == 2 and d.is_dir())
