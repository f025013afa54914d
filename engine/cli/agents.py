"""The command line for agents: `hook` (the lean hook client), `install-hooks`, `doctor` (the
health checks, with the agents' hook set-up among them) and `mcp` (the MCP server).

Runs on the main thread; `hook` runs without click when `entry` sees it (`hookrun`).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from shadowpoint.cli.context import Ctx, dir_option, isolate, pass_ctx, workspace_for
from shadowpoint.cli.report import fail, print_json


@click.command()
@click.argument("positional_dir", metavar="[DIR]", required=False, type=click.Path(file_okay=False, exists=True))
@dir_option
@click.option("--json", "as_json", is_flag=True, help="print JSON")
@pass_ctx
def doctor(ctx: Ctx, positional_dir: str | None, as_json: bool) -> None:
    """Check watch limits, storage, locks, sidecars and every shadow repo's health."""
    from shadowpoint.sidecar.doctor import run_checks

    isolate()
    report = run_checks(ctx.settings, workspace_for(ctx, positional_dir))
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
        fail(f"{len(problems)} problem(s) found.", "doctor_problems")


@click.command()
@click.argument("agent")
@dir_option
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


@click.command(name="install-hooks")
@click.argument("agent", type=click.Choice(["claude", "codex", "gemini"]))
@click.argument("directory", required=False, type=click.Path(file_okay=False, exists=True))
@click.option("--remove", is_flag=True, help="remove shadowpoint's entries (only ours)")
@click.option("--command", "command", default=None, help="the hook command (default: this shadowpoint)")
@click.option("--json", "as_json", is_flag=True, help="print JSON")
@dir_option
@pass_ctx
def install_hooks(ctx: Ctx, agent: str, directory: str | None, remove: bool, command: str | None,
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


@click.command()
@click.argument("directory", required=False, type=click.Path(file_okay=False, exists=True))
@dir_option
@pass_ctx
def mcp(ctx: Ctx, directory: str | None) -> None:
    """Run an MCP server (stdio) with tools to list, diff and restore checkpoints (needs the
    optional extra: pip install 'shadowpoint[mcp]')."""
    try:
        import mcp as _sdk  # noqa: F401 - only: is the optional extra installed?
    except ImportError:
        fail("`shadowpoint mcp` needs the MCP SDK: pip install 'shadowpoint[mcp]'", "usage")
    from shadowpoint.mcp_server import run

    isolate()
    run(ctx.settings, directory)


COMMANDS = (hook, install_hooks, doctor, mcp)
