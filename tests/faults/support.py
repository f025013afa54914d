"""Helpers of the fault suites: the git CLI as an oracle, canary trees, soak scaling,
sidecar start-up.

The git CLI runs with an empty configuration (no global/system config, no hooks), so a
hostile ~/.gitconfig planted by a test never affects the oracle.
"""

from __future__ import annotations

import hashlib
import os
import stat
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from shadowpoint.engine import Engine
from shadowpoint.kinds import ToolKind
from shadowpoint.results import Checkpoint
from shadowpoint.workspace import workspace_hash
from tests.conftest import Exe, Link, make_tree, read_tree, wait_for
from tests.rpc import SidecarProcess

PROTOCOL_KINDS = frozenset({
    "no_workspace", "protected_directory", "path_outside_workspace", "unknown_task", "unknown_checkpoint",
    "unknown_message", "no_file_snapshot", "already_restored", "nothing_to_undo", "init_timeout",
    "init_failed", "checkpoints_disabled", "lock_timeout", "restore_failed", "invalid_params",
    "storage_failed",
})


def _soak() -> int:
    try:
        return max(1, int(os.environ.get("SHADOWPOINT_SOAK") or 1))
    except ValueError:
        return 1


SOAK = _soak()
"""`SHADOWPOINT_SOAK=N` multiplies the iterations of the fault suites (default 1). Read at import:
the hermetic fixture clears every SHADOWPOINT_* variable before a test runs."""


