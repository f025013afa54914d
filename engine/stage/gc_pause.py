"""Python's cyclic garbage collector held off while a baseline builds its lasting objects.

A fresh baseline allocates a few objects per file that all live on (the index's entries, the
stat cache's, the sorted paths): at 100k files the collector ran its full collections over
them again and again, ~40 ms of the baseline of a git repository (the index's parse alone:
~95 ms with it, ~70 ms without). Nothing of a baseline makes reference cycles to collect.

The collector is process-wide and baselines of several roots may run at once on their own
threads: it is held off while any of them runs and given back as it was found (an embedding
program that disabled it keeps it disabled). A forked child disables it for good
(`forked.py`).

Given back, the collector would first collect its youngest generation: every object the
baseline made and kept (~5 ms at 100k files, on the baseline's last step). They go to the
oldest generation unexamined instead (`gc.freeze`, then `gc.unfreeze`: a move of lists), where
the collections that look at long-lived objects find any cycle among them.
"""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Iterator

_lock = threading.Lock()
_holders = 0
_was_enabled = False


@contextlib.contextmanager
def collection_paused() -> Iterator[None]:
    """No automatic collection inside; on the last holder's way out, as before the first's."""
    global _holders, _was_enabled
    with _lock:
        if _holders == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _holders += 1
    try:
        yield
    finally:
        with _lock:
            _holders -= 1
            if _holders == 0 and _was_enabled:
                gc.freeze()
                gc.unfreeze()
                gc.enable()
