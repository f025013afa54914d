"""What the click commands share: the per-invocation context (settings loaded once, the
consoles), the workspace and task a command means, the backend it talks to, waiting for a
baseline, confirmation, the common options and the pager.

Used by every command module of `shadowpoint.cli`; runs on the main thread.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Protocol

import click

from shadowpoint.cli.report import PlainOut, fail, rich_console, stdout_console
from shadowpoint.errors import AbortedError
from shadowpoint.stopping import StopFlag

if TYPE_CHECKING:
    from rich.console import Console

    from shadowpoint.config import Settings
    from shadowpoint.sidecar.backend import Backend, Progress


class Waitable(Protocol):
    """What `wait_ready` reads: a backend, or the watch process's own engine."""

    root: Path

    def task_state(self, task_id: str) -> dict[str, Any]: ...
    def progress(self) -> Progress: ...


class Ctx:
    """Per-invocation state: settings (loaded once) and the consoles."""

    def __init__(self) -> None:
        self._settings: Settings | None = None
        self._out: Console | PlainOut | None = None
        self._err: Console | None = None

    @property
    def settings(self) -> Settings:
        if self._settings is None:
            from shadowpoint.config import load_settings
            from shadowpoint.logs import configure_logging

            self._settings = load_settings()
            configure_logging(self._settings.log_level, self._settings.log_format, self._settings.log_file)
        return self._settings

    @property
    def out(self) -> Console | PlainOut:
        if self._out is None:
            self._out = stdout_console()
        return self._out

    @property
    def rich_out(self) -> Console:
        """The rich console of stdout (for rich's own widgets)."""
        out = self.out
        return out.rich if isinstance(out, PlainOut) else out

    @property
    def err(self) -> Console:
        if self._err is None:
            self._err = rich_console(stderr=True, highlight=False, emoji=False, markup=False)
        return self._err


pass_ctx = click.make_pass_decorator(Ctx, ensure=True)


def isolate() -> None:
    from shadowpoint.store.shadow_repo import isolate_libgit2

    isolate_libgit2()


def workspace_for(ctx: Ctx, directory: str | None) -> Path:
    """The workspace a command means: searched upwards from DIR or the current folder (as git
    finds its repository; see `backend.find_workspace`)."""
    from shadowpoint.sidecar.backend import find_workspace

    return find_workspace(directory, ctx.settings.resolved_docs_dir())


@contextlib.contextmanager
def backend_for(ctx: Ctx, directory: str | None, *, read_only: bool = False) -> Iterator[Backend]:
    """The backend of the workspace a command means. `read_only` (status, diff, list, log):
    a folder without checkpoints is refused (unknown_task) before anything is written there."""
    from shadowpoint.sidecar.backend import open_backend, require_checkpoints

    isolate()
    root = workspace_for(ctx, directory)
    if read_only:
        require_checkpoints(ctx.settings.resolved_docs_dir(), root)
    backend = open_backend(root, ctx.settings)
    try:
        yield backend
    finally:
        backend.close()


def task_for(ctx: Ctx, backend: Backend, task_id: str | None, *, create: bool = False) -> str:
    """The task a command acts on: --task-id, else the workspace's one default task (its most
    recently active; with `create`, a new `cli-<hash>` when there is none)."""
    from shadowpoint.sidecar.backend import default_task

    return task_id or default_task(ctx.settings.resolved_docs_dir(), backend.root, create=create)


def checkpoints_of(backend: Backend, task_id: str) -> list[dict[str, Any]]:
    from shadowpoint.sidecar.backend import by_position

    return by_position(backend.list_checkpoints(task_id)["checkpoints"])


def is_unknown_task(exc: Exception) -> bool:
    return getattr(exc, "kind", None) == "unknown_task"


