"""`delete-task` without click (`shadowpoint.cli.quick`) against the click command: the installed
`shadowpoint` program and `shadowpoint.cli.main`, each in a real process, on the same shadow
repo (copied back between the two) give the same output, exit code and effect (refs, task
records, the background collection); the forms and cases the fast path does not take reach
click; and the fast path imports neither click, rich nor pydantic."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shadowpoint.errors import SidecarError
from shadowpoint.sidecar.client import SidecarClient, socket_path
from tests.conftest import wait_for
from tests.integration.test_cli import save, sp_json
from tests.integration.test_socket import server

SHADOWPOINT = Path(sys.executable).parent / "shadowpoint"  # the installed console script (entry.main)
CLICK = [sys.executable, "-c", "import sys; from shadowpoint.cli import main; sys.exit(main(sys.argv[1:]))"]
HEAVY = ("click", "rich", "pydantic", "pydantic_core", "pydantic_settings")
# Imported by every Python process run with PYTHONPATH=<its folder>: on SP_TEST_BLOCK, importing
# a heavy module fails; on SP_TEST_MODULES, the modules loaded are written there at exit. Both
# variables are taken out of the environment, so the background collection runs unhindered.
SITECUSTOMIZE = f"""
import atexit, json, os, sys
if os.environ.pop("SP_TEST_BLOCK", None):
    for name in {HEAVY!r}:
        sys.modules[name] = None
_modules = os.environ.pop("SP_TEST_MODULES", None)
if _modules:
    atexit.register(lambda: open(_modules, "w").write(json.dumps(sorted(
        n for n, m in sys.modules.items() if m is not None))))
"""


@pytest.fixture
def hooks_env(env: dict[str, str], tmp_path: Path) -> dict[str, str]:
    folder = tmp_path / "site-hooks"
    folder.mkdir()
    (folder / "sitecustomize.py").write_text(SITECUSTOMIZE)
    return {**env, "PYTHONPATH": str(folder), "SHADOWPOINT_GC_GRACE_S": "0"}


def run(program: list[str], args: list[str], cwd: Path, env: dict[str, str]) -> tuple[int, str, str]:
    proc = subprocess.run([*program, *args], cwd=cwd, env=env, stdin=subprocess.DEVNULL, capture_output=True,
                          text=True, timeout=120, check=False)
    return proc.returncode, proc.stdout, proc.stderr


def refs(git_dir: Path) -> list[str]:
    out = subprocess.run(["git", "--git-dir", str(git_dir), "for-each-ref", "--format=%(refname) %(objectname)"],
                         capture_output=True, text=True, check=True).stdout
    return out.splitlines()


def state(docs: Path) -> dict[str, Any]:
    """What a deletion changes: every shadow repo's refs and pending mark, the task records."""
    checkpoints = docs / "checkpoints"
    repos = sorted(checkpoints.iterdir()) if checkpoints.is_dir() else []
    return {"repos": {d.name: {"refs": refs(d / ".git"),
                               "pending": (d / ".git" / "shadowpoint-gc-pending").exists()} for d in repos},
            "tasks": sorted(p.name for p in (docs / "tasks").iterdir()) if (docs / "tasks").is_dir() else []}


@pytest.fixture
def two_tasks(ws: Path, hooks_env: dict[str, str]) -> Iterator[Path]:
    """A workspace with its default task, task `kept` and task `doomed` (two checkpoints, a file
    only it saw); yields the docs root, saved aside so that each run starts from the same files."""
    save(ws, hooks_env, "kept")
    kept = sp_json("list", "--tasks", cwd=ws, env=hooks_env)["tasks"][0]["taskId"]
    sp_json("save", "--task-id", "kept", cwd=ws, env=hooks_env)  # an explicit name too
    (ws / "only-doomed.txt").write_text("only the doomed task saw this\n" * 40)
    sp_json("save", "--task-id", "doomed", cwd=ws, env=hooks_env)
    (ws / "app.py").write_text("print(2)\n")
    sp_json("save", "--task-id", "doomed", cwd=ws, env=hooks_env)
    (ws / "only-doomed.txt").unlink()
    sp_json("save", "--task-id", kept, cwd=ws, env=hooks_env)
    docs = Path(hooks_env["SHADOWPOINT_DOCS_DIR"])
    shutil.copytree(docs, docs.with_name("docs-pristine"), symlinks=True)
    yield docs


def restore_docs(docs: Path) -> None:
    shutil.rmtree(docs)
    shutil.copytree(docs.with_name("docs-pristine"), docs, symlinks=True)


