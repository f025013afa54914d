"""Guards before any scan (SPEC §7) and deleting/collecting that return at once (issue 13),
as a person meets them: real `shadowpoint` processes, a real sidecar, real shadow repos."""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from shadowpoint.engine import EngineOptions
from shadowpoint.roots import RootState
from shadowpoint.workspace import RepoPath, open_workspaces
from tests.conftest import make_tree, read_tree, wait_for
from tests.integration.test_cli import SP, run_pty, save, sp, sp_json
from tests.rpc import RpcError, SidecarProcess


@pytest.mark.parametrize("folder", ["/", "/usr", "/etc", "/proc", "/tmp"])
def test_save_refuses_the_root_and_system_folders_before_any_scan(folder: str, env: dict[str, str],
                                                                   tmp_path: Path) -> None:
    proc = sp("save", folder, cwd=tmp_path, env=env, timeout=60)
    assert proc.returncode == 4, proc.stderr
    assert "Cannot use checkpoints in" in proc.stderr and "directory" in proc.stderr
    assert "scanner" not in proc.stderr, "refused before anything was scanned"
    docs = Path(env["SHADOWPOINT_DOCS_DIR"])
    assert not (docs / "checkpoints").exists() or not any((docs / "checkpoints").iterdir())


def test_commands_run_in_a_system_folder_are_refused_too(env: dict[str, str], tmp_path: Path) -> None:
    listed = sp("-C", "/etc", "list", cwd=tmp_path, env=env)
    assert listed.returncode in (4, 10), listed.stderr  # refused, or nothing saved there
    saved = sp("-C", "/etc", "save", cwd=tmp_path, env=env)
    assert saved.returncode == 4 and "Cannot use checkpoints in system /etc directory" in saved.stderr


def test_the_docs_root_and_a_folder_holding_it_are_refused(env: dict[str, str], tmp_path: Path) -> None:
    docs = Path(env["SHADOWPOINT_DOCS_DIR"])
    docs.mkdir(parents=True, exist_ok=True)
    (docs / "note.txt").write_text("x")
    inside = sp("save", str(docs), cwd=tmp_path, env=env)
    assert inside.returncode == 4 and "checkpoint store" in inside.stderr
    holder = sp("save", str(docs.parent), cwd=tmp_path, env=env)
    assert holder.returncode == 4 and "holds the checkpoint store" in holder.stderr
    assert not (docs / "checkpoints").exists()


def test_the_sidecar_refuses_them_with_protected_directory(env: dict[str, str], tmp_path: Path) -> None:
    sc = SidecarProcess(env=env, cwd=tmp_path)
    try:
        for root in ("/", "/usr", env["SHADOWPOINT_DOCS_DIR"]):
            Path(root).mkdir(parents=True, exist_ok=True)
            with pytest.raises(RpcError) as info:
                sc.call("initialize", {"roots": [root]})
            assert info.value.kind == "protected_directory", info.value.error
            assert str(info.value).startswith("Cannot use checkpoints in")
    finally:
        sc.close()


def test_a_docs_root_inside_the_workspace_is_never_snapshotted(tmp_path: Path, env: dict[str, str],
                                                               options: EngineOptions) -> None:
    project = make_tree(tmp_path / "project", {"app.py": "print(1)\n", ".checkpoints/tasks/t/task.json": "{}"})
    inner = {**env, "SHADOWPOINT_DOCS_DIR": str(project / ".checkpoints")}
    refused = sp("save", cwd=project, env=inner)
    assert refused.returncode == 4 and "holds the checkpoint store" in refused.stderr
    # and should a workspace hold it anyway (the guard is the first line), its rules leave it out
    ws = open_workspaces([project], tmp_path / "elsewhere", {})[0]
    root = RootState(ws, dataclasses.replace(options, docs_dir=project / ".checkpoints"))
    assert root.rules.is_excluded(RepoPath(".checkpoints"), is_dir=True)
    assert [str(p) for p, _ in root.rules.walk()] == ["app.py"]


# ---------------------------------------------------------------------------- delete / collect


