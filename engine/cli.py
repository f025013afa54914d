"""The `shadowpoint` command line: a thin entry point over the engine, the sidecar and the adapters.

Commands for people and scripts (`watch`, `save`, `list`, `diff`, `restore`, `undo`,
`storage`, `delete-task`, `doctor`, `bench`), for agents (`serve`, `hook`,
`install-hooks`, `mcp`). Runs on the main thread; a workspace served by a running sidecar
is reached through it, otherwise through an in-process engine. Output goes to stdout,
progress, prompts and logs to stderr; `--json` prints one JSON document for scripts.

Exit codes (one per error kind; the README carries the same table):

    0   success
    1   internal                an unexpected error (a bug, an OS error)
    2   usage, invalid_params   bad arguments; also `bench` when the benchmark suite is absent
    3   no_workspace            not a workspace folder
    4   protected_directory     the home, Desktop, Documents or Downloads folder itself
    5   path_outside_workspace  a path outside the workspace
    10  unknown_task            no such task (or the workspace has none yet)
    11  unknown_checkpoint      no checkpoint by that position or hash
    12  ambiguous_checkpoint    a hash prefix naming several commits
    13  unknown_message         no message at that ts
    20  no_file_snapshot        a compaction checkpoint: Restore Task only
    21  already_restored        the files are already at that checkpoint
    22  nothing_to_undo         no file restore to undo
    23  restore_failed          some files could not be restored
    24  restore_conflict        --keep-mine found edits it cannot merge (nothing was written)
    30  init_timeout            the baseline took too long
    31  init_failed             the baseline (or the shadow repo) failed
    32  checkpoints_disabled    checkpoints are off for the task
    33  storage_failed          the docs root could not be written (disk full, quota, I/O error)
    40  lock_timeout            another process held the workspace lock too long
    41  sidecar_running         another sidecar or `watch` already serves the workspace
    42  sidecar_unavailable     the sidecar could not be reached or started
    50  confirmation_required   a destructive command without a terminal to ask on and without --yes
    51  aborted                 the question was answered no
    60  doctor_problems         `doctor` found problems
    130 interrupted             Ctrl-C (outside `watch`, which exits 0)
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import IO, TYPE_CHECKING, Any, Protocol

import click

from shadowpoint import __version__
from shadowpoint.cli_report import EXIT_CODES as EXIT_CODES
from shadowpoint.cli_report import PlainOut, print_json, report_exception, stdout_console
from shadowpoint.cli_report import fail as _fail
from shadowpoint.cli_report import people_words as people_words
from shadowpoint.cli_report import report as _report
from shadowpoint.errors import AbortedError
from shadowpoint.errors import CliError as CliError

if TYPE_CHECKING:
    from rich.console import Console

    from shadowpoint.config import Settings
    from shadowpoint.engine import Engine
    from shadowpoint.sidecar.backend import Backend, BaselineProgress, Progress


class _Waitable(Protocol):
    root: Path

    def task_state(self, task_id: str) -> dict[str, Any]: ...
    def progress(self) -> Progress: ...

# ---------------------------------------------------------------------------- shared helpers


class _Ctx:
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
            from rich.console import Console

            self._err = Console(stderr=True, highlight=False, emoji=False, markup=False)
        return self._err


pass_ctx = click.make_pass_decorator(_Ctx, ensure=True)


def _isolate() -> None:
    from shadowpoint.store.shadow_repo import isolate_libgit2

    isolate_libgit2()


def workspace_for(ctx: _Ctx, directory: str | None) -> Path:
    """The workspace a command means: searched upwards from DIR or the current folder (as git
    finds its repository; see `backend.find_workspace`)."""
    from shadowpoint.sidecar.backend import find_workspace

    return find_workspace(directory, ctx.settings.resolved_docs_dir())


@contextlib.contextmanager
def _backend(ctx: _Ctx, directory: str | None) -> Iterator[Backend]:
    from shadowpoint.sidecar.backend import open_backend

    _isolate()
    backend = open_backend(workspace_for(ctx, directory), ctx.settings)
    try:
        yield backend
    finally:
        backend.close()


def _task_for(ctx: _Ctx, backend: Backend, task_id: str | None, *, create: bool = False) -> str:
    """The task a command acts on: --task-id, else the workspace's one default task (its most
    recently active; with `create`, a new `cli-<hash>` when there is none)."""
    from shadowpoint.sidecar.backend import default_task

    return task_id or default_task(ctx.settings.resolved_docs_dir(), backend.root, create=create)


def header(task: str, root: Path, extra: str = "") -> str:
    """The line every command's output starts with: which task of which workspace."""
    return f"Task {task} · {root}" + (f" · {extra}" if extra else "")


def _checkpoints(backend: Backend, task_id: str) -> list[dict[str, Any]]:
    from shadowpoint.sidecar.backend import by_position

    return by_position(backend.list_checkpoints(task_id)["checkpoints"])


def _is_unknown_task(exc: Exception) -> bool:
    return getattr(exc, "kind", None) == "unknown_task"


def wait_ready(ctx: _Ctx, backend: _Waitable, task_id: str, stop: threading.Event | None = None) -> dict[str, Any]:
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


