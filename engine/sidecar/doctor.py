"""`shadowpoint doctor`: read-only checks of what checkpoints depend on.

OS watch limits (inotify) against the workspace's folder count, the docs root (writable,
sizes), running and stale sidecar sockets, held workspace locks, and each shadow repo's
health (it opens, its worktree exists, every ref resolves to an object it holds). Called by
the CLI on its thread; changes nothing (a lock is probed without blocking and let go).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

from shadowpoint.config import Settings
from shadowpoint.errors import ShadowpointError, SidecarError
from shadowpoint.sidecar.backend import kept_checkpoints_hint
from shadowpoint.sidecar.client import SidecarClient, runtime_dir
from shadowpoint.stage.exclusions import ExclusionRules
from shadowpoint.store.locking import lock_holder
from shadowpoint.store.shadow_repo import ShadowRepo, disk_usage
from shadowpoint.workspace import RepoPath

# Recommended floors: a 100,000-file workspace has ~17,000 folders (benchmarks/watch_probe.py);
# editors and other tools share the per-user limits.
WATCHES_FLOOR = 524_288
INSTANCES_FLOOR = 1024
_DIR_COUNT_CAP = 200_000

Check = dict[str, Any]


def _check(name: str, status: str, summary: str, details: list[str] | None = None) -> Check:
    return {"name": name, "status": status, "summary": summary, "details": details or []}


def _sysctl(name: str) -> int | None:
    try:
        return int(Path("/proc/sys", *name.split(".")).read_text().strip())
    except (OSError, ValueError):
        return None


def _count_dirs(root: Path) -> int:
    """Folders a watcher would watch (excluded ones and nested repos pruned), capped."""
    rules = ExclusionRules(root)
    count = 0
    stack = [""]
    while stack and count < _DIR_COUNT_CAP:
        rel = stack.pop()
        count += 1
        try:
            with os.scandir(root / rel if rel else root) as it:
                for d in it:
                    if not d.is_dir(follow_symlinks=False) or d.name.lower() == ".git":
                        continue
                    child = RepoPath(f"{rel}/{d.name}" if rel else d.name)
                    if not rules.is_excluded(child, is_dir=True):
                        stack.append(child)
        except OSError:
            continue
    return count


def check_watch_limits(workspace: Path | None) -> Check:
    """inotify limits against the watches `workspace` needs, and how to raise them."""
    watches = _sysctl("fs.inotify.max_user_watches")
    instances = _sysctl("fs.inotify.max_user_instances")
    if watches is None and instances is None:
        return _check("watch limits", "info", "no inotify on this system (the watcher uses another backend)")
    details = [f"fs.inotify.max_user_watches = {watches}", f"fs.inotify.max_user_instances = {instances}",
               f"fs.inotify.max_queued_events = {_sysctl('fs.inotify.max_queued_events')}"]
    status = "ok"
    dirs: int | None = None
    if workspace is not None and workspace.is_dir():
        dirs = _count_dirs(workspace)
        details.append(f"{workspace} needs about {dirs:,}{'+' if dirs >= _DIR_COUNT_CAP else ''} watches "
                       f"(one per folder)")
        # half the limit for this project: editors and other tools share the per-user limit
        if watches is not None and dirs > watches // 2:
            status = "problem" if dirs > watches else "warning"
    low = []
    if watches is not None and watches < WATCHES_FLOOR:
        low.append(f"fs.inotify.max_user_watches={WATCHES_FLOOR}")
    if instances is not None and instances < INSTANCES_FLOOR:
        low.append(f"fs.inotify.max_user_instances={INSTANCES_FLOOR}")
    if low and dirs is not None and status == "ok":
        # judged against this project: the floors are for projects of ~100,000 files
        details.append("enough for this project; for very large ones (~100,000 files): "
                       + "; ".join(f"sudo sysctl {kv}" for kv in low))
        low = []
    if low:
        status = "warning" if status == "ok" else status
        details.append("raise them: " + "; ".join(f"sudo sysctl {kv}" for kv in low))
        details.append("keep them after a reboot: printf '%s\\n' " + " ".join(f"'{kv}'" for kv in low)
                       + " | sudo tee /etc/sysctl.d/60-shadowpoint.conf")
        details.append("without enough watches, rounds fall back to a full rescan (slower, still correct)")
    enough = f"enough for this project's {dirs:,} folder(s)" if dirs is not None else "enough for the watcher"
    summary = {"ok": enough, "warning": "low: rounds may fall back to a rescan",
               "problem": "too low for this workspace: rounds will rescan"}[status]
    return _check("watch limits", status, summary, details)


def check_docs(docs: Path) -> Check:
    """The docs root: writable, and what its shadow repos and task folders use."""
    if not docs.exists():
        return _check("storage", "info", f"{docs} does not exist yet (created with the first checkpoint)")
    writable = os.access(docs, os.W_OK)
    repos = sorted(d for d in (docs / "checkpoints").iterdir()) if (docs / "checkpoints").is_dir() else []
    # a name starting with "." is no task's (the engine's `.file-pool`: ref_component never makes one)
    tasks_dir = docs / "tasks"
    tasks = sorted(d for d in tasks_dir.iterdir() if not d.name.startswith(".")) if tasks_dir.is_dir() else []
    repo_bytes = sum(disk_usage(r) for r in repos)
    task_bytes = disk_usage(tasks_dir) if tasks_dir.is_dir() else 0
    details = [f"{len(repos)} shadow repo(s): {repo_bytes / 2**20:.1f} MiB",
               f"{len(tasks)} task folder(s): {task_bytes / 2**20:.1f} MiB",
               "`shadowpoint storage` shows each task; `shadowpoint storage --gc` reclaims space"]
    if not writable:
        return _check("storage", "problem", f"{docs} is not writable", details)
    return _check("storage", "ok", f"{docs}: {(repo_bytes + task_bytes) / 2**20:.1f} MiB", details)


def check_sidecars() -> Check:
    """Sidecar sockets in the runtime dir: who answers (pid, owner, roots) and which are stale."""
    folder = runtime_dir()
    socks = sorted(folder.glob("*.sock")) if folder.is_dir() else []
    details = []
    stale = 0
    for sock in socks:
        try:
            with SidecarClient(sock, timeout_s=5.0) as client:
                st = client.request("sidecar/status")
            owner = f" (shadowpoint {st['owner']})" if st.get("owner") else ""
            details.append(f"{sock.name}: pid {st['pid']}{owner}, {st['connections']} connection(s), "
                           f"roots {', '.join(st.get('roots') or []) or '—'}")
        except (SidecarError, OSError, ValueError, KeyError):
            stale += 1
            details.append(f"{sock.name}: stale (nothing answers; removed by the next sidecar)")
    status = "warning" if stale else "ok"
    return _check("sidecars", status, f"{len(socks) - stale} running, {stale} stale in {folder}", details)


def check_locks(docs: Path) -> Check:
    """Workspace locks held right now, and by which pid."""
    root = docs / "checkpoints"
    locks = sorted(root.glob("*/shadowpoint.lock")) if root.is_dir() else []
    held = []
    for lock in locks:
        holder = lock_holder(lock)
        if holder is not None:
            alive = holder.isdigit() and Path(f"/proc/{holder}").exists()
            held.append(f"{lock.parent.name}: held by pid {holder}{'' if alive else ' (not running?)'}")
    summary = f"{len(held)} of {len(locks)} workspace lock(s) held right now"
    return _check("locks", "ok", summary, held + (["a held lock is normal while a checkpoint is written; the "
                                                   "kernel frees it if its holder dies"] if held else []))


def check_repos(docs: Path) -> list[Check]:
    """Each shadow repo: it opens, its workspace exists, every ref resolves to an object it holds."""
    root = docs / "checkpoints"
    git_dirs = sorted(d / ".git" for d in root.iterdir() if (d / ".git").is_dir()) if root.is_dir() else []
    out = []
    for git_dir in git_dirs:
        name = f"shadow repo {git_dir.parent.name}"
        try:
            repo = ShadowRepo.open_existing(git_dir)
        except ShadowpointError as exc:
            out.append(_check(name, "problem", f"does not open: {exc}",
                              ["the next checkpoint of its workspace repairs or rebuilds it"]))
            continue
        try:
            problems = []
            worktree = str(repo.worktree)
            if not worktree or not Path(worktree).is_dir():
                problems.append(f"its workspace {worktree or '(none recorded)'} is gone")
            refs = repo.list_refs()
            names = [n for n in _all_refs(repo) if n not in refs]
            problems += [f"ref {n} does not resolve" for n in names]
            problems += [f"ref {n} points at a missing commit {c[:10]}" for n, c in refs.items()
                         if not repo.has_object(c)]
        except ShadowpointError as exc:
            problems = [f"refs unreadable: {exc}"]
        finally:
            repo.close()
        status = "problem" if any("ref" in p for p in problems) else ("warning" if problems else "ok")
        summary = f"{worktree}: {len(refs)} ref(s) resolve" if status == "ok" else "; ".join(problems[:3])
        details = problems[3:]
        if worktree and not Path(worktree).is_dir():
            details.append(f"{kept_checkpoints_hint(worktree)}; `shadowpoint storage` shows its tasks, "
                           "`shadowpoint delete-task ID` lets them go")
        out.append(_check(name, status, summary, details))
    return out


def _all_refs(repo: ShadowRepo) -> list[str]:
    """Every shadowpoint ref name, including those whose target does not resolve."""
    refs_dir = repo.git_dir / "refs" / "shadowpoint"
    names = [f"refs/shadowpoint/{p.relative_to(refs_dir).as_posix()}" for p in refs_dir.rglob("*") if p.is_file()]
    packed = repo.git_dir / "packed-refs"
    with contextlib.suppress(OSError):
        for line in packed.read_text(errors="replace").splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[1].startswith("refs/shadowpoint/"):
                names.append(parts[1])
    return sorted(set(names))


def run_checks(settings: Settings, workspace: Path | None) -> list[Check]:
    """Every check, in the order `doctor` prints them."""
    docs = settings.resolved_docs_dir()
    from shadowpoint.adapters.health import check_agents

    return [check_watch_limits(workspace), check_docs(docs), check_sidecars(), check_locks(docs),
            *check_repos(docs), *check_agents(workspace)]
