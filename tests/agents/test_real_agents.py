"""The real Claude Code, Codex CLI and Gemini CLI, driven headless by the scripted model server.

The `runs` fixture (conftest.py, one per agent) runs the agent's scripted session
(sessions.py) once hooked and once without hooks; the tests below run in this order for
each agent, the restore last because it changes the project. The oracles are the model
stub's workspace snapshots (the disk as the model saw it at each request) and the git CLI
reading the shadow repository.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from shadowpoint.adapters.install import settings_path
from shadowpoint.workspace import workspace_hash
from tests.agents.conftest import Run, shadowpoint_argv
from tests.agents.model_stub import Served, Snapshot
from tests.agents.sessions import SESSIONS
from tests.conftest import Exe, Link

pytestmark = pytest.mark.agents


def sp(run: Run, *args: str) -> Any:
    """`shadowpoint ARGS --json` in the run's project, as its user would type it."""
    proc = subprocess.run([*shadowpoint_argv(), *args, "--json"], cwd=run.ws, env=run.env, capture_output=True,
                          text=True, timeout=300, check=False)
    assert proc.returncode == 0, f"shadowpoint {' '.join(args)}: {proc.stderr}"
    return json.loads(proc.stdout)


def checkpoints(run: Run) -> list[dict[str, Any]]:
    """The session's checkpoints, oldest first."""
    listed = sp(run, "list", str(run.ws), "--task", run.outcome.session_id)
    return list(reversed(listed["checkpoints"]))


def hook_log(run: Run) -> str:
    path = Path(run.env["XDG_STATE_HOME"]) / "shadowpoint" / "hooks.log"
    return path.read_text() if path.exists() else "(no hooks.log)"


def _git(run: Run, *args: str) -> bytes:
    git_dir = Path(run.env["SHADOWPOINT_DOCS_DIR"]) / "checkpoints" / workspace_hash(run.ws) / ".git"
    env = {"PATH": os.environ["PATH"], "HOME": run.env["HOME"], "GIT_CONFIG_NOSYSTEM": "1"}
    return subprocess.run(["git", "--git-dir", str(git_dir), *args], capture_output=True, env=env,
                          check=True, timeout=120).stdout


def checkpoint_tree(run: Run, commit: str) -> Snapshot:
    """A checkpoint's files as `read_tree` shows a directory (the git CLI as the oracle)."""
    out: Snapshot = {}
    for entry in _git(run, "ls-tree", "-r", "-z", commit).split(b"\0"):
        if not entry:
            continue
        meta, path = entry.split(b"\t", 1)
        mode, _, sha = meta.split()
        data = _git(run, "cat-file", "blob", sha.decode())
        name = path.decode("utf-8", "surrogateescape")
        out[name] = Link(data.decode()) if mode == b"120000" else Exe(data) if mode == b"100755" else data
    return out


def request_at(run: Run, who: str, step: int) -> Served:
    found = [s for s in run.stub.main_requests() if s.who == who and s.step == step]
    assert found, f"the agent never made request {who}#{step}: {[(s.who, s.step) for s in run.stub.served]}"
    return found[0]


# ---------------------------------------------------------------------------- the checks


def test_task_is_the_session(runs: dict[str, Run]) -> None:
    run = runs["hooked"]
    assert run.outcome.session_id
    tasks = sp(run, "list", str(run.ws), "--tasks")
    ids = [t.get("taskId") or t.get("id") for t in tasks["tasks"]]
    assert run.outcome.session_id in ids, (ids, hook_log(run))


def test_checkpoint_per_round_byte_exact(runs: dict[str, Run]) -> None:
    run = runs["hooked"]
    session = SESSIONS[run.agent]
    cps = checkpoints(run)
    kinds = [c["kind"] for c in cps]
    log = hook_log(run)
    assert "failed" not in log, log
    assert kinds[0] == "baseline", (kinds, log)
    assert checkpoint_tree(run, cps[0]["hash"]) == run.initial, "the baseline is the project before the session"
    assert "compaction" not in kinds, f"no compaction happened in this session: {kinds}\n{log}"
    rounds = [c for c in cps if c["kind"] == "round"]
    expected = [request_at(run, who, step).tree for who, step in session.round_steps]
    got = [checkpoint_tree(run, c["hash"]) for c in rounds]
    assert len(got) == len(expected), f"{len(expected)} rounds expected, checkpoints: {kinds}\n{log}"
    for i, (tree, want) in enumerate(zip(got, expected, strict=True)):
        assert tree == want, f"round {i + 1} is not the disk the model saw after it ({session.round_steps[i]})"
    assert set(kinds) <= {"baseline", "round", "completion"}, kinds
    for before, cp in itertools.pairwise(cps):
        if cp["kind"] == "completion" and cp["hash"]:
            assert checkpoint_tree(run, cp["hash"]) == checkpoint_tree(run, before["hash"]), \
                "a turn's completion holds what its last round held (nothing ran in between)"


