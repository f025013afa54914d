"""`Settings`: every knob of shadowpoint (pydantic-settings: environment variables with the
prefix `SHADOWPOINT_`, then the TOML file `config_file()` names, then the defaults).

Imported through `shadowpoint.config` on first use. `shadowpoint.config.plain` reads the same
sources without pydantic for the commands that must start at once; its tests hold the two to
the same answers, so a field added here is added there too.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from shadowpoint.config import DEFAULT_READ_ONLY_TOOLS, ENV_PREFIX, config_file, resolve_docs_dir


class Settings(BaseSettings):
    """Every knob of shadowpoint; each has a safe default so nothing needs configuring."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore")

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
    verify_interval_s: float = Field(
        default=60.0, ge=0, description="seconds between the verification passes of a healthy watcher (0: none)")
    verify_cpu_share: float = Field(default=0.05, gt=0, le=1, description="share of one core a verification pass takes")
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
        toml = TomlConfigSettingsSource(settings_cls, toml_file=config_file())
        return (init_settings, env_settings, toml)

    def resolved_docs_dir(self) -> Path:
        """The docs root, with the platform default filled in."""
        return resolve_docs_dir(self.docs_dir)


def load_settings(**overrides: Any) -> Settings:
    """Read environment and TOML file once; keyword overrides win (e.g. from `initialize`)."""
    return Settings(**overrides)
