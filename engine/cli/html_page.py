"""The shell of shadowpoint's HTML pages for people (`diff --html`, `log --html`): one
self-contained file (no network, no script needed to read it), light and dark colours
(`prefers-color-scheme`), a header naming the task and workspace, and an index.

Pure functions returning strings; `html_diff` builds the diff page's body on top of this.
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from pygments.formatters import HtmlFormatter

# Colours as custom properties, so that both schemes share one set of rules.
PAGE_CSS = """
:root { color-scheme: light dark;
  --fg: #1f2328; --bg: #ffffff; --muted: #59636e; --line: #d1d9e0; --panel: #f6f8fa;
  --add: #dafbe1; --add-word: #aceebb; --del: #ffebe9; --del-word: #ffcecb; --empty: #f6f8fa;
  --link: #0969da; --badge: #eaeef2; }
@media (prefers-color-scheme: dark) { :root {
  --fg: #e6edf3; --bg: #0d1117; --muted: #9198a1; --line: #3d444d; --panel: #151b23;
  --add: #12261e; --add-word: #1f6f3f; --del: #25171c; --del-word: #8e1519; --empty: #151b23;
  --link: #4493f8; --badge: #262c36; } }
* { box-sizing: border-box; }
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0; color: var(--fg);
  background: var(--bg); }
a { color: var(--link); }
header.page { padding: 1em 1.5em; border-bottom: 1px solid var(--line); background: var(--panel); }
header.page h1 { font-size: 1.25em; margin: 0 0 .3em; }
header.page .where { color: var(--muted); font-size: .9em; }
main { padding: 0 1.5em 3em; }
nav.index table { border-collapse: collapse; margin: 1em 0; font-size: .9em; }
nav.index td { padding: .15em .8em .15em 0; }
nav.index td.num { text-align: right; font-family: ui-monospace, monospace; }
.added-n { color: #1a7f37; } .removed-n { color: #cf222e; }
.badge { font-size: .75em; padding: .1em .55em; border-radius: 1em; background: var(--badge);
  white-space: nowrap; }
.badge.added { background: var(--add); } .badge.deleted { background: var(--del); }
.note { color: var(--muted); font-style: italic; }
"""


@dataclass(frozen=True, slots=True)
class IndexRow:
    """One line of a page's index: a link to an anchor, a status badge and counts."""

    anchor: str
    label: str
    status: str
    added: int | None = None
    removed: int | None = None


def anchor_for(i: int) -> str:
    return f"f{i}"


def index_table(rows: Sequence[IndexRow]) -> str:
    """The index: one row per entry, linking to its anchor."""
    out = ["<nav class='index'><table>"]
    for row in rows:
        counts = ""
        if row.added is not None and row.removed is not None:
            counts = (f"<td class='num added-n'>+{row.added}</td>"
                      f"<td class='num removed-n'>−{row.removed}</td>")
        else:
            counts = "<td class='num' colspan='2'></td>"
        out.append(f"<tr><td><span class='badge {html.escape(row.status)}'>{html.escape(row.status)}</span></td>"
                   f"<td><a href='#{row.anchor}'>{html.escape(row.label)}</a></td>{counts}</tr>")
    out.append("</table></nav>")
    return "".join(out)


def page(title: str, where: Iterable[str], body: str, extra_css: str = "") -> str:
    """A whole page: `title`, the `where` lines under it (task, workspace), then `body`."""
    lines = "".join(f"<div class='where'>{html.escape(w)}</div>" for w in where)
    return ("<!doctype html><html lang='en'><head><meta charset='utf-8'>"
            "<meta name='viewport' content='width=device-width, initial-scale=1'>"
            f"<title>{html.escape(title)}</title><style>{PAGE_CSS}{extra_css}</style></head><body>"
            f"<header class='page'><h1>{html.escape(title)}</h1>{lines}</header>"
            f"<main>{body}</main></body></html>\n")


def pygments_css() -> str:
    """Syntax colours for code inside `.code`, light by default and dark in a dark scheme."""
    light = HtmlFormatter(style="default").get_style_defs(".code")
    dark = HtmlFormatter(style="github-dark" if _has_style("github-dark") else "monokai").get_style_defs(".code")
    # the styles' own backgrounds would hide the diff's; keep only token colours
    light = "\n".join(line for line in light.splitlines() if "background" not in line or ".hll" in line)
    dark = "\n".join(line for line in dark.splitlines() if "background" not in line or ".hll" in line)
    return f"{light}\n@media (prefers-color-scheme: dark) {{\n{dark}\n}}\n"


def _has_style(name: str) -> bool:
    from pygments.styles import get_all_styles

    return name in set(get_all_styles())
