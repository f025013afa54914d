"""The command line's task history: `save`, `list`, `diff`, `status`, `log` (the timeline of
messages, checkpoints, restores, undos, redos and forks, with their safety checkpoints) and
`fork`, with what `restore` shares from them (`load_record`, `resolve_ref`).

Runs on the main thread. Reads checkpoints through the backend (the sidecar serving the
workspace, or an in-process engine) and a task's history from its record on disk (written by
whichever engine holds the task).
"""

from __future__ import annotations

import html
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from shadowpoint.cli.context import (
    Ctx,
    args_after_dashes,
    backend_for,
    checkpoints_of,
    dir_option,
    is_unknown_task,
    paged,
    pager_option,
    pass_ctx,
    task_for,
    task_option,
    wait_ready,
    workspace_for,
)
from shadowpoint.cli.report import fail, header, print_json, rich_console, when

if TYPE_CHECKING:
    from shadowpoint.sidecar.backend import Backend
    from shadowpoint.store.checkpoints import TaskRecord


def load_record(ctx: Ctx, task_id: str) -> TaskRecord | None:
    """The task's record on disk (None when it cannot be read)."""
    from shadowpoint.errors import ShadowpointError
    from shadowpoint.store.checkpoints import CheckpointStore

    try:
        return CheckpointStore(ctx.settings.resolved_docs_dir()).load(task_id)
    except ShadowpointError:
        return None


# ---------------------------------------------------------------------------- safety checkpoints


OP_WORDS = {"restore": "restore", "undo": "undo", "redo": "redo"}


def safety_rows(record: TaskRecord | None) -> list[dict[str, Any]]:
    """One row per safety checkpoint of the task (each file restore, undo and redo takes one),
    newest first: `{n, op, ts, of, hash, hashes, after, createdAt, paths}`."""
    if record is None:
        return []
    rows = []
    for entry in reversed(record.restores):
        roots = entry.get("roots") or {}
        hashes = {name: r.get("safety") for name, r in roots.items() if r.get("safety")}
        first = next(iter(hashes.values()), None)
        rows.append({"n": entry.get("n"), "op": entry.get("op", "restore"), "ts": entry.get("ts"),
                     "of": entry.get("of"), "hash": first, "hashes": hashes,
                     "after": {name: r.get("after") for name, r in roots.items()},
                     "createdAt": entry.get("createdAt"),
                     "paths": sum(len(r.get("paths", [])) for r in roots.values())})
    return rows


def checkpoint_at(ts: int | None, cps: list[dict[str, Any]]) -> str:
    """The checkpoint of `ts` as people name it: `#N (hash prefix)`, or its time once cut from the task."""
    cp = next((c for c in cps if c["ts"] == ts), None)
    if ts is None:
        return "a checkpoint"
    if cp is None:
        return f"the checkpoint of {when(ts)} (no longer in the task)"
    return f"#{cp['position']} ({str(cp.get('hash') or 'no snapshot')[:10]})"


def describe_safety(row: Mapping[str, Any], cps: list[dict[str, Any]]) -> str:
    if row["op"] == "restore":
        what = f"before restore {row['n']} to {checkpoint_at(row['ts'], cps)}" if row.get("ts") is not None else \
            f"before restore {row['n']}"
    else:
        what = f"before {row['op']} of restore {row.get('of')}"
    return f"{what} ({row['paths']} path{'s' if row['paths'] != 1 else ''})"


def resolve_ref(ctx: Ctx, backend: Backend, task: str, ref: str) -> dict[str, Any]:
    """The checkpoint `ref` names (position or hash prefix), else the safety checkpoint whose
    hash starts with it: then `{safety: n, kind: "safety", ts: None, hash, hashes, position,
    createdAt}` (n: the restore it was taken before).

    Raises:
        UnknownCheckpointError: neither matches.
        AmbiguousCheckpointError: the prefix matches several safety checkpoints.
    """
    from shadowpoint.errors import AmbiguousCheckpointError, UnknownCheckpointError
    from shadowpoint.sidecar.backend import resolve_checkpoint

    try:
        return resolve_checkpoint(checkpoints_of(backend, task), ref)
    except UnknownCheckpointError:
        prefix = ref.strip().lower()
        rows = [r for r in safety_rows(load_record(ctx, task))
                if len(prefix) >= 5 and any(h.startswith(prefix) for h in r["hashes"].values())]
        if not rows:
            raise
        if len({r["hash"] for r in rows}) > 1:
            raise AmbiguousCheckpointError(f"{ref} matches {len(rows)} safety checkpoints; give more digits.") from None
    row = rows[0]
    return {"safety": row["n"], "kind": "safety", "ts": None, "hash": row["hash"], "hashes": row["hashes"],
            "position": f"safety {row['n']}", "createdAt": row["createdAt"], "restored": False}


