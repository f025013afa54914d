"""Agent adapters end to end: hook payloads with the real field names of Claude Code, Codex CLI
and Gemini CLI piped through `shadowpoint hook AGENT` processes, one per event as the agents
run them, and the checkpoints that result read back from the shadow repo with the git CLI.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shadowpoint.adapters import claude, codex, gemini
from shadowpoint.sidecar.client import SidecarClient, socket_path
from shadowpoint.store.checkpoints import CheckpointStore
from shadowpoint.workspace import workspace_hash
from tests.conftest import make_tree, wait_for

SP = [sys.executable, "-m", "shadowpoint"]


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    """Hermetic environment, a short runtime dir; every sidecar the hooks started is stopped after."""
    run_dir = Path(tempfile.mkdtemp(prefix="sp-run-"))
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(run_dir))
    for var in ("CLAUDE_PROJECT_DIR", "GEMINI_PROJECT_DIR", "CODEX_PROJECT_DIR"):
        monkeypatch.delenv(var, raising=False)
    yield dict(os.environ)
    stop_sidecars(run_dir)
    shutil.rmtree(run_dir, ignore_errors=True)


def _alive(pid: int) -> bool:
    """Whether any thread of process `pid` has yet to exit. Its main thread shows as a zombie
    while the others are still exiting, and the last one to exit closes the process's
    descriptors: a sidecar whose main thread alone was a zombie still held its listening
    socket, and a connection made then was accepted by the kernel and reset."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return False
    for tid in tasks:
        try:
            state = Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue  # that thread is gone
        if state not in ("Z", "X"):
            return True
    return False


def stop_sidecars(run_dir: Path) -> None:
    for sock in run_dir.glob("shadowpoint/*.sock"):
        try:
            with SidecarClient(sock, timeout_s=30) as client:
                pid = client.request("sidecar/status")["pid"]
        except Exception:
            continue
        os.kill(pid, signal.SIGTERM)

        def gone(pid: int = pid) -> bool:
            return not _alive(pid)

        with contextlib.suppress(AssertionError):  # a sidecar that outlives this is the next test's worry
            wait_for(gone, f"sidecar {pid} still alive", 30, poll_s=0.05)


def hook(agent: str, payload: dict[str, Any], env: dict[str, str], cwd: Path) -> None:
    """One hook invocation as the agent runs it; it must print nothing and exit 0."""
    proc = subprocess.run([*SP, "hook", agent], input=json.dumps(payload).encode(), cwd=cwd, env=env,
                          capture_output=True, timeout=120, check=False)
    assert proc.returncode == 0
    assert proc.stdout == b"", proc.stdout
    assert proc.stderr == b"", proc.stderr


def shell(command: str, cwd: Path) -> None:
    subprocess.run(command, shell=True, cwd=cwd, check=True)


def git(git_dir: Path, *args: str) -> str:
    env = {"PATH": os.environ["PATH"], "HOME": os.environ["HOME"], "GIT_CONFIG_NOSYSTEM": "1"}
    return subprocess.run(["git", "--git-dir", str(git_dir), *args], capture_output=True, text=True,
                          env=env, check=True).stdout


def files_of(git_dir: Path, commit: str) -> set[str]:
    return set(git(git_dir, "ls-tree", "-r", "--name-only", commit).split())


