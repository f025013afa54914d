"""Logging set-up (structlog) for the entry points: to stderr or a file, never stdout.

Called once by the CLI before anything logs; engine modules only call
`structlog.get_logger(__name__)`.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any, TextIO

import structlog
from structlog.typing import ExcInfo

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}


def _rich_traceback(sio: TextIO, exc_info: ExcInfo) -> None:
    """A traceback for a terminal, by rich (imported on the first one)."""
    from rich.console import Console
    from rich.traceback import Traceback

    sio.write("\n")
    Console(file=sio, color_system="truecolor", width=100).print(Traceback.from_exception(*exc_info))


def configure_logging(level: str = "warning", fmt: str = "console", file: Path | None = None,
                      *, cache_loggers: bool = True) -> None:
    """Send structured logs to `file` (or stderr) at `level`, as JSON lines or console text.

    A library host should pass `cache_loggers=False`, so its own later structlog set-up
    (or `structlog.testing.capture_logs`) still reaches our module loggers.
    """
    stream: TextIO = open(file, "a", encoding="utf-8") if file else sys.stderr
    tty = stream.isatty()
    renderer: Any = (
        structlog.processors.JSONRenderer()
        if fmt == "json"
        # rich only for a traceback on a terminal, imported then (`entry` loads structlog without it)
        else structlog.dev.ConsoleRenderer(
            colors=tty, exception_formatter=_rich_traceback if tty else structlog.dev.plain_traceback)
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso"),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS.get(level, logging.WARNING)),
        logger_factory=structlog.PrintLoggerFactory(file=stream),
        cache_logger_on_first_use=cache_loggers,
    )
