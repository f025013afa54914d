"""Pure helpers of the command line: people's words for engine messages, and git's reading of
`diff [REF [REF2]] [--] [PATH…]`."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import pytest

from shadowpoint.cli import CliError, people_words
from shadowpoint.cli.history import split_refs_and_paths


def test_engine_messages_in_peoples_words() -> None:
    ts = 1796153580707
    when = datetime.fromtimestamp(ts / 1000).strftime("%Y-%m-%d %H:%M:%S")
    assert people_words(f"The checkpoint at ts={ts} has no file snapshot.") == \
        f"The checkpoint at {when} has no file snapshot."
    words = people_words("Unknown task 'x': start it with task/start first.")
    assert "task/start" not in words and "shadowpoint save" in words


def test_refs_and_paths_as_git_reads_them(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    (root / "src").mkdir(parents=True)
    (root / "7").write_text("a file named like a position\n")
    assert split_refs_and_paths(("2", "1"), None, root, root) == (["2", "1"], [])
    assert split_refs_and_paths(("2", "src"), None, root, root) == (["2"], ["src"])
    assert split_refs_and_paths(("7",), None, root, root) == ([], ["7"]), "an existing file wins without --"
    assert split_refs_and_paths(("7", "x"), 1, root, root) == (["7"], ["x"]), "before --, refs"
    assert split_refs_and_paths(("a.py",), None, root / "src", root) == ([], ["src/a.py"])
    assert split_refs_and_paths((".",), None, root, root) == ([], [""])
    with pytest.raises(CliError) as info:
        split_refs_and_paths(("../elsewhere",), None, root, root)
    assert info.value.kind == "path_outside_workspace"
    with pytest.raises(CliError) as info:
        split_refs_and_paths(("1", "2", "3"), 0, root, root)
    assert info.value.kind == "usage"
