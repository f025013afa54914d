"""The command line's careful restores and task history as a script uses them (real processes):
`restore PATHS`, `--dry-run` (`--json` is the protocol's Restore), `--keep-mine`, the plan a
restore shows, `undo`/`redo`, `fork`, `log` (and `--html`), `list --all`, `storage --gc`'s grace.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pygit2
import pytest

from tests.conftest import make_tree, read_tree
from tests.integration.test_cli import SP, run_pty, save, sp, sp_json


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    """The hermetic environment with a short runtime dir of its own (as test_cli.py's)."""
    run_dir = Path(tempfile.mkdtemp(prefix="sp-run-"))
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(run_dir))
    yield dict(os.environ)
    shutil.rmtree(run_dir, ignore_errors=True)

LINES = "".join(f"line {i}\n" for i in range(1, 11))


@pytest.fixture
def ws(workspace: Path) -> Path:
    make_tree(workspace, {"a.txt": "a1\n", "f.txt": LINES})
    return workspace


def two_saves(ws: Path, env: dict[str, str]) -> None:
    save(ws, env, "base")
    make_tree(ws, {"a.txt": "a2\n", "f.txt": LINES.replace("line 2\n", "task 2\n"), "n.txt": "new\n"})
    save(ws, env, "two")


def test_dry_run_prints_the_plan_and_json_is_the_restore(ws: Path, env: dict[str, str]) -> None:
    two_saves(ws, env)
    make_tree(ws, {"f.txt": LINES.replace("line 2\n", "task 2\n").replace("line 9\n", "mine 9\n"),
                   "notes.md": "the person's\n"})
    disk = read_tree(ws)
    dry = sp_json("restore", "2", "--files", "--dry-run", "--keep-mine", cwd=ws, env=env)
    assert dry["files"] == {"restored": ["a.txt"], "deleted": ["n.txt"], "merged": ["f.txt"], "conflicts": [],
                            "safety": None}
    text = sp("restore", "2", "--files", "--dry-run", cwd=ws, env=env)
    assert text.returncode == 0, text.stderr
    assert "restore 2 files:\n  a.txt\n  f.txt\ndelete 1 file:\n  n.txt\n" in text.stdout
    assert "notes.md: changed outside the task's rounds" in text.stdout
    assert "shadowpoint restore 2 --files -- notes.md" in text.stdout, "names the form that would include it"
    assert read_tree(ws) == disk, "--dry-run changes nothing"
    done = sp_json("restore", "2", "--files", "--keep-mine", "--yes", cwd=ws, env=env)
    assert done["files"]["merged"] == ["f.txt"]
    assert (ws / "f.txt").read_text() == LINES.replace("line 9\n", "mine 9\n")
    assert (ws / "notes.md").read_text() == "the person's\n"


def test_the_question_of_a_task_restore_lists_what_leaves_the_task(ws: Path, env: dict[str, str]) -> None:
    two_saves(ws, env)
    listed = sp_json("list", cwd=ws, env=env)
    newest = listed["checkpoints"][0]
    code, out = run_pty([*SP, "restore", "2", "--task"], ws, env, typed=b"n\n")
    text = out.decode().replace("\r\n", "\n")
    assert code == 51 and "Nothing was changed." in text, text
    assert f"Task {listed['taskId']} · {ws}\n" in text and text.count(f"Task {listed['taskId']} · ") == 1, text
    assert "leave the task: 1 checkpoint and 1 message after it:\n" in text, text
    assert f"  #1 ({newest['hash'][:10]}, round, " in text and text.index("#1 (") < text.index("Go ahead?"), text
    assert sp_json("list", cwd=ws, env=env)["checkpoints"] == listed["checkpoints"], "answered no: nothing cut"
    plan = sp("restore", "1", "--both", "--dry-run", cwd=ws, env=env).stdout
    assert "nothing leaves the task: no checkpoint or message after it" in plan, plan


