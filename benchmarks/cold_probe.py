"""`python -m benchmarks.cold_probe [--size 10k] [--rounds 30] [--pause 0.4]`: why a 1-file
edit round costs about twice as much after a pause as right after another round (issue 14).

A round that follows another at once finds the CPU's caches and predictors holding what the
last one touched. One that follows a pause (another program's work, such as the suite's git
round, or plain waiting: measured alike on this project's 2-vCPU VM) finds them cold, and
pays again for each piece of code and data it touches. This measures, in one process:

1. what a distinct Python function costs cold: a chain of N distinct small functions, each
   making an instance of a class of its own, run at once after itself and after a pause;
2. what a file-system call costs cold: 20 and 80 of them (lstat, open, read, flock, pread),
   the same two ways;
3. the engine's 1-file edit round, back to back and after pauses of `--short-pause` and
   `--pause` seconds, and how many distinct Python functions and built-ins one round calls
   (cProfile, in rounds of their own);
4. the round's floor: the same work as that round and nothing else, in one Python function
   (`FloorRound`), alternated with the engine's round under the same pauses. What the floor
   pays cold is what the work itself pays; the rest of the engine's penalty is its layers'.

It prints the round's cold penalty (after the pause, less back to back) beside what (1) pays
for as many distinct functions and (2) for its first 20 calls: what a round pays for little
more than running at all after a pause. And (4) what the engine's layers add to the work,
warm and cold: the floor is no design to copy (it checks less), but where it lies says how
far a flatter round could go in Python. A file-system call past the first few costs about
nothing more cold: the kernel's share is first touch, not per call. Not a timing of record
(the suite's `round_edit_1` is): this says where the difference between a warm and a cold
round goes.
"""

from __future__ import annotations

import argparse
import cProfile
import fcntl
import hashlib
import itertools
import json
import os
import pstats
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pygit2

from benchmarks.ours import EDIT_TOOL, OurEngine
from benchmarks.treegen import generate, parse_size
from shadowpoint.kinds import ToolKind
from shadowpoint.logs import configure_logging
from shadowpoint.store.packing import small_pack
from shadowpoint.store.values import task_ref

CHAIN_LENGTHS = (50, 200, 800)
CALL_BLOCKS = (1, 4)  # blocks of 20 file-system calls
SAMPLES = 25


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--size", default="10k", help="the generated tree for the rounds")
    p.add_argument("--rounds", type=int, default=30, help="timed rounds of each kind")
    p.add_argument("--pause", type=float, default=0.4, help="seconds before a cold round")
    p.add_argument("--short-pause", type=float, default=0.05)
    p.add_argument("--workdir", type=Path, default=None)
    p.add_argument("--json", type=Path, default=None, help="write the figures here too")
    args = p.parse_args(argv)
    configure_logging("warning")
    work = Path(tempfile.mkdtemp(prefix="sp-cold-probe-", dir=args.workdir))
    try:
        out: dict[str, Any] = {"pause_s": args.pause}
        chains = {}
        for n in CHAIN_LENGTHS:
            warm, cold = _warm_and_cold(_function_chain(n), args.pause)
            chains[n] = {"warm_us": warm * 1e6, "cold_us": cold * 1e6, "cold_us_per_function": (cold - warm) * 1e6 / n}
            print(f"{n:4d} distinct functions: {warm * 1e6:7.1f} us at once, {cold * 1e6:7.1f} us after "
                  f"{args.pause} s: {chains[n]['cold_us_per_function']:.2f} us more a function")
        out["chains"] = chains

        blocks = {}
        for k in CALL_BLOCKS:
            warm, cold = _warm_and_cold(_file_calls(work, k), args.pause)
            blocks[k * 20] = {"warm_us": warm * 1e6, "cold_us": cold * 1e6}
            print(f"{k * 20:4d} file-system calls: {warm * 1e6:7.1f} us at once, {cold * 1e6:7.1f} us after "
                  f"{args.pause} s")
        few, many = blocks[CALL_BLOCKS[0] * 20], blocks[CALL_BLOCKS[-1] * 20]
        per_call = ((many["cold_us"] - many["warm_us"]) - (few["cold_us"] - few["warm_us"])) \
            / ((CALL_BLOCKS[-1] - CALL_BLOCKS[0]) * 20)
        out["file_calls"] = {"blocks": blocks, "cold_us_per_call": per_call}
        print(f"  {per_call:.2f} us more a call cold, past the first {CALL_BLOCKS[0] * 20} (whose "
              f"{few['cold_us'] - few['warm_us']:.0f} us are mostly the kernel's first touch)")

        out["rounds"] = _rounds(work, args)
        r = out["rounds"]
        functions = _interpolated({n: c["cold_us"] - c["warm_us"] for n, c in chains.items()}, r["distinct_functions"])
        kernel = few["cold_us"] - few["warm_us"]
        measured = (r["after_pause_ms"] - r["back_to_back_ms"]) * 1e3
        out["round_penalty_us"] = {"measured": measured, "chain_of_as_many_functions": functions,
                                   "first_file_calls": kernel}
        print(f"round, 1 edited path ({r['files']} files): {r['back_to_back_ms']:.3f} ms back to back, "
              f"{r['after_short_pause_ms']:.3f} ms after {args.short_pause} s, "
              f"{r['after_pause_ms']:.3f} ms after {args.pause} s")
        print(f"  a round calls {r['distinct_functions']} distinct Python functions and {r['distinct_builtins']} "
              f"built-ins ({r['calls']} calls)")
        print(f"  cold penalty: {measured:.0f} us measured; a chain of as many functions pays {functions:.0f} us, "
              f"the first 20 file-system calls {kernel:.0f} us: {functions + kernel:.0f} us together")
        f = r["floor"]
        print(f"  the same work in one function (the floor), alternated with the round: "
              f"{f['floor_back_to_back_ms']:.3f} ms back to back, {f['floor_after_pause_ms']:.3f} ms after "
              f"{args.pause} s; the round beside it {f['round_back_to_back_ms']:.3f} and "
              f"{f['round_after_pause_ms']:.3f} ms: the engine's layers add "
              f"{f['round_back_to_back_ms'] - f['floor_back_to_back_ms']:.3f} and "
              f"{f['round_after_pause_ms'] - f['floor_after_pause_ms']:.3f} ms")
        if args.json is not None:
            args.json.write_text(json.dumps(out, indent=2) + "\n")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


