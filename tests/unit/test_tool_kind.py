"""Unit tests for `shadowpoint.observe.rounds.tool_kind`: a tool's kind as given (an enum, or the
string a library caller may pass), else from its name (PROTOCOL.md)."""

from __future__ import annotations

from typing import Any

import pytest

from shadowpoint.kinds import ToolKind
from shadowpoint.observe.rounds import tool_kind

READ_ONLY = frozenset({"Read", "Grep"})


@pytest.mark.parametrize("kind", list(ToolKind))
def test_a_kind_given_wins_over_the_name(kind: ToolKind) -> None:
    for given in (kind, kind.value):  # the enum, or its string from a library caller
        found = tool_kind("Read", given, READ_ONLY)  # type: ignore[arg-type]  # a str on purpose
        assert found is kind and type(found) is ToolKind


@pytest.mark.parametrize(("tool", "expected"), [
    ("Read", ToolKind.READ), ("Bash", ToolKind.COMMAND), ("run_shell_command", ToolKind.COMMAND),
    ("execute_command", ToolKind.COMMAND), ("exec", ToolKind.COMMAND), ("Write", ToolKind.EDIT),
    ("apply_patch", ToolKind.EDIT),
])
def test_without_a_kind_the_name_decides(tool: str, expected: ToolKind) -> None:
    assert tool_kind(tool, None, READ_ONLY) is expected


@pytest.mark.parametrize("odd", ["Edit", "", "writes", 3])
def test_a_kind_that_is_none_of_them_goes_by_the_name(odd: Any) -> None:
    assert tool_kind("Bash", odd, READ_ONLY) is ToolKind.COMMAND
    assert tool_kind("Grep", odd, READ_ONLY) is ToolKind.READ