@click.command()
@click.argument("positional_dir", metavar="[DIR]", required=False, type=click.Path(file_okay=False, exists=True))
@dir_option
@click.option("-m", "--message", default=None, help="a note stored with the checkpoint")
@click.option("--task-id", "task_id", default=None,
              help="task id (default: the workspace's latest; cli-<workspace hash> for a new one)")
@click.option("--json", "as_json", is_flag=True, help="print the checkpoint as JSON")
@pass_ctx
def save(ctx: Ctx, positional_dir: str | None, message: str | None, task_id: str | None, as_json: bool) -> None:
    """Checkpoint the workspace now (in its default task, the one `list` shows)."""
    from shadowpoint.sidecar.backend import now_ms

    with backend_for(ctx, positional_dir) as backend:
        task = task_for(ctx, backend, task_id, create=True)
        try:
            backend.task_state(task)
            is_new = False
        except Exception as exc:
            if not is_unknown_task(exc):
                raise
            is_new = True
        ts = now_ms()
        backend.start_task(task, ts)
        state = wait_ready(ctx, backend, task)
        if state["state"] != "ready":
            error = state.get("error") or {}
            fail(error.get("message", f"checkpoints are off for task {task}"), error.get("kind", "init_failed"))
        if is_new:
            # The baseline just built is the checkpoint asked for: no second, identical one.
            cp = next(c for c in backend.list_checkpoints(task)["checkpoints"] if c["kind"] == "baseline")
            if message:
                backend.add_message(task, cp["ts"], "user", message)
        else:
            cp = backend.save(task, max(ts + 1, now_ms()), message) or {}
    if as_json:
        print_json({"taskId": task, "workspace": str(backend.root), "checkpoint": cp})
        return
    what = "baseline" if is_new else ("unchanged since the last one" if cp.get("reused") else "saved")
    ctx.out.print(header(task, backend.root))
    ctx.out.print(f"checkpoint #1 {str(cp.get('hash') or '—')[:10]} ({what})")


@click.command(name="list")
@click.argument("positional_dir", metavar="[DIR]", required=False, type=click.Path(file_okay=False, exists=True))
@dir_option
@click.option("--task", "--task-id", "task_id", default=None, help="task id (default: the workspace's latest)")
@click.option("--tasks", "show_tasks", is_flag=True, help="list the workspace's tasks instead")
@click.option("--all", "show_all", is_flag=True, help="also list the safety checkpoints of restores, undos, redos")
@click.option("--json", "as_json", is_flag=True, help="print JSON")
@pager_option
@pass_ctx
def list_cmd(ctx: Ctx, positional_dir: str | None, task_id: str | None, show_tasks: bool, show_all: bool,
             as_json: bool, no_pager: bool) -> None:
    """List the checkpoints of a task, newest first (# is what other commands accept)."""
    from shadowpoint.cli.render import checkpoint_table

    if show_tasks:
        _list_tasks(ctx, positional_dir, as_json)
        return
    with backend_for(ctx, positional_dir, read_only=True) as backend:
        task = task_for(ctx, backend, task_id)
        result = backend.list_checkpoints(task)
        cps = checkpoints_of(backend, task)
        messages = backend.messages(task)
    safety = safety_rows(load_record(ctx, task)) if show_all else []
    if as_json:
        print_json({"taskId": task, "workspace": str(backend.root), "state": result.get("state"),
                     "checkpoints": cps, **({"safety": safety} if show_all else {})})
        return
    state = str(result.get("state"))
    state = {"ready": "", "initializing": "baseline being built"}.get(state, state)
    table = checkpoint_table(cps, messages, header(task, backend.root, state))
    with paged(not no_pager) as out:
        if out is sys.stdout:
            ctx.out.print(table)
        else:
            rich_console(file=out, force_terminal=ctx.out.is_terminal, width=ctx.out.width,
                         highlight=False).print(table)
        if show_all:
            out.write(f"Safety checkpoints ({len(safety)}; name one by its hash in diff or restore):\n")
            for row in safety:
                out.write(f"  {str(row['hash'])[:10]}  {when(row['createdAt'])}  {describe_safety(row, cps)}\n")