def _interpolated(points: dict[int, float], x: int) -> float:
    """The value at `x` on the straight lines between `points` (extended past the ends)."""
    xs = sorted(points)
    lo, hi = (xs[0], xs[1]) if x <= xs[1] else (xs[-2], xs[-1])
    for a, b in itertools.pairwise(xs):
        if a <= x <= b:
            lo, hi = a, b
    return points[lo] + (points[hi] - points[lo]) * (x - lo) / (hi - lo)


def _pause(seconds: float) -> None:
    time.sleep(seconds)


def _warm_and_cold(fn: Callable[[], object], pause: float) -> tuple[float, float]:
    """Median seconds of `fn` run right after itself, and run after `pause` seconds."""
    warm, cold = [], []
    for _ in range(SAMPLES):
        fn()
        t = time.perf_counter()
        fn()
        warm.append(time.perf_counter() - t)
        _pause(pause)
        t = time.perf_counter()
        fn()
        cold.append(time.perf_counter() - t)
    return statistics.median(warm), statistics.median(cold)


def _function_chain(n: int) -> Callable[[], object]:
    """A call of `n` distinct functions, one after the other, each making an instance of a
    class of its own and storing a value: the shape of a round's code, one layer per call."""
    source = []
    for i in range(n):
        call_next = f"f{i + 1}(x + 1, d)" if i + 1 < n else "d"
        source.append(f"class C{i}:\n    def __init__(self, a):\n        self.a = a\n        self.b = a + {i}\n"
                      f"def f{i}(x, d):\n    c = C{i}(x)\n    d['k{i}'] = c.a + c.b\n    return {call_next}\n")
    namespace: dict[str, Any] = {}
    exec(compile("\n".join(source), f"<chain of {n}>", "exec"), namespace)  # the chain is generated above
    first = namespace["f0"]
    return lambda: first(0, {})


def _file_calls(work: Path, blocks: int) -> Callable[[], object]:
    """`blocks` times 20 file-system calls of the kinds a round makes (lstat, stat, open, read,
    close, flock, pread), on a file six folders deep."""
    folder = work / "a" / "b" / "c" / "d" / "e" / "f"
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / "file.py"
    target.write_bytes(b"x" * 4000)
    lock = os.fspath(work / "probe.lock")
    path, deep = os.fspath(target), os.fspath(folder)

    def calls() -> None:
        for _ in range(blocks):
            for _ in range(6):
                os.lstat(deep)
            fd = os.open(path, os.O_RDONLY)
            os.read(fd, 65536)
            os.close(fd)
            fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
            fcntl.flock(fd, fcntl.LOCK_EX)
            os.pread(fd, 32, 0)
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)
            for _ in range(3):
                os.stat(path)
                os.lstat(path)

    return calls


