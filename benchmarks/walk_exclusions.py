"""Time `ExclusionRules.walk()` on a generated workspace and compare with the git CLI.

Generates a seeded tree (nested source folders, a large `node_modules`, build output, media,
logs and a few `.gitignore` files), then times a full walk with the built-in rules, a walk
without them, and `git ls-files --others --exclude-standard` on the same tree; the walk
without built-in rules must list exactly what git lists.

    python benchmarks/walk_exclusions.py [--files 100000] [--seed 1] [--repeat 3] [--keep DIR]
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from shadowpoint.stage.exclusions import ExclusionRules

SOURCE_EXTS = (".py", ".ts", ".tsx", ".js", ".md", ".json", ".go", ".rs", ".yaml", ".html", ".css")
NOISE_EXTS = (".png", ".log", ".csv", ".pyc", ".generated.ts", ".tmp")
ROOT_GITIGNORE = """\
# typical project rules
node_modules/
*.pyc
/coverage-report/
.env.*
logs/
!logs/keep.log
*.generated.ts
docs/**/*.pdf
tmp-*
*.py[cod]
*$py.class
*.sw?
*~
.#*
[Bb]in/
[Oo]bj/
**/temp/**
*.egg-info/
pip-log.txt
"""
NESTED_GITIGNORES = ("*.snap\n", "!important.log\n*.log\n", "/local/\n", "fixtures/*.json\n!fixtures/keep.json\n")


def generate(root: Path, files: int, seed: int) -> int:
    """Write a workspace of about `files` files under `root`; returns the exact count."""
    rng = random.Random(seed)
    root.mkdir(parents=True, exist_ok=True)
    (root / ".gitignore").write_text(ROOT_GITIGNORE)
    written = 1

    def write(path: Path) -> None:
        nonlocal written
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x")
        written += 1

    # node_modules: packages of a few dozen files each, nested one level.
    node_modules = files // 10
    pkg = 0
    while node_modules > 0:
        base = root / "node_modules" / f"pkg{pkg}"
        for i in range(min(node_modules, rng.randint(10, 60))):
            write(base / ("lib" if i % 3 else "dist") / f"f{i}.js")
            node_modules -= 1
        pkg += 1
    for i in range(files // 50):
        write(root / "build" / f"b{i % 20}" / f"out{i}.js")
    # Source tree: random folders up to depth 6, ~12 files per folder.
    folders = [root / "src"]
    gitignores = 0
    while written < files:
        parent = rng.choice(folders)
        if len(parent.relative_to(root).parts) < 6 and rng.random() < 0.1:
            child = parent / f"d{len(folders)}"
            folders.append(child)
            if gitignores < len(NESTED_GITIGNORES) * 2 and rng.random() < 0.02:
                write(child / ".gitignore")
                (child / ".gitignore").write_text(NESTED_GITIGNORES[gitignores % len(NESTED_GITIGNORES)])
                gitignores += 1
            continue
        ext = rng.choice(NOISE_EXTS) if rng.random() < 0.1 else rng.choice(SOURCE_EXTS)
        write(parent / f"f{written}{ext}")
    return written


def best_of(repeat: int, fn: Callable[[], int]) -> tuple[float, float, int]:
    """(first run s, best run s, result of the last run)."""
    times: list[float] = []
    result = 0
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return times[0], min(times), result


def git_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(GIT_CONFIG_GLOBAL=os.devnull, GIT_CONFIG_NOSYSTEM="1", HOME=str(home), XDG_CONFIG_HOME=str(home))
    return env


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--keep", type=Path, help="generate here and keep the tree")
    args = parser.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="shadowpoint-walk-"))
    root = args.keep or tmp / "ws"
    try:
        start = time.perf_counter()
        total = generate(root, args.files, args.seed)
        print(f"generated {total} files in {time.perf_counter() - start:.1f} s under {root}")

        def walk(**kwargs: Any) -> Callable[[], int]:
            return lambda: sum(1 for _ in ExclusionRules(root, **kwargs).walk())

        first, best, count = best_of(args.repeat, walk())
        print(f"walk, built-in rules:    {count:>7} files  first {first:.3f} s  best {best:.3f} s")
        first, best, count = best_of(args.repeat, walk(builtin={}))
        print(f"walk, no built-in rules: {count:>7} files  first {first:.3f} s  best {best:.3f} s")

        if shutil.which("git") is None:
            print("git CLI not found: no comparison")
            return 0
        env = git_env(tmp)
        subprocess.run(["git", "init", "-q", "--template=", str(root)], env=env, check=True)
        cmd = ["git", "-C", str(root), "ls-files", "--others", "--exclude-standard", "-z"]
        out = b""

        def git_ls() -> int:
            nonlocal out
            out = subprocess.run(cmd, env=env, capture_output=True, check=True).stdout
            return out.count(b"\0")

        first, best, count = best_of(args.repeat, git_ls)
        print(f"git ls-files --others:   {count:>7} files  first {first:.3f} s  best {best:.3f} s")
        theirs = {os.fsdecode(p) for p in out.split(b"\0") if p}
        ours = {str(p) for p, _ in ExclusionRules(root, builtin={}).walk()}
        if ours != theirs:
            print(f"MISMATCH with git: only ours {len(ours - theirs)}, only git's {len(theirs - ours)}")
            return 1
        print("walk without built-in rules lists exactly what git lists")
        return 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
