"""The hook path as the agents take it: the lean command (`python -I -S …/hookrun.py AGENT`, a real
subprocess) starts the real socket sidecar, Claude Code's http hooks post to it over real
HTTP on 127.0.0.1 with the workspace's secret, and the checkpoints are read back through it.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from shadowpoint import hookrun
from shadowpoint.adapters import claude, codex, gemini, install
from shadowpoint.adapters.health import check_agent
from shadowpoint.adapters.install import default_command, install_hooks, is_ours
from shadowpoint.sidecar.client import SidecarClient, socket_path
from shadowpoint.sidecar.hook_endpoint import http_config_path, load_http_config
from shadowpoint.workspace import workspace_hash
from tests.conftest import make_tree
from tests.integration.test_adapters import checkpoints, env, shadow_git_dir
from tests.integration.test_adapters import files_of as all_files_of

__all__ = ["env"]  # the fixture, shared with test_adapters

LEAN = [sys.executable, "-I", "-S", hookrun.__file__]


def lean(agent: str, payload: dict[str, Any] | bytes, env: dict[str, str], cwd: Path) -> None:
    """One hook invocation through the lean command; it must print nothing and exit 0."""
    raw = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    proc = subprocess.run([*LEAN, agent], input=raw, cwd=cwd, env=env, capture_output=True, timeout=120,
                          check=False)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, b"", b"")


def post(port: int, payload: dict[str, Any] | bytes, *, secret: str | None, host: str | None = None,
         origin: str | None = None) -> int:
    """One http hook as Claude Code sends it; returns the status."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    headers = {"Content-Type": "application/json"}
    if secret is not None:
        headers["Authorization"] = f"Bearer {secret}"
    if origin is not None:
        headers["Origin"] = origin
    if host is not None:
        conn.putrequest("POST", "/hook/claude", skip_host=True)
        conn.putheader("Host", host)
    else:
        conn.putrequest("POST", "/hook/claude")
    body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    for k, v in {**headers, "Content-Length": str(len(body))}.items():
        conn.putheader(k, v)
    conn.endheaders(body)
    resp = conn.getresponse()
    assert resp.read() == b""
    conn.close()
    return resp.status


def files_of(git_dir: Path, commit: str) -> set[str]:
    """A checkpoint's files but the agent settings (`install-hooks` wrote them into the workspace)."""
    return {f for f in all_files_of(git_dir, commit) if not f.startswith(".claude/")}


def hooks_log(env: dict[str, str]) -> str:
    path = Path(env["XDG_STATE_HOME"]) / "shadowpoint" / "hooks.log"
    return path.read_text() if path.exists() else ""


def installed_command(agent: str, ws: Path, event: str) -> str:
    """Our command for `event` as `install-hooks` wrote it into the agent's project settings."""
    command = install.installed_command(agent, ws, event)
    assert command is not None, f"no command hook of ours for {event}"
    return command


def run_hook(command: str, payload: dict[str, Any] | bytes, env: dict[str, str], cwd: Path) -> None:
    """One hook as the agent runs it (`sh -c COMMAND`, payload on stdin): exit 0, no output at all."""
    raw = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    proc = subprocess.run(["sh", "-c", command], input=raw, cwd=cwd, env=env, capture_output=True, timeout=120,
                          check=False)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, b"", b"")


class Session:
    """A Claude Code session with hooks installed: its command hooks as installed (`sh -c`), the rest http."""

    def __init__(self, ws: Path, env: dict[str, str], session: str = "claude-http-session") -> None:
        self.ws, self.env = ws, env
        install_hooks("claude", ws)
        config = load_http_config(str(ws))
        assert config is not None
        self.port, self.secret = config.port, config.secret
        self.base = {"session_id": session, "transcript_path": str(ws.parent / "t.jsonl"), "cwd": str(ws)}
        self.task = session

    def command(self, event: str, **fields: Any) -> None:
        run_hook(installed_command("claude", self.ws, event), {**self.base, "hook_event_name": event, **fields},
                 self.env, self.ws)

    def http(self, event: str, **fields: Any) -> None:
        assert post(self.port, {**self.base, "hook_event_name": event, **fields}, secret=self.secret) == 200

    def write(self, rel: str, text: str, **extra: Any) -> None:
        """The Write tool, its file written between its Pre and Post events."""
        tool_input = {"file_path": str(self.ws / rel), "content": text}
        self.http("PreToolUse", tool_name="Write", tool_input=tool_input, **extra)
        (self.ws / rel).parent.mkdir(parents=True, exist_ok=True)
        (self.ws / rel).write_text(text)
        self.http("PostToolUse", tool_name="Write", tool_input=tool_input, tool_response={"filePath": rel}, **extra)

    def checkpoints(self) -> list[dict[str, Any]]:
        return checkpoints(self.task, self.ws, self.env)


