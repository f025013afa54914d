"""gc_pause.py: the collector is held off during a baseline and given back without a
collection of what the baseline kept."""

from __future__ import annotations

import gc

from shadowpoint.stage.gc_pause import collection_paused


class _Kept:
    """A tracked object a baseline keeps."""


def test_what_a_pause_made_goes_to_the_oldest_generation_unexamined() -> None:
    assert gc.isenabled()
    collected: list[int] = []

    def note(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            collected.append(info["generation"])

    gc.callbacks.append(note)
    try:
        with collection_paused():
            assert not gc.isenabled()
            with collection_paused():  # a second root's baseline at once
                kept = [_Kept() for _ in range(5000)]
            assert not gc.isenabled()  # the first still runs
        assert gc.isenabled() and gc.get_freeze_count() == 0
        assert gc.get_count()[0] < 100 and collected == []  # no young collection on the way out
        oldest = {id(obj) for obj in gc.get_objects(generation=2)}
        assert all(id(obj) in oldest for obj in kept[::500])
    finally:
        gc.callbacks.remove(note)


def test_a_collector_disabled_by_the_program_stays_disabled() -> None:
    gc.disable()
    try:
        with collection_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()
