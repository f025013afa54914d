"""Rendering for people: unified diffs (ANSI-coloured on a terminal), `--stat` summaries,
and the checkpoint table (the HTML page is `html_diff`) of `shadowpoint list`.

Pure functions over the protocol's `Diff` and `Checkpoint` dicts, called by the CLI and the
MCP server on their own thread. Colour is decided once by the caller (`use_color`): only on
a terminal, never when `NO_COLOR` is set or `TERM=dumb`.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Iterator, Mapping
from typing import IO, Any

from rich.table import Table
from rich.text import Text

from shadowpoint.cli.report import when

_RESET = "\x1b[0m"
_STYLES = {"header": "\x1b[1m", "meta": "\x1b[1;36m", "hunk": "\x1b[36m", "del": "\x1b[31m", "add": "\x1b[32m"}
CONTEXT_LINES = 3


def use_color(stream: IO[str], override: bool | None = None) -> bool:
    """Colour on a terminal only, and never with `NO_COLOR` set (https://no-color.org) or `TERM=dumb`.

    Args:
        stream: Where the output goes.
        override: `--color`/`--no-color` from the command line; None decides from the stream.
    """
    if override is not None:
        return override
    if os.environ.get("NO_COLOR", "") != "" or os.environ.get("TERM") == "dumb":
        return False
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


def _paint(line: str, style: str, color: bool) -> str:
    return f"{_STYLES[style]}{line}{_RESET}" if color else line


def _lines(text: str | None) -> list[str]:
    """The lines of `text`, split at `\\n` only, each keeping it (as git splits them: a form feed,
    `\\r` or U+2028 inside a line is part of it, so the diff applies with `git apply`)."""
    if not text:
        return []
    parts = text.split("\n")
    lines = [p + "\n" for p in parts[:-1]]
    if parts[-1]:
        lines.append(parts[-1])
    return lines


def unified_diff_lines(diff: Mapping[str, Any], *, color: bool = False) -> Iterator[str]:
    """The `Diff` as a git-style unified diff, one line at a time (each ending in a newline).

    Args:
        diff: The protocol's `Diff` (`files` with `path`, `status`, `before`, `after`, …).
        color: Wrap lines in ANSI colours (headers bold, hunks cyan, removals red, additions green).
    """
    for f in diff.get("files", []):
        path, status = f["path"], f["status"]
        old = f.get("oldPath") or path
        yield _paint(f"diff --shadowpoint a/{old} b/{path}\n", "header", color)
        if status == "added":
            yield _paint("new file\n", "meta", color)
        elif status == "deleted":
            yield _paint("deleted file\n", "meta", color)
        elif status == "renamed":
            yield _paint(f"rename from {old}\nrename to {path}\n", "meta", color)
        if f.get("binary"):
            yield f"Binary files a/{old} and b/{path} differ\n"
            continue
        before, after = f.get("before"), f.get("after")
        a = "/dev/null" if status == "added" else f"a/{old}"
        b = "/dev/null" if status == "deleted" else f"b/{path}"
        body = list(difflib.unified_diff(_lines(before), _lines(after), a, b, n=CONTEXT_LINES))
        for line in body:
            if not line.endswith("\n"):
                line += "\n\\ No newline at end of file\n"
            if line.startswith(("---", "+++")):
                yield _paint(line, "header", color)
            elif line.startswith("@@"):
                yield _paint(line, "hunk", color)
            elif line.startswith("-"):
                yield _paint(line, "del", color)
            elif line.startswith("+"):
                yield _paint(line, "add", color)
            else:
                yield line


def line_counts(f: Mapping[str, Any]) -> tuple[int, int]:
    """(added, removed) lines of one changed file (0, 0 for binary files)."""
    if f.get("binary"):
        return 0, 0
    added = removed = 0
    for line in difflib.unified_diff(_lines(f.get("before")), _lines(f.get("after")), n=0):
        if line.startswith(("---", "+++", "@@")):
            continue
        if line.startswith("+"):
            added += 1
        elif line.startswith("-"):
            removed += 1
    return added, removed


def stat_lines(diff: Mapping[str, Any], *, color: bool = False, width: int = 40) -> Iterator[str]:
    """A `git diff --stat`-like summary: one line per file, then the totals."""
    files = list(diff.get("files", []))
    counts = [line_counts(f) for f in files]
    name_w = max((len(f["path"]) for f in files), default=0)
    most = max((a + r for a, r in counts), default=0)
    total_a = total_r = 0
    for f, (a, r) in zip(files, counts, strict=True):
        total_a, total_r = total_a + a, total_r + r
        if f.get("binary"):
            yield f" {f['path']:<{name_w}} | Bin\n"
            continue
        scale = min(1.0, width / most) if most else 1.0
        # a changed file always shows at least one mark of each kind it has (as git does)
        plus = max(1, round(a * scale)) if a else 0
        minus = max(1, round(r * scale)) if r else 0
        bar = _paint("+" * plus, "add", color) + _paint("-" * minus, "del", color) if (plus or minus) else ""
        yield f" {f['path']:<{name_w}} | {a + r:>4} {bar}\n"
    yield (f" {len(files)} file{'s' if len(files) != 1 else ''} changed, "
           f"{total_a} insertion{'s' if total_a != 1 else ''}(+), {total_r} deletion{'s' if total_r != 1 else ''}(-)\n")


def checkpoint_table(checkpoints: list[dict[str, Any]], messages: Mapping[int, str], title: str) -> Table:
    """The rich table of `shadowpoint list` (checkpoints already numbered, newest first)."""
    table = Table(title=title, title_justify="left", expand=False)
    table.add_column("#", justify="right", style="bold")
    table.add_column("hash", style="yellow", no_wrap=True)
    table.add_column("kind")
    table.add_column("created", no_wrap=True)
    table.add_column("notes")
    for cp in checkpoints:
        notes = []
        if cp.get("restored"):
            notes.append("restored")
        if cp.get("reused"):
            notes.append("unchanged")
        if cp.get("warnings"):
            notes.append(f"{len(cp['warnings'])} file(s) left out")
        text = messages.get(int(cp["ts"]))
        if text:
            first = text.strip().splitlines()[0] if text.strip() else ""
            notes.append(f"“{first[:60]}”")
        table.add_row(str(cp["position"]), (cp.get("hash") or "—")[:10], cp["kind"],
                      when(cp.get("createdAt", "")), Text(", ".join(notes)))
    return table
