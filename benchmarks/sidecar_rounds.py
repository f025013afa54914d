"""`python -m benchmarks.sidecar_rounds TREE [--rounds 200] [--watcher]`: what a one-file edit
round costs over the sidecar's stdio, beside the same rounds in process (issue 14).

Starts `shadowpoint serve` on TREE with a docs dir of its own, builds a task's baseline, then
runs `--rounds` edit rounds: `round/begin`, `tool/begin`, a line appended to one file of TREE
(the deepest; the tree is written to), `tool/end`, `round/end`. Prints the median round as the
client sees it (its four requests, the write excluded) and each request's median; then the
same rounds through the engine's API in this process (`OurEngine.edit_round`), so the
protocol's share shows. Each side runs on a fresh docs dir, after the other has ended.

Not a timing of record: the host moves both sides, the stdio side far more. On the 10k
benchmark tree (2026-12-06, no watcher): 3.1 ms a round over stdio against 0.9-1.3 ms in
process at one hour, 17.9 ms (first quartile 4.1) against 1.7 ms half an hour later. Most of
it was the background collection of the baseline's loose objects (from the 25th checkpoint,
2-3 s holding the interpreter and the workspace lock; it now yields to rounds) and the
hand-off of each request to the task's worker thread (a round's requests now run on the
reader's thread): 2.3 ms against 1.5 ms after both, every stretch of rounds alike.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

from benchmarks.ours import EDIT_TOOL, OurEngine
from benchmarks.sidecar_probe import RpcClient, sidecar_env, wait_ready
from shadowpoint.logs import configure_logging
from shadowpoint.stage.exclusions import ExclusionRules
from shadowpoint.workspace import RepoPath

REQUESTS = ("round/begin", "tool/begin", "tool/end", "round/end")
TASK = "bench-rounds"


def deepest_file(root: Path) -> str:
    """The root-relative path of the deepest regular file a checkpoint holds (none the
    exclusion rules leave out; the first by name)."""
    rules = ExclusionRules(root)
    found: list[tuple[int, str]] = []
    for folder, dirs, files in os.walk(root):
        rel = "" if folder == str(root) else os.path.relpath(folder, root)
        dirs[:] = sorted(d for d in dirs if not rules.is_excluded(RepoPath(f"{rel}/{d}" if rel else d), is_dir=True))
        for name in files:
            path = f"{rel}/{name}" if rel else name
            if os.path.isfile(root / path) and not os.path.islink(root / path) \
                    and not rules.is_excluded(RepoPath(path), is_dir=False):
                found.append((-path.count("/"), path))
    if not found:
        raise SystemExit(f"{root} holds no file to edit")
    return min(found)[1]


def _append(root: Path, path: str, mark: str) -> None:
    with open(root / path, "ab") as fh:
        fh.write(f"\n# {mark}\n".encode())


def over_stdio(root: Path, docs: Path, path: str, rounds: int,
               watcher: bool) -> tuple[list[float], dict[str, list[float]], int]:
    """The rounds over a real sidecar: each round's client time, each request's, and the
    checkpoints the task holds at the end."""
    env = sidecar_env(docs)
    docs.mkdir(parents=True, exist_ok=True)
    per: dict[str, list[float]] = {name: [] for name in REQUESTS}
    times: list[float] = []
    with open(docs / "sidecar.log", "wb") as err:
        proc = subprocess.Popen([sys.executable, "-m", "shadowpoint", "serve"], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=err, env=env, cwd=root)
        try:
            rpc = RpcClient(proc)

            def call(method: str, params: dict[str, object]) -> float:
                start = time.perf_counter()
                rpc.call(method, params)
                seconds = time.perf_counter() - start
                per[method].append(seconds)
                return seconds

            rpc.call("initialize", {"roots": [str(root)], "settings": {"watcher": watcher}})
            rpc.call("task/start", {"taskId": TASK, "ts": 1})
            wait_ready(rpc, TASK)
            edit: dict[str, object] = {"taskId": TASK, "tool": EDIT_TOOL, "kind": "edit", "paths": [path]}
            for i in range(rounds):
                time.sleep(0.02)  # an agent's model turn: the background settles
                before = call("round/begin", {"taskId": TASK}) + call("tool/begin", edit)
                _append(root, path, f"stdio {i}")
                times.append(before + call("tool/end", edit) + call("round/end", {"taskId": TASK, "ts": 10 + i}))
            held = len(rpc.call("checkpoint/list", {"taskId": TASK})["checkpoints"])
        finally:
            if proc.stdin is not None:
                proc.stdin.close()
            proc.wait(timeout=120)
            if proc.stdout is not None:
                proc.stdout.close()
    return times, per, held


def in_process(root: Path, docs: Path, path: str, rounds: int, watcher: bool) -> list[float]:
    ours = OurEngine(root, docs, watcher=watcher)
    try:
        ours.start(TASK)
        times = []
        for i in range(rounds):
            time.sleep(0.02)
            seconds, _ = ours.edit_round(TASK, [path], partial(_append, root, path, f"in process {i}"))
            times.append(seconds)
        return times
    finally:
        ours.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("tree", type=Path, help="the workspace (one of its files is appended to)")
    p.add_argument("--rounds", type=int, default=200)
    p.add_argument("--watcher", action="store_true", help="run the watcher on both sides")
    p.add_argument("--workdir", type=Path, default=None, help="where the docs dirs go (a temp folder in it)")
    args = p.parse_args(argv)
    configure_logging("warning")
    root = args.tree.resolve()
    path = deepest_file(root)
    work = Path(tempfile.mkdtemp(prefix="sp-sidecar-rounds-", dir=args.workdir))
    try:
        times, per, held = over_stdio(root, work / "stdio", path, args.rounds, args.watcher)
        print(f"edited: {path} ({args.rounds} rounds a side, watcher {'on' if args.watcher else 'off'})")
        print(f"over stdio: a round {statistics.median(times) * 1e3:.2f} ms (median); "
              + ", ".join(f"{name} {statistics.median(per[name]) * 1e6:.0f} us" for name in REQUESTS)
              + f"; {held} checkpoints")
        local = in_process(root, work / "in-process", path, args.rounds, args.watcher)
        print(f"in process: a round {statistics.median(local) * 1e3:.2f} ms (median)")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