def wait_ready(ctx: Ctx, backend: Waitable, task_id: str, stop: StopFlag | None = None) -> dict[str, Any]:
    """Wait for the task's baseline; a progress bar on a terminal (stderr) while it builds."""
    state = backend.task_state(task_id)
    if state["state"] != "initializing":
        return state
    if not ctx.err.is_terminal:
        while state["state"] == "initializing" and not (stop and stop.is_set()):
            time.sleep(0.05)
            state = backend.task_state(task_id)
        return state
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    columns = (SpinnerColumn(), TextColumn("Baseline snapshot of {task.fields[root]}"), BarColumn(),
               MofNCompleteColumn(), TextColumn("files"), TimeElapsedColumn())
    with Progress(*columns, console=ctx.err, transient=True) as progress:
        bar = progress.add_task("baseline", total=None, root=str(backend.root))
        while state["state"] == "initializing" and not (stop and stop.is_set()):
            p = backend.progress()
            progress.update(bar, completed=p.done or 0,
                            total=max(p.total, p.done or 0) if p.total is not None else None)
            time.sleep(0.1)
            state = backend.task_state(task_id)
        p = backend.progress()
        progress.update(bar, completed=p.done or 0, total=p.done or None)
    return state


def confirm(ctx: Ctx, question: str, yes: bool, refusal: str | None = None) -> None:
    """Ask before a destructive step; refuse without a terminal unless --yes."""
    if yes:
        return
    if not sys.stdin.isatty():
        fail(refusal or "This overwrites work: pass --yes to confirm (there is no terminal to ask on).",
              "confirmation_required")
    if not click.confirm(question, default=False, err=True):
        raise AbortedError("The question was answered no.")


# ---------------------------------------------------------------------------- the group

def _chdir(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    if not value or ctx.resilient_parsing:
        return
    try:
        os.chdir(value)
    except FileNotFoundError:
        raise click.BadParameter(f"Directory {value!r} does not exist{_kept_hint(ctx, value)}.", ctx, param) from None
    except OSError as exc:
        raise click.BadParameter(f"Cannot go into {value!r}: {exc.strerror or exc}.", ctx, param) from None


def _kept_hint(ctx: click.Context, value: str) -> str:
    """For a workspace folder that is gone: where its checkpoints are, and how to get its files back."""
    from shadowpoint.sidecar.backend import has_checkpoints, kept_checkpoints_hint, workspace_root

    if not has_checkpoints(ctx.ensure_object(Ctx).settings.resolved_docs_dir(), workspace_root(value)):
        return ""
    return f"; {kept_checkpoints_hint(value)}"


# `-C DIR` on the group and on every command (git's -C): run as if started in DIR, so the
# workspace is searched upwards from it and relative paths are read from it. Eager: DIR holds
# before the other arguments are checked.
dir_option = click.option("-C", "--dir", "chdir_to", type=click.Path(file_okay=False), default=None,
                          is_eager=True, expose_value=False, callback=_chdir,
                          help="run as if started in this folder (like git -C); the workspace is searched "
                               "upwards from it")
task_option = click.option("--task-id", "task_id", default=None, help="task id (default: the workspace's latest)")
pager_option = click.option("--no-pager", "no_pager", is_flag=True, help="do not page long output on a terminal")


@contextlib.contextmanager
def paged(enabled: bool) -> Iterator[IO[str]]:
    """stdout, through a pager when `enabled` and stdout is a terminal: $SHADOWPOINT_PAGER, else
    $PAGER, else `less -FRX` (which exits at once when the text fits the screen)."""
    import subprocess

    command = os.environ.get("SHADOWPOINT_PAGER") or os.environ.get("PAGER") or "less -FRX"
    if not enabled or not sys.stdout.isatty() or command.strip() in ("", "cat"):
        yield sys.stdout
        sys.stdout.flush()
        return
    env = {**os.environ, "LESS": os.environ.get("LESS", "FRX")}
    try:
        pager = subprocess.Popen(command, shell=True, stdin=subprocess.PIPE, env=env, text=True,
                                 encoding="utf-8", errors="replace")
    except OSError:
        yield sys.stdout
        return
    assert pager.stdin is not None
    try:
        yield pager.stdin
    except BrokenPipeError:
        pass
    finally:
        with contextlib.suppress(BrokenPipeError, OSError):
            pager.stdin.close()
        pager.wait()

ARGV: list[str] = []  # this invocation's arguments (main): where `--` was, which click drops


def args_after_dashes(args: tuple[str, ...]) -> int | None:
    """How many of a command's trailing positional `args` came after a `--` (None: no `--`)."""
    if "--" not in ARGV:
        return None
    return min(len(args), len(ARGV) - ARGV.index("--") - 1)
