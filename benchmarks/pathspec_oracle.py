"""Measure pathspec's gitignore matching against git on the random trees of the own matcher's
oracle test (tests/unit/test_exclusions.py), beside the own matcher (`ExclusionRules`).

Each tree gets nested `.gitignore` files drawn from the test's pattern list; git's answer is
`git ls-files --others --exclude-standard`. pathspec is used as a walker would use it: one
`GitIgnoreSpec` per `.gitignore`, checked against the path below that file's folder, the
deepest file with a decision winning, and an ignored folder pruned (as git does). The README
cites the figures (issue 15, item 7). pathspec is no dependency of shadowpoint: install it
(`pip install pathspec`; mypy brings it along with the dev tools) to run this.

    python -m benchmarks.pathspec_oracle [--seeds 500] [--cases]
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import pathspec

from tests.unit.test_exclusions import GITIGNORE_CASES, _random_tree, git_env, git_untracked, make_tree, walked

# The two faults the issue names, by hand: a POSIX class, and a negation below a pruned folder.
EXTRA_CASES: dict[str, dict[str, object]] = {
    "posix_space": {".gitignore": "a[[:space:]]b\n*[[:space:]]\n", "a b": "x", "ab": "x", "c\t": "x", "c": "x"},
    "negation_under_ignored_folder": {".gitignore": "d/\n!d/keep\n", "d": {"keep": "x", "other": "x"},
                                      "e": {".gitignore": "!keep\n", "keep": "x"}},
    "negation_in_nested_file": {".gitignore": "*.log\n", "logs": {".gitignore": "!keep.log\n", "keep.log": "x",
                                                                     "y.log": "x"}},
}


def _valid(line: str) -> bool:
    """pathspec refuses some lines git accepts and never matches (a trailing `\\`): left out."""
    try:
        pathspec.GitIgnoreSpec.from_lines([line])
    except ValueError:
        return False
    return True


def pathspec_walk(root: Path) -> set[str]:
    """The untracked files a gitignore walk built on pathspec finds (symlinks are leaves)."""
    out: set[str] = set()

    def ignored(rel: str, is_dir: bool, specs: list[tuple[str, pathspec.GitIgnoreSpec]]) -> bool:
        for base, spec in reversed(specs):  # the deepest rule file decides first
            below = rel[len(base):]
            result = spec.check_file(below + "/" if is_dir else below)
            if result.include is not None:
                return bool(result.include)
        return False

    def walk(folder: Path, prefix: str, specs: list[tuple[str, pathspec.GitIgnoreSpec]]) -> None:
        rules = folder / ".gitignore"
        if rules.is_file() and not rules.is_symlink():
            lines = rules.read_text(encoding="utf-8", errors="surrogateescape").splitlines()
            specs = [*specs, (prefix, pathspec.GitIgnoreSpec.from_lines([ln for ln in lines if _valid(ln)]))]
        for entry in sorted(os.scandir(folder), key=lambda e: e.name):
            if entry.name == ".git":
                continue
            rel = prefix + entry.name
            is_dir = entry.is_dir(follow_symlinks=False)
            if ignored(rel, is_dir, specs):
                continue
            if is_dir:
                walk(Path(entry.path), rel + "/", specs)
            else:
                out.add(rel)

    walk(root, "", [])
    return out


def own_walk(root: Path) -> set[str]:
    return walked(root, builtin={})


def measure(trees: list[tuple[str, dict[str, object]]]) -> dict[str, tuple[int, int]]:
    """{matcher: (trees with a disagreement, paths in disagreement)} over `trees`."""
    matchers: dict[str, Callable[[Path], set[str]]] = {"own": own_walk, "pathspec": pathspec_walk}
    counts = {name: (0, 0) for name in matchers}
    examples: dict[str, list[str]] = {name: [] for name in matchers}
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        env = git_env(tmp)
        for label, tree in trees:
            root = tmp / "ws"
            shutil.rmtree(root, ignore_errors=True)
            make_tree(root, tree)  # type: ignore[arg-type]
            theirs = git_untracked(root, env)
            for name, matcher in matchers.items():
                ours = matcher(root)
                wrong = ours ^ theirs
                if wrong:
                    t, p = counts[name]
                    counts[name] = (t + 1, p + len(wrong))
                    if len(examples[name]) < 5:
                        examples[name].append(f"{label}: {sorted(wrong)[:4]}")
    for name, ex in examples.items():
        for line in ex:
            print(f"  {name} differs on {line}")
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--seeds", type=int, default=500)
    parser.add_argument("--cases", action="store_true", help="also the hand-written cases of the test")
    args = parser.parse_args()
    trees: list[tuple[str, dict[str, object]]] = [
        (f"seed {seed}", _random_tree(random.Random(seed))) for seed in range(args.seeds)  # type: ignore[misc]
    ]
    if args.cases:
        trees += [(f"case {name}", dict(tree)) for name, tree in GITIGNORE_CASES.items()]
        trees += [(f"case {name}", tree) for name, tree in EXTRA_CASES.items()]
    counts = measure(trees)
    print(f"pathspec {pathspec.__version__}, {len(trees)} trees")
    for name, (t, p) in counts.items():
        print(f"{name:>9}: {t} trees disagree with git, {p} paths")


if __name__ == "__main__":
    main()