def checkpoints(task: str, ws: Path, env: dict[str, str]) -> list[dict[str, Any]]:
    """The task's checkpoints, oldest first, asked of the running sidecar (`list` goes through it)."""
    proc = subprocess.run([*SP, "list", str(ws), "--task", task, "--json"], cwd=ws, env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    return list(reversed(json.loads(proc.stdout)["checkpoints"]))


def shadow_git_dir(ws: Path, env: dict[str, str]) -> Path:
    return Path(env["SHADOWPOINT_DOCS_DIR"]) / "checkpoints" / workspace_hash(ws) / ".git"


# ---------------------------------------------------------------------------- Claude Code


def test_claude_code_session_checkpoints_each_batch_including_bash_changes(workspace: Path,
                                                                          env: dict[str, str]) -> None:
    ws = make_tree(workspace, {".gitignore": "gen/\n", "a.txt": "a\n"})
    session = "5e0c2f7a-claude-session"
    base = {"session_id": session, "transcript_path": str(ws.parent / "t.jsonl"), "cwd": str(ws)}

    def ev(event: str, **fields: Any) -> None:
        hook("claude", {**base, "hook_event_name": event, **fields}, env, ws)

    ev("SessionStart", source="startup")
    ev("UserPromptSubmit", prompt="generate a module and run the build")
    # one batch: an edit into an ignored folder, a Bash command that creates a file, a read
    write = {"file_path": str(ws / "gen" / "out.py"), "content": "generated = True\n"}
    ev("PreToolUse", tool_name="Write", tool_input=write)
    (ws / "gen").mkdir()
    (ws / "gen" / "out.py").write_text("generated = True\n")
    ev("PostToolUse", tool_name="Write", tool_input=write, tool_response={"filePath": write["file_path"]})
    bash = {"command": "echo built > made-by-bash.txt", "description": "build"}
    ev("PreToolUse", tool_name="Bash", tool_input=bash)
    shell(bash["command"], ws)
    ev("PostToolUse", tool_name="Bash", tool_input=bash, tool_response={"stdout": "", "stderr": ""})
    ev("PreToolUse", tool_name="Read", tool_input={"file_path": str(ws / "a.txt")})
    ev("PostToolUse", tool_name="Read", tool_input={"file_path": str(ws / "a.txt")}, tool_response={})
    ev("PostToolBatch", tool_calls=[{"tool_name": "Write", "tool_input": write}, {"tool_name": "Bash",
                                                                                  "tool_input": bash}])
    # second batch: a failing command that still changed a file, then an edit
    failing = {"command": "echo half > partial.txt && false"}
    ev("PreToolUse", tool_name="Bash", tool_input=failing)
    subprocess.run(failing["command"], shell=True, cwd=ws, check=False)
    ev("PostToolUseFailure", tool_name="Bash", tool_input=failing, error="exit status 1")
    edit = {"file_path": str(ws / "a.txt"), "old_string": "a", "new_string": "b"}
    ev("PreToolUse", tool_name="Edit", tool_input=edit)
    (ws / "a.txt").write_text("b\n")
    ev("PostToolUse", tool_name="Edit", tool_input=edit, tool_response={})
    ev("PostToolBatch", tool_calls=[])
    ev("Stop", stop_hook_active=False)
    ev("PreCompact", trigger="auto", custom_instructions="")

    cps = checkpoints(session, ws, env)
    assert [c["kind"] for c in cps] == ["baseline", "round", "round", "completion", "compaction"]
    git_dir = shadow_git_dir(ws, env)
    baseline, first, second, completion = (c["hash"] for c in cps[:4])
    assert files_of(git_dir, baseline) == {".gitignore", "a.txt"}
    assert files_of(git_dir, first) == {".gitignore", "a.txt", "gen/out.py", "made-by-bash.txt"}
    assert git(git_dir, "show", f"{first}:made-by-bash.txt") == "built\n", "the Bash-made file is in the round"
    assert git(git_dir, "show", f"{second}:partial.txt") == "half\n"
    assert git(git_dir, "show", f"{second}:a.txt") == "b\n"
    assert completion == second and cps[4]["hash"] is None
    record = CheckpointStore(Path(env["SHADOWPOINT_DOCS_DIR"])).load(session).to_json()  # task.json + its log
    assert "generate a module and run the build" in [m["text"] for m in record["messages"]]
    assert sorted(record["edited"][ws.name]) == ["a.txt", "gen/out.py"]

    sock = socket_path(ws)
    assert sock.stat().st_mode & 0o777 == 0o600


def test_a_failing_hook_stays_silent_and_exits_0(workspace: Path, env: dict[str, str]) -> None:
    hook("claude", {"hook_event_name": "PreToolUse"}, env, workspace)  # no session id
    proc = subprocess.run([*SP, "hook", "claude"], input=b"{not json", cwd=workspace, env=env,
                          capture_output=True, timeout=60, check=False)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, b"", b"")
    home = Path(env["HOME"])
    hook("claude", {"session_id": "s-home", "cwd": str(home), "hook_event_name": "SessionStart"}, env, home)
    log = (Path(env["XDG_STATE_HOME"]) / "shadowpoint" / "hooks.log").read_text()
    assert "no session_id" in log and "not JSON" in log and "Cannot use checkpoints in home" in log


