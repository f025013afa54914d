"""The sidecar's input and signals (PROTOCOL.md 1.1 "Errors and signals").

- No input ends the process: deep nesting, huge lines, bytes that are not UTF-8, JSON that
  is not a request object (a batch array included) are answered with -32700 or -32600 and
  the sidecar keeps serving.
- SIGTERM / SIGINT: every request already written to the sidecar's stdin is answered,
  commits included (checked with the git CLI), no later one is taken, and the exit status is
  0. The signal is aimed by construction: the sidecar is stopped (SIGSTOP) while the last
  requests are written to its pipe, so they are surely unread when the signal arrives.
"""

from __future__ import annotations

import io
import json
import os
import random
import signal
from pathlib import Path
from typing import Any

import pytest

import shadowpoint.sidecar.server as server_module
from shadowpoint.config import load_settings
from tests.conftest import make_tree
from tests.faults.support import git, shadow_git_dir, start_sidecar
from tests.rpc import RpcError, SidecarProcess

PARSE_OR_INVALID = (-32700, -32600)


def _write_raw(sc: SidecarProcess, line: bytes) -> None:
    assert sc.proc.stdin is not None
    sc.proc.stdin.write(line + b"\n")
    sc.proc.stdin.flush()


def _errors(sc: SidecarProcess) -> list[dict[str, Any]]:
    with sc._cond:
        return [m for m in sc.notifications if "error" in m]


def _fuzz_lines() -> list[bytes]:
    rng = random.Random(14)
    deep = 1000
    lines = [
        b"[" * deep + b"]" * deep,  # the 2 KB line of the report
        b'{"a":' * 5000 + b"1" + b"}" * 5000,
        b'{"jsonrpc":"2.0","id":1,"method":"sidecar/status","params":' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        b"x" * (8 * 1024 * 1024),  # a huge line
        b"\xff\xfe\x80 not utf-8 {",
        b'{"jsonrpc":"2.0","id":' + b"[" * 900 + b"]" * 900 + b',"method":"x"}',  # parses; a structure as id
        b'{"jsonrpc":"2.0","id":NaN,"method":"x"}',
        b'{"jsonrpc":"2.0","id":{"a":1},"method":"x"}',
        b"5", b'"a string"', b"null", b"true", b"[]",
        b'[{"jsonrpc":"2.0","id":8,"method":"sidecar/status"}]',  # a batch
        b'{"jsonrpc":"1.0","method":"x"}', b'{"method":5}', b"{}",
    ]
    for _ in range(40):
        lines.append(bytes(rng.choice([b for b in range(256) if b != 0x0A]) for _ in range(rng.randint(1, 300))))
    return [line for line in lines if line.strip()]


def test_no_input_ends_the_sidecar(tmp_path: Path) -> None:
    root = make_tree(tmp_path / "work" / "proj", {"a.txt": "a\n"})
    sc = start_sidecar(root, "t", ts=1)
    try:
        for line in _fuzz_lines():
            before = len(_errors(sc))
            status = sc.call("sidecar/status")  # answered after the fuzz line: the process lives on
            assert status["pid"] == sc.proc.pid
            _write_raw(sc, line)
            sc.call("sidecar/status")
            errors = _errors(sc)[before:]
            assert len(errors) == 1, f"one error answer for {line[:60]!r}: {errors}"
            assert errors[0]["id"] is None and errors[0]["error"]["code"] in PARSE_OR_INVALID, errors[0]
        # a request with a method name that is not UTF-8 is answered by its id
        _write_raw(sc, b'{"jsonrpc":"2.0","id":4242,"method":"\xff\xfe"}')
        with pytest.raises(RpcError) as err:
            sc.wait(4242)
        assert err.value.error["code"] == -32601
        # deep params that parse: refused, and the engine stays as it was
        deep_settings: Any = []
        for _ in range(400):
            deep_settings = [deep_settings]
        with pytest.raises(RpcError) as err:
            sc.call("initialize", {"roots": [str(root)], "settings": {"watcher": deep_settings}})
        assert err.value.kind in ("invalid_params", "internal"), err.value.error
        assert sc.call("checkpoint/list", {"taskId": "t"})["state"] == "ready"
    finally:
        sc.close()
    assert sc.proc.returncode == 0


