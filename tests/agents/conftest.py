"""The `agents` marker and the runs of the real agent programs the tests there share.

Each agent's session runs twice, in two fresh git projects with the same files: once after
`shadowpoint install-hooks AGENT`, once without hooks; the two runs are shared by every test
of that agent (a module-scoped fixture with the agent as its parameter).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.agents.harness import AgentHome, offline_env
from tests.agents.model_stub import ModelStub, Snapshot
from tests.agents.sessions import PROJECT, SESSIONS, Outcome
from tests.conftest import make_tree, read_tree
from tests.integration.test_adapters import stop_sidecars


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "agents: drives the real Claude Code / Codex / Gemini CLI programs "
                                       "(installed by .ci/agents) against a scripted model server on 127.0.0.1")


def shadowpoint_argv() -> list[str]:
    """This venv's `shadowpoint` (the hook command install-hooks writes is its absolute path)."""
    exe = Path(sys.executable).with_name("shadowpoint")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "shadowpoint"]


@dataclass
class Run:
    """One session of one agent in its own project."""

    agent: str
    ws: Path
    env: dict[str, str]
    outcome: Outcome
    stub: ModelStub
    initial: Snapshot


def new_project(ws: Path) -> Path:
    make_tree(ws, PROJECT)
    env = {"PATH": os.environ["PATH"], "HOME": str(ws.parent), "GIT_CONFIG_NOSYSTEM": "1"}
    git = ["git", "-c", "user.email=t@example.invalid", "-c", "user.name=t"]
    for argv in (["init", "-q"], ["add", "."], ["commit", "-qm", "init"]):
        subprocess.run([*git, *argv], cwd=ws, env=env, check=True, capture_output=True)
    return ws


def run_agent(agent: str, root: Path, run_dir: Path, *, hooked: bool, hook_command: str | None = None,
              extra_env: dict[str, str] | None = None) -> Run:
    """The agent's scripted session in a fresh project under `root` (hooks installed when `hooked`).

    `hook_command` replaces `shadowpoint hook AGENT` in the installed entries (the benchmark's
    counting hook); `extra_env` is added to the agent's environment.
    """
    session = SESSIONS[agent]
    ws = new_project(Path(os.path.realpath(root)) / "proj")
    base = {k: v for k, v in os.environ.items() if not k.startswith("SHADOWPOINT_")}
    with ModelStub(session.script(ws), ws) as stub:
        env = offline_env(base, AgentHome(root / "agent"), stub.url)
        env["XDG_RUNTIME_DIR"] = str(run_dir)
        env["SHADOWPOINT_HOOK_TRACE"] = "1"
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
        env.update(extra_env or {})
        if hooked:
            command = ["--command", hook_command] if hook_command else []
            subprocess.run([*shadowpoint_argv(), "install-hooks", agent, str(ws), *command], env=env, cwd=ws,
                           check=True, capture_output=True, timeout=120)
        initial = read_tree(ws)
        outcome = session.run(ws, env, stub)
    return Run(agent, ws, env, outcome, stub, initial)


@pytest.fixture(scope="module", params=sorted(SESSIONS))
def runs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Run]]:
    """{"hooked": Run, "plain": Run} of one agent (pytest runs every test of one agent, then the next)."""
    agent: str = request.param
    root = tmp_path_factory.mktemp(f"agent-{agent}")
    run_dir = Path(tempfile.mkdtemp(prefix="sp-run-"))  # short: the sidecar's socket lives here
    try:
        plain = run_agent(agent, root / "plain", run_dir, hooked=False)
        hooked = run_agent(agent, root / "hooked", run_dir, hooked=True)
        yield {"hooked": hooked, "plain": plain}
    finally:
        stop_sidecars(run_dir)
        shutil.rmtree(run_dir, ignore_errors=True)
