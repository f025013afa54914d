"""`shadowpoint install-hooks AGENT [DIR]`: merge our hook entries into an agent's settings file.

The user's own entries are never changed, reordered or duplicated: ours are separate
groups whose command runs our hook client (`…/shadowpoint/hookrun.py AGENT`, the bash client
`…/shadowpoint/hookrun.sh AGENT …`, or the older `… shadowpoint hook AGENT`) or whose http
hook posts to `…/hook/claude` on 127.0.0.1, found again by that for an update or for `--remove`. Files: Claude Code
`DIR/.claude/settings.local.json` (user-local: it holds the http hooks' secret; never the
`settings.json` meant to be committed, from which older entries of ours are moved), Codex
CLI `DIR/.codex/hooks.json`, Gemini CLI `DIR/.gemini/settings.json` (all the same
`hooks → event → [{matcher?, hooks: [{type, command | url, timeout}]}]` shape). The result
says what the agent still needs before it runs them (trust). Runs on the CLI's thread;
writes atomically.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shadowpoint import hookrun
from shadowpoint.adapters import AGENTS
from shadowpoint.errors import InvalidParamsError
from shadowpoint.store.atomic import atomic_writer

SETTINGS_FILES = {"claude": (".claude", "settings.local.json"), "codex": (".codex", "hooks.json"),
                  "gemini": (".gemini", "settings.json")}
# Where older versions put Claude Code's entries (a file meant to be committed).
LEGACY_SETTINGS = {"claude": (".claude", "settings.json")}
# Hook timeouts: the barrier before a mutating tool may wait for a large baseline.
_BARRIER_EVENTS = {"PreToolUse", "BeforeTool"}
_BARRIER_TIMEOUT_S = 600
_TIMEOUT_S = 60
_TIMEOUT_IN_MS = {"gemini"}
_HTTP_PATH = "/hook/claude"
# The agents whose command events run the bash client where it can run: every event of Codex
# CLI and Gemini CLI, Claude Code's SessionStart and UserPromptSubmit (its others are http hooks).
BASH_CLIENT_AGENTS = frozenset({"claude", "codex", "gemini"})


@dataclass(slots=True)
class InstallResult:
    """What `install_hooks` changed in one settings file, and what the agent still needs."""

    path: Path
    added: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        """True when the file needs writing."""
        return bool(self.added or self.updated or self.removed)


def settings_path(agent: str, directory: Path) -> Path:
    """The project settings file of `agent` under `directory`."""
    folder, name = SETTINGS_FILES[agent]
    return directory / folder / name


def bash_client() -> tuple[str, Path] | None:
    """bash and our bash hook client (`hookrun.sh`), where it can run: Linux with bash and sha256sum."""
    script = Path(hookrun.__file__).resolve().with_name("hookrun.sh")
    bash = shutil.which("bash")
    if not sys.platform.startswith("linux") or bash is None or shutil.which("sha256sum") is None:
        return None
    return (bash, script) if script.is_file() else None


def default_command(agent: str) -> str:
    """The lean hook client by absolute paths.

    Codex CLI and Gemini CLI run a command for every event, Claude Code for SessionStart and
    UserPromptSubmit: `BASH …/shadowpoint/hookrun.sh AGENT PYTHON` where it can run (bash
    starts in a few milliseconds; it posts to the sidecar's http endpoint and hands anything
    else, such as starting the sidecar, to the Python client), else `PYTHON -I -S
    …/shadowpoint/hookrun.py AGENT`: no site, no user environment (the module needs only the
    standard library), so a hook runs without our venv on PATH.
    """
    script = Path(hookrun.__file__).resolve()
    client = bash_client() if agent in BASH_CLIENT_AGENTS else None
    if client is not None:
        bash, sh_script = client
        return f"{shlex.quote(bash)} {shlex.quote(str(sh_script))} {agent} {shlex.quote(sys.executable)}"
    return f"{shlex.quote(sys.executable)} -I -S {shlex.quote(str(script))} {agent}"


def is_ours(hook: Any, agent: str) -> bool:
    """True for a hook entry (or a command string) of ours: a command running our hook client for
    `agent` (any path), or, for Claude Code, an http hook posting to `/hook/claude` on 127.0.0.1."""
    if isinstance(hook, str):
        hook = {"command": hook}
    if not isinstance(hook, dict):
        return False
    url = hook.get("url")
    if agent == "claude" and isinstance(url, str):
        return url.startswith("http://127.0.0.1:") and url.endswith(_HTTP_PATH)
    command = hook.get("command")
    if not isinstance(command, str):
        return False
    try:
        words = shlex.split(command)
    except ValueError:
        words = command.split()
    for i, word in enumerate(words):
        base = os.path.basename(word)
        is_exe = base == "shadowpoint" or (word == "shadowpoint" and i > 0 and words[i - 1] == "-m")
        if is_exe and words[i + 1:i + 3] == ["hook", agent]:
            return True
        is_lean = (base in ("hookrun.py", "hookrun.sh")
                   or (word == "shadowpoint.hookrun" and i > 0 and words[i - 1] == "-m"))
        if is_lean and words[i + 1:i + 2] == [agent]:
            return True
    return False


def our_hooks(settings: Mapping[str, Any], agent: str) -> dict[str, list[dict[str, Any]]]:
    """Our hook entries in an agent's settings, per event."""
    found: dict[str, list[dict[str, Any]]] = {}
    hooks = settings.get("hooks")
    for event, groups in (hooks.items() if isinstance(hooks, dict) else ()):
        for group in groups if isinstance(groups, list) else ():
            for hook in (group.get("hooks") or []) if isinstance(group, dict) else ():
                if is_ours(hook, agent):
                    found.setdefault(event, []).append(hook)
    return found


