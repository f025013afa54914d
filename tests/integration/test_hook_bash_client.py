"""The bash hook client (`hookrun.sh`, what `install-hooks` writes for Codex CLI and Gemini CLI
on Linux): run as the agents run it (the installed command through `sh -c`), against the real
socket sidecar and its http endpoint on 127.0.0.1; whatever goes wrong, exit 0, nothing on
stdout, a line in hooks.log, and the Python client gets the event when it still can.
"""

from __future__ import annotations

import json
import os
import signal
import stat
from pathlib import Path
from typing import Any

import pytest

from shadowpoint.adapters.health import check_agent
from shadowpoint.adapters.install import bash_client, default_command, install_hooks, settings_path
from shadowpoint.hookrun import fast_session_file
from shadowpoint.sidecar.hook_endpoint import http_config_path, load_http_config
from shadowpoint.workspace import workspace_hash
from tests.conftest import make_tree
from tests.integration.test_adapters import checkpoints, env, shadow_git_dir
from tests.integration.test_adapters import files_of as all_files_of
from tests.integration.test_hook_endpoint import (
    Session,
    _sidecar_pid,
    _wait_gone,
    hooks_log,
    installed_command,
    outlive_the_sidecar,
    run_hook,
)

__all__ = ["env"]  # the fixture, shared with test_adapters

pytestmark = pytest.mark.skipif(bash_client() is None, reason="the bash client runs on Linux with bash and sha256sum")


def files_of(ws: Path, env: dict[str, str], commit: str) -> set[str]:
    return {f for f in all_files_of(shadow_git_dir(ws, env), commit) if not f.startswith(".codex/")}


def show(ws: Path, env: dict[str, str], commit: str, path: str) -> str:
    from tests.integration.test_adapters import git

    return git(shadow_git_dir(ws, env), "show", f"{commit}:{path}")


class Codex:
    """A Codex session whose hooks run the installed bash client."""

    def __init__(self, ws: Path, env: dict[str, str], session: str) -> None:
        self.ws, self.env, self.task = ws, {**env, "SHADOWPOINT_HOOK_TRACE": "1"}, session
        install_hooks("codex", ws)
        self.command = installed_command("codex", ws, "PreToolUse")
        self.base = {"session_id": session, "cwd": str(ws), "transcript_path": None, "model": "gpt-5.5",
                     "permission_mode": "default", "turn_id": "t1"}

    def ev(self, event: str, **fields: Any) -> None:
        run_hook(self.command, {**self.base, "hook_event_name": event, **fields}, self.env, self.ws)

    def patch(self, rel: str, text: str) -> None:
        patch = f"*** Begin Patch\n*** Update File: {rel}\n@@\n-x\n+y\n*** End Patch\n"
        self.ev("PreToolUse", tool_name="apply_patch", tool_input={"command": patch}, tool_use_id=f"p-{rel}")
        (self.ws / rel).write_text(text)
        self.ev("PostToolUse", tool_name="apply_patch", tool_input={"command": patch}, tool_use_id=f"p-{rel}",
                tool_response="Success. Updated the following files:\nM " + rel)


def test_install_writes_the_bash_client_and_keeps_the_secret_out_of_the_project(workspace: Path,
                                                                                env: dict[str, str]) -> None:
    ws = make_tree(workspace, {"a.txt": "x\n"})
    for agent in ("codex", "gemini"):
        install_hooks(agent, ws)
        command = installed_command(agent, ws, "PreToolUse" if agent == "codex" else "BeforeTool")
        assert command == default_command(agent) and "hookrun.sh" in command and command.split()[2] == agent
    config = load_http_config(str(ws))
    assert config is not None
    for agent in ("codex", "gemini"):
        assert config.secret not in settings_path(agent, ws).read_text()
    mode = stat.S_IMODE(os.stat(http_config_path(str(ws))).st_mode)
    assert mode == 0o600 and stat.S_IMODE(os.stat(http_config_path(str(ws)).parent).st_mode) == 0o700
    install_hooks("claude", ws)  # its two command events run the bash client too; the rest are http hooks
    assert installed_command("claude", ws, "UserPromptSubmit") == default_command("claude")
    assert "hookrun.sh" in default_command("claude") and default_command("claude").split()[2] == "claude"
    # doctor: current while the secret file exists; without it every event would go to Python
    assert check_agent("codex", ws)["summary"].startswith("installed, current")
    http_config_path(str(ws)).unlink()
    check = check_agent("codex", ws)
    assert check["summary"].startswith("installed, needs an update")
    assert "no http port and secret" in check["details"][0]
    install_hooks("codex", ws)
    assert check_agent("codex", ws)["summary"].startswith("installed, current") and load_http_config(str(ws))
    for agent in ("codex", "gemini"):
        install_hooks(agent, ws, remove=True)
        assert "hookrun" not in settings_path(agent, ws).read_text()


