"""`python -m benchmarks.baseline_profile TREE [--runs 5]`: where a fresh baseline's time goes,
in both of its processes (issues 11 and 14).

Builds `--runs` baselines of TREE (read only; a new shadow repository and docs folder each
time, the watcher on, as in the sidecar) and times the scanner's phases in this process and in
the children it forks (the walk's share, the trees' share): each phase is wrapped, and each
process appends its (process, phase, start, end) to one file. CLOCK_MONOTONIC is the same in
every process, so one timeline holds both. Prints each run's timeline, relative to the start
of the scan, then the median of each phase's duration and end over the runs.

Not a timing of record (the wrappers cost a little, the host's load swings more): use it to
see which side waits for which, and where the end of a task's first command's wait comes from.
On the packed 100k git tree (2026-12-06): both processes read the index (~130 ms each), walk
their part (~430 ms each), and write the trees of their own folders (~90 ms here, ~110 ms in the
child); the parent then takes the child's answer (~40 ms) and writes the few trees above both.
"""

from __future__ import annotations

import argparse
import functools
import os
import shutil
import statistics
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.ours import OurEngine
from shadowpoint.logs import configure_logging
from shadowpoint.stage import forked, git_index, scanner
from shadowpoint.store import shadow_repo

# (owner, method) of each timed phase; `Forked.result` is a wait for a child
PHASES: tuple[tuple[Any, str], ...] = (
    (scanner.Scanner, "_fork_share"), (git_index.IndexProof, "read"), (git_index, "_parse"),
    (scanner.Scanner, "_first_scan"), (scanner.Scanner, "_scan_folders"), (scanner, "check_folders"),
    (scanner.Scanner, "_share_in_child"), (scanner.Scanner, "_unit_trees"), (scanner.Scanner, "_own_trees"),
    (shadow_repo.ShadowRepo, "write_folder_trees"), (forked.Forked, "result"), (scanner.Scanner, "_take_share"),
    (scanner.Scanner, "_keep_proven"), (scanner.Scanner, "_trees_aside"), (scanner.Scanner, "_note_borrowed"),
    (scanner.Scanner, "_subtrees"), (scanner.Scanner, "_trees_beside"), (shadow_repo.ShadowRepo, "write_tree_packed"),
    (shadow_repo.ShadowRepo, "commit"),
)


def _timed(log: Path, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            line = f"{os.getpid()} {name} {start:.6f} {time.perf_counter():.6f}\n"
            fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                os.write(fd, line.encode())  # one small append: whole, whichever process writes
            finally:
                os.close(fd)

    return wrapper


def _rows(log: Path, parent: int) -> list[tuple[str, str, float, float]]:
    rows = []
    for line in log.read_text().splitlines():
        pid, name, start, end = line.split()
        rows.append(("parent" if int(pid) == parent else "child", name, float(start), float(end)))
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("tree", type=Path, help="the workspace (a git repository shows the split baseline)")
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--workdir", type=Path, default=None)
    p.add_argument("--no-watcher", action="store_true", help="as the benchmark's baseline scenarios run")
    args = p.parse_args(argv)
    configure_logging("warning")
    work = Path(tempfile.mkdtemp(prefix="sp-baseline-profile-", dir=args.workdir))
    log = work / "phases.log"
    for owner, name in PHASES:
        setattr(owner, name, _timed(log, name, getattr(owner, name)))
    durations: dict[tuple[str, str], list[float]] = defaultdict(list)
    ends: dict[tuple[str, str], list[float]] = defaultdict(list)
    totals: list[float] = []
    try:
        for run in range(args.runs):
            log.unlink(missing_ok=True)
            ours = OurEngine(args.tree.resolve(), work / f"docs-{run}", watcher=not args.no_watcher)
            try:
                totals.append(ours.start("t"))
            finally:
                ours.close()
            rows = sorted(_rows(log, os.getpid()), key=lambda r: r[3])
            t0 = min(start for who, name, start, _ in rows if name == "_first_scan")
            print(f"run {run}: baseline ready after {totals[-1] * 1e3:.0f} ms (from the task's start)")
            seen: dict[tuple[str, str], int] = defaultdict(int)
            for who, name, start, end in rows:
                key = (who, name if not seen[(who, name)] else f"{name}#{seen[(who, name)] + 1}")
                seen[(who, name)] += 1
                durations[key].append((end - start) * 1e3)
                ends[key].append((end - t0) * 1e3)
                print(f"   {who:6s} {key[1]:16s} {1e3 * (start - t0):7.0f} -> {1e3 * (end - t0):7.0f} ms"
                      f"  ({1e3 * (end - start):.0f})")
        print(f"\nmedians over {args.runs} runs (ready after {statistics.median(totals) * 1e3:.0f} ms):")
        for key in sorted(ends, key=lambda k: statistics.median(ends[k])):
            print(f"   {key[0]:6s} {key[1]:16s} ends {statistics.median(ends[key]):7.0f} ms, "
                  f"takes {statistics.median(durations[key]):6.0f} ms")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
