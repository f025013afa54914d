"""`python -m benchmarks.cold_probe [--size 10k] [--rounds 30] [--pause 0.4]`: why a 1-file
edit round costs about twice as much after a pause as right after another round (issue 14).

A round that follows another at once finds the CPU's caches and predictors holding what the
last one touched. One that follows a pause (another program's work, such as the suite's git
round, or plain waiting: measured alike on this project's 2-vCPU VM) finds them cold, and
pays again for each piece of code and data it touches. This measures, in one process:

1. what a distinct Python function costs cold: a chain of N distinct small functions, each
   making an instance of a class of its own, run at once after itself and after a pause;
2. what a file-system call costs cold: 20 and 80 of them (lstat, open, read, flock, pread),
   the same two ways;
3. the engine's 1-file edit round, back to back and after pauses of `--short-pause` and
   `--pause` seconds, and how many distinct Python functions and built-ins one round calls
   (cProfile, in rounds of their own).

It prints the round's cold penalty (after the pause, less back to back) beside what (1) pays
for as many distinct functions and (2) for its first 20 calls: what a round pays for little
more than running at all after a pause. A file-system call past the first few costs about
nothing more cold: the kernel's share is first touch, not per call. Not a timing of record
(the suite's `round_edit_1` is): this says where the difference between a warm and a cold
round goes.
"""

from __future__ import annotations

import argparse
import cProfile
import fcntl
import itertools
import json
import os
import pstats
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.ours import EDIT_TOOL, OurEngine
from benchmarks.treegen import generate, parse_size
from shadowpoint.kinds import ToolKind
from shadowpoint.logs import configure_logging

CHAIN_LENGTHS = (50, 200, 800)
CALL_BLOCKS = (1, 4)  # blocks of 20 file-system calls
SAMPLES = 25


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--size", default="10k", help="the generated tree for the rounds")
    p.add_argument("--rounds", type=int, default=30, help="timed rounds of each kind")
    p.add_argument("--pause", type=float, default=0.4, help="seconds before a cold round")
    p.add_argument("--short-pause", type=float, default=0.05)
    p.add_argument("--workdir", type=Path, default=None)
    p.add_argument("--json", type=Path, default=None, help="write the figures here too")
    args = p.parse_args(argv)
    configure_logging("warning")
    work = Path(tempfile.mkdtemp(prefix="sp-cold-probe-", dir=args.workdir))
    try:
        out: dict[str, Any] = {"pause_s": args.pause}
        chains = {}
        for n in CHAIN_LENGTHS:
            warm, cold = _warm_and_cold(_function_chain(n), args.pause)
            chains[n] = {"warm_us": warm * 1e6, "cold_us": cold * 1e6, "cold_us_per_function": (cold - warm) * 1e6 / n}
            print(f"{n:4d} distinct functions: {warm * 1e6:7.1f} us at once, {cold * 1e6:7.1f} us after "
                  f"{args.pause} s: {chains[n]['cold_us_per_function']:.2f} us more a function")
        out["chains"] = chains

        blocks = {}
        for k in CALL_BLOCKS:
            warm, cold = _warm_and_cold(_file_calls(work, k), args.pause)
            blocks[k * 20] = {"warm_us": warm * 1e6, "cold_us": cold * 1e6}
            print(f"{k * 20:4d} file-system calls: {warm * 1e6:7.1f} us at once, {cold * 1e6:7.1f} us after "
                  f"{args.pause} s")
        few, many = blocks[CALL_BLOCKS[0] * 20], blocks[CALL_BLOCKS[-1] * 20]
        per_call = ((many["cold_us"] - many["warm_us"]) - (few["cold_us"] - few["warm_us"])) \
            / ((CALL_BLOCKS[-1] - CALL_BLOCKS[0]) * 20)
        out["file_calls"] = {"blocks": blocks, "cold_us_per_call": per_call}
        print(f"  {per_call:.2f} us more a call cold, past the first {CALL_BLOCKS[0] * 20} (whose "
              f"{few['cold_us'] - few['warm_us']:.0f} us are mostly the kernel's first touch)")

        out["rounds"] = _rounds(work, args)
        r = out["rounds"]
        functions = _interpolated({n: c["cold_us"] - c["warm_us"] for n, c in chains.items()}, r["distinct_functions"])
        kernel = few["cold_us"] - few["warm_us"]
        measured = (r["after_pause_ms"] - r["back_to_back_ms"]) * 1e3
        out["round_penalty_us"] = {"measured": measured, "chain_of_as_many_functions": functions,
                                   "first_file_calls": kernel}
        print(f"round, 1 edited path ({r['files']} files): {r['back_to_back_ms']:.3f} ms back to back, "
              f"{r['after_short_pause_ms']:.3f} ms after {args.short_pause} s, "
              f"{r['after_pause_ms']:.3f} ms after {args.pause} s")
        print(f"  a round calls {r['distinct_functions']} distinct Python functions and {r['distinct_builtins']} "
              f"built-ins ({r['calls']} calls)")
        print(f"  cold penalty: {measured:.0f} us measured; a chain of as many functions pays {functions:.0f} us, "
              f"the first 20 file-system calls {kernel:.0f} us: {functions + kernel:.0f} us together")
        if args.json is not None:
            args.json.write_text(json.dumps(out, indent=2) + "\n")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