def _rounds(work: Path, args: argparse.Namespace) -> dict[str, Any]:
    root = work / "tree"
    stats = generate(root, parse_size(args.size), seed=1)
    ours = OurEngine(root, work / "docs", watcher=False)
    try:
        ours.start("t")
        rel = sorted(str(q.relative_to(root)) for q in root.rglob("*.py") if q.is_file())[0]
        data = (root / rel).read_bytes()
        serial = itertools.count()

        def one() -> float:
            i = next(serial)
            seconds, _ = ours.edit_round("t", [rel], lambda: (root / rel).write_bytes(data + f"\n# {i}\n".encode()))
            return seconds

        def timed(pause: float) -> float:
            times = []
            for _ in range(args.rounds + 1):
                ours.background.settle()
                if pause:
                    _pause(pause)
                times.append(one())
            return statistics.median(times[1:])  # the first follows the previous kind's rounds

        back_to_back = timed(0.0)
        short = timed(args.short_pause)
        long = timed(args.pause)
        prof = cProfile.Profile()
        profiled = 10
        for _ in range(profiled):
            ours.background.settle()
            prof.enable()
            ours.eng.begin_round("t")
            ours.eng.tool_began("t", EDIT_TOOL, ToolKind.EDIT, [rel])
            ours.eng.tool_ended("t", EDIT_TOOL, [rel])
            ours.eng.end_round("t", ours.next_ts())
            prof.disable()
        # pstats' table: function -> (primitive calls, calls, own time, cumulative time, callers)
        table: dict[tuple[str, int, str], tuple[int, int, float, float, object]] = \
            pstats.Stats(prof).stats  # type: ignore[attr-defined]
        # a function called in every round (not one of an occasional job's)
        every = [f for f, row in table.items() if row[1] >= profiled]
        floor = _beside_the_floor(ours, work, root, rel, data, args)
        (root / rel).write_bytes(data)
        return {
            "files": stats.files,
            "back_to_back_ms": back_to_back * 1e3,
            "after_short_pause_ms": short * 1e3,
            "after_pause_ms": long * 1e3,
            "distinct_functions": sum(1 for f in every if f[0] != "~"),
            "distinct_builtins": sum(1 for f in every if f[0] == "~"),
            "calls": round(sum(row[1] for row in table.values()) / profiled),
            "floor": floor,
        }
    finally:
        ours.close()


