"""`shadowpoint install-hooks AGENT [DIR] [--remove]` on settings files that already hold the
user's own hooks: ours are merged in once, theirs are never changed, and removal takes out
only ours.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from shadowpoint.adapters.install import default_command, is_ours

SP = [sys.executable, "-m", "shadowpoint"]

USER_CLAUDE: dict[str, Any] = {
    "model": "opus",
    "permissions": {"allow": ["Bash(npm test:*)"]},
    "hooks": {
        "PreToolUse": [{"matcher": "Bash", "hooks": [{"type": "command", "command": "~/bin/guard.sh"}]}],
        "Stop": [{"hooks": [{"type": "command", "command": "notify-send done", "timeout": 5}]}],
    },
}


def install(agent: str, directory: Path, *extra: str) -> dict[str, Any]:
    proc = subprocess.run([*SP, "install-hooks", agent, str(directory), "--json", *extra],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    result: dict[str, Any] = json.loads(proc.stdout)
    return result


def ours(settings: dict[str, Any], agent: str) -> dict[str, list[dict[str, Any]]]:
    """Event -> our hook entries."""
    out: dict[str, list[dict[str, Any]]] = {}
    for event, groups in settings.get("hooks", {}).items():
        for g in groups:
            for h in g.get("hooks", []):
                if is_ours(h, agent):
                    out.setdefault(event, []).append({"matcher": g.get("matcher"), **h})
    return out


def test_claude_merge_keeps_the_users_hooks_and_remove_takes_only_ours(tmp_path: Path) -> None:
    path = tmp_path / ".claude" / "settings.local.json"
    path.parent.mkdir()
    path.write_text(json.dumps(USER_CLAUDE, indent=2))

    result = install("claude", tmp_path)
    assert set(result["added"]) == {"SessionStart", "UserPromptSubmit", "PreToolUse", "PostToolUse",
                                    "PostToolUseFailure", "PostToolBatch", "Stop", "StopFailure", "PreCompact"}
    assert any("trust dialog" in n for n in result["nextSteps"])
    settings = json.loads(path.read_text())
    assert settings["model"] == "opus" and settings["permissions"] == USER_CLAUDE["permissions"]
    assert settings["hooks"]["PreToolUse"][0] == USER_CLAUDE["hooks"]["PreToolUse"][0]
    assert settings["hooks"]["Stop"][0] == USER_CLAUDE["hooks"]["Stop"][0]
    mine = ours(settings, "claude")
    assert all(len(entries) == 1 for entries in mine.values()) and len(mine) == 9
    assert mine["PreToolUse"][0]["matcher"].startswith("^(?!") and mine["PreToolUse"][0]["type"] == "http"
    assert mine["PreToolUse"][0]["url"].startswith("http://127.0.0.1:")
    assert mine["SessionStart"][0]["command"] == default_command("claude")
    assert mine["PreToolUse"][0]["timeout"] >= 300, "the barrier may wait for a large baseline"
    assert mine["Stop"][0]["matcher"] is None

    again = install("claude", tmp_path)
    assert again["added"] == [] and again["updated"] == []
    assert json.loads(path.read_text()) == settings, "installing twice changes nothing"

    removed = install("claude", tmp_path, "--remove")
    assert set(removed["removed"]) == set(mine)
    assert json.loads(path.read_text()) == USER_CLAUDE


def test_codex_and_gemini_files(tmp_path: Path) -> None:
    gemini_path = tmp_path / ".gemini" / "settings.json"
    gemini_path.parent.mkdir()
    user: dict[str, Any] = {"theme": "Dracula", "hooks": {"BeforeTool": [
        {"matcher": "run_shell_command", "hooks": [{"type": "command", "command": "./audit.sh", "name": "audit"}]}]}}
    gemini_path.write_text(json.dumps(user))
    install("gemini", tmp_path)
    settings = json.loads(gemini_path.read_text())
    mine = ours(settings, "gemini")
    assert set(mine) == {"SessionStart", "BeforeAgent", "BeforeTool", "AfterTool", "AfterAgent", "PreCompress"}
    assert mine["BeforeTool"][0]["timeout"] >= 300_000, "Gemini timeouts are milliseconds"
    assert settings["hooks"]["BeforeTool"][0] == user["hooks"]["BeforeTool"][0] and settings["theme"] == "Dracula"
    install("gemini", tmp_path, "--remove")
    assert json.loads(gemini_path.read_text()) == user

    result = install("codex", tmp_path)
    codex_path = Path(result["file"])
    assert codex_path == tmp_path / ".codex" / "hooks.json"
    assert set(ours(json.loads(codex_path.read_text()), "codex")) == {
        "SessionStart", "UserPromptSubmit", "PreToolUse", "PostToolUse", "Stop", "PreCompact"}
    install("codex", tmp_path, "--remove")
    assert json.loads(codex_path.read_text()) == {}


def test_an_unreadable_settings_file_is_left_untouched(tmp_path: Path) -> None:
    path = tmp_path / ".claude" / "settings.json"
    path.parent.mkdir()
    path.write_text('{"hooks": {"Stop": [ // a comment\n]}}')
    before = path.read_text()
    proc = subprocess.run([*SP, "install-hooks", "claude", str(tmp_path)], capture_output=True, text=True,
                          timeout=60, check=False)
    assert proc.returncode == 2 and "not valid JSON" in proc.stderr
    assert path.read_text() == before


@pytest.mark.parametrize(("command", "agent", "expected"), [
    ("shadowpoint hook claude", "claude", True),
    ("'/opt/my env/bin/shadowpoint' hook claude", "claude", True),
    ("/usr/bin/python3 -m shadowpoint hook gemini", "gemini", True),
    ("shadowpoint hook codex", "claude", False),
    ("echo shadowpoint hook claude-ish", "claude", False),
    ("~/bin/guard.sh", "claude", False),
    ("/usr/bin/bash '/opt/my env/shadowpoint/hookrun.sh' codex /opt/venv/bin/python", "codex", True),
    ("/usr/bin/bash /opt/shadowpoint/hookrun.sh codex /opt/venv/bin/python", "gemini", False),
])
def test_our_command_is_recognised(command: str, agent: str, expected: bool) -> None:
    assert is_ours(command, agent) is expected


def test_user_group_sharing_our_command_keeps_its_other_hooks(tmp_path: Path) -> None:
    path = tmp_path / ".claude" / "settings.local.json"
    path.parent.mkdir()
    mixed = {"hooks": {"Stop": [{"hooks": [{"type": "command", "command": "shadowpoint hook claude"},
                                           {"type": "command", "command": "say done"}]}]}}
    path.write_text(json.dumps(mixed))
    install("claude", tmp_path)
    after = json.loads(path.read_text())
    assert len(after["hooks"]["Stop"]) == 1, "the existing entry is reused, not duplicated"
    assert after["hooks"]["Stop"][0]["hooks"][1] == {"type": "command", "command": "say done"}
    install("claude", tmp_path, "--remove")
    expected = copy.deepcopy(mixed)
    expected["hooks"]["Stop"][0]["hooks"] = [{"type": "command", "command": "say done"}]
    assert json.loads(path.read_text()) == expected


def test_claude_entries_leave_the_committed_settings_file(tmp_path: Path) -> None:
    committed = tmp_path / ".claude" / "settings.json"
    committed.parent.mkdir()
    committed.write_text(json.dumps({**USER_CLAUDE, "hooks": {**USER_CLAUDE["hooks"], "PostToolBatch": [
        {"hooks": [{"type": "command", "command": "/old/bin/shadowpoint hook claude"}]}]}}))
    result = install("claude", tmp_path)
    assert any("Moved shadowpoint's entries" in n for n in result["nextSteps"])
    assert json.loads(committed.read_text()) == USER_CLAUDE, "the user's entries stay, ours leave"
    local = json.loads((tmp_path / ".claude" / "settings.local.json").read_text())
    assert "PostToolBatch" in ours(local, "claude")