def _confirm(ctx: _Ctx, question: str, yes: bool, refusal: str | None = None) -> None:
    """Ask before a destructive step; refuse without a terminal unless --yes."""
    if yes:
        return
    if not sys.stdin.isatty():
        _fail(refusal or "This overwrites work: pass --yes to confirm (there is no terminal to ask on).",
              "confirmation_required")
    if not click.confirm(question, default=False, err=True):
        raise AbortedError("The question was answered no.")


# ---------------------------------------------------------------------------- the group


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="shadowpoint")
@click.option("-C", "chdir", type=click.Path(file_okay=False, exists=True), default=None,
              help="run as if started in this folder (like git -C)")
def cli(chdir: str | None) -> None:
    """Checkpoints for AI coding agents: snapshots in a shadow git repository, compare and restore.

    Checkpoints are named by their position in `shadowpoint list` (1 = newest; `@N` works
    too) or by a hash prefix (5+ hex digits); positions stay the same until a new
    checkpoint is saved. The workspace is found like git finds a repository: the nearest
    folder upwards from the current one (or -C DIR) that has checkpoints, else the nearest
    holding a .git, else the current folder. Every command acts on the workspace's one
    default task (its most recently active) unless --task-id says otherwise.
    """
    if chdir:
        os.chdir(chdir)


_dir_option = click.option("-C", "--dir", "directory", type=click.Path(file_okay=False, exists=True), default=None,
                           help="workspace folder, searched upwards (default: the current folder)")
_task_option = click.option("--task-id", "task_id", default=None, help="task id (default: the workspace's latest)")
_pager_option = click.option("--no-pager", "no_pager", is_flag=True, help="do not page long output on a terminal")


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


@cli.command()
@click.option("--socket", "socket_path", type=click.Path(dir_okay=False), default=None,
              help="serve on this Unix socket (shared by all connections) instead of stdio")
@click.option("--idle-timeout", type=float, default=None,
              help="with --socket: exit after this many seconds without a connection")
@click.option("--workspace", "http_root", type=click.Path(file_okay=False), default=None,
              help="with --socket: also serve this workspace's http hooks on 127.0.0.1")
@pass_ctx
def serve(ctx: _Ctx, socket_path: str | None, idle_timeout: float | None, http_root: str | None) -> None:
    """Run the sidecar: JSON-RPC 2.0 on stdio (or a Unix socket), see PROTOCOL.md."""
    settings = ctx.settings
    _isolate()
    if socket_path:
        from shadowpoint.errors import SidecarRunningError
        from shadowpoint.sidecar.socket_server import serve_socket

        try:
            sys.exit(serve_socket(socket_path, settings, idle_timeout, http_root))
        except SidecarRunningError as exc:
            _fail(str(exc), "sidecar_running")
    from shadowpoint.sidecar.server import serve_stdio

    sys.exit(serve_stdio(settings))


# ---------------------------------------------------------------------------- watch


@cli.command()
@click.argument("positional_dir", metavar="[DIR]", required=False, type=click.Path(file_okay=False, exists=True))
@_dir_option
@click.option("--debounce", type=float, default=None, help="quiet period in seconds (default: watch_debounce_s)")
@click.option("--task-id", "task_id", default=None,
              help="task id (default: the workspace's latest; cli-<workspace hash> for a new one)")
@pass_ctx
def watch(ctx: _Ctx, positional_dir: str | None, directory: str | None, debounce: float | None,
          task_id: str | None) -> None:
    """Checkpoint DIR after every quiet period, until Ctrl-C (the standalone main job).

    Also serves the workspace's sidecar socket, so agent hooks and other commands share
    this process's engine while it runs.
    """
    from shadowpoint.engine import Engine, EngineOptions
    from shadowpoint.errors import SidecarError, SidecarRunningError
    from shadowpoint.sidecar.backend import BaselineProgress, default_task
    from shadowpoint.sidecar.client import connect_live, socket_path
    from shadowpoint.sidecar.server import Host
    from shadowpoint.sidecar.socket_server import SocketServer
    from shadowpoint.watch_mode import WatchEvent, WatchLoop

    settings = ctx.settings
    _isolate()
    root = workspace_for(ctx, directory or positional_dir)
    task = task_id or default_task(settings.resolved_docs_dir(), root, create=True)
    from shadowpoint.store.checkpoints import CheckpointStore

    # the baseline this run builds (a new task) is a checkpoint too, as `list` shows
    baseline = 0 if CheckpointStore(settings.resolved_docs_dir()).task_dir(task).is_dir() else 1
    debounce_s = debounce if debounce is not None else settings.watch_debounce_s
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)

    engine = Engine([root], EngineOptions.from_settings(settings))
    # A hook-started sidecar hands the workspace over (its state is on disk); another watch does not.
    live = connect_live(root)
    if live is not None:
        with live:
            try:
                live.request("sidecar/stop")
            except SidecarError as exc:
                engine.close()
                _fail(f"{root} is already served: {exc}", "sidecar_running")
        deadline = time.monotonic() + 10
        while socket_path(root).exists() and time.monotonic() < deadline:
            time.sleep(0.05)
    host = Host(settings, shared=True)
    host.owner = "watch"
    host.adopt(engine, settings)
    server: SocketServer | None = None
    try:
        server = SocketServer(socket_path(root), host, idle_timeout_s=None, http_root=str(root))
    except (SidecarRunningError, OSError) as exc:
        ctx.err.print(f"shadowpoint: warning: not serving the sidecar socket ({exc})")
    accept = None
    if server is not None:
        accept = threading.Thread(target=server.serve_forever, name="shadowpoint-accept", daemon=True)
        accept.start()

    out = ctx.out
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

    loop = WatchLoop(engine, task, debounce_s, runner=host.call, on_checkpoint=announce)
    try:
        loop.install()
        loop.start()
        with BaselineProgress(engine) as progress:
            state = wait_ready(ctx, _EngineStatus(engine, root, progress), task, stop)
        if state["state"] != "ready" and not stop.is_set():
            error = state.get("error") or {}
            _fail(error.get("message", "checkpoints are off for this task"), error.get("kind", "init_failed"))
        mode = "watching" if loop.is_watching else f"polling every {loop.poll_s:.0f} s (watcher unavailable)"
        header = f"shadowpoint: {mode} {root} (task {task}, quiet period {debounce_s:g} s); Ctrl-C to stop"
        if tty:
            _watch_live(ctx, loop, stop, header, baseline)
        else:
            sys.stdout.write(header + "\n")
            sys.stdout.flush()
            loop.run(stop)
        loop.checkpoint_pending("exit")
    finally:
        if server is not None:
            server.shutdown()
        if accept is not None:
            accept.join(5)
        host.close()
    if tty:
        made = loop.checkpoints + baseline
        out.print(f"shadowpoint: stopped ({made} checkpoint{'s' if made != 1 else ''} this session).")