def test_two_different_restore_modes_are_a_usage_error(ws: Path, env: dict[str, str]) -> None:
    two_saves(ws, env)
    disk = read_tree(ws)
    listed = sp_json("list", cwd=ws, env=env)["checkpoints"]
    for modes in (["--files", "--task"], ["--task", "--files"], ["--files", "--both"], ["--both", "--task"],
                  ["--files", "--task", "--both"]):
        proc = sp("restore", "2", *modes, "--yes", cwd=ws, env=env)
        assert proc.returncode == 2, (modes, proc.stderr)
        assert "--files" in proc.stderr and "contradict" in proc.stderr, proc.stderr
        assert read_tree(ws) == disk and sp_json("list", cwd=ws, env=env)["checkpoints"] == listed, "nothing changed"
    again = sp("restore", "2", "--files", "--files", "--yes", "--json", cwd=ws, env=env)
    assert again.returncode == 0 and json.loads(again.stdout)["files"]["restored"], "one mode twice is that mode"


def test_restore_named_paths_only(ws: Path, env: dict[str, str]) -> None:
    two_saves(ws, env)
    proc = sp("restore", "2", "--yes", "--json", "--", "a.txt", cwd=ws, env=env)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["files"]["restored"] == ["a.txt"] and out["files"]["deleted"] == []
    assert (ws / "a.txt").read_text() == "a1\n" and (ws / "n.txt").exists()


def test_a_path_naming_nothing_is_refused_before_anything_is_written(ws: Path, env: dict[str, str]) -> None:
    make_tree(ws, {"d/x.txt": "x\n"})
    two_saves(ws, env)
    (ws / "n.txt").unlink()  # only in the newest snapshot now
    disk = read_tree(ws)
    for args in (["nosuch.txt"], ["--", "nosuch.txt"], ["a.txt", "d/nosuch.txt"]):
        proc = sp("restore", "2", "--files", "--yes", *args, cwd=ws, env=env)  # git: "pathspec did not match"
        assert proc.returncode == 5, (args, proc.returncode, proc.stdout, proc.stderr)
        assert proc.stderr.startswith("shadowpoint: error:") and proc.stderr.count("\n") == 1, proc.stderr
        assert args[-1] in proc.stderr and proc.stdout == "", proc.stderr
    assert read_tree(ws) == disk
    assert sp_json("list", "--all", cwd=ws, env=env)["safety"] == [], "no safety checkpoint"
    assert sp("undo", cwd=ws, env=env).returncode == 22, "nothing on the undo stack"
    done = sp_json("restore", "2", "--files", "--yes", "n.txt", "d", cwd=ws, env=env)  # newest snapshot, a folder
    assert done["files"]["restored"] == [] and done["files"]["deleted"] == []
    done = sp_json("restore", "1", "--files", "--yes", "n.txt", cwd=ws, env=env)  # in the checkpoint
    assert done["files"]["restored"] == ["n.txt"] and (ws / "n.txt").read_text() == "new\n"


def test_already_restored_names_the_checkpoint_as_list_shows_it(ws: Path, env: dict[str, str]) -> None:
    two_saves(ws, env)
    sp_json("restore", "1", "--files", "--yes", cwd=ws, env=env)
    listed = sp("list", cwd=ws, env={**env, "TZ": "IST-5:30"})  # local time, not UTC
    [(short, created)] = re.findall(r"│ 1 │ (\w+) +│ \w+ +│ ([\d-]+ [\d:]+) +│", listed.stdout)
    proc = sp("restore", "1", "--files", "--yes", cwd=ws, env={**env, "TZ": "IST-5:30"})
    assert proc.returncode == 21 and proc.stderr.count("\n") == 1, proc.stderr
    assert f"#1 ({short}, round, {created})" in proc.stderr, (proc.stderr, listed.stdout)


def test_a_conflict_exits_with_its_code_and_writes_nothing(ws: Path, env: dict[str, str]) -> None:
    two_saves(ws, env)
    make_tree(ws, {"f.txt": LINES.replace("line 2\n", "mine 2\n")})
    disk = read_tree(ws)
    proc = sp("restore", "2", "--files", "--keep-mine", "--yes", cwd=ws, env=env)
    assert proc.returncode == 24 and "f.txt" in proc.stderr, proc.stderr
    assert read_tree(ws) == disk


