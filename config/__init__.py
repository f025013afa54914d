"""Configuration of shadowpoint: `Settings` (pydantic-settings, env prefix `SHADOWPOINT_`,
optional TOML file; in `settings`), a reader of the same sources without pydantic for the
commands that must start at once (`plain`), and the built-in exclusion lists (`exclusion_data`).

Loaded once at an entry point (CLI, sidecar `initialize`, library hook set-up) by
`load_settings()`; engine modules receive narrow option objects, never this module's globals.
This module imports no pydantic: `Settings` and `load_settings` are imported from `settings`
on first use (pydantic and pydantic-settings take ~150 ms to import, issue 13).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import platformdirs

if TYPE_CHECKING:
    from shadowpoint.config.settings import Settings as Settings
    from shadowpoint.config.settings import load_settings as load_settings

ENV_PREFIX = "SHADOWPOINT_"

DEFAULT_READ_ONLY_TOOLS: tuple[str, ...] = (
    "read_file",
    "list_files",
    "search_files",
    "list_code_definition_names",
    "find_references",
    "web_search",
    "web_fetch",
    "load_skill",
    "load_workflow",
    "browser_action",
    "ask_followup_question",
    "plan_mode_respond",
    "Read",
    "Glob",
    "Grep",
    "LS",
    "WebSearch",
    "WebFetch",
    "TodoWrite",
    "read_many_files",
    "glob",
    "google_web_search",
)


def default_config_file() -> Path:
    """The TOML file read when `SHADOWPOINT_CONFIG_FILE` is not set."""
    return Path(platformdirs.user_config_dir("shadowpoint")) / "config.toml"


def config_file() -> str:
    """The TOML file the settings are read from: `$SHADOWPOINT_CONFIG_FILE`, else the default
    (read when it is a file; `~` is expanded)."""
    return os.environ.get(f"{ENV_PREFIX}CONFIG_FILE") or str(default_config_file())


def default_docs_dir() -> Path:
    """`shadowpoint` under the OS Documents folder (SPEC §2)."""
    return Path(platformdirs.user_documents_dir()) / "shadowpoint"


def resolve_docs_dir(docs_dir: Path | None) -> Path:
    """The docs root a `docs_dir` setting names, with the platform default filled in."""
    return Path(os.path.abspath(docs_dir)) if docs_dir else default_docs_dir()


def protected_directories() -> dict[str, Path]:
    """The folders a workspace may not be (SPEC §7): home, Desktop, Documents, Downloads."""
    home = Path(os.path.expanduser("~"))
    found: dict[str, Path] = {"home": home}
    for name, getter in (
        ("Desktop", platformdirs.user_desktop_dir),
        ("Documents", platformdirs.user_documents_dir),
        ("Downloads", platformdirs.user_downloads_dir),
    ):
        found[name] = Path(getter())
    return found


def __getattr__(name: str) -> Any:
    """`Settings` and `load_settings`, imported (with pydantic) on first use."""
    if name in ("Settings", "load_settings"):
        import importlib

        return getattr(importlib.import_module("shadowpoint.config.settings"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