class _EngineStatus:
    """What `wait_ready` needs, over the watch process's own engine."""

    def __init__(self, engine: Engine, root: Path, progress: BaselineProgress) -> None:
        self.engine = engine
        self.root = root
        self.progress = progress.progress

    def task_state(self, task_id: str) -> dict[str, Any]:
        return self.engine.list_checkpoints(task_id).status.to_wire()


def _watch_live(ctx: _Ctx, loop: Any, stop: threading.Event, header: str, baseline: int) -> None:
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


# ---------------------------------------------------------------------------- save / list


@cli.command()
@click.argument("positional_dir", metavar="[DIR]", required=False, type=click.Path(file_okay=False, exists=True))
@_dir_option
@click.option("-m", "--message", default=None, help="a note stored with the checkpoint")
@click.option("--task-id", "task_id", default=None,
              help="task id (default: the workspace's latest; cli-<workspace hash> for a new one)")
@click.option("--json", "as_json", is_flag=True, help="print the checkpoint as JSON")
@pass_ctx
def save(ctx: _Ctx, positional_dir: str | None, directory: str | None, message: str | None, task_id: str | None,
         as_json: bool) -> None:
    """Checkpoint the workspace now (in its default task, the one `list` shows)."""
    from shadowpoint.sidecar.backend import now_ms

    with _backend(ctx, directory or positional_dir) as backend:
        task = _task_for(ctx, backend, task_id, create=True)
        try:
            backend.task_state(task)
            is_new = False
        except Exception as exc:
            if not _is_unknown_task(exc):
                raise
            is_new = True
        ts = now_ms()
        backend.start_task(task, ts)
        state = wait_ready(ctx, backend, task)
        if state["state"] != "ready":
            error = state.get("error") or {}
            _fail(error.get("message", f"checkpoints are off for task {task}"), error.get("kind", "init_failed"))
        if is_new:
            # The baseline just built is the checkpoint asked for: no second, identical one.
            cp = next(c for c in backend.list_checkpoints(task)["checkpoints"] if c["kind"] == "baseline")
            if message:
                backend.add_message(task, cp["ts"], "user", message)
        else:
            cp = backend.save(task, max(ts + 1, now_ms()), message) or {}
    if as_json:
        print_json({"taskId": task, "workspace": str(backend.root), "checkpoint": cp})
        return
    what = "baseline" if is_new else ("unchanged since the last one" if cp.get("reused") else "saved")
    ctx.out.print(header(task, backend.root))
    ctx.out.print(f"checkpoint #1 {str(cp.get('hash') or '—')[:10]} ({what})")


@cli.command(name="list")
@click.argument("positional_dir", metavar="[DIR]", required=False, type=click.Path(file_okay=False, exists=True))
@_dir_option
@click.option("--task", "--task-id", "task_id", default=None, help="task id (default: the workspace's latest)")
@click.option("--tasks", "show_tasks", is_flag=True, help="list the workspace's tasks instead")
@click.option("--all", "show_all", is_flag=True, help="also list the safety checkpoints of restores, undos, redos")
@click.option("--json", "as_json", is_flag=True, help="print JSON")
@_pager_option
@pass_ctx
def list_cmd(ctx: _Ctx, positional_dir: str | None, directory: str | None, task_id: str | None, show_tasks: bool,
             show_all: bool, as_json: bool, no_pager: bool) -> None:
    """List the checkpoints of a task, newest first (# is what other commands accept)."""
    from shadowpoint.render import checkpoint_table

    directory = directory or positional_dir
    if show_tasks:
        _list_tasks(ctx, directory, as_json)
        return
    with _backend(ctx, directory) as backend:
        task = _task_for(ctx, backend, task_id)
        result = backend.list_checkpoints(task)
        cps = _checkpoints(backend, task)
        messages = backend.messages(task)
    from shadowpoint.cli_history import describe_safety, load_record, safety_rows

    safety = safety_rows(load_record(ctx, task)) if show_all else []
    if as_json:
        print_json({"taskId": task, "workspace": str(backend.root), "state": result.get("state"),
                     "checkpoints": cps, **({"safety": safety} if show_all else {})})
        return
    state = str(result.get("state"))
    state = {"ready": "", "initializing": "baseline being built"}.get(state, state)
    table = checkpoint_table(cps, messages, header(task, backend.root, state))
    with paged(not no_pager) as out:
        if out is sys.stdout:
            ctx.out.print(table)
        else:
            from rich.console import Console

            Console(file=out, force_terminal=ctx.out.is_terminal, width=ctx.out.width, highlight=False).print(table)
        if show_all:
            out.write(f"Safety checkpoints ({len(safety)}; name one by its hash in diff or restore):\n")
            for row in safety:
                out.write(f"  {str(row['hash'])[:10]}  {str(row['createdAt'] or '')[:19].replace('T', ' ')}  "
                          f"{describe_safety(row)}\n")


