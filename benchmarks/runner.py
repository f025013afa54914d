"""The benchmark runner: `python -m benchmarks` (and, later, `shadowpoint bench`).

For each workspace size (or a copied `--tree`), generates the tree in a temporary folder,
runs every scenario for ours and the rival, prints the table, and at the end writes the
JSON results and the chart. Progress goes to stderr, the tables to stdout.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchmarks.measure import EventTap, progress, tapped_logging
from benchmarks.report import TreeReport, load_json, print_table, render_chart, write_json
from benchmarks.rivals import git_version
from benchmarks.scenarios import SCENARIOS, TreeBench
from benchmarks.treegen import TreeStats, copy_tree, generate, git_env, parse_size, size_label

DEFAULT_SIZES = "10k,100k"
# a generated tree plus two shadow repos and a sidecar's: ~30 KB of disk per file
DISK_BYTES_PER_FILE = 30_000


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="shadowpoint against the seed's git CLI engine on generated (or copied) workspaces.",
    )
    p.add_argument("--size", default=DEFAULT_SIZES,
                   help=f"comma-separated workspace sizes in files, e.g. 10k,100k,1M (default {DEFAULT_SIZES})")
    p.add_argument("--repeat", type=int, default=5,
                   help="timed runs per scenario (default 5; baselines and the sidecar run at most 3 and 2 times)")
    p.add_argument("--heavy-repeat", type=int, default=None,
                   help="timed runs of the whole-tree scenarios (baselines, the first edit's wait); "
                        "default min(repeat, 3)")
    p.add_argument("--seed", type=int, default=1, help="seed of the generated trees (default 1)")
    p.add_argument("--tree", type=Path, help="benchmark a copy of this repository (without its .git) instead")
    p.add_argument("--out", type=Path, default=Path("bench-results"), help="folder for JSON and chart")
    p.add_argument("--json", type=Path, help="write the JSON here instead of OUT/<timestamp>.json")
    p.add_argument("--keep", action="store_true", help="keep the temporary trees and shadow repos")
    p.add_argument("--workdir", type=Path, help="where the temporary trees go (default: the system temp dir)")
    p.add_argument("--only", help="comma-separated scenario names to run (baseline always runs)")
    p.add_argument("--profile", help="comma-separated scenario names whose engine calls pyinstrument profiles "
                                     "(written to OUT/profile-<size>-<scenario>.txt and .html)")
    p.add_argument("--chart-from", nargs="+", type=Path, metavar="JSON",
                   help="only draw OUT/chart.png from earlier result files (sizes merged, newest wins)")
    return p


def machine_info() -> dict[str, Any]:
    from importlib.metadata import version

    import pygit2

    from shadowpoint import __version__

    return {
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "pygit2": version("pygit2"),
        "libgit2": pygit2.LIBGIT2_VERSION,
        "git": git_version(),
        "shadowpoint": __version__,
        "source": _source_revision(),
    }


def _source_revision() -> str | None:
    """The commit of the engine's checkout, `+dirty` with uncommitted changes (None outside git)."""
    import shadowpoint

    here = Path(shadowpoint.__file__).resolve().parent
    env = git_env()
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=here, env=env, capture_output=True,
                              text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "."], cwd=here, env=env,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return head + ("+dirty" if dirty else "")


def _check_disk(base: Path, files: int) -> None:
    free = shutil.disk_usage(base).free
    need = files * DISK_BYTES_PER_FILE
    if free < need:
        raise SystemExit(f"not enough disk in {base}: {free / 1e9:.1f} GB free, about {need / 1e9:.1f} GB needed "
                         f"for {files:,} files (use --workdir elsewhere or a smaller --size)")


