"""Running the real agent programs headless, offline, against `model_stub`.

Where the programs are: `SHADOWPOINT_AGENTS_DIR` (default `~/.cache/shadowpoint-ci/agents`,
filled by `.ci/agents`), one npm prefix per program and version. Every run gets a private
HOME, XDG dirs and agent home, telemetry and updates off, and every proxy variable pointed at
a refused loopback port (the stub's own loopback address excluded through NO_PROXY), so
nothing can leave the machine.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path

VERSIONS = {"claude": ("@anthropic-ai/claude-code", "2.1.332"), "codex": ("@openai/codex", "0.171.0"),
            "gemini": ("@google/gemini-cli", "0.61.0")}
_BIN = {"claude": "claude", "codex": "codex", "gemini": "gemini"}
# A generous bound on one agent process (a session takes seconds); not a sleep.
STEP_TIMEOUT_S = 300


def agents_dir() -> Path:
    default = Path.home() / ".cache" / "shadowpoint-ci" / "agents"
    return Path(os.environ.get("SHADOWPOINT_AGENTS_DIR") or default)


def agent_bin(agent: str) -> Path:
    """The installed program of `agent` at its pinned version; a clear failure when missing."""
    package, version = VERSIONS[agent]
    prefix = agents_dir() / f"{agent}-{version}"
    exe = prefix / "node_modules" / ".bin" / _BIN[agent]
    if not exe.exists():
        raise AssertionError(f"{package}@{version} is not installed under {prefix}: run `bash .ci/agents` "
                             "(it installs the pinned agents from the npm registry) or set SHADOWPOINT_AGENTS_DIR")
    return exe


def refused_port() -> int:
    """A loopback port nothing listens on (bound, then closed: connecting is refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class AgentHome:
    """The private directories of one agent run."""

    root: Path

    @property
    def home(self) -> Path:
        return self.root / "home"

    def dirs(self) -> dict[str, Path]:
        return {"HOME": self.home, "XDG_CONFIG_HOME": self.root / "xdg-config",
                "XDG_DATA_HOME": self.root / "xdg-data", "XDG_STATE_HOME": self.root / "xdg-state",
                "XDG_CACHE_HOME": self.root / "xdg-cache", "CODEX_HOME": self.root / "codex-home",
                "SHADOWPOINT_DOCS_DIR": self.root / "docs", "TMPDIR": self.root / "tmp"}


def offline_env(base: dict[str, str], home: AgentHome, stub_url: str) -> dict[str, str]:
    """`base` with private dirs, no telemetry or updates, and every proxy refused."""
    env = {k: v for k, v in base.items() if not k.upper().endswith("_PROXY") and not k.startswith("GIT_")}
    for key, path in home.dirs().items():
        path.mkdir(parents=True, exist_ok=True)
        env[key] = str(path)
    dead = f"http://127.0.0.1:{refused_port()}"
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
        env[var] = env[var.lower()] = dead
    env["NO_PROXY"] = env["no_proxy"] = "127.0.0.1,localhost"
    env.update({
        # Claude Code
        "ANTHROPIC_BASE_URL": stub_url, "ANTHROPIC_API_KEY": "sk-ant-stub", "IS_SANDBOX": "1",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_TELEMETRY": "1",
        "DISABLE_AUTOUPDATER": "1", "DISABLE_ERROR_REPORTING": "1", "CLAUDE_CODE_ENABLE_TELEMETRY": "0",
        # Codex CLI
        "OPENAI_API_KEY": "sk-stub", "CODEX_STUB_BASE_URL": f"{stub_url}/v1",
        # Gemini CLI
        "GEMINI_API_KEY": "stub-key", "GOOGLE_GEMINI_BASE_URL": stub_url, "GEMINI_CLI_TRUST_WORKSPACE": "true",
        "GEMINI_TELEMETRY_ENABLED": "false", "GEMINI_CLI_NO_RELAUNCH": "true",
        "NO_BROWSER": "1", "CI": "1", "TERM": "dumb", "NO_COLOR": "1",
    })
    for var in ("CLAUDE_PROJECT_DIR", "GEMINI_PROJECT_DIR", "CODEX_PROJECT_DIR", "CLAUDECODE",
                "CLAUDE_CODE_ENTRYPOINT", "GOOGLE_API_KEY", "GOOGLE_CLOUD_PROJECT"):
        env.pop(var, None)
    return env


def run(argv: list[str], cwd: Path, env: dict[str, str], stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(argv, cwd=cwd, env=env, input=stdin, capture_output=True, text=True,
                          timeout=STEP_TIMEOUT_S, check=False)
    return proc


def jsonl(text: str) -> list[dict[str, object]]:
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
    return out
