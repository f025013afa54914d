"""The scripted two-turn session of each real agent, and how to run it headless.

Turn 1: the agent's write tool creates `src/new.py`, its edit tool changes `README.md`, a
shell command creates `made_by_shell.txt` and `git rm`s the tracked `src/old.py` (Claude
Code also runs a foreground subagent that writes `sub.txt`); turn 2: one more edit
(`src/app.py`; Codex first tries a patch that fails). `round_steps` names, for each round
the session should make, the main request whose workspace snapshot the round's checkpoint
must equal byte for byte: the first model request after the round ended (Claude Code:
after each batch, as `PostToolBatch` fires before the next model call; Codex and Gemini
CLI: the turn's last request, after which no tool runs).
"""

from __future__ import annotations

import json
import queue
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tests.agents.harness import STEP_TIMEOUT_S, agent_bin, jsonl
from tests.agents.model_stub import ModelStub, Reply, Script, Text, ToolCall

PROJECT = {"README.md": "# demo\n", "src/app.py": "x = 1\n", "src/old.py": "old = True\n"}
SHELL = "echo shell > made_by_shell.txt && git rm -q src/old.py"
PROMPTS = ("Create src/new.py, edit README.md and run the shell step.", "Now bump x in src/app.py.")
SUB_MARKER = "SUBAGENT-7f3a: write sub.txt"


@dataclass
class Outcome:
    """What one session produced."""

    session_id: str
    answers: list[str]
    wall_s: float
    transcripts: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Session:
    """One agent's scripted session."""

    agent: str
    script: Callable[[Path], Script]
    round_steps: list[tuple[str, int]]      # (who, step) per expected round
    run: Callable[[Path, dict[str, str], ModelStub], Outcome]
    answers: list[str]


# ---------------------------------------------------------------------------- Claude Code


def _claude_script(ws: Path) -> Script:
    w = str(ws)
    steps: list[Reply] = [
        ToolCall("Write", {"file_path": f"{w}/src/new.py", "content": "new = True\n"}),        # 0
        ToolCall("Read", {"file_path": f"{w}/README.md"}),                                     # 1
        ToolCall("Edit", {"file_path": f"{w}/README.md", "old_string": "# demo", "new_string": "# demo, edited"}),
        ToolCall("Bash", {"command": SHELL, "description": "make a file, delete a tracked one"}),  # 3
        ToolCall("Agent", {"description": "write sub.txt", "prompt": SUB_MARKER,              # 4
                           "subagent_type": "general-purpose", "run_in_background": False}),
        Text("turn one done"),                                                                 # 5
        ToolCall("Read", {"file_path": f"{w}/src/app.py"}),                                    # 6
        ToolCall("Edit", {"file_path": f"{w}/src/app.py", "old_string": "x = 1", "new_string": "x = 2"}),
        Text("turn two done"),                                                                 # 8
    ]
    sub: list[Reply] = [ToolCall("Write", {"file_path": f"{w}/sub.txt", "content": "from the subagent\n"}),
                        Text("sub done")]
    return Script(steps, subs={SUB_MARKER: sub})


def _read_lines(stream: subprocess.Popen[str], out: queue.Queue[str | None]) -> None:
    assert stream.stdout is not None
    for line in stream.stdout:
        out.put(line)
    out.put(None)


def _claude_result(lines: queue.Queue[str | None], transcript: list[str]) -> dict[str, object]:
    """Read the stream until the turn's `result` line (each read bounded by STEP_TIMEOUT_S)."""
    while True:
        line = lines.get(timeout=STEP_TIMEOUT_S)
        if line is None:
            raise AssertionError(f"claude exited before answering: {''.join(transcript)[-2000:]}")
        transcript.append(line)
        event = jsonl(line)
        if event and event[0].get("type") == "result":
            return event[0]


