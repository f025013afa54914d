"""`shadowpoint.config.plain` against `Settings`: generated environments and TOML files (valid
values, pydantic's looser forms, wrong types, two spellings of one key, broken files, the
file found by `SHADOWPOINT_CONFIG_FILE`, `~` or the default place); whatever the plain reader
answers, `Settings` answers the same, and where `Settings` refuses, the plain reader hands over."""

from __future__ import annotations

import contextlib
import json
import math
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from shadowpoint.config import Settings, default_config_file
from shadowpoint.config.plain import FIELDS, PlainSettings, read_plain_settings, read_values

CATEGORY = {
    "docs_dir": "path", "log_file": "path",
    "init_warn_s": "float", "init_timeout_s": "float", "watch_debounce_s": "float", "lock_timeout_s": "float",
    "retention_max_age_days": "float", "gc_grace_s": "float", "verify_interval_s": "float", "verify_cpu_share": "float",
    "max_file_bytes": "int", "hash_workers": "int", "retention_max_tasks": "int", "retention_max_bytes": "int",
    "read_only_tools": "strings", "extra_exclusions": "strings",
    "watcher": "bool", "log_format": "format", "log_level": "level", "watcher_observer": "observer",
}
ENV_TEXTS: dict[str, list[str]] = {
    "path": ["/abs/docs", "rel/docs", "", "~/x", " /x ", "None", "null", "dir with space/ç"],
    "float": ["0", "0.5", "1", "30", "3600", "12.25", "00.1", "0.0", "1e3", "inf", "nan", "-1", "-0", " 5", "5 ",
              "1_0", "+1", ".5", "5.", "", "abc", "true", "1" * 20],
    "int": ["0", "1", "16", "17", "05", "4096", "1_000", "5.0", "-1", "", " 3", "abc", "true", "9" * 30],
    "bool": ["true", "false", "TRUE", "True", "1", "0", "yes", "no", "on", "off", "t", "f", "y", "n", "Y", "2",
             "", "tru", " true"],
    "format": ["console", "json", "JSON", "", " json"],
    "level": ["debug", "info", "warning", "error", "INFO", "warn", ""],
    "observer": ["inotify", "portable", "Portable", "", " inotify", "fsevents"],
    "strings": ["[]", '["a"]', '["*.log", "!keep.log"]', '["a", 1]', "a,b", "", "null", '{"a": 1}', '"a"', '[""]',
                ' ["a"] '],
}
TOML_VALUES: dict[str, list[Any]] = {
    "path": ["/abs/docs", "rel/docs", "", "~/x", 5, True, ["x"]],
    "float": [0, 1, 0.5, 3600, 12.25, 0.0, -1, -0.0, True, "5", math.inf, math.nan, [1], 10**400],
    "int": [0, 1, 16, 17, 4096, -1, 2.0, True, "5", 10**30],
    "bool": [True, False, 1, 0, "yes", "true"],
    "format": ["console", "json", "JSON", 1, ""],
    "level": ["debug", "info", "warning", "error", "INFO", 0],
    "observer": ["inotify", "portable", "PORTABLE", 1, ""],
    "strings": [[], ["a"], ["*.log", "!keep.log"], ["a", 1], "a", [["a"]]],
}
TEXT = st.text(st.characters(blacklist_categories=["Cs"], blacklist_characters="\0"), max_size=6)


def test_every_field_of_settings_is_known_to_the_plain_reader() -> None:
    assert set(FIELDS) == set(Settings.model_fields) == set(CATEGORY)
    assert set(PlainSettings.__dataclass_fields__) == set(FIELDS), "the sidecar holds every setting as a plain value"


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return "nan" if math.isnan(value) else ("inf" if math.isinf(value) else repr(value))
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return json.dumps(value)
    return "[" + ", ".join(_toml(v) for v in value) + "]"


def _spell(name: str, how: str) -> str:
    key = f"SHADOWPOINT_{name}"
    return {"upper": key.upper(), "lower": key.lower(), "mixed": key.title()}[how]


