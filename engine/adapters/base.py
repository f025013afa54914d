"""What every agent adapter shares: the `Call` plan a hook payload turns into, and
`run_hook`, which sends that plan to the workspace's socket sidecar.

An adapter (`claude.py`, `codex.py`, `gemini.py`) is a pure function from a hook payload
to a `HookPlan`; `run_hook` (called by `shadowpoint hook AGENT`, in a short-lived process
on its main thread) fills in timestamps, starts or reuses the sidecar, sends the calls and
waits only where the agent must wait (the baseline barrier before a mutating tool). It
never raises and never writes to stdout: failures go to a log file under the state dir.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import time
import traceback
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

# The sidecar a hook starts exits after this long without a connection.
HOOK_SIDECAR_IDLE_S = 30 * 60.0
# A barrier wait (baseline of a large workspace) may take long; the agent's hook timeout
# (set by `install-hooks`) bounds it first.
BARRIER_TIMEOUT_S = 600.0
_LOG_MAX_BYTES = 1 << 20


@dataclass(frozen=True, slots=True)
class Call:
    """One protocol request of a hook (without `taskId`, which the runner adds).

    Attributes:
        method: The protocol method (`tool/begin`, `round/end`, …).
        params: Its parameters.
        needs_ts: The runner adds a fresh `ts` (milliseconds, strictly increasing per task).
        wait: The hook waits for the answer before the agent goes on (a mutating tool's barrier).
    """

    method: str
    params: dict[str, Any] = field(default_factory=dict)
    needs_ts: bool = False
    wait: bool = False


@dataclass(frozen=True, slots=True)
class HookPlan:
    """What one hook invocation asks of the sidecar.

    Attributes:
        event: The agent's event name (for the log).
        task_id: The task (the agent's session id), None when the payload has none.
        cwd: The agent's working directory from the payload.
        calls: The requests, in order; empty when the event needs nothing (a read tool).
    """

    event: str
    task_id: str | None
    cwd: str | None
    calls: list[Call]


Adapter = Callable[[Mapping[str, Any]], HookPlan]


def absolute(path: Any, cwd: str | None) -> str | None:
    """A tool's path made absolute against the agent's cwd (None for a non-string)."""
    if not isinstance(path, str) or not path:
        return None
    if os.path.isabs(path) or not cwd:
        return path
    return os.path.normpath(os.path.join(cwd, path))


def tool_calls(tool: str, kind: str | None, paths: list[str], *, ended: bool, ok: bool = True) -> list[Call]:
    """`tool/begin` (a barrier unless the tool only reads) or `tool/end`; nothing for read tools."""
    if kind == "read":
        return []
    params: dict[str, Any] = {"tool": tool}
    if kind is not None:
        params["kind"] = kind
    if paths:
        params["paths"] = paths
    if ended:
        params["ok"] = ok
        return [Call("tool/end", params)]
    return [Call("tool/begin", params, wait=True)]


Classifier = Callable[[str, Mapping[str, Any], "str | None"], "tuple[str | None, list[str]]"]


def prompt_calls(payload: Mapping[str, Any]) -> list[Call]:
    """The user's prompt as a timeline message (every agent's "prompt submitted" event)."""
    params: dict[str, Any] = {"role": "user"}
    prompt = payload.get("prompt")
    if isinstance(prompt, str):
        params["text"] = prompt
    return [Call("message/add", params, needs_ts=True)]


def tool_event_calls(payload: Mapping[str, Any], classify: Classifier, *, ended: bool, ok: bool = True) -> list[Call]:
    """tool/begin or tool/end for a tool event, its kind and paths from the agent's `classify`."""
    tool = payload_str(payload, "tool_name") or "unknown"
    tool_input = payload.get("tool_input")
    kind, paths = classify(tool, tool_input if isinstance(tool_input, Mapping) else {}, payload_str(payload, "cwd"))
    return tool_calls(tool, kind, paths, ended=ended, ok=ok)


def finish_calls() -> list[Call]:
    """round/end first (it closes a round whose end event never came), then the completion."""
    return [Call("round/end", needs_ts=True), Call("task/complete", needs_ts=True)]


@dataclass(frozen=True, slots=True)
class EventNames:
    """How one agent names the round-boundary events (None: the agent has no such event)."""

    prompt: str
    tool_begin: str
    tool_ends: tuple[str, ...]
    finish: str
    compact: str
    round_end: str | None = None
    start: str = "SessionStart"


def plan_events(payload: Mapping[str, Any], names: EventNames, classify: Classifier,
                tool_ok: Callable[[str, Mapping[str, Any]], bool]) -> HookPlan:
    """Map one hook payload to protocol calls through the agent's event names.

    start → task/start; prompt → message/add (user); tool_begin → tool/begin (a barrier for
    mutating tools); tool_ends → tool/end (`tool_ok(event, payload)` says whether it
    succeeded); round_end → round/end; finish → round/end + task/complete; compact →
    task/compacted.
    """
    event = payload_str(payload, "hook_event_name") or ""
    calls: list[Call] = []
    if event == names.start:
        calls = [Call("task/start", needs_ts=True)]
    elif event == names.prompt:
        calls = prompt_calls(payload)
    elif event == names.tool_begin or event in names.tool_ends:
        ended = event != names.tool_begin
        calls = tool_event_calls(payload, classify, ended=ended, ok=not ended or tool_ok(event, payload))
    elif event == names.round_end:
        calls = [Call("round/end", needs_ts=True)]
    elif event == names.finish:
        calls = finish_calls()
    elif event == names.compact:
        calls = [Call("task/compacted", needs_ts=True)]
    return HookPlan(event, payload_str(payload, "session_id"), payload_str(payload, "cwd"), calls)


def payload_str(payload: Mapping[str, Any], key: str) -> str | None:
    """`payload[key]` if it is a non-empty string, else None."""
    value = payload.get(key)
    return value if isinstance(value, str) and value else None


# ---------------------------------------------------------------------------- state


def _session_file(state: Path, agent: str, task_id: str) -> Path:
    digest = hashlib.sha256(task_id.encode("utf-8", "surrogateescape")).hexdigest()[:24]
    return state / "sessions" / f"{agent}-{digest}.json"


@contextlib.contextmanager
def _session_state(state: Path, agent: str, task_id: str) -> Iterator[dict[str, Any]]:
    """The per-session state (root, last ts), read and written under a file lock."""
    path = _session_file(state, agent, task_id)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path.with_suffix(".lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        data: dict[str, Any] = {}
        with contextlib.suppress(OSError, ValueError):
            loaded = json.loads(path.read_text(encoding="utf-8"))
            if isinstance(loaded, dict):
                data = loaded
        yield data
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data), encoding="utf-8")
        os.replace(tmp, path)
    finally:
        os.close(fd)