def test_claude_http_hooks_checkpoint_a_batch_and_refuse_requests_without_the_secret(
        workspace: Path, env: dict[str, str]) -> None:
    ws = make_tree(workspace, {"a.txt": "a\n"})
    s = Session(ws, env)
    s.command("SessionStart", source="startup")
    s.command("UserPromptSubmit", prompt="write b")
    s.write("b.txt", "b\n")
    s.http("PostToolBatch", tool_calls=[])
    cps = s.checkpoints()
    assert [c["kind"] for c in cps] == ["baseline", "round"]
    assert files_of(shadow_git_dir(ws, env), cps[-1]["hash"]) == {"a.txt", "b.txt"}

    # no secret, a wrong one, a foreign Host, any Origin: 403 and nothing changes
    batch = {**s.base, "hook_event_name": "PreToolUse", "tool_name": "Write",
             "tool_input": {"file_path": str(ws / "c.txt"), "content": "c"}}
    end = {**s.base, "hook_event_name": "PostToolBatch", "tool_calls": []}
    for kwargs in ({"secret": None}, {"secret": "wrong"}, {"secret": s.secret, "host": "evil.example:80"},
                   {"secret": s.secret, "host": f"attacker.test:{s.port}"},
                   {"secret": s.secret, "origin": "http://evil.example"}):
        assert post(s.port, batch, **kwargs) == 403
        (ws / "c.txt").write_text("c\n")
        assert post(s.port, end, **kwargs) == 403
    assert len(s.checkpoints()) == 2

    # the secret lives in files only the user can read, never in the committed settings file
    assert stat.S_IMODE(http_config_path(str(ws)).stat().st_mode) == 0o600
    local = ws / ".claude" / "settings.local.json"
    assert stat.S_IMODE(local.stat().st_mode) & 0o077 == 0
    assert s.secret in local.read_text()
    assert not (ws / ".claude" / "settings.json").exists()
    settings = json.loads(local.read_text())
    assert settings["hooks"]["SessionStart"][0]["hooks"][0]["type"] == "command"
    assert settings["hooks"]["PreToolUse"][0]["hooks"][0]["type"] == "http"


def test_a_subagents_tools_belong_to_the_round_of_its_agent_call_and_stop_failure_completes(
        workspace: Path, env: dict[str, str]) -> None:
    ws = make_tree(workspace, {"a.txt": "a\n"})
    s = Session(ws, env, "claude-subagent-session")
    s.command("SessionStart", source="startup")
    s.command("UserPromptSubmit", prompt="delegate")
    agent_input = {"description": "edit", "prompt": "write sub.txt", "subagent_type": "general-purpose"}
    s.http("PreToolUse", tool_name="Agent", tool_input=agent_input)
    sub = {"agent_id": "a-1", "agent_type": "general-purpose"}
    s.http("SubagentStart", **sub)
    s.write("sub.txt", "from the subagent\n", **sub)
    s.http("PostToolBatch", tool_calls=[], **sub)  # the subagent's own batch ends nothing
    s.write("sub2.txt", "second\n", **sub)
    s.http("PostToolBatch", tool_calls=[], **sub)
    s.http("SubagentStop", stop_hook_active=False, agent_transcript_path="x", **sub)
    s.http("PostToolUse", tool_name="Agent", tool_input=agent_input, tool_response={"status": "completed"})
    s.http("PostToolBatch", tool_calls=[])
    cps = s.checkpoints()
    assert [c["kind"] for c in cps] == ["baseline", "round"]
    assert files_of(shadow_git_dir(ws, env), cps[-1]["hash"]) == {"a.txt", "sub.txt", "sub2.txt"}

    (ws / "late.txt").write_text("written by a Bash whose batch an API error ended\n")
    s.http("PreToolUse", tool_name="Bash", tool_input={"command": "echo > late.txt"})
    s.http("StopFailure", error="rate_limit")
    cps = s.checkpoints()
    assert [c["kind"] for c in cps] == ["baseline", "round", "round", "completion"]
    assert "late.txt" in files_of(shadow_git_dir(ws, env), cps[-1]["hash"])

    # a background subagent (Claude Code's default): the Agent call returns at once, the turn
    # ends, and the subagent's own batch later makes a round of its own
    background = {**agent_input, "run_in_background": True}
    s.command("UserPromptSubmit", prompt="in the background")
    s.http("PreToolUse", tool_name="Agent", tool_input=background)
    s.http("PostToolUse", tool_name="Agent", tool_input=background, tool_response={"status": "async_launched"})
    s.http("PostToolBatch", tool_calls=[])
    s.http("Stop", stop_hook_active=False)
    s.write("bg.txt", "from the background\n", **sub)
    s.http("PostToolBatch", tool_calls=[], **sub)
    cps = s.checkpoints()
    assert [c["kind"] for c in cps][-2:] == ["completion", "round"]
    assert "bg.txt" in files_of(shadow_git_dir(ws, env), cps[-1]["hash"])


