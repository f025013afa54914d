"""Probe `WorkspaceWatcher` on a generated large tree: start-up, OS watches, event latency, flush cost.

Standalone: generates a seeded tree (default 100,000 files in ~17,000 folders, ~8,000 of them under
`node_modules`) in a temporary directory, measures, prints a table (or JSON) and deletes the tree.

    python benchmarks/watch_probe.py [--files N] [--dirs N] [--node-modules-dirs N] [--seed N] [--json]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import posixpath
import random
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import structlog

from shadowpoint.observe.journal import PathJournal
from shadowpoint.observe.watcher import WorkspaceWatcher
from shadowpoint.workspace import RepoPath

TOP_LEVEL = ["src", "lib", "tests", "docs", "packages", "tools", "assets", "config"]


def generate(root: Path, *, files: int, dirs: int, nm_dirs: int, seed: int) -> dict[str, int]:
    """Write a seeded random tree under `root`; return its counts."""
    rng = random.Random(seed)
    outside: list[str] = list(TOP_LEVEL)
    while len(outside) < dirs - nm_dirs:
        parent = rng.choice(outside)
        if parent.count("/") < 7:
            outside.append(f"{parent}/d{len(outside)}")
    inside: list[str] = ["node_modules"]
    while len(inside) < nm_dirs:
        parent = rng.choice(inside) if rng.random() < 0.7 else "node_modules"
        if parent.count("/") < 6:
            inside.append(f"{parent}/p{len(inside)}")
    for rel in outside + inside:
        (root / rel).mkdir(parents=True, exist_ok=True)
    nm_files = int(files * 0.4)
    for i in range(files):
        folder = rng.choice(inside) if i < nm_files else rng.choice(outside)
        data = rng.randbytes(rng.randint(16, 400))
        fd = os.open(root / folder / f"f{i}.txt", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
    return {"files": files, "dirs": len(outside) + len(inside) + 1, "node_modules_dirs": len(inside)}


def inotify_watches() -> int:
    """Watches held by this process, counted by the kernel (/proc/self/fdinfo)."""
    total = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}") == "anon_inode:inotify":
                text = Path(f"/proc/self/fdinfo/{fd}").read_text()
                total += sum(1 for line in text.splitlines() if line.startswith("inotify wd:"))
        except OSError:
            continue
    return total


class TimingJournal(PathJournal):
    """Records when a path it waits for arrives (on the observer thread)."""

    def __init__(self) -> None:
        super().__init__()
        self.target: str | None = None
        self.arrived_ns = 0
        self.arrived = threading.Event()

    def add(self, path: RepoPath) -> None:
        if path == self.target and not self.arrived.is_set():
            self.arrived_ns = time.perf_counter_ns()
            self.arrived.set()
        super().add(path)


def measure_start(root: Path, skip: Callable[[RepoPath], bool] | None, repeat: int) -> dict[str, Any]:
    durations, watches, kernel = [], 0, 0
    for _ in range(repeat):
        watcher = WorkspaceWatcher(root, skip_dirs=skip)
        t0 = time.perf_counter()
        watcher.start()
        durations.append((time.perf_counter() - t0) * 1000)
        assert watcher.is_healthy, "watcher did not start healthy"
        watches, kernel = watcher.watch_count or 0, inotify_watches()
        watcher.stop()
    return {"start_ms_median": statistics.median(durations), "watches": watches, "kernel_watches": kernel}


def measure_stock_start(root: Path, repeat: int) -> dict[str, Any]:
    """Watchdog's own recursive set-up (os.walk plus one lstat per folder), for comparison."""
    from watchdog.events import FileSystemEventHandler
    from watchdog.observers import Observer

    from shadowpoint.observe.watcher import _EVENT_FILTER

    durations, kernel = [], 0
    for _ in range(repeat):
        observer = Observer()
        observer.schedule(FileSystemEventHandler(), str(root), recursive=True, event_filter=_EVENT_FILTER)
        t0 = time.perf_counter()
        observer.start()
        durations.append((time.perf_counter() - t0) * 1000)
        kernel = inotify_watches()
        observer.stop()
        observer.join()
    return {"start_ms_median": statistics.median(durations), "watches": kernel, "kernel_watches": kernel}