def run_claude(ws: Path, env: dict[str, str], stub: ModelStub) -> Outcome:
    """Both turns in one `claude -p` process (stream-json in and out)."""
    argv = [str(agent_bin("claude")), "-p", "--input-format", "stream-json", "--output-format", "stream-json",
            "--verbose", "--permission-mode", "bypassPermissions"]
    started = time.monotonic()
    answers: list[str] = []
    transcript: list[str] = []
    session_id = ""
    with tempfile.TemporaryFile("w+") as errors, subprocess.Popen(
            argv, cwd=ws, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=errors, text=True) as proc:
        lines: queue.Queue[str | None] = queue.Queue()
        reader = threading.Thread(target=_read_lines, args=(proc, lines), daemon=True)
        reader.start()
        assert proc.stdin is not None
        try:
            for prompt in PROMPTS:
                proc.stdin.write(json.dumps({"type": "user", "message": {"role": "user", "content": prompt}}) + "\n")
                proc.stdin.flush()
                answer = _claude_result(lines, transcript)
                answers.append(str(answer.get("result")))
                session_id = str(answer.get("session_id"))
            proc.stdin.close()
            proc.wait(timeout=STEP_TIMEOUT_S)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        reader.join(timeout=STEP_TIMEOUT_S)
        errors.seek(0)
        err = errors.read()
    assert proc.returncode == 0, f"claude exited {proc.returncode}: {err[-2000:]}"
    return Outcome(session_id, answers, time.monotonic() - started, ["".join(transcript)])


# ---------------------------------------------------------------------------- Codex CLI


def _patch(body: str) -> ToolCall:
    return ToolCall("apply_patch", {"input": f"*** Begin Patch\n{body}*** End Patch\n"}, custom=True)


def _codex_script(ws: Path) -> Script:
    return Script([
        _patch("*** Add File: src/new.py\n+new = True\n"),                      # 0
        _patch("*** Update File: README.md\n@@\n-# demo\n+# demo, edited\n"),   # 1
        ToolCall("exec_command", {"cmd": SHELL}),                              # 2
        Text("turn one done"),                                                 # 3
        # A patch that fails: Codex sends no PostToolUse for it, the round's end closes it.
        _patch("*** Update File: missing.txt\n@@\n-a\n+b\n"),                   # 4
        _patch("*** Update File: src/app.py\n@@\n-x = 1\n+x = 2\n"),            # 5
        Text("turn two done"),                                                 # 6
    ])


def codex_config(stub_url: str) -> str:
    """`$CODEX_HOME/config.toml`: the stub as the model provider, analytics and feedback off."""
    return (f'model = "gpt-5.5"\nmodel_provider = "stub"\n\n[model_providers.stub]\nname = "stub"\n'
            f'base_url = "{stub_url}/v1"\nwire_api = "responses"\nenv_key = "OPENAI_API_KEY"\n\n'
            '[analytics]\nenabled = false\n\n[feedback]\nenabled = false\n')


CODEX_FLAGS = ["--json", "--trust", "--dangerously-bypass-approvals-and-sandbox", "--dangerously-bypass-hook-trust",
               "--skip-git-repo-check"]


def _codex_turn(argv: list[str], ws: Path, env: dict[str, str]) -> tuple[str, str, str]:
    proc = subprocess.run(argv, cwd=ws, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=STEP_TIMEOUT_S, check=False)
    assert proc.returncode == 0, f"codex exited {proc.returncode}: {proc.stderr[-2000:]}"
    events = jsonl(proc.stdout)
    thread = next((str(e["thread_id"]) for e in events if e.get("type") == "thread.started"), "")
    items = [e.get("item") for e in events if e.get("type") == "item.completed"]
    texts = [str(i.get("text")) for i in items if isinstance(i, dict) and i.get("type") == "agent_message"]
    return thread, texts[-1] if texts else "", proc.stdout