def _changes(old: Snapshot, new: Snapshot) -> dict[str, str]:
    out = {p: "added" for p in new.keys() - old.keys()}
    out.update({p: "deleted" for p in old.keys() - new.keys()})
    out.update({p: "modified" for p in old.keys() & new.keys() if old[p] != new[p]})
    return out


def test_diff_names_the_changes(runs: dict[str, Run]) -> None:
    run = runs["hooked"]
    cps = checkpoints(run)
    final = request_at(run, *SESSIONS[run.agent].round_steps[-1]).tree
    expected = _changes(run.initial, final)
    assert {"src/new.py", "README.md", "made_by_shell.txt", "src/old.py", "src/app.py"} <= expected.keys()
    result = sp(run, "diff", cps[0]["hash"], cps[-1]["hash"] or cps[-2]["hash"], "--task", run.outcome.session_id)
    got = {f.get("path"): f.get("status") for f in result["files"]}
    assert got == expected, result["files"]


def test_hooks_change_no_model_request(runs: dict[str, Run]) -> None:
    hooked, plain = runs["hooked"], runs["plain"]
    assert hooked.outcome.answers == plain.outcome.answers == SESSIONS[hooked.agent].answers
    assert conversation(hooked) == conversation(plain)
    ours = hooked.initial.keys() - plain.initial.keys()  # what install-hooks wrote
    assert str(settings_path(hooked.agent, hooked.ws).relative_to(hooked.ws)) in ours
    seen_hooked = [{p: v for p, v in s.tree.items() if p not in ours} for s in hooked.stub.main_requests()]
    seen_plain = [s.tree for s in plain.stub.main_requests()]
    assert seen_hooked == seen_plain, "the model saw the same files at every request"
    assert hooked.stub.unknown == plain.stub.unknown == []


def test_restore_baseline_exactly(runs: dict[str, Run]) -> None:
    run = runs["hooked"]
    cps = checkpoints(run)
    assert read_tree_now(run) != run.initial
    sp(run, "restore", cps[0]["hash"], "--files", "--yes", "--task-id", run.outcome.session_id)
    now = read_tree_now(run)
    assert now == run.initial, f"left over after restore: {_changes(run.initial, now)}"


def read_tree_now(run: Run) -> Snapshot:
    from tests.conftest import read_tree
    return read_tree(run.ws)


# ---------------------------------------------------------------------------- conversation


_IDS = re.compile(r"\b(?:toolu|call|msg|resp|item|gem)_stub\d+\b")
_VOLATILE = [(re.compile(r"Wall time: [0-9.]+ seconds"), "Wall time: <t>"),
             (re.compile(r"Process Group PGID: \d+"), "Process Group PGID: <pgid>"),
             (re.compile(r"Chunk ID: \w+"), "Chunk ID: <chunk>"),
             (re.compile(r"\ba[0-9a-f]{16}\b"), "<agent-id>"), (re.compile(r"duration_ms: \d+"), "duration_ms: <t>")]


def _norm(value: Any, ws: str) -> Any:
    if isinstance(value, str):
        text = _IDS.sub("<id>", value.replace(ws, "<ws>"))
        for pattern, repl in _VOLATILE:
            text = pattern.sub(repl, text)
        return text
    if isinstance(value, dict):
        return {k: _norm(v, ws) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_norm(v, ws) for v in value]
    return value


def _exchange(api: str, body: dict[str, Any]) -> list[Any]:
    """The tool calls and tool results of a request's history (what the agent did and got back)."""
    out: list[Any] = []
    if api == "anthropic":
        for m in body.get("messages") or []:
            for block in m.get("content") if isinstance(m.get("content"), list) else []:
                if block.get("type") == "tool_use":
                    out.append(("call", block.get("name"), block.get("input")))
                elif block.get("type") == "tool_result":
                    out.append(("result", block.get("content"), block.get("is_error")))
    elif api == "openai":
        for item in body.get("input") or []:
            kind = item.get("type")
            if kind in ("function_call", "custom_tool_call"):
                out.append(("call", item.get("name"), item.get("arguments") or item.get("input")))
            elif kind in ("function_call_output", "custom_tool_call_output"):
                out.append(("result", item.get("output")))
    else:
        for content in body.get("contents") or []:
            for part in content.get("parts") or []:
                if "functionCall" in part:
                    out.append(("call", part["functionCall"].get("name"), part["functionCall"].get("args")))
                elif "functionResponse" in part:
                    out.append(("result", part["functionResponse"].get("response")))
    return out


def conversation(run: Run) -> list[Any]:
    """Every scripted request, as (who, step, tools offered, the history's calls and results)."""
    ws = str(run.ws)
    out = []
    for s in run.stub.main_requests():
        tools = sorted(str(t.get("name") or [d.get("name") for d in t.get("functionDeclarations", [])])
                       for t in s.body.get("tools") or [])
        out.append((s.who, s.step, tools, _norm(_exchange(s.api, s.body), ws)))
    return out
