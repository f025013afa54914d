"""The command line's task history: `redo`, `fork`, `log` (the timeline of messages,
checkpoints, restores, undos, redos and forks, with their safety checkpoints), the rows of
`list --all`, and the plan a `restore` shows before it runs (and prints for `--dry-run`).

Registered on the `shadowpoint` group by cli.py; runs on the main thread. Reads a task's
history from its record on disk (written by whichever engine holds the task).
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from shadowpoint.cli import _backend, _checkpoints, _Ctx, _dir_option, _task_for, _task_option, pass_ctx
from shadowpoint.cli_report import print_json as _print_json

if TYPE_CHECKING:
    from shadowpoint.sidecar.backend import Backend
    from shadowpoint.store.checkpoints import TaskRecord


def register(group: click.Group) -> None:
    """Add this module's commands to the `shadowpoint` group."""
    for command in (redo, fork, log):
        group.add_command(command)


def load_record(ctx: _Ctx, task_id: str) -> TaskRecord | None:
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


def describe_safety(row: Mapping[str, Any]) -> str:
    if row["op"] == "restore":
        what = f"before restore {row['n']} to ts {row['ts']}" if row.get("ts") is not None else \
            f"before restore {row['n']}"
    else:
        what = f"before {row['op']} of restore {row.get('of')}"
    return f"{what} ({row['paths']} path{'s' if row['paths'] != 1 else ''})"


def resolve_ref(ctx: _Ctx, backend: Backend, task: str, ref: str) -> dict[str, Any]:
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
        return resolve_checkpoint(_checkpoints(backend, task), ref)
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


def run_restore(backend: Backend, task: str, cp: Mapping[str, Any], mode: str, paths: list[str] | None,
                dry_run: bool, keep_mine: bool) -> dict[str, Any]:
    """`backend.restore`, or the restore to a safety checkpoint (files only) when `cp` is one."""
    if cp.get("safety") is None:
        return backend.restore(task, cp["ts"], mode, paths, dry_run, keep_mine)
    if mode != "files":
        from shadowpoint.cli_report import fail as _fail

        _fail("A safety checkpoint holds files only: restore it with --files.", "usage")
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
        elif keep_mine and (scope is None or _in(path, scope)):
            why = "only edits made outside the task's rounds since then: kept by --keep-mine (leave it out to reset)"
        else:
            why = (f"changed outside the task's rounds (not in its scope); to restore it too: "
                   f"shadowpoint restore {ref} --files -- {path}")
        out.append(LeftAlone(path, why))
    return out


def _in(path: str, scope: set[str]) -> bool:
    parts = path.split("/")
    return any("/".join(parts[:i]) in scope for i in range(1, len(parts) + 1))


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


# ---------------------------------------------------------------------------- commands


@click.command()
@_dir_option
@_task_option
@click.option("--json", "as_json", is_flag=True, help="print the Restore result as JSON")
@pass_ctx
def redo(ctx: _Ctx, directory: str | None, task_id: str | None, as_json: bool) -> None:
    """Redo the last undone file restore (walks forward through what `undo` walked back)."""
    step(ctx, directory, task_id, as_json, "redo")


def step(ctx: _Ctx, directory: str | None, task_id: str | None, as_json: bool, op: str) -> None:
    """`undo` or `redo`: one step along the task's undo stack, and what it wrote."""
    with _backend(ctx, directory) as backend:
        task = _task_for(ctx, backend, task_id)
        result = backend.undo_restore(task) if op == "undo" else backend.redo_restore(task)
    if as_json:
        _print_json({"taskId": task, **result})
        return
    files = result.get("files") or {}
    other = "redo" if op == "undo" else "undo"
    ctx.out.print(f"{op}ne: {len(files.get('restored', []))} file(s) written, {len(files.get('deleted', []))} "
                  f"removed (safety checkpoint {str(files.get('safety'))[:10]}; `shadowpoint {other}` reverts)")