def test_a_line_over_the_limit_is_an_invalid_request(monkeypatch: pytest.MonkeyPatch) -> None:
    """In-process (a small limit stands for 64 MiB): the long line is dropped whole, the next
    line is read as usual, also when the long line is cut across reads."""
    monkeypatch.setattr(server_module, "MAX_LINE_BYTES", 100)
    status = json.dumps({"jsonrpc": "2.0", "id": 2, "method": "sidecar/status"}).encode()
    data = b"y" * 250 + b"\n" + status + b"\n" + b'{"jsonrpc":"2.0","id":3,' + b" " * 200 + b'"method":"x"}'
    out = io.BytesIO()
    server = server_module.Server(io.BytesIO(), out, load_settings())
    # fed in pieces of 7 bytes: lines cut across reads
    assert server.serve(data[i:i + 7] for i in range(0, len(data), 7)) == 0
    answers = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [a.get("id") for a in answers] == [None, 2, None]
    assert answers[0]["error"]["code"] == -32600 and answers[2]["error"]["code"] == -32600
    assert answers[1]["result"]["pid"] == os.getpid()


# ---- signals ---------------------------------------------------------------------------------------


def _send_round(sc: SidecarProcess, i: int) -> int:
    """Pipeline one edit round naming f{i}.txt; returns the id of its round/end."""
    path = f"f{i:02d}.txt"
    for method in ("round/begin", "tool/begin", "tool/end"):
        params: dict[str, Any] = {"taskId": "t"}
        if method != "round/begin":
            params.update(tool="write_to_file", kind="edit", paths=[path])
        sc.send(method, params)
    return sc.send("round/end", {"taskId": "t", "ts": 100 + i})


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_answers_every_request_already_written(tmp_path: Path, docs: Path, signum: int) -> None:
    rounds = 12
    root = make_tree(tmp_path / "work" / "proj", {f"f{i:02d}.txt": f"base {i}\n" for i in range(rounds)})
    git_dir = shadow_git_dir(docs, root)
    sc = start_sidecar(root, "t", ts=1)
    make_tree(root, {f"f{i:02d}.txt": f"round {i}\n" for i in range(rounds)})  # round i stages f{i}
    ends = [_send_round(sc, i) for i in range(6)]
    fourth = sc.wait(ends[3])["checkpoint"]["hash"]  # rounds 5 and 6 may still be running or queued
    os.kill(sc.proc.pid, signal.SIGSTOP)
    try:
        ends += [_send_round(sc, i) for i in range(6, rounds)]  # written while it cannot read
        os.kill(sc.proc.pid, signum)
    finally:
        os.kill(sc.proc.pid, signal.SIGCONT)
    # stdin stays open: the sidecar ends by itself once the requests it had are answered
    assert sc.proc.wait(timeout=300) == 0, bytes(sc.stderr[-4000:])
    with sc._cond:
        unanswered = set(range(ends[0] - 3, ends[-1] + 1)) - {ends[3]} - set(sc._answers)
    assert not unanswered, f"every request written before the signal is answered: {sorted(unanswered)}"
    hashes = [fourth if mid == ends[3] else sc.wait(mid, timeout=5)["checkpoint"]["hash"] for mid in ends]
    sc._close_pipes()
    assert len(set(hashes)) == rounds, "every round was answered with its own checkpoint"
    ref = git(git_dir, "for-each-ref", "--format=%(objectname)", "refs/shadowpoint/tasks/t").stdout.decode().strip()
    assert ref == hashes[-1]
    log = git(git_dir, "rev-list", "--first-parent", ref).stdout.decode().split()
    assert log[:rounds] == hashes[::-1], "the task's history is the 12 rounds, newest first"
    for i, commit in enumerate(hashes):
        names = git(git_dir, "ls-tree", "--name-only", commit).stdout.decode().split()
        assert names == [f"f{j:02d}.txt" for j in range(rounds)]
        for j in range(rounds):
            want = f"round {j}\n" if j <= i else f"base {j}\n"
            assert git(git_dir, "cat-file", "blob", f"{commit}:f{j:02d}.txt").stdout == want.encode()