def test_delete_task_says_what_it_deletes_and_a_no_is_calm(ws: Path, env: dict[str, str]) -> None:
    task = save(ws, env)["taskId"]
    refused = sp("delete-task", task, cwd=ws, env=env)
    assert refused.returncode == 50
    assert f"Deleting task {task} removes its 1 checkpoint(s)" in refused.stderr
    assert "overwrites" not in refused.stderr
    code, out = run_pty([*SP, "delete-task", task], ws, env, typed=b"n\n")
    assert code == 51, out
    assert b"Your files stay as they are" in out and b"Nothing was changed." in out
    assert b"error" not in out
    assert sp_json("list", "--tasks", cwd=ws, env=env)["tasks"][0]["taskId"] == task


def test_delete_task_returns_at_once_and_the_space_is_collected_in_the_background(
        ws: Path, env: dict[str, str], tmp_path: Path) -> None:
    keep = save(ws, env, "kept")["taskId"]
    doomed = "doomed-task"
    (ws / "only-doomed.txt").write_text("only the doomed task has this\n" * 50)
    sp_json("save", "--task-id", doomed, cwd=ws, env=env)
    docs = Path(env["SHADOWPOINT_DOCS_DIR"])
    git_dir = next((docs / "checkpoints").iterdir()) / ".git"
    oid = subprocess.run(["git", "hash-object", str(ws / "only-doomed.txt")], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert subprocess.run(["git", "--git-dir", str(git_dir), "cat-file", "-e", oid]).returncode == 0
    (ws / "only-doomed.txt").unlink()
    sp_json("save", "--task-id", keep, cwd=ws, env=env)  # the shared head moves off the doomed commit
    deleted = sp("delete-task", doomed, "--yes", "--json", cwd=ws, env={**env, "SHADOWPOINT_GC_GRACE_S": "0"})
    assert deleted.returncode == 0, deleted.stderr
    assert json.loads(deleted.stdout) == {"taskId": doomed, "deleted": True, "collecting": True}
    assert [t["taskId"] for t in sp_json("list", "--tasks", cwd=ws, env=env)["tasks"]] == [keep]
    # the detached collection clears the pending mark when done, and the doomed blob is gone
    wait_for(lambda: not (git_dir / "shadowpoint-gc-pending").exists(), "the collection never finished", 120)
    assert subprocess.run(["git", "--git-dir", str(git_dir), "cat-file", "-e", oid],
                          capture_output=True).returncode != 0
    assert subprocess.run(["git", "--git-dir", str(git_dir), "fsck", "--no-dangling"],
                          capture_output=True).returncode == 0
    listed = sp_json("list", cwd=ws, env=env)
    assert listed["taskId"] == keep and listed["checkpoints"][0]["hash"]


def test_storage_gc_on_a_terminal_reports_what_it_collected(ws: Path, env: dict[str, str]) -> None:
    save(ws, env)
    code, out = run_pty([*SP, "storage", "--gc"], ws, env)
    assert code == 0, out
    assert b"collected " in out and b"kept " in out


def test_a_removed_workspace_is_named_with_its_kept_checkpoints_and_restored_into_its_folder(
        ws: Path, env: dict[str, str]) -> None:
    """An agent removed the project folder itself: `-C` on it says the checkpoints are kept and
    how to get the files back (a folder that never had any gets click's plain answer), and a
    restore into the folder made again brings every file back."""
    before = read_tree(ws)
    save(ws, env)
    shutil.rmtree(ws)
    gone = sp("-C", ws.name, "list", cwd=ws.parent, env=env)
    assert gone.returncode == 2
    assert "does not exist; its checkpoints are kept" in gone.stderr and f"mkdir {ws.name}" in gone.stderr
    never = sp("-C", "never-saved", "list", cwd=ws.parent, env=env)
    assert never.returncode == 2 and "does not exist." in never.stderr and "kept" not in never.stderr
    # the shadow repository still opens (libgit2 alone refuses one whose work tree is gone)
    [entry] = sp_json("storage", cwd=ws.parent, env=env)["workspaces"]
    assert entry["worktree"] == str(ws) and len(entry["tasks"]) == 1
    doctor = sp_json("doctor", cwd=ws.parent, env=env)
    [repo_check] = [c for c in doctor["checks"] if c["name"].startswith("shadow repo")]
    assert repo_check["status"] == "warning" and f"its workspace {ws} is gone" in repo_check["summary"]
    assert any("its checkpoints are kept" in d for d in repo_check["details"]), repo_check
    ws.mkdir()
    restored = sp("-C", ws.name, "restore", "1", "--files", "--yes", cwd=ws.parent, env=env)
    assert restored.returncode == 0, restored.stderr
    assert read_tree(ws) == before
