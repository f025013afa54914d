"""Several sidecar processes on one workspace (SPEC §7 "two processes on one workspace").

Three `shadowpoint serve` processes, one task each, run interleaved edit rounds, command
rounds, restores and undos from threads, while a fourth task is started and deleted now and
then (each delete starts a garbage collection that really deletes: grace 0). Each task works
in its own folder, so what each checkpoint must hold there is known exactly. Afterwards:
every answered checkpoint exists (`git cat-file -e`) and holds what its round wrote, fsck is
clean, and every error answer carried a protocol `data.kind` (none is expected at all).

A lock held by another process longer than `SHADOWPOINT_LOCK_TIMEOUT_S` gives `lock_timeout`
answers in bounded time (never a hang), and nothing is lost once it is released.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import random
import threading
from pathlib import Path
from typing import Any

from tests.conftest import make_tree, read_tree, wait_for
from tests.faults.support import (
    PROTOCOL_KINDS,
    SOAK,
    expected_git_tree,
    fsck_problems,
    git_tree,
    has_object,
    shadow_git_dir,
    start_sidecar,
)
from tests.rpc import RpcError, SidecarProcess

WORKERS = 3
STEPS = 30 * SOAK
SHARED = {"shared/readme.md": "shared by every task\n", "shared/lib.py": "x = 1\n"}


def _own(tree: dict[str, Any], prefix: str) -> dict[str, Any]:
    return {p: v for p, v in tree.items() if p.startswith(prefix)}


class Worker:
    """One sidecar, one task, one folder; records what every checkpoint must hold."""

    def __init__(self, index: int, root: Path, errors: list[tuple[str, str, Any]]) -> None:
        self.index = index
        self.root = root
        self.task = f"task-{index}"
        self.prefix = f"t{index}/"
        self.rng = random.Random(1000 + index)
        self.errors = errors
        self.sc: SidecarProcess | None = None
        self.ts = 1
        self.checkpoints: list[tuple[int, str, dict[str, Any]]] = []  # ts, hash, own files then
        self.last_restore: dict[str, Any] | None = None  # own files before the last restore
        self.failure: BaseException | None = None
        self.done = {"edit": 0, "command": 0, "restore": 0, "undo": 0}

    def call(self, method: str, params: dict[str, Any]) -> Any:
        assert self.sc is not None
        try:
            return self.sc.call(method, params, timeout=180)
        except RpcError as exc:
            self.errors.append((self.task, method, exc.error))
            raise

    def own_disk(self) -> dict[str, Any]:
        # only this task's folder: the other workers create and delete files in theirs
        # meanwhile, and a walk of the whole workspace raced with them (FileNotFoundError)
        return {self.prefix + p: v for p, v in read_tree(self.root / self.prefix).items()}

    def write_some(self) -> list[str]:
        """Create, rewrite or delete a few of this task's files; returns the paths touched."""
        touched = []
        for _ in range(self.rng.randint(1, 4)):
            path = f"{self.prefix}d{self.rng.randint(0, 2)}/f{self.rng.randint(0, 5)}.txt"
            full = self.root / path
            if full.exists() and self.rng.random() < 0.25:
                full.unlink()
            else:
                text = f"{self.task} ts={self.ts} {self.rng.random()}\n" * self.rng.randint(1, 50)
                make_tree(self.root, {path: text})
            touched.append(path)
        return touched

    def record(self, cp: dict[str, Any]) -> None:
        assert self.sc is not None
        if cp is None or not cp.get("hash"):
            tail = bytes(self.sc.stderr[-6000:]).decode(errors="replace")
            raise AssertionError(f"{self.task}@{self.ts}: the round answered no checkpoint ({cp!r}); "
                                 f"the sidecar's log:\n{tail}")
        self.checkpoints.append((cp["ts"], cp["hash"], self.own_disk()))
        self.last_restore = None  # undo is tried only right after a restore

    def run(self) -> None:
        try:
            self.sc = start_sidecar(self.root, env={"SHADOWPOINT_GC_GRACE_S": "0"})
            self.call("task/start", {"taskId": self.task, "ts": self.ts})
            # the first round reports the task's folder: restores are then scoped to it (SPEC §6)
            self.edit_round(report=[self.prefix.rstrip("/")])
            restored_last = False
            for _ in range(STEPS):
                choice = self.rng.random()
                if choice < 0.35:
                    self.edit_round()
                    restored_last = False
                elif choice < 0.6:
                    self.command_round()
                    restored_last = False
                elif choice < 0.85 and not restored_last and len(self.checkpoints) > 1:
                    self.restore()
                    restored_last = True
                elif self.last_restore is not None:
                    self.undo()
                else:
                    self.edit_round()
                    restored_last = False
            self.call("shutdown", {})
        except BaseException as exc:  # reported by the test thread
            self.failure = exc
        finally:
            if self.sc is not None:
                if self.sc.proc.poll() is None:
                    self.sc.kill()
                else:
                    self.sc.close()

    def edit_round(self, report: list[str] | None = None) -> None:
        self.ts += 1
        self.call("round/begin", {"taskId": self.task})
        self.call("tool/begin", {"taskId": self.task, "tool": "write_to_file", "kind": "edit",
                                 "paths": report or []})
        touched = self.write_some()
        self.call("tool/end", {"taskId": self.task, "tool": "write_to_file", "kind": "edit",
                               "paths": report or touched})
        self.record(self.call("round/end", {"taskId": self.task, "ts": self.ts})["checkpoint"])
        self.done["edit"] += 1

    def command_round(self) -> None:
        self.ts += 1
        self.call("round/begin", {"taskId": self.task})
        self.call("tool/begin", {"taskId": self.task, "tool": "execute_command", "kind": "command"})
        self.write_some()
        self.call("tool/end", {"taskId": self.task, "tool": "execute_command", "kind": "command"})
        self.record(self.call("round/end", {"taskId": self.task, "ts": self.ts})["checkpoint"])
        self.done["command"] += 1

    def restore(self) -> None:
        ts, _commit, own = self.rng.choice(self.checkpoints[:-1])
        before = self.own_disk()
        # The task's folder by name: the tasks' rounds overlap in time, and a file another task's
        # command changed while one of this task's command rounds was open is in this task's
        # scope too (PROTOCOL 1.1 "Scope"), so a scope restore may rightly touch it.
        out = self.call("checkpoint/restore", {"taskId": self.task, "ts": ts, "mode": "files",
                                               "paths": [self.prefix.rstrip("/")]})
        assert out["files"] is not None and "error" not in out, out
        assert self.own_disk() == own, f"{self.task}: restore to ts={ts} did not reproduce its files"
        self.last_restore = before
        self.done["restore"] += 1

    def undo(self) -> None:
        assert self.last_restore is not None
        self.call("checkpoint/undoRestore", {"taskId": self.task})
        assert self.own_disk() == self.last_restore, f"{self.task}: undo did not put the files back"
        self.last_restore = None
        self.done["undo"] += 1