def run_tree(label: str, make: Any, args: argparse.Namespace, tap: EventTap, base: Path) -> TreeReport:
    """Create one tree with `make(root)`, run the scenarios on it and clean up."""
    started = time.perf_counter()
    workdir = Path(tempfile.mkdtemp(prefix=f"shadowpoint-bench-{label.replace(':', '-')}-", dir=base))
    root = workdir / f"ws-{label.replace(':', '-')}"
    try:
        progress(f"{label}: creating the workspace in {root} …")
        stats: TreeStats = make(root)
        progress(f"{label}: {stats.files:,} files, {stats.dirs:,} folders, {stats.bytes / 1e6:,.0f} MB "
                 f"in {stats.duration_s:.1f} s")
        repeat = max(1, args.repeat)
        bench = TreeBench(label=label, root=root, workdir=workdir, stats=stats, repeat=repeat,
                          heavy_repeat=max(1, args.heavy_repeat) if args.heavy_repeat else min(repeat, 3),
                          seed=args.seed, tap=tap,
                          profile=_names(args.profile, "--profile"), profile_dir=args.out)
        specs = list(SCENARIOS)
        if args.only:
            wanted = _names(args.only, "--only") | {"baseline"}
            specs = [s for s in SCENARIOS if s.name in wanted]
        try:
            results = bench.run_all(specs)
        finally:
            bench.close()
        return TreeReport(label, stats.files, stats.to_json(), results, dict(bench.consistency),
                          time.perf_counter() - started, bench.background.to_json())
    finally:
        if args.keep:
            progress(f"{label}: kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


def _names(text: str | None, option: str) -> frozenset[str]:
    names = frozenset(n.strip() for n in (text or "").split(",") if n.strip())
    unknown = names - {s.name for s in SCENARIOS}
    if unknown:
        raise SystemExit(f"{option}: unknown scenarios {sorted(unknown)}; known: {[s.name for s in SCENARIOS]}")
    return names


def main(argv: list[str] | None = None) -> int:
    """Run the benchmarks; returns 0, or 1 when a scenario failed with an error."""
    args = build_parser().parse_args(argv)
    out_dir: Path = args.out
    if args.chart_from:
        trees: dict[str, TreeReport] = {}
        for path in sorted(args.chart_from, key=lambda p: p.stat().st_mtime):
            for t in load_json(path):
                trees[t.label] = t
        print(render_chart(list(trees.values()), out_dir / "chart.png"))
        return 0
    base = args.workdir or Path(tempfile.gettempdir())
    base.mkdir(parents=True, exist_ok=True)
    started_at = datetime.now(UTC)
    jobs: list[tuple[str, Any, int]] = []
    if args.tree is not None:
        src: Path = args.tree.resolve()
        jobs.append((f"tree:{src.name}", lambda root: copy_tree(src, root), 0))
    else:
        try:
            sizes = [parse_size(s) for s in args.size.split(",") if s.strip()]
        except ValueError as exc:
            raise SystemExit(str(exc)) from exc
        for n in sizes:
            jobs.append((size_label(n), lambda root, n=n: generate(root, n, args.seed), n))
    for _, _, n in jobs:
        _check_disk(base, n)

    meta: dict[str, Any] = {
        "started_at": started_at.isoformat(timespec="seconds"),
        "machine": machine_info(),
        "options": {"sizes": [j[0] for j in jobs], "repeat": args.repeat, "seed": args.seed,
                    "tree": str(args.tree) if args.tree else None},
    }
    json_path: Path = args.json or out_dir / f"{started_at.strftime('%Y%m%dT%H%M%SZ')}.json"
    reports: list[TreeReport] = []
    tap = EventTap()
    with tapped_logging(tap):
        for label, make, _ in jobs:
            report = run_tree(label, make, args, tap, base)
            reports.append(report)
            print_table(report)
            meta["duration_s"] = sum(r.duration_s for r in reports)
            write_json(json_path, meta, reports)
    print(f"results: {json_path}")
    print(render_chart(reports, out_dir / "chart.png"))
    failed = [s.name for r in reports for s in r.scenarios if s.error]
    if failed:
        print(f"scenarios that failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0
