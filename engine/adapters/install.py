"""`shadowpoint install-hooks AGENT [DIR]`: merge our hook entries into an agent's settings file.

The user's own entries are never changed, reordered or duplicated: ours are separate
groups whose command is `… shadowpoint hook AGENT`, found again by that command for an
update or for `--remove`. Files: Claude Code `DIR/.claude/settings.json`, Codex CLI
`DIR/.codex/hooks.json`, Gemini CLI `DIR/.gemini/settings.json` (all the same
`hooks → event → [{matcher?, hooks: [{type: "command", command, timeout}]}]` shape). Runs on
the CLI's thread; writes atomically.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shadowpoint.adapters import AGENTS
from shadowpoint.errors import InvalidParamsError

SETTINGS_FILES = {"claude": (".claude", "settings.json"), "codex": (".codex", "hooks.json"),
                  "gemini": (".gemini", "settings.json")}
# Hook timeouts: the barrier before a mutating tool may wait for a large baseline.
_BARRIER_EVENTS = {"PreToolUse", "BeforeTool"}
_BARRIER_TIMEOUT_S = 600
_TIMEOUT_S = 60
_TIMEOUT_IN_MS = {"gemini"}


@dataclass(slots=True)
class InstallResult:
    """What `install_hooks` changed in one settings file."""

    path: Path
    added: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        """True when the file needs writing."""
        return bool(self.added or self.updated or self.removed)


def settings_path(agent: str, directory: Path) -> Path:
    """The project settings file of `agent` under `directory`."""
    folder, name = SETTINGS_FILES[agent]
    return directory / folder / name


def default_command(agent: str) -> str:
    """`<absolute path of shadowpoint> hook AGENT` (the agent may run hooks without our venv on PATH)."""
    exe = shutil.which("shadowpoint")
    argv0 = Path(sys.argv[0]) if sys.argv and sys.argv[0] else None
    if argv0 is not None and argv0.name == "shadowpoint" and argv0.exists():
        exe = str(argv0.resolve())
    if exe is None:
        return f"{shlex.quote(sys.executable)} -m shadowpoint hook {agent}"
    return f"{shlex.quote(os.path.abspath(exe))} hook {agent}"


def is_ours(command: Any, agent: str) -> bool:
    """True for a hook command that runs `shadowpoint hook AGENT` (any path to shadowpoint)."""
    if not isinstance(command, str):
        return False
    try:
        words = shlex.split(command)
    except ValueError:
        words = command.split()
    for i, word in enumerate(words):
        is_exe = os.path.basename(word) == "shadowpoint" or (word == "shadowpoint" and i > 0 and words[i - 1] == "-m")
        if is_exe and words[i + 1:i + 3] == ["hook", agent]:
            return True
    return False


def _timeout(agent: str, event: str) -> int:
    seconds = _BARRIER_TIMEOUT_S if event in _BARRIER_EVENTS else _TIMEOUT_S
    return seconds * 1000 if agent in _TIMEOUT_IN_MS else seconds


def _our_group(agent: str, event: str, matcher: str | None, command: str) -> dict[str, Any]:
    hook: dict[str, Any] = {"type": "command", "command": command, "timeout": _timeout(agent, event)}
    if agent == "gemini":
        hook["name"] = "shadowpoint"
    group: dict[str, Any] = {}
    if matcher is not None:
        group["matcher"] = matcher
    group["hooks"] = [hook]
    return group


def merge_hooks(settings: dict[str, Any], agent: str, command: str) -> tuple[list[str], list[str]]:
    """Add our group to every event of `agent` in `settings` (in place).

    An event that already has our command keeps it (its command and timeout brought up to
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
        wanted = _our_group(agent, event, matcher, command)
        mine = [g for g in groups if isinstance(g, dict) and any(
            isinstance(h, dict) and is_ours(h.get("command"), agent) for h in g.get("hooks") or [])]
        if not mine:
            groups.append(wanted)
            added.append(event)
            continue
        group = mine[0]
        for h in group.get("hooks") or []:
            if isinstance(h, dict) and is_ours(h.get("command"), agent):
                before = dict(h)
                h.update(wanted["hooks"][0])
                if h != before:
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
            kept = [h for h in inner if not (isinstance(h, dict) and is_ours(h.get("command"), agent))]
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


def _write(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        with contextlib.suppress(OSError):
            os.chmod(tmp, os.stat(path).st_mode & 0o777)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def install_hooks(agent: str, directory: Path, *, remove: bool = False, command: str | None = None) -> InstallResult:
    """Merge (or, with `remove`, take out) our hook entries in `agent`'s settings under `directory`.

    Args:
        agent: `claude`, `codex` or `gemini`.
        directory: The project folder whose settings file is edited.
        remove: Remove our entries instead of adding them.
        command: The hook command (default: this `shadowpoint` by absolute path).

    Returns:
        The file and the events changed; the file is not written when nothing changed.

    Raises:
        InvalidParamsError: unknown agent, or a settings file that is not valid JSON of the
            documented shape (left untouched).
    """
    if agent not in AGENTS:
        raise InvalidParamsError(f"Unknown agent {agent!r}; choose one of {', '.join(sorted(AGENTS))}.")
    path = settings_path(agent, directory)
    data = _load(path)
    result = InstallResult(path)
    if remove:
        result.removed = remove_hooks(data, agent)
    else:
        result.added, result.updated = merge_hooks(data, agent, command or default_command(agent))
    if result.changed:
        _write(path, data)
    return result