def _churn(root: Path, errors: list[tuple[str, str, Any]], stop: threading.Event) -> None:
    """Start and delete short tasks: each delete runs a garbage collection in the background."""
    sc = start_sidecar(root, env={"SHADOWPOINT_GC_GRACE_S": "0"})
    n = 0
    try:
        while not stop.is_set() and n < 4 * SOAK:
            task = f"ephemeral-{n}"
            n += 1
            try:
                sc.call("task/start", {"taskId": task, "ts": 1}, timeout=180)
                sc.wait_ready(task, timeout=180)
                sc.call("task/delete", {"taskId": task}, timeout=180)
            except RpcError as exc:
                errors.append((task, "churn", exc.error))
            stop.wait(0.3)
    finally:
        sc.close()


def test_three_sidecars_on_one_workspace(tmp_path: Path, docs: Path) -> None:
    root = make_tree(tmp_path / "work" / "proj", {
        **SHARED,
        **{f"t{i}/d0/f0.txt": f"initial {i}\n" for i in range(WORKERS)},
    })
    shared_before = _own(read_tree(root), "shared/")
    errors: list[tuple[str, str, Any]] = []
    workers = [Worker(i, root, errors) for i in range(WORKERS)]
    stop = threading.Event()
    threads = [threading.Thread(target=w.run, name=f"worker-{w.index}") for w in workers]
    churn = threading.Thread(target=_churn, args=(root, errors, stop), name="churn")
    for t in [*threads, churn]:
        t.start()
    for t in threads:
        t.join(timeout=600)
        assert not t.is_alive(), "a worker hung"
    stop.set()
    churn.join(timeout=300)
    assert not churn.is_alive()

    raw = [e for e in errors if (e[2].get("data") or {}).get("kind") not in PROTOCOL_KINDS]
    assert not raw, f"error answers without a protocol kind (raw exceptions): {raw[:3]}"
    assert not errors, f"no request should fail while the lock is only contended: {errors[:3]}"
    for w in workers:
        if w.failure is not None:
            raise w.failure
    git_dir = shadow_git_dir(docs, root)
    problems = fsck_problems(git_dir)
    assert not problems, problems[:10]
    total = 0
    for w in workers:
        assert len(w.checkpoints) > STEPS // 3
        for ts, commit, own in w.checkpoints:
            total += 1
            assert has_object(git_dir, commit), f"{w.task}@{ts}: answered checkpoint {commit} is gone"
            tree = {p: v for p, v in git_tree(git_dir, commit).items() if p.startswith(w.prefix)}
            assert tree == expected_git_tree(own), f"{w.task}@{ts}: the checkpoint does not hold what the round wrote"
    assert _own(read_tree(root), "shared/") == shared_before, "no task's restore touched the shared files"
    # every task's list still has every checkpoint it answered (restores were Files Only)
    sc = start_sidecar(root)
    try:
        for w in workers:
            listed = {c["ts"]: c["hash"] for c in sc.call("checkpoint/list", {"taskId": w.task})["checkpoints"]}
            for ts, commit, _own_files in w.checkpoints:
                assert listed.get(ts) == commit
    finally:
        sc.close()
    assert total >= WORKERS * (STEPS // 3)
    done = {k: sum(w.done[k] for w in workers) for k in workers[0].done}
    print(f"concurrency: {done}, {total} checkpoints checked")
    assert all(done.values()), done


class HeldLock:
    """Another process's hold on the workspace lock (flock on its own open file)."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(self.fd, fcntl.LOCK_EX)

    def release(self) -> None:
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)


def _wait_until_open(pid: int, path: Path, timeout_s: float = 60) -> None:
    """Until process `pid` has `path` open (a condition with a generous bound, not a delay)."""
    fd_dir = Path(f"/proc/{pid}/fd")

    def is_open() -> bool:
        for fd in fd_dir.iterdir():
            with contextlib.suppress(OSError):
                if os.readlink(fd) == str(path):
                    return True
        return False

    wait_for(is_open, f"process {pid} never opened {path}", timeout_s, poll_s=0.001)


def test_a_held_lock_gives_lock_timeout_not_a_hang(tmp_path: Path, docs: Path) -> None:
    root = make_tree(tmp_path / "work" / "proj", {"a.txt": "a0\n", "b.txt": "b0\n"})
    env = {"SHADOWPOINT_LOCK_TIMEOUT_S": "2"}
    sc = start_sidecar(root, "t", ts=1, env=env)
    git_dir = shadow_git_dir(docs, root)
    lock_path = git_dir.parent / "shadowpoint.lock"

    # held briefly: the sidecar retries (with backoff) and the round commits once it is free
    held = HeldLock(lock_path)
    released = threading.Event()

    def release_once_tried() -> None:
        # released as soon as the sidecar has the lock file open (it is trying to take it),
        # not after a delay: a loaded machine never makes the wait exceed the 2 s timeout
        _wait_until_open(sc.proc.pid, lock_path)
        released.set()
        held.release()

    sc.call("round/begin", {"taskId": "t"})
    sc.call("tool/begin", {"taskId": "t", "tool": "write_to_file", "paths": ["b.txt"]})
    make_tree(root, {"b.txt": "b0 again\n"})
    sc.call("tool/end", {"taskId": "t", "tool": "write_to_file", "paths": ["b.txt"]})
    releaser = threading.Thread(target=release_once_tried)
    releaser.start()
    cp = sc.call("round/end", {"taskId": "t", "ts": 2}, timeout=60)["checkpoint"]
    releaser.join()
    assert released.is_set(), "the commit waited for the other holder"
    assert git_tree(git_dir, cp["hash"]) == expected_git_tree(read_tree(root))
    make_tree(root, {"b.txt": "b0\n"})

    # held for longer than the timeout: lock_timeout answers, in bounded time
    held = HeldLock(lock_path)
    try:
        # a round whose commit cannot get the lock
        sc.call("round/begin", {"taskId": "t"})
        sc.call("tool/begin", {"taskId": "t", "tool": "write_to_file", "paths": ["a.txt"]})
        make_tree(root, {"a.txt": "a1 written while the lock was held\n"})
        sc.call("tool/end", {"taskId": "t", "tool": "write_to_file", "paths": ["a.txt"]})
        kinds: list[str | None] = []
        for method, params in (("round/end", {"taskId": "t", "ts": 3}),
                               ("checkpoint/restore", {"taskId": "t", "ts": 1, "mode": "files"}),
                               ("checkpoint/diff", {"taskId": "t", "from": 1})):
            try:
                sc.call(method, params, timeout=60)  # a hang fails here
                kinds.append(None)
            except RpcError as exc:
                kinds.append(exc.kind)
        assert kinds == ["lock_timeout"] * 3, kinds
        assert read_tree(root) == {"a.txt": b"a1 written while the lock was held\n", "b.txt": b"b0\n"}, (
            "a restore that could not lock wrote nothing")
        # a new task's baseline: reported as failed with the lock_timeout kind, retry works later
        sc.call("task/start", {"taskId": "u", "ts": 1})
        listing = wait_for(lambda: (lst := sc.call("checkpoint/list", {"taskId": "u"}))["state"] != "initializing"
                           and lst, "the baseline of u never finished", poll_s=0.05)
        assert listing["state"] == "disabled" and listing["error"]["kind"] == "lock_timeout", listing
    finally:
        held.release()
    # once released: the next round succeeds and holds the change of the round that failed too
    sc.call("round/begin", {"taskId": "t"})
    sc.call("tool/begin", {"taskId": "t", "tool": "write_to_file", "paths": ["b.txt"]})
    make_tree(root, {"b.txt": "b1\n"})
    sc.call("tool/end", {"taskId": "t", "tool": "write_to_file", "paths": ["b.txt"]})
    cp = sc.call("round/end", {"taskId": "t", "ts": 4})["checkpoint"]
    assert git_tree(git_dir, cp["hash"]) == expected_git_tree(read_tree(root)), (
        "the change of the round whose commit timed out is in the next checkpoint")
    assert sc.call("task/retry", {"taskId": "u"})["state"] in ("initializing", "ready")
    sc.wait_ready("u")
    restored = sc.call("checkpoint/restore", {"taskId": "t", "ts": 1, "mode": "files"})
    assert sorted(restored["files"]["restored"]) == ["a.txt", "b.txt"]
    assert read_tree(root) == {"a.txt": b"a0\n", "b.txt": b"b0\n"}
    sc.close()
