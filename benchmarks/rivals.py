"""The rival: the seed's checkpoint engine emulated with the git CLI on a separate git dir.

Each round of the seed renames nested `.git` folders to `.git_disabled`, runs
`git add . --ignore-errors`, renames them back and runs `git commit --allow-empty
--no-verify`; restores are `git reset --hard`. `git status --porcelain` stands for a
rescan. Every call runs with `--git-dir=X --work-tree=ROOT`, without the user's or the
system's git configuration. Used on the runner's main thread.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from benchmarks.treegen import git_env

DISABLED_SUFFIX = "_disabled"


@dataclass(frozen=True, slots=True)
class GitRun:
    """One finished git process."""

    args: tuple[str, ...]
    returncode: int
    stdout: bytes
    seconds: float
    max_rss_kb: int
    cpu_user_s: float  # its CPU time (from `wait4`): in user space
    cpu_sys_s: float  # and in the kernel


def builtin_exclude_lines() -> list[str]:
    """The built-in exclusion patterns, as the seed writes them to `info/exclude`."""
    from shadowpoint.config.exclusion_data import BUILTIN_EXCLUSIONS

    lines = [p for patterns in BUILTIN_EXCLUSIONS.values() for p in patterns]
    # The seed's renamed nested git dirs must not be snapshotted themselves.
    lines.append(f".git{DISABLED_SUFFIX}/")
    return lines


def run_measured(cmd: Sequence[str], cwd: Path, env: dict[str, str]) -> GitRun:
    """Run `cmd`, returning its output, wall time, peak RSS and CPU time (from `wait4`, this
    child only)."""
    with tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        proc = subprocess.Popen(list(cmd), cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=err)
        assert proc.stdout is not None
        out = proc.stdout.read()
        proc.stdout.close()
        _, status, usage = os.wait4(proc.pid, 0)
        seconds = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        run = GitRun(tuple(cmd), proc.returncode, out, seconds, int(usage.ru_maxrss), usage.ru_utime, usage.ru_stime)
        if proc.returncode != 0:
            err.seek(0)
            message = err.read().decode(errors="replace")[-2000:]
            raise GitFailedError(f"{' '.join(cmd[:6])} exited {proc.returncode}: {message}", run)
    return run


class GitFailedError(RuntimeError):
    """A git CLI call of the rival failed; `run`: its measurements all the same (a caller
    that allows the failure counts its time, memory and CPU)."""

    def __init__(self, message: str, run: GitRun) -> None:
        super().__init__(message)
        self.run = run


class SeedGit:
    """A shadow git dir driven like the seed's engine drives it."""

    def __init__(self, root: Path, git_dir: Path, nested_repos: Iterable[str]) -> None:
        self.root = root
        self.git_dir = git_dir
        # Found once by the runner; the seed walks the tree for them on every round, which
        # this emulation does not charge to the rival.
        self.nested = [root / n for n in nested_repos]
        self.env = git_env()
        self.peak_rss_kb = 0
        self.add_peak_rss_kb = 0
        # called before each timed operation (the runner waits there for our background work)
        self.before_timed: Callable[[], None] = lambda: None

    def git(self, *args: str, allow_fail: bool = False) -> GitRun:
        cmd = ["git", f"--git-dir={self.git_dir}", f"--work-tree={self.root}", *args]
        try:
            run = run_measured(cmd, self.root, self.env)
        except GitFailedError as exc:
            if not allow_fail:
                raise
            run = exc.run
        self.peak_rss_kb = max(self.peak_rss_kb, run.max_rss_kb)
        return run

    def init(self) -> None:
        """A fresh git dir with the seed's configuration and exclusions."""
        self.git_dir.parent.mkdir(parents=True, exist_ok=True)
        self.git("init", "-q")
        for key, value in (
            ("user.name", "Seed Checkpoint"),
            ("user.email", "checkpoint@seed.invalid"),
            ("commit.gpgSign", "false"),
            # git commit would start `gc --auto` (detached) over >6,700 loose objects and
            # burn a core under the next measurements; turning it off only helps the rival.
            ("gc.auto", "0"),
            ("core.fsmonitor", "false"),
        ):
            self.git("config", key, value)
        info = self.git_dir / "info"
        info.mkdir(exist_ok=True)
        (info / "exclude").write_text("\n".join(builtin_exclude_lines()) + "\n")

    def _rename_nested(self, disable: bool) -> None:
        for repo in self.nested:
            src, dst = repo / ".git", repo / f".git{DISABLED_SUFFIX}"
            if not disable:
                src, dst = dst, src
            if src.exists():
                os.rename(src, dst)

    def add_all(self) -> GitRun:
        """Nested `.git` renamed away, `git add . --ignore-errors`, renamed back."""
        self._rename_nested(True)
        try:
            run = self.git("add", ".", "--ignore-errors", allow_fail=True)
        finally:
            self._rename_nested(False)
        self.add_peak_rss_kb = max(self.add_peak_rss_kb, run.max_rss_kb)
        return run

    def round(self) -> float:
        """The seed's checkpoint of one round; returns its wall time in seconds."""
        self.before_timed()
        start = time.perf_counter()
        self.add_all()
        self.git("commit", "--allow-empty", "--no-verify", "-q", "-m", "checkpoint")
        return time.perf_counter() - start

    def status(self) -> float:
        self.before_timed()
        return self.git("status", "--porcelain").seconds

    def head(self) -> str:
        return self.git("rev-parse", "HEAD").stdout.decode().strip()

    def reset_hard(self, commit: str) -> float:
        self.before_timed()
        return self.git("reset", "-q", "--hard", commit).seconds

    def diff_workspace(self, commit: str) -> tuple[float, bytes]:
        """The seed's compare against the workspace: add everything, then diff the index."""
        self.before_timed()
        start = time.perf_counter()
        self.add_all()
        out = self.git("diff", "--cached", commit).stdout
        return time.perf_counter() - start, out

    def ls_files(self) -> dict[str, tuple[int, str]]:
        """{path: (mode, blob id)} of the index (what the last add staged)."""
        out = self.git("ls-files", "-s", "-z").stdout
        listing: dict[str, tuple[int, str]] = {}
        for record in out.split(b"\0"):
            if not record:
                continue
            meta, path = record.split(b"\t", 1)
            mode, oid, _stage = meta.split(b" ")
            listing[path.decode("utf-8", "surrogateescape")] = (int(mode, 8), oid.decode())
        return listing


