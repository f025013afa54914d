"""Session-replay benchmark: `benchmarks/session_data.py`'s Claude Code session, replayed three ways.

`python -m benchmarks.session_replay [--files 10000] [--out DIR]`, on fresh generated trees (the
same seed for every mode; each a git repository with everything committed, as the session's
project is: it runs `git status`), in one run:

- `none`: the session's file changes only (no checkpoints): the reference wall time;
- `shadowpoint`: every hook Claude Code would send, through the real entry points as
  `install-hooks claude` writes them: SessionStart and UserPromptSubmit as the installed command
  (`sh -c` of the bash client `bash …/hookrun.sh claude PYTHON`, a subprocess each, which hands
  the start of the sidecar to `python -I -S …/hookrun.py`), every other event as an http hook
  to the workspace's sidecar on 127.0.0.1 (one keep-alive connection, as Claude Code keeps);
  tool events only where the installed matcher lets them through (read tools send nothing);
- `seed`: the seed engine's checkpoint per round, `git add . && git commit` with the git CLI
  (a baseline commit at session start, then one per batch).

Reports every hook's latency (median, p95, per transport), each mode's wall time, the
session's checkpoint overhead (mode minus `none`, also after the sidecar drained its queue),
writes JSON and an SVG chart. Runs on the main thread; the sidecar is a separate process.

`--model-s S` waits S seconds before each model response (every batch of tool calls, a
subagent's included, and each turn's closing answer), in every mode alike: the time a real
model takes, which the replay otherwise leaves out. The seed engine's commits run on the
agent's path whatever the model does; what it changes for ours is how much of the baseline
is still building when the first shell command comes. The default, 0, is the figure of record.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.rivals import SeedGit
from benchmarks.session_data import SESSION, Batch, Effect, ToolCall, all_calls
from benchmarks.treegen import generate, git_env, size_label

SEED = 7
SESSION_ID = "replay-0001"


@dataclass(slots=True)
class ModeResult:
    name: str
    wall_s: float
    drained_s: float = 0.0  # until the sidecar had written every checkpoint
    hooks: dict[str, list[float]] = field(default_factory=dict)  # transport → latencies (s)
    checkpoints: int = 0
    by_event: dict[str, list[float]] = field(default_factory=dict)
    first_barrier_s: float = 0.0
    kinds: list[str] = field(default_factory=list)
    floor: dict[str, list[float]] = field(default_factory=dict)


def _existing_sources(root: Path, count: int = 10) -> list[str]:
    """The `@N` files: the first `count` tracked source files of the tree, in sorted order."""
    found: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in ("node_modules", ".git", "generated"))
        for name in sorted(filenames):
            if name.endswith(".py"):
                found.append(os.path.relpath(os.path.join(dirpath, name), root))
                if len(found) == count:
                    return found
    raise RuntimeError(f"the tree has fewer than {count} .py files")


class Replayer:
    """Applies the session to one tree; `hook(event, fields)` is the mode's hook transport."""

    def __init__(self, root: Path, hook: Callable[[str, dict[str, Any]], None] | None = None,
                 matcher: re.Pattern[str] | None = None, on_batch: Callable[[], None] | None = None,
                 model_s: float = 0.0) -> None:
        self.root = root
        self.sources = _existing_sources(root)
        self.hook = hook
        self.matcher = matcher
        self.on_batch = on_batch
        self.model_s = model_s
        self._ids = iter(range(1, 10_000))

    def _model_responds(self) -> None:
        if self.model_s > 0:
            time.sleep(self.model_s)

    def path(self, rel: str) -> str:
        if rel.startswith("@"):
            return str(self.root / self.sources[int(rel[1:])])
        return str(self.root / rel)

    def _inputs(self, call: ToolCall) -> dict[str, str]:
        return {k: (self.path(v) if k == "file_path" else re.sub(r"@\d+", lambda m: self.path(m.group()), v))
                for k, v in call.input.items()}

    def apply(self, effect: Effect) -> None:
        target = Path(self.path(effect.path))
        if effect.op == "write":
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(effect.data)
        elif effect.op == "append":
            with open(target, "a", encoding="utf-8") as fh:
                fh.write(effect.data)
        elif effect.op == "delete":
            target.unlink()
        elif effect.op == "move":
            dest = Path(self.path(effect.data))
            dest.parent.mkdir(parents=True, exist_ok=True)
            os.replace(target, dest)

    def _send(self, event: str, **fields: Any) -> None:
        if self.hook is not None:
            self.hook(event, fields)

    def _tool_event(self, event: str, call: ToolCall, extra: dict[str, Any], tool_id: str, **more: Any) -> None:
        if self.matcher is None or self.matcher.search(call.tool):
            self._send(event, tool_name=call.tool, tool_input=self._inputs(call), tool_use_id=tool_id, **extra, **more)

    def batch(self, b: Batch, extra: dict[str, Any]) -> None:
        self._model_responds()
        for call in b.calls:
            tool_id = f"toolu_{next(self._ids):04d}"
            self._tool_event("PreToolUse", call, extra, tool_id)
            if call.subagent:
                sub = {"agent_id": "agent-1", "agent_type": "general-purpose"}
                for inner in call.subagent:
                    self.batch(inner, sub)
            for effect in call.effects:
                self.apply(effect)
            self._tool_event("PostToolUse", call, extra, tool_id, tool_response={"ok": True})
        self._send("PostToolBatch", tool_calls=[], **extra)
        if self.on_batch is not None and not extra:
            self.on_batch()

    def session(self) -> None:
        self._send("SessionStart", source="startup")
        for turn in SESSION:
            self._send("UserPromptSubmit", prompt=turn.prompt)
            for b in turn.batches:
                self.batch(b, {})
            self._model_responds()
            self._send("Stop", stop_hook_active=False, last_assistant_message="done")


