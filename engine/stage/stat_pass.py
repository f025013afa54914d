"""The stat pass of a rescan: which walked files the stat cache cannot prove unchanged.

A rescan of an unchanged tree is one lstat per file and one comparison with the stat cache.
At 100k files the lstats alone are half of it (about 3.5 µs each here, nearly all of it in
the kernel). `git status` spreads its lstats over threads (core.preloadIndex); Python threads
would take turns at the GIL between every two lstats, so `split_pass` gives about half of the
folders to a forked child of this process instead. The child holds the stat cache as it was
at the fork (copy-on-write: nothing is sent), does only lstats and comparisons, and answers
with the few paths it could not prove unchanged; the caller examines those itself (hashing,
recording), as it does its own.

Nothing depends on the child: if it cannot be started, dies, or answers anything but a
complete answer, this process does the child's folders itself.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from shadowpoint.stage.exclusions import DIR_FLAGS, NAME_SEP, Listed
from shadowpoint.stage.forked import Forked
from shadowpoint.stage.stat_cache import FileState, is_clean

_COUNTS = struct.Struct("<QQQ")  # reached, clean, bytes of the paths that follow

# Below this many files a rescan's stat pass stays in this process: a fork and the child's
# copy-on-write faults cost a few milliseconds, which half of a smaller pass does not repay.
SPLIT_MIN_FILES = 20_000

# (folder prefix with a trailing "/" or "" for the root, its file names joined by NAME_SEP,
# their lstat if the walk read them), as ExclusionRules.walk_folders yields them
Folder = Listed


@dataclass(slots=True)
class StatPass:
    """What the stat pass found over some folders."""

    reached: int = 0  # files that are tracked (in the stat cache)
    clean: int = 0  # of those, the ones their stat proves unchanged
    # every other walked file: new, changed, racy, or gone since its folder was listed
    unproven: list[str] = field(default_factory=list)

    def add(self, other: StatPass) -> None:
        self.reached += other.reached
        self.clean += other.clean
        self.unproven.extend(other.unproven)


def default_split_min() -> int | None:
    """`SPLIT_MIN_FILES` where a second core is usable, else None (never split)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return SPLIT_MIN_FILES if cpus > 1 else None


def check_folders(root: str, folders: Iterable[Folder], entries: Mapping[str, FileState],
                  prove: Callable[[str, os.stat_result], bool] | None = None) -> StatPass:
    """lstat every file of `folders` (under `root`, which ends with "/") and compare it with
    its entry. The hot loop of a rescan. `prove`: asked about each file without an entry
    (a forked baseline's index proof); True keeps it out of `unproven`."""
    reached = clean = 0
    unproven: list[str] = []
    known_state = entries.get
    for prefix, joined, listed in folders:
        names = joined.split(NAME_SEP)
        stats: Sequence[os.stat_result | None] = listed if listed is not None else lstat_names(root + prefix, names)
        for name, st in zip(names, stats, strict=True):
            path = prefix + name
            if st is None:
                unproven.append(path)  # gone since its folder was listed
                continue
            known = known_state(path)
            if known is not None:
                reached += 1
                if is_clean(known, st):
                    clean += 1
                    continue
            elif prove is not None and prove(path, st):
                continue
            unproven.append(path)
    return StatPass(reached, clean, unproven)


def lstat_names(folder: str, names: Iterable[str]) -> list[os.stat_result | None]:
    """The lstat of each of `names` in `folder` (ending with "/"); None for one that is gone.
    Looked up from the folder itself: shorter lookups, and never through a symlink that
    replaced one of its parents since the listing."""
    out: list[os.stat_result | None] = []
    add = out.append
    lstat = os.lstat
    try:
        fd = os.open(folder, DIR_FLAGS)
    except OSError:
        fd = -1
    try:
        for name in names:
            try:
                add(lstat(name, dir_fd=fd) if fd >= 0 else lstat(folder + name))
            except OSError:
                add(None)
    finally:
        if fd >= 0:
            os.close(fd)
    return out


Check = Callable[[str, Sequence[Folder], Mapping[str, FileState]], StatPass]


def split_pass(root: str, folders: Sequence[Folder], entries: Mapping[str, FileState],
               min_files: int | None, child_check: Check = check_folders) -> StatPass:
    """`check_folders` over all `folders`, the half of them in a forked child when there are
    at least `min_files` files (None: never, as on a single core).

    `child_check` is what the child runs (a seam for fault tests)."""
    if min_files is None or sum(joined.count(NAME_SEP) + 1 for _, joined, _ in folders) < min_files:
        return check_folders(root, folders, entries)
    mine, theirs = _halves(folders)
    child = Forked.start(lambda: _encode(child_check(root, theirs, entries)))
    found = check_folders(root, mine, entries)
    answer = _decode(child.result()) if child is not None else None
    if answer is None:
        answer = check_folders(root, theirs, entries)
    found.add(answer)
    return found


def _encode(found: StatPass) -> bytes:
    paths = b"\0".join(os.fsencode(p) for p in found.unproven)
    return _COUNTS.pack(found.reached, found.clean, len(paths)) + paths


def _decode(data: bytes | None) -> StatPass | None:
    """The child's answer; None if it is not one."""
    if data is None or len(data) < _COUNTS.size:
        return None
    reached, clean, size = _COUNTS.unpack_from(data)
    if len(data) != _COUNTS.size + size:
        return None
    names = data[_COUNTS.size:]
    return StatPass(reached, clean, [os.fsdecode(p) for p in names.split(b"\0")] if names else [])


def _halves(folders: Sequence[Folder]) -> tuple[list[Folder], list[Folder]]:
    """The folders in two parts with about as many files each."""
    parts: tuple[list[Folder], list[Folder]] = ([], [])
    files = [0, 0]
    for folder in folders:
        side = 0 if files[0] <= files[1] else 1
        parts[side].append(folder)
        files[side] += folder[1].count(NAME_SEP) + 1
    return parts
