"""A small JSON-RPC 2.0 client for a real `shadowpoint serve` process over pipes (tests only)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast


class RpcError(Exception):
    def __init__(self, error: dict[str, Any]) -> None:
        super().__init__(error.get("message"))
        self.error = error
        self.kind = (error.get("data") or {}).get("kind")


class SidecarProcess:
    """`python -m shadowpoint serve` with pipelined requests and answers matched by id."""

    def __init__(self, env: dict[str, str] | None = None, cwd: Path | None = None,
                 preexec_fn: Callable[[], Any] | None = None, argv: list[str] | None = None) -> None:
        """`preexec_fn` runs in the child before the sidecar starts (resource limits for fault
        tests); `argv` replaces `python -m shadowpoint serve` (a fault-injecting launcher)."""
        self.proc = subprocess.Popen(
            argv or [sys.executable, "-m", "shadowpoint", "serve"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            env={**os.environ, **(env or {})}, cwd=cwd, start_new_session=True, preexec_fn=preexec_fn,
        )
        self._next = 1
        self._answers: dict[int, dict[str, Any]] = {}
        self.notifications: list[dict[str, Any]] = []
        self._cond = threading.Condition()
        self.stderr = bytearray()
        self._stdout_ended = False  # the reader saw the end of stdout: every answer is in
        self._readers = [threading.Thread(target=self._read, daemon=True),
                         threading.Thread(target=self._read_err, daemon=True)]
        for reader in self._readers:
            reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            msg = json.loads(line)
            with self._cond:
                if "id" in msg and msg["id"] is not None:
                    self._answers[msg["id"]] = msg
                else:
                    self.notifications.append(msg)
                self._cond.notify_all()
        with self._cond:
            self._stdout_ended = True
            self._cond.notify_all()

    def _read_err(self) -> None:
        assert self.proc.stderr is not None
        # stderr=PIPE, binary and buffered: Popen opens it with open(fd, "rb"), a BufferedReader
        stderr = cast(io.BufferedReader, self.proc.stderr)
        for chunk in iter(lambda: stderr.read1(65536), b""):
            self.stderr += chunk

    def send(self, method: str, params: dict[str, Any] | None = None) -> int:
        mid = self._next
        self._next += 1
        msg = {"jsonrpc": "2.0", "id": mid, "method": method, "params": params or {}}
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps(msg) + "\n").encode())
        self.proc.stdin.flush()
        return mid

    def wait(self, mid: int, timeout: float = 120) -> Any:
        deadline = time.monotonic() + timeout
        with self._cond:
            while mid not in self._answers:
                left = deadline - time.monotonic()
                if left <= 0 or (self._stdout_ended and self.proc.poll() is not None):
                    raise AssertionError(f"no answer to request {mid}; stderr: {bytes(self.stderr[-4000:])!r}")
                self._cond.wait(min(left, 0.5))
            msg = self._answers.pop(mid)
        if "error" in msg:
            raise RpcError(msg["error"])
        return msg["result"]

    def call(self, method: str, params: dict[str, Any] | None = None, timeout: float = 120) -> Any:
        return self.wait(self.send(method, params), timeout)

    def kill(self) -> None:
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)
        self._close_pipes()

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.call("shutdown", timeout=60)
            finally:
                assert self.proc.stdin is not None
                self.proc.stdin.close()
                self.proc.wait(timeout=60)
        self._close_pipes()

    def _close_pipes(self) -> None:
        for reader in self._readers:  # they drain what is left, up to the end of the pipes
            reader.join(timeout=30)
        for pipe in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if pipe is not None:
                with contextlib.suppress(OSError, ValueError):
                    pipe.close()

    def wait_ready(self, task: str, timeout: float = 120) -> None:
        from tests.conftest import wait_for

        wait_for(lambda: self.call("checkpoint/list", {"taskId": task})["state"] == "ready",
                 "task never became ready", timeout, poll_s=0.05)