def _sidecar_pid(ws: Path) -> int:
    with SidecarClient(socket_path(ws), timeout_s=60) as client:
        return int(client.request("sidecar/status")["pid"])


def _wait_gone(pid: int) -> None:
    from tests.conftest import wait_for
    from tests.integration.test_adapters import _alive

    wait_for(lambda: not _alive(pid), f"process {pid} still alive", poll_s=0.05)


def outlive_the_sidecar(s: Session) -> tuple[int, list[dict[str, Any]]]:
    """A round, then the sidecar dies: an http hook finds nobody (Claude Code reports it and
    goes on), a Bash makes a file, and the next command hook starts a sidecar again before a
    round of one more file. Returns the dead sidecar's pid and the task's checkpoints, after
    checking that the last one holds both files and says events were missed."""
    s.write("b.txt", "b\n")
    s.http("PostToolBatch", tool_calls=[])
    pid = _sidecar_pid(s.ws)
    os.kill(pid, signal.SIGTERM)
    _wait_gone(pid)
    with pytest.raises(ConnectionRefusedError):
        post(s.port, {**s.base, "hook_event_name": "PreToolUse", "tool_name": "Bash"}, secret=s.secret)
    (s.ws / "lost.txt").write_text("made by a Bash whose hooks went nowhere\n")
    s.command("UserPromptSubmit", prompt="go on")
    s.write("c.txt", "c\n")
    s.http("PostToolBatch", tool_calls=[])
    cps = s.checkpoints()
    assert [c["kind"] for c in cps] == ["baseline", "round", "round"]
    assert {"lost.txt", "c.txt"} <= files_of(shadow_git_dir(s.ws, s.env), cps[-1]["hash"])
    reasons = [w["reason"] for w in cps[-1]["warnings"]]
    assert any(r.startswith("events_missed") for r in reasons), reasons
    assert cps[1]["warnings"] == []
    return pid, cps


def test_an_unreachable_sidecar_fails_open_and_the_next_checkpoint_says_events_were_missed(
        workspace: Path, env: dict[str, str]) -> None:
    ws = make_tree(workspace, {"a.txt": "a\n"})
    s = Session(ws, env, "claude-missed-session")
    s.command("SessionStart", source="startup")
    outlive_the_sidecar(s)


def test_bad_payloads_are_logged_and_ignored(workspace: Path, env: dict[str, str]) -> None:
    ws = make_tree(workspace, {"a.txt": "a\n"})
    s = Session(ws, env, "claude-bad-input")
    s.command("SessionStart", source="startup")
    lean("claude", b"{not json", env, ws)
    lean("claude", {"hook_event_name": "PreToolUse"}, env, ws)  # no session
    lean("codex", b"[1, 2]", env, ws)
    outside = ws.parent / "outside.txt"
    s.http("PreToolUse", tool_name="Write", tool_input={"file_path": str(outside), "content": "x"})
    assert post(s.port, b"\xff not json", secret=s.secret) == 200
    assert post(s.port, {"hook_event_name": "Stop"}, secret=s.secret) == 200
    # an unknown session gets a task of its own (its SessionStart may have been missed); nothing breaks
    lean("claude", {**s.base, "session_id": "never-started", "hook_event_name": "UserPromptSubmit",
                    "prompt": "hi"}, env, ws)
    log = hooks_log(env)
    assert "not JSON" in log and "no session_id" in log and "not a JSON object" in log
    assert "path_outside_workspace" not in log  # the http hook's refusal went to the sidecar's log
    assert not outside.exists()
    assert [c["kind"] for c in s.checkpoints()] == ["baseline"]


