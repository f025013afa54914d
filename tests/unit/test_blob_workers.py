"""Unit tests for `shadowpoint.stage.blob_workers`: scans whose files are hashed by worker processes.

Real worker processes and real shadow repos, no mocks; snapshots are checked against the git
CLI (`git ls-tree -r` against `git hash-object`) and against the scanner's own thread. Races
and faults go through seams that wrap `Scanner._stage_stat` (called after the walk's lstat).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from shadowpoint.errors import RepoError
from shadowpoint.stage.blob_workers import BlobWorkerOptions, default_worker_count
from shadowpoint.stage.exclusions import ExclusionRules
from shadowpoint.stage.scanner import Scanner, SkipReason, StageOptions, StageResult
from shadowpoint.stage.stager import StagePlan
from shadowpoint.stage.stat_cache import StatCache, stat_fields, state_entry
from shadowpoint.store.shadow_repo import ShadowRepo
from shadowpoint.workspace import RepoPath
from tests.conftest import Exe, Link, make_tree, read_tree, wait_for
from tests.faults.support import expected_git_tree, git, git_tree

# workers from the first file on, in small batches, so a small tree crosses many batches
EAGER = BlobWorkerOptions(workers=2, min_files=1, batch_paths=8, batch_bytes=64 * 1024)
IN_PROCESS = BlobWorkerOptions(workers=0)

ODD_NAMES = ["new\nline.txt", "tab\there.txt", "back\\slash.txt", " leading space.txt", "-dash.txt",
             "ünïcödé.txt", os.fsdecode(b"latin1-\xe9t\xe9.txt"), os.fsdecode(b"bad-\xff\xfe-bytes"),
             "quote\"s'.txt", "deep/er/new\nline/dir/f.txt"]


def scan(root: Path, git_dir: Path, workers: BlobWorkerOptions, cache: StatCache | None = None,
         max_file_bytes: int = 100 * 1024 * 1024) -> tuple[StageResult, StatCache]:
    repo = ShadowRepo.open_or_init(git_dir, root)
    try:
        scanner = Scanner(root, repo, ExclusionRules(root), StageOptions(max_file_bytes=max_file_bytes,
                                                                         workers=workers))
        cache = cache if cache is not None else StatCache()
        return scanner.stage(StagePlan(rescan=True), cache), cache
    finally:
        repo.close()


def stat_view(cache: StatCache) -> dict[str, tuple[Any, ...]]:
    """The cache without the per-scan check time: what each path's stat and blob were."""
    return {p: (*stat_fields(s)[:5], state_entry(s)) for p, s in cache.entries.items()}


def varied_tree(n: int = 240) -> dict[str, Any]:
    tree: dict[str, Any] = {f"src/d{i % 7}/f{i:03d}.py": f"print({i})\n" * (i % 40) for i in range(n)}
    tree.update({"empty.txt": b"", "run.sh": Exe("#!/bin/sh\necho hi\n"), "link": Link("src/d0"),
                 "big.data": bytes(range(256)) * 2048,  # 512 KiB: a batch of its own
                 "binary.dat": bytes(range(256)) * 3})
    tree.update({name: f"odd {name!r}\n" for name in ODD_NAMES})
    return tree


def worker_pids_seen(monkeypatch: pytest.MonkeyPatch) -> set[int]:
    """Every worker pid the scanner's batch had while files were staged (a seam, no fault)."""
    pids: set[int] = set()
    real = Scanner._stage_stat

    def watching(self: Scanner, run: Any, path: RepoPath, st: os.stat_result) -> None:
        real(self, run, path, st)
        if run.batch is not None:
            pids.update(run.batch.worker_pids())

    monkeypatch.setattr(Scanner, "_stage_stat", watching)
    return pids


