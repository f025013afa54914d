"""Helpers for tests that build a user's git repository with the git CLI (the oracle)."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

GIT_ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.invalid", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@example.invalid", "GIT_CONFIG_NOSYSTEM": "1"}


def git(repo: Path, *args: str, input: bytes | None = None) -> bytes:
    """Run the git CLI in `repo` (its variables only in the child: the engine sees none)."""
    env = {**os.environ, **GIT_ENV}
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, env=env,
                          input=input).stdout


def backdate(root: Path, *paths: str, seconds: float = 100.0) -> None:
    """The mtime of `paths` (else of every file) `seconds` in the past, so that git's index
    entries are not racy (a utime changes the ctime: files git recorded are left alone)."""
    past = time.time() - seconds
    for rel in paths:
        os.utime(root / rel, (past, past), follow_symlinks=False)
    for dp, dns, fns in [] if paths else os.walk(root):
        if ".git" in dns:
            dns.remove(".git")
        for n in fns:
            os.utime(os.path.join(dp, n), (past, past), follow_symlinks=False)


def make_repo(root: Path, files: dict[str, bytes], *, commit: bool = True) -> Path:
    """`root` as a git repository holding `files`, added (and committed) with the git CLI."""
    root.mkdir(parents=True, exist_ok=True)
    git(root, "init", "-q", "-b", "main")
    for rel, data in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    backdate(root)
    git(root, "add", "-A")
    if commit:
        git(root, "commit", "-q", "-m", "initial")
    return root


def git_dir_state(git_dir: Path) -> dict[str, tuple[bytes, int]]:
    """Every file of a git dir: its bytes and mtime (to prove nothing wrote there)."""
    out: dict[str, tuple[bytes, int]] = {}
    for dp, _, fns in os.walk(git_dir):
        for n in fns:
            p = os.path.join(dp, n)
            st = os.lstat(p)
            data = os.readlink(p).encode() if os.path.islink(p) else Path(p).read_bytes()
            out[os.path.relpath(p, git_dir)] = (data, st.st_mtime_ns)
    for dp, dns, _ in os.walk(git_dir):
        for n in dns:
            p = os.path.join(dp, n)
            out[os.path.relpath(p, git_dir) + "/"] = (b"", os.lstat(p).st_mtime_ns)
    return out
