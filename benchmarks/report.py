"""Benchmark output: the terminal table, the JSON file and the PNG chart.

`TreeReport` holds one tree's results; `write_json` / `load_json` round-trip a run;
`render_chart` draws latency against workspace size (log scales, ours against the rival,
one panel per scenario) when matplotlib is importable. Called by the runner at the end.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.measure import ScenarioResult, fmt_value

SCHEMA_VERSION = 1


@dataclass(slots=True)
class TreeReport:
    """Every scenario of one workspace tree."""

    label: str
    files: int
    stats: dict[str, Any]
    scenarios: list[ScenarioResult]
    consistency: dict[str, Any] = field(default_factory=dict)
    duration_s: float = 0.0
    background: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "files": self.files,
            "stats": self.stats,
            "consistency": self.consistency,
            "background": self.background,
            "duration_s": self.duration_s,
            "scenarios": [s.to_json() for s in self.scenarios],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TreeReport:
        return cls(
            label=data["label"],
            files=int(data["files"]),
            stats=dict(data.get("stats", {})),
            scenarios=[ScenarioResult.from_json(s) for s in data["scenarios"]],
            consistency=dict(data.get("consistency", {})),
            duration_s=float(data.get("duration_s", 0.0)),
            background=dict(data.get("background", {})),
        )


def _one_line(text: str, limit: int = 140) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def _ratio_text(ratio: float | None) -> str:
    if ratio is None:
        return "—"
    if ratio < 0.1:
        return f"1/{1 / ratio:.0f}"
    return f"{ratio:.2f}"


def _cell(series_median: float | None, series_min: float | None, unit: str) -> str:
    if series_median is None:
        return "—"
    return f"{fmt_value(series_median, unit)} ({fmt_value(series_min, unit)})"


def table_rows(tree: TreeReport) -> list[list[str]]:
    """Rows of the table: scenario, ours, rival, rival median, ratio, target, status."""
    rows = []
    for s in tree.scenarios:
        ours = s.ours if s.ours and s.ours.samples else None
        rival = s.rival if s.rival and s.rival.samples else None
        if s.skipped or s.error:
            reason = f"skipped: {s.skipped}" if s.skipped else f"ERROR: {_one_line(s.error or '')}"
            rows.append([s.title, reason, "", "", "", s.target.text if s.target else "", s.status])
            continue
        rows.append([
            s.title,
            _cell(ours.median if ours else None, ours.min if ours else None, s.unit),
            s.rival_name or "—",
            _cell(rival.median if rival else None, rival.min if rival else None, s.unit),
            _ratio_text(s.ratio),
            s.target.text if s.target else "—",
            s.status,
        ])
    return rows


HEADERS = ["scenario", "ours median (min)", "rival", "rival median (min)", "ours/rival", "target", "result"]


def tree_heading(tree: TreeReport) -> str:
    st = tree.stats
    size_mb = st.get("bytes", 0) / 1e6
    source = st.get("source", "generated")
    origin = f"generated, seed {st.get('seed')}" if source == "generated" else f"copy of {source}"
    return (f"{tree.label}: {tree.files:,} files, {st.get('dirs', 0):,} folders, {size_mb:,.0f} MB "
            f"({origin}; node_modules {st.get('node_modules_files', 0):,} files, "
            f"{len(st.get('nested_repos', []))} nested repos)")


def render_table(tree: TreeReport) -> str:
    """The table as plain text (what the terminal shows when `rich` is missing)."""
    rows = table_rows(tree)
    out = [tree_heading(tree)]
    # skipped rows print their reason across the middle columns
    widths = [max(len(h), *(len(r[i]) for r in rows if not r[1].startswith(("skipped", "ERROR")) or i != 1))
              for i, h in enumerate(HEADERS)]
    widths[1] = min(widths[1], 24)
    line = "  ".join(h.ljust(w) for h, w in zip(HEADERS, widths, strict=True))
    out.append(line)
    out.append("-" * len(line))
    for r in rows:
        if r[1].startswith(("skipped", "ERROR")):
            out.append(f"{r[0].ljust(widths[0])}  {r[1]}  [{r[6]}]")
        else:
            out.append("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)))
    notes = [(s.title, n) for s in tree.scenarios for n in s.notes]
    if notes:
        out.append("notes:")
        out.extend(f"  {title}: {n}" for title, n in notes)
    for when, c in tree.consistency.items():
        agree = c["only_ours"] == c["only_git"] == c["differing"] == 0
        out.append(f"snapshot check ({when}): ours {c['ours_files']:,} files vs git ls-files {c['git_files']:,}: "
                   + ("identical" if agree else f"only ours {c['only_ours']}, only git {c['only_git']}, "
                      f"differing {c['differing']} {c['examples']}"))
    if tree.background.get("packs_waited_for"):
        out.append(f"engine background packs (shadowpoint-gc) waited for outside every timing: "
                   f"{tree.background['packs_waited_for']}, {tree.background['seconds']:.1f} s in all")
    return "\n".join(out)


def print_table(tree: TreeReport) -> None:
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        print(render_table(tree), flush=True)
        print(flush=True)
        return
    table = Table(title=tree_heading(tree))
    for h in HEADERS:
        table.add_column(h)
    for r in table_rows(tree):
        style = {"PASS": "green", "MISS": "red", "ERROR": "red", "skipped": "yellow"}.get(r[6])
        table.add_row(*r, style=style)
    console = Console()
    if not console.is_terminal:
        console = Console(width=200)
    console.print(table)
    text = render_table(tree).split("\n")
    rest = [ln for ln in text if ln.startswith(("notes:", "  ", "snapshot check", "engine background"))]
    if rest:
        console.print("\n".join(rest), markup=False, highlight=False)


def write_json(path: Path, meta: dict[str, Any], trees: list[TreeReport]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {"schema": SCHEMA_VERSION, **meta, "trees": [t.to_json() for t in trees]}
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    tmp.replace(path)


def load_json(path: Path) -> list[TreeReport]:
    data = json.loads(path.read_text(encoding="utf-8"))
    return [TreeReport.from_json(t) for t in data["trees"]]


def render_chart(trees: list[TreeReport], path: Path) -> str:
    """Draw ours against the rival per scenario, against workspace size; returns a message."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "chart skipped: matplotlib is not installed (pip install matplotlib)"
    names: list[str] = []
    for t in trees:
        for s in t.scenarios:
            if s.name not in names and s.ours and s.ours.samples:
                names.append(s.name)
    if not names:
        return "chart skipped: no measured scenario"
    cols = 4
    rows = math.ceil(len(names) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.3 * rows), squeeze=False)
    ordered = sorted(trees, key=lambda t: t.files)
    for ax, name in zip(axes.flat, names, strict=False):
        title, unit, rival_name = name, "s", None
        ours_pts: list[tuple[int, float]] = []
        rival_pts: list[tuple[int, float]] = []
        for t in ordered:
            for s in t.scenarios:
                if s.name != name:
                    continue
                title, unit, rival_name = s.title, s.unit, s.rival_name
                if s.ours and s.ours.samples:
                    ours_pts.append((t.files, s.ours.median))
                if s.rival and s.rival.samples:
                    rival_pts.append((t.files, s.rival.median))
        if ours_pts:
            ax.plot(*zip(*ours_pts, strict=True), "o-", color="tab:blue", label="shadowpoint")
        if rival_pts:
            ax.plot(*zip(*rival_pts, strict=True), "s--", color="tab:red", label=rival_name or "rival")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("workspace files", fontsize=8)
        ax.set_ylabel("seconds" if unit == "s" else unit, fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=6)
    for ax in list(axes.flat)[len(names):]:
        ax.set_visible(False)
    fig.suptitle("shadowpoint vs the seed's git CLI (median; log scales)", fontsize=11)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return f"chart: {path}"
