"""Deterministic benchmark workspaces: `generate()` builds a realistic tree from a seed.

The shape follows a large JavaScript/Python monorepo: nested source folders, a deep
`node_modules` holding about 8 % of the files, media, ignored output, logs, a couple of
nested git repositories (made with the git CLI) and a few big files. `copy_tree()` copies
a real repository (minus its own `.git`) instead. Called by the runner on the main thread.
"""

from __future__ import annotations

import math
import os
import random
import shutil
import subprocess
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

TEXT_POOL_BYTES = 4 << 20
BINARY_POOL_BYTES = 1 << 20
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
TOP_LEVEL = ("src", "lib", "packages", "tests", "docs", "app", "services", "tools", "scripts", "web")
TEXT_EXTENSIONS = (".py", ".ts", ".tsx", ".js", ".md", ".json", ".go", ".rs", ".txt", ".html", ".css", ".yaml")
ROOT_GITIGNORE = """\
# written by shadowpoint's benchmark generator
generated/
*.ignored
!important.ignored
"""
NESTED_GITIGNORE = "local_*.txt\n"
# the git CLI must not read the user's configuration, nor date commits with the clock
GIT_ENV_OVERRIDES = {
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_AUTHOR_NAME": "bench",
    "GIT_AUTHOR_EMAIL": "bench@example.invalid",
    "GIT_COMMITTER_NAME": "bench",
    "GIT_COMMITTER_EMAIL": "bench@example.invalid",
    "GIT_AUTHOR_DATE": "2024-01-01T00:00:00Z",
    "GIT_COMMITTER_DATE": "2024-01-01T00:00:00Z",
}