@st.composite
def sources(draw: st.DrawFn) -> dict[str, Any]:
    env: dict[str, str] = {}
    for name in draw(st.lists(st.sampled_from(sorted(FIELDS)), unique=True, max_size=4)):
        cat = CATEGORY[name]
        texts = draw(st.lists(TEXT if draw(st.integers(0, 5)) == 0 else st.sampled_from(ENV_TEXTS[cat]),
                              min_size=1, max_size=1 if draw(st.integers(0, 5)) else 2))
        hows = draw(st.permutations(["upper", "lower", "mixed"]))
        for text, how in zip(texts, hows, strict=False):  # two texts: two spellings of one variable
            env[_spell(name, how)] = text
    lines = []
    for name in draw(st.lists(st.sampled_from(sorted(FIELDS)), unique=True, max_size=4)):
        value = draw(st.sampled_from(TOML_VALUES[CATEGORY[name]]))
        key = name.upper() if draw(st.integers(0, 9)) == 0 else name
        lines.append(f"{key} = {_toml(value)}")
    if draw(st.integers(0, 14)) == 0:
        lines.append("docs_dir = ")  # not TOML
    if draw(st.integers(0, 14)) == 0:
        lines.append("unknown_key = 1\n[table]\ndocs_dir = 5")  # ignored, as extra keys are
    where = draw(st.sampled_from(["env", "tilde", "default", "none", "empty-var"]))
    return {"env": env, "toml": "\n".join(lines) + "\n", "where": where}


@contextlib.contextmanager
def _environment(env: dict[str, str]) -> Iterator[None]:
    saved = {k: v for k, v in os.environ.items() if k.upper().startswith("SHADOWPOINT_")}
    for key in saved:
        del os.environ[key]
    os.environ.update(env)
    try:
        yield
    finally:
        for key in [k for k in os.environ if k.upper().startswith("SHADOWPOINT_")]:
            del os.environ[key]
        os.environ.update(saved)


def _place_config(case: dict[str, Any], tmp: Path) -> dict[str, str]:
    home = Path(os.environ["HOME"])
    files = {"env": tmp / "given.toml", "tilde": home / "tilde.toml", "default": default_config_file()}
    for f in files.values():
        f.unlink(missing_ok=True)
    extra = {"env": {"SHADOWPOINT_CONFIG_FILE": str(files["env"])},
             "tilde": {"SHADOWPOINT_CONFIG_FILE": "~/tilde.toml"},
             "none": {"SHADOWPOINT_CONFIG_FILE": str(tmp / "missing.toml")},
             "empty-var": {"SHADOWPOINT_CONFIG_FILE": ""}}.get(case["where"], {})
    target = files.get(case["where"], default_config_file() if case["where"] == "empty-var" else None)
    if target is not None:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(case["toml"], encoding="utf-8")
    return extra


def _same(a: Any, b: Any) -> bool:
    return type(a) is type(b) and a == b


def _compare(case: dict[str, Any], tmp: Path) -> str:
    """Both readers on one case; what happened ("plain", "handed over" or "both refuse")."""
    extra = _place_config(case, tmp)
    with _environment({**case["env"], **extra}):
        try:
            full: Settings | None = Settings()
        except Exception:
            full = None
        values = read_values()
        plain = read_plain_settings()
    if full is None:
        assert values is None and plain is None, f"Settings refuses what the plain reader accepts: {values}"
        return "both refuse"
    if values is None:
        assert plain is None
        return "handed over"
    for name, value in values.items():
        assert _same(value, getattr(full, name)), (name, value, getattr(full, name))
    assert plain is not None
    for name in PlainSettings.__dataclass_fields__:
        assert _same(getattr(plain, name), getattr(full, name)), (name, getattr(plain, name), getattr(full, name))
    assert plain.resolved_docs_dir() == full.resolved_docs_dir()
    return "plain"


@hypothesis_settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=sources())
def test_the_plain_reader_agrees_with_settings_or_hands_over(case: dict[str, Any], tmp_path: Path) -> None:
    event(_compare(case, tmp_path))  # --hypothesis-show-statistics: how often each answer came


