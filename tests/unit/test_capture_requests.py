"""`EarlyCapture`: requests from an edit tool's thread, answered by the scan or by its end."""

from __future__ import annotations

import threading

from shadowpoint.stage.early_capture import EarlyCapture, ScanHold
from shadowpoint.workspace import RepoPath


def test_requests_are_taken_once_and_answered_by_the_scanner() -> None:
    capture = EarlyCapture()
    req = capture.request([RepoPath("a.py"), RepoPath("b/c.py")])
    assert capture.has_pending and not req.done.is_set()
    assert capture.take() == [req] and not capture.has_pending
    assert capture.take() == []


def test_the_end_of_the_scan_answers_every_request_now_and_later() -> None:
    capture = EarlyCapture()
    pending = capture.request([RepoPath("a.py")])
    capture.finish()
    late = capture.request([RepoPath("b.py")])
    assert pending.done.is_set() and late.done.is_set() and not capture.has_pending


def test_a_held_scan_serves_requests_until_released() -> None:
    hold = ScanHold(after_files=3)
    capture = EarlyCapture(hold)
    served: list[tuple[RepoPath, ...]] = []

    def serve() -> None:
        for req in capture.take():
            served.append(req.paths)
            req.done.set()

    capture.hold_point(2, serve)  # before the hold: returns at once
    assert not hold.reached.is_set()
    scanner = threading.Thread(target=capture.hold_point, args=(3, serve))
    scanner.start()
    assert hold.reached.wait(30)
    req = capture.request([RepoPath("x.py")])
    assert req.done.wait(30), "a held scan still captures what an edit asks for"
    assert served == [(RepoPath("x.py"),)] and scanner.is_alive()
    hold.release()
    scanner.join(30)
    assert not scanner.is_alive()
    capture.hold_point(4, serve)  # released: never holds again
