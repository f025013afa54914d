"""How the command line answers, without click or rich: the exit code of each error kind, the
one-line error report (and its JSON under `--json`), JSON output, and stdout as plain text.

Shared by the click commands (`app` and the command modules) and those that start without
click (`quick`), so both answer alike. Runs on the main thread. The exit-code table is in `shadowpoint.cli`'s docstring.
"""

from __future__ import annotations

import errno
import functools
import json
import os
import sys
from typing import TYPE_CHECKING, Any, NoReturn

from shadowpoint.errors import AbortedError, CliError, cli_error

if TYPE_CHECKING:
    from rich.console import Console

EXIT_CODES: dict[str, int] = {
    "internal": 1,
    "usage": 2,
    "invalid_params": 2,
    "no_workspace": 3,
    "protected_directory": 4,
    "path_outside_workspace": 5,
    "unknown_task": 10,
    "unknown_checkpoint": 11,
    "ambiguous_checkpoint": 12,
    "unknown_message": 13,
    "no_file_snapshot": 20,
    "already_restored": 21,
    "nothing_to_undo": 22,
    "restore_failed": 23,
    "restore_conflict": 24,
    "init_timeout": 30,
    "init_failed": 31,
    "checkpoints_disabled": 32,
    "storage_failed": 33,
    "lock_timeout": 40,
    "sidecar_running": 41,
    "sidecar_unavailable": 42,
    "confirmation_required": 50,
    "aborted": 51,
    "doctor_problems": 60,
    "interrupted": 130,
}


STDOUT_CLOSED = 141  # 128 + SIGPIPE: what a shell shows for git (or cat) whose reader quit early


def is_stdout_closed() -> bool:
    """Whether stdout is a pipe (or socket) whose reader has gone (`shadowpoint diff | head -1`)."""
    import select

    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))
    except (AttributeError, OSError, ValueError):  # no poll, or stdout is no file
        return False


def stdout_closed() -> int:
    """After stdout's reader quit: send what is still buffered to /dev/null (so the interpreter's
    last flush raises nothing) and answer the exit code; no message, no traceback."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    finally:
        os.close(devnull)
    return STDOUT_CLOSED


def fail(message: str, kind: str) -> NoReturn:
    raise cli_error(message, kind)


class PlainOut:
    """stdout when it is not a terminal: plain text is written as the rich console would
    write it (no markup, highlighting or wrapping there), without importing rich (~100 ms of
    a short command, issue 13); anything else (tables, tabs, control characters, options)
    goes to the rich console."""

    is_terminal = False

    def __init__(self) -> None:
        self._rich: Console | None = None

    @property
    def rich(self) -> Console:
        if self._rich is None:
            self._rich = rich_console(highlight=False, emoji=False, markup=False, soft_wrap=True)
        return self._rich

    @property
    def width(self) -> int:
        return self.rich.width

    def print(self, *objects: Any, **options: Any) -> None:
        texts = [o for o in objects if isinstance(o, str)]
        text = " ".join(texts)
        if options or len(texts) != len(objects) or not text.replace("\n", "").isprintable():
            self.rich.print(*objects, **options)
            return
        sys.stdout.write(text + "\n")
        sys.stdout.flush()


def stdout_console() -> Console | PlainOut:
    """The console of stdout: rich's on a terminal (or when colour is forced), else `PlainOut`."""
    if not sys.stdout.isatty() and "FORCE_COLOR" not in os.environ and "TTY_COMPATIBLE" not in os.environ:
        return PlainOut()
    return rich_console(highlight=False, emoji=False, markup=False, soft_wrap=True)


def rich_console(**options: Any) -> Console:
    """A rich console whose broken pipe raises `BrokenPipeError` (for `cli.app` to answer),
    where rich's own exits 1 (`internal` here)."""
    return _quiet_console_class()(**options)


@functools.cache
def _quiet_console_class() -> type[Console]:
    from rich.console import Console

    class PipeConsole(Console):
        def on_broken_pipe(self) -> None:
            self.quiet = True
            raise BrokenPipeError(errno.EPIPE, os.strerror(errno.EPIPE))

    return PipeConsole


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, ensure_ascii=False) + "\n")
    sys.stdout.flush()


def header(task: str, root: str | os.PathLike[str], extra: str = "") -> str:
    """The line every command's output for people starts with: which task of which workspace."""
    return f"Task {task} · {os.fspath(root)}" + (f" · {extra}" if extra else "")


def when(stamp: str | int | None) -> str:
    """A time as people read it everywhere in the CLI: local `YYYY-MM-DD HH:MM:SS`, the seconds
    cut, not rounded. `stamp` is an ISO text (a `createdAt`) or epoch milliseconds (a `ts`);
    a text that is neither comes back as it is ("" for None)."""
    from datetime import datetime

    try:
        moment = datetime.fromtimestamp(stamp / 1000) if isinstance(stamp, int) else \
            datetime.fromisoformat(str(stamp or "").replace("Z", "+00:00")).astimezone()
    except (OverflowError, OSError, ValueError):
        return str(stamp or "")
    return moment.strftime("%Y-%m-%d %H:%M:%S")


def people_words(message: str) -> str:
    """An engine message as a person reads it: times instead of raw `ts=…` milliseconds,
    commands instead of protocol methods."""
    import re

    message = re.sub(r"\bts=['\"]?(\d{10,16})['\"]?", lambda m: when(int(m.group(1))), message)
    message = message.replace("start it with task/start first", "it has no checkpoints yet (`shadowpoint save` "
                              "makes the first)")
    return message.replace("task/start", "`shadowpoint save`")


def report(message: str, kind: str, as_json: bool = False) -> int:
    """One line on stderr (and with --json, the error as JSON on stdout); the kind's exit code."""
    message = people_words(message)
    first = message.strip().splitlines()[0] if message.strip() else kind
    code = EXIT_CODES.get(kind, EXIT_CODES["internal"])
    sys.stderr.write(f"shadowpoint: error: {first}\n")
    if as_json:
        print_json({"error": {"kind": kind, "message": message.strip(), "exitCode": code}})
    return code


def report_exception(exc: Exception | KeyboardInterrupt, as_json: bool) -> int:
    """The answer to what a command raised (past click's own exceptions): a calm line for a
    no, the error's kind and message for ours, a traceback for anything else; the exit code."""
    if isinstance(exc, AbortedError):
        sys.stderr.write("Nothing was changed.\n")
        if as_json:
            print_json({"aborted": True, "changed": False})
        return EXIT_CODES["aborted"]
    if isinstance(exc, CliError):
        return report(str(exc), exc.kind, as_json)
    if isinstance(exc, KeyboardInterrupt):
        sys.stderr.write("shadowpoint: interrupted\n")
        return EXIT_CODES["interrupted"]
    from shadowpoint.errors import ShadowpointError

    if isinstance(exc, ShadowpointError):
        return report(str(exc), exc.kind, as_json)
    import traceback

    traceback.print_exception(exc)
    return report(f"internal error: {exc}", "internal", as_json)
