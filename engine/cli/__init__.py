"""The `shadowpoint` command line, one module per command group: `history` (save, list, diff,
status, log, fork), `restore` (restore, undo, redo), `storage` (storage, delete-task),
`agents` (hook, install-hooks, doctor, mcp), `serve` (serve, watch), on the click group of
`app` (with `bench`); `context` holds what they share, `report` how they answer, `quick` the
commands that start without click, `render`/`html_diff`/`html_page` what they print.

Commands for people and scripts (`watch`, `save`, `list`, `diff`, `restore`, `undo`,
`storage`, `delete-task`, `doctor`, `bench`), for agents (`serve`, `hook`,
`install-hooks`, `mcp`). Runs on the main thread; a workspace served by a running sidecar
is reached through it, otherwise through an in-process engine. Output goes to stdout,
progress, prompts and logs to stderr; `--json` prints one JSON document for scripts.
Importing this package imports no click, rich or pydantic (`quick` and `report` are on the
fast paths of `entry`); `main` imports the click group when it runs.

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
    141 —                       stdout's reader quit early (`| head`): stops quietly (128 + SIGPIPE, as git)
"""

from __future__ import annotations

from shadowpoint.cli.report import EXIT_CODES as EXIT_CODES
from shadowpoint.cli.report import people_words as people_words
from shadowpoint.errors import CliError as CliError


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit status (see the table in this module's docstring)."""
    from shadowpoint.cli.app import main as run

    return run(argv)
