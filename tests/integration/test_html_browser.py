"""The `diff --html` page in a real browser (headless Chromium, Debian's `chromium`): the laid-out
DOM says where each cell sits, so the test checks what a person sees (issue 13): old text in
the left half and new in the right in every file, the same columns in every file, an added
file only on the right and a deleted one only on the left, index links that reach every
file, folded unchanged stretches, binary files named, and a dark scheme.

Skipped when no chromium is installed, except with CI=true (`.ci/browser` installs it there).
"""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest

from shadowpoint.cli.html_diff import diff_page

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--window-size=1400,1000"]

# Runs in the page after layout: writes what the test asserts on into the DOM.
PROBE = """<script>
const out = {rows: [], heads: [], links: [], sections: [], folded: [], words: 0, binary: []};
for (const table of document.querySelectorAll('table.sbs')) {
  const box = table.getBoundingClientRect();
  const half = box.left + box.width / 2;
  const file = table.closest('section').id;
  for (const th of table.querySelectorAll('thead th')) {
    const r = th.getBoundingClientRect();
    out.heads.push({file, text: th.textContent, left: r.left, right: r.right, half});
  }
  for (const tr of table.querySelectorAll('tbody:not(.folded) tr:not(.fold)')) {
    const o = tr.querySelector('td.code.old'), n = tr.querySelector('td.code.new');
    const ro = o.getBoundingClientRect(), rn = n.getBoundingClientRect();
    out.rows.push({file, kind: tr.className, half, oldEmpty: o.classList.contains('empty'),
      newEmpty: n.classList.contains('empty'), oL: ro.left, oR: ro.right, nL: rn.left, nR: rn.right,
      oText: o.textContent, nText: n.textContent});
  }
  for (const tb of table.querySelectorAll('tbody.folded')) {
    out.folded.push({file, height: tb.getBoundingClientRect().height, rows: tb.rows.length});
  }
}
out.words = document.querySelectorAll('td.code .chg-word').length;
for (const a of document.querySelectorAll('nav.index a')) {
  const id = a.getAttribute('href').slice(1), el = document.getElementById(id);
  out.links.push({id, found: !!el, height: el ? el.getBoundingClientRect().height : 0});
}
out.sections = [...document.querySelectorAll('section.file')].map(s => s.id);
out.binary = [...document.querySelectorAll('section.file p.note')].map(p => p.textContent);
out.background = getComputedStyle(document.body).backgroundColor;
document.body.setAttribute('data-layout', JSON.stringify(out));
</script>"""


def _files() -> list[dict[str, Any]]:
    long_before = "".join(f"value_{i} = compute({i}, 'text')\n" for i in range(200))
    long_after = long_before.replace("value_5 = compute(5,", "value_5 = compute(50,").replace(
        "value_150 = compute(150, 'text')\n", "value_150 = compute(150, 'text')\nextra = True\n")
    files: list[dict[str, Any]] = [
        {"path": "src/long.py", "status": "modified", "binary": False, "before": long_before, "after": long_after},
        {"path": "src/new_module.py", "status": "added", "binary": False, "before": None,
         "after": "def added():\n    return 'only on the right'\n"},
        {"path": "docs/removed.md", "status": "deleted", "binary": False,
         "before": "# Gone\n\nThis file was deleted.\n", "after": None},
        {"path": "assets/logo.png", "status": "modified", "binary": True, "before": None, "after": None},
    ]
    for i in range(11):  # 15 files in all: the index is how a person finds one
        files.append({"path": f"pkg/mod{i:02d}.ts", "status": "modified", "binary": False,
                      "before": f"export const v{i} = {i};\n" + "x" * (10 * i) + "\n",
                      "after": f"export const v{i} = {i + 1};\n" + "x" * (10 * i) + "\n"})
    return files