def test_a_codex_session_through_the_bash_client(workspace: Path, env: dict[str, str]) -> None:
    ws = make_tree(workspace, {"a.txt": "x\n", "b.txt": "x\n"})
    s = Codex(ws, env, "codex-bash-session")
    s.ev("SessionStart", source="startup")     # nothing listens yet: the Python client starts the sidecar
    s.ev("UserPromptSubmit", prompt="go: héllo ✓ 日本")  # Content-Length counts bytes
    s.patch("a.txt", "y\n")
    s.ev("PreToolUse", tool_name="Bash", tool_input={"command": "make"}, tool_use_id="c1")
    (ws / "made.txt").write_text("by a command\n")
    s.ev("PostToolUse", tool_name="Bash", tool_input={"command": "make"}, tool_use_id="c1", tool_response="")
    s.ev("Stop", stop_hook_active=False, last_assistant_message="done")
    s.ev("UserPromptSubmit", prompt="again")
    s.patch("b.txt", "z\n")
    s.ev("Stop", stop_hook_active=False, last_assistant_message="done again")
    cps = checkpoints(s.task, ws, s.env)
    assert [c["kind"] for c in cps] == ["baseline", "round", "completion", "round", "completion"]
    # PreToolUse returned only once the baseline held the file: the baseline has its old text
    assert show(ws, s.env, cps[0]["hash"], "a.txt") == "x\n"
    assert show(ws, s.env, cps[1]["hash"], "a.txt") == "y\n" and "made.txt" in files_of(ws, s.env, cps[1]["hash"])
    assert show(ws, s.env, cps[3]["hash"], "b.txt") == "z\n"
    assert all(c["warnings"] == [] for c in cps)
    traced = [line for line in hooks_log(s.env).splitlines() if " ok in " in line]
    assert len(traced) == 11 and "(http)" not in traced[0]
    assert all(line.endswith("ms (http)") for line in traced[1:]), traced


def test_bad_payloads_no_sidecar_and_a_wrong_secret_fail_open_and_are_logged(workspace: Path,
                                                                           env: dict[str, str]) -> None:
    ws = make_tree(workspace, {"a.txt": "x\n"})
    s = Codex(ws, env, "codex-bash-failures")
    run_hook(s.command, b"{not json", s.env, ws)
    run_hook(s.command, b"[1, 2]", s.env, ws)
    run_hook(s.command, {"hook_event_name": "Stop", "cwd": str(ws)}, s.env, ws)  # no session
    log = hooks_log(s.env)
    assert "not JSON" in log and "not a JSON object" in log and "no session_id" in log
    # no sidecar and no Python client to start one: the event is lost, said in the log
    broken = s.command.rsplit(" ", 1)[0] + " /nonexistent/python"
    run_hook(broken, {**s.base, "hook_event_name": "SessionStart", "source": "startup"}, s.env, ws)
    assert "no Python client to fall back to: the event is lost" in hooks_log(s.env)
    s.ev("SessionStart", source="startup")
    s.ev("UserPromptSubmit", prompt="go")
    # a wrong secret: the endpoint refuses it (403, nothing done) and the Python client delivers the event
    path = http_config_path(str(ws))
    data = json.loads(path.read_text())
    path.write_text(json.dumps({**data, "secret": "not-the-secret"}))
    s.patch("a.txt", "y\n")
    assert "refused the secret (403); handed to hookrun.py" in hooks_log(s.env)
    path.write_text(json.dumps(data))
    s.ev("Stop", stop_hook_active=False, last_assistant_message="done")
    cps = checkpoints(s.task, ws, s.env)
    assert [c["kind"] for c in cps] == ["baseline", "round", "completion"]
    assert show(ws, s.env, cps[0]["hash"], "a.txt") == "x\n" and show(ws, s.env, cps[1]["hash"], "a.txt") == "y\n"
    assert cps[1]["warnings"] == []
    sidecar_log = (Path(s.env["XDG_STATE_HOME"]) / "shadowpoint" / "sidecar.log").read_text()
    assert "hook.request_forbidden" in sidecar_log
    # the sidecar went away: nothing answers on the port, the Python client starts a new one
    pid = _sidecar_pid(ws)
    os.kill(pid, signal.SIGTERM)
    _wait_gone(pid)
    s.ev("UserPromptSubmit", prompt="again")
    s.patch("a.txt", "z\n")
    s.ev("Stop", stop_hook_active=False, last_assistant_message="done again")
    assert _sidecar_pid(ws) != pid
    cps = checkpoints(s.task, ws, s.env)
    assert [c["kind"] for c in cps][-2:] == ["round", "completion"]
    assert show(ws, s.env, cps[-2]["hash"], "a.txt") == "z\n"


