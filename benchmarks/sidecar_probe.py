"""Peak memory of the sidecar: `shadowpoint serve` driven over JSON-RPC on stdio.

Starts the sidecar as a subprocess with its own docs dir, builds a task's baseline,
runs a few edit and command rounds and a compare, then reads the kernel's high-water
mark of its resident set (`VmHWM`) before shutting it down. Linux only (`/proc`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any


class SidecarError(RuntimeError):
    """The sidecar answered with an error or went away."""


@dataclass(frozen=True, slots=True)
class SidecarStats:
    peak_rss_mb: float
    baseline_s: float
    rounds: int
    # the timed 1-file edit rounds (`timed_rounds`), each as the client saw its four requests
    round_s: tuple[float, ...] = ()


# An agent's model turn between two timed rounds: the sidecar idles between rounds as it would.
MODEL_TURN_S = 0.02


class RpcClient:
    """Newline-delimited JSON-RPC 2.0 over a child's stdin/stdout."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdin is not None and proc.stdout is not None
        self.proc = proc
        self._in: IO[bytes] = proc.stdin
        self._out: IO[bytes] = proc.stdout
        self._next_id = 0

    def call(self, method: str, params: dict[str, Any] | None = None) -> Any:
        self._next_id += 1
        msg_id = self._next_id
        msg = {"jsonrpc": "2.0", "id": msg_id, "method": method, "params": params or {}}
        self._in.write(json.dumps(msg).encode() + b"\n")
        self._in.flush()
        while True:
            line = self._out.readline()
            if not line:
                raise SidecarError(f"sidecar closed its output during {method} (exit {self.proc.poll()})")
            reply = json.loads(line)
            if reply.get("id") != msg_id:
                continue  # a notification, or the answer to another request
            if "error" in reply:
                raise SidecarError(f"{method}: {reply['error']}")
            return reply.get("result")


def wait_for_collections(log_file: Path, timeout_s: float = 900.0) -> bool:
    """Until every collection the sidecar logged starting (`storage.collect_started`) logged
    its end; False when one has not ended within `timeout_s`. A sidecar's first upkeep
    collection starts after its 25th checkpoint (on a big shadow repo) and runs beside the
    rounds: its memory is part of the sidecar's peak, on a fast host and a slow one alike."""
    ends = ("storage.collected", "storage.collect_failed", "storage.collect_stopped", "storage.collect_deferred")
    deadline = time.monotonic() + timeout_s
    while True:
        with open(log_file, encoding="utf-8", errors="replace") as fh:
            text = fh.read()
        if text.count("storage.collect_started") <= sum(text.count(end) for end in ends):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)


def sidecar_env(docs_dir: Path, settings: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a benchmark's sidecar: its own docs dir, no config file, no limit on
    the baseline's time, and none of the caller's `SHADOWPOINT_*` or `GIT_*` variables."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SHADOWPOINT_", "GIT_"))}
    env.update({
        "SHADOWPOINT_DOCS_DIR": str(docs_dir),
        "SHADOWPOINT_CONFIG_FILE": str(docs_dir / "no-config.toml"),
        "SHADOWPOINT_INIT_WARN_S": "86400",
        "SHADOWPOINT_INIT_TIMEOUT_S": "86400",
        **(settings or {}),
    })
    return env


def wait_ready(rpc: RpcClient, task: str) -> None:
    """Wait until `task`'s baseline is ready.

    Raises:
        SidecarError: the baseline failed.
    """
    while True:
        listing = rpc.call("checkpoint/list", {"taskId": task})
        if listing["state"] == "ready":
            return
        if listing["state"] != "initializing":
            raise SidecarError(f"baseline failed: {listing.get('error')}")
        time.sleep(0.01)


def read_vm_hwm_mb(pid: int) -> float:
    """The peak resident set size of `pid` so far, in MB (VmHWM from /proc)."""
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    raise SidecarError(f"no VmHWM for process {pid}")


def is_supported() -> bool:
    return sys.platform.startswith("linux") and os.path.exists("/proc/self/status")