def _list_tasks(ctx: _Ctx, directory: str | None, as_json: bool) -> None:
    from datetime import datetime

    from rich.table import Table

    from shadowpoint.sidecar.backend import last_activity, workspace_tasks

    root = workspace_for(ctx, directory)
    tasks = workspace_tasks(ctx.settings.resolved_docs_dir(), root)
    rows: list[dict[str, Any]] = [
        {"taskId": t.task_id, "checkpoints": len(t.checkpoints), "createdAt": t.created_at,
         "lastActivity": datetime.fromtimestamp(last_activity(t)).astimezone().isoformat(timespec="seconds")}
        for t in tasks]
    if as_json:
        print_json({"workspace": str(root), "tasks": rows, "default": rows[0]["taskId"] if rows else None})
        return
    table = Table(title=f"Tasks of {root} (the first is the default)", title_justify="left")
    for col in ("task", "checkpoints", "last activity"):
        table.add_column(col)
    for r in rows:
        table.add_row(str(r["taskId"]), str(r["checkpoints"]), str(r["lastActivity"]).replace("T", " "))
    ctx.out.print(table)


# ---------------------------------------------------------------------------- diff / status


def split_refs_and_paths(args: tuple[str, ...], after_dashes: int | None, cwd: Path,
                         root: Path) -> tuple[list[str], list[str]]:
    """`diff [REF [REF2]] [--] [PATH…]` as git reads it. With `--` (`after_dashes` is how many
    arguments followed it), what precedes it are refs; without, leading arguments that name
    checkpoints and are not existing paths are refs (up to two), the rest paths. Paths become
    workspace-relative.

    Raises:
        CliError: more than two refs (usage); a path outside the workspace (path_outside_workspace).
    """
    from shadowpoint.sidecar.backend import looks_like_checkpoint

    if after_dashes is not None:
        refs, paths = list(args[: len(args) - after_dashes]), list(args[len(args) - after_dashes:])
        if len(refs) > 2:
            _fail(f"At most two checkpoints before `--`, got {len(refs)}: {' '.join(refs)}.", "usage")
    else:
        refs, paths = [], []
        for arg in args:
            if len(refs) < 2 and not paths and looks_like_checkpoint(arg) and not (cwd / arg).exists():
                refs.append(arg)
            else:
                paths.append(arg)
    rel: list[str] = []
    for p in paths:
        full = Path(os.path.normpath(cwd / p))
        if full != root and root not in full.parents:
            _fail(f"{p} is outside the workspace {root}.", "path_outside_workspace")
        rel.append("" if full == root else full.relative_to(root).as_posix())
    return refs, rel


def _under(path: str, wanted: list[str]) -> bool:
    return not wanted or any(not w or path == w or path.startswith(w + "/") for w in wanted)


@cli.command(context_settings={"ignore_unknown_options": False})
@click.argument("args", nargs=-1, metavar="[REF [REF2]] [--] [PATH]...")
@_dir_option
@click.option("--task", "--task-id", "task_id", default=None, help="task id (default: the workspace's latest)")
@click.option("--json", "as_json", is_flag=True, help="print the Diff as JSON")
@click.option("--html", "html_file", type=click.Path(dir_okay=False, writable=True), default=None,
              help="also write a side-by-side HTML page to this file")