def test_parallel_hooks_share_one_sidecar(workspace: Path, env: dict[str, str]) -> None:
    ws = make_tree(workspace, {"a.txt": "a\n"})
    payloads = [{"session_id": "par", "cwd": str(ws), "hook_event_name": "PreToolUse", "tool_name": "Bash",
                 "tool_input": {"command": f"true {i}"}} for i in range(6)]
    procs = [subprocess.Popen([*SP, "hook", "claude"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, cwd=ws, env=env) for _ in payloads]
    for proc, payload in zip(procs, payloads, strict=True):
        out, err = proc.communicate(json.dumps(payload).encode(), timeout=120)
        assert (proc.returncode, out, err) == (0, b"", b"")
    sock = str(socket_path(ws))
    servers = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            args = cmdline.read_bytes().split(b"\0")
        except OSError:
            continue
        if b"serve" in args and sock.encode() in args and _alive(int(cmdline.parent.name)):
            servers.append(cmdline.parent.name)
    assert len(servers) == 1, servers
    assert [c["kind"] for c in checkpoints("par", ws, env)] == ["baseline"]


def test_claude_tool_kinds() -> None:
    assert claude.classify("Write", {"file_path": "x.py"}, "/w") == ("edit", ["/w/x.py"])
    assert claude.classify("NotebookEdit", {"notebook_path": "/w/n.ipynb"}, "/w") == ("edit", ["/w/n.ipynb"])
    assert claude.classify("Bash", {"command": "ls"}, "/w") == ("command", [])
    assert claude.classify("Grep", {"pattern": "x"}, "/w") == ("read", [])
    assert claude.classify("mcp__fs__write", {}, "/w") == (None, [])
    assert claude.plan({"session_id": "s", "hook_event_name": "PreToolUse", "tool_name": "Read"}).calls == []


# ---------------------------------------------------------------------------- Codex CLI

PATCH = """*** Begin Patch
*** Add File: build/gen.txt
+generated
*** Update File: a.txt
@@
-a
+a2
*** Update File: b.txt
*** Move to: docs/b.txt
@@
 b
*** Delete File: old.txt
*** End Patch
"""


def test_codex_apply_patch_paths_come_from_the_patch_text(workspace: Path, env: dict[str, str]) -> None:
    ws = make_tree(workspace, {"a.txt": "a\n", "b.txt": "b\n", "old.txt": "old\n"})
    session = "019a-codex-thread"
    base = {"session_id": session, "transcript_path": None, "cwd": str(ws), "model": "gpt-5-codex"}

    def ev(event: str, **fields: Any) -> None:
        hook("codex", {**base, "hook_event_name": event, **fields}, env, ws)

    ev("SessionStart", source="startup")
    ev("UserPromptSubmit", prompt="patch it", turn_id="t1")
    patch_input = {"command": PATCH}
    ev("PreToolUse", tool_name="apply_patch", tool_input=patch_input, tool_use_id="c1", turn_id="t1")
    make_tree(ws, {"build/gen.txt": "generated\n", "a.txt": "a2\n", "docs/b.txt": "b\n", "b.txt": None,
                   "old.txt": None})
    ev("PostToolUse", tool_name="apply_patch", tool_input=patch_input, tool_response={"success": True},
       tool_use_id="c1", turn_id="t1")
    cmd = {"command": "printf 'x\\n' > by-shell.txt"}
    ev("PreToolUse", tool_name="Bash", tool_input=cmd, tool_use_id="c2", turn_id="t1")
    shell(cmd["command"], ws)
    ev("PostToolUse", tool_name="Bash", tool_input=cmd, tool_response={"exit_code": 0}, tool_use_id="c2",
       turn_id="t1")
    ev("Stop", stop_hook_active=False, last_assistant_message="done", turn_id="t1")

    cps = checkpoints(session, ws, env)
    assert [c["kind"] for c in cps] == ["baseline", "round", "completion"]
    git_dir = shadow_git_dir(ws, env)
    files = files_of(git_dir, cps[1]["hash"])
    # build/ is excluded by the built-in rules: only the patch's own path list can have added it
    assert files == {"a.txt", "build/gen.txt", "docs/b.txt", "by-shell.txt"}
    assert git(git_dir, "show", f"{cps[1]['hash']}:a.txt") == "a2\n"


def test_codex_patch_paths() -> None:
    assert codex.patch_paths(PATCH, "/w") == ["/w/build/gen.txt", "/w/a.txt", "/w/b.txt", "/w/docs/b.txt",
                                              "/w/old.txt"]
    shell_patch = {"command": ["bash", "-lc", f"apply_patch <<'EOF'\n{PATCH}EOF"]}
    kind, paths = codex.classify("shell", shell_patch, "/w")
    assert kind == "edit" and "/w/docs/b.txt" in paths
    assert codex.classify("Bash", {"command": "ls"}, "/w") == ("command", [])


# ---------------------------------------------------------------------------- Gemini CLI


def test_gemini_turn_is_a_round(workspace: Path, env: dict[str, str]) -> None:
    ws = make_tree(workspace, {"main.go": "package main\n"})
    session = "gemini-7f1"
    base = {"session_id": session, "transcript_path": str(ws.parent / "g.json"), "cwd": str(ws),
            "timestamp": "2026-01-01T00:00:00Z"}

    def ev(event: str, **fields: Any) -> None:
        hook("gemini", {**base, "hook_event_name": event, **fields}, env, ws)

    ev("SessionStart", source="startup")
    ev("BeforeAgent", prompt="add a vendored helper")
    write = {"file_path": str(ws / "vendor" / "helper.go"), "content": "package vendor\n"}
    ev("BeforeTool", tool_name="write_file", tool_input=write)
    make_tree(ws, {"vendor/helper.go": "package vendor\n"})
    ev("AfterTool", tool_name="write_file", tool_input=write, tool_response={"llmContent": "ok"})
    run = {"command": "echo ran > ran.txt", "description": "run"}
    ev("BeforeTool", tool_name="run_shell_command", tool_input=run)
    shell(run["command"], ws)
    ev("AfterTool", tool_name="run_shell_command", tool_input=run, tool_response={"llmContent": ""})
    ev("BeforeTool", tool_name="read_file", tool_input={"absolute_path": str(ws / "main.go")})
    ev("AfterAgent", prompt="add a vendored helper", prompt_response="done", stop_hook_active=False)
    ev("PreCompress", trigger="manual")  # an automatic one fires on every model call: no compaction

    cps = checkpoints(session, ws, env)
    assert [c["kind"] for c in cps] == ["baseline", "round", "completion", "compaction"]
    files = files_of(shadow_git_dir(ws, env), cps[1]["hash"])
    assert files == {"main.go", "vendor/helper.go", "ran.txt"}, "vendor/ is excluded: the file_path forced it"
    assert gemini.classify("replace", {"file_path": "x.go"}, "/w") == ("edit", ["/w/x.go"])