def test_undo_redo_list_all_fork_and_log(ws: Path, env: dict[str, str], tmp_path: Path) -> None:
    two_saves(ws, env)
    after_two = read_tree(ws)
    sp_json("restore", "2", "--files", "--yes", cwd=ws, env=env)
    at_base = read_tree(ws)
    sp_json("restore", "1", "--files", "--yes", cwd=ws, env=env)
    listing = sp_json("list", "--all", cwd=ws, env=env)
    assert [s["op"] for s in listing["safety"]] == ["restore", "restore"] and all(s["hash"] for s in listing["safety"])
    sp_json("undo", cwd=ws, env=env)
    assert read_tree(ws) == at_base
    sp_json("undo", cwd=ws, env=env)
    assert read_tree(ws) == after_two
    assert sp("undo", cwd=ws, env=env).returncode == 22
    sp_json("redo", cwd=ws, env=env)
    assert read_tree(ws) == at_base
    listing = sp_json("list", "--all", cwd=ws, env=env)
    assert [s["op"] for s in listing["safety"]] == ["redo", "undo", "undo", "restore", "restore"]
    forked = sp_json("fork", "1", "attempt-2", cwd=ws, env=env)
    assert forked["checkpoint"]["hash"] == listing["checkpoints"][0]["hash"] and forked["taskId"] == "attempt-2"
    assert sp("fork", "1", "attempt-2", cwd=ws, env=env).returncode == 2, "a known id is invalid_params"
    task = listing["taskId"]
    page = tmp_path / "log.html"
    log = sp_json("log", "--task-id", task, "--html", str(page), cwd=ws, env=env)
    kinds = [e["kind"] for e in log["events"]]
    assert kinds.count("checkpoint") == 2 and kinds.count("undo") == 2 and "redo" in kinds and "fork" in kinds
    safety = {s["hash"] for s in listing["safety"]}
    assert {e["safety"] for e in log["events"] if e["kind"] in ("restore", "undo", "redo")} == safety
    assert "<!doctype html>" in page.read_text() and "forked into task attempt-2" in page.read_text()
    text = sp("log", "--task-id", task, cwd=ws, env=env)
    assert text.returncode == 0 and "safety checkpoint" in text.stdout and "undo" in text.stdout


def test_restore_undo_redo_fork_and_delete_task_start_with_the_task_and_workspace(ws: Path,
                                                                                  env: dict[str, str]) -> None:
    two_saves(ws, env)
    task = sp_json("list", cwd=ws, env=env)["taskId"]
    head = f"Task {task} · {ws}\n"
    for args in (["restore", "2", "--files", "--yes"], ["undo"], ["redo"], ["restore", "2", "--files", "--dry-run"],
                 ["fork", "1", "other"], ["restore", "1", "--task", "--yes"], ["delete-task", "other", "--yes"]):
        proc = sp(*args, cwd=ws, env=env)
        assert proc.returncode == 0, (args, proc.stderr)
        want = head.replace(task, "other") if args[0] == "delete-task" else head
        assert proc.stdout.startswith(want) and proc.stdout.count(want) == 1, (args, proc.stdout)
    assert "Task" not in sp("undo", "--json", cwd=ws, env=env).stdout, "JSON output is unchanged"


def test_people_see_checkpoints_by_position_and_local_time_never_raw_ts(ws: Path, env: dict[str, str]) -> None:
    env = {**env, "TZ": "IST-5:30"}  # list shows local time: so must everything else
    two_saves(ws, env)
    make_tree(ws, {"a.txt": "a3\n"})
    save(ws, env, "three")
    sp_json("restore", "2", "--files", "--yes", cwd=ws, env=env)
    sp_json("fork", "2", "attempt-2", cwd=ws, env=env)
    two = sp_json("list", cwd=ws, env=env)["checkpoints"][1]
    name = f"#2 ({two['hash'][:10]})"
    cut = sp("restore", "2", "--task", "--yes", cwd=ws, env=env)
    assert cut.returncode == 0 and f"task cut after checkpoint {name[:-1]}, round, " in cut.stdout, cut.stdout
    listed = sp("list", "--all", cwd=ws, env=env).stdout
    log = sp("log", cwd=ws, env=env).stdout
    fork_log = sp("log", "--task-id", "attempt-2", cwd=ws, env=env).stdout
    for text in (cut.stdout, listed, log, fork_log):
        assert not re.search(r"\bts\b|(?<![-\d])\d{13}", text), text  # cli-<13 digits> is a task id
    now = f"#1 ({two['hash'][:10]})"  # the newest since the cut
    assert f"to {now}" in listed and f"restore 1 to {now}" in log and f"forked into task attempt-2 at {now}" in log
    assert f"forked from task {cut.stdout.split()[1]} at {now}" in fork_log, fork_log
    times = dict(re.findall(r"│ (\d) │ \w+ +│ \w+ +│ ([\d-]+ [\d:]+) +│", listed))
    shown = [line[:19] for line in log.splitlines() if line[21:].startswith("checkpoint ")]
    assert shown == [times["2"], times["1"]], log


