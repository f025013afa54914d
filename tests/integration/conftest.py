"""Fixtures of the integration tests: the hermetic environment of a real `shadowpoint` process, a
small workspace, and the watcher's observer that the watcher and round tests run on."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import pytest

from shadowpoint.observe.watcher import ObserverKind
from tests.conftest import make_tree


@pytest.fixture(params=["inotify", "portable"])
def observer(request: pytest.FixtureRequest) -> ObserverKind:
    """The `watcher_observer` setting: every test that asks runs on shadowpoint's inotify observer
    and on watchdog's stock one (what macOS and Windows get). A test of an inotify-only feature
    names its observer with `@pytest.mark.parametrize("observer", ["inotify"])` and says why."""
    return cast("ObserverKind", request.param)


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


