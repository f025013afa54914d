"""PathJournal: round contents, health marks, and the swap race (no watchdog involved)."""

from __future__ import annotations

import dataclasses
import sys
import threading
from collections.abc import Iterator

import pytest

from shadowpoint.observe.journal import JournalSnapshot, PathJournal
from shadowpoint.workspace import RepoPath


@pytest.fixture
def journal() -> PathJournal:
    return PathJournal()


@pytest.fixture
def fast_thread_switching() -> Iterator[None]:
    """Make the interpreter switch threads as often as it can, so races show up."""
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(old)


def test_swap_returns_the_round_and_starts_an_empty_one(journal: PathJournal) -> None:
    journal.add(RepoPath("src/a.py"))
    journal.add(RepoPath("src/a.py"))
    journal.add(RepoPath("docs"))

    first = journal.swap()
    second = journal.swap()

    assert first == JournalSnapshot(frozenset({RepoPath("src/a.py"), RepoPath("docs")}), healthy=True, reasons=())
    assert second == JournalSnapshot(frozenset(), healthy=True, reasons=())


def test_a_snapshot_does_not_change_after_the_swap(journal: PathJournal) -> None:
    journal.add(RepoPath("a"))
    snapshot = journal.swap()
    journal.add(RepoPath("b"))

    assert snapshot.paths == {"a"}
    assert journal.swap().paths == {"b"}


def test_snapshot_is_a_frozen_slotted_value(journal: PathJournal) -> None:
    snapshot = journal.swap()

    with pytest.raises(dataclasses.FrozenInstanceError):
        snapshot.healthy = False  # type: ignore[misc]
    assert not hasattr(snapshot, "__dict__")
    assert isinstance(snapshot.paths, frozenset)


def test_mark_unhealthy_spoils_only_the_current_round(journal: PathJournal) -> None:
    journal.add(RepoPath("a"))
    journal.mark_unhealthy("flush timed out")

    spoiled = journal.swap()
    next_round = journal.swap()

    assert spoiled == JournalSnapshot(frozenset({RepoPath("a")}), healthy=False, reasons=("flush timed out",))
    assert next_round.healthy
    assert next_round.reasons == ()


def test_degraded_watcher_spoils_every_round_until_it_recovers(journal: PathJournal) -> None:
    assert journal.swap().healthy

    assert journal.mark_degraded("queue overflow") is True
    assert journal.mark_degraded("queue overflow") is False  # already degraded: no new transition
    assert journal.is_degraded
    during = journal.swap()
    still = journal.swap()

    assert journal.mark_recovered() is True
    assert not journal.is_degraded
    recovering = journal.swap()  # this round started while degraded
    after = journal.swap()

    assert (during.healthy, during.reasons) == (False, ("queue overflow",))
    assert (still.healthy, still.reasons) == (False, ("queue overflow",))
    assert (recovering.healthy, recovering.reasons) == (False, ("queue overflow",))
    assert (after.healthy, after.reasons) == (True, ())
    assert journal.mark_recovered() is False


def test_recovery_within_a_round_keeps_that_round_unhealthy(journal: PathJournal) -> None:
    journal.mark_degraded("queue overflow")
    journal.mark_recovered()

    assert journal.swap().healthy is False
    assert journal.swap().healthy is True


def test_reasons_are_kept_once_and_in_order(journal: PathJournal) -> None:
    journal.mark_unhealthy("a")
    journal.mark_unhealthy("b")
    journal.mark_unhealthy("a")
    for i in range(1000):
        journal.mark_unhealthy(f"handler failed {i}")

    reasons = journal.swap().reasons

    assert reasons[:2] == ("a", "b")
    assert len(reasons) == len(set(reasons))
    assert len(reasons) < 100  # bounded: a failing burst does not grow it without limit


@pytest.mark.usefixtures("fast_thread_switching")
def test_an_add_racing_a_swap_lands_in_exactly_one_round(journal: PathJournal) -> None:
    writers, per_writer = 4, 20_000
    start = threading.Barrier(writers + 1)

    def write(n: int) -> None:
        start.wait()
        for i in range(per_writer):
            journal.add(RepoPath(f"w{n}/f{i}"))

    threads = [threading.Thread(target=write, args=(n,), name=f"test-writer-{n}") for n in range(writers)]
    for thread in threads:
        thread.start()
    start.wait()
    rounds: list[frozenset[RepoPath]] = []
    while any(thread.is_alive() for thread in threads):
        rounds.append(journal.swap().paths)
    for thread in threads:
        thread.join()
    rounds.append(journal.swap().paths)

    expected = {f"w{n}/f{i}" for n in range(writers) for i in range(per_writer)}
    union: set[str] = set().union(*rounds)
    assert union == expected  # nothing lost
    assert sum(len(r) for r in rounds) == len(expected)  # nothing in two rounds
    assert sum(1 for r in rounds if r) > 2  # the swaps really did interleave with the writers


@pytest.mark.usefixtures("fast_thread_switching")
def test_a_path_added_while_degraded_is_in_an_unhealthy_round(journal: PathJournal) -> None:
    periods = 3_000
    done = threading.Event()

    def flap() -> None:
        for i in range(periods):
            journal.mark_degraded("queue overflow")
            journal.add(RepoPath(f"degraded/{i}"))
            journal.mark_recovered()
            journal.add(RepoPath(f"healthy/{i}"))
        done.set()

    thread = threading.Thread(target=flap, name="test-flapper")
    thread.start()
    snapshots: list[JournalSnapshot] = []
    while not done.is_set():
        snapshots.append(journal.swap())
    thread.join()
    snapshots.append(journal.swap())

    # Whichever round a degraded-time path landed in, the watcher was degraded during that round.
    assert all(not s.healthy for s in snapshots if any(p.startswith("degraded/") for p in s.paths))
    assert sum(len(s.paths) for s in snapshots) == 2 * periods
    assert journal.swap().healthy  # it ended recovered: the next round is healthy again


def test_paths_recorded_before_a_round_opens_are_not_the_rounds() -> None:
    journal = PathJournal()
    journal.add(RepoPath("between.txt"))
    journal.open_round()
    journal.add(RepoPath("during.txt"))
    journal.open_round()  # again while open: nothing moves
    journal.add(RepoPath("between.txt"))  # touched again during the round: the round's now
    snap = journal.swap()
    assert snap.paths == {"between.txt", "during.txt"} and snap.during == {"during.txt", "between.txt"}
    journal.add(RepoPath("after.txt"))
    snap = journal.swap()
    assert snap.paths == {"after.txt"} and snap.during == frozenset() and not snap.opened


def test_put_back_keeps_which_paths_came_during_the_round() -> None:
    journal = PathJournal()
    journal.add(RepoPath("outside.txt"))
    journal.open_round()
    journal.add(RepoPath("inside.txt"))
    journal.mark_unhealthy("lost an event")
    journal.put_back(journal.swap())  # a compare that must not consume the round
    journal.add(RepoPath("later.txt"))
    snap = journal.swap()
    assert snap.paths == {"outside.txt", "inside.txt", "later.txt"}
    assert snap.during == {"inside.txt", "later.txt"} and snap.reasons == ("lost an event",)


def test_current_paths_reads_the_round_without_ending_it() -> None:
    journal = PathJournal()
    journal.add(RepoPath("a.txt"))
    assert journal.current_paths() == {"a.txt"} and journal.swaps == 0
    snap = journal.swap()
    assert snap.paths == {"a.txt"} and journal.swaps == 1 and journal.current_paths() == frozenset()