def both(args: list[str], ws: Path, docs: Path, env: dict[str, str], *, quick: bool) -> tuple[Any, Any]:
    """The installed program (with click, rich and pydantic unimportable when the fast path must
    take the case) and the click command, from the same files; each one's answer and effect
    (once a collection they started is done: it clears the pending marks)."""
    answers = []
    for program, extra in ((SHADOWPOINT, {"SP_TEST_BLOCK": "1"} if quick else {}), (None, {})):
        restore_docs(docs)
        code, out, err = run([str(program)] if program else CLICK, args, ws, {**env, **extra})
        if "--no-collect" not in args:
            wait_for(lambda: not any(r["pending"] for r in state(docs)["repos"].values()),
                     "the background collection never finished", timeout_s=120)
        answers.append(((code, out, err), state(docs)))
    return answers[0], answers[1]


@pytest.mark.parametrize("flags", [["--yes", "--no-collect"], ["--no-collect", "-y", "--json"],
                                   ["--json", "--yes", "--no-collect"]])
def test_the_fast_path_deletes_as_the_click_command_does(two_tasks: Path, ws: Path, hooks_env: dict[str, str],
                                                         flags: list[str]) -> None:
    docs = two_tasks
    before = state(docs)
    [(fast, fast_effect), (slow, slow_effect)] = both(["delete-task", "doomed", *flags], ws, docs, hooks_env,
                                                      quick=True)
    assert fast == slow and fast_effect == slow_effect
    code, out, err = fast
    assert code == 0 and err == ""
    if "--json" in flags:
        assert json.loads(out) == {"taskId": "doomed", "deleted": True, "collecting": False}
    else:
        assert out == f"Task doomed · {ws}\ndeleted task doomed (2 checkpoint(s))\n"
    [repo] = fast_effect["repos"].values()
    assert not [r for r in repo["refs"] if "/doomed" in r], "the task's refs are gone"
    assert [r for r in repo["refs"] if r not in before["repos"][next(iter(before["repos"]))]["refs"]] == []
    assert repo["pending"], "its objects await a collection"
    assert "doomed" not in fast_effect["tasks"] and len(fast_effect["tasks"]) == 2


def test_the_background_collection_starts_alike(two_tasks: Path, ws: Path, hooks_env: dict[str, str]) -> None:
    docs = two_tasks
    oid = subprocess.run(["git", "hash-object", "--stdin"], input="only the doomed task saw this\n" * 40,
                         capture_output=True, text=True, check=True).stdout.strip()
    [(fast, fast_effect), (slow, slow_effect)] = both(["delete-task", "doomed", "--yes"], ws, docs, hooks_env,
                                                      quick=True)
    assert fast == slow and fast_effect == slow_effect
    assert fast == (0, f"Task doomed · {ws}\n"
                       "deleted task doomed (2 checkpoint(s)); its space is being reclaimed in the background\n", "")
    git_dir = next((docs / "checkpoints").iterdir()) / ".git"
    assert subprocess.run(["git", "--git-dir", str(git_dir), "cat-file", "-e", oid], capture_output=True).returncode
    [(fast, _), (slow, _)] = both(["delete-task", "doomed", "--yes", "--json"], ws, docs, hooks_env, quick=True)
    assert fast == slow and json.loads(fast[1]) == {"taskId": "doomed", "deleted": True, "collecting": True}


def test_deleting_the_last_task_removes_the_store_alike(ws: Path, hooks_env: dict[str, str]) -> None:
    save(ws, hooks_env)
    task = sp_json("list", "--tasks", cwd=ws, env=hooks_env)["tasks"][0]["taskId"]
    docs = Path(hooks_env["SHADOWPOINT_DOCS_DIR"])
    shutil.copytree(docs, docs.with_name("docs-pristine"), symlinks=True)
    [(fast, fast_effect), (slow, slow_effect)] = both(["delete-task", task, "--yes"], ws, docs, hooks_env, quick=True)
    assert fast == slow and fast_effect == slow_effect
    assert fast == (0, f"Task {task} · {ws}\ndeleted task {task} (1 checkpoint(s))\n", "")
    assert fast_effect == {"repos": {}, "tasks": []}


@pytest.mark.parametrize("flags", [["--yes"], ["--yes", "--json"]])
def test_errors_are_answered_alike(two_tasks: Path, ws: Path, hooks_env: dict[str, str], flags: list[str]) -> None:
    docs = two_tasks
    unknown = both(["delete-task", "no-such-task", *flags], ws, docs, hooks_env, quick=True)
    assert unknown[0] == unknown[1]
    code, out, err = unknown[0][0]
    assert code == 10 and err.startswith("shadowpoint: error: Unknown task 'no-such-task'")
    if "--json" in flags:
        assert json.loads(out)["error"]["exitCode"] == 10
    pristine = docs.with_name("docs-pristine") / "tasks" / "doomed"
    (pristine / "task.json").write_text("{not json")
    damaged = both(["delete-task", "doomed", *flags], ws, docs, hooks_env, quick=True)
    assert damaged[0] == damaged[1]
    assert damaged[0][0][0] != 0 and "unreadable metadata" in damaged[0][0][2]
    assert damaged[0][1]["tasks"] == damaged[1][1]["tasks"] and "doomed" in damaged[0][1]["tasks"]