def run_codex(ws: Path, env: dict[str, str], stub: ModelStub) -> Outcome:
    """`codex exec` for turn 1, `codex exec resume <thread>` for turn 2."""
    (Path(env["CODEX_HOME"]) / "config.toml").write_text(codex_config(stub.url))
    exe = str(agent_bin("codex"))
    started = time.monotonic()
    thread, first, out1 = _codex_turn([exe, "exec", *CODEX_FLAGS, PROMPTS[0]], ws, env)
    assert thread, out1
    again, second, out2 = _codex_turn([exe, "exec", "resume", *CODEX_FLAGS, thread, PROMPTS[1]], ws, env)
    assert again == thread, (again, thread)
    return Outcome(thread, [first, second], time.monotonic() - started, [out1, out2])


# ---------------------------------------------------------------------------- Gemini CLI


def _gemini_script(ws: Path) -> Script:
    w = str(ws)
    return Script([
        ToolCall("write_file", {"file_path": f"{w}/src/new.py", "content": "new = True\n"}),   # 0
        ToolCall("replace", {"file_path": f"{w}/README.md", "instruction": "edit the title",    # 1
                             "old_string": "# demo", "new_string": "# demo, edited"}),
        ToolCall("run_shell_command", {"command": SHELL, "description": "make a file, delete one"}),  # 2
        Text("turn one done"),                                                                 # 3
        ToolCall("replace", {"file_path": f"{w}/src/app.py", "instruction": "bump x",           # 4
                             "old_string": "x = 1", "new_string": "x = 2"}),
        Text("turn two done"),                                                                 # 5
    ])


GEMINI_USER_SETTINGS = {"telemetry": {"enabled": False}, "privacy": {"usageStatisticsEnabled": False},
                        "general": {"disableAutoUpdate": True, "disableUpdateNag": True},
                        "security": {"auth": {"selectedType": "gemini-api-key"}}}
GEMINI_FLAGS = ["--approval-mode", "yolo", "--output-format", "json"]


def _gemini_turn(argv: list[str], ws: Path, env: dict[str, str]) -> tuple[str, str, str]:
    proc = subprocess.run(argv, cwd=ws, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=STEP_TIMEOUT_S, check=False)
    assert proc.returncode == 0, f"gemini exited {proc.returncode}: {proc.stderr[-2000:]}"
    start = proc.stdout.find("{")
    assert start >= 0, f"gemini printed no JSON: {proc.stdout[-2000:]} {proc.stderr[-2000:]}"
    result = json.loads(proc.stdout[start:])
    return str(result.get("session_id")), str(result.get("response")), proc.stdout


def run_gemini(ws: Path, env: dict[str, str], stub: ModelStub) -> Outcome:
    """`gemini -p` for turn 1, `gemini --resume <session> -p` for turn 2."""
    settings = Path(env["HOME"]) / ".gemini" / "settings.json"
    settings.parent.mkdir(parents=True, exist_ok=True)
    settings.write_text(json.dumps(GEMINI_USER_SETTINGS))
    exe = str(agent_bin("gemini"))
    started = time.monotonic()
    session, first, out1 = _gemini_turn([exe, *GEMINI_FLAGS, "-p", PROMPTS[0]], ws, env)
    again, second, out2 = _gemini_turn([exe, *GEMINI_FLAGS, "--resume", session, "-p", PROMPTS[1]], ws, env)
    assert again == session, (again, session)
    return Outcome(session, [first, second], time.monotonic() - started, [out1, out2])


SESSIONS = {
    "claude": Session("claude", _claude_script,
                      [("main", 1), ("main", 3), ("main", 4), ("main", 5), ("main", 8)],
                      run_claude, ["turn one done", "turn two done"]),
    "codex": Session("codex", _codex_script, [("main", 3), ("main", 6)], run_codex,
                     ["turn one done", "turn two done"]),
    "gemini": Session("gemini", _gemini_script, [("main", 3), ("main", 5)], run_gemini,
                      ["turn one done", "turn two done"]),
}