@click.command()
@click.argument("ref")
@click.argument("new_id")
@_dir_option
@_task_option
@click.option("--json", "as_json", is_flag=True, help="print the fork's newest checkpoint as JSON")
@pass_ctx
def fork(ctx: _Ctx, ref: str, new_id: str, directory: str | None, task_id: str | None, as_json: bool) -> None:
    """Fork the task at checkpoint REF into a new task NEW_ID (sharing its snapshots).

    Both lines stay: restore the fork's files to try another way from REF, and the first
    attempt is one restore away (`shadowpoint restore --task-id OLD …`).
    """
    from shadowpoint.sidecar.backend import resolve_checkpoint

    with _backend(ctx, directory) as backend:
        task = _task_for(ctx, backend, task_id)
        cp = resolve_checkpoint(_checkpoints(backend, task), ref)
        forked = backend.fork(task, cp["ts"], new_id)
    if as_json:
        _print_json({"taskId": new_id, "source": task, "checkpoint": forked})
        return
    ctx.out.print(f"forked task {task} at #{cp['position']} ({str(forked.get('hash') or '—')[:10]}) into {new_id}; "
                  f"its files: shadowpoint restore 1 --files --task-id {new_id}")


@click.command()
@_dir_option
@_task_option
@click.option("--json", "as_json", is_flag=True, help="print the timeline as JSON")
@click.option("--html", "html_file", type=click.Path(dir_okay=False, writable=True), default=None,
              help="also write the timeline as an HTML page to this file")
@pass_ctx
def log(ctx: _Ctx, directory: str | None, task_id: str | None, as_json: bool, html_file: str | None) -> None:
    """The task's timeline: messages, checkpoints, restores, undos, redos and forks, with the
    safety checkpoints (named by hash prefix in `diff` and `restore`)."""
    with _backend(ctx, directory) as backend:
        task = _task_for(ctx, backend, task_id)
        cps = _checkpoints(backend, task)
        root = backend.root
    events = timeline(load_record(ctx, task), cps)
    if html_file:
        Path(html_file).write_text(timeline_page(task, str(root), events), encoding="utf-8")
    if as_json:
        _print_json({"taskId": task, "workspace": str(root), "events": events})
        return
    ctx.out.print(f"Task {task} · {root}")
    for e in events:
        ctx.out.print(f"{str(e.get('createdAt') or '')[:19].replace('T', ' '):<19}  {e['kind']:<10} {e['text']}")
    if html_file:
        ctx.err.print(f"timeline page written to {html_file}")


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
        target = f" to ts {row['ts']}" if row["op"] == "restore" and row.get("ts") is not None else (
            f" of restore {row.get('of')}" if row["op"] != "restore" else "")
        extra.append({"kind": row["op"], "createdAt": row["createdAt"], "safety": row["hash"], "n": row["n"],
                      "text": f"{OP_WORDS.get(row['op'], row['op'])} {row['n']}{target}: {row['paths']} path(s); "
                              f"safety checkpoint {str(row['hash'])[:10]}"})
    if record is not None:
        if record.forked_from:
            src = record.forked_from
            extra.append({"kind": "fork", "createdAt": src.get("createdAt"),
                          "text": f"forked from task {src.get('taskId')} at ts {src.get('ts')}"})
        for f in record.forks:
            extra.append({"kind": "fork", "createdAt": f.get("createdAt"),
                          "text": f"forked into task {f.get('taskId')} at ts {f.get('ts')}"})
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
    from shadowpoint.html_page import page

    rows = "\n".join(
        f"<tr class='{html.escape(e['kind'])}'><td class='when'>"
        f"{html.escape(str(e.get('createdAt') or '')[:19].replace('T', ' '))}</td>"
        f"<td><span class='badge {BADGES.get(e['kind'], '')}'>{html.escape(e['kind'])}</span></td>"
        f"<td class='what'>{html.escape(e['text'])}</td></tr>" for e in events)
    body = f"<table class='timeline'><tbody>{rows}</tbody></table>"
    return page(f"Timeline of task {task}", [root], body, TIMELINE_CSS)