# ---------------------------------------------------------------------------- modes


def _fresh_tree(base: Path, name: str, files: int) -> tuple[Path, list[str]]:
    """A generated tree (the same for every mode) and its nested repositories.

    The tree is a git repository with everything committed, as the replayed Claude Code
    session's project is (it runs `git status` and `git diff`): `git init`, `git add -A`, `git
    commit` with the benchmarks' git environment, untimed and identical for every mode.
    """
    root = base / name / "proj"
    stats = generate(root, files, SEED)
    git = ["git", "-c", "gc.auto=0", "-c", "advice.addEmbeddedRepo=false", "-c", "commit.gpgSign=false"]
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "the project before the session"]):
        subprocess.run([*git, *args], cwd=root, env=git_env(), check=True, capture_output=True)
    subprocess.run(["sync"], check=False)
    return root, list(stats.nested_repos)


def run_none(root: Path, model_s: float = 0.0) -> ModeResult:
    start = time.perf_counter()
    Replayer(root, model_s=model_s).session()
    return ModeResult("none", time.perf_counter() - start)


def run_seed(root: Path, git_dir: Path, nested: list[str], model_s: float = 0.0) -> ModeResult:
    seed = SeedGit(root, git_dir, nested)
    seed.init()
    rounds = 0

    def commit() -> None:
        nonlocal rounds
        seed.round()
        rounds += 1

    start = time.perf_counter()
    replay = Replayer(root, on_batch=commit, model_s=model_s)
    commit()  # the seed's baseline at session start
    replay.session()
    result = ModeResult("seed", time.perf_counter() - start, checkpoints=rounds)
    result.drained_s = result.wall_s
    return result


@dataclass(slots=True)
class _Ours:
    root: Path
    env: dict[str, str]
    port: int
    secret: str
    command: str  # the installed command of Claude Code's command events
    hooks: dict[str, list[float]] = field(default_factory=lambda: {"http": [], "command": [], "command-first": []})
    by_event: dict[str, list[float]] = field(default_factory=dict)
    first_barrier_s: float | None = None
    conn: http.client.HTTPConnection | None = None

    def send(self, event: str, fields: dict[str, Any]) -> None:
        payload = {"session_id": SESSION_ID, "transcript_path": str(self.root.parent / "t.jsonl"),
                   "cwd": str(self.root), "permission_mode": "bypassPermissions", "hook_event_name": event, **fields}
        body = json.dumps(payload).encode()
        start = time.perf_counter()
        if event in ("SessionStart", "UserPromptSubmit"):
            subprocess.run(["sh", "-c", self.command], input=body, env=self.env, cwd=self.root, check=True,
                           stdout=subprocess.DEVNULL)
            took = time.perf_counter() - start
            self.hooks["command-first" if event == "SessionStart" else "command"].append(took)
            self.by_event.setdefault(event, []).append(took)
            return
        if self.conn is None:
            self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=600)
        self.conn.request("POST", "/hook/claude", body=body, headers={
            "Content-Type": "application/json", "Authorization": f"Bearer {self.secret}"})
        resp = self.conn.getresponse()
        resp.read()
        if resp.status != 200:
            raise RuntimeError(f"{event}: the sidecar answered {resp.status}")
        took = time.perf_counter() - start
        if event == "PreToolUse" and self.first_barrier_s is None and fields.get("tool_name") != "Agent":
            self.first_barrier_s = took  # the first mutating tool waits for the baseline (SPEC §3)
            self.by_event.setdefault("first PreToolUse (baseline wait)", []).append(took)
            return
        self.hooks["http"].append(took)
        self.by_event.setdefault(event, []).append(took)