def _interpolated(points: dict[int, float], x: int) -> float:
    """The value at `x` on the straight lines between `points` (extended past the ends)."""
    xs = sorted(points)
    lo, hi = (xs[0], xs[1]) if x <= xs[1] else (xs[-2], xs[-1])
    for a, b in itertools.pairwise(xs):
        if a <= x <= b:
            lo, hi = a, b
    return points[lo] + (points[hi] - points[lo]) * (x - lo) / (hi - lo)


def _pause(seconds: float) -> None:
    time.sleep(seconds)


def _warm_and_cold(fn: Callable[[], object], pause: float) -> tuple[float, float]:
    """Median seconds of `fn` run right after itself, and run after `pause` seconds."""
    warm, cold = [], []
    for _ in range(SAMPLES):
        fn()
        t = time.perf_counter()
        fn()
        warm.append(time.perf_counter() - t)
        _pause(pause)
        t = time.perf_counter()
        fn()
        cold.append(time.perf_counter() - t)
    return statistics.median(warm), statistics.median(cold)


def _function_chain(n: int) -> Callable[[], object]:
    """A call of `n` distinct functions, one after the other, each making an instance of a
    class of its own and storing a value: the shape of a round's code, one layer per call."""
    source = []
    for i in range(n):
        call_next = f"f{i + 1}(x + 1, d)" if i + 1 < n else "d"
        source.append(f"class C{i}:\n    def __init__(self, a):\n        self.a = a\n        self.b = a + {i}\n"
                      f"def f{i}(x, d):\n    c = C{i}(x)\n    d['k{i}'] = c.a + c.b\n    return {call_next}\n")
    namespace: dict[str, Any] = {}
    exec(compile("\n".join(source), f"<chain of {n}>", "exec"), namespace)  # the chain is generated above
    first = namespace["f0"]
    return lambda: first(0, {})


def _file_calls(work: Path, blocks: int) -> Callable[[], object]:
    """`blocks` times 20 file-system calls of the kinds a round makes (lstat, stat, open, read,
    close, flock, pread), on a file six folders deep."""
    folder = work / "a" / "b" / "c" / "d" / "e" / "f"
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / "file.py"
    target.write_bytes(b"x" * 4000)
    lock = os.fspath(work / "probe.lock")
    path, deep = os.fspath(target), os.fspath(folder)

    def calls() -> None:
        for _ in range(blocks):
            for _ in range(6):
                os.lstat(deep)
            fd = os.open(path, os.O_RDONLY)
            os.read(fd, 65536)
            os.close(fd)
            fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
            fcntl.flock(fd, fcntl.LOCK_EX)
            os.pread(fd, 32, 0)
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)
            for _ in range(3):
                os.stat(path)
                os.lstat(path)

    return calls


def _rounds(work: Path, args: argparse.Namespace) -> dict[str, Any]:
    root = work / "tree"
    stats = generate(root, parse_size(args.size), seed=1)
    ours = OurEngine(root, work / "docs", watcher=False)
    try:
        ours.start("t")
        rel = sorted(str(q.relative_to(root)) for q in root.rglob("*.py") if q.is_file())[0]
        data = (root / rel).read_bytes()
        serial = itertools.count()

        def one() -> float:
            i = next(serial)
            seconds, _ = ours.edit_round("t", [rel], lambda: (root / rel).write_bytes(data + f"\n# {i}\n".encode()))
            return seconds

        def timed(pause: float) -> float:
            times = []
            for _ in range(args.rounds + 1):
                ours.background.settle()
                if pause:
                    _pause(pause)
                times.append(one())
            return statistics.median(times[1:])  # the first follows the previous kind's rounds

        back_to_back = timed(0.0)
        short = timed(args.short_pause)
        long = timed(args.pause)
        prof = cProfile.Profile()
        profiled = 10
        for _ in range(profiled):
            ours.background.settle()
            prof.enable()
            ours.eng.begin_round("t")
            ours.eng.tool_began("t", EDIT_TOOL, ToolKind.EDIT, [rel])
            ours.eng.tool_ended("t", EDIT_TOOL, [rel])
            ours.eng.end_round("t", ours.next_ts())
            prof.disable()
        # pstats' table: function -> (primitive calls, calls, own time, cumulative time, callers)
        table: dict[tuple[str, int, str], tuple[int, int, float, float, object]] = \
            pstats.Stats(prof).stats  # type: ignore[attr-defined]
        # a function called in every round (not one of an occasional job's)
        every = [f for f, row in table.items() if row[1] >= profiled]
        (root / rel).write_bytes(data)
        return {
            "files": stats.files,
            "back_to_back_ms": back_to_back * 1e3,
            "after_short_pause_ms": short * 1e3,
            "after_pause_ms": long * 1e3,
            "distinct_functions": sum(1 for f in every if f[0] != "~"),
            "distinct_builtins": sum(1 for f in every if f[0] == "~"),
            "calls": round(sum(row[1] for row in table.values()) / profiled),
        }
    finally:
        ours.close()


if __name__ == "__main__":
    raise SystemExit(main())
