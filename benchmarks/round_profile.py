"""`python -m benchmarks.round_profile [--size 10k] [--rounds 400]`: where a 1-file edit
round's time goes, in process, on a generated tree (issue 14).

Starts one task on a fresh tree and docs dir, runs `--rounds` one-file edit rounds through
the engine's API (the file writes untimed, as in `benchmarks.ours`), then prints the
median round, the medians of the first and last 20 rounds, and a cProfile of the rounds
(functions by own time, and by cumulative time within shadowpoint). Not a timing of record:
cProfile's overhead inflates many small calls; use it to see the segments' shares.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks.ours import EDIT_TOOL, OurEngine
from benchmarks.treegen import generate, parse_size
from shadowpoint.kinds import ToolKind
from shadowpoint.logs import configure_logging


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--size", default="10k")
    p.add_argument("--rounds", type=int, default=400)
    p.add_argument("--top", type=int, default=30)
    p.add_argument("--no-profile", action="store_true", help="only the timings")
    p.add_argument("--workdir", type=Path, default=None)
    p.add_argument("--whole-record", action="store_true",
                   help="write the whole task.json every round (the format before task.log), to compare")
    args = p.parse_args(argv)
    configure_logging("warning")
    if args.whole_record:
        from shadowpoint.engine import Engine

        Engine._append = Engine._save  # type: ignore[method-assign]
    work = Path(tempfile.mkdtemp(prefix="sp-round-profile-", dir=args.workdir))
    try:
        root = work / "tree"
        stats = generate(root, parse_size(args.size), seed=1)
        ours = OurEngine(root, work / "docs")
        print(f"tree: {stats.files} files; baseline {ours.start('t'):.2f} s")
        paths = sorted(str(q.relative_to(root)) for q in root.rglob("*.py") if q.is_file())[:20]
        if not paths:
            paths = sorted(str(q.relative_to(root)) for q in root.rglob("*") if q.is_file())[:20]
        prof = None if args.no_profile else cProfile.Profile()
        times: list[float] = []
        for i in range(args.rounds):
            path = root / paths[i % len(paths)]

            def write(path: Path = path, i: int = i) -> None:
                path.write_bytes(path.read_bytes() + f"\n# round {i}\n".encode())

            ours.background.settle()  # a background pack and the writeback: never inside a round
            rel = [paths[i % len(paths)]]
            if prof is not None:
                prof.enable()
            t0 = time.perf_counter()
            ours.eng.begin_round("t")
            ours.eng.tool_began("t", EDIT_TOOL, ToolKind.EDIT, rel)
            t1 = time.perf_counter()
            if prof is not None:
                prof.disable()
            write()
            if prof is not None:
                prof.enable()
            t2 = time.perf_counter()
            ours.eng.tool_ended("t", EDIT_TOOL, rel)
            ours.eng.end_round("t", ours.next_ts())
            t3 = time.perf_counter()
            if prof is not None:
                prof.disable()
            times.append((t1 - t0) + (t3 - t2))
        ours.close()
        n = min(20, len(times))
        print(f"rounds: {len(times)}; median {statistics.median(times) * 1e3:.2f} ms; first {n}: "
              f"{statistics.median(times[:n]) * 1e3:.2f} ms; last {n}: {statistics.median(times[-n:]) * 1e3:.2f} ms"
              + (" (under cProfile)" if prof is not None else ""))
        tenth = max(1, len(times) // 10)
        print("median of each tenth: " + ", ".join(f"{statistics.median(times[k:k + tenth]) * 1e3:.2f} ms"
                                                    for k in range(0, len(times) - tenth + 1, tenth)))
        if prof is not None:
            for key, restrict in (("tottime", ()), ("cumulative", ("shadowpoint",))):
                out = io.StringIO()
                st = pstats.Stats(prof, stream=out)
                st.sort_stats(key).print_stats(*restrict, args.top)
                print(out.getvalue())
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