def test_every_candidate_value_of_every_field_alone(tmp_path: Path) -> None:
    """Each field with each candidate, alone in the environment and alone in the TOML file."""
    seen: set[str] = set()
    for name, cat in sorted(CATEGORY.items()):
        for text in ENV_TEXTS[cat]:
            seen.add(_compare({"env": {f"SHADOWPOINT_{name.upper()}": text}, "toml": "", "where": "none"}, tmp_path))
        for value in TOML_VALUES[cat]:
            seen.add(_compare({"env": {}, "toml": f"{name} = {_toml(value)}\n", "where": "env"}, tmp_path))
    assert seen == {"plain", "handed over", "both refuse"}


def test_defaults_everyday_values_and_precedence_are_read_without_handing_over(tmp_path: Path) -> None:
    everyday: list[dict[str, Any]] = [
        {"env": {}, "toml": "", "where": "none"},
        {"env": {"SHADOWPOINT_DOCS_DIR": "/srv/docs", "SHADOWPOINT_GC_GRACE_S": "0",
                 "SHADOWPOINT_LOG_LEVEL": "error"}, "toml": "", "where": "none"},
        {"env": {}, "toml": 'docs_dir = "/from/toml"\ngc_grace_s = 60\nlog_format = "json"\nlog_file = "sp.log"\n'
                            'extra_exclusions = ["*.log", "!keep.log"]\nhash_workers = 0\nwatcher = false\n',
         "where": "default"},
        {"env": {"SHADOWPOINT_DOCS_DIR": "rel/env", "SHADOWPOINT_GC_GRACE_S": "12.5",
                 "SHADOWPOINT_EXTRA_EXCLUSIONS": '["*.tmp"]', "SHADOWPOINT_WATCHER": "no"},
         "toml": 'docs_dir = "/from/toml"\ngc_grace_s = 60\nlog_level = "info"\n', "where": "env"},
        {"env": {"SHADOWPOINT_LOG_LEVEL": "debug"}, "toml": 'log_level = "error"\n', "where": "tilde"},
    ]
    for case in everyday:
        assert _compare(case, tmp_path) == "plain", case
    with _environment({"SHADOWPOINT_DOCS_DIR": "rel/env", "SHADOWPOINT_CONFIG_FILE": str(tmp_path / "given.toml")}):
        (tmp_path / "given.toml").write_text('docs_dir = "/from/toml"\ngc_grace_s = 7\n')
        assert read_plain_settings() == PlainSettings(docs_dir=Path("rel/env"), gc_grace_s=7.0)


@pytest.mark.parametrize(("env", "toml"), [
    ({"SHADOWPOINT_GC_GRACE_S": "nan"}, ""),
    ({"SHADOWPOINT_LOG_LEVEL": "INFO"}, ""),
    ({"SHADOWPOINT_MAX_FILE_BYTES": "0"}, ""),  # a field delete-task does not read fails every command
    ({}, "hash_workers = 17\n"),
    ({}, "docs_dir = \n"),
])
def test_what_settings_refuses_is_handed_over(env: dict[str, str], toml: str, tmp_path: Path) -> None:
    assert _compare({"env": env, "toml": toml, "where": "env"}, tmp_path) == "both refuse"


def test_reading_plain_settings_imports_no_pydantic() -> None:
    probe = ("import sys; from shadowpoint.config.plain import read_plain_settings; read_plain_settings(); "
             "print(sorted(m for m in sys.modules if m.split('.')[0] in ('pydantic', 'pydantic_core', "
             "'pydantic_settings', 'click', 'rich')))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_verification_settings_reach_the_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    """`verify_interval_s` (0: no verification pass) and `verify_cpu_share` (a share of one
    core, above 0 and at most 1) reach the engine's options; a share out of range is refused."""
    from pydantic import ValidationError

    from shadowpoint.options import EngineOptions

    assert (EngineOptions.from_settings(Settings()).verify_interval_s, Settings().verify_cpu_share) == (60.0, 0.05)
    monkeypatch.setenv("SHADOWPOINT_VERIFY_INTERVAL_S", "0")
    monkeypatch.setenv("SHADOWPOINT_VERIFY_CPU_SHARE", "0.5")
    options = EngineOptions.from_settings(Settings())
    assert (options.verify_interval_s, options.verify_cpu_share) == (0.0, 0.5)
    for bad in ("0", "1.5"):
        monkeypatch.setenv("SHADOWPOINT_VERIFY_CPU_SHARE", bad)
        with pytest.raises(ValidationError):
            Settings()