def git_version() -> str:
    out = subprocess.run(["git", "--version"], capture_output=True, text=True, env=git_env(), check=False)
    return out.stdout.strip()


class OpenCodeSnapshot:
    """OpenCode's way to snapshot a workspace that is a git repository, with the git CLI: a
    fresh git dir whose `objects/info/alternates` names the user's objects, the user's index
    copied as its index (so unchanged files are not hashed again), then `update-index
    --refresh`, `add -A` and `write-tree`. The best case for it: a copied index where the
    user's stat data still holds (a `read-tree HEAD` index would re-hash every file)."""

    def __init__(self, root: Path, git_dir: Path) -> None:
        self.root = root
        self.git_dir = git_dir
        self.env = git_env()
        self.tree = ""
        self.steps: list[GitRun] = []  # the git processes of the last `snapshot`

    def git(self, *args: str, allow_fail: bool = False, bare: bool = False) -> GitRun:
        cmd = ["git", *args] if bare else ["git", f"--git-dir={self.git_dir}", f"--work-tree={self.root}", *args]
        env = {**self.env, "GIT_INDEX_FILE": str(self.git_dir / "index")}
        try:
            done = run_measured(cmd, self.root, env)
        except GitFailedError as exc:
            if not allow_fail:
                raise
            done = exc.run
        self.steps.append(done)
        return done

    def snapshot(self) -> float:
        """Every step from the fresh git dir to the tree id; returns its wall time in seconds."""
        self.steps = []
        start = time.perf_counter()
        self.git_dir.parent.mkdir(parents=True, exist_ok=True)
        self.git("init", "-q", "--bare", str(self.git_dir), bare=True)
        (self.git_dir / "objects" / "info" / "alternates").write_text(f"{self.root / '.git' / 'objects'}\n")
        with open(self.root / ".git" / "index", "rb") as src, open(self.git_dir / "index", "wb") as dst:
            dst.write(src.read())
        self.git("update-index", "-q", "--refresh", allow_fail=True)  # exits 1 when files changed
        self.git("add", "-A")
        self.tree = self.git("write-tree").stdout.decode().strip()
        return time.perf_counter() - start
