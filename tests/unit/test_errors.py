"""Unit tests for `shadowpoint.errors`: one root, the drawn tree is the real one, and every error
kind of the protocol and every exit code of the CLI has its class.

PROTOCOL.md is read from the shared folder beside the checkout when it is there (../shared);
a clone without it checks the copy of its list below.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
from pathlib import Path

import pytest

import shadowpoint
from shadowpoint import errors
from shadowpoint.cli import EXIT_CODES
from shadowpoint.errors import KIND_CLASSES, CliError, ShadowpointError, cli_error
from shadowpoint.kinds import ErrorKind, error_kind

REPO = Path(__file__).resolve().parents[2]
PROTOCOL = REPO.parent / "shared" / "PROTOCOL.md"
README = REPO / "README.md"

# PROTOCOL.md's "Error kinds" section, copied for a clone without ../shared
PROTOCOL_KINDS_COPY = frozenset({
    "no_workspace", "protected_directory", "path_outside_workspace", "unknown_task", "unknown_checkpoint",
    "unknown_message", "no_file_snapshot", "already_restored", "nothing_to_undo", "init_timeout",
    "init_failed", "checkpoints_disabled", "lock_timeout", "restore_failed", "invalid_params",
    "storage_failed", "restore_conflict",
})

# Exceptions that are signals inside one module and never reach a caller (errors.py says so).
MODULE_SIGNALS = {"shadowpoint.stage.git_index.IndexDoubt", "shadowpoint.stage.patterns._Unmatchable",
                  "shadowpoint.sidecar.hook_endpoint.BadRequestError", "shadowpoint.config.plain._Unproven",
                  "shadowpoint.store.shadow_repo._NotATree", "shadowpoint.store.borrowed._Stopped",
                  "shadowpoint.roots._Closing", "shadowpoint.maintenance._Closing"}


def protocol_kinds() -> frozenset[str]:
    if not PROTOCOL.is_file():
        return PROTOCOL_KINDS_COPY
    text = PROTOCOL.read_text(encoding="utf-8")
    section = re.search(r"^## Error kinds\n(.*?)(?=^#)", text, re.S | re.M)
    assert section is not None, "PROTOCOL.md has no 'Error kinds' section"
    return frozenset(re.findall(r"`([a-z_]+)`", section.group(1)))


def docstring_exit_codes() -> dict[str, int]:
    """The exit-code table of `shadowpoint.cli`'s docstring: {kind: code}."""
    import shadowpoint.cli

    doc = shadowpoint.cli.__doc__ or ""
    table = doc.split("Exit codes", 1)[1]
    out: dict[str, int] = {}
    for m in re.finditer(r"^ +(\d+) +([a-z_]+(?:, [a-z_]+)*)(?: {2,}|$)", table, re.M):
        for kind in m.group(2).split(", ") if m.group(1) != "0" else ():
            out[kind] = int(m.group(1))
    return out


def readme_exit_codes() -> dict[str, int]:
    """The README's exit-code table: the backticked kinds of each `| code | kind |` cell pair."""
    out: dict[str, int] = {}
    for line in README.read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        for code, words in zip(cells[::2], cells[1::2], strict=False):
            if code.isdigit():
                for kind in re.findall(r"`([a-z_]+)`", re.split(r"[(;]", words)[0]):
                    out[kind] = int(code)
    return out


def drawn_tree() -> list[tuple[str, str | None, str]]:
    """(class, parent drawn above it, the kind column) for each line of the docstring's drawing."""
    rows: list[tuple[str, str | None, str]] = []
    stack: list[str] = []
    for line in (errors.__doc__ or "").splitlines():
        m = re.match(r"^ {4}((?:│   |    )*)(?:[├└]── )?([A-Z]\w+Error)(?:\s+(.*))?$", line)
        if m is None:
            continue
        depth = len(m.group(1)) // 4 + (1 if "──" in line else 0)
        del stack[depth:]
        rows.append((m.group(2), stack[-1] if stack else None, m.group(3) or ""))
        stack.append(m.group(2))
    return rows


def error_classes() -> dict[str, type[BaseException]]:
    return {name: cls for name, cls in vars(errors).items()
            if inspect.isclass(cls) and issubclass(cls, BaseException) and cls.__module__ == errors.__name__}


def test_every_class_in_errors_is_under_the_one_root() -> None:
    classes = error_classes()
    assert len(classes) > 20
    for name, cls in classes.items():
        assert issubclass(cls, ShadowpointError), name
        assert isinstance(getattr(cls, "kind", None), str), name


def test_the_docstring_draws_the_real_tree() -> None:
    rows = drawn_tree()
    classes = error_classes()
    assert {name for name, _, _ in rows} == set(classes), "every class drawn, nothing else"
    for name, parent, column in rows:
        cls = classes[name]
        if parent is None:
            assert cls is ShadowpointError
        else:
            assert cls.__bases__ == (classes[parent],), f"{name} is drawn under {parent}"
        first = column.split()[0] if column else ""
        if re.fullmatch(r"[a-z_]+", first):
            assert getattr(cls, "kind", None) == first, f"{name}'s kind is drawn as {first}"


def test_every_protocol_error_kind_has_its_class() -> None:
    kinds = protocol_kinds()
    assert PROTOCOL_KINDS_COPY <= kinds, "the copy in this test names only kinds PROTOCOL.md has"
    for kind in kinds:
        assert kind in KIND_CLASSES, f"no class for the protocol's {kind}"
        assert KIND_CLASSES[ErrorKind(kind)].kind == kind
        assert not issubclass(KIND_CLASSES[ErrorKind(kind)], CliError), "a protocol kind is raised by the engine"


def test_every_cli_exit_code_has_its_class() -> None:
    documented = docstring_exit_codes()
    assert documented == {k: v for k, v in EXIT_CODES.items()}, "cli's docstring table is EXIT_CODES"
    assert readme_exit_codes().items() <= EXIT_CODES.items(), "the README's table agrees with EXIT_CODES"
    for kind in EXIT_CODES:
        assert kind in KIND_CLASSES, f"no class for exit code {EXIT_CODES[kind]} ({kind})"
        assert KIND_CLASSES[ErrorKind(kind)].kind == kind
    assert set(KIND_CLASSES) == set(EXIT_CODES), "every kind with a class has an exit code"


def test_error_kind_names_every_kind_and_nothing_else() -> None:
    assert set(ErrorKind) == set(KIND_CLASSES), "ErrorKind is the kinds errors.py raises"
    assert protocol_kinds() <= set(ErrorKind)
    assert error_kind("no_such_kind") is ErrorKind.INTERNAL


@pytest.mark.parametrize("kind", sorted(EXIT_CODES))
def test_cli_error_keeps_the_kind(kind: str) -> None:
    err = cli_error("message", kind)
    assert isinstance(err, CliError)
    assert isinstance(err, ShadowpointError)
    assert err.kind == kind
    assert str(err) == "message"


def test_no_module_defines_an_exception_of_its_own() -> None:
    """Exceptions live in errors.py; only module-private signals stay beside their code."""
    found: set[str] = set()
    for info in pkgutil.walk_packages(shadowpoint.__path__, "shadowpoint."):
        if info.name.endswith("__main__"):
            continue
        try:
            module = importlib.import_module(info.name)
        except ImportError:  # an optional extra (mcp) is not installed
            continue
        for name, cls in vars(module).items():
            if (inspect.isclass(cls) and issubclass(cls, BaseException)
                    and cls.__module__ == module.__name__ and module.__name__ != errors.__name__):
                found.add(f"{module.__name__}.{name}")
    assert found == MODULE_SIGNALS
