"""The borrowed-blob ledger (`shadowpoint.store.borrowed`): written by `_lines`, read back by
`parse_ledger` in one parse, or line by line when a line is damaged."""

from __future__ import annotations

from shadowpoint.store import borrowed

ITEMS = [("a" * 40, "src/app.py"), ("b" * 40, 'odd "quoted"\\name\nwith newline'),
         ("c" * 40, "caf\udce9.txt"), ("d" * 40, "ünïcode/ファイル")]


def ledger_text() -> str:
    return "".join(borrowed._lines("/repo/.git/objects", ITEMS[:2])) + "".join(
        borrowed._lines("/other/.git/objects", ITEMS[2:]))


def test_round_trip() -> None:
    ledger = borrowed.parse_ledger(ledger_text())
    assert ledger.alternates == ["/repo/.git/objects", "/other/.git/objects"]
    assert ledger.items == dict(ITEMS)


def test_a_damaged_line_is_skipped_and_the_others_kept() -> None:
    lines = ledger_text().splitlines(keepends=True)
    lines.insert(2, '{"oid": "e' + "e" * 39 + '", "pa\n')  # a write cut short
    ledger = borrowed.parse_ledger("".join(lines))
    assert ledger.alternates == ["/repo/.git/objects", "/other/.git/objects"]
    assert ledger.items == dict(ITEMS)


def test_an_empty_ledger() -> None:
    ledger = borrowed.parse_ledger("")
    assert ledger.alternates == [] and ledger.items == {}


def test_lines_are_what_json_dumps_writes() -> None:
    """The ledger's lines keep the format of `json.dumps` (older ledgers, and `{"alt"` lines
    that `ShadowRepo` finds by their start)."""
    import json

    expected = [json.dumps({"alt": "/repo/.git/objects"}) + "\n"]
    expected += [json.dumps({"oid": oid, "path": path}) + "\n" for oid, path in ITEMS]
    assert list(borrowed._lines("/repo/.git/objects", ITEMS)) == expected


def test_an_id_of_another_form_is_a_damaged_line_and_never_written_back() -> None:
    """`_lines` writes ids as they are (they are hex): `parse_ledger` keeps only ids that are 40
    lowercase hex digits, so a hand-edited or damaged id never reaches a rewritten ledger."""
    import json

    bad = ['{"oid": "' + "A" * 40 + '", "path": "upper"}\n', '{"oid": "x\\"y", "path": "quote"}\n',
           '{"oid": "' + "a" * 39 + '", "path": "short"}\n']
    ledger = borrowed.parse_ledger(ledger_text() + "".join(bad))
    assert ledger.items == dict(ITEMS)
    rewritten = "".join(borrowed._lines(ledger.alternates[-1], ledger.items.items()))
    assert [json.loads(line) for line in rewritten.splitlines()][1:] == [{"oid": o, "path": p} for o, p in ITEMS]


def test_tree_lines_round_trip_beside_the_earlier_form() -> None:
    """A baseline writes one `{"tree"}` line (whatever its count of files); a ledger an earlier
    version wrote holds a line per blob. Both are read, a tree once however often it is named,
    and a tree id of another form is a damaged line."""
    trees = ["e" * 40, "f" * 40]
    text = ledger_text() + "".join(borrowed._lines(None, (), trees)) + "".join(borrowed._lines(None, (), trees[:1]))
    text += '{"tree": "' + "E" * 40 + '"}\n'
    ledger = borrowed.parse_ledger(text)
    assert ledger.trees == trees and ledger.items == dict(ITEMS)
    assert ledger.alternates == ["/repo/.git/objects", "/other/.git/objects"]