def _list_tasks(ctx: Ctx, directory: str | None, as_json: bool) -> None:
    from datetime import datetime

    from rich.table import Table

    from shadowpoint.sidecar.backend import last_activity, workspace_tasks

    root = workspace_for(ctx, directory)
    tasks = workspace_tasks(ctx.settings.resolved_docs_dir(), root)
    rows: list[dict[str, Any]] = [
        {"taskId": t.task_id, "checkpoints": len(t.checkpoints), "createdAt": t.created_at,
         "lastActivity": datetime.fromtimestamp(last_activity(t)).astimezone().isoformat(timespec="seconds")}
        for t in tasks]
    if as_json:
        print_json({"workspace": str(root), "tasks": rows, "default": rows[0]["taskId"] if rows else None})
        return
    table = Table(title=f"Tasks of {root} (the first is the default)", title_justify="left")
    for col in ("task", "checkpoints", "last activity"):
        table.add_column(col)
    for r in rows:
        table.add_row(str(r["taskId"]), str(r["checkpoints"]), str(r["lastActivity"]).replace("T", " "))
    ctx.out.print(table)


# ---------------------------------------------------------------------------- diff / status


def split_refs_and_paths(args: tuple[str, ...], after_dashes: int | None, cwd: Path,
                         root: Path) -> tuple[list[str], list[str]]:
    """`diff [REF [REF2]] [--] [PATH…]` as git reads it. With `--` (`after_dashes` is how many
    arguments followed it), what precedes it are refs; without, leading arguments that name
    checkpoints and are not existing paths are refs (up to two), the rest paths. Paths become
    workspace-relative.

    Raises:
        CliError: more than two refs (usage); a path outside the workspace (path_outside_workspace).
    """
    from shadowpoint.sidecar.backend import looks_like_checkpoint

    if after_dashes is not None:
        refs, paths = list(args[: len(args) - after_dashes]), list(args[len(args) - after_dashes:])
        if len(refs) > 2:
            fail(f"At most two checkpoints before `--`, got {len(refs)}: {' '.join(refs)}.", "usage")
    else:
        refs, paths = [], []
        for arg in args:
            if len(refs) < 2 and not paths and looks_like_checkpoint(arg) and not (cwd / arg).exists():
                refs.append(arg)
            else:
                paths.append(arg)
    rel: list[str] = []
    for p in paths:
        full = Path(os.path.normpath(cwd / p))
        if full != root and root not in full.parents:
            fail(f"{p} is outside the workspace {root}.", "path_outside_workspace")
        rel.append("" if full == root else full.relative_to(root).as_posix())
    return refs, rel


def unknown_paths(named: Mapping[str, str], root: Path, files: list[dict[str, Any]],
                  more: Callable[[], list[dict[str, Any]]] | None = None) -> list[str]:
    """The arguments of `named` ({argument: workspace-relative path}) that name no path on disk
    and none of `files` (a Diff's: what a compared snapshot holds that the disk does not), nor
    of `more()` (another snapshot's Diff against the disk, asked for only when some are left)."""
    unknown = [arg for arg, rel in named.items()
               if not os.path.lexists(root / rel)
               and not any(_under(f["path"], [rel]) or _under(f.get("oldPath") or "", [rel]) for f in files)]
    if unknown and more is not None:
        return unknown_paths({arg: named[arg] for arg in unknown}, root, more())
    return unknown


def _under(path: str, wanted: list[str]) -> bool:
    return not wanted or any(not w or path == w or path.startswith(w + "/") for w in wanted)


@click.command(context_settings={"ignore_unknown_options": False})
@click.argument("args", nargs=-1, metavar="[REF [REF2]] [--] [PATH]...")
@dir_option
@click.option("--task", "--task-id", "task_id", default=None, help="task id (default: the workspace's latest)")
@click.option("--json", "as_json", is_flag=True, help="print the Diff as JSON")
@click.option("--html", "html_file", type=click.Path(dir_okay=False, writable=True), default=None,
              help="also write a side-by-side HTML page to this file")