NOT_TAKEN = [
    ["delete-task", "doomed"],  # no --yes: click asks (here: refuses, there is no terminal)
    ["delete-task", "doomed", "--json"],
    ["delete-task", "--help"],
    ["delete-task", "doomed", "--yes", "--bogus"],
    ["delete-task", "doomed", "--yes", "--yes"],
    ["delete-task", "--", "doomed", "--yes"],
    ["delete-task", "doomed", "other", "--yes"],
    ["delete-task", "--yes"],
    ["-C", ".", "delete-task", "doomed", "--yes", "--no-collect"],
]


def test_what_the_fast_path_does_not_take_reaches_click(two_tasks: Path, ws: Path, hooks_env: dict[str, str]) -> None:
    for args in NOT_TAKEN:
        [(fast, fast_effect), (slow, slow_effect)] = both(args, ws, two_tasks, hooks_env, quick=False)
        assert fast == slow and fast_effect == slow_effect, args
    assert both(["delete-task", "doomed"], ws, two_tasks, hooks_env, quick=False)[0][0][0] == 50


def test_a_setting_the_plain_reader_cannot_prove_is_reported_by_settings(two_tasks: Path, ws: Path,
                                                                         hooks_env: dict[str, str]) -> None:
    docs = two_tasks
    env = {**hooks_env, "SHADOWPOINT_MAX_FILE_BYTES": "1_000"}  # pydantic reads 1000: so must we, through it
    [(fast, fast_effect), (slow, slow_effect)] = both(["delete-task", "doomed", "--yes", "--no-collect"], ws, docs,
                                                      env, quick=False)
    assert fast == slow and fast_effect == slow_effect and fast[0] == 0
    bad = {**hooks_env, "SHADOWPOINT_LOG_LEVEL": "loud"}
    [(fast, fast_effect), (slow, slow_effect)] = both(["delete-task", "doomed", "--yes", "--json"], ws, docs, bad,
                                                      quick=False)
    assert fast[:2] == slow[:2] and fast_effect == slow_effect
    assert fast[0] == 1 and json.loads(fast[1])["error"]["kind"] == "internal" and "log_level" in fast[2]
    assert "doomed" in fast_effect["tasks"], "nothing was deleted"


def test_the_fast_path_imports_no_click_rich_or_pydantic(two_tasks: Path, ws: Path, hooks_env: dict[str, str],
                                                         tmp_path: Path) -> None:
    listing = tmp_path / "modules.json"
    for flags in (["--yes", "--no-collect"], ["--no-collect", "--yes", "--json"]):
        restore_docs(two_tasks)
        code, _, err = run([str(SHADOWPOINT)], ["delete-task", "doomed", *flags], ws,
                             {**hooks_env, "SP_TEST_MODULES": str(listing)})
        assert code == 0, err
        loaded = json.loads(listing.read_text())
        assert "shadowpoint.cli.quick" in loaded and "pygit2" in loaded
        assert not [m for m in loaded if m.split(".")[0] in HEAVY], [m for m in loaded if m.split(".")[0] in HEAVY]
    # and the same command through click loads them: the check above can tell
    restore_docs(two_tasks)
    run(CLICK, ["delete-task", "doomed", "--yes", "--no-collect"], ws, {**hooks_env, "SP_TEST_MODULES": str(listing)})
    assert {"click", "pydantic"} <= set(json.loads(listing.read_text()))


def _serving(ws: Path, env: dict[str, str]) -> contextlib.AbstractContextManager[subprocess.Popen[bytes]]:
    """The workspace's socket sidecar (`test_socket.server`), from the workspace."""
    path = socket_path(ws)
    path.parent.mkdir(parents=True, exist_ok=True)
    return server(path, env=env, cwd=ws)


