"""`shadowpoint mcp`: an MCP server (stdio, the official `mcp` SDK) exposing checkpoints as tools.

Tools: `list_checkpoints`, `diff_checkpoint`, `restore_checkpoint` (destructive) and
`undo_restore` (destructive), each for the workspace given by its `root` argument or the
server's working directory, and that workspace's latest task unless `task_id` is given.
Each call goes through the workspace's running sidecar if there is one, else an
in-process engine opened for the call. Tool functions run on the SDK's event-loop thread.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, Protocol, TypeVar, cast

from shadowpoint import __version__
from shadowpoint.cli.render import stat_lines, unified_diff_lines
from shadowpoint.config import Settings
from shadowpoint.errors import ShadowpointError
from shadowpoint.sidecar.backend import (
    Backend,
    by_position,
    default_task,
    open_backend,
    resolve_checkpoint,
    workspace_root,
)

INSTRUCTIONS = (
    "shadowpoint keeps checkpoints of this workspace (snapshots taken after each round of tool calls). "
    "Name a checkpoint by its position from list_checkpoints (1 = newest) or a hash prefix. "
    "restore_checkpoint overwrites files (a safety checkpoint is taken first; undo_restore reverts it)."
)
_MAX_DIFF_CHARS = 200_000
F = TypeVar("F", bound=Callable[..., Any])


class _Workspace:
    """One tool call's view of a workspace: its backend and task."""

    def __init__(self, settings: Settings, default_root: Path, root: str | None, task_id: str | None) -> None:
        self.root = workspace_root(root) if root else default_root
        self.backend: Backend = open_backend(self.root, settings)
        try:
            self.task = task_id or default_task(settings.resolved_docs_dir(), self.root)
        except Exception:
            self.backend.close()
            raise

    def checkpoints(self) -> list[dict[str, Any]]:
        """The task's checkpoints, newest first, numbered as `shadowpoint list` shows them."""
        return by_position(self.backend.list_checkpoints(self.task)["checkpoints"])

    def __enter__(self) -> _Workspace:
        return self

    def __exit__(self, *exc: object) -> None:
        self.backend.close()


def _brief(cp: dict[str, Any], messages: dict[int, str] | None = None) -> dict[str, Any]:
    out = {"position": cp["position"], "hash": cp.get("hash"), "kind": cp["kind"], "ts": cp["ts"],
           "createdAt": cp.get("createdAt"), "restored": cp.get("restored", False),
           "unchanged": cp.get("reused", False), "filesLeftOut": len(cp.get("warnings") or [])}
    if messages and messages.get(cp["ts"]):
        out["message"] = messages[cp["ts"]]
    return out


def build_server(settings: Settings, directory: str | None = None) -> Any:
    """The MCP server object (not started), its tools bound to `settings` and the workspace."""
    import importlib

    try:
        server_cls: Any = importlib.import_module("mcp.server.mcpserver").MCPServer
        tool_error: type[Exception] = importlib.import_module("mcp.server.mcpserver.exceptions").ToolError
    except ImportError:  # mcp 1.x
        server_cls = importlib.import_module("mcp.server.fastmcp").FastMCP
        tool_error = importlib.import_module("mcp.server.fastmcp.exceptions").ToolError
    server = server_cls("shadowpoint", instructions=INSTRUCTIONS, version=__version__)
    _add_tools(_tool_registrar(server, tool_error), settings, workspace_root(directory))
    return server


def _hints(**values: Any) -> Any:
    """A tool's annotations, by the wire names: accepted by mcp 1.x (camelCase fields) and 2.x
    (aliases)."""
    from mcp.types import ToolAnnotations

    return ToolAnnotations.model_validate(values)


class _Decorate(Protocol):
    def __call__(self, fn: F, /) -> F: ...


def _tool_registrar(server: Any, tool_error: type[Exception]) -> Callable[..., _Decorate]:
    """`server.tool`, with our refusals turned into the tool errors the model reads."""

    def tool(**options: Any) -> _Decorate:
        register: Callable[[F], F] = server.tool(**options)

        def decorate(fn: F) -> F:
            @functools.wraps(fn)
            def call(*args: Any, **kwargs: Any) -> Any:
                try:
                    return fn(*args, **kwargs)
                except ShadowpointError as exc:
                    # An expected refusal: its message (and kind) reach the model, not a bare "error".
                    raise tool_error(f"{exc} ({exc.kind})") from exc

            return register(cast(F, call))

        return decorate

    return tool