def _beside_the_floor(ours: OurEngine, work: Path, root: Path, rel: str, data: bytes,
                      args: argparse.Namespace) -> dict[str, Any]:
    """The engine's round and `FloorRound` alternated (which goes first alternates too), back
    to back and after `--pause`: the median of each, in ms. Each floor round's commit is read
    back and must hold the file as written."""
    ours.background.settle()
    state = next(iter(ours.eng.roots.values()))
    floor = FloorRound(root, rel, state.ws.git_dir, task_ref("t"), work / "floor.git")
    serial = itertools.count()
    target = root / rel

    def write() -> bytes:
        content = data + f"\n# floor {next(serial)}\n".encode()
        target.write_bytes(content)
        return content

    def once(side: str, check: bool = True) -> float:
        if side == "round":
            seconds, _ = ours.edit_round("t", [rel], write)
            return seconds
        floor.make_files()
        content = write()
        t = time.perf_counter()
        floor.run()
        seconds = time.perf_counter() - t
        if check:  # untimed, and followed by an untimed round or a pause
            if floor.content() != content:
                raise RuntimeError(f"the floor's commit does not hold {rel} as written")
        return seconds

    times: dict[str, list[float]] = {"round_back_to_back": [], "round_after_pause": [],
                                     "floor_back_to_back": [], "floor_after_pause": []}
    try:
        for i in range(2 * args.rounds + 2):
            pause = args.pause if i % 2 else 0.0
            for side in (("round", "floor") if (i // 2) % 2 else ("floor", "round")):
                ours.background.settle()
                if pause:
                    _pause(pause)
                else:
                    once(side, check=False)  # back to back: right after the same work, untimed
                seconds = once(side)
                if i >= 2:  # the first pair of each kind warms up
                    times[f"{side}_{'after_pause' if pause else 'back_to_back'}"].append(seconds)
    finally:
        floor.close()
    return {f"{k}_ms": statistics.median(v) * 1e3 for k, v in times.items()}


class FloorRound:
    """The work of the engine's 1-file edit round and nothing more, in one function (`run`):
    the round's lock, the file's folder checked to be no symlink or under one (its real path
    is itself), the file read and hashed, the trees above it patched, a commit, one small pack
    with its index (`small_pack`, as a round writes them), the branch moved (written in
    place, as `rewrite_ref` moves a round's refs), a line appended to a record. Into a
    repository of its own that borrows the engine's objects (an alternate): the engine's
    repository is not written.

    Left out, and so what the engine's layers cost beside it: the request's path checks when
    the tool begins (`.git` look-alikes, nested repositories, exclusions), the racy re-hash
    probe, the stat cache, the task's second ref and the record's bookkeeping. One edited
    path, the same every round: a regular file already in the engine's last snapshot."""

    def __init__(self, root: Path, rel: str, engine_git_dir: Path, ref: str, git_dir: Path) -> None:
        source = pygit2.Repository(os.fspath(engine_git_dir))
        head = source.references[ref].peel(pygit2.Commit)
        pygit2.init_repository(os.fspath(git_dir), bare=True)
        (git_dir / "objects" / "info" / "alternates").write_text(os.fspath(engine_git_dir / "objects") + "\n")
        self.repo = pygit2.Repository(os.fspath(git_dir))
        self.rel = rel
        parts = rel.split("/")
        self.folder, self.name = os.path.join(os.path.realpath(root), *parts[:-1]), parts[-1]
        self.pack_dir = os.fspath(git_dir / "objects" / "pack") + "/"
        branch = git_dir / "refs" / "heads" / "floor"
        branch.write_text(f"{head.id}\n")
        self.ref_fd = os.open(branch, os.O_WRONLY | os.O_CLOEXEC)
        self.record = os.fspath(git_dir / "record.jsonl")
        self.lock = os.open(git_dir / "floor.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        self.parent = head.id.raw
        self.serial = 0
        self.ready: list[tuple[str, int]] = []  # `make_files`
        self.made = 0
        # each tree above the file: its content, and where its child's id lies in it
        self.levels: list[tuple[bytes, int]] = []
        tree = head.tree
        for depth, part in enumerate(parts, 1):
            raw = source.odb.read(tree.id)[1]
            name = part.encode()
            at = raw.index(b" " + name + b"\0") + len(name) + 2
            child = tree[part].id
            if raw[at:at + 20] != child.raw:
                raise RuntimeError(f"{part!r} is not where it was looked for in its tree")
            self.levels.append((raw, at))
            if depth < len(parts):
                tree = source[child].peel(pygit2.Tree)

    def run(self) -> None:
        fcntl.flock(self.lock, fcntl.LOCK_EX)
        try:
            folder = os.open(self.folder, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
            try:
                if os.readlink(f"/proc/self/fd/{folder}") != self.folder:
                    raise RuntimeError(f"{self.folder} is reached through a symlink")
                fd = os.open(self.name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=folder)
            finally:
                os.close(folder)
            try:
                data = os.read(fd, os.fstat(fd).st_size + 1)
            finally:
                os.close(fd)
            raw = hashlib.sha1(b"blob %d\0%s" % (len(data), data)).digest()
            objects = [(raw, 3, data)]
            levels = []
            for tree, at in reversed(self.levels):
                tree = tree[:at] + raw + tree[at + 20:]
                levels.append((tree, at))
                raw = hashlib.sha1(b"tree %d\0%s" % (len(tree), tree)).digest()
                objects.append((raw, 2, tree))
            self.levels = levels[::-1]
            self.serial += 1
            who = b"shadowpoint <shadowpoint@localhost> %d +0000" % (1_700_000_000 + self.serial)
            commit = b"tree %s\nparent %s\nauthor %s\ncommitter %s\n\nround %d\n" % (
                raw.hex().encode(), self.parent.hex().encode(), who, who, self.serial)
            self.parent = hashlib.sha1(b"commit %d\0%s" % (len(commit), commit)).digest()
            objects.append((self.parent, 1, commit))
            name, pack, index = small_pack(objects)
            for (made, fd), suffix, content in zip(self.ready, (".pack", ".idx"), (pack, index), strict=True):
                try:
                    os.write(fd, content)
                finally:
                    os.close(fd)
                os.rename(made, f"{self.pack_dir}{name}{suffix}")
            self.ready = []
            os.pwrite(self.ref_fd, self.parent.hex().encode() + b"\n", 0)  # in place, as `rewrite_ref`
            fd = os.open(self.record, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                os.write(fd, b'{"round":%d,"commit":"%s"}\n' % (self.serial, self.parent.hex().encode()))
            finally:
                os.close(fd)
        finally:
            fcntl.flock(self.lock, fcntl.LOCK_UN)

    def make_files(self) -> None:
        """The two files the next `run` writes its pack and index into, made and opened ahead,
        as the engine's `FilePool` makes a round's (a file made in the round itself waited up
        to ~1 ms for the file system's journal after the benchmark's sync)."""
        while len(self.ready) < 2:
            self.made += 1
            made = f"{self.pack_dir}tmp-floor-{self.made}"
            self.ready.append((made, os.open(made, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o444)))

    def close(self) -> None:
        for made, fd in self.ready:
            os.close(fd)
            os.unlink(made)
        os.close(self.ref_fd)
        os.close(self.lock)

    def content(self) -> bytes:
        """The file as the floor's branch holds it (read back with libgit2: the packs are real)."""
        commit = self.repo.revparse_single("refs/heads/floor").peel(pygit2.Commit)
        return bytes(self.repo[commit.tree[self.rel].id].read_raw())


if __name__ == "__main__":
    raise SystemExit(main())
