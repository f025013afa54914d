"""kill -9 of the sidecar at seeded random points of a baseline, a round's commit, a restore
and a garbage collection (SPEC §6, §7, §9 "nothing is lost").

After every kill a new sidecar starts on the same docs root, and then:
- `git fsck --full` finds no missing or broken object reachable from any ref;
- every checkpoint answered before the kill still resolves, and its tree (read by
  `git ls-tree`) is what the workspace held at that round;
- no lock file blocks new checkpoints: a new round succeeds and snapshots the disk;
- no `.shadowpoint-tmp-*` entry is left in the workspace, nor a gc staging folder in the repo;
- an interrupted restore left the workspace exactly as before it or exactly as the checkpoint.

Iterations are bounded for CI; `SHADOWPOINT_SOAK=N` multiplies them.
"""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

from tests.conftest import make_tree, read_tree
from tests.faults.support import (
    SOAK,
    Aim,
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
    """The answer to `mid` if the sidecar wrote it before it died."""
    time.sleep(0.05)
    with sc._cond:
        msg = sc._answers.get(mid)
    if msg is None:
        return None
    assert "error" not in msg, msg
    result: dict[str, Any] = msg["result"]
    return result


def test_kill_during_baseline(tmp_path: Path, docs: Path) -> None:
    rng = random.Random(101)
    root = make_tree(tmp_path / "work" / "proj", _version("v0"))
    git_dir = shadow_git_dir(docs, root)
    acked = Acked()
    inside = 0
    iterations = 8 * SOAK
    sc = start_sidecar(root, env=ENV)
    t0 = time.monotonic()
    sc.call("task/start", {"taskId": "measure", "ts": 1})  # measure, to aim the kills inside a baseline
    sc.wait_ready("measure")
    duration = time.monotonic() - t0
    acked.add("measure", _listed_first(sc, "measure"), read_tree(root))
    aim = Aim(rng, duration)
    for it in range(iterations):
        # change half the files so the baseline really hashes and writes objects
        make_tree(root, _version(f"b{it}", rng.sample(_paths(), FILES // 2)))
        task = f"base-{it}"
        sc.call("task/start", {"taskId": task, "ts": 1})
        delay = aim.delay()
        time.sleep(delay)
        state = sc.call("checkpoint/list", {"taskId": task})["state"]
        sc.kill()
        if state == "initializing":
            inside += 1
        else:
            aim.too_late(delay)

        _check_repo(git_dir, root, acked)
        sc = start_sidecar(root, task, ts=1, env=ENV)  # builds the baseline again if it never finished
        listing = sc.call("checkpoint/list", {"taskId": task})
        assert listing["state"] == "ready" and listing["checkpoints"][0]["kind"] == "baseline"
        base_tree = read_tree(root)
        assert git_tree(git_dir, listing["checkpoints"][0]["hash"]) == expected_git_tree(base_tree)
        acked.add(task, listing["checkpoints"][0], base_tree)
        _new_round_works(sc, task, 50, root, git_dir, acked)
        _check_repo(git_dir, root, acked)
    sc.close()
    print(f"baseline kills: {inside} inside, {iterations - inside} after it")
    assert inside >= 1, "no kill landed inside a baseline; aim better"


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
    # measure one edit round and one command round of every file
    durations = {}
    for kind, ts in (("edit", 2), ("command", 3)):
        mid = _big_round(sc, root, task, ts, kind, f"m{ts}", wait=False)
        t0 = time.monotonic()
        cp = sc.wait(mid)["checkpoint"]
        durations[kind] = time.monotonic() - t0  # from round/end to its answer
        acked.add(task, cp, read_tree(root))
    inside = 0
    ts = 10
    iterations = 10 * SOAK
    for it in range(iterations):
        kind = ("edit", "command")[it % 2]
        ts += 10
        mid = _big_round(sc, root, task, ts, kind, f"r{it}", wait=False)
        tree = read_tree(root)
        time.sleep(rng.uniform(0.0, 1.2) * durations[kind])
        sc.kill()
        answer = _answered(sc, mid)
        if answer is None:
            inside += 1
        else:
            acked.add(task, answer["checkpoint"], tree)

        _check_repo(git_dir, root, acked)
        sc = start_sidecar(root, task, ts=1, env=ENV)
        listed = _listed(sc, task)
        for t, _ts, commit, _tree in acked.items:
            if t == task:
                assert listed.get(_ts) == commit, f"checkpoint at {_ts} lost from the task's list"
        ts += 1
        _new_round_works(sc, task, ts, root, git_dir, acked)  # the first round after a start rescans
        _check_repo(git_dir, root, acked)
    sc.close()
    print(f"round kills: {inside} before the answer, {iterations - inside} after")
    assert inside >= 1, "no kill landed before a round's answer; aim better"


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
    paths = _paths(RESTORE_FILES)  # a restore fsyncs every file: fewer files, still a long window
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
    t0 = time.monotonic()
    sc.call("checkpoint/restore", {"taskId": task, "ts": 1, "mode": "files"})
    duration = time.monotonic() - t0
    assert read_tree(root) == old
    inside = 0
    iterations = 8 * SOAK
    aim = Aim(rng, duration)
    for it in range(iterations):
        ts += 10
        cp = edit_round(sc, task, ts, paths, lambda it=it: make_tree(root, _version(f"new{it}", paths)))
        before = read_tree(root)
        acked.add(task, cp, before)
        sc.send("checkpoint/restore", {"taskId": task, "ts": 1, "mode": "files"})
        delay = aim.delay()
        time.sleep(delay)
        sc.kill()
        at_kill = read_tree(root)
        torn = [p for p, data in at_kill.items() if isinstance(data, bytes) and data.count(b"\n") and
                len({line.split(b" ")[0] for line in data.splitlines()}) > 1]
        assert not torn, f"a file is never torn, even mid-restore: {torn[:3]}"
        if at_kill == before:
            aim.too_early(delay)
        elif at_kill == old:
            aim.too_late(delay)
        else:
            inside += 1

        problems = fsck_problems(git_dir)
        assert not problems, problems[:10]
        acked.check(git_dir)
        sc = start_sidecar(root, task, ts=1, env=ENV)  # resuming the task completes the restore
        after = read_tree(root)
        assert after in (before, old), "exactly before the restore, or exactly the checkpoint"
        assert not temp_leftovers(root)
        if after == old:
            # the completed restore can be undone, back to the state before it
            sc.call("checkpoint/undoRestore", {"taskId": task})
            assert read_tree(root) == before
        _new_round_works(sc, task, ts + 1, root, git_dir, acked)
        _check_repo(git_dir, root, acked)
    sc.close()
    print(f"restore kills: {inside} mid-write, {iterations - inside} before or after the writes")
    assert inside >= 1, "no kill landed in the middle of a restore's writes; aim better"


def test_kill_during_garbage_collection(tmp_path: Path, docs: Path) -> None:
    rng = random.Random(404)
    root = make_tree(tmp_path / "work" / "proj", _version("k0"))
    git_dir = shadow_git_dir(docs, root)
    acked = Acked()
    keep = "keeper"
    paths = _paths()
    sc = start_sidecar(root, keep, ts=1, env=ENV)
    acked.add(keep, _listed_first(sc, keep), read_tree(root))
    duration = 0.0
    inside = 0
    ts = 10
    iterations = 6 * SOAK
    for it in range(iterations + 1):
        victim = f"victim-{it}"
        sc.call("task/start", {"taskId": victim, "ts": 1})
        sc.wait_ready(victim)
        # objects only the victim reaches: its round's content, overwritten before the keeper's round
        edit_round(sc, victim, 5, paths, lambda it=it: make_tree(root, _version(f"victim{it}")))
        ts += 10
        cp = edit_round(sc, keep, ts, paths, lambda it=it: make_tree(root, _version(f"keep{it}")))
        acked.add(keep, cp, read_tree(root))
        loose_before = _loose(git_dir)
        t0 = time.monotonic()
        sc.call("task/delete", {"taskId": victim})  # answers at once; the collection runs in the background
        if it == 0:
            sc.close()  # waits for the background collection: measures it
            duration = time.monotonic() - t0
            assert _loose(git_dir) < loose_before, "the measured collection packed the loose objects"
            sc = start_sidecar(root, keep, ts=1, env=ENV)
            continue
        time.sleep(rng.uniform(0.0, 1.0) * duration)
        sc.kill()
        loose_at_kill = _loose(git_dir)
        if list((git_dir / "objects").glob("gc-*")) or 0 < loose_at_kill < loose_before:
            inside += 1

        problems = fsck_problems(git_dir)
        assert not problems, f"git fsck after a kill during gc: {problems[:10]}"
        acked.check(git_dir)
        sc = start_sidecar(root, keep, ts=1, env=ENV)
        listed = _listed(sc, keep)
        for _t, _ts, commit, _tree in acked.items:
            assert listed.get(_ts) == commit
        ts += 1
        _new_round_works(sc, keep, ts, root, git_dir, acked)
        _check_repo(git_dir, root, acked)
    sc.close()
    print(f"gc kills: {inside} inside, {iterations - inside} before or after")
    assert inside >= 1, "no kill landed inside a garbage collection; aim better"


def _loose(git_dir: Path) -> int:
    objects = git_dir / "objects"
    return sum(len(list(d.iterdir())) for d in objects.iterdir() if len(d.name) == 2 and d.is_dir())