def test_codex_failed_tool_is_closed_by_the_turns_end(workspace: Path, env: dict[str, str]) -> None:
    ws = make_tree(workspace, {"a.txt": "a\n"})
    base = {"session_id": "codex-fail", "cwd": str(ws), "transcript_path": None, "model": "gpt-5.5",
            "permission_mode": "default", "turn_id": "t1"}

    def ev(event: str, **fields: Any) -> None:
        lean("codex", {**base, "hook_event_name": event, **fields}, env, ws)

    ev("SessionStart", source="startup")
    ev("UserPromptSubmit", prompt="try")
    ev("PreToolUse", tool_name="exec_command", tool_input={"cmd": "make"}, tool_use_id="c1")
    (ws / "half.txt").write_text("a failed command still changed this\n")  # no PostToolUse follows
    ev("Stop", stop_hook_active=False, last_assistant_message="failed")
    cps = checkpoints("codex-fail", ws, env)
    assert [c["kind"] for c in cps] == ["baseline", "round", "completion"]
    assert "half.txt" in files_of(shadow_git_dir(ws, env), cps[1]["hash"])


def test_codex_success_as_its_responses_show_it() -> None:
    def ok(response: Any) -> bool:
        return codex._tool_ok("PostToolUse", {"tool_response": response})

    assert ok(json.dumps({"output": "fine", "metadata": {"exit_code": 0, "duration_seconds": 0.1}}))
    assert not ok(json.dumps({"output": "boom", "metadata": {"exit_code": 2, "duration_seconds": 0.1}}))
    assert not ok("Chunk ID: 1\nWall time: 0.1 seconds\nProcess exited with code 1\nOutput:\nerr")
    assert ok("Success. Updated the following files:\nM a.txt\n")
    assert not ok({"success": False})
    plan = codex.plan({"session_id": "s", "hook_event_name": "Stop", "agent_id": "sub"})
    assert plan.calls == []  # a subagent's stop ends nothing of the parent's


def test_gemini_automatic_precompress_is_no_compaction(workspace: Path, env: dict[str, str]) -> None:
    ws = make_tree(workspace, {"a.txt": "a\n"})
    base = {"session_id": "gemini-compress", "cwd": str(ws), "transcript_path": ""}

    def ev(event: str, **fields: Any) -> None:
        lean("gemini", {**base, "hook_event_name": event, **fields}, env, ws)

    ev("SessionStart", source="startup")
    for _ in range(3):
        ev("PreCompress", trigger="auto")  # fired before every model call
    ev("PreCompress", trigger="manual")  # the user's /compress
    assert [c["kind"] for c in checkpoints("gemini-compress", ws, env)] == ["baseline", "compaction"]
    assert gemini.EVENTS["PreCompress"] == "manual"


def test_read_tools_start_nothing_and_current_tool_names() -> None:
    import re

    for module, reads, writes in ((claude, ["Read", "Grep", "ToolSearch", "Skill", "AskUserQuestion", "TaskList",
                                             "TaskGet", "LSP"], ["Write", "Edit", "Bash", "Agent", "mcp__fs__write"]),
                                  (gemini, ["read_file", "grep_search", "glob", "list_directory"],
                                   ["write_file", "replace", "run_shell_command", "mcp__x__y"])):
        tool_event = "PreToolUse" if module is claude else "BeforeTool"
        matcher = re.compile(module.EVENTS[tool_event])
        assert not [t for t in reads if matcher.search(t)]
        assert all(matcher.search(t) for t in writes)
    assert not {"LS", "NotebookRead", "KillBash", "MultiEdit"} & (claude.READ_TOOLS | set(claude.EDIT_TOOLS))
    assert not {"edit", "save_memory"} & (gemini.READ_TOOLS | gemini.EDIT_TOOLS)
    assert claude.classify("mcp__github__create_issue", {}, "/w") == (None, [])  # PROTOCOL.md's default
    assert codex.classify("mcp__fs__read", {}, "/w") == (None, [])