def git_env(home: Path | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update({"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull, "GIT_TERMINAL_PROMPT": "0",
                "LC_ALL": "C"})
    if home is not None:
        env["HOME"] = str(home)
    return env


def git(git_dir: Path, *args: str, check: bool = True,
        input: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    """The git CLI on a shadow repo (an oracle only: the engine never runs git)."""
    return subprocess.run(["git", f"--git-dir={git_dir}", "-c", "core.hooksPath=/dev/null", *args],
                          capture_output=True, env=git_env(), check=check, input=input, timeout=120)


def fsck_problems(git_dir: Path) -> list[str]:
    """Lines of `git fsck --full` that report a missing or broken object reachable from a ref."""
    res = git(git_dir, "fsck", "--full", "--no-dangling", "--no-progress", check=False)
    lines = (res.stdout + res.stderr).decode("utf-8", "replace").splitlines()
    bad = [ln for ln in lines if any(w in ln for w in ("missing", "broken", "corrupt", "error", "fatal",
                                                          "invalid", "bad "))]
    if res.returncode != 0 and not bad:
        bad = lines or [f"git fsck exited {res.returncode}"]
    return bad


def has_object(git_dir: Path, oid: str) -> bool:
    return git(git_dir, "cat-file", "-e", oid, check=False).returncode == 0


def blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def git_tree(git_dir: Path, commit: str) -> dict[str, tuple[str, str]]:
    """{path: (mode, blob id)} of a commit, read by `git ls-tree -r` (paths as surrogateescape str)."""
    res = git(git_dir, "ls-tree", "-r", "-z", "--full-tree", commit)
    out: dict[str, tuple[str, str]] = {}
    for rec in res.stdout.split(b"\0"):
        if not rec:
            continue
        meta, path = rec.split(b"\t", 1)
        mode, _kind, oid = meta.split(b" ")
        out[os.fsdecode(path)] = (mode.decode(), oid.decode())
    return out


def expected_git_tree(tree: dict[str, Any]) -> dict[str, tuple[str, str]]:
    """What `git_tree` should give for a `read_tree`-style dict."""
    out = {}
    for path, val in tree.items():
        if isinstance(val, Link):
            out[path] = ("120000", blob_id(os.fsencode(val.target)))
        elif isinstance(val, Exe):
            out[path] = ("100755", blob_id(val.data))
        else:
            out[path] = ("100644", blob_id(val))
    return out


def shadow_git_dir(docs: Path, root: Path) -> Path:
    return docs / "checkpoints" / workspace_hash(Path(os.path.realpath(root))) / ".git"


def hash_tree(root: Path) -> str:
    """A digest of everything below `root` (names, types, modes, contents, link targets)."""
    h = hashlib.sha256()
    for dp, dns, fns in os.walk(root):
        dns.sort()
        for name in sorted(dns + fns):
            full = os.path.join(dp, name)
            st = os.lstat(full)
            h.update(os.fsencode(os.path.relpath(full, root)) + b"\0" + b"%o" % st.st_mode)
            if stat.S_ISLNK(st.st_mode):
                h.update(os.fsencode(os.readlink(full)))
            elif stat.S_ISREG(st.st_mode):
                h.update(Path(full).read_bytes())
    return h.hexdigest()


def make_canary(tmp_path: Path) -> Path:
    """A tree outside the workspace that nothing may change."""
    canary = tmp_path / "canary"
    (canary / "sub").mkdir(parents=True, exist_ok=True)
    (canary / "secret.txt").write_text("canary secret\n")
    (canary / "sub" / "deep.txt").write_text("deep canary\n")
    (canary / "run.sh").write_text("#!/bin/sh\necho hi\n")
    (canary / "run.sh").chmod(0o755)
    return canary


def temp_leftovers(root: Path) -> list[str]:
    return [p for p in read_tree(root) if ".shadowpoint-tmp-" in p]


def start_sidecar(root: Path, task: str | None = None, ts: int = 1000, settings: dict[str, Any] | None = None,
                  env: dict[str, str] | None = None, preexec_fn: Callable[[], Any] | None = None,
                  argv: list[str] | None = None) -> SidecarProcess:
    sc = SidecarProcess(env=env, preexec_fn=preexec_fn, argv=argv)
    sc.call("initialize", {"roots": [str(root)], "settings": {"watcher": False, **(settings or {})}})
    if task is not None:
        sc.call("task/start", {"taskId": task, "ts": ts})
        sc.wait_ready(task)
    return sc


def edit_round(sc: SidecarProcess, task: str, ts: int, paths: list[str], write: Any = None,
               tool: str = "write_to_file") -> dict[str, Any]:
    """One edit round over the protocol: `write()` runs between tool/begin and tool/end."""
    sc.call("round/begin", {"taskId": task})
    sc.call("tool/begin", {"taskId": task, "tool": tool, "kind": "edit", "paths": paths})
    if write is not None:
        write()
    sc.call("tool/end", {"taskId": task, "tool": tool, "kind": "edit", "paths": paths})
    cp: dict[str, Any] = sc.call("round/end", {"taskId": task, "ts": ts})["checkpoint"]
    return cp


def command_round(sc: SidecarProcess, task: str, ts: int, run: Any = None) -> dict[str, Any]:
    sc.call("round/begin", {"taskId": task})
    sc.call("tool/begin", {"taskId": task, "tool": "execute_command", "kind": "command"})
    if run is not None:
        run()
    sc.call("tool/end", {"taskId": task, "tool": "execute_command", "kind": "command"})
    cp: dict[str, Any] = sc.call("round/end", {"taskId": task, "ts": ts})["checkpoint"]
    return cp



# ---- the engine in-process ---------------------------------------------------------------------

def wait_ready(eng: Engine, task_id: str, timeout_s: float = 120) -> str:
    """Wait (never asserting a duration) for the background baseline; returns the state."""

    def settled() -> str:
        state = str(eng.list_checkpoints(task_id).to_wire()["state"])
        return "" if state == "initializing" else state

    return wait_for(settled, f"the baseline of {task_id} never finished", timeout_s)


def start(eng: Engine, task_id: str = "t", ts: int = 1) -> None:
    eng.start_task(task_id, ts)
    assert wait_ready(eng, task_id) == "ready", eng.list_checkpoints(task_id).to_wire()


def engine_edit(eng: Engine, root: Path, ts: int, files: dict[str, Any], task_id: str = "t",
                report: list[str] | None = None) -> Checkpoint:
    """A round with one edit tool writing `files` (a make_tree dict) and reporting their paths."""
    paths = list(files) if report is None else report
    eng.begin_round(task_id)
    eng.tool_began(task_id, "write_to_file", ToolKind.EDIT, paths)
    make_tree(root, files)
    eng.tool_ended(task_id, "write_to_file", paths)
    cp = eng.end_round(task_id, ts)
    assert cp is not None
    return cp


def engine_command(eng: Engine, root: Path, ts: int, run: Callable[[], Any] | None = None,
                   task_id: str = "t") -> Checkpoint:
    eng.begin_round(task_id)
    eng.tool_began(task_id, "execute_command", ToolKind.COMMAND, None)
    if run is not None:
        run()
    eng.tool_ended(task_id, "execute_command", None, ToolKind.COMMAND)
    cp = eng.end_round(task_id, ts)
    assert cp is not None
    return cp


def lose_object(git_dir: Path, oid: str) -> None:
    """Take `oid` away as a damaged disk would: its loose file, or else the whole pack holding it
    (a round's trees and commit share one, `ShadowRepo.flush`)."""
    path = git_dir / "objects" / oid[:2] / oid[2:]
    if path.exists():
        path.unlink()
        return
    for idx in (git_dir / "objects" / "pack").glob("pack-*.idx"):
        listed = git(git_dir, "show-index", input=idx.read_bytes()).stdout.decode().split()
        if oid in listed:
            idx.unlink()
            idx.with_suffix(".pack").unlink()
            return
    raise AssertionError(f"{oid} is neither loose nor in a pack of {git_dir}")


def tree_objects(git_dir: Path, commit: str) -> list[str]:
    """The commit, and every tree and blob its tree reaches (git ls-tree -r -t)."""
    res = git(git_dir, "ls-tree", "-r", "-t", "-z", "--full-tree", commit)
    out = [commit]
    for rec in res.stdout.split(b"\0"):
        if rec:
            out.append(rec.split(b"\t", 1)[0].split(b" ")[2].decode())
    return out


def missing_objects(git_dir: Path, commit: str) -> list[str]:
    """Objects of a commit's snapshot that the repo cannot give (empty: the snapshot is whole)."""
    try:
        oids = tree_objects(git_dir, commit)
    except subprocess.CalledProcessError as exc:
        return [f"unreadable: {exc.stderr.decode(errors='replace').strip()}"]
    res = git(git_dir, "cat-file", "--batch-check", input="".join(o + "\n" for o in oids).encode())
    return [ln for ln in res.stdout.decode().splitlines() if ln.endswith("missing")]