@click.option("--stat", "stat_only", is_flag=True, help="a summary per file instead of the diff")
@click.option("--color/--no-color", "color", default=None, help="force colour on or off (default: on a terminal)")
@pager_option
@pass_ctx
def diff(ctx: Ctx, args: tuple[str, ...], task_id: str | None, as_json: bool, html_file: str | None,
         stat_only: bool, color: bool | None, no_pager: bool) -> None:
    """Compare checkpoint REF (default: the newest) with the workspace, or with REF2; PATHs
    (files or folders) limit the comparison to them."""
    from shadowpoint.cli.render import stat_lines, unified_diff_lines, use_color
    from shadowpoint.sidecar.backend import resolve_checkpoint

    with backend_for(ctx, None, read_only=True) as backend:
        after_dashes = args_after_dashes(args)
        refs, paths = split_refs_and_paths(args, after_dashes, Path(os.getcwd()), backend.root)
        task = task_for(ctx, backend, task_id)
        cps = checkpoints_of(backend, task)
        old = resolve_ref(ctx, backend, task, refs[0] if refs else "@1")  # a safety checkpoint's hash too
        new = resolve_checkpoint(cps, refs[1]) if len(refs) > 1 else None
        result = backend.diff(task, old["ts"], new["ts"] if new else None) if old.get("safety") is None or new \
            else backend.diff_safety(task, int(old["safety"]))
        # without `--`, a word that names no checkpoint must be a path (git's "ambiguous argument")
        named = dict(zip(args[len(refs):], paths, strict=True)) if after_dashes is None else {}
        # a path in both snapshots, unchanged, gone from the disk since: in REF2's diff to the disk
        unknown = unknown_paths(named, backend.root, result["files"],
                                (lambda: backend.diff(task, new["ts"], None)["files"]) if new is not None else None)
    if unknown:
        fail(f"{unknown[0]!r} names no checkpoint and no path in the workspace or the checkpoints compared "
             "(a checkpoint is its position in `shadowpoint list` or 5+ hex digits of its hash; put paths "
             "after `--`).", "unknown_checkpoint")
    result = {**result, "files": [f for f in result["files"]
                                  if _under(f["path"], paths) or _under(f.get("oldPath") or "", paths)]}
    against = f"checkpoint #{new['position']}" if new else "the workspace"
    title = f"{result['title']}: #{old['position']} ({str(old.get('hash') or '')[:10]}) → {against}"
    if html_file:
        from shadowpoint.cli.html_diff import diff_page

        write_page(html_file, diff_page(result, title, task=task, workspace=str(backend.root)))
    if as_json:
        print_json({"taskId": task, "workspace": str(backend.root), "from": old, "to": new, **result})
        return
    painted = use_color(sys.stdout, color)
    lines = stat_lines(result, color=painted) if stat_only else unified_diff_lines(result, color=painted)
    head = f"{header(task, backend.root)}\n{title}\n"
    with paged(not no_pager) as out:
        for_people = out if out is not sys.stdout or sys.stdout.isatty() else sys.stderr  # piped: a clean diff
        for_people.write(head)
        if not result["files"]:
            for_people.write("No changes.\n")
            lines = iter(())  # not even --stat's "0 files changed": nothing on stdout, as git
        for line in lines:
            out.write(line)
    if html_file:
        sys.stderr.write(f"side-by-side page written to {html_file}\n")


