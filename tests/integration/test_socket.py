"""The socket sidecar (`shadowpoint serve --socket PATH`): one engine shared by every
connection, connections served concurrently, a private socket, and a clean exit on
SIGTERM, on `sidecar/stop` and after an idle period.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from shadowpoint.errors import SidecarError
from shadowpoint.sidecar.client import SidecarClient
from tests.conftest import make_tree, wait_for

SP = [sys.executable, "-m", "shadowpoint"]


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="sp-sock-"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


@contextlib.contextmanager
def server(path: Path, *extra: str, env: dict[str, str] | None = None,
           cwd: Path | None = None) -> Iterator[subprocess.Popen[bytes]]:
    """`shadowpoint serve --socket PATH`, once it accepts; stopped (SIGTERM, else killed) on exit
    when the test left it running."""
    proc = subprocess.Popen([*SP, "serve", "--socket", str(path), *extra], stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=cwd)
    try:
        connect(path, proc).close()
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for stream in (proc.stdout, proc.stderr):
            if stream:
                stream.close()


def connect(path: Path, proc: subprocess.Popen[bytes] | None = None) -> SidecarClient:

    def connected() -> SidecarClient | None:
        try:
            return SidecarClient(path, timeout_s=60)
        except SidecarError:
            assert proc is None or proc.poll() is None, proc.stderr.read() if proc and proc.stderr else ""
            return None

    client = wait_for(connected, "the sidecar did not come up", 30, poll_s=0.05)
    assert client is not None  # wait_for returns the first truthy value
    return client


def test_state_survives_between_connections_and_connections_run_concurrently(workspace: Path,
                                                                             sock_dir: Path) -> None:
    ws = make_tree(workspace, {"a.txt": "a\n"})
    path = sock_dir / "ws.sock"
    with server(path) as proc:
        assert path.stat().st_mode & 0o777 == 0o600
        with connect(path) as c1:
            c1.request("initialize", {"roots": [str(ws)]})
            assert c1.request("task/start", {"taskId": "t", "ts": 1})["state"] in ("initializing", "ready")
        idle = connect(path)  # stays open: the next connection must not wait for it
        try:
            with connect(path) as c2:
                c2.request("initialize", {"roots": [str(ws)]})
                c2.request("tool/begin", {"taskId": "t", "tool": "write_to_file", "paths": ["a.txt"]})
                (ws / "a.txt").write_text("b\n")
                c2.request("tool/end", {"taskId": "t", "tool": "write_to_file", "paths": ["a.txt"]})
                cp = c2.request("round/end", {"taskId": "t", "ts": 2})["checkpoint"]
                assert cp["kind"] == "round" and not cp["reused"]
                status = c2.request("sidecar/status")
                assert status["shared"] is True and status["connections"] == 2 and status["pid"] == proc.pid
        finally:
            idle.close()
        with connect(path) as c3:
            c3.request("initialize", {"roots": [str(ws)]})
            listed = c3.request("checkpoint/list", {"taskId": "t"})
            assert [c["kind"] for c in listed["checkpoints"]] == ["baseline", "round"]
            assert c3.request("checkpoint/diff", {"taskId": "t", "from": 1, "to": 2})["files"][0]["after"] == "b\n"

        second = subprocess.run([*SP, "serve", "--socket", str(path)], capture_output=True, text=True,
                                timeout=60, check=False)
        assert second.returncode == 41 and "already listens" in second.stderr
        assert proc.poll() is None, "the running sidecar was left alone"

        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    assert not path.exists()


def test_idle_timeout_and_stop_request_end_the_sidecar(workspace: Path, sock_dir: Path) -> None:
    make_tree(workspace, {"a.txt": "a\n"})
    idle_path = sock_dir / "idle.sock"
    with server(idle_path, "--idle-timeout", "1") as proc:
        with connect(idle_path) as c:
            c.request("initialize", {"roots": [str(workspace)]})
            c.request("task/start", {"taskId": "idle", "ts": 1})
        assert proc.wait(timeout=60) == 0
    assert not idle_path.exists()

    stop_path = sock_dir / "stop.sock"
    with server(stop_path) as proc:
        with connect(stop_path) as c:
            c.request("sidecar/stop")
        assert proc.wait(timeout=60) == 0
    assert not stop_path.exists()
    assert os.listdir(sock_dir) == []
