"""The command line's restores: `restore` (with the plan it shows before it runs, and prints
for `--dry-run`), `undo` and `redo`.

Runs on the main thread, through the backend (the sidecar serving the workspace, or an
in-process engine); the checkpoint a ref names comes from `history.resolve_ref`.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from shadowpoint.cli.context import (
    Ctx,
    backend_for,
    checkpoints_of,
    confirm,
    dir_option,
    pass_ctx,
    task_for,
    task_option,
)
from shadowpoint.cli.history import load_record, resolve_ref, split_refs_and_paths, unknown_paths
from shadowpoint.cli.report import fail, header, print_json, when
from shadowpoint.workspace import at_or_under

if TYPE_CHECKING:
    from shadowpoint.sidecar.backend import Backend


@click.command()
@click.argument("ref")
@click.argument("paths", nargs=-1)
@click.option("--files", "files_mode", is_flag=True, help="restore the files only")
@click.option("--task", "task_mode", is_flag=True, help="restore the task only (cut the conversation)")
@click.option("--both", "both_mode", is_flag=True, help="restore files and task")
@click.option("--dry-run", is_flag=True, help="change nothing: print what the restore would do")
@click.option("--keep-mine", is_flag=True, help="keep edits made outside the task's rounds (three-way merge)")
@click.option("-y", "--yes", is_flag=True, help="do not ask for confirmation")
@dir_option
@task_option
@click.option("--json", "as_json", is_flag=True, help="print the Restore result as JSON")
@pass_ctx
def restore(ctx: Ctx, ref: str, paths: tuple[str, ...], files_mode: bool, task_mode: bool, both_mode: bool,
            dry_run: bool, keep_mine: bool, yes: bool, task_id: str | None, as_json: bool) -> None:
    """Restore checkpoint REF: --files, --task or --both (asks first unless --yes).

    PATHS (after REF, or after `--`) restores only those files and folders. The question
    shows exactly what the restore does, and which changed files it leaves alone and why.
    """
    mode = one_mode(files=files_mode, task=task_mode, both=both_mode)
    if mode is None:
        mode = "files" if paths else None
    if mode is None:
        fail("Say what to restore: --files, --task or --both.", "usage")
    named = [os.path.abspath(p) for p in paths] if paths else None  # -C DIR is the current folder by now
    with backend_for(ctx, None) as backend:
        task = task_for(ctx, backend, task_id)
        cp = resolve_ref(ctx, backend, task, ref)
        label = f"#{cp['position']} ({str(cp.get('hash') or 'no snapshot')[:10]}, {cp['kind']}, " \
                f"{when(cp['createdAt'])})"
        files_part = mode in ("files", "both") and bool(cp.get("hash"))
        changes = changed_since(backend, task, cp) if files_part else []
        if paths and files_part:
            refuse_unknown_paths(backend, task, cp, paths, changes)
        try:
            plan = run_restore(backend, task, cp, mode, named, True, keep_mine) if files_part or dry_run else {}
        except Exception as exc:
            if getattr(exc, "kind", None) != "already_restored":
                raise
            # the engine names the checkpoint by its ts; people know it as `list` shows it
            fail(f"The files are already restored to checkpoint {label}; save a new checkpoint first.",
                 "already_restored")
        lines = [f"{'Would restore' if dry_run else 'Restore'} {'files and task' if mode == 'both' else mode} "
                 f"of task {task} to checkpoint {label}."]
        if files_part and plan.get("files") is not None:
            record = load_record(ctx, task)
            scope = {p for name in (record.roots if record else {}) for p in record.scope_paths(name)} \
                if record is not None and record.has_scope() else None
            alone = left_alone([f["path"] for f in changes], plan["files"], scope=scope, named=named is not None,
                               keep_mine=keep_mine, ref=ref)
            lines += plan_lines(plan["files"], alone)
            if not dry_run:
                lines.append("A safety checkpoint is taken first; `shadowpoint undo` puts the files back.")
        elif plan.get("error"):
            lines.append(f"the files cannot be restored: {plan['error'].get('message')}")
        if mode in ("task", "both") and cp.get("safety") is None:
            record = load_record(ctx, task)
            lines += cut_lines(checkpoints_of(backend, task), record.messages if record else [], int(cp["ts"]))
        if dry_run:
            if as_json:
                print_json({"taskId": task, "checkpoint": cp, **plan})
            else:
                ctx.out.print(header(task, backend.root))
                ctx.out.print("\n".join(lines))
            return
        asking = not yes and sys.stdin.isatty()
        if asking and not as_json:  # the header above the question (stderr) and the result under it
            ctx.out.print(header(task, backend.root))
        if asking:
            sys.stderr.write("\n".join(lines) + "\n")
        confirm(ctx, "Go ahead?", yes)
        result = run_restore(backend, task, cp, mode, named, False, keep_mine)
    if as_json:
        print_json({"taskId": task, "checkpoint": cp, **result})
    else:
        if not asking:
            ctx.out.print(header(task, backend.root))
        files = result.get("files")
        if files:
            merged = f", merged {len(files.get('merged', []))}" if files.get("merged") else ""
            ctx.out.print(f"restored {len(files['restored'])} file(s), deleted {len(files['deleted'])}{merged} "
                          f"(safety checkpoint {str(files['safety'])[:10]}; `shadowpoint undo` reverts)")
        if result.get("task"):
            ctx.out.print(f"task cut after checkpoint {label}")
    if result.get("error"):
        err = result["error"]
        fail(err.get("message", "restore failed"), err.get("kind", "restore_failed"))


@click.command()
@dir_option
@task_option
@click.option("--json", "as_json", is_flag=True, help="print the Restore result as JSON")
@pass_ctx
def undo(ctx: Ctx, task_id: str | None, as_json: bool) -> None:
    """Undo the last file restore of the task (puts back exactly the files it touched); again for
    the one before it, and so on."""
    step(ctx, task_id, as_json, "undo")


@click.command()
@dir_option
@task_option
@click.option("--json", "as_json", is_flag=True, help="print the Restore result as JSON")
@pass_ctx
def redo(ctx: Ctx, task_id: str | None, as_json: bool) -> None:
    """Redo the last undone file restore (walks forward through what `undo` walked back)."""
    step(ctx, task_id, as_json, "redo")


def step(ctx: Ctx, task_id: str | None, as_json: bool, op: str) -> None:
    """`undo` or `redo`: one step along the task's undo stack, and what it wrote."""
    with backend_for(ctx, None) as backend:
        task = task_for(ctx, backend, task_id)
        result = backend.undo_restore(task) if op == "undo" else backend.redo_restore(task)
    if as_json:
        print_json({"taskId": task, **result})
        return
    files = result.get("files") or {}
    other = "redo" if op == "undo" else "undo"
    ctx.out.print(header(task, backend.root))
    ctx.out.print(f"{op}ne: {len(files.get('restored', []))} file(s) written, {len(files.get('deleted', []))} "
                  f"removed (safety checkpoint {str(files.get('safety'))[:10]}; `shadowpoint {other}` reverts)")


