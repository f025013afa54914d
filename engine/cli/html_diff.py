"""The side-by-side diff page of `shadowpoint diff --html`, for people.

One self-contained file (`html_page` shell): an index of the changed files with their status
and line counts, then each file as one fixed-layout table of four columns (old line number,
old text, new line number, new text), so that the old side is always the left half and the
new side the right half, in every file; an added file fills only the right, a deleted one
only the left. Changed words inside a changed line are marked, code is coloured by
Pygments, long unchanged stretches are folded (a link opens them, no script), binary files
are named without content. Pure functions over the protocol's `Diff`.
"""

from __future__ import annotations

import difflib
import html
import itertools
import re
from collections.abc import Iterator, Mapping
from typing import Any

from pygments.lexer import Lexer
from pygments.lexers import TextLexer, get_lexer_for_filename
from pygments.token import STANDARD_TYPES, _TokenType
from pygments.util import ClassNotFound

from shadowpoint.cli.html_page import IndexRow, anchor_for, index_table, page, pygments_css
from shadowpoint.cli.render import line_counts

CONTEXT = 3  # unchanged lines shown around a change
FOLD_MIN = 8  # shorter unchanged stretches are shown whole
MAX_HIGHLIGHT_BYTES = 1 << 20  # bigger files are shown without syntax colours

DIFF_CSS = """
section.file { margin-top: 2em; }
section.file h2 { font-size: 1em; font-family: ui-monospace, monospace; margin: 0 0 .4em;
  display: flex; gap: .6em; align-items: center; }
table.sbs { table-layout: fixed; width: 100%; border-collapse: collapse; border: 1px solid var(--line);
  font: 12px/1.45 ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; }
table.sbs col.ln { width: 4.5em; }
table.sbs col.code { width: calc(50% - 4.5em); }
table.sbs th { background: var(--panel); color: var(--muted); font-weight: 600; text-align: left;
  padding: .3em .6em; border-bottom: 1px solid var(--line); }
table.sbs td { padding: 0 .5em; vertical-align: top; }
table.sbs td.ln { color: var(--muted); text-align: right; user-select: none; background: var(--panel); }
table.sbs td.code { white-space: pre-wrap; overflow-wrap: anywhere; }
table.sbs td.code.old { border-right: 1px solid var(--line); }
td.del { background: var(--del); } td.add { background: var(--add); }
td.empty { background: var(--empty); }
td.del .chg-word { background: var(--del-word); border-radius: 2px; }
td.add .chg-word { background: var(--add-word); border-radius: 2px; }
tr.fold td { background: var(--panel); color: var(--muted); text-align: center; padding: .2em; }
tbody.folded { display: none; }
tbody.folded:target { display: table-row-group; }
"""

_WORD = re.compile(r"\w+|\s+|[^\w\s]")


def diff_page(diff: Mapping[str, Any], title: str, *, task: str = "", workspace: str = "") -> str:
    """The whole page for the protocol's `Diff`."""
    files = list(diff.get("files", []))
    rows, sections = [], []
    for i, f in enumerate(files):
        label = f"{f['oldPath']} → {f['path']}" if f.get("oldPath") else f["path"]
        added, removed = (None, None) if f.get("binary") else line_counts(f)
        rows.append(IndexRow(anchor_for(i), label, f["status"], added, removed))
        sections.append(_file_section(i, f, label, added, removed))
    summary = f"<p>{len(files)} file{'s' if len(files) != 1 else ''} changed.</p>" if files else \
        "<p class='note'>No changes.</p>"
    where = [w for w in (f"task {task}" if task else "", f"workspace {workspace}" if workspace else "") if w]
    body = summary + index_table(rows) + "".join(sections)
    return page(title, where, body, DIFF_CSS + pygments_css())


def _file_section(i: int, f: Mapping[str, Any], label: str, added: int | None, removed: int | None) -> str:
    status = f["status"]
    counts = f"<span class='added-n'>+{added}</span> <span class='removed-n'>−{removed}</span>" \
        if added is not None else ""
    head = (f"<section class='file' id='{anchor_for(i)}'><h2><span class='badge {html.escape(status)}'>"
            f"{html.escape(status)}</span><span class='path'>{html.escape(label)}</span>{counts}</h2>")
    if f.get("binary"):
        return head + f"<p class='note'>Binary file {html.escape(f['path'])}: contents not shown.</p></section>"
    before, after = f.get("before") or "", f.get("after") or ""
    if before == after:
        return head + "<p class='note'>Same content (moved, or its mode changed).</p></section>"
    old_lines = _highlighted(f.get("oldPath") or f["path"], before)
    new_lines = _highlighted(f["path"], after)
    table = ["<table class='sbs'><colgroup><col class='ln'><col class='code'><col class='ln'><col class='code'>"
             "</colgroup><thead><tr><th colspan='2'>before</th><th colspan='2'>after</th></tr></thead>"]
    table += _bodies(i, status, old_lines, new_lines)
    table.append("</table>")
    return head + "".join(table) + "</section>"


# ---------------------------------------------------------------- rows


_Line = tuple[str, list[tuple[str, str]]]  # (plain text, [(css class, text)])