def is_gone(pid: int) -> bool:
    """True once `pid` has exited (reaped, or a zombie waiting for an init that does not reap)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state in ("Z", "X")


@pytest.fixture
def shadow(tmp_path: Path) -> Iterator[Callable[[str], Path]]:
    yield lambda name: tmp_path / "shadow" / name / ".git"


# ---- same snapshot as the scanner's own thread and as git ---------------------------------------


def test_workers_write_the_tree_the_scanner_thread_and_git_write(workspace: Path, shadow: Any) -> None:
    tree = varied_tree()
    make_tree(workspace, tree)
    # times past 2262 and before 1970 cross the pipe intact (the stat cache compares them)
    os.utime(workspace / "src/d1/f001.py", ns=(10_413_792_000_123_456_789, 10_413_792_000_123_456_789))
    os.utime(workspace / "src/d2/f002.py", ns=(-315_619_200_987_654_321, -315_619_200_987_654_321))
    with capture_logs() as logs:
        res_w, cache_w = scan(workspace, shadow("w"), EAGER)
    res_p, cache_p = scan(workspace, shadow("p"), IN_PROCESS)
    started = [e for e in logs if e["event"] == "blob_workers.started"]
    closed = [e for e in logs if e["event"] == "blob_workers.closed"]
    assert started and started[0]["workers"] == 2, logs
    assert closed[0]["answered"] == len(tree) - 1 and closed[0]["given_back"] == 0  # all but the link
    assert not [e for e in logs if e["log_level"] == "warning"], logs
    assert res_w.tree == res_p.tree
    assert res_w.stats.hashed == res_p.stats.hashed == len(tree)
    assert stat_view(cache_w) == stat_view(cache_p)
    listing = git_tree(shadow("w"), res_w.tree or "")
    assert listing == expected_git_tree(read_tree(workspace))
    # the git CLI hashes the odd names' files to the ids the snapshot holds
    for name in ODD_NAMES:
        out = subprocess.run(["git", "hash-object", "--no-filters", "--", os.fsencode(workspace / name)],
                             capture_output=True, check=True).stdout.decode().strip()
        assert listing[name][1] == out, name
    missing = git(shadow("w"), "cat-file", "--batch-check",
                  input="".join(f"{oid}\n" for _, oid in listing.values()).encode()).stdout
    assert b"missing" not in missing


def test_a_rescan_after_edits_hashes_only_the_changes(workspace: Path, shadow: Any) -> None:
    make_tree(workspace, varied_tree())
    hour_ago = time.time_ns() - 3600 * 10**9
    for dp, dirs, files in os.walk(workspace):  # old enough for the racy-clean rule to trust them
        for f in files + dirs:
            os.utime(os.path.join(dp, f), ns=(hour_ago, hour_ago), follow_symlinks=False)
    _, cache = scan(workspace, shadow("w"), EAGER)
    make_tree(workspace, {"src/d3/f003.py": "changed\n", "new\nline.txt": "changed too\n", "src/d0/f000.py": None})
    res, _ = scan(workspace, shadow("w"), EAGER, cache)
    assert res.stats.hashed == 2
    assert git_tree(shadow("w"), res.tree or "") == expected_git_tree(read_tree(workspace))


# ---- per-path outcomes ---------------------------------------------------------------------------


RACES = {"vanishes.txt": SkipReason.VANISHED, "becomes-link.txt": SkipReason.UNREADABLE,
         "becomes-fifo.txt": SkipReason.UNREADABLE, "grows.txt": SkipReason.TOO_LARGE}


def _race_after_lstat(monkeypatch: pytest.MonkeyPatch, root: Path, outside: Path) -> None:
    real = Scanner._stage_stat

    def racing(self: Scanner, run: Any, path: RepoPath, st: os.stat_result) -> None:
        full = root / path
        if path == "vanishes.txt":
            full.unlink()
        elif path == "becomes-link.txt":
            full.unlink()
            full.symlink_to(outside)
        elif path == "becomes-fifo.txt":
            full.unlink()
            os.mkfifo(full)
        elif path == "grows.txt":
            full.write_bytes(b"x" * 5000)
        real(self, run, path, st)

    monkeypatch.setattr(Scanner, "_stage_stat", racing)


def test_files_changing_after_the_walk_are_reported_as_on_the_scanner_thread(
        workspace: Path, shadow: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    outside = tmp_path / "secret.txt"
    outside.write_text("never copied\n")
    tree = {f"keep/{i}.txt": f"{i}\n" for i in range(40)}
    details: dict[str, dict[str, tuple[SkipReason, str]]] = {}
    for mode, options in (("workers", EAGER), ("in-process", IN_PROCESS)):
        for name in RACES:
            (workspace / name).unlink(missing_ok=True)
        make_tree(workspace, {**tree, **{name: "small\n" for name in RACES}})
        _race_after_lstat(monkeypatch, workspace, outside)
        with capture_logs() as logs:
            res, cache = scan(workspace, shadow(mode), options, max_file_bytes=1000)
        monkeypatch.undo()
        details[mode] = {s.path: (s.reason, s.detail) for s in res.stats.skipped}
        assert {p: r for p, (r, _) in details[mode].items()} == RACES
        assert sorted(e["path"] for e in logs if e["event"] == "scanner.skipped") == sorted(RACES)
        assert set(cache.entries) == set(tree)
        assert git_tree(shadow(mode), res.tree or "") == expected_git_tree({p: v.encode() for p, v in tree.items()})
    # the very same words, whichever process read the file
    assert details["workers"] == details["in-process"]
    assert details["workers"]["grows.txt"][1] == "5000 bytes"


def test_files_over_the_cap_at_the_walk_never_reach_a_worker(workspace: Path, shadow: Any) -> None:
    make_tree(workspace, {**{f"f{i}.txt": "ok\n" for i in range(30)}, "huge.txt": "y" * 2000})
    with capture_logs() as logs:
        res, cache = scan(workspace, shadow("w"), EAGER, max_file_bytes=1000)
    assert [(s.path, s.reason, s.detail) for s in res.stats.skipped] == [
        ("huge.txt", SkipReason.TOO_LARGE, "2000 bytes")]
    assert [e["answered"] for e in logs if e["event"] == "blob_workers.closed"] == [30]
    assert "huge.txt" not in cache.entries


# ---- thresholds and process hygiene ---------------------------------------------------------------


def test_a_small_rescan_starts_no_worker(workspace: Path, shadow: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    make_tree(workspace, {f"f{i}.txt": f"{i}\n" for i in range(20)})
    pids = worker_pids_seen(monkeypatch)
    with capture_logs() as logs:
        res, _ = scan(workspace, shadow("w"), BlobWorkerOptions(workers=2))
    assert res.stats.hashed == 20
    assert pids == set()
    assert not [e for e in logs if e["event"].startswith("blob_workers.")], logs


def test_no_worker_process_or_thread_remains_after_a_scan(workspace: Path, shadow: Any,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    make_tree(workspace, varied_tree(120))
    pids = worker_pids_seen(monkeypatch)
    scan(workspace, shadow("w"), EAGER)
    assert len(pids) == 2
    for pid in pids:  # reaped: not even a zombie is left
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    # (the autouse fixture fails the test if a reader thread outlived the scan)


def test_a_worker_killed_mid_scan_falls_back_without_losing_files(workspace: Path, shadow: Any,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    tree = {f"d{i % 5}/f{i:03d}.txt": f"file {i}\n" * (i % 9 + 1) for i in range(300)}
    make_tree(workspace, tree)
    real = Scanner._stage_stat
    calls = 0
    killed: list[int] = []

    def killing(self: Scanner, run: Any, path: RepoPath, st: os.stat_result) -> None:
        nonlocal calls
        real(self, run, path, st)
        calls += 1
        live = run.batch.worker_pids() if run.batch is not None else []
        # one worker early, the other later: the rest of the scan runs on this thread
        if live and calls in (40, 200):
            os.kill(live[0], signal.SIGKILL)
            killed.append(live[0])

    monkeypatch.setattr(Scanner, "_stage_stat", killing)
    with capture_logs() as logs:
        res, cache = scan(workspace, shadow("w"), EAGER)
    assert len(killed) == 2
    failures = [e for e in logs if e["event"] == "blob_workers.failed"]
    assert sorted(e["pid"] for e in failures) == sorted(killed)
    assert all(e["returncode"] == -signal.SIGKILL for e in failures)
    assert res.stats.hashed == len(tree) and res.stats.skipped == []
    assert set(cache.entries) == set(tree)
    assert git_tree(shadow("w"), res.tree or "") == expected_git_tree(read_tree(workspace))
    res_p, cache_p = scan(workspace, shadow("p"), IN_PROCESS)
    assert res.tree == res_p.tree and stat_view(cache) == stat_view(cache_p)
    assert all(is_gone(pid) for pid in killed)


def test_a_worker_that_cannot_write_a_blob_fails_the_scan_with_repo_error(
        workspace: Path, shadow: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    make_tree(workspace, {f"f{i}.txt": f"{i}\n" for i in range(60)})
    git_dir = shadow("w")
    ShadowRepo.open_or_init(git_dir, workspace).close()
    for i in range(256):  # every fan-out folder of the object store is a file: no loose object fits
        fan = git_dir / "objects" / f"{i:02x}"
        if fan.is_dir():
            os.rmdir(fan)
        fan.write_bytes(b"")
    pids = worker_pids_seen(monkeypatch)
    with pytest.raises(RepoError, match="write a blob"):
        scan(workspace, git_dir, EAGER)
    assert pids
    assert all(is_gone(pid) for pid in pids)
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_workers_exit_when_the_scanning_process_is_killed(workspace: Path, tmp_path: Path) -> None:
    make_tree(workspace, {f"d{i % 9}/f{i:04d}.txt": f"{i}\n" * 50 for i in range(3000)})
    script = textwrap.dedent(f"""
        import os, signal, sys
        from pathlib import Path
        from shadowpoint.stage.blob_workers import BlobWorkerOptions
        from shadowpoint.stage.exclusions import ExclusionRules
        from shadowpoint.stage.scanner import Scanner, StageOptions
        from shadowpoint.stage.stager import StagePlan
        from shadowpoint.store.shadow_repo import ShadowRepo
        from shadowpoint.stage.stat_cache import StatCache

        root = Path({str(workspace)!r})
        repo = ShadowRepo.open_or_init(Path({str(tmp_path / "shadow" / ".git")!r}), root)
        real = Scanner._stage_stat
        calls = 0

        def dying(self, run, path, st):
            global calls
            real(self, run, path, st)
            calls += 1
            if calls == 1000:  # the workers hold batches: the scanning process dies at once
                print("PIDS", *run.batch.worker_pids(), flush=True)
                os.kill(os.getpid(), signal.SIGKILL)

        Scanner._stage_stat = dying
        options = StageOptions(workers=BlobWorkerOptions(workers=2, min_files=1, batch_paths=16))
        Scanner(root, repo, ExclusionRules(root), options).stage(StagePlan(rescan=True), StatCache())
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()
    line = next(ln for ln in proc.stdout.decode().splitlines() if ln.startswith("PIDS"))
    pids = [int(p) for p in line.split()[1:]]
    assert len(pids) == 2
    wait_for(lambda: all(is_gone(pid) for pid in pids), "orphaned blob workers kept running", poll_s=0.05)


