"""The command line's long-running commands: `serve` (the sidecar on stdio or a Unix socket)
and `watch` (checkpoints after every quiet period, serving the workspace's sidecar socket
meanwhile; the loop is `watch_mode.WatchLoop`, the socket hand-over `watch_mode.serve_watched`).

Runs on the main thread; `watch` stops on SIGINT or SIGTERM.
"""

from __future__ import annotations

import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

import click

from shadowpoint.cli.context import Ctx, dir_option, isolate, pass_ctx, wait_ready, workspace_for
from shadowpoint.cli.report import PlainOut, fail
from shadowpoint.stopping import SignalStop, StopFlag

if TYPE_CHECKING:
    from rich.console import Console

    from shadowpoint.engine import Engine
    from shadowpoint.sidecar.backend import BaselineProgress
    from shadowpoint.watch_mode import WatchEvent


@click.command()
@click.option("--socket", "socket_path", type=click.Path(dir_okay=False), default=None,
              help="serve on this Unix socket (shared by all connections) instead of stdio")
@click.option("--idle-timeout", type=float, default=None,
              help="with --socket: exit after this many seconds without a connection")
@click.option("--workspace", "http_root", type=click.Path(file_okay=False), default=None,
              help="with --socket: also serve this workspace's http hooks on 127.0.0.1")
@dir_option
@pass_ctx
def serve(ctx: Ctx, socket_path: str | None, idle_timeout: float | None, http_root: str | None) -> None:
    """Run the sidecar: JSON-RPC 2.0 on stdio (or a Unix socket), see PROTOCOL.md."""
    settings = ctx.settings
    isolate()
    if socket_path:
        from shadowpoint.errors import SidecarRunningError
        from shadowpoint.sidecar.socket_server import serve_socket

        try:
            sys.exit(serve_socket(socket_path, settings, idle_timeout, http_root))
        except SidecarRunningError as exc:
            fail(str(exc), "sidecar_running")
    from shadowpoint.sidecar.server import serve_stdio

    sys.exit(serve_stdio(settings))


# ---------------------------------------------------------------------------- watch

@click.command()
@click.argument("positional_dir", metavar="[DIR]", required=False, type=click.Path(file_okay=False, exists=True))
@dir_option
@click.option("--debounce", type=float, default=None, help="quiet period in seconds (default: watch_debounce_s)")
@click.option("--task-id", "task_id", default=None,
              help="task id (default: the workspace's latest; cli-<workspace hash> for a new one)")
@pass_ctx
def watch(ctx: Ctx, positional_dir: str | None, debounce: float | None, task_id: str | None) -> None:
    """Checkpoint DIR after every quiet period, until Ctrl-C (the standalone main job).

    Also serves the workspace's sidecar socket, so agent hooks and other commands share
    this process's engine while it runs.
    """
    from shadowpoint.engine import Engine, EngineOptions
    from shadowpoint.errors import SidecarError
    from shadowpoint.sidecar.backend import BaselineProgress, default_task
    from shadowpoint.store.checkpoints import CheckpointStore
    from shadowpoint.watch_mode import WatchLoop, serve_watched, take_over_sidecar

    settings = ctx.settings
    isolate()
    root = workspace_for(ctx, positional_dir)
    task = task_id or default_task(settings.resolved_docs_dir(), root, create=True)
    # the baseline this run builds (a new task) is a checkpoint too, as `list` shows
    baseline = 0 if CheckpointStore(settings.resolved_docs_dir()).task_dir(task).is_dir() else 1
    debounce_s = debounce if debounce is not None else settings.watch_debounce_s
    stop = _stop_on_signals()

    engine = Engine([root], EngineOptions.from_settings(settings))
    # A hook-started sidecar hands the workspace over (its state is on disk); another watch does not.
    try:
        take_over_sidecar(root)
    except SidecarError as exc:
        engine.close()
        fail(f"{root} is already served: {exc}", "sidecar_running")
    out = ctx.out
    with serve_watched(engine, root, settings, lambda text: ctx.err.print(f"shadowpoint: warning: {text}")) as host:
        loop = WatchLoop(engine, task, debounce_s, runner=host.call, on_checkpoint=_announcer(out))
        loop.install()
        loop.start()
        with BaselineProgress(engine) as progress:
            state = wait_ready(ctx, _EngineStatus(engine, root, progress), task, stop)
        if state["state"] != "ready" and not stop.is_set():
            error = state.get("error") or {}
            fail(error.get("message", "checkpoints are off for this task"), error.get("kind", "init_failed"))
        mode = "watching" if loop.is_watching else f"polling every {loop.poll_s:.0f} s (watcher unavailable)"
        header = f"shadowpoint: {mode} {root} (task {task}, quiet period {debounce_s:g} s); Ctrl-C to stop"
        if out.is_terminal:
            _watch_live(ctx, loop, stop, header, baseline)
        else:
            sys.stdout.write(header + "\n")
            sys.stdout.flush()
            loop.run(stop)
        loop.checkpoint_pending("exit", settle=True)
    if out.is_terminal:
        made = loop.checkpoints + baseline
        out.print(f"shadowpoint: stopped ({made} checkpoint{'s' if made != 1 else ''} this session).")


def _stop_on_signals() -> SignalStop:
    """A flag SIGINT and SIGTERM set (the watch then checkpoints what is pending and exits 0);
    lock-free, so any number of signals at any moment is safe (`SignalStop`)."""
    stop = SignalStop()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    return stop


def _announcer(out: Console | PlainOut) -> Callable[[WatchEvent], None]:
    """One line per checkpoint the watch makes, on stdout."""
    tty = out.is_terminal

    def announce(event: WatchEvent) -> None:
        cp = event.checkpoint
        stamp = time.strftime("%H:%M:%S")
        what = "unchanged" if cp and cp.reused else f"{event.paths} path{'s' if event.paths != 1 else ''}"
        line = f"{stamp} checkpoint {((cp.hash if cp else None) or '—')[:10]} ({what}, {event.reason})"
        if tty:
            out.print(line)
        else:
            sys.stdout.write(line + "\n")
            sys.stdout.flush()

    return announce


class _EngineStatus:
    """What `wait_ready` needs, over the watch process's own engine."""

    def __init__(self, engine: Engine, root: Path, progress: BaselineProgress) -> None:
        self.engine = engine
        self.root = root
        self.progress = progress.progress

    def task_state(self, task_id: str) -> dict[str, Any]:
        return self.engine.list_checkpoints(task_id).status.to_wire()


def _watch_live(ctx: Ctx, loop: Any, stop: StopFlag, header: str, baseline: int) -> None:
    from rich.live import Live
    from rich.text import Text

    ctx.out.print(header)
    last = "none yet"

    def status() -> Text:
        pending = loop.pending_paths()
        mode = "watching" if loop.is_watching else "polling"
        tail = f" · {pending} path{'s' if pending != 1 else ''} changed, waiting for quiet" if pending else ""
        made = loop.checkpoints + baseline
        return Text(f"● {mode} · {made} checkpoint{'s' if made != 1 else ''} · "
                    f"last: {last}{tail}", style="cyan")

    with Live(status(), console=ctx.rich_out, refresh_per_second=4, transient=True) as live:
        while not stop.wait(0.1):
            event = loop.tick()
            if event is not None:
                last = time.strftime("%H:%M:%S")
            live.update(status())


COMMANDS = (serve, watch)