@click.option("--stat", "stat_only", is_flag=True, help="a summary per file instead of the diff")
@click.option("--color/--no-color", "color", default=None, help="force colour on or off (default: on a terminal)")
@_pager_option
@pass_ctx
def diff(ctx: _Ctx, args: tuple[str, ...], directory: str | None, task_id: str | None,
         as_json: bool, html_file: str | None, stat_only: bool, color: bool | None, no_pager: bool) -> None:
    """Compare checkpoint REF (default: the newest) with the workspace, or with REF2; PATHs
    (files or folders) limit the comparison to them."""
    from shadowpoint.cli_history import resolve_ref
    from shadowpoint.render import stat_lines, unified_diff_lines, use_color
    from shadowpoint.sidecar.backend import resolve_checkpoint

    with _backend(ctx, directory) as backend:
        refs, paths = split_refs_and_paths(args, _args_after_dashes(args), Path(os.getcwd()), backend.root)
        task = _task_for(ctx, backend, task_id)
        cps = _checkpoints(backend, task)
        old = resolve_ref(ctx, backend, task, refs[0] if refs else "@1")  # a safety checkpoint's hash too
        new = resolve_checkpoint(cps, refs[1]) if len(refs) > 1 else None
        result = backend.diff(task, old["ts"], new["ts"] if new else None) if old.get("safety") is None or new \
            else backend.diff_safety(task, int(old["safety"]))
    result = {**result, "files": [f for f in result["files"]
                                  if _under(f["path"], paths) or _under(f.get("oldPath") or "", paths)]}
    against = f"checkpoint #{new['position']}" if new else "the workspace"
    title = f"{result['title']}: #{old['position']} ({str(old.get('hash') or '')[:10]}) → {against}"
    if html_file:
        from shadowpoint.html_diff import diff_page

        Path(html_file).write_text(diff_page(result, title, task=task, workspace=str(backend.root)),
                                   encoding="utf-8")
    if as_json:
        print_json({"taskId": task, "workspace": str(backend.root), "from": old, "to": new, **result})
        return
    painted = use_color(sys.stdout, color)
    lines = stat_lines(result, color=painted) if stat_only else unified_diff_lines(result, color=painted)
    head = f"{header(task, backend.root)}\n{title}\n"
    with paged(not no_pager) as out:
        if out is not sys.stdout or sys.stdout.isatty():
            out.write(head)
        else:
            sys.stderr.write(head)  # piped: stdout stays a clean diff
        if not result["files"]:
            out.write("No changes.\n")
        for line in lines:
            out.write(line)
    if html_file:
        sys.stderr.write(f"side-by-side page written to {html_file}\n")


_ARGV: list[str] = []  # this invocation's arguments (main): where `--` was, which click drops


def _args_after_dashes(args: tuple[str, ...]) -> int | None:
    """How many of a command's trailing positional `args` came after a `--` (None: no `--`)."""
    if "--" not in _ARGV:
        return None
    return min(len(args), len(_ARGV) - _ARGV.index("--") - 1)


@cli.command()
@click.argument("paths", nargs=-1, metavar="[PATH]...")
@_dir_option
@_task_option
@click.option("--ignored", is_flag=True, help="also the changed files the exclusion rules leave out, and why")
@click.option("--json", "as_json", is_flag=True, help="print JSON")
@pass_ctx
def status(ctx: _Ctx, paths: tuple[str, ...], directory: str | None, task_id: str | None, ignored: bool,
           as_json: bool) -> None:
    """What changed since the newest checkpoint (--ignored: and what the rules leave out)."""
    from shadowpoint.sidecar.backend import resolve_checkpoint
    from shadowpoint.stage.exclusions import ignored_changes

    with _backend(ctx, directory) as backend:
        _, wanted = split_refs_and_paths(paths, len(paths), Path(os.getcwd()), backend.root)
        task = _task_for(ctx, backend, task_id)
        newest = resolve_checkpoint(_checkpoints(backend, task), "@1")
        changed = [f for f in backend.diff(task, newest["ts"], None)["files"] if _under(f["path"], wanted)]
    left_out: list[dict[str, Any]] = []
    if ignored:
        since = _stamp_s(newest.get("createdAt", ""))
        left_out = [e for e in ignored_changes(backend.root, since, extra=ctx.settings.extra_exclusions,
                                               max_file_bytes=ctx.settings.max_file_bytes,
                                               docs_dir=ctx.settings.resolved_docs_dir())
                    if _under(e["path"].rstrip("/"), wanted)]
    if as_json:
        data: dict[str, Any] = {"taskId": task, "workspace": str(backend.root), "since": newest,
                                "changed": [{"path": f["path"], "status": f["status"]} for f in changed]}
        if ignored:
            data["ignored"] = left_out
        print_json(data)
        return
    out = ctx.out
    out.print(header(task, backend.root))
    out.print(f"Since checkpoint #1 ({str(newest.get('hash') or '')[:10]}, {_when_text(newest)}):")
    marks = {"added": "A", "modified": "M", "deleted": "D", "renamed": "R"}
    if not changed:
        out.print("  nothing changed")
    for f in changed:
        name = f"{f['oldPath']} → {f['path']}" if f.get("oldPath") else f["path"]
        out.print(f"  {marks.get(f['status'], '?')} {name}")
    if ignored:
        out.print("Changed but left out of checkpoints (re-include one with a `!pattern` in extra_exclusions):")
        if not left_out:
            out.print("  none")
        for e in left_out:
            out.print(f"  {e['path']}  ({e['why']})")


def _stamp_s(stamp: str) -> float:
    from datetime import datetime

    try:
        return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0


def _when_text(cp: dict[str, Any]) -> str:
    from shadowpoint.render import when

    return when(cp.get("createdAt", ""))


# ---------------------------------------------------------------------------- restore / undo


