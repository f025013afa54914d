"""`python -m benchmarks.memory_timeline TREE [--every 30] [--timed-rounds N] [--collected]
[--verify N]`: the sidecar's memory over time on an existing tree (issue 14: the 1M tree is
generated once and reused; `benchmarks.treegen`).

Runs `sidecar_probe.measure_sidecar` (a baseline, three edit rounds, two command rounds and a
diff) on TREE with a new docs dir, samples the sidecar's VmRSS, RssAnon and RssFile from
/proc every 0.2 s, and prints one line per `--every` seconds, the highest sample and the
kernel's peak (VmHWM). `--verify N` then waits for N passes of the watcher's verification
(SPEC §4; run every second, unthrottled, instead of every minute at 5% of a core), which a
sidecar runs while it is idle, and reads the peak after them. `--timed-rounds 40 --collected`
is the suite's sidecar_rss: the peak read once the sidecar's first upkeep collection (after its
25th checkpoint) has ended. Linux only. The rounds append a comment line to the first text
files the walk finds and leave it there.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from benchmarks.sidecar_probe import is_supported, measure_sidecar, wait_for_collections

_FIELDS = ("VmRSS", "RssAnon", "RssFile")


def _sample(pid: int) -> tuple[float, ...] | None:
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as fh:
            values = dict(line.split(":", 1) for line in fh)
    except OSError:
        return None
    return tuple(int(values[f].split()[0]) / 1024 for f in _FIELDS)


def _text_files(root: Path, count: int) -> list[str]:
    found: list[str] = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d not in ("node_modules", ".git")]
        found += [os.path.relpath(os.path.join(folder, f), root) for f in files if f.endswith((".py", ".md", ".ts"))]
        if len(found) >= count:
            return found[:count]
    return found


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("tree", type=Path)
    p.add_argument("--every", type=float, default=30.0, help="seconds between printed lines")
    p.add_argument("--timed-rounds", type=int, default=0, metavar="N",
                   help="then N 1-file edit rounds 20 ms apart, as the suite's sidecar_rss runs")
    p.add_argument("--collected", action="store_true",
                   help="before reading the peak, wait for the sidecar's first collection to finish "
                        "(its upkeep starts one after the 25th checkpoint when loose objects pile up)")
    p.add_argument("--verify", type=int, default=0, metavar="N",
                   help="wait for N verification passes before reading the peak")
    p.add_argument("--docs", type=Path, help="docs dir for the sidecar, kept afterwards (default: a temp dir, "
                   "removed; removing a 1M-file shadow repository takes longer than the run)")
    args = p.parse_args(argv)
    if not is_supported():
        raise SystemExit("needs Linux /proc")
    samples: list[tuple[float, ...]] = []
    pids: list[int] = []
    done = threading.Event()
    start = time.perf_counter()

    def sampler() -> None:
        while not done.wait(0.2):
            values = _sample(pids[0]) if pids else None
            if values is not None:
                samples.append((time.perf_counter() - start, *values))

    def touch(paths: Sequence[str], tag: str) -> None:
        for rel in paths:
            with open(args.tree / rel, "a", encoding="utf-8") as fh:
                fh.write(f"\n# {tag}\n")

    thread = threading.Thread(target=sampler, name="memory-sampler", daemon=True)
    thread.start()
    work = Path(tempfile.mkdtemp(prefix="shadowpoint-memory-"))
    log_file = work / "sidecar.log"
    settings: dict[str, str] = {}
    passes: list[str] = []  # the sidecar's log lines of its finished verification passes
    passes_done_s = 0.0

    def verified() -> None:
        """Until the sidecar logged `--verify` finished passes (its log is the marker)."""
        nonlocal passes_done_s
        while True:
            with open(log_file, encoding="utf-8", errors="replace") as fh:
                passes[:] = [text.strip() for text in fh if "watcher.verification_finished" in text]
            if len(passes) >= args.verify:
                passes_done_s = time.perf_counter() - start
                return
            time.sleep(0.5)

    def collected() -> None:
        wait_for_collections(log_file)

    if args.collected:
        settings = {"SHADOWPOINT_LOG_LEVEL": "info", "SHADOWPOINT_LOG_FORMAT": "json"}
    if args.verify:
        settings = {"SHADOWPOINT_VERIFY_INTERVAL_S": "1", "SHADOWPOINT_VERIFY_CPU_SHARE": "1",
                    "SHADOWPOINT_LOG_LEVEL": "info", "SHADOWPOINT_LOG_FORMAT": "json"}
    try:
        stats = measure_sidecar(args.tree, args.docs or work / "docs", _text_files(args.tree, 4), touch,
                                log_file, started=pids.append, settings=settings,
                                before_shutdown=verified if args.verify else collected if args.collected else None,
                                timed_rounds=args.timed_rounds)
        for text in passes:
            print("verification:", text)
    finally:
        done.set()
        thread.join()
        shutil.rmtree(work, ignore_errors=True)
    line = -1.0
    for t, rss, anon, mapped in samples:
        if t >= line + args.every:
            line = t
            print(f"{t:8.1f} s  RSS {rss:7.1f} MiB  anon {anon:7.1f}  file {mapped:6.1f}")
    if samples:
        top = max(samples, key=lambda s: s[1])
        print(f"highest sample at {top[0]:.1f} s: RSS {top[1]:.1f} MiB (anon {top[2]:.1f}, file {top[3]:.1f})")
    print(f"peak (VmHWM) {stats.peak_rss_mb:.1f} MiB; baseline {stats.baseline_s:.1f} s; {stats.rounds} rounds"
          + (f"; {len(passes)} verification passes done at {passes_done_s:.1f} s" if passes else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