def test_missed_events_go_through_the_python_client_until_reported(workspace: Path, env: dict[str, str],
                                                                   tmp_path: Path) -> None:
    import venv

    ws = make_tree(workspace, {"a.txt": "x\n"})
    s = Codex(ws, env, "codex-bash-missed")
    s.ev("SessionStart", source="startup")
    s.ev("UserPromptSubmit", prompt="go")
    note = Path(fast_session_file("codex", s.task) or "")
    assert note.read_text() == f"{workspace_hash(ws)} {ws}\n"  # the bash client's note: no hashing next time
    s.patch("a.txt", "y\n")
    s.ev("Stop", stop_hook_active=False, last_assistant_message="done")
    # the sidecar goes away, and a Python that cannot start another: the event is lost
    pid = _sidecar_pid(ws)
    os.kill(pid, signal.SIGTERM)
    _wait_gone(pid)
    bare = tmp_path / "bare-venv"
    venv.create(bare, with_pip=False)  # no shadowpoint in it: `python -m shadowpoint serve` fails
    no_sidecar = s.command.rsplit(" ", 1)[0] + " " + str(bare / "bin" / "python")
    run_hook(no_sidecar, {**s.base, "hook_event_name": "UserPromptSubmit", "prompt": "lost"}, s.env, ws)
    assert "no sidecar for" in hooks_log(s.env) and not note.exists()
    (ws / "lost.txt").write_text("made while no sidecar listened\n")
    # the next events: the Python client reports the missed events, then the bash client goes on
    s.ev("PreToolUse", tool_name="Bash", tool_input={"command": "make"}, tool_use_id="c2")
    assert note.exists() is False
    s.ev("PostToolUse", tool_name="Bash", tool_input={"command": "make"}, tool_use_id="c2", tool_response="")
    assert note.exists()
    s.ev("Stop", stop_hook_active=False, last_assistant_message="done again")
    cps = checkpoints(s.task, ws, s.env)
    assert "lost.txt" in files_of(ws, s.env, cps[-1]["hash"])
    reasons = [w["reason"] for c in cps[-2:] for w in c["warnings"]]
    assert any(r.startswith("events_missed") for r in reasons), reasons
    assert all(c["warnings"] == [] for c in cps[:3])


def test_claude_command_hooks_through_the_bash_client_and_events_missed_after_them(workspace: Path,
                                                                                    env: dict[str, str]) -> None:
    """Claude Code's SessionStart and UserPromptSubmit run the bash client: a session whose
    events all went through it (the sidecar was already up) has no state file of the Python
    client, only the bash client's note; when the sidecar dies, its http hooks go nowhere, and
    the next command hook (handed to the Python client, which starts a sidecar) must still
    say that events were missed."""
    ws = make_tree(workspace, {"a.txt": "a\n"})
    first = Session(ws, {**env, "SHADOWPOINT_HOOK_TRACE": "1"}, "claude-bash-first")
    first.command("SessionStart", source="startup")  # nothing listens: the Python client starts the sidecar
    s = Session(ws, first.env, "claude-bash-second")
    s.command("SessionStart", source="startup")
    s.command("UserPromptSubmit", prompt="go: héllo ✓")
    note = Path(fast_session_file("claude", s.task) or "")
    assert note.read_text() == f"{workspace_hash(ws)} {ws}\n"
    traced = [line for line in hooks_log(s.env).splitlines() if " ok in " in line]
    assert len(traced) == 3 and "(http)" not in traced[0] and all(t.endswith("ms (http)") for t in traced[1:])
    pid, _ = outlive_the_sidecar(s)  # its UserPromptSubmit, refused on the port, goes to the Python client
    assert _sidecar_pid(ws) != pid