def _bodies(i: int, status: str, old: list[_Line], new: list[_Line]) -> Iterator[str]:
    """The table's row groups: shown rows, and folded unchanged stretches."""
    if status == "added":
        yield "<tbody>" + "".join(_row(None, None, n + 1, line, "add") for n, line in enumerate(new)) + "</tbody>"
        return
    if status == "deleted":
        yield "<tbody>" + "".join(_row(n + 1, line, None, None, "del") for n, line in enumerate(old)) + "</tbody>"
        return
    matcher = difflib.SequenceMatcher(None, [t for t, _ in old], [t for t, _ in new], autojunk=False)
    ops = matcher.get_opcodes()
    shown: list[str] = []
    folds = 0
    for k, (tag, a0, a1, b0, b1) in enumerate(ops):
        if tag == "equal":
            rows = [_row(a0 + j + 1, old[a0 + j], b0 + j + 1, new[b0 + j], "ctx") for j in range(a1 - a0)]
            keep_head = CONTEXT if k > 0 else 0
            keep_tail = CONTEXT if k < len(ops) - 1 else 0
            if len(rows) - keep_head - keep_tail < FOLD_MIN:
                shown += rows
                continue
            shown += rows[:keep_head]
            hidden = rows[keep_head:len(rows) - keep_tail]
            fold_id = f"{anchor_for(i)}-fold{folds}"
            folds += 1
            yield "<tbody>" + "".join(shown) + (
                f"<tr class='fold'><td colspan='4'><a href='#{fold_id}'>⋯ {len(hidden)} unchanged lines "
                f"(lines {a0 + keep_head + 1}–{a1 - keep_tail}) ⋯</a></td></tr></tbody>")
            yield f"<tbody class='folded' id='{fold_id}'>" + "".join(hidden) + "</tbody>"
            shown = rows[len(rows) - keep_tail:]
            continue
        olds, news = old[a0:a1], new[b0:b1]
        for j in range(max(len(olds), len(news))):
            o = olds[j] if j < len(olds) else None
            n = news[j] if j < len(news) else None
            if o is not None and n is not None:
                o_marks, n_marks = _changed_words(o[0], n[0])
                shown.append(_row(a0 + j + 1, o, b0 + j + 1, n, "chg", o_marks, n_marks))
            elif o is not None:
                shown.append(_row(a0 + j + 1, o, None, None, "del"))
            else:
                shown.append(_row(None, None, b0 + j + 1, n, "add"))
    yield "<tbody>" + "".join(shown) + "</tbody>"


def _row(old_no: int | None, old: _Line | None, new_no: int | None, new: _Line | None, kind: str,
         old_marks: list[tuple[int, int]] | None = None, new_marks: list[tuple[int, int]] | None = None) -> str:
    old_cls = "del" if kind in ("del", "chg") else "ctx"
    new_cls = "add" if kind in ("add", "chg") else "ctx"
    left = (f"<td class='ln old'>{old_no}</td><td class='code old {old_cls}'>{_render(old, old_marks)}</td>"
            if old is not None else "<td class='ln old empty'></td><td class='code old empty'></td>")
    right = (f"<td class='ln new'>{new_no}</td><td class='code new {new_cls}'>{_render(new, new_marks)}</td>"
             if new is not None else "<td class='ln new empty'></td><td class='code new empty'></td>")
    return f"<tr class='{kind}'>{left}{right}</tr>"


def _changed_words(old: str, new: str) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """Character ranges of the words that differ between two versions of a line."""
    a, b = _WORD.findall(old), _WORD.findall(new)
    pos_a = _offsets(a)
    pos_b = _offsets(b)
    marks_a: list[tuple[int, int]] = []
    marks_b: list[tuple[int, int]] = []
    for tag, a0, a1, b0, b1 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if tag == "equal":
            continue
        if a1 > a0:
            marks_a.append((pos_a[a0], pos_a[a1]))
        if b1 > b0:
            marks_b.append((pos_b[b0], pos_b[b1]))
    return marks_a, marks_b


def _offsets(words: list[str]) -> list[int]:
    out = [0]
    for w in words:
        out.append(out[-1] + len(w))
    return out


def _render(line: _Line, marks: list[tuple[int, int]] | None) -> str:
    """A line's coloured tokens, with the `marks` ranges wrapped in `<span class='chg-word'>`."""
    text, tokens = line
    if not text:
        return ""
    out: list[str] = []
    pos = 0
    marks = marks or []
    for cls, value in tokens:
        end = pos + len(value)
        cuts = sorted({pos, end, *(m for r in marks for m in r if pos < m < end)})
        for s, e in itertools.pairwise(cuts):
            piece = html.escape(value[s - pos:e - pos])
            if cls:
                piece = f"<span class='{cls}'>{piece}</span>"
            if any(a <= s and e <= b for a, b in marks):
                piece = f"<span class='chg-word'>{piece}</span>"
            out.append(piece)
        pos = end
    return "".join(out)


# ---------------------------------------------------------------- syntax colours


def _lexer(path: str, text: str) -> Lexer:
    if len(text) > MAX_HIGHLIGHT_BYTES:
        return TextLexer()
    try:
        return get_lexer_for_filename(path, stripnl=False, ensurenl=False)
    except ClassNotFound:
        return TextLexer()


def _css_class(ttype: _TokenType) -> str:
    while ttype not in STANDARD_TYPES:
        ttype = ttype.parent
    return str(STANDARD_TYPES[ttype])


def _highlighted(path: str, text: str) -> list[_Line]:
    """The text's lines (without their end), each with its Pygments tokens."""
    lines: list[_Line] = []
    current: list[tuple[str, str]] = []
    plain: list[str] = []
    for ttype, value in _lexer(path, text).get_tokens(text):
        parts = value.split("\n")
        for k, part in enumerate(parts):
            if k:
                lines.append(("".join(plain), current))
                current, plain = [], []
            if part:
                current.append((_css_class(ttype), part))
                plain.append(part)
    if plain or current:
        lines.append(("".join(plain), current))
    # the lexer's text must be the file's text: fall back to plain lines if it is not
    if [t for t, _ in lines] != text.split("\n")[: len(lines)] or len(lines) != len(text.splitlines()):
        return [(t, [("", t)]) for t in text.splitlines()]
    return lines
