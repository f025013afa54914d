"""The sidecar's `Host`: a round's request runs on the thread that read it when nothing else
is queued or running, and the order of a task's requests holds whichever thread runs them."""

from __future__ import annotations

import io
import json
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from shadowpoint.engine import Engine
from shadowpoint.sidecar.hook_endpoint import _HookConnection
from shadowpoint.sidecar.server import Host, Server
from tests.conftest import make_tree, wait_for

WAIT_S = 30.0  # a bound on waits for events that must come (never a measure of speed)


class _Answers:
    """An `_Answerer` that records results and the thread each request ran on."""

    def __init__(self) -> None:
        self.results: dict[Any, Any] = {}
        self.threads: dict[Any, threading.Thread] = {}
        self._lock = threading.Lock()

    def _answer(self, msg_id: Any, fn: Callable[[], Any]) -> None:
        result = fn()
        with self._lock:
            self.results[msg_id] = result
            self.threads[msg_id] = threading.current_thread()


@pytest.fixture
def host() -> Iterator[Host]:
    h = Host()
    try:
        yield h
    finally:
        h.stop_workers()


def _running_inline(host: Host, answers: _Answers, log: list[str], task_id: str,
                    name: str) -> tuple[threading.Thread, threading.Event]:
    """A request of `task_id` submitted inline from a thread of its own (another connection's
    reader), running once this returns: it logs "`name` start", blocks until the returned event
    is set, then logs "`name` end" and answers `name` (id 1)."""
    started, release = threading.Event(), threading.Event()

    def run() -> str:
        log.append(f"{name} start")
        started.set()
        assert release.wait(WAIT_S)
        log.append(f"{name} end")
        return name

    thread = threading.Thread(target=host.submit, args=(task_id, answers, 1, run), kwargs={"inline": True})
    thread.start()
    assert started.wait(WAIT_S)
    return thread, release


def test_a_request_runs_on_the_reading_thread_when_nothing_else_runs(host: Host) -> None:
    answers = _Answers()
    host.submit("t", answers, 1, lambda: "inline", inline=True)
    # answered before submit returned, on this thread
    assert answers.results == {1: "inline"} and answers.threads[1] is threading.current_thread()
    host.submit("t", answers, 2, lambda: "queued")  # not inline: the task's worker
    host.flush(WAIT_S)
    assert answers.results[2] == "queued" and answers.threads[2] is not threading.current_thread()
    assert host.status()["busy"] == 0


def test_a_tasks_request_waits_for_its_request_running_on_another_thread(host: Host) -> None:
    answers, log = _Answers(), list[str]()
    first, release = _running_inline(host, answers, log, "t", "1")

    def second() -> str:
        log.append("2")
        return "2"

    # another connection's request for the same task: queued (something runs), not run beside it
    host.submit("t", answers, 2, second, inline=True)
    assert log == ["1 start"] and answers.threads.get(1) is None
    release.set()
    first.join(WAIT_S)
    host.flush(WAIT_S)
    assert log == ["1 start", "1 end", "2"]
    assert answers.threads[1] is first and answers.threads[2] is not first


def test_another_tasks_request_goes_to_its_worker_while_one_runs(host: Host) -> None:
    answers, log = _Answers(), list[str]()
    first, release = _running_inline(host, answers, log, "t", "t")
    done = threading.Event()

    def other_task() -> str:
        done.set()
        return "u"

    host.submit("u", answers, 2, other_task, inline=True)
    assert done.wait(WAIT_S), "task u waited for task t's request"
    assert log == ["t start"]  # t's is still running
    release.set()
    first.join(WAIT_S)
    assert answers.results == {1: "t", 2: "u"}


def test_a_flush_waits_for_a_request_running_on_a_reading_thread(host: Host) -> None:
    answers, log = _Answers(), list[str]()
    host.submit("t", answers, 0, lambda: "worker made")  # the task has a worker for flush to mark
    host.flush(WAIT_S)
    first, release = _running_inline(host, answers, log, "t", "1")
    flushed = threading.Event()

    def flush() -> None:
        host.flush(WAIT_S)
        log.append("flushed")
        flushed.set()

    flusher = threading.Thread(target=flush)
    flusher.start()
    # a flush that did not wait would return at once, long before this
    assert not flushed.wait(0.5)
    release.set()
    first.join(WAIT_S)
    flusher.join(WAIT_S)
    assert log == ["1 start", "1 end", "flushed"]


@pytest.mark.parametrize("hooks", [False, True], ids=["stdio", "hook endpoint"])
def test_a_round_runs_on_the_reading_thread_only_where_the_caller_waits_for_it(
        workspace: Path, monkeypatch: pytest.MonkeyPatch, hooks: bool) -> None:
    # A stdio client waits for each answer: its round's requests run as they are read. The
    # hook endpoint queues a hook's calls under its lock and waits for few of them: they go to
    # the task's worker, as before.
    make_tree(workspace, {"a.txt": "a\n"})
    ran_on: list[threading.Thread] = []
    begin_round = Engine.begin_round

    def recording(self: Engine, task_id: str) -> int:
        ran_on.append(threading.current_thread())
        return begin_round(self, task_id)

    monkeypatch.setattr(Engine, "begin_round", recording)
    host = Host()
    conn: Server = _HookConnection(host) if hooks else Server(io.BytesIO(), io.BytesIO(), host=host)
    try:
        for i, (method, params) in enumerate([("initialize", {"roots": [str(workspace)]}),
                                               ("task/start", {"taskId": "t", "ts": 1})]):
            conn._handle_line(json.dumps({"jsonrpc": "2.0", "id": i, "method": method, "params": params}).encode())
        host.flush(WAIT_S)
        assert conn.engine is not None
        engine = conn.engine
        wait_for(lambda: engine.is_settled("t"), "the baseline was not built", WAIT_S)
        conn._handle_line(b'{"jsonrpc": "2.0", "id": 9, "method": "round/begin", "params": {"taskId": "t"}}')
        host.flush(WAIT_S)
        assert len(ran_on) == 1
        assert (ran_on[0] is threading.current_thread()) is not hooks
    finally:
        host.close()