def _add_tools(tool: Callable[..., _Decorate], settings: Settings, default_root: Path) -> None:
    """The four tools: list, diff, restore and undo, on the workspace's latest task by default."""

    @tool(annotations=_hints(title="List checkpoints", readOnlyHint=True))
    def list_checkpoints(root: str | None = None, task_id: str | None = None) -> dict[str, Any]:
        """List the checkpoints of the workspace's latest task (or `task_id`), newest first.

        Args:
            root: Workspace folder (default: the server's working directory).
            task_id: Task id (default: the workspace's most recently active task).
        """
        with _Workspace(settings, default_root, root, task_id) as ws:
            messages = ws.backend.messages(ws.task)
            return {"workspace": str(ws.root), "taskId": ws.task,
                    "checkpoints": [_brief(c, messages) for c in ws.checkpoints()]}

    @tool(annotations=_hints(title="Diff a checkpoint", readOnlyHint=True))
    def diff_checkpoint(checkpoint: str = "1", to: str | None = None, stat: bool = False,
                        root: str | None = None, task_id: str | None = None) -> dict[str, Any]:
        """Show what changed since a checkpoint (against the current files, or against checkpoint `to`).

        Args:
            checkpoint: Position in list_checkpoints (1 = newest) or a hash prefix.
            to: Another checkpoint to compare with instead of the current files.
            stat: Only a per-file summary instead of the unified diff.
            root: Workspace folder (default: the server's working directory).
            task_id: Task id (default: the workspace's most recently active task).
        """
        with _Workspace(settings, default_root, root, task_id) as ws:
            cps = ws.checkpoints()
            old = resolve_checkpoint(cps, checkpoint)
            new = resolve_checkpoint(cps, to) if to else None
            diff = ws.backend.diff(ws.task, old["ts"], new["ts"] if new else None)
        text = "".join(stat_lines(diff) if stat else unified_diff_lines(diff))
        truncated = len(text) > _MAX_DIFF_CHARS
        return {"title": diff["title"], "from": _brief(old), "to": _brief(new) if new else "workspace",
                "files": [{"path": f["path"], "status": f["status"], "binary": f["binary"]} for f in diff["files"]],
                "diff": text[:_MAX_DIFF_CHARS], "truncated": truncated}

    @tool(annotations=_hints(title="Restore a checkpoint", destructiveHint=True,
                                   readOnlyHint=False, idempotentHint=False))
    def restore_checkpoint(checkpoint: str, mode: Literal["files", "task", "both"] = "files",
                           paths: list[str] | None = None, dryRun: bool = False,  # the protocol's names
                           keepOutsideEdits: bool = False,
                           root: str | None = None, task_id: str | None = None) -> dict[str, Any]:
        """Restore the workspace files (and/or cut the task's conversation) to a checkpoint.

        Overwrites files: a safety checkpoint is taken first and undo_restore puts them back.

        Args:
            checkpoint: Position in list_checkpoints (1 = newest) or a hash prefix.
            mode: "files" (files only), "task" (conversation only) or "both".
            paths: Restore only these paths (workspace-relative), whatever the task changed.
            dryRun: Change nothing; answer what the restore would do (with any conflicts).
            keepOutsideEdits: Keep the edits made outside the task's rounds (a three-way merge;
                refused with restore_conflict, changing nothing, when they overlap).
            root: Workspace folder (default: the server's working directory).
            task_id: Task id (default: the workspace's most recently active task).
        """
        with _Workspace(settings, default_root, root, task_id) as ws:
            cp = resolve_checkpoint(ws.checkpoints(), checkpoint)
            result = ws.backend.restore(ws.task, cp["ts"], mode, paths, dryRun, keepOutsideEdits)
        return {"checkpoint": _brief(cp), **result}

    @tool(annotations=_hints(title="Undo the last restore", destructiveHint=True,
                                   readOnlyHint=False, idempotentHint=False))
    def undo_restore(root: str | None = None, task_id: str | None = None) -> dict[str, Any]:
        """Undo the last file restore: put back exactly the files it changed.

        Args:
            root: Workspace folder (default: the server's working directory).
            task_id: Task id (default: the workspace's most recently active task).
        """
        with _Workspace(settings, default_root, root, task_id) as ws:
            return dict(ws.backend.undo_restore(ws.task))


def run(settings: Settings, directory: str | None = None) -> None:
    """Serve MCP on stdin/stdout until the client closes the connection."""
    build_server(settings, directory).run("stdio")
