"""Are our hooks in place for each agent? For `shadowpoint doctor`: installed, current, trusted.

Per agent, from its project settings file under the workspace: whether our entries are there
for every event `install-hooks` writes (installed), whether they run this shadowpoint's hook
client and, for Claude Code's http hooks, post to the workspace's endpoint with its secret
(current), and, where the agent's own files show it, whether the agent will run them
(trusted): Codex's `~/.codex/config.toml` (project `trust_level`, stored hook trust), Gemini
CLI's `~/.gemini/trustedFolders.json` (or `GEMINI_CLI_TRUST_WORKSPACE`). Read-only; called on
the CLI's thread.
"""

from __future__ import annotations

import json
import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from shadowpoint.adapters import AGENTS
from shadowpoint.adapters.install import (
    HookTarget,
    default_command,
    is_bash_client,
    our_hook,
    our_hooks,
    settings_path,
)

Check = dict[str, Any]


def _load(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _expected(agent: str, root: Path) -> HookTarget:
    url = secret = None
    if AGENTS[agent].http_events:
        from shadowpoint.sidecar.hook_endpoint import load_http_config

        config = load_http_config(str(root))
        if config is not None:
            url, secret = config.url, config.secret
    return HookTarget(default_command(agent), url, secret)


def codex_trust(root: Path, env: Mapping[str, str]) -> tuple[bool | None, str]:
    """Whether Codex trusts the project (and how many hook trusts it stored)."""
    home = Path(env.get("CODEX_HOME") or Path.home() / ".codex")
    try:
        config = tomllib.loads((home / "config.toml").read_text(encoding="utf-8"))
    except FileNotFoundError:
        return False, f"{home / 'config.toml'} does not exist: the project is not trusted yet"
    except (OSError, ValueError) as exc:
        return None, f"cannot read {home / 'config.toml'}: {exc}"
    projects = config.get("projects")
    if not isinstance(projects, dict):
        projects = {}
    real = os.path.realpath(root)
    level = next((v.get("trust_level") for k, v in projects.items()
                  if isinstance(v, dict) and os.path.realpath(k) == real), None)
    state = (config.get("hooks") or {}).get("state") if isinstance(config.get("hooks"), dict) else None
    stored = sum(1 for k, v in (state.items() if isinstance(state, dict) else ())
                 if real in str(k) and isinstance(v, dict) and v.get("trusted_hash"))
    if level != "trusted":
        return False, f"project trust_level is {level or 'unset'} (Codex runs its hooks only when trusted)"
    if not stored:
        return None, ("project trusted; no stored hook trust for it: review the hooks at Codex's next start, "
                      "or run with --dangerously-bypass-hook-trust")
    return True, f"project trusted, {stored} hook trust(s) stored"


def gemini_trust(root: Path, env: Mapping[str, str]) -> tuple[bool | None, str]:
    """Whether Gemini CLI treats the folder as trusted (its longest matching rule wins)."""
    if env.get("GEMINI_CLI_TRUST_WORKSPACE") == "true":
        return True, "GEMINI_CLI_TRUST_WORKSPACE=true in this environment"
    home = Path(env.get("GEMINI_CLI_HOME") or Path.home())
    path = Path(env.get("GEMINI_CLI_TRUSTED_FOLDERS_PATH") or home / ".gemini" / "trustedFolders.json")
    rules = _load(path)
    if rules is None:
        return False, f"{path} has no rule for this folder: trust it in Gemini CLI's dialog"
    real = os.path.realpath(root)
    best: tuple[int, str] | None = None
    for rule, level in rules.items():
        where = os.path.realpath(os.path.dirname(rule) if level == "TRUST_PARENT" else rule)
        if (real == where or real.startswith(where.rstrip("/") + "/")) and (best is None or len(where) > best[0]):
            best = (len(where), str(level))
    if best is None:
        return False, f"{path} has no rule for this folder: trust it in Gemini CLI's dialog"
    trusted = best[1] in ("TRUST_FOLDER", "TRUST_PARENT")
    return trusted, f"{path}: {best[1]}"


def _bash_without_secret(ours: Mapping[str, list[dict[str, Any]]], root: Path) -> bool:
    """True when our entries run the bash client and the workspace has no http port and secret."""
    if not any(is_bash_client(str(h.get("command") or "")) for hooks in ours.values() for h in hooks):
        return False
    from shadowpoint.sidecar.hook_endpoint import load_http_config

    return load_http_config(str(root)) is None


def check_agent(agent: str, root: Path, env: Mapping[str, str] | None = None) -> Check:
    """One doctor check: are our hooks for `agent` installed, current and trusted in `root`?"""
    env = os.environ if env is None else env
    name = f"hooks ({agent})"
    path = settings_path(agent, root)
    settings = _load(path)
    ours = our_hooks(settings or {}, agent)
    if not ours:
        return {"name": name, "status": "info", "summary": f"not installed ({path})", "details": []}
    details: list[str] = []
    missing = [e for e in AGENTS[agent].events if e not in ours]
    if missing:
        details.append(f"missing events: {', '.join(missing)} (run `shadowpoint install-hooks {agent}`)")
    expected = _expected(agent, root)
    stale = sorted(e for e, hooks in ours.items() if e in AGENTS[agent].events
                   and any(h != our_hook(agent, e, expected) for h in hooks))
    if stale:
        details.append(f"not current (another hook client, endpoint or secret): {', '.join(stale)}; "
                       f"run `shadowpoint install-hooks {agent}` again")
    if not stale and _bash_without_secret(ours, root):
        stale = ["http secret"]
        details.append("the bash hook client finds no http port and secret for this workspace, so every event "
                       f"goes through the slower Python client; run `shadowpoint install-hooks {agent}` again")
    trusted: bool | None = None
    if agent == "codex":
        trusted, why = codex_trust(root, env)
        details.append(why)
    elif agent == "gemini":
        trusted, why = gemini_trust(root, env)
        details.append(why)
    else:
        details.append("Claude Code runs them once its workspace trust dialog is accepted")
    ok = not missing and not stale and trusted is not False
    summary = "installed, current" if not (missing or stale) else "installed, needs an update"
    if trusted is not None:
        summary += ", trusted" if trusted else ", NOT trusted: the agent will not run them"
    return {"name": name, "status": "ok" if ok else "warning", "summary": f"{summary} ({path})", "details": details}


def check_agents(root: Path | None) -> list[Check]:
    """The hook checks of every agent whose settings under `root` hold any entry of ours."""
    if root is None:
        return []
    checks = [check_agent(agent, root) for agent in AGENTS]
    return [c for c in checks if c["status"] != "info"] or [
        {"name": "hooks", "status": "info", "summary": "no agent hooks installed here "
         "(`shadowpoint install-hooks claude|codex|gemini`)", "details": []}]
