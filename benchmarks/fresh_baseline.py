"""`python -m benchmarks.fresh_baseline ROOT DOCS`: one baseline, in a fresh interpreter.

The engine as its sidecar runs it for an agent's first task: a process of its own whose
memory holds little else. The benchmark's own process, by the time it measures a git
repository's baseline, has built and let go of the plain baselines' 100k-file structures:
its heap is large and full of holes, and a split baseline forks. Every object either process
then makes in a hole writes to a page both share, which the kernel copies first. Measured on
the benchmark's tree (`vs_rival`-style pairs, alternated with OpenCode's way): 650 ms with a
45 MB heap, 863 ms with a 769 MB heap of which half was freed; OpenCode's way 632 and 718 ms
in the same minutes (its git processes are fresh either way).

Prints one JSON object: the seconds from the task's start to its baseline ready (the same
points as `OurEngine.start`), the CPU seconds spent meanwhile (this process's, and its
children's that ended by then: a split baseline's forked walker), the seconds the background
copy of borrowed blobs took after it (untimed), and the engine's own `task.baseline_built`
event fields.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path

from benchmarks.measure import EventTap, tapped_logging
from benchmarks.ours import OurEngine

TASK = "bench"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("root", type=Path, help="the workspace")
    p.add_argument("docs", type=Path, help="the engine's docs root (made here)")
    p.add_argument("--watcher", action="store_true")
    args = p.parse_args(argv)
    tap = EventTap()
    with tapped_logging(tap):
        mark = tap.mark()
        ours = OurEngine(args.root, args.docs, watcher=args.watcher)
        try:
            before = _cpu()
            seconds = ours.start(TASK)
            cpu = {key: round(after - before[key], 4) for key, after in _cpu().items()}
            copy_start = time.perf_counter()
            for state in ours.eng.roots.values():
                state.wait_copied()
            copy_s = time.perf_counter() - copy_start
        finally:
            ours.close()
        built = [{k: e.get(k) for k in ("borrowed", "hashed", "duration_ms")}
                 for e in tap.since(mark, "task.baseline_built")]
    json.dump({"seconds": seconds, "cpu": cpu, "copy_s": copy_s, "built": built}, sys.stdout)
    sys.stdout.write("\n")
    return 0


def _cpu() -> dict[str, float]:
    """CPU seconds so far: this process's and its ended children's, in user space and in the kernel."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return {"user": own.ru_utime, "sys": own.ru_stime, "children_user": children.ru_utime,
            "children_sys": children.ru_stime}


if __name__ == "__main__":
    raise SystemExit(main())