def ms(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {
        "median_ms": round(statistics.median(ordered), 3),
        "p90_ms": round(ordered[int(len(ordered) * 0.9)], 3),
        "max_ms": round(ordered[-1], 3),
    }


def measure_rounds(root: Path, skip: Callable[[RepoPath], bool], samples: int) -> dict[str, Any]:
    journal = TimingJournal()
    watcher = WorkspaceWatcher(root, skip_dirs=skip, journal=journal)
    watcher.start()
    try:
        latency, flush_idle, flush_write, flush_rename, flush_dirty = [], [], [], [], []
        probe_dir = root / "src" / "probe"
        probe_dir.mkdir()
        assert watcher.flush(10.0)
        watcher.swap()
        for i in range(samples):
            journal.target, journal.arrived_ns = f"src/probe/w{i}.txt", 0
            journal.arrived.clear()
            written_ns = time.perf_counter_ns()
            (probe_dir / f"w{i}.txt").write_text("x")
            assert journal.arrived.wait(10.0), "event never arrived"
            latency.append((journal.arrived_ns - written_ns) / 1e6)
        watcher.swap()
        for _ in range(samples):
            t0 = time.perf_counter()
            assert watcher.flush(10.0)
            flush_idle.append((time.perf_counter() - t0) * 1000)
        for i in range(samples):
            (probe_dir / f"f{i}.txt").write_text("y")
            t0 = time.perf_counter()
            assert watcher.flush(10.0)
            flush_write.append((time.perf_counter() - t0) * 1000)
        for i in range(samples):  # an editor's atomic save: temporary file renamed over the target
            (probe_dir / f".r{i}.tmp").write_text("z")
            os.replace(probe_dir / f".r{i}.tmp", probe_dir / f"r{i}.txt")
            t0 = time.perf_counter()
            assert watcher.flush(10.0)
            flush_rename.append((time.perf_counter() - t0) * 1000)
        for i in range(samples // 10):  # a busy round: 100 files written, then the barrier
            for j in range(100):
                (probe_dir / f"b{i}_{j}.txt").write_text("b")
            t0 = time.perf_counter()
            assert watcher.flush(10.0)
            flush_dirty.append((time.perf_counter() - t0) * 1000)
        snapshot = watcher.swap()
        return {
            "write_to_event": ms(latency),
            "flush_idle": ms(flush_idle),
            "flush_after_write": ms(flush_write),
            "flush_after_atomic_save": ms(flush_rename),
            "flush_after_100_writes": ms(flush_dirty),
            "healthy": snapshot.healthy,
        }
    finally:
        watcher.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=100_000)
    parser.add_argument("--dirs", type=int, default=17_000)
    parser.add_argument("--node-modules-dirs", type=int, default=8_000)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--samples", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=3, help="start-up runs per configuration")
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--compare-stock", action="store_true", help="also time watchdog's own observer (same event filter)"
    )
    args = parser.parse_args(argv)
    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
    )

    def skip(path: RepoPath) -> bool:
        return posixpath.basename(path) == "node_modules"

    with tempfile.TemporaryDirectory(prefix="shadowpoint-watch-probe-") as tmp:
        root = Path(os.path.realpath(tmp)) / "ws"
        root.mkdir()
        t0 = time.perf_counter()
        tree: dict[str, Any] = dict(
            generate(root, files=args.files, dirs=args.dirs, nm_dirs=args.node_modules_dirs, seed=args.seed)
        )
        tree["generate_s"] = round(time.perf_counter() - t0, 1)
        result: dict[str, Any] = {
            "tree": tree,
            "start_without_skip": measure_start(root, None, args.repeat),
            "start_with_skip": measure_start(root, skip, args.repeat),
            "rounds_with_skip": measure_rounds(root, skip, args.samples),
        }
        if args.compare_stock:
            result["stock_watchdog_start"] = measure_stock_start(root, args.repeat)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        t = result["tree"]
        print(f"tree: {t['files']} files, {t['dirs']} folders ({t['node_modules_dirs']} under node_modules)")
        for key in ("start_without_skip", "start_with_skip", "stock_watchdog_start"):
            if key not in result:
                continue
            r = result[key]
            print(
                f"{key:24} start {r['start_ms_median']:8.1f} ms (median of {args.repeat})"
                f"  watches {r['watches']:6}  kernel {r['kernel_watches']:6}"
            )
        for key, r in result["rounds_with_skip"].items():
            if isinstance(r, dict):
                print(f"{key:24} median {r['median_ms']:7.3f} ms  p90 {r['p90_ms']:7.3f}  max {r['max_ms']:7.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
