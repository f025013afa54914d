"""Disk use of the shadow repo: 200 rounds on a 10,000-file workspace, then half the tasks
deleted and garbage collected (issue 4). Standalone: `python benchmarks/storage_probe.py`.

Uses the engine in-process; prints one JSON object with the sizes in bytes.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

from shadowpoint.config import DEFAULT_READ_ONLY_TOOLS
from shadowpoint.engine import Engine, EngineOptions
from shadowpoint.kinds import ToolKind
from shadowpoint.store.shadow_repo import disk_usage
from shadowpoint.store.storage import collect_garbage, storage_report


def make_workspace(root: Path, files: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    paths = []
    for i in range(files):
        rel = f"src/p{i % 97:02d}/m{i % 13}/f{i:05d}.py"
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text("".join(f"line {i} {rng.random():.12f}\n" for _ in range(rng.randint(20, 200))))
        paths.append(rel)
    return paths


def edit_round(eng: Engine, task: str, root: Path, chosen: list[str], ts: int, line: str) -> None:
    """One round of an edit tool appending `line` to each chosen file."""
    eng.begin_round(task)
    eng.tool_began(task, "write_to_file", ToolKind.EDIT, chosen)
    for rel in chosen:
        with open(root / rel, "a") as fh:
            fh.write(line)
    eng.tool_ended(task, "write_to_file", chosen, ToolKind.EDIT)
    eng.end_round(task, ts)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--files", type=int, default=10_000)
    ap.add_argument("--tasks", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=200, help="rounds in all, spread over the tasks")
    ap.add_argument("--edits", type=int, default=5, help="files edited per round")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args(argv)
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory(prefix="sp-storage-") as tmp:
        root = Path(tmp) / "ws"
        paths = make_workspace(root, args.files, args.seed)
        docs = Path(tmp) / "docs"
        opts = EngineOptions(docs_dir=docs, read_only_tools=frozenset(DEFAULT_READ_ONLY_TOOLS), watcher=False)
        eng = Engine([root], opts)
        ts = 1000
        start = time.perf_counter()
        per_task = args.rounds // args.tasks
        for t in range(args.tasks):
            task = f"task-{t:02d}"
            eng.start_task(task, ts)
            for _ in range(per_task):
                ts += 10
                edit_round(eng, task, root, rng.sample(paths, args.edits), ts, f"edit {ts} {rng.random():.12f}\n")
        rounds_s = time.perf_counter() - start
        git_dir = eng.workspaces[0].git_dir
        after_rounds = disk_usage(git_dir)
        collect_garbage(docs, grace_s=0)
        packed = disk_usage(git_dir)
        report_before = storage_report(docs)
        for t in range(0, args.tasks, 2):
            eng.delete_task(f"task-{t:02d}")
        eng.close()
        deleted_only = disk_usage(git_dir)
        gc = collect_garbage(docs, grace_s=0)
        after_gc = disk_usage(git_dir)
        report_after = storage_report(docs)
        out = {
            "files": args.files, "tasks": args.tasks, "rounds": per_task * args.tasks, "editsPerRound": args.edits,
            "roundsSeconds": round(rounds_s, 2),
            "bytesAfterRounds": after_rounds, "bytesAfterGcAllTasks": packed,
            "bytesAfterDeletingHalf": deleted_only, "bytesAfterGc": after_gc, "gc": gc,
            "taskUniqueBytesBefore": {t["taskId"]: t.get("uniqueBytes") for w in report_before["workspaces"]
                                      for t in w["tasks"]},
            "tasksAfter": [t["taskId"] for w in report_after["workspaces"] for t in w["tasks"]],
        }
        json.dump(out, sys.stdout, indent=1)
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
