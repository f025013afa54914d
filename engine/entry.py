"""The `shadowpoint` command's entry point: imports only what the command needs.

`shadowpoint serve` (the sidecar, on stdio or its socket) and `shadowpoint delete-task ID
--yes` (`quick`) start without click, rich or pydantic (the settings read by `config.plain`,
pydantic only for a value it cannot judge), `shadowpoint hook AGENT` (run on every tool call)
without any of them; every other command, and any of these in a form they do not take, goes
to the click CLI (`cli.app.main`).
structlog and the settings are imported without rich and asyncio (`lean_imports`); `logs`
renders a traceback with rich only on a terminal, importing it then.
"""

from __future__ import annotations

import importlib
import sys
import types
from types import ModuleType
from typing import Any


class _Deferred(types.ModuleType):
    """Stands in for a module its importers only use inside functions: the real one is
    imported on the first attribute they read (and replaces this one in sys.modules)."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        if sys.modules.get(self.__name__) is self:
            del sys.modules[self.__name__]
        return getattr(importlib.import_module(self.__name__), name)


LEAN_MODULES = ("structlog", "shadowpoint.config.settings")


def lean_imports(modules: tuple[str, ...] = LEAN_MODULES) -> None:
    """Import structlog and the settings (pydantic-settings) without what they import and a
    command does not use: rich (structlog.dev's default traceback formatter; importable again
    afterwards, the CLI's consoles import it when they print) and asyncio (structlog's and
    pydantic-settings' async helpers: imported on their first use). Measured with `python -X
    importtime`: ~100 ms and ~7 MiB of every process (issue 14). Only those of `modules` not
    loaded yet (the fast commands import structlog alone, and the settings only when they hand
    over to the click CLI)."""
    wanted = [name for name in modules if name not in sys.modules]
    if not wanted:
        return
    placed: dict[str, ModuleType | None] = {}
    if "rich" not in sys.modules:
        placed["rich"] = None  # `import rich` raises ImportError: structlog goes without it
    if "asyncio" not in sys.modules:
        placed["asyncio"] = _Deferred("asyncio")
    sys.modules.update(placed)  # type: ignore[arg-type]
    try:
        for name in wanted:
            importlib.import_module(name)
    finally:
        for name, module in placed.items():
            if name in sys.modules and sys.modules[name] is module:
                del sys.modules[name]


_SERVE_OPTIONS = {"--socket": str, "--idle-timeout": float, "--workspace": str}


def _serve_options(args: list[str]) -> dict[str, str | float] | None:
    """The options of `serve [--socket P] [--idle-timeout S] [--workspace DIR]` (each with its
    value as a separate word, as hookrun spawns it), or None for anything else (help, `=`
    forms, a bad value): the click CLI parses and reports those."""
    if not args or args[0] != "serve" or len(args) % 2 == 0:
        return None
    out: dict[str, str | float] = {}
    for name, value in zip(args[1::2], args[2::2], strict=True):
        kind = _SERVE_OPTIONS.get(name)
        if kind is None or name in out or value.startswith("-"):
            return None
        try:
            out[name] = kind(value)
        except ValueError:
            return None
    if ("--idle-timeout" in out or "--workspace" in out) and "--socket" not in out:
        return None  # the CLI's own message for options that need --socket
    return out


def _serve(options: dict[str, str | float]) -> int | None:
    """`shadowpoint serve` without click, or None when the click CLI must answer (a setting
    that does not load, a sidecar already listening: the CLI reports it as for any command)."""
    try:
        from shadowpoint.config.plain import plain_settings, read_plain_settings
        from shadowpoint.logs import configure_logging

        settings = read_plain_settings()  # no pydantic: the first answer comes ~0.13 s sooner
        if settings is None:  # a value only `Settings` can judge
            lean_imports()
            from shadowpoint.config import load_settings

            settings = plain_settings(load_settings())
        configure_logging(settings.log_level, settings.log_format, settings.log_file)
    except Exception:
        return None
    from shadowpoint.store.shadow_repo import isolate_libgit2

    isolate_libgit2()
    if "--socket" in options:
        from shadowpoint.errors import SidecarRunningError
        from shadowpoint.sidecar.socket_server import serve_socket

        idle = options.get("--idle-timeout")
        http_root = options.get("--workspace")
        try:
            return serve_socket(str(options["--socket"]), settings, float(idle) if idle is not None else None,
                                str(http_root) if http_root is not None else None)
        except SidecarRunningError:
            return None
    from shadowpoint.sidecar.server import serve_stdio

    return serve_stdio(settings)


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit status (`cli.app.main`'s)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) == 2 and args[0] == "hook" and not args[1].startswith("-"):
        from shadowpoint.hookrun import main as hook_main

        return hook_main([args[1]])
    if args[:1] == ["delete-task"]:
        from shadowpoint.cli import quick

        command = quick.parse(args)
        if command is not None:
            lean_imports(("structlog",))
            code = command.run()
            if code is not None:
                return code
    options = _serve_options(args)
    if options is not None:
        lean_imports(("structlog",))
        code = _serve(options)
        if code is not None:
            return code
    lean_imports()
    from shadowpoint.cli.app import main as cli_main

    return cli_main(args)