def _workspace_root(plan: HookPlan, env: Mapping[str, str], project_vars: tuple[str, ...]) -> str | None:
    for var in project_vars:
        value = env.get(var)
        if value and os.path.isdir(value):
            return value
    return plan.cwd


def hook_log(state: Path, agent: str, message: str) -> None:
    """Append one line to the hooks' log (rotated at 1 MiB); never raises."""
    with contextlib.suppress(Exception):
        state.mkdir(parents=True, exist_ok=True, mode=0o700)
        path = state / "hooks.log"
        with contextlib.suppress(OSError):
            if path.stat().st_size > _LOG_MAX_BYTES:
                os.replace(path, path.with_suffix(".log.1"))
        stamp = datetime.now(UTC).isoformat(timespec="milliseconds")
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(f"{stamp} pid={os.getpid()} {agent}: {message}\n")


# ---------------------------------------------------------------------------- runner


def run_hook(agent: str, adapter: Adapter, raw: bytes, *, env: Mapping[str, str] | None = None,
             project_vars: tuple[str, ...] = ()) -> int:
    """Turn one hook payload into requests to the workspace's sidecar; always returns 0.

    Args:
        agent: The agent's name (`claude`, `codex`, `gemini`), for state and logs.
        adapter: Maps the payload to a `HookPlan`.
        raw: The payload as read from stdin.
        env: The environment (the agent's project-dir variables); default `os.environ`.
        project_vars: Environment variables naming the project root, tried before the cwd.

    Returns:
        0, whatever happened: a checkpoint problem must never stop the agent.
    """
    from shadowpoint.sidecar.client import state_dir

    env = os.environ if env is None else env
    state = state_dir()
    started = time.monotonic()
    try:
        payload = json.loads(raw.decode("utf-8", "surrogateescape") or "{}")
        if not isinstance(payload, dict):
            raise ValueError("the hook payload is not a JSON object")
        plan = adapter(payload)
        if not plan.calls:
            return 0
        if plan.task_id is None:
            raise ValueError(f"{plan.event}: the payload has no session_id")
        _send_plan(agent, plan, state, env, project_vars)
        if os.environ.get("SHADOWPOINT_HOOK_TRACE"):
            hook_log(state, agent, f"{plan.event} ok in {(time.monotonic() - started) * 1e3:.0f} ms")
    except Exception as exc:
        hook_log(state, agent, f"failed: {exc!r}\n{traceback.format_exc()}")
    return 0


def _send_plan(agent: str, plan: HookPlan, state: Path, env: Mapping[str, str],
               project_vars: tuple[str, ...]) -> None:
    from shadowpoint import __version__
    from shadowpoint.sidecar.client import SidecarError, ensure_sidecar

    assert plan.task_id is not None
    calls = list(plan.calls)
    if calls[0].method != "task/start":
        # A session whose SessionStart hook was missed (installed mid-session) still gets a task.
        calls.insert(0, Call("task/start", needs_ts=True))
    with _session_state(state, agent, plan.task_id) as session:
        root = session.get("root") or _workspace_root(plan, env, project_vars)
        if not root:
            raise ValueError(f"{plan.event}: no workspace (no cwd in the payload)")
        session["root"] = root
        last = int(session.get("lastTs", 0))
        stamped = []
        for call in calls:
            params = {"taskId": plan.task_id, **call.params}
            if call.needs_ts:
                # Integer ms, strictly increasing per task even within one millisecond.
                last = max(time.time_ns() // 1_000_000, last + 1)
                params["ts"] = last
            stamped.append((call, params))
        session["lastTs"] = last
    client = ensure_sidecar(root, idle_timeout_s=HOOK_SIDECAR_IDLE_S, log_file=state / "sidecar.log",
                            timeout_s=BARRIER_TIMEOUT_S)
    with client:
        init = client.send("initialize", {"roots": [root], "client": {"name": f"shadowpoint-hook-{agent}",
                                                                      "version": __version__}})
        waits = []
        for call, params in stamped:
            msg_id = client.send(call.method, params)
            if call.wait:
                waits.append((call.method, msg_id))
        # Answered by the connection's reader once every request above is queued on its
        # task's worker: after this the next hook's requests cannot overtake ours.
        dispatched = client.send("sidecar/status")
        client.wait(init)
        client.wait(dispatched)
        for method, msg_id in waits:
            try:
                client.wait(msg_id)
            except SidecarError as exc:
                hook_log(state, agent, f"{plan.event}: {method} refused ({exc.kind}): {exc}")
