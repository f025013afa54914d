"""The click group of the `shadowpoint` command, its entry point `main`, and `bench`.

`main` runs the group on the main thread and turns what a command raised into the exit code
of the table in `shadowpoint.cli`'s docstring. The commands live in one module per command
group (`history`, `restore`, `storage`, `agents`, `serve`), added to the group here.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path

import click

from shadowpoint import __version__
from shadowpoint.cli import agents, history, restore, serve, storage
from shadowpoint.cli.context import ARGV, dir_option
from shadowpoint.cli.report import EXIT_CODES, is_stdout_closed, report, report_exception, stdout_closed


class _Group(click.Group):
    """The group, answering a reader that closed stdout early (`| head`) before click does:
    click would exit 1, which is `internal` here."""

    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except BrokenPipeError:
            if not is_stdout_closed():
                raise
            sys.exit(stdout_closed())


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="shadowpoint")
@dir_option
def cli() -> None:
    """Checkpoints for AI coding agents: snapshots in a shadow git repository, compare and restore.

    Checkpoints are named by their position in `shadowpoint list` (1 = newest; `@N` works
    too) or by a hash prefix (5+ hex digits); positions stay the same until a new
    checkpoint is saved. The workspace is found like git finds a repository: the nearest
    folder upwards from the current one (or -C DIR) that has checkpoints, else the nearest
    holding a .git, else the current folder. Every command acts on the workspace's one
    default task (its most recently active) unless --task-id says otherwise.
    """


@click.command(context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
@dir_option
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

    for extra in (None, os.getcwd(), str(Path(__file__).resolve().parents[2])):
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

for _module in (history, restore, storage, agents, serve):
    for _command in _module.COMMANDS:
        cli.add_command(_command)
cli.add_command(bench)


# ---------------------------------------------------------------------------- entry point


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit status (see the table in this module's docstring)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) == 2 and args[0] == "hook" and not args[1].startswith("-"):
        return agents.run_hook_command(args[1])
    ARGV[:] = args
    as_json = "--json" in args[: args.index("--")] if "--" in args else "--json" in args
    try:
        cli.main(args=args, prog_name="shadowpoint", standalone_mode=False)
        sys.stdout.flush()
    except BrokenPipeError:  # the last flush of stdout (a command's own writes go to _Group.invoke)
        return stdout_closed()
    except click.exceptions.Abort:
        sys.stderr.write("shadowpoint: interrupted\n")
        return EXIT_CODES["interrupted"]
    except click.exceptions.Exit as exc:
        return int(exc.exit_code)
    except click.ClickException as exc:
        if as_json:
            return report(exc.format_message(), "usage", as_json)
        exc.show()
        return EXIT_CODES["usage"]
    except (Exception, KeyboardInterrupt) as exc:
        return report_exception(exc, as_json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
