"""Deleting a task and collecting garbage on a big shadow repository, beside `git gc --prune=now`
(issue 13). Standalone: `python -m benchmarks.delete_gc_probe --files 100k`.

Generates a workspace (benchmarks.treegen), checkpoints it in two tasks (a baseline each and
a few rounds), then times, as a person runs them, `shadowpoint delete-task --yes` and
`shadowpoint storage --gc` (real processes; peak memory from the kernel's child rusage), and
`git gc --prune=now` on a copy of the same repository taken just before our collection.
Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.storage_probe import edit_round
from benchmarks.treegen import generate, git_env, parse_size
from shadowpoint.config import DEFAULT_READ_ONLY_TOOLS
from shadowpoint.engine import Engine, EngineOptions
from shadowpoint.logs import configure_logging
from shadowpoint.store.shadow_repo import disk_usage


def _timed(cmd: list[str], env: dict[str, str]) -> dict[str, Any]:
    """Run `cmd` to its end: wall time, peak RSS of the process (MiB), exit code."""
    # ru_maxrss of RUSAGE_CHILDREN is the largest child so far: run each command from a fresh
    # helper process so that earlier children do not mask it.
    wrapper = ("import resource, subprocess, sys, time, json; t = time.perf_counter(); "
               "rc = subprocess.call(sys.argv[1:], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL); "
               "print(json.dumps({'s': time.perf_counter() - t, 'rc': rc, "
               "'rss': resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}))")
    out = subprocess.run([sys.executable, "-c", wrapper, *cmd], env=env, capture_output=True, text=True,
                         check=True)
    data = json.loads(out.stdout.strip().splitlines()[-1])
    return {"seconds": round(data["s"], 3), "peakMiB": round(data["rss"] / 1024, 1), "exit": data["rc"]}


def _rounds(eng: Engine, task: str, root: Path, paths: list[str], rng: random.Random, ts: int, n: int) -> int:
    eng.start_task(task, ts)
    for _ in range(n):
        ts += 10
        chosen = rng.sample(paths, min(20, len(paths)))
        edit_round(eng, task, root, chosen, ts, f"edit {task} {ts} {rng.random():.12f}\n")
    return ts


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--files", default="10k", help="workspace size, e.g. 10k, 100k")
    ap.add_argument("--rounds", type=int, default=5, help="rounds per task")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--workdir", default=None, help="where the temporary tree goes")
    args = ap.parse_args(argv)
    configure_logging("error", "console", None)  # stdout carries only the JSON
    files = parse_size(args.files)
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory(prefix="sp-delete-gc-", dir=args.workdir) as tmp:
        root = Path(tmp) / "ws"
        t0 = time.perf_counter()
        generate(root, files, args.seed)
        generated_s = time.perf_counter() - t0
        docs = Path(tmp) / "docs"
        paths = [str(p.relative_to(root)) for p in root.rglob("*.py") if ".git" not in p.parts
                 and "node_modules" not in p.parts][:5000]
        opts = EngineOptions(docs_dir=docs, read_only_tools=frozenset(DEFAULT_READ_ONLY_TOOLS), watcher=False,
                             gc_grace_s=0)
        eng = Engine([root], opts)
        t0 = time.perf_counter()
        ts = _rounds(eng, "task-a", root, paths, rng, 1000, args.rounds)
        _rounds(eng, "task-b", root, paths, rng, ts + 1000, args.rounds)
        eng.close()
        checkpoints_s = time.perf_counter() - t0
        git_dir = eng.workspaces[0].git_dir
        env = {**os.environ, "SHADOWPOINT_DOCS_DIR": str(docs), "SHADOWPOINT_GC_GRACE_S": "0",
               "SHADOWPOINT_LOG_LEVEL": "error"}
        sp = [sys.executable, "-m", "shadowpoint"]
        size_before = disk_usage(git_dir)
        delete = _timed([*sp, "delete-task", "task-a", "--yes", "--no-collect"], env)
        copy = Path(tmp) / "copy.git"
        shutil.copytree(git_dir, copy, symlinks=True)
        ours = _timed([*sp, "storage", "--gc"], env)
        theirs = _timed(["git", "--git-dir", str(copy), "gc", "--prune=now", "--quiet"], {**os.environ, **git_env()})
        result = {
            "files": files, "generatedS": round(generated_s, 1), "checkpointsS": round(checkpoints_s, 1),
            "repoBytesBefore": size_before,
            "deleteTask": delete, "storageGc": ours, "gitGcPruneNow": theirs,
            "repoBytesAfterOurs": disk_usage(git_dir), "repoBytesAfterGit": disk_usage(copy),
            "gcRatio": round(ours["seconds"] / theirs["seconds"], 2) if theirs["seconds"] else None,
            "selfPeakMiB": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        }
    json.dump(result, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