def changed_since(backend: Backend, task: str, cp: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The files that differ between checkpoint `cp` (a safety checkpoint too) and the workspace."""
    diff = backend.diff(task, cp["ts"], None) if cp.get("safety") is None \
        else backend.diff_safety(task, int(cp["safety"]))
    files: list[dict[str, Any]] = diff["files"]
    return files


def refuse_unknown_paths(backend: Backend, task: str, cp: Mapping[str, Any], paths: tuple[str, ...],
                         changes: list[dict[str, Any]]) -> None:
    """Fail (path_outside_workspace) for the first of `paths` that names nothing on disk, in the
    checkpoint or in the newest one (git's "pathspec did not match"), before anything is written;
    `changes` is `changed_since(cp)`."""
    from shadowpoint.sidecar.backend import resolve_checkpoint

    _, rel = split_refs_and_paths(paths, len(paths), Path(os.getcwd()), backend.root)
    named = dict(zip(paths, rel, strict=True))

    def newest_changes() -> list[dict[str, Any]]:
        newest = resolve_checkpoint(checkpoints_of(backend, task), "@1")
        files: list[dict[str, Any]] = [] if newest["ts"] == cp.get("ts") else \
            backend.diff(task, newest["ts"], None)["files"]
        return files

    unknown = unknown_paths(named, backend.root, changes, newest_changes)
    if unknown:
        fail(f"{unknown[0]!r} names no path in the workspace, in checkpoint #{cp['position']} or in the newest "
             "checkpoint; nothing was restored.", "path_outside_workspace")


def cut_lines(cps: list[dict[str, Any]], messages: Iterable[Any], ts: int, *, limit: int = 40) -> list[str]:
    """The task part of a restore's plan: which checkpoints (by #N) and how many messages after
    `ts` leave the task."""
    gone = [c for c in cps if c["ts"] > ts]
    said = sum(1 for m in messages if m.ts > ts)
    if not gone and not said:
        return ["nothing leaves the task: no checkpoint or message after it"]
    lines = [f"leave the task: {len(gone)} checkpoint{'s' if len(gone) != 1 else ''} and {said} "
             f"message{'s' if said != 1 else ''} after it{':' if gone else ''}"]
    lines += [f"  #{c['position']} ({str(c.get('hash') or 'no snapshot')[:10]}, {c['kind']}, {when(c['createdAt'])})"
              for c in gone[:limit]]
    if len(gone) > limit:
        lines.append(f"  … and {len(gone) - limit} more")
    return lines


def one_mode(**flags: bool) -> str | None:
    """The one of --files, --task, --both given (None: none).

    Raises:
        click.UsageError: two different ones (which wins would be a guess).
    """
    given = [name for name, on in flags.items() if on]
    if len(given) > 1:
        raise click.UsageError(f"{' and '.join('--' + g for g in given)} contradict each other: give one of "
                               "--files, --task or --both.")
    return given[0] if given else None


def run_restore(backend: Backend, task: str, cp: Mapping[str, Any], mode: str, paths: list[str] | None,
                dry_run: bool, keep_mine: bool) -> dict[str, Any]:
    """`backend.restore`, or the restore to a safety checkpoint (files only) when `cp` is one."""
    if cp.get("safety") is None:
        return backend.restore(task, cp["ts"], mode, paths, dry_run, keep_mine)
    if mode != "files":
        fail("A safety checkpoint holds files only: restore it with --files.", "usage")
    return backend.restore_safety(task, int(cp["safety"]), paths, dry_run, keep_mine)


# ---------------------------------------------------------------------------- the restore plan


@dataclass(frozen=True, slots=True)
class LeftAlone:
    path: str
    why: str


def left_alone(changed: Iterable[str], files: Mapping[str, Any], *, scope: set[str] | None,
               named: bool, keep_mine: bool, ref: str) -> list[LeftAlone]:
    """The changed files (checkpoint → workspace) a restore leaves as they are, and why, naming
    the flag or the paths form that would include them."""
    planned = set(files.get("restored", [])) | set(files.get("deleted", [])) | set(files.get("merged", [])) | set(
        files.get("conflicts", []))
    out = []
    for path in changed:
        if path in planned:
            continue
        if named:
            why = "not among the paths named"
        elif keep_mine and (scope is None or at_or_under(path, scope)):
            why = "only edits made outside the task's rounds since then: kept by --keep-mine (leave it out to reset)"
        else:
            why = (f"changed outside the task's rounds (not in its scope); to restore it too: "
                   f"shadowpoint restore {ref} --files -- {path}")
        out.append(LeftAlone(path, why))
    return out


def plan_lines(files: Mapping[str, Any], alone: list[LeftAlone], *, limit: int = 40) -> list[str]:
    """The plan of a file restore as lines for people (the confirmation and `--dry-run`)."""
    lines = []
    for key, label in (("restored", "restore"), ("deleted", "delete"), ("merged", "merge"),
                       ("conflicts", "conflict")):
        paths = list(files.get(key) or [])
        if not paths:
            continue
        lines.append(f"{label} {len(paths)} file{'s' if len(paths) != 1 else ''}:")
        lines += [f"  {p}" for p in paths[:limit]]
        if len(paths) > limit:
            lines.append(f"  … and {len(paths) - limit} more")
    if not any(files.get(k) for k in ("restored", "deleted", "merged", "conflicts")):
        lines.append("nothing to change: the files in scope are as in the checkpoint")
    if files.get("conflicts"):
        lines.append("with conflicts the restore is refused and writes nothing (drop --keep-mine, "
                     "or name other paths)")
    if alone:
        lines.append(f"left alone {len(alone)} changed file{'s' if len(alone) != 1 else ''}:")
        lines += [f"  {a.path}: {a.why}" for a in alone[:limit]]
        if len(alone) > limit:
            lines.append(f"  … and {len(alone) - limit} more")
    return lines


COMMANDS = (restore, undo, redo)
