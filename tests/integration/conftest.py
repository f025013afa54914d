"""Fixtures of the command-line tests: the hermetic environment of a real `shadowpoint` process
and a small workspace."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import make_tree


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    """The hermetic environment plus a short runtime dir (Unix socket paths are limited)."""
    run_dir = Path(tempfile.mkdtemp(prefix="sp-run-"))
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(run_dir))
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setenv("TERM", "xterm-256color")
    monkeypatch.setenv("SHADOWPOINT_PAGER", "cat")  # the pager has tests of its own (test_cli_habits.py)
    yield dict(os.environ)
    shutil.rmtree(run_dir, ignore_errors=True)


@pytest.fixture
def ws(workspace: Path) -> Path:
    make_tree(workspace, {"app.py": "print(1)\n", "lib/util.py": "def f():\n    return 1\n", "README.md": "r\n"})
    return workspace


