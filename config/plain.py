"""`read_plain_settings`: the settings (`PlainSettings`, every field) for the sidecar and the fast
commands, read from the same sources as `Settings` (`SHADOWPOINT_*` variables, then the TOML file
`config_file()` names, then the defaults) without importing pydantic (~150 ms, issue 13).

Used at start-up, on the main thread, by the sidecar (`entry`: its first answer comes ~130 ms
sooner without pydantic, issue 11) and by `shadowpoint.cli.quick`. It proves, not guesses: every
variable and TOML key naming a field of `Settings` is checked with a grammar narrower than
pydantic's, and on anything it cannot prove valid or unambiguous
it returns None: the caller then loads the full `Settings`, which accepts the value or reports
it as it does for every command. tests/unit/test_config_plain.py holds both readers to the
same answers, field by field.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from shadowpoint.config import DEFAULT_READ_ONLY_TOOLS, ENV_PREFIX, config_file, resolve_docs_dir

if TYPE_CHECKING:
    from shadowpoint.config.settings import Settings


class _Unproven(Exception):
    """A value the plain reader cannot show that `Settings` reads the same way."""


@dataclass(frozen=True, slots=True)
class PlainSettings:
    """Every field of `Settings` as a plain value, with `Settings`' defaults (the tests compare
    them field by field): what the sidecar and the fast commands hold instead of `Settings`."""

    docs_dir: Path | None = None
    init_warn_s: float = 15.0
    init_timeout_s: float = 600.0
    read_only_tools: list[str] = field(default_factory=lambda: list(DEFAULT_READ_ONLY_TOOLS))
    extra_exclusions: list[str] = field(default_factory=list)
    max_file_bytes: int = 100 * 1024 * 1024
    hash_workers: int | None = None
    watcher: bool = True
    watcher_observer: Literal["inotify", "portable"] = "inotify"
    verify_interval_s: float = 60.0
    verify_cpu_share: float = 0.05
    watch_debounce_s: float = 2.0
    lock_timeout_s: float = 30.0
    retention_max_age_days: float | None = None
    retention_max_tasks: int | None = None
    retention_max_bytes: int | None = None
    gc_grace_s: float = 3600.0
    log_format: Literal["console", "json"] = "console"
    log_level: Literal["debug", "info", "warning", "error"] = "warning"
    log_file: Path | None = None

    def resolved_docs_dir(self) -> Path:
        """The docs root, with the platform default filled in (as `Settings.resolved_docs_dir`)."""
        return resolve_docs_dir(self.docs_dir)

    def values(self) -> dict[str, Any]:
        """Every field's value, by name."""
        return {name: getattr(self, name) for name in FIELDS}


@dataclass(frozen=True, slots=True)
class _Kind:
    """How one field's value is read: from an environment string, and from a TOML value."""

    env: Callable[[str], Any]
    toml: Callable[[Any], Any]


# Narrower than pydantic: no sign, exponent, `_`, whitespace, inf or nan (pydantic takes
# those; here they mean "ask `Settings`").
_DECIMAL = re.compile(r"[0-9]{1,15}(?:\.[0-9]{1,15})?")
_INTEGER = re.compile(r"[0-9]{1,18}")
_BOOLS = {"1": True, "true": True, "yes": True, "on": True, "t": True, "y": True,
          "0": False, "false": False, "no": False, "off": False, "f": False, "n": False}


def _check(ok: bool) -> None:
    if not ok:
        raise _Unproven()


def _number(kind: type[int] | type[float], *, gt: float | None = None, ge: float | None = None,
            le: float | None = None) -> _Kind:
    def bounded(value: int | float) -> Any:
        try:
            _check(math.isfinite(value))
        except OverflowError:  # an int beyond any float
            raise _Unproven() from None
        _check((gt is None or value > gt) and (ge is None or value >= ge) and (le is None or value <= le))
        return kind(value)

    def from_env(text: str) -> Any:
        _check(bool((_DECIMAL if kind is float else _INTEGER).fullmatch(text)))
        return bounded(kind(text))

    def from_toml(value: Any) -> Any:
        # bool is an int to Python, and pydantic reads true as 1: not ours to prove
        allowed: tuple[type, ...] = (int, float) if kind is float else (int,)
        _check(type(value) in allowed)
        return bounded(value)

    return _Kind(from_env, from_toml)


def _path_env(text: str) -> Path:
    _check(text != "" and "\0" not in text)  # pydantic reads "" as the current folder
    return Path(text)


def _path_toml(value: Any) -> Path:
    _check(type(value) is str)
    return _path_env(value)


def _bool_env(text: str) -> bool:
    _check(text.lower() in _BOOLS)
    return _BOOLS[text.lower()]