def _child_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def hook_floor(ours: _Ours, n: int = 25) -> dict[str, list[float]]:
    """What one hook invocation costs by itself, in the same run: the lean command and an http
    hook for an event that needs no checkpoint work (a Notification), and the bare interpreter.
    The processes' CPU time (user + system) is given too: it hardly depends on the machine's load."""
    bare, bare_cpu, lean_cpu = [], [], []
    for _ in range(n):
        start, cpu = time.perf_counter(), _child_cpu_s()
        subprocess.run([sys.executable, "-I", "-S", "-c", "pass"], check=True)
        bare.append(time.perf_counter() - start)
        bare_cpu.append(_child_cpu_s() - cpu)
    saved = ours.by_event, ours.hooks
    ours.by_event, ours.hooks = {}, {"http": [], "command": [], "command-first": []}
    fields = {"message": "waiting", "notification_type": "idle_prompt"}
    for _ in range(n):
        cpu = _child_cpu_s()
        ours.send("UserPromptSubmit", {"prompt": "p"})  # the lean command, the whole path
        lean_cpu.append(_child_cpu_s() - cpu)
        ours.send("Notification", fields)  # http, the whole path (the adapter plans no call)
    command, http_ = ours.hooks["command"], ours.hooks["http"]
    ours.by_event, ours.hooks = saved
    return {"python -I -S -c pass": bare, "python -I -S -c pass (cpu)": bare_cpu,
            "lean command (UserPromptSubmit)": command, "lean command (UserPromptSubmit, cpu)": lean_cpu,
            "http (Notification)": http_}


def _installed_command(root: Path, event: str) -> str:
    """Our command for Claude Code's `event`, as `install-hooks claude` wrote it."""
    from shadowpoint.adapters.install import installed_command

    command = installed_command("claude", root, event)
    if command is None:
        raise RuntimeError(f"install-hooks claude wrote no command for {event}")
    return command