# ---- the setting ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("setting", "expected"), [(0, 0), (1, 1), (None, None)])
def test_the_hash_workers_setting_reaches_the_scanner(make_engine: Any, workspace: Path,
                                                      monkeypatch: pytest.MonkeyPatch,
                                                      setting: int | None, expected: int | None) -> None:
    """`hash_workers` (SHADOWPOINT_HASH_WORKERS) decides how many processes a big baseline
    starts; 0 keeps every hash in process."""
    from shadowpoint.config import Settings
    from shadowpoint.options import EngineOptions

    monkeypatch.setenv("SHADOWPOINT_HASH_WORKERS", "" if setting is None else str(setting))
    if setting is None:
        monkeypatch.delenv("SHADOWPOINT_HASH_WORKERS")
    assert EngineOptions.from_settings(Settings()).hash_workers == setting
    make_tree(workspace, {f"d{i % 9}/f{i}.txt": f"{i}\n" for i in range(700)})
    pids = worker_pids_seen(monkeypatch)
    eng = make_engine(workspace, hash_workers=setting, watcher=False)
    eng.start_task("t", ts=1)
    assert eng.list_checkpoints("t").to_wire()["state"] in ("initializing", "ready")
    wait_for(lambda: eng.list_checkpoints("t").to_wire()["state"] == "ready", "the baseline never finished")
    assert len(pids) == (default_worker_count() if expected is None else expected)