def test_the_lean_client_imports_nothing_heavy() -> None:
    probe = ("import sys, runpy; sys.argv = ['hookrun', 'claude']; sys.stdin = open('/dev/null'); "
             f"runpy.run_path({hookrun.__file__!r}, run_name='not_main'); "
             "heavy = [m for m in sys.modules if m.split('.')[0] in "
             "('click', 'rich', 'pydantic', 'structlog', 'shadowpoint', 'pygit2', 'platformdirs')]; print(heavy)")
    out = subprocess.run([sys.executable, "-I", "-S", "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
    assert hookrun.workspace_hash("/some/where") == workspace_hash(Path("/some/where"))


def test_install_says_what_each_agent_needs_and_doctor_checks_it(workspace: Path, env: dict[str, str],
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    ws = make_tree(workspace, {"a.txt": "a\n"})
    home = Path(env["HOME"])
    codex_result = install_hooks("codex", ws)
    assert any("--dangerously-bypass-hook-trust" in n for n in codex_result.notes)
    gemini_result = install_hooks("gemini", ws)
    assert any("GEMINI_CLI_TRUST_WORKSPACE=true" in n for n in gemini_result.notes)
    monkeypatch.delenv("GEMINI_CLI_TRUST_WORKSPACE", raising=False)
    assert check_agent("gemini", ws, {"HOME": str(home)})["summary"].startswith("installed, current, NOT trusted")
    (home / ".gemini").mkdir(exist_ok=True)
    (home / ".gemini" / "trustedFolders.json").write_text(json.dumps({str(ws): "TRUST_FOLDER"}))
    assert check_agent("gemini", ws, {"GEMINI_CLI_HOME": str(home)})["status"] == "ok"
    codex_home = home / ".codex"
    codex_home.mkdir(exist_ok=True)
    (codex_home / "config.toml").write_text(f'[projects."{ws}"]\ntrust_level = "trusted"\n')
    check = check_agent("codex", ws, {"CODEX_HOME": str(codex_home)})
    assert check["summary"].startswith("installed, current") and "no stored hook trust" in " ".join(check["details"])
    assert check_agent("claude", ws)["status"] == "info"
    install_hooks("claude", ws)
    assert check_agent("claude", ws)["summary"].startswith("installed, current")
    # another hook client (an older install) is not current
    install_hooks("claude", ws, command="/old/bin/shadowpoint hook claude")
    check = check_agent("claude", ws)
    assert check["status"] == "warning" and "not current" in check["details"][0]
    assert is_ours(default_command("claude"), "claude")  # the bash client where it runs, else the Python one


def test_a_client_that_closes_before_its_answers_is_no_error(workspace: Path, env: dict[str, str]) -> None:
    import socket as socketlib

    ws = make_tree(workspace, {"a.txt": "a\n"})
    lean("codex", {"session_id": "early-close", "cwd": str(ws), "hook_event_name": "SessionStart"}, env, ws)
    for n in range(5):
        sock = socketlib.socket(socketlib.AF_UNIX, socketlib.SOCK_STREAM)
        sock.connect(str(socket_path(ws)))
        for i, (method, params) in enumerate([("initialize", {"roots": [str(ws)]}),
                                              ("tool/begin", {"taskId": "early-close", "tool": "Bash"}),
                                              ("round/end", {"taskId": "early-close", "ts": 2**41 + n})]):
            sock.sendall(json.dumps({"jsonrpc": "2.0", "id": i, "method": method, "params": params}).encode() + b"\n")
        sock.setsockopt(socketlib.SOL_SOCKET, socketlib.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        sock.close()  # a reset, before any answer
    assert "round" in [c["kind"] for c in checkpoints("early-close", ws, env)]  # the requests ran
    log = (Path(env["XDG_STATE_HOME"]) / "shadowpoint" / "sidecar.log").read_text()
    assert "connection_failed" not in log and "[error" not in log and "Traceback" not in log, log