def installed_command(agent: str, directory: Path, event: str) -> str | None:
    """Our command for `event` as `install-hooks` wrote it into the project settings under
    `directory`; None if there is none (not installed, or an http hook).

    Raises:
        InvalidParamsError: the settings file is not a JSON object.
    """
    for hook in our_hooks(_load(settings_path(agent, directory)), agent).get(event, []):
        if isinstance(hook.get("command"), str):
            return str(hook["command"])
    return None


def _timeout(agent: str, event: str) -> int:
    seconds = _BARRIER_TIMEOUT_S if event in _BARRIER_EVENTS else _TIMEOUT_S
    return seconds * 1000 if agent in _TIMEOUT_IN_MS else seconds


@dataclass(frozen=True, slots=True)
class HookTarget:
    """What our entries run: the command, and for Claude Code's http events the url and secret."""

    command: str
    url: str | None = None
    secret: str | None = None


def our_hook(agent: str, event: str, target: HookTarget) -> dict[str, Any]:
    """Our hook entry for one event (an http hook where the agent has one for it)."""
    if target.url is not None and event in AGENTS[agent].http_events:
        return {"type": "http", "url": target.url, "headers": {"Authorization": f"Bearer {target.secret}"},
                "timeout": _timeout(agent, event)}
    hook: dict[str, Any] = {"type": "command", "command": target.command, "timeout": _timeout(agent, event)}
    if agent == "gemini":
        hook["name"] = "shadowpoint"
    return hook


def _our_group(agent: str, event: str, matcher: str | None, target: HookTarget) -> dict[str, Any]:
    group: dict[str, Any] = {}
    if matcher is not None:
        group["matcher"] = matcher
    group["hooks"] = [our_hook(agent, event, target)]
    return group


def _groups_with_ours(groups: list[Any], agent: str) -> list[dict[str, Any]]:
    return [g for g in groups if isinstance(g, dict) and any(is_ours(h, agent) for h in g.get("hooks") or [])]


def merge_hooks(settings: dict[str, Any], agent: str, target: HookTarget) -> tuple[list[str], list[str]]:
    """Add our group to every event of `agent` in `settings` (in place).

    An event that already has our entry keeps its group (entry and matcher brought up to
    date); the user's groups are left exactly as they are.

    Returns:
        (added, updated) event names.

    Raises:
        InvalidParamsError: `hooks` or an event entry is not of the documented shape.
    """
    hooks = settings.setdefault("hooks", {})
    if not isinstance(hooks, dict):
        raise InvalidParamsError("`hooks` in the settings file is not an object; fix it by hand first.")
    added, updated = [], []
    for event, matcher in AGENTS[agent].events.items():
        groups = hooks.setdefault(event, [])
        if not isinstance(groups, list):
            raise InvalidParamsError(f"`hooks.{event}` in the settings file is not a list; fix it by hand first.")
        wanted = _our_group(agent, event, matcher, target)
        mine = _groups_with_ours(groups, agent)
        if not mine:
            groups.append(wanted)
            added.append(event)
            continue
        group = mine[0]
        before = json.dumps(group, sort_keys=True)
        if matcher is None:
            group.pop("matcher", None)
        else:
            group["matcher"] = matcher
        inner = group.get("hooks") or []
        for i, h in enumerate(inner):
            if is_ours(h, agent):
                inner[i] = wanted["hooks"][0]  # a command may become an http hook, or back
        if json.dumps(group, sort_keys=True) != before:
            updated.append(event)
    return added, updated


def remove_hooks(settings: dict[str, Any], agent: str) -> list[str]:
    """Remove our hook commands (and groups and events that only held them), in place.

    Returns:
        The events something was removed from.
    """
    hooks = settings.get("hooks")
    if not isinstance(hooks, dict):
        return []
    removed = []
    for event in list(hooks):
        groups = hooks[event]
        if not isinstance(groups, list):
            continue
        kept_groups = []
        touched = False
        for g in groups:
            inner = g.get("hooks") if isinstance(g, dict) else None
            if not isinstance(inner, list):
                kept_groups.append(g)
                continue
            kept = [h for h in inner if not is_ours(h, agent)]
            if len(kept) == len(inner):
                kept_groups.append(g)
                continue
            touched = True
            if kept:
                kept_groups.append({**g, "hooks": kept})
        if touched:
            removed.append(event)
            if kept_groups:
                hooks[event] = kept_groups
            else:
                del hooks[event]
    if not hooks and removed:
        del settings["hooks"]
    return removed