def test_a_fork_leaves_the_default_task_and_its_positions_alone(ws: Path, env: dict[str, str]) -> None:
    two_saves(ws, env)
    before = sp_json("list", cwd=ws, env=env)
    forked = sp("fork", "2", "attempt-2", cwd=ws, env=env)
    assert forked.returncode == 0 and "--task-id attempt-2" in forked.stdout, forked.stderr
    after = sp_json("list", cwd=ws, env=env)
    assert after["taskId"] == before["taskId"] and after["checkpoints"] == before["checkpoints"], \
        "@N names the same checkpoint until a new one is saved"
    assert sp_json("diff", "@1", cwd=ws, env=env)["from"]["hash"] == before["checkpoints"][0]["hash"]
    assert sp_json("list", "--tasks", cwd=ws, env=env)["default"] == before["taskId"]
    fork = sp_json("list", "--task-id", "attempt-2", cwd=ws, env=env)
    assert [c["hash"] for c in fork["checkpoints"]] == [before["checkpoints"][1]["hash"]]
    (ws / "a.txt").write_text("a3 in the fork\n")
    sp_json("save", "--task-id", "attempt-2", cwd=ws, env=env)
    assert sp_json("list", cwd=ws, env=env)["taskId"] == "attempt-2", "its own checkpoint: the most recently active"


def test_storage_gc_keeps_young_unreachable_objects_by_default(ws: Path, env: dict[str, str]) -> None:
    save(ws, env)
    report = sp_json("storage", cwd=ws, env=env)
    shadow = Path(report["workspaces"][0]["shadowGitDir"])
    repo = pygit2.Repository(str(shadow))
    loose = str(repo.create_blob(b"unreachable, just written"))
    repo.free()
    sp_json("storage", "--gc", cwd=ws, env={**env, "SHADOWPOINT_GC_GRACE_S": "3600"})
    assert (shadow / "objects" / loose[:2] / loose[2:]).exists(), "gc_grace_s (3600 s) keeps a young object"
    sp_json("storage", "--gc", "--grace", "0", cwd=ws, env=env)
    assert not (shadow / "objects" / loose[:2] / loose[2:]).exists()


def test_a_safety_checkpoint_is_named_by_its_hash_in_diff_and_restore(ws: Path, env: dict[str, str]) -> None:
    two_saves(ws, env)
    make_tree(ws, {"a.txt": "the person's unsaved edit\n"})
    out = sp_json("restore", "2", "--files", "--yes", cwd=ws, env=env)
    safety = out["files"]["safety"]
    assert (ws / "a.txt").read_text() == "a1\n"
    diff = sp_json("diff", safety[:10], cwd=ws, env=env)
    changed = {f["path"]: f for f in diff["files"]}
    assert changed["a.txt"]["before"] == "the person's unsaved edit\n" and changed["a.txt"]["after"] == "a1\n"
    back = sp_json("restore", safety[:10], "--files", "--yes", cwd=ws, env=env)
    assert "a.txt" in back["files"]["restored"]
    assert (ws / "a.txt").read_text() == "the person's unsaved edit\n" and (ws / "n.txt").read_text() == "new\n"
    assert sp("restore", safety[:10], "--task", "--yes", cwd=ws, env=env).returncode == 2