@cli.command()
@click.argument("ref")
@click.argument("paths", nargs=-1)
@click.option("--files", "mode", flag_value="files", help="restore the files only")
@click.option("--task", "mode", flag_value="task", help="restore the task only (cut the conversation)")
@click.option("--both", "mode", flag_value="both", help="restore files and task")
@click.option("--dry-run", is_flag=True, help="change nothing: print what the restore would do")
@click.option("--keep-mine", is_flag=True, help="keep edits made outside the task's rounds (three-way merge)")
@click.option("-y", "--yes", is_flag=True, help="do not ask for confirmation")
@_dir_option
@_task_option
@click.option("--json", "as_json", is_flag=True, help="print the Restore result as JSON")
@pass_ctx
def restore(ctx: _Ctx, ref: str, paths: tuple[str, ...], mode: str | None, dry_run: bool, keep_mine: bool,
            yes: bool, directory: str | None, task_id: str | None, as_json: bool) -> None:
    """Restore checkpoint REF: --files, --task or --both (asks first unless --yes).

    PATHS (after REF, or after `--`) restores only those files and folders. The question
    shows exactly what the restore does, and which changed files it leaves alone and why.
    """
    from shadowpoint.cli_history import left_alone, load_record, plan_lines, resolve_ref, run_restore

    if mode is None:
        mode = "files" if paths else None
    if mode is None:
        _fail("Say what to restore: --files, --task or --both.", "usage")
    # relative to -C DIR when given (as git's -C), else to the current directory
    named = [os.path.join(os.path.abspath(directory or os.getcwd()), p) for p in paths] if paths else None
    with _backend(ctx, directory) as backend:
        task = _task_for(ctx, backend, task_id)
        cp = resolve_ref(ctx, backend, task, ref)
        label = f"#{cp['position']} ({str(cp.get('hash') or 'no snapshot')[:10]}, {cp['kind']}, {cp['createdAt']})"
        files_part = mode in ("files", "both") and bool(cp.get("hash"))
        plan = run_restore(backend, task, cp, mode, named, True, keep_mine) if files_part or dry_run else {}
        lines = [f"{'Would restore' if dry_run else 'Restore'} {'files and task' if mode == 'both' else mode} "
                 f"of task {task} to checkpoint {label}."]
        if files_part and plan.get("files") is not None:
            record = load_record(ctx, task)
            scope = {p for name in (record.roots if record else {}) for p in record.scope_paths(name)} \
                if record is not None and record.has_scope() else None
            changed = [f["path"] for f in (backend.diff(task, cp["ts"], None) if cp.get("safety") is None
                                           else backend.diff_safety(task, int(cp["safety"])))["files"]]
            alone = left_alone(changed, plan["files"], scope=scope, named=named is not None, keep_mine=keep_mine,
                               ref=ref)
            lines += plan_lines(plan["files"], alone)
            if not dry_run:
                lines.append("A safety checkpoint is taken first; `shadowpoint undo` puts the files back.")
        elif plan.get("error"):
            lines.append(f"the files cannot be restored: {plan['error'].get('message')}")
        if mode in ("task", "both"):
            lines.append("Checkpoints and messages after it leave the task.")
        if dry_run:
            if as_json:
                print_json({"taskId": task, "checkpoint": cp, **plan})
            else:
                ctx.out.print("\n".join(lines))
            return
        if not yes:
            if sys.stdin.isatty():
                sys.stderr.write("\n".join(lines) + "\n")
            _confirm(ctx, "Go ahead?", yes)
        result = run_restore(backend, task, cp, mode, named, False, keep_mine)
    if as_json:
        print_json({"taskId": task, "checkpoint": cp, **result})
    else:
        files = result.get("files")
        if files:
            merged = f", merged {len(files.get('merged', []))}" if files.get("merged") else ""
            ctx.out.print(f"restored {len(files['restored'])} file(s), deleted {len(files['deleted'])}{merged} "
                          f"(safety checkpoint {str(files['safety'])[:10]}; `shadowpoint undo` reverts)")
        if result.get("task"):
            ctx.out.print(f"task cut after ts {result['task']['keepThrough']}")
    if result.get("error"):
        err = result["error"]
        _fail(err.get("message", "restore failed"), err.get("kind", "restore_failed"))


@cli.command()
@_dir_option
@_task_option
@click.option("--json", "as_json", is_flag=True, help="print the Restore result as JSON")
@pass_ctx
def undo(ctx: _Ctx, directory: str | None, task_id: str | None, as_json: bool) -> None:
    """Undo the last file restore of the task (puts back exactly the files it touched); again for
    the one before it, and so on."""
    from shadowpoint.cli_history import step

    step(ctx, directory, task_id, as_json, "undo")


# ---------------------------------------------------------------------------- storage / tasks


@cli.command()
@click.option("--gc", "gc", is_flag=True, help="collect garbage: drop objects no task reaches")
@click.option("--grace", type=float, default=None,
              help="with --gc: keep unreachable loose objects younger than this (s; default: gc_grace_s)")