def _load(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    if not text.strip():
        return {}
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise InvalidParamsError(f"{path} is not valid JSON ({exc}); left untouched.") from exc
    if not isinstance(data, dict):
        raise InvalidParamsError(f"{path} does not hold a JSON object; left untouched.")
    return data


def _write(path: Path, data: dict[str, Any], *, private: bool) -> None:
    """Write atomically, keeping the file's mode (`private`: readable by the user only)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_writer(path) as fh:
        fh.write((json.dumps(data, indent=2, ensure_ascii=False) + "\n").encode("utf-8"))
        with contextlib.suppress(OSError):
            os.fchmod(fh.fileno(), os.stat(path).st_mode & 0o777)
        if private:
            os.fchmod(fh.fileno(), os.fstat(fh.fileno()).st_mode & 0o700)


def next_steps(agent: str, directory: Path) -> list[str]:
    """What the agent still needs before it runs the hooks just installed (its trust rules)."""
    root = str(directory.resolve())
    if agent == "codex":
        return [
            "Codex runs project hooks only in a trusted project and only hooks you have reviewed: at its next "
            "start, trust the project and review and trust the new hooks (\"Hooks need review\", or /hooks); "
            "they run from then on, until a hook changes.",
            f"Non-interactive (`codex exec`): trust the project ([projects.\"{root}\"] trust_level = \"trusted\" "
            "in ~/.codex/config.toml, or --trust) and pass --dangerously-bypass-hook-trust, or trust the hooks "
            "once interactively (the trust is stored in ~/.codex/config.toml).",
        ]
    if agent == "gemini":
        return [
            f"Gemini CLI runs project hooks only in a trusted folder: trust {root} in its folder-trust dialog "
            "(stored in ~/.gemini/trustedFolders.json), or start it with GEMINI_CLI_TRUST_WORKSPACE=true "
            "(--skip-trust is too late: settings are loaded before it acts).",
        ]
    return [
        "Claude Code runs these hooks once you accept its workspace trust dialog for this folder.",
        "Its http hooks carry a secret in .claude/settings.local.json (user-local, not for version control).",
    ]


def _target(agent: str, directory: Path, command: str | None) -> HookTarget:
    cmd = command or default_command(agent)
    if command is None and agent == "claude":
        from shadowpoint.sidecar.hook_endpoint import ensure_http_config

        config = ensure_http_config(str(directory.resolve()))
        return HookTarget(cmd, config.url, config.secret)
    if is_bash_client(cmd):
        from shadowpoint.sidecar.hook_endpoint import ensure_http_config

        # The bash client posts to the sidecar's http endpoint; it reads the port and secret
        # at run time from the user's 0600 file, never from the project's settings file.
        ensure_http_config(str(directory.resolve()))
    return HookTarget(cmd)  # an explicit command is used for every event


def is_bash_client(command: str) -> bool:
    """True for a command running our bash hook client."""
    try:
        words = shlex.split(command)
    except ValueError:
        return False
    return any(os.path.basename(w) == "hookrun.sh" for w in words)


def install_hooks(agent: str, directory: Path, *, remove: bool = False, command: str | None = None) -> InstallResult:
    """Merge (or, with `remove`, take out) our hook entries in `agent`'s settings under `directory`.

    Args:
        agent: `claude`, `codex` or `gemini`.
        directory: The project folder whose settings file is edited.
        remove: Remove our entries instead of adding them.
        command: The hook command for every event (default: the lean client by absolute path,
            and for Claude Code http hooks to the workspace's sidecar).

    Returns:
        The file and the events changed (the file is not written when nothing changed), and
        what the agent still needs.

    Raises:
        InvalidParamsError: unknown agent, or a settings file that is not valid JSON of the
            documented shape (left untouched).
    """
    if agent not in AGENTS:
        raise InvalidParamsError(f"Unknown agent {agent!r}; choose one of {', '.join(sorted(AGENTS))}.")
    path = settings_path(agent, directory)
    data = _load(path)
    result = InstallResult(path)
    legacy = directory.joinpath(*LEGACY_SETTINGS[agent]) if agent in LEGACY_SETTINGS else None
    legacy_data = _load(legacy) if legacy is not None else {}
    moved = remove_hooks(legacy_data, agent)  # ours do not belong in a committed file
    if remove:
        result.removed = sorted(set(remove_hooks(data, agent)) | set(moved))
    else:
        result.added, result.updated = merge_hooks(data, agent, _target(agent, directory, command))
        result.notes = next_steps(agent, directory)
        if moved:
            assert legacy is not None
            result.notes.insert(0, f"Moved shadowpoint's entries out of {legacy} (a file meant to be committed).")
    if result.changed:
        _write(path, data, private=agent == "claude")
    if moved and legacy is not None:
        _write(legacy, legacy_data, private=False)
    return result
