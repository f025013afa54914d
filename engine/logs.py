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

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}


def configure_logging(level: str = "warning", fmt: str = "console", file: Path | None = None,
                      *, cache_loggers: bool = True) -> None:
    """Send structured logs to `file` (or stderr) at `level`, as JSON lines or console text.

    A library host should pass `cache_loggers=False`, so its own later structlog set-up
    (or `structlog.testing.capture_logs`) still reaches our module loggers.
    """
    stream: TextIO = open(file, "a", encoding="utf-8") if file else sys.stderr
    renderer: Any = (
        structlog.processors.JSONRenderer()
        if fmt == "json"
        else structlog.dev.ConsoleRenderer(colors=stream.isatty())
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