def _wait_exit(pid: int, timeout_s: float = 30.0) -> None:
    """Until the process `pid` (not a child of this one) has exited, or `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.01)


def run_ours(root: Path, state: Path, model_s: float = 0.0) -> ModeResult:
    from shadowpoint.adapters import claude
    from shadowpoint.adapters.install import install_hooks
    from shadowpoint.sidecar.client import SidecarClient, socket_path
    from shadowpoint.sidecar.hook_endpoint import load_http_config

    env = {**os.environ, "XDG_RUNTIME_DIR": str(state / "run"), "XDG_STATE_HOME": str(state / "state"),
           "SHADOWPOINT_DOCS_DIR": str(state / "docs")}
    (state / "run").mkdir(parents=True, exist_ok=True)
    saved = {k: os.environ.get(k) for k in ("XDG_RUNTIME_DIR", "XDG_STATE_HOME", "SHADOWPOINT_DOCS_DIR")}
    os.environ.update({k: env[k] for k in saved})
    try:
        install_hooks("claude", root)
        config = load_http_config(str(root))
        assert config is not None
        ours = _Ours(root, env, config.port, config.secret, _installed_command(root, "UserPromptSubmit"))
        matcher = re.compile(claude.EVENTS["PreToolUse"] or ".*")
        start = time.perf_counter()
        Replayer(root, ours.send, matcher, model_s=model_s).session()
        wall = time.perf_counter() - start
        with SidecarClient(socket_path(root), timeout_s=600) as client:
            client.request("initialize", {"roots": [str(root)]})
            listed = client.request("checkpoint/list", {"taskId": SESSION_ID})  # queued behind every hook
            drained = time.perf_counter() - start
            floor = hook_floor(ours)
            pid = client.request("sidecar/status")["pid"]
            client.request("sidecar/stop")
        if ours.conn is not None:
            ours.conn.close()
        _wait_exit(pid)  # it writes to the state dir until it exits: removed after that
        kinds = [c["kind"] for c in listed["checkpoints"]]
        result = ModeResult("shadowpoint", wall, drained, ours.hooks, checkpoints=len(kinds))
        result.by_event = ours.by_event
        result.first_barrier_s = ours.first_barrier_s or 0.0
        result.kinds = kinds
        result.floor = floor
        return result
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


# ---------------------------------------------------------------------------- report


def _ms(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    ordered = sorted(values)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return {"count": len(values), "median_ms": round(statistics.median(values) * 1e3, 2),
            "p95_ms": round(p95 * 1e3, 2), "max_ms": round(ordered[-1] * 1e3, 2),
            "total_ms": round(sum(values) * 1e3, 1)}


def summarize(files: int, none: ModeResult, ours: ModeResult, seed: ModeResult, model_s: float = 0.0) -> dict[str, Any]:
    hooks = {k: _ms(v) for k, v in ours.hooks.items()}
    ours_overhead = ours.wall_s - none.wall_s
    seed_overhead = seed.wall_s - none.wall_s
    return {
        "tree": size_label(files), "files": files, "tool_calls": len(all_calls()), "turns": len(SESSION),
        "model_s": model_s,
        "wall_s": {"none": round(none.wall_s, 3), "shadowpoint": round(ours.wall_s, 3),
                   "shadowpoint_drained": round(ours.drained_s, 3), "seed": round(seed.wall_s, 3)},
        "overhead_s": {"shadowpoint": round(ours_overhead, 3),
                       "shadowpoint_drained": round(ours.drained_s - none.wall_s, 3),
                       "seed": round(seed_overhead, 3)},
        "overhead_ratio_seed_over_ours": round(seed_overhead / ours_overhead, 1) if ours_overhead > 0 else None,
        "overhead_without_first_edit_wait_s": {
            "shadowpoint": round(ours_overhead - ours.first_barrier_s, 3),
            "ratio_seed_over_ours": round(seed_overhead / (ours_overhead - ours.first_barrier_s), 1)
            if ours_overhead > ours.first_barrier_s else None},
        "hooks": hooks,
        "hooks_by_event": {k: _ms(v) for k, v in ours.by_event.items()},
        "hook_floor": {k: _ms(v) for k, v in ours.floor.items()},
        "checkpoints": {"shadowpoint": dict(Counter(ours.kinds)), "seed_commits": seed.checkpoints},
        "load_average": [round(x, 2) for x in os.getloadavg()], "cpus": os.cpu_count(),
    }


def svg_chart(summary: dict[str, Any], path: Path) -> None:
    """A bar chart of the session's checkpoint overhead per mode, and the hooks' medians (no deps)."""
    bars = [("shadowpoint (agent waits)", summary["overhead_s"]["shadowpoint"], "#1f77b4"),
            ("shadowpoint (drained)", summary["overhead_s"]["shadowpoint_drained"], "#6baed6"),
            ("seed: git add+commit per round", summary["overhead_s"]["seed"], "#d62728")]
    top = max(v for _, v, _ in bars) or 1.0
    width, bar_h, left = 720, 34, 250
    rows = []
    for i, (label, value, color) in enumerate(bars):
        y = 50 + i * (bar_h + 14)
        w = max(1.0, (width - left - 90) * value / top)
        rows.append(f'<text x="{left - 8}" y="{y + 22}" text-anchor="end" font-size="13">{label}</text>'
                    f'<rect x="{left}" y="{y}" width="{w:.1f}" height="{bar_h}" fill="{color}"/>'
                    f'<text x="{left + w + 6:.1f}" y="{y + 22}" font-size="13">{value:.2f} s</text>')
    hooks = summary["hooks"]
    note = (f'http hook median {hooks.get("http", {}).get("median_ms")} ms (p95 {hooks.get("http", {}).get("p95_ms")}),'
            f' command median {hooks.get("command", {}).get("median_ms")} ms')
    height = 50 + len(bars) * (bar_h + 14) + 40
    svg = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif">'
           f'<text x="10" y="24" font-size="15" font-weight="bold">Replayed Claude Code session '
           f'({summary["tool_calls"]} tool calls, {summary["turns"]} turns, {summary["tree"]} tree): '
           f'checkpoint overhead</text>{"".join(rows)}'
           f'<text x="10" y="{height - 14}" font-size="12">{note}</text></svg>')
    path.write_text(svg, encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=10_000)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    parser.add_argument("--keep", action="store_true", help="keep the trees")
    parser.add_argument("--model-s", type=float, default=0.0,
                        help="seconds the model takes for each response, in every mode (default 0)")
    args = parser.parse_args(argv)
    base = Path(tempfile.mkdtemp(prefix="sp-replay-"))
    try:
        trees = {name: _fresh_tree(base, name, args.files) for name in ("none", "ours", "seed")}
        print(f"trees ready under {base}", file=sys.stderr)
        # Each mode starts with nothing left to write back: the trees' generation and the seed
        # engine's 27 commits of a 100k-file index leave hundreds of MB of dirty pages, which the
        # kernel would otherwise write while the next mode runs, slowing it for the one before.
        os.sync()
        none = run_none(trees["none"][0], args.model_s)
        os.sync()
        seed = run_seed(trees["seed"][0], base / "seed-git" / ".git", trees["seed"][1], args.model_s)
        os.sync()
        ours = run_ours(trees["ours"][0], base / "ours-state", args.model_s)
        summary = summarize(args.files, none, ours, seed, args.model_s)
    finally:
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)
    args.out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y-%m-%d")
    model = f"-model{args.model_s:g}s" if args.model_s > 0 else ""
    out = args.out / f"session-replay-{summary['tree']}{model}-{stamp}.json"
    out.write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    svg_chart(summary, out.with_suffix(".svg"))
    print(json.dumps(summary, indent=2))
    print(f"wrote {out} and {out.with_suffix('.svg')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