def _bool_toml(value: Any) -> bool:
    _check(type(value) is bool)
    return bool(value)


def _choice(*allowed: str) -> _Kind:
    def pick(value: Any) -> str:
        _check(type(value) is str and value in allowed)
        return str(value)

    return _Kind(pick, pick)


def _strings_toml(value: Any) -> list[str]:
    _check(type(value) is list and all(type(item) is str for item in value))
    return list(value)


def _strings_env(text: str) -> list[str]:
    try:
        value = json.loads(text)  # pydantic-settings reads a list from the environment as JSON
    except ValueError:
        raise _Unproven() from None
    return _strings_toml(value)


_PATH = _Kind(_path_env, _path_toml)
_STRINGS = _Kind(_strings_env, _strings_toml)
_POSITIVE_FLOAT = _number(float, gt=0)
_POSITIVE_INT = _number(int, gt=0)

# Every field of `Settings` (a value of any of them that `Settings` rejects fails every command,
# so each is checked here too); `test_config_plain` fails when the two lists differ.
FIELDS: dict[str, _Kind] = {
    "docs_dir": _PATH,
    "init_warn_s": _POSITIVE_FLOAT,
    "init_timeout_s": _POSITIVE_FLOAT,
    "read_only_tools": _STRINGS,
    "extra_exclusions": _STRINGS,
    "max_file_bytes": _POSITIVE_INT,
    "hash_workers": _number(int, ge=0, le=16),
    "watcher": _Kind(_bool_env, _bool_toml),
    "watcher_observer": _choice("inotify", "portable"),
    "verify_interval_s": _number(float, ge=0),
    "verify_cpu_share": _number(float, gt=0, le=1),
    "watch_debounce_s": _POSITIVE_FLOAT,
    "lock_timeout_s": _POSITIVE_FLOAT,
    "retention_max_age_days": _POSITIVE_FLOAT,
    "retention_max_tasks": _POSITIVE_INT,
    "retention_max_bytes": _POSITIVE_INT,
    "gc_grace_s": _number(float, ge=0),
    "log_format": _choice("console", "json"),
    "log_level": _choice("debug", "info", "warning", "error"),
    "log_file": _PATH,
}


def _from_env(environ: Mapping[str, str]) -> dict[str, Any]:
    prefix = ENV_PREFIX.lower()
    out: dict[str, Any] = {}
    for key, text in environ.items():
        name = key.lower()  # pydantic-settings matches variables case-insensitively
        if not name.startswith(prefix) or name[len(prefix):] not in FIELDS:
            continue
        name = name[len(prefix):]
        _check(name not in out)  # two spellings of one variable: which one wins is not ours to say
        out[name] = FIELDS[name].env(text)
    return out


def _from_toml(file: str) -> dict[str, Any]:
    try:
        path = Path(file).expanduser()
        if not path.is_file():
            return {}
        import tomllib

        with path.open("rb") as fh:
            data = tomllib.load(fh)
    except (OSError, RuntimeError, ValueError):  # RuntimeError: `~` without a home
        raise _Unproven() from None
    out: dict[str, Any] = {}
    for key, value in data.items():
        name = key.lower()
        if name not in FIELDS:
            continue  # pydantic-settings ignores other keys (extra="ignore")
        _check(key == name)  # `DOCS_DIR = …` counts too, but alongside `docs_dir` which wins?
        out[name] = FIELDS[name].toml(value)
    return out


def read_values() -> dict[str, Any] | None:
    """Every field the environment or the TOML file sets, as `Settings` would hold it (the
    environment wins); None when a value is not provably one that `Settings` reads the same."""
    try:
        values = _from_toml(config_file())
        values.update(_from_env(os.environ))
    except _Unproven:
        return None
    return values


def read_plain_settings() -> PlainSettings | None:
    """The settings, or None: then load the full `Settings` instead (`load_plain_settings`)."""
    values = read_values()
    if values is None:
        return None
    return PlainSettings(**values)


def plain_settings(settings: Settings | PlainSettings) -> PlainSettings:
    """`settings` as a plain value."""
    if isinstance(settings, PlainSettings):
        return settings
    return PlainSettings(**{name: getattr(settings, name) for name in FIELDS})


def load_plain_settings() -> PlainSettings:
    """The settings without pydantic when the plain reader proves them, else read by `Settings`
    (which reports a value it refuses as it does for every command).

    Raises:
        pydantic.ValidationError: a value `Settings` refuses.
    """
    plain = read_plain_settings()
    if plain is not None:
        return plain
    from shadowpoint.config.settings import load_settings

    return plain_settings(load_settings())
