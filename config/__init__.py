"""Configuration of shadowpoint: `Settings` (pydantic-settings, env prefix `SHADOWPOINT_`,
optional TOML file) and the built-in exclusion lists (`exclusion_data`).

Loaded once at an entry point (CLI, sidecar `initialize`, library hook set-up) by
`load_settings()`; engine modules receive narrow option objects, never this module's globals.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

import platformdirs
from pydantic import Field
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

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


def default_docs_dir() -> Path:
    """`shadowpoint` under the OS Documents folder (SPEC §2)."""
    return Path(platformdirs.user_documents_dir()) / "shadowpoint"


class Settings(BaseSettings):
    """Every knob of shadowpoint; each has a safe default so nothing needs configuring."""

    model_config = SettingsConfigDict(env_prefix="SHADOWPOINT_", extra="ignore")

    docs_dir: Path | None = Field(default=None, description="docs root; default <Documents>/shadowpoint")
    init_warn_s: float = Field(default=15.0, gt=0, description="warn that the repo may be large after this")
    init_timeout_s: float = Field(default=600.0, gt=0, description="initialisation fails after this")
    read_only_tools: list[str] = Field(default_factory=lambda: list(DEFAULT_READ_ONLY_TOOLS))
    extra_exclusions: list[str] = Field(default_factory=list, description="gitignore patterns")
    max_file_bytes: int = Field(default=100 * 1024 * 1024, gt=0, description="larger files are skipped")
    hash_workers: int | None = Field(
        default=None, ge=0, le=16,
        description="processes that hash big scans (our own interpreter); 0: none; default: one per core, up to 4")
    watcher: bool = True
    watcher_observer: Literal["inotify", "portable"] = Field(
        default="inotify",
        description="inotify: our own observer on Linux (elsewhere the portable one); "
                    "portable: watchdog's stock observer, as on macOS and Windows, every command round rescans")
    watch_debounce_s: float = Field(default=2.0, gt=0, description="quiet period of `shadowpoint watch`")
    lock_timeout_s: float = Field(default=30.0, gt=0)
    retention_max_age_days: float | None = Field(default=None, gt=0, description="delete older tasks")
    retention_max_tasks: int | None = Field(default=None, gt=0, description="keep at most this many tasks")
    retention_max_bytes: int | None = Field(default=None, gt=0, description="shadow repos' total size cap")
    gc_grace_s: float = Field(default=3600.0, ge=0, description="unreachable objects younger than this stay")
    log_format: Literal["console", "json"] = "console"
    log_level: Literal["debug", "info", "warning", "error"] = "warning"
    log_file: Path | None = None

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        toml_path = os.environ.get("SHADOWPOINT_CONFIG_FILE") or str(default_config_file())
        toml = TomlConfigSettingsSource(settings_cls, toml_file=toml_path)
        return (init_settings, env_settings, toml)

    def resolved_docs_dir(self) -> Path:
        """The docs root, with the platform default filled in."""
        return Path(os.path.abspath(self.docs_dir)) if self.docs_dir else default_docs_dir()


def load_settings(**overrides: Any) -> Settings:
    """Read environment and TOML file once; keyword overrides win (e.g. from `initialize`)."""
    return Settings(**overrides)


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
