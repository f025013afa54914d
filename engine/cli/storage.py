"""The command line's storage commands: `storage` (what each shadow repository and task uses;
`--gc` collects garbage) and `delete-task`.

Runs on the main thread; `delete-task` deletes through the sidecar serving the workspace when
one runs, else here (`quick.delete_task_here`, shared with the command that starts without
click), leaving the collection to a background process.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from shadowpoint.cli.context import Ctx, backend_for, confirm, dir_option, isolate, pass_ctx
from shadowpoint.cli.report import fail, print_json


@click.command()
@click.option("--gc", "gc", is_flag=True, help="collect garbage: drop objects no task reaches")
@click.option("--grace", type=float, default=None,
              help="with --gc: keep unreachable loose objects younger than this (s; default: gc_grace_s)")
@click.option("--only", "only", multiple=True, hidden=True, help="with --gc: only this workspace hash")
@click.option("--quiet", is_flag=True, hidden=True, help="print nothing (the background collection)")
@click.option("--json", "as_json", is_flag=True, help="print JSON")
@dir_option
@pass_ctx
def storage(ctx: Ctx, gc: bool, grace: float | None, only: tuple[str, ...], quiet: bool, as_json: bool) -> None:
    """What each workspace's shadow repo and each task uses; --gc reclaims space.

    A collection can be interrupted (Ctrl-C) at any time without harm; the next one goes on
    from the packs already written.
    """
    from shadowpoint.store import storage as store
    from shadowpoint.store.shadow_repo import limit_mapped_memory

    settings = ctx.settings
    isolate()
    limit_mapped_memory(STORAGE_MAPPED_BYTES)
    docs = settings.resolved_docs_dir()
    collected: dict[str, Any] = {}
    if gc:
        grace_s = settings.gc_grace_s if grace is None else grace
        collected = _collect(ctx, docs, grace_s, settings.lock_timeout_s, only, show=not quiet and not as_json)
    if quiet:
        return
    report = store.storage_report(docs)
    if as_json:
        print_json({**report, "collected": collected} if gc else report)
        return
    from rich.table import Table

    ctx.out.print(f"Storage under {report['docsDir']}: {_size(report['totalBytes'])}")
    for ws in report["workspaces"]:
        name = ws.get("worktree") or ws["workspaceHash"]
        ctx.out.print(f"\n{name}: shadow repo {_size(ws['bytes'])} ({ws['shadowGitDir']})")
        if ws.get("error"):
            ctx.out.print(f"  unreadable: {ws['error']}")
        if ws.get("collectionPending") and ws["workspaceHash"] not in collected:
            ctx.out.print("  a deleted task's space is not reclaimed yet: `shadowpoint storage --gc` does it")
        if not ws["tasks"]:
            continue
        table = Table(box=None, padding=(0, 2), show_edge=False)
        for col in ("task", "checkpoints", "only this task", "last activity"):
            table.add_column(col)
        for t in ws["tasks"]:
            table.add_row(t["taskId"], str(t["checkpoints"]), _size(t.get("uniqueBytes", 0)),
                          str(t.get("lastActivity", ""))[:19].replace("T", " "))
        ctx.out.print(table)
    for h, info in collected.items():
        ctx.out.print(f"collected {h}: kept {info['kept']} objects, freed {_size(info['freedBytes'])}")


STORAGE_MAPPED_BYTES = 64 << 20  # pack memory `storage` keeps mapped: it reads every object once


def _collect(ctx: Ctx, docs: Path, grace: float, lock_timeout_s: float, only: tuple[str, ...] = (),
             show: bool = True) -> dict[str, Any]:
    from shadowpoint.store import storage as store

    root = docs / "checkpoints"
    git_dirs = sorted(d / ".git" for d in root.iterdir() if (d / ".git").is_dir()) if root.is_dir() else []
    if only:
        git_dirs = [g for g in git_dirs if g.parent.name in only]
    if not show or not ctx.err.is_terminal:
        return store.collect_garbage(docs, grace_s=grace, lock_timeout_s=lock_timeout_s, only=git_dirs)
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    out: dict[str, Any] = {}
    with Progress(TextColumn("Collecting garbage in {task.fields[name]}"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("objects"), TimeElapsedColumn(), console=ctx.err, transient=True) as progress:
        for g in git_dirs:
            bar = progress.add_task("gc", total=None, name=g.parent.name)

            def step(_: Path, done: int, total: int, bar: Any = bar) -> None:
                progress.update(bar, completed=done, total=total)

            out.update(store.collect_garbage(docs, grace_s=grace, lock_timeout_s=lock_timeout_s, only=[g],
                                             progress=step))
            progress.remove_task(bar)
    return out


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


@click.command(name="delete-task")
@click.argument("task_id")
@click.option("-y", "--yes", is_flag=True, help="do not ask for confirmation")
@click.option("--no-collect", "no_collect", is_flag=True,
              help="leave the freed space for a later `shadowpoint storage --gc`")
@click.option("--json", "as_json", is_flag=True, help="print JSON")
@dir_option
@pass_ctx
def delete_task(ctx: Ctx, task_id: str, yes: bool, no_collect: bool, as_json: bool) -> None:
    """Delete a task's checkpoints (the shared shadow repo stays for the other tasks).

    Returns at once; the space the task alone used is reclaimed in the background.
    Your files are not touched.
    """
    from shadowpoint.cli.quick import delete_task_here, deleted_json, deleted_text
    from shadowpoint.sidecar.client import connect_live
    from shadowpoint.store.checkpoints import CheckpointStore

    settings = ctx.settings
    isolate()
    docs = settings.resolved_docs_dir()
    rec = CheckpointStore(docs).load(task_id)
    roots = list(rec.roots.values())
    if not roots:
        fail(f"Task {task_id} names no workspace.", "unknown_task")
    confirm(ctx, f"Delete task {task_id}: its {len(rec.checkpoints)} checkpoint(s) and conversation marks "
                  f"for {', '.join(roots)}? Your files stay as they are.", yes,
             refusal=f"Deleting task {task_id} removes its {len(rec.checkpoints)} checkpoint(s): pass --yes to "
                     "confirm (there is no terminal to ask on).")
    live = connect_live(Path(roots[0]))
    background = False
    if live is not None:
        # The sidecar serving the workspace holds the task: it deletes it and collects itself.
        live.close()
        with backend_for(ctx, roots[0]) as backend:
            backend.delete_task(task_id)
    else:
        background = delete_task_here(docs, rec, no_collect=no_collect, gc_grace_s=settings.gc_grace_s)
    if as_json:
        print_json(deleted_json(task_id, background))
        return
    ctx.out.print(deleted_text(task_id, roots, len(rec.checkpoints), background))


COMMANDS = (storage, delete_task)