@click.option("--only", "only", multiple=True, hidden=True, help="with --gc: only this workspace hash")
@click.option("--quiet", is_flag=True, hidden=True, help="print nothing (the background collection)")
@click.option("--json", "as_json", is_flag=True, help="print JSON")
@pass_ctx
def storage(ctx: _Ctx, gc: bool, grace: float | None, only: tuple[str, ...], quiet: bool, as_json: bool) -> None:
    """What each workspace's shadow repo and each task uses; --gc reclaims space.

    A collection can be interrupted (Ctrl-C) at any time without harm; the next one goes on
    from the packs already written.
    """
    from shadowpoint.store import storage as store
    from shadowpoint.store.shadow_repo import limit_mapped_memory

    settings = ctx.settings
    _isolate()
    limit_mapped_memory(STORAGE_MAPPED_BYTES)
    docs = settings.resolved_docs_dir()
    collected: dict[str, Any] = {}
    if gc:
        grace_s = settings.gc_grace_s if grace is None else grace
        collected = _collect(ctx, docs, grace_s, settings.lock_timeout_s, only, show=not quiet and not as_json)
    if quiet:
        return
    report = store.storage_report(docs)
    if as_json:
        print_json({**report, "collected": collected} if gc else report)
        return
    from rich.table import Table

    ctx.out.print(f"Storage under {report['docsDir']}: {_size(report['totalBytes'])}")
    for ws in report["workspaces"]:
        name = ws.get("worktree") or ws["workspaceHash"]
        ctx.out.print(f"\n{name}: shadow repo {_size(ws['bytes'])} ({ws['shadowGitDir']})")
        if ws.get("error"):
            ctx.out.print(f"  unreadable: {ws['error']}")
        if ws.get("collectionPending") and ws["workspaceHash"] not in collected:
            ctx.out.print("  a deleted task's space is not reclaimed yet: `shadowpoint storage --gc` does it")
        if not ws["tasks"]:
            continue
        table = Table(box=None, padding=(0, 2), show_edge=False)
        for col in ("task", "checkpoints", "only this task", "last activity"):
            table.add_column(col)
        for t in ws["tasks"]:
            table.add_row(t["taskId"], str(t["checkpoints"]), _size(t.get("uniqueBytes", 0)),
                          str(t.get("lastActivity", ""))[:19].replace("T", " "))
        ctx.out.print(table)
    for h, info in collected.items():
        ctx.out.print(f"collected {h}: kept {info['kept']} objects, freed {_size(info['freedBytes'])}")


STORAGE_MAPPED_BYTES = 64 << 20  # pack memory `storage` keeps mapped: it reads every object once


