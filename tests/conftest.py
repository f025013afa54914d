"""Shared fixtures: hermetic environment, trees from dict literals, engines on temp dirs.

Every test runs with HOME, XDG dirs and SHADOWPOINT_DOCS_DIR pointing into its own
temporary directory, no GIT_* variable, and fails if it leaks a thread.
"""

from __future__ import annotations

import os
import stat
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
import structlog

from shadowpoint.config import DEFAULT_READ_ONLY_TOOLS
from shadowpoint.engine import Engine, EngineOptions

T = TypeVar("T")


class Link:
    """A symlink in a tree literal."""

    def __init__(self, target: str) -> None:
        self.target = target

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Link) and other.target == self.target

    def __hash__(self) -> int:
        return hash(("link", self.target))

    def __repr__(self) -> str:
        return f"Link({self.target!r})"


class Exe:
    """An executable file in a tree literal."""

    def __init__(self, data: str | bytes) -> None:
        self.data = data.encode() if isinstance(data, str) else data

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Exe) and other.data == self.data

    def __hash__(self) -> int:
        return hash(("exe", self.data))

    def __repr__(self) -> str:
        return f"Exe({self.data!r})"


def make_tree(root: Path, tree: dict[str, Any]) -> Path:
    """Create files from a dict literal: str/bytes content, Link, Exe, None deletes, "dir/" makes a dir."""
    root.mkdir(parents=True, exist_ok=True)
    for rel, val in tree.items():
        p = root / rel
        if rel.endswith("/"):
            p.mkdir(parents=True, exist_ok=True)
            continue
        if val is None:
            if p.is_symlink() or p.is_file():
                p.unlink()
            continue
        p.parent.mkdir(parents=True, exist_ok=True)
        if p.is_symlink() or p.is_file():
            p.unlink()
        if isinstance(val, Link):
            os.symlink(val.target, p)
        elif isinstance(val, Exe):
            p.write_bytes(val.data)
            p.chmod(0o755)
        else:
            p.write_bytes(val.encode() if isinstance(val, str) else val)
            p.chmod(0o644)
    return root


def wait_for(predicate: Callable[[], T], what: str = "a condition never held", timeout_s: float = 60.0,
             poll_s: float = 0.01) -> T:
    """Wait for a state another thread or process reaches; returns the predicate's first truthy value.

    The one polling helper of the tests: a condition with a generous bound (a hang fails with
    `what`), never a sleep sized to a duration and never a duration to assert on. A predicate
    may raise AssertionError itself to give up early (a process that exited).
    """
    deadline = time.monotonic() + timeout_s
    while not (value := predicate()):
        assert time.monotonic() < deadline, what
        time.sleep(poll_s)
    return value


def read_tree(root: Path) -> dict[str, Any]:
    """{path: bytes | Link | Exe} for a directory, `.git` folders skipped, links not followed."""
    out: dict[str, Any] = {}
    for dp, dns, fns in os.walk(root):
        for n in list(dns):
            full = os.path.join(dp, n)
            if os.path.islink(full):
                out[os.path.relpath(full, root)] = Link(os.readlink(full))
                dns.remove(n)
            elif n == ".git":
                dns.remove(n)
        for n in fns:
            full = os.path.join(dp, n)
            rel = os.path.relpath(full, root)
            st = os.lstat(full)
            if stat.S_ISLNK(st.st_mode):
                out[rel] = Link(os.readlink(full))
            elif stat.S_ISREG(st.st_mode):
                data = Path(full).read_bytes()
                out[rel] = Exe(data) if st.st_mode & 0o100 else data
    return out


@pytest.fixture(autouse=True)
def hermetic(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Isolate HOME/XDG/docs and fail on leaked threads."""
    home = tmp_path / "home"
    home.mkdir()
    for key in list(os.environ):
        if key.startswith(("GIT_", "SHADOWPOINT_")):
            monkeypatch.delenv(key)
    monkeypatch.setenv("HOME", str(home))
    for var, sub in (("XDG_CONFIG_HOME", ".config"), ("XDG_DATA_HOME", ".local/share"),
                     ("XDG_CACHE_HOME", ".cache"), ("XDG_STATE_HOME", ".local/state")):
        monkeypatch.setenv(var, str(home / sub))
    monkeypatch.setenv("SHADOWPOINT_DOCS_DIR", str(tmp_path / "docs"))
    before = {t.ident for t in threading.enumerate()}
    yield
    structlog.reset_defaults()  # a test that configured logging must not leak it into the next

    def leaked() -> list[str]:
        return [t.name for t in threading.enumerate() if t.ident not in before and t.is_alive()
                and t.name.startswith("shadowpoint")]

    try:
        wait_for(lambda: not leaked(), "threads leaked", timeout_s=5)
    except AssertionError:
        raise AssertionError(f"threads leaked: {leaked()}") from None


@pytest.fixture
def docs(tmp_path: Path) -> Path:
    return tmp_path / "docs"


@pytest.fixture
def options(docs: Path) -> EngineOptions:
    return EngineOptions(docs_dir=docs, read_only_tools=frozenset(DEFAULT_READ_ONLY_TOOLS), watcher=False)


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "work" / "proj"
    ws.mkdir(parents=True)
    return Path(os.path.realpath(ws))


@pytest.fixture
def make_engine(options: EngineOptions) -> Iterator[Any]:
    engines: list[Engine] = []

    def make(*roots: Path, **changes: Any) -> Engine:
        opts = options if not changes else EngineOptions(**{**_fields(options), **changes})
        eng = Engine(list(roots), opts)
        engines.append(eng)
        return eng

    yield make
    for eng in engines:
        eng.close()


def _fields(options: EngineOptions) -> dict[str, Any]:
    return {f: getattr(options, f) for f in options.__dataclass_fields__}