def test_a_running_sidecar_deletes_the_task_as_with_click(ws: Path, hooks_env: dict[str, str]) -> None:
    with _serving(ws, hooks_env) as proc:
        for task in ("kept", "live-1", "live-2"):
            sp_json("save", "--task-id", task, cwd=ws, env=hooks_env)
        fast = run([str(SHADOWPOINT)], ["delete-task", "live-1", "--yes", "--json"], ws,
                   {**hooks_env, "SHADOWPOINT_LOG_LEVEL": "debug"})
        slow = run(CLICK, ["delete-task", "live-2", "--yes", "--json"], ws, hooks_env)
        assert fast[0] == slow[0] == 0, (fast, slow)
        assert "quick.handed_over" in fast[2] and "reason=sidecar" in fast[2]
        assert json.loads(fast[1]) == {"taskId": "live-1", "deleted": True, "collecting": False}
        assert json.loads(slow[1]) == {"taskId": "live-2", "deleted": True, "collecting": False}
        assert [t["taskId"] for t in sp_json("list", "--tasks", cwd=ws, env=hooks_env)["tasks"]] == ["kept"]
        assert proc.poll() is None, "the sidecar still serves the workspace"
        git_dir = next((Path(hooks_env["SHADOWPOINT_DOCS_DIR"]) / "checkpoints").iterdir()) / ".git"
        assert not [r for r in refs(git_dir) if "/live-" in r]


def test_the_console_script_is_the_entry_point() -> None:
    assert SHADOWPOINT.is_file() and os.access(SHADOWPOINT, os.X_OK)
    assert "shadowpoint.entry" in SHADOWPOINT.read_text()


def test_the_sidecar_serves_a_task_without_pydantic(ws: Path, hooks_env: dict[str, str], tmp_path: Path) -> None:
    """`serve --socket` with pydantic, click and rich unimportable: a task's rounds are answered and
    checkpointed (the params are checked, the settings read without them), and the process never
    loaded them (issue 11: ~0.1 s of every sidecar's start). Settings sent with `initialize` are
    the one use of pydantic: checked by `Settings` in a sidecar that may import it."""
    listing = tmp_path / "modules.json"
    with _serving(ws, {**hooks_env, "SP_TEST_BLOCK": "1", "SP_TEST_MODULES": str(listing)}) as proc:
        with SidecarClient(socket_path(ws), timeout_s=60) as sc:
            sc.request("initialize", {"roots": [str(ws)]})
            sc.request("task/start", {"taskId": "lean", "ts": 1})
            sc.request("tool/begin", {"taskId": "lean", "tool": "write", "kind": "edit", "paths": ["made.txt"]})
            (ws / "made.txt").write_text("made while no pydantic was loaded\n")
            sc.request("tool/end", {"taskId": "lean", "tool": "write", "kind": "edit", "paths": ["made.txt"]})
            ended = sc.request("round/end", {"taskId": "lean", "ts": 2})
            with pytest.raises(SidecarError) as err:
                sc.request("tool/begin", {"taskId": "lean", "tool": "write", "kind": "write"})
            assert err.value.kind == "invalid_params" and "`kind` must be read, edit or command." in str(err.value)
            sc.request("sidecar/stop")
        assert proc.wait(timeout=60) == 0
    git_dir = next((Path(hooks_env["SHADOWPOINT_DOCS_DIR"]) / "checkpoints").iterdir()) / ".git"
    shown = subprocess.run(["git", "--git-dir", str(git_dir), "show", f"{ended['checkpoint']['hash']}:made.txt"],
                           capture_output=True, text=True, check=True).stdout
    assert shown == "made while no pydantic was loaded\n"
    loaded = json.loads(listing.read_text())
    assert "shadowpoint.sidecar.params" in loaded and "pygit2" in loaded
    assert not [m for m in loaded if m.split(".")[0] in HEAVY], [m for m in loaded if m.split(".")[0] in HEAVY]

    # pydantic importable: settings overrides are checked by `Settings`
    with _serving(ws, hooks_env) as proc:
        with SidecarClient(socket_path(ws), timeout_s=60) as sc:
            with pytest.raises(SidecarError) as err:
                sc.request("initialize", {"roots": [str(ws)], "settings": {"maxFileBytes": 0}})
            assert err.value.kind == "invalid_params" and str(err.value).startswith("Invalid settings:")
            sc.request("initialize", {"roots": [str(ws)], "settings": {"maxFileBytes": 10}})
            sc.request("task/start", {"taskId": "small", "ts": 1})
            (ws / "big.txt").write_text("more than ten bytes\n")
            sc.request("tool/begin", {"taskId": "small", "tool": "bash", "kind": "command"})
            sc.request("tool/end", {"taskId": "small", "tool": "bash", "kind": "command"})
            ended = sc.request("round/end", {"taskId": "small", "ts": 2})
            listed = ["git", "--git-dir", str(git_dir), "ls-tree", "-r", "--name-only", ended["checkpoint"]["hash"]]
            tree = subprocess.run(listed, capture_output=True, text=True, check=True).stdout.split()
            assert "made.txt" not in tree and "big.txt" not in tree, "files over maxFileBytes are left out"
            sc.request("sidecar/stop")
        assert proc.wait(timeout=60) == 0