@click.command()
@click.argument("paths", nargs=-1, metavar="[PATH]...")
@dir_option
@task_option
@click.option("--ignored", is_flag=True, help="also the changed files the exclusion rules leave out, and why")
@click.option("--json", "as_json", is_flag=True, help="print JSON")
@pass_ctx
def status(ctx: Ctx, paths: tuple[str, ...], task_id: str | None, ignored: bool, as_json: bool) -> None:
    """What changed since the newest checkpoint (--ignored: and what the rules leave out)."""
    from shadowpoint.sidecar.backend import resolve_checkpoint
    from shadowpoint.stage.exclusions import ignored_changes

    with backend_for(ctx, None, read_only=True) as backend:
        _, wanted = split_refs_and_paths(paths, len(paths), Path(os.getcwd()), backend.root)
        task = task_for(ctx, backend, task_id)
        newest = resolve_checkpoint(checkpoints_of(backend, task), "@1")
        files = backend.diff(task, newest["ts"], None)["files"]
        changed = [f for f in files if _under(f["path"], wanted)]
    checked = len(paths) - (args_after_dashes(paths) or 0)  # after `--`, any word is a path (as git)
    unknown = unknown_paths(dict(zip(paths[:checked], wanted, strict=False)), backend.root, files)
    if unknown:
        fail(f"{unknown[0]!r} names no path in the workspace or in checkpoint #1 (status takes paths; "
             "`shadowpoint diff REF` compares a checkpoint).", "unknown_checkpoint")
    left_out: list[dict[str, Any]] = []
    if ignored:
        since = _stamp_s(newest.get("createdAt", ""))
        left_out = [e for e in ignored_changes(backend.root, since, extra=ctx.settings.extra_exclusions,
                                               max_file_bytes=ctx.settings.max_file_bytes,
                                               docs_dir=ctx.settings.resolved_docs_dir())
                    if _under(e["path"].rstrip("/"), wanted)]
    if as_json:
        data: dict[str, Any] = {"taskId": task, "workspace": str(backend.root), "since": newest,
                                "changed": [{"path": f["path"], "status": f["status"]} for f in changed]}
        if ignored:
            data["ignored"] = left_out
        print_json(data)
        return
    out = ctx.out
    out.print(header(task, backend.root))
    out.print(f"Since checkpoint #1 ({str(newest.get('hash') or '')[:10]}, {_when_text(newest)}):")
    marks = {"added": "A", "modified": "M", "deleted": "D", "renamed": "R"}
    if not changed:
        out.print("  nothing changed")
    for f in changed:
        name = f"{f['oldPath']} → {f['path']}" if f.get("oldPath") else f["path"]
        out.print(f"  {marks.get(f['status'], '?')} {name}")
    if ignored:
        out.print("Changed but left out of checkpoints (re-include one with a `!pattern` in extra_exclusions):")
        if not left_out:
            out.print("  none")
        for e in left_out:
            out.print(f"  {e['path']}  ({e['why']})")


def _stamp_s(stamp: str) -> float:
    from datetime import datetime

    try:
        return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0


def _when_text(cp: dict[str, Any]) -> str:
    return when(cp.get("createdAt", ""))


# ---------------------------------------------------------------------------- fork / log


@click.command()
@click.argument("ref")
@click.argument("new_id")
@dir_option
@task_option
@click.option("--json", "as_json", is_flag=True, help="print the fork's newest checkpoint as JSON")
@pass_ctx
def fork(ctx: Ctx, ref: str, new_id: str, task_id: str | None, as_json: bool) -> None:
    """Fork the task at checkpoint REF into a new task NEW_ID (sharing its snapshots).

    Both lines stay: restore the fork's files to try another way from REF, and the first
    attempt is one restore away. The default task stays this one (positions keep naming the
    same checkpoints): name the fork with --task-id NEW_ID until it has a checkpoint of its own.
    """
    from shadowpoint.sidecar.backend import resolve_checkpoint

    with backend_for(ctx, None) as backend:
        task = task_for(ctx, backend, task_id)
        cp = resolve_checkpoint(checkpoints_of(backend, task), ref)
        forked = backend.fork(task, cp["ts"], new_id)
    if as_json:
        print_json({"taskId": new_id, "source": task, "checkpoint": forked})
        return
    ctx.out.print(header(task, backend.root))
    ctx.out.print(f"forked task {task} at #{cp['position']} ({str(forked.get('hash') or '—')[:10]}) into {new_id}; "
                  f"its files: shadowpoint restore 1 --files --task-id {new_id} (the default task stays {task}: "
                  f"name the fork with --task-id {new_id} until it has a checkpoint of its own)")


@click.command()
@dir_option
@task_option
@click.option("--json", "as_json", is_flag=True, help="print the timeline as JSON")
@click.option("--html", "html_file", type=click.Path(dir_okay=False, writable=True), default=None,
              help="also write the timeline as an HTML page to this file")
@pass_ctx
def log(ctx: Ctx, task_id: str | None, as_json: bool, html_file: str | None) -> None:
    """The task's timeline: messages, checkpoints, restores, undos, redos and forks, with the
    safety checkpoints (named by hash prefix in `diff` and `restore`)."""
    with backend_for(ctx, None, read_only=True) as backend:
        task = task_for(ctx, backend, task_id)
        cps = checkpoints_of(backend, task)
        root = backend.root
    events = timeline(load_record(ctx, task), cps)
    if html_file:
        write_page(html_file, timeline_page(task, str(root), events))
    if as_json:
        print_json({"taskId": task, "workspace": str(root), "events": events})
        return
    ctx.out.print(header(task, root))
    for e in events:
        ctx.out.print(f"{when(e.get('createdAt')):<19}  {e['kind']:<10} {e['text']}")
    if html_file:
        ctx.err.print(f"timeline page written to {html_file}")


