"""Commands that start without click, rich or pydantic (issue 13): `delete-task ID --yes`
(with `--no-collect`, `--json`), which a person or a script runs to free space at once.

`entry.main` parses the arguments with `parse` and runs the command before the click CLI is
imported. The command hands over to the click CLI (returns None) before it changes anything
whenever the case is not the plain one: no `--yes` (the CLI asks or refuses), a sidecar
serving the workspace (the CLI deletes through it), a setting `shadowpoint.config.plain`
cannot prove (the CLI loads `Settings`, which reports it). The deletion and its report are
shared with the click command (`delete_task_here`, `deleted_json`, `deleted_text`), and
errors are answered by `cli.report` as the CLI answers them. Runs on the main thread.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shadowpoint.cli.report import fail, header, print_json, report_exception, stdout_console

if TYPE_CHECKING:
    from shadowpoint.store.checkpoints import TaskRecord

_DELETE_FLAGS = {"-y": "yes", "--yes": "yes", "--no-collect": "no_collect", "--json": "as_json"}


@dataclass(frozen=True, slots=True)
class DeleteTask:
    """`shadowpoint delete-task TASK_ID --yes [--no-collect] [--json]`."""

    task_id: str
    no_collect: bool = False
    as_json: bool = False

    def run(self) -> int | None:
        """Delete the task as the click command does; its exit code, or None when the click
        CLI must run the command instead (nothing was changed then)."""
        try:
            return self._run()
        except (Exception, KeyboardInterrupt) as exc:
            return report_exception(exc, self.as_json)

    def _run(self) -> int | None:
        from shadowpoint.config.plain import read_plain_settings

        settings = read_plain_settings()
        if settings is None:
            return None
        from shadowpoint.logs import configure_logging

        try:
            configure_logging(settings.log_level, settings.log_format, settings.log_file)
        except Exception:  # an unwritable log file: the CLI reports it as for every command
            return None
        import structlog

        from shadowpoint.sidecar.client import connect_live
        from shadowpoint.store.checkpoints import CheckpointStore
        from shadowpoint.store.shadow_repo import isolate_libgit2

        isolate_libgit2()
        docs = settings.resolved_docs_dir()
        rec = CheckpointStore(docs).load(self.task_id)
        roots = list(rec.roots.values())
        if not roots:
            fail(f"Task {self.task_id} names no workspace.", "unknown_task")
        live = connect_live(Path(roots[0]))
        if live is not None:
            live.close()
            structlog.get_logger(__name__).debug("quick.handed_over", command="delete-task", reason="sidecar")
            return None
        background = delete_task_here(docs, rec, no_collect=self.no_collect, gc_grace_s=settings.gc_grace_s)
        if self.as_json:
            print_json(deleted_json(self.task_id, background))
        else:
            stdout_console().print(deleted_text(self.task_id, roots, len(rec.checkpoints), background))
        return 0


def parse(args: list[str]) -> DeleteTask | None:
    """The command `args` name when it can run without click: `delete-task ID --yes` with
    `--no-collect` and `--json`, in any order, each once; None for anything else (no `--yes`,
    help, `=` forms, `--`, other options, options before the command): the click CLI runs it."""
    if not args or args[0] != "delete-task":
        return None
    flags: set[str] = set()
    words: list[str] = []
    for word in args[1:]:
        if word.startswith("-"):
            flag = _DELETE_FLAGS.get(word)
            if flag is None or flag in flags:
                return None
            flags.add(flag)
        else:
            words.append(word)
    if len(words) != 1 or not words[0] or "yes" not in flags:
        return None
    return DeleteTask(words[0], no_collect="no_collect" in flags, as_json="as_json" in flags)


def delete_task_here(docs: Path, rec: TaskRecord, *, no_collect: bool, gc_grace_s: float) -> bool:
    """Delete a task no sidecar serves: its refs (the objects stay, `storage.delete_task_storage`)
    and its record; the whole store when it was the last task, else a collection of the freed
    objects in the background unless `no_collect`. Returns whether a collection was started."""
    from shadowpoint.store import storage as store
    from shadowpoint.store.checkpoints import CheckpointStore

    git_dirs = store.delete_task_storage(docs, rec)
    if not CheckpointStore(docs).has_any_task() and store.remove_all_checkpoints(docs):
        return False  # the last task, and no engine runs: the whole store went
    if no_collect or not git_dirs:
        return False
    collect_in_background(git_dirs, gc_grace_s)
    return True


def collect_in_background(git_dirs: list[Path], grace_s: float) -> None:
    """Start a detached `shadowpoint storage --gc` for these shadow repos (it outlives us)."""
    import subprocess

    if not git_dirs:
        return
    only = [arg for g in git_dirs for arg in ("--only", g.parent.name)]
    subprocess.Popen([sys.executable, "-m", "shadowpoint", "storage", "--gc", "--quiet", "--grace", str(grace_s),
                      *only], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                     start_new_session=True, close_fds=True)


def deleted_json(task_id: str, background: bool) -> dict[str, Any]:
    return {"taskId": task_id, "deleted": True, "collecting": background}


def deleted_text(task_id: str, roots: list[str], checkpoints: int, background: bool) -> str:
    tail = "; its space is being reclaimed in the background" if background else ""
    return f"{header(task_id, ', '.join(roots))}\ndeleted task {task_id} ({checkpoints} checkpoint(s)){tail}"