def _render(page: Path, *extra: str) -> dict[str, Any]:
    assert CHROMIUM is not None
    profile = tempfile.mkdtemp(prefix="sp-chromium-")
    try:
        proc = subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={profile}", *extra, "--dump-dom",
                               page.as_uri()], capture_output=True, text=True, timeout=180,
                              env={**os.environ, "HOME": profile})
    finally:
        shutil.rmtree(profile, ignore_errors=True)
    found = re.search(r'data-layout="([^"]*)"', proc.stdout)
    assert found, f"chromium rendered nothing usable (exit {proc.returncode}): {proc.stderr[-2000:]}"
    layout: dict[str, Any] = json.loads(html.unescape(found.group(1)))
    return layout


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], dict[str, Any]]:
    if CHROMIUM is None:
        if os.environ.get("CI") == "true":
            pytest.fail("CI=true but no chromium: .ci/browser installs it")
        pytest.skip("no chromium installed (apt-get install chromium)")
    text = diff_page({"title": "Changes since snapshot", "files": _files()}, "Changes since snapshot: #2 → #1",
                     task="task-1", workspace="/tmp/project")
    page = tmp_path_factory.mktemp("page") / "diff.html"
    page.write_text(text.replace("</body>", PROBE + "</body>"), encoding="utf-8")
    return _render(page), _render(page, "--force-dark-mode", "--blink-settings=forceDarkModeEnabled=false")


def test_old_text_sits_left_and_new_text_right_in_every_row(rendered: tuple[dict[str, Any], dict[str, Any]]) -> None:
    layout, _ = rendered
    assert layout["rows"], "no rows laid out"
    for row in layout["rows"]:
        assert row["oR"] <= row["half"] + 1, row
        assert row["nL"] >= row["half"] - 1, row
    for head in layout["heads"]:
        if head["text"] == "before":
            assert head["right"] <= head["half"] + 1, head
        else:
            assert head["text"] == "after" and head["left"] >= head["half"] - 1, head


def test_every_file_has_the_same_columns(rendered: tuple[dict[str, Any], dict[str, Any]]) -> None:
    layout, _ = rendered
    edges = {(round(r["oL"]), round(r["oR"]), round(r["nL"]), round(r["nR"])) for r in layout["rows"]}
    assert len(edges) == 1, f"columns differ between files: {sorted(edges)[:5]}"


def test_an_added_file_is_on_the_right_only_and_a_deleted_one_on_the_left(
        rendered: tuple[dict[str, Any], dict[str, Any]]) -> None:
    layout, _ = rendered
    index = {sid: i for i, sid in enumerate(layout["sections"])}
    added = [r for r in layout["rows"] if r["file"] == f"f{1}"]
    deleted = [r for r in layout["rows"] if r["file"] == f"f{2}"]
    assert len(index) == 15
    assert added and all(r["oldEmpty"] and not r["newEmpty"] for r in added)
    assert "only on the right" in "".join(r["nText"] for r in added)
    assert deleted and all(r["newEmpty"] and not r["oldEmpty"] for r in deleted)
    assert "This file was deleted." in "".join(r["oText"] for r in deleted)


def test_changes_are_marked_and_long_stretches_folded(rendered: tuple[dict[str, Any], dict[str, Any]]) -> None:
    layout, _ = rendered
    long_rows = [r for r in layout["rows"] if r["file"] == "f0"]
    assert len(long_rows) < 40, "a 200-line file with two changes is shown around them"
    changed = [r for r in long_rows if r["kind"] == "chg"]
    assert any("compute(50," in r["nText"] and "compute(5," in r["oText"] for r in changed)
    assert layout["words"] >= 2, "the changed words inside a changed line are marked"
    assert layout["folded"] and all(f["height"] == 0 and f["rows"] > 0 for f in layout["folded"])
    assert any("extra = True" in r["nText"] and r["oldEmpty"] for r in long_rows)


def test_the_index_reaches_every_file_and_binary_files_are_named(
        rendered: tuple[dict[str, Any], dict[str, Any]]) -> None:
    layout, _ = rendered
    assert [link["id"] for link in layout["links"]] == layout["sections"]
    assert all(link["found"] and link["height"] > 0 for link in layout["links"])
    assert any("Binary file assets/logo.png" in note for note in layout["binary"])


def test_a_dark_scheme_when_the_system_asks_for_one(rendered: tuple[dict[str, Any], dict[str, Any]]) -> None:
    light, dark = rendered
    assert light["background"] != dark["background"], (light["background"], dark["background"])