@dataclass(slots=True)
class TreeStats:
    """What `generate()` (or `copy_tree()`) put on disk."""

    files: int = 0
    dirs: int = 0
    bytes: int = 0
    node_modules_files: int = 0
    node_modules_dirs: int = 0
    media_files: int = 0
    ignored_files: int = 0
    log_files: int = 0
    large_files: int = 0
    executables: int = 0
    symlinks: int = 0
    nested_repos: list[str] = field(default_factory=list)
    seed: int | None = None
    source: str = "generated"
    duration_s: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def git_env() -> dict[str, str]:
    """The environment for git CLI calls: no GIT_* of the caller, no user or system config."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(GIT_ENV_OVERRIDES)
    return env


def parse_size(text: str) -> int:
    """`10k` -> 10000, `1M` -> 1000000, `300` -> 300."""
    raw = text.strip().lower()
    scale = 1
    if raw.endswith("k"):
        scale, raw = 1_000, raw[:-1]
    elif raw.endswith("m"):
        scale, raw = 1_000_000, raw[:-1]
    value = float(raw) * scale
    if value < 50 or value != int(value):
        raise ValueError(f"workspace size {text!r}: use a whole number of at least 50 files (e.g. 10k, 100k, 1M)")
    return int(value)


def size_label(files: int) -> str:
    if files >= 1_000_000 and files % 1_000_000 == 0:
        return f"{files // 1_000_000}M"
    if files >= 1_000 and files % 1_000 == 0:
        return f"{files // 1_000}k"
    return str(files)


class _Writer:
    """Creates folders (in order, on the caller's thread) and files (on a small thread pool:
    creating a file costs ~0.5 ms of kernel time here, and creations in parallel overlap)."""

    BATCH = 256
    THREADS = 16

    def __init__(self, root: Path, stats: TreeStats) -> None:
        self.root = root
        self.stats = stats
        self.made: set[str] = {""}
        self._pool = ThreadPoolExecutor(self.THREADS, thread_name_prefix="bench-treegen")
        self._batch: list[tuple[str, bytes, bool]] = []
        self._pending: list[Future[None]] = []

    def mkdir(self, rel: str) -> None:
        if rel in self.made:
            return
        parent = rel.rsplit("/", 1)[0] if "/" in rel else ""
        self.mkdir(parent)
        os.mkdir(self.root / rel)
        self.made.add(rel)
        self.stats.dirs += 1
        if rel.startswith("node_modules"):
            self.stats.node_modules_dirs += 1

    def write(self, rel: str, data: bytes, *, executable: bool = False) -> None:
        parent = rel.rsplit("/", 1)[0] if "/" in rel else ""
        self.mkdir(parent)
        self._batch.append((str(self.root / rel), data, executable))
        if executable:
            self.stats.executables += 1
        self.stats.files += 1
        self.stats.bytes += len(data)
        if len(self._batch) >= self.BATCH:
            self._submit()

    def _submit(self) -> None:
        batch, self._batch = self._batch, []
        self._pending.append(self._pool.submit(_write_batch, batch))
        if len(self._pending) > 4 * self.THREADS:  # bound the memory held by queued contents
            self._pending.pop(0).result()

    def flush(self) -> None:
        """Wait until every file is on disk (raises the first write error)."""
        if self._batch:
            self._submit()
        for fut in self._pending:
            fut.result()
        self._pending.clear()

    def close(self) -> None:
        try:
            self.flush()
        finally:
            self._pool.shutdown(wait=True)


def _write_batch(batch: list[tuple[str, bytes, bool]]) -> None:
    for path, data, executable in batch:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o755 if executable else 0o644)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)


class _Words:
    """Pronounceable pseudo-words from a seeded generator."""

    def __init__(self, rng: random.Random, count: int = 600) -> None:
        onsets = ["b", "c", "d", "f", "g", "h", "k", "l", "m", "n", "p", "r", "s", "t", "v", "w", "z", "st", "tr"]
        vowels = ["a", "e", "i", "o", "u", "ai", "ou"]
        words: set[str] = set()
        while len(words) < count:
            words.add("".join(rng.choice(onsets) + rng.choice(vowels) for _ in range(rng.randint(1, 3))))
        self.words = sorted(words)
        self.rng = rng

    def pick(self) -> str:
        return self.rng.choice(self.words)


def _text_pool(rng: random.Random, words: _Words) -> bytes:
    """Code-like text: indented lines of words and punctuation (distinct lines, shuffled repeats)."""
    tokens = ["(", ")", " = ", ": ", ", ", ".", " + ", " -> ", "{", "}", "[", "]", " # ", "return ", "def "]
    lines: list[str] = []
    size = 0
    while size < TEXT_POOL_BYTES // 8:
        parts = [" " * (4 * rng.randint(0, 3))]
        for _ in range(rng.randint(2, 10)):
            parts.append(words.pick())
            parts.append(rng.choice(tokens))
        parts.append("\n")
        line = "".join(parts)
        lines.append(line)
        size += len(line)
    out: list[str] = []
    for _ in range(8):
        rng.shuffle(lines)
        out.extend(lines)
    return "".join(out).encode()


def _text_size(rng: random.Random) -> int:
    if rng.random() < 0.01:
        return int(math.exp(rng.uniform(math.log(20_000), math.log(500_000))))
    return max(1024, min(20_480, int(rng.lognormvariate(math.log(3_800), 0.75))))


def _slice(pool: bytes, rng: random.Random, size: int, header: bytes) -> bytes:
    size = max(0, size - len(header))
    if size >= len(pool):
        reps = size // len(pool) + 1
        return header + (pool * reps)[:size]
    start = rng.randrange(0, len(pool) - size + 1)
    return header + pool[start : start + size]


def _grow_dirs(rng: random.Random, words: _Words, roots: list[str], count: int, max_depth: int) -> list[str]:
    """`count` folders below `roots`, each under a random existing one (a random recursive tree)."""
    dirs = list(roots)
    names: set[str] = set(dirs)
    while len(dirs) < count + len(roots):
        parent = rng.choice(dirs)
        if parent.count("/") >= max_depth:
            continue
        name = f"{parent}/{words.pick()}"
        if name in names:
            name = f"{name}{len(dirs)}"
        names.add(name)
        dirs.append(name)
    return dirs


def generate(root: Path, files: int, seed: int) -> TreeStats:
    """Write a deterministic workspace of about `files` files into `root` (created, must be empty).

    Args:
        root: the workspace folder to create.
        files: how many files to write (nested repositories' `.git` contents not counted).
        seed: the same seed and size always give the same tree.

    Returns:
        What was written.
    """
    started = time.perf_counter()
    rng = random.Random(seed * 1_000_003 + files)
    words = _Words(rng)
    text = _text_pool(rng, words)
    binary = rng.randbytes(BINARY_POOL_BYTES)
    root.mkdir(parents=True, exist_ok=True)
    if any(root.iterdir()):
        raise ValueError(f"{root} is not empty")
    stats = TreeStats(seed=seed)
    w = _Writer(root, stats)

    n_modules = round(files * 0.08)
    n_media = round(files * 0.02)
    n_ignored = round(files * 0.02)
    n_logs = max(3, files // 2_000)
    n_nested = max(5, files // 400)
    n_links = 3
    n_main = files - n_modules - n_media - n_ignored - n_logs - 2 * n_nested - n_links - 2
    # ~17,000 folders for 100,000 files: about 8,400 in node_modules (one file each), the rest here
    main_dirs = _grow_dirs(rng, words, list(TOP_LEVEL), max(1, round(files * 0.088)), max_depth=7)

    w.write(".gitignore", ROOT_GITIGNORE.encode())
    local_dir = main_dirs[len(TOP_LEVEL)] if len(main_dirs) > len(TOP_LEVEL) else main_dirs[0]
    w.write(f"{local_dir}/.gitignore", NESTED_GITIGNORE.encode())

    def text_file(rel: str, size: int | None = None) -> None:
        size = _text_size(rng) if size is None else size
        if size > 20_480:
            stats.large_files += 1
        w.write(rel, _slice(text, rng, size, f"// {rel} seed={seed}\n".encode()))

    reincluded: set[str] = set()
    for i in range(n_main):
        folder = rng.choice(main_dirs)
        if i % 997 == 0:
            w.write(f"{folder}/run_{i:x}.sh", f"#!/bin/sh\n# {folder} {i}\necho {i}\n".encode(), executable=True)
        elif i % 401 == 0 and folder not in reincluded:
            reincluded.add(folder)
            text_file(f"{folder}/important.ignored")  # re-included by `!important.ignored`
        else:
            text_file(f"{folder}/{words.pick()}_{i:x}{rng.choice(TEXT_EXTENSIONS)}")

    for i in range(n_links):
        target = f"link_target_{i}.md"
        folder = main_dirs[(i * 7) % len(main_dirs)]
        text_file(f"{folder}/{target}", 2_000)
        w.mkdir(folder)
        os.symlink(target, root / folder / f"link_{i}.md")
        stats.symlinks += 1

    # node_modules: a few hundred packages, each file in a fresh folder a few levels down
    packages = [f"node_modules/{words.pick()}-{i}" for i in range(max(3, n_modules // 25))]
    module_dirs = list(packages)
    for i in range(n_modules):
        parent = rng.choice(module_dirs)
        if parent.count("/") >= 9:
            parent = rng.choice(packages)
        folder = f"{parent}/{words.pick()}{i:x}"
        module_dirs.append(folder)
        text_file(f"{folder}/index_{i:x}.js")
        stats.node_modules_files += 1

    for i in range(n_media):
        folder = rng.choice(main_dirs)
        size = int(math.exp(rng.uniform(math.log(2_000), math.log(300_000))))
        w.write(f"{folder}/img_{i:x}.png", _slice(binary, rng, size, PNG_MAGIC + f"{folder}{i}".encode()))
        stats.media_files += 1

    generated = _grow_dirs(rng, words, ["generated"], max(1, n_ignored // 40), max_depth=3)
    for i in range(n_ignored):
        if i % 2:
            text_file(f"{rng.choice(generated)}/out_{i:x}.js")
        elif i % 10 == 0:
            text_file(f"{local_dir}/local_{i:x}.txt")
        else:
            text_file(f"{rng.choice(main_dirs)}/scratch_{i:x}.ignored")
        stats.ignored_files += 1

    for i in range(n_logs):
        size = int(math.exp(rng.uniform(math.log(50_000), math.log(5_000_000))))
        w.write(f"logs/app-{i}.log", _slice(text, rng, size, f"log {i}\n".encode()))
        stats.log_files += 1

    for name in ("third_party/alpha", "third_party/beta"):
        for i in range(n_nested):
            text_file(f"{name}/{rng.choice(['src', 'include', 'doc'])}/{words.pick()}_{i}.c", rng.randint(500, 8_000))
        stats.nested_repos.append(name)
    w.close()
    for name in stats.nested_repos:
        _make_nested_repo(root / name)

    stats.duration_s = time.perf_counter() - started
    return stats


def _make_nested_repo(path: Path) -> None:
    env = git_env()
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "nested"]):
        subprocess.run(["git", *args], cwd=path, env=env, check=True, stdout=subprocess.DEVNULL)


def copy_tree(source: Path, dest: Path) -> TreeStats:
    """Copy a real repository into `dest` without its own top-level `.git`.

    Nested repositories (a `.git` folder or file further down) are copied as they are.
    """
    started = time.perf_counter()
    source = source.resolve()
    if not source.is_dir():
        raise ValueError(f"--tree {source}: not a folder")

    def ignore(folder: str, names: list[str]) -> list[str]:
        return [".git"] if Path(folder).resolve() == source and ".git" in names else []

    shutil.copytree(source, dest, symlinks=True, ignore=ignore)
    stats = TreeStats(source=str(source))
    for dp, dirnames, filenames in os.walk(dest):
        rel = os.path.relpath(dp, dest)
        if ".git" in dirnames or ".git" in filenames:
            if rel != ".":
                stats.nested_repos.append(rel.replace(os.sep, "/"))
            if ".git" in dirnames:
                dirnames.remove(".git")
        stats.dirs += len(dirnames)
        for f in filenames:
            if f == ".git":
                continue
            p = os.path.join(dp, f)
            st = os.lstat(p)
            stats.files += 1
            stats.bytes += st.st_size
            if os.path.islink(p):
                stats.symlinks += 1
            if rel.split(os.sep)[0] == "node_modules":
                stats.node_modules_files += 1
    stats.duration_s = time.perf_counter() - started
    return stats