def _collect(ctx: _Ctx, docs: Path, grace: float, lock_timeout_s: float, only: tuple[str, ...] = (),
             show: bool = True) -> dict[str, Any]:
    from shadowpoint.store import storage as store

    root = docs / "checkpoints"
    git_dirs = sorted(d / ".git" for d in root.iterdir() if (d / ".git").is_dir()) if root.is_dir() else []
    if only:
        git_dirs = [g for g in git_dirs if g.parent.name in only]
    if not show or not ctx.err.is_terminal:
        return store.collect_garbage(docs, grace_s=grace, lock_timeout_s=lock_timeout_s, only=git_dirs)
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    out: dict[str, Any] = {}
    with Progress(TextColumn("Collecting garbage in {task.fields[name]}"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("objects"), TimeElapsedColumn(), console=ctx.err, transient=True) as progress:
        for g in git_dirs:
            bar = progress.add_task("gc", total=None, name=g.parent.name)

            def step(_: Path, done: int, total: int, bar: Any = bar) -> None:
                progress.update(bar, completed=done, total=total)

            out.update(store.collect_garbage(docs, grace_s=grace, lock_timeout_s=lock_timeout_s, only=[g],
                                             progress=step))
            progress.remove_task(bar)
    return out


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


@cli.command(name="delete-task")
@click.argument("task_id")
@click.option("-y", "--yes", is_flag=True, help="do not ask for confirmation")
@click.option("--no-collect", "no_collect", is_flag=True,
              help="leave the freed space for a later `shadowpoint storage --gc`")
@click.option("--json", "as_json", is_flag=True, help="print JSON")
@pass_ctx
def delete_task(ctx: _Ctx, task_id: str, yes: bool, no_collect: bool, as_json: bool) -> None:
    """Delete a task's checkpoints (the shared shadow repo stays for the other tasks).

    Returns at once; the space the task alone used is reclaimed in the background.
    Your files are not touched.
    """
    from shadowpoint.quick import delete_task_here, deleted_json, deleted_text
    from shadowpoint.sidecar.client import connect_live
    from shadowpoint.store.checkpoints import CheckpointStore

    settings = ctx.settings
    _isolate()
    docs = settings.resolved_docs_dir()
    rec = CheckpointStore(docs).load(task_id)
    roots = list(rec.roots.values())
    if not roots:
        _fail(f"Task {task_id} names no workspace.", "unknown_task")
    _confirm(ctx, f"Delete task {task_id}: its {len(rec.checkpoints)} checkpoint(s) and conversation marks "
                  f"for {', '.join(roots)}? Your files stay as they are.", yes,
             refusal=f"Deleting task {task_id} removes its {len(rec.checkpoints)} checkpoint(s): pass --yes to "
                     "confirm (there is no terminal to ask on).")
    live = connect_live(Path(roots[0]))
    background = False
    if live is not None:
        # The sidecar serving the workspace holds the task: it deletes it and collects itself.
        live.close()
        with _backend(ctx, roots[0]) as backend:
            backend.delete_task(task_id)
    else:
        background = delete_task_here(docs, rec, no_collect=no_collect, gc_grace_s=settings.gc_grace_s)
    if as_json:
        print_json(deleted_json(task_id, background))
        return
    ctx.out.print(deleted_text(task_id, len(rec.checkpoints), background))


# ---------------------------------------------------------------------------- doctor / bench


@cli.command()
@click.argument("positional_dir", metavar="[DIR]", required=False, type=click.Path(file_okay=False, exists=True))
@_dir_option
@click.option("--json", "as_json", is_flag=True, help="print JSON")
@pass_ctx
def doctor(ctx: _Ctx, positional_dir: str | None, directory: str | None, as_json: bool) -> None:
    """Check watch limits, storage, locks, sidecars and every shadow repo's health."""
    from shadowpoint.sidecar.doctor import run_checks

    _isolate()
    report = run_checks(ctx.settings, workspace_for(ctx, directory or positional_dir))
    problems = [c for c in report if c["status"] == "problem"]
    if as_json:
        print_json({"checks": report, "problems": len(problems)})
    else:
        marks = {"ok": "✓", "warning": "!", "problem": "✗", "info": "·"}
        for c in report:
            ctx.out.print(f"{marks[c['status']]} {c['name']}: {c['summary']}")
            for line in c.get("details", []):
                ctx.out.print(f"    {line}")
    if problems:
        _fail(f"{len(problems)} problem(s) found.", "doctor_problems")


@cli.command(context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def bench(args: tuple[str, ...]) -> None:
    """Run the benchmark suite (benchmarks/ of a checkout); arguments go to its runner."""
    runner = _import_bench()
    if runner is None:
        sys.stderr.write("shadowpoint: error: the benchmark suite is not available: run `shadowpoint bench` from a "
                         "checkout of shadowpoint (the folder holding benchmarks/), or `python -m benchmarks`.\n")
        sys.exit(2)
    sys.exit(int(runner(list(args)) or 0))


def _import_bench() -> Callable[[list[str]], int] | None:
    import importlib

    for extra in (None, os.getcwd(), str(Path(__file__).resolve().parent.parent)):
        if extra is not None and extra not in sys.path:
            sys.path.insert(0, extra)
        try:
            module = importlib.import_module("benchmarks.runner")
        except ImportError:
            continue
        main = getattr(module, "main", None)
        if callable(main):
            return main  # type: ignore[no-any-return]
    return None


# ---------------------------------------------------------------------------- agents


@cli.command()
@click.argument("agent")
def hook(agent: str) -> None:
    """Read an agent's hook payload on stdin and forward it to the workspace's sidecar.

    AGENT is claude, codex or gemini. Prints nothing and exits 0 whatever happens (the agent
    must never be stopped by a checkpoint problem); failures are logged under the state dir.
    """
    sys.exit(run_hook_command(agent))


def run_hook_command(agent: str) -> int:
    """`shadowpoint hook AGENT`: the lean hook client, without click or rich (`shadowpoint.hookrun`)."""
    from shadowpoint.hookrun import main as hook_main

    return hook_main([agent])


@cli.command(name="install-hooks")
@click.argument("agent", type=click.Choice(["claude", "codex", "gemini"]))
@click.argument("directory", required=False, type=click.Path(file_okay=False, exists=True))
@click.option("--remove", is_flag=True, help="remove shadowpoint's entries (only ours)")
@click.option("--command", "command", default=None, help="the hook command (default: this shadowpoint)")
@click.option("--json", "as_json", is_flag=True, help="print JSON")
@pass_ctx
def install_hooks(ctx: _Ctx, agent: str, directory: str | None, remove: bool, command: str | None,
                  as_json: bool) -> None:
    """Merge shadowpoint's hook entries into AGENT's project settings in DIR (never the user's own)."""
    from shadowpoint.adapters.install import install_hooks as install

    result = install(agent, Path(directory or os.getcwd()), remove=remove, command=command)
    if as_json:
        print_json({"file": str(result.path), "added": result.added, "updated": result.updated,
                     "removed": result.removed, "nextSteps": result.notes})
        return
    if remove:
        msg = f"removed from {', '.join(result.removed)}" if result.removed else "nothing of ours was there"
    elif result.added or result.updated:
        msg = f"added to {', '.join(result.added) or '—'}; updated {', '.join(result.updated) or '—'}"
    else:
        msg = "already installed"
    ctx.out.print(f"{result.path}: {msg}")
    for note in result.notes:
        ctx.out.print(f"  next: {note}")


@cli.command()
@click.argument("directory", required=False, type=click.Path(file_okay=False, exists=True))
@pass_ctx
def mcp(ctx: _Ctx, directory: str | None) -> None:
    """Run an MCP server (stdio) with tools to list, diff and restore checkpoints (needs the
    optional extra: pip install 'shadowpoint[mcp]')."""
    try:
        import mcp as _sdk  # noqa: F401 - only: is the optional extra installed?
    except ImportError:
        _fail("`shadowpoint mcp` needs the MCP SDK: pip install 'shadowpoint[mcp]'", "usage")
    from shadowpoint.mcp_server import run

    _isolate()
    run(ctx.settings, directory)


from shadowpoint import cli_history  # noqa: E402  (its commands use this module's helpers)

cli_history.register(cli)

# ---------------------------------------------------------------------------- entry point


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit status (see the table in this module's docstring)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) == 2 and args[0] == "hook" and not args[1].startswith("-"):
        return run_hook_command(args[1])
    _ARGV[:] = args
    as_json = "--json" in args[: args.index("--")] if "--" in args else "--json" in args
    try:
        cli.main(args=args, prog_name="shadowpoint", standalone_mode=False)
    except click.exceptions.Abort:
        sys.stderr.write("shadowpoint: interrupted\n")
        return EXIT_CODES["interrupted"]
    except click.exceptions.Exit as exc:
        return int(exc.exit_code)
    except click.ClickException as exc:
        if as_json:
            return _report(exc.format_message(), "usage", as_json)
        exc.show()
        return EXIT_CODES["usage"]
    except (Exception, KeyboardInterrupt) as exc:
        return report_exception(exc, as_json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