def measure_sidecar(
    root: Path,
    docs_dir: Path,
    edit_paths: Sequence[str],
    touch: Callable[[Sequence[str], str], None],
    log_file: Path,
    started: Callable[[int], None] | None = None,
    settings: Mapping[str, str] | None = None,
    before_shutdown: Callable[[], None] | None = None,
    timed_rounds: int = 0,
) -> SidecarStats:
    """Run the sidecar through a baseline, rounds and a compare; return its peak RSS.

    Args:
        root: the workspace root.
        docs_dir: an empty docs dir for this sidecar (its own shadow repo).
        edit_paths: root-relative files the rounds edit.
        touch: writes new content into the given paths (the benchmark's edit).
        log_file: where the sidecar's stderr goes.
        started: called with the sidecar's pid once it runs (e.g. to sample its memory).
        settings: more `SHADOWPOINT_*` variables for the sidecar.
        before_shutdown: called after the rounds and the compare, before the peak is read
            (e.g. to wait for a verification pass).
        timed_rounds: then this many 1-file edit rounds of `edit_paths[0]`, `MODEL_TURN_S`
            apart, each timed at the client (round/begin and tool/begin, then tool/end and
            round/end; the edit itself is not timed): `SidecarStats.round_s`.
    """
    env = sidecar_env(docs_dir, settings)
    docs_dir.mkdir(parents=True, exist_ok=True)
    with open(log_file, "wb") as err:
        proc = subprocess.Popen([sys.executable, "-m", "shadowpoint", "serve"], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=err, env=env, cwd=root)
        if started is not None:
            started(proc.pid)
        round_s: list[float] = []
        try:
            rpc = RpcClient(proc)
            rpc.call("initialize", {"roots": [str(root)], "client": {"name": "shadowpoint-bench", "version": "1"}})
            task = "bench-sidecar"
            ts = 1_000
            start = time.perf_counter()
            rpc.call("task/start", {"taskId": task, "ts": ts})
            wait_ready(rpc, task)
            baseline_s = time.perf_counter() - start
            base_ts = ts
            rounds = 0
            for i, path in enumerate(edit_paths[:3]):
                ts += 1_000
                abs_path = str(root / path)
                rpc.call("round/begin", {"taskId": task})
                rpc.call("tool/begin", {"taskId": task, "tool": "write_to_file", "kind": "edit", "paths": [abs_path]})
                touch([path], f"sidecar-{i}")
                rpc.call("tool/end", {"taskId": task, "tool": "write_to_file", "paths": [abs_path]})
                rpc.call("round/end", {"taskId": task, "ts": ts})
                rounds += 1
            for i in range(2):
                ts += 1_000
                rpc.call("round/begin", {"taskId": task})
                rpc.call("tool/begin", {"taskId": task, "tool": "execute_command", "kind": "command"})
                touch(list(edit_paths[-1:]), f"sidecar-cmd-{i}")
                rpc.call("tool/end", {"taskId": task, "tool": "execute_command"})
                rpc.call("round/end", {"taskId": task, "ts": ts})
                rounds += 1
            rpc.call("checkpoint/diff", {"taskId": task, "from": base_ts})
            edit = {"taskId": task, "tool": "write_to_file", "kind": "edit", "paths": [str(root / edit_paths[0])]}
            for i in range(timed_rounds):
                time.sleep(MODEL_TURN_S)
                ts += 1_000
                t0 = time.perf_counter()
                rpc.call("round/begin", {"taskId": task})
                rpc.call("tool/begin", edit)
                t1 = time.perf_counter()
                touch(edit_paths[:1], f"sidecar-timed-{i}")
                t2 = time.perf_counter()
                rpc.call("tool/end", edit)
                rpc.call("round/end", {"taskId": task, "ts": ts})
                round_s.append((t1 - t0) + (time.perf_counter() - t2))
                rounds += 1
            if before_shutdown is not None:
                before_shutdown()
            peak = read_vm_hwm_mb(proc.pid)
            rpc.call("shutdown", {})
        except SidecarError as exc:
            err.flush()
            lines = log_file.read_bytes()[-4000:].decode(errors="replace").strip().splitlines()
            last = lines[-1] if lines else "(nothing on stderr)"
            raise SidecarError(f"{exc}: {last} (sidecar log: {log_file})") from exc
        finally:
            if proc.stdin is not None:
                proc.stdin.close()
            try:
                proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()
    return SidecarStats(peak, baseline_s, rounds, tuple(round_s))