def write_page(path: str, text: str) -> None:
    """Write an `--html` page. A path that cannot be written is bad input (exit 2, as click
    answers for an existing read-only file or a folder there), not an internal error."""
    try:
        Path(path).write_text(text, encoding="utf-8")
    except OSError as exc:
        fail(f"Cannot write the page to {path}: {exc.strerror or exc}.", "usage")


def timeline(record: TaskRecord | None, cps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The task's events in order: messages and checkpoints by ts, restores and forks after the
    newest checkpoint made before them."""
    positions = {c["ts"]: c["position"] for c in cps}
    items: list[tuple[int, str, dict[str, Any]]] = []  # (ts, createdAt, event)
    texts = {m.ts: m for m in record.messages} if record is not None else {}
    for ts, m in texts.items():
        if ts not in positions:
            items.append((ts, "", {"kind": "message", "ts": ts, "createdAt": None,
                                   "text": f"{m.role}: {(m.text or '').splitlines()[0][:80] if m.text else '—'}"}))
    for c in cps:
        msg = texts.get(c["ts"])
        note = f" · {msg.role}: {msg.text.splitlines()[0][:60]}" if msg is not None and msg.text else ""
        items.append((c["ts"], c.get("createdAt") or "", {
            "kind": "checkpoint", "ts": c["ts"], "createdAt": c.get("createdAt"), "hash": c.get("hash"),
            "text": f"#{c['position']} {c['kind']} {str(c.get('hash') or 'no snapshot')[:10]}"
                    f"{' (restored)' if c.get('restored') else ''}{note}"}))
    items.sort(key=lambda i: (i[0], i[1]))
    extra: list[dict[str, Any]] = []
    for row in safety_rows(record):
        target = f" to {checkpoint_at(row['ts'], cps)}" if row["op"] == "restore" and row.get("ts") is not None else (
            f" of restore {row.get('of')}" if row["op"] != "restore" else "")
        extra.append({"kind": row["op"], "createdAt": row["createdAt"], "safety": row["hash"], "n": row["n"],
                      "text": f"{OP_WORDS.get(row['op'], row['op'])} {row['n']}{target}: {row['paths']} path(s); "
                              f"safety checkpoint {str(row['hash'])[:10]}"})
    if record is not None:
        if record.forked_from:
            src = record.forked_from
            extra.append({"kind": "fork", "createdAt": src.get("createdAt"),
                          "text": f"forked from task {src.get('taskId')} at {checkpoint_at(src.get('ts'), cps)}"})
        for f in record.forks:
            extra.append({"kind": "fork", "createdAt": f.get("createdAt"),
                          "text": f"forked into task {f.get('taskId')} at {checkpoint_at(f.get('ts'), cps)}"})
    events = [e for _, _, e in items]
    for e in sorted(extra, key=lambda x: str(x.get("createdAt") or "")):
        stamp = str(e.get("createdAt") or "")
        at = next((i for i, ex in enumerate(events)
                   if ex["kind"] == "checkpoint" and str(ex.get("createdAt") or "") > stamp), len(events))
        events.insert(at, e)
    return events


TIMELINE_CSS = """
table.timeline { border-collapse: collapse; width: 100%; margin-top: 1em; }
table.timeline td { padding: .3em .6em; border-bottom: 1px solid var(--line); vertical-align: top; }
table.timeline td.when { white-space: nowrap; color: var(--muted); font-family: ui-monospace, monospace; }
table.timeline tr.message td.what { color: var(--muted); }
"""
BADGES = {"checkpoint": "added", "restore": "deleted", "undo": "deleted", "redo": "deleted"}


def timeline_page(task: str, root: str, events: list[dict[str, Any]]) -> str:
    """The timeline as one self-contained page (the shell of html_page, as `diff --html`)."""
    from shadowpoint.cli.html_page import page

    rows = "\n".join(
        f"<tr class='{html.escape(e['kind'])}'><td class='when'>"
        f"{html.escape(when(e.get('createdAt')))}</td>"
        f"<td><span class='badge {BADGES.get(e['kind'], '')}'>{html.escape(e['kind'])}</span></td>"
        f"<td class='what'>{html.escape(e['text'])}</td></tr>" for e in events)
    body = f"<table class='timeline'><tbody>{rows}</tbody></table>"
    return page(f"Timeline of task {task}", [root], body, TIMELINE_CSS)


COMMANDS = (save, list_cmd, diff, status, log, fork)
