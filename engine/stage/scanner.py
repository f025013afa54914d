"""`Scanner`: turns a `StagePlan` into tree changes for one root, reading the disk safely.

Stages explicit paths in O(paths) (edit-tool paths forced past every exclusion, watcher
paths filtered), or walks the whole root for the baseline and the rescan fallback, using
the `StatCache` so unchanged files are not re-hashed (a big walk hands its files to the
processes of `blob_workers.py`). Runs on whichever thread holds the root's lock (task
worker or baseline builder); never writes to the workspace.
"""

from __future__ import annotations

import bisect
import contextlib
import enum
import errno
import os
import pickle
import stat
import sys
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Protocol, cast

import structlog

from shadowpoint.errors import FileNotStorableError, RepoError, StorageFailedError
from shadowpoint.stage import exclusions, git_index, patterns
from shadowpoint.stage.blob_workers import (
    BlobWorkerOptions,
    BlobWorkers,
    FailureKind,
    HashedFile,
    Result,
    read_file,
    snapshot_file,
)
from shadowpoint.stage.early_capture import EarlyCapture
from shadowpoint.stage.exclusions import (
    DIR_FLAGS,
    NAME_SEP,
    ExclusionRules,
    Listed,
    WalkPart,
    is_gone,
    note_unlisted,
    unwalked,
)
from shadowpoint.stage.forked import Forked
from shadowpoint.stage.gc_pause import collection_paused
from shadowpoint.stage.git_index import IndexDoubt, IndexProof, open_index
from shadowpoint.stage.stager import StagePlan, is_rules_file
from shadowpoint.stage.stat_cache import (
    FileState,
    StatCache,
    is_clean,
    same_stat,
    state_entry,
    state_mode,
    state_of,
    state_oid,
    tree_files,
)
from shadowpoint.stage.stat_pass import check_folders, default_split_min, lstat_names, split_pass
from shadowpoint.store import borrowed, loose, shadow_repo
from shadowpoint.store.shadow_repo import FolderFiles, RootItems, ShadowRepo
from shadowpoint.store.values import MODE_LINK, MODE_TREE, TreeEntry, file_entry
from shadowpoint.workspace import RepoPath, at_or_under, folders_above, is_git_component

log = structlog.get_logger(__name__)

# a path with at least this many folders above it has them checked at once (`is_real_folder`)
_FOLDERS_AT_ONCE = 4
# where Linux names what each descriptor of this process opened (None: not Linux)
_FD_LINKS = "/proc/self/fd/" if sys.platform.startswith("linux") else None
_FOLDER_FLAGS = getattr(os, "O_PATH", os.O_RDONLY) | os.O_DIRECTORY | os.O_CLOEXEC


def is_real_folder(folder: str) -> bool:
    """Whether `folder` (an absolute path under a canonical root) is a folder that no symlink
    leads to, at once: its real path is itself. A real path never goes through a symlink, so
    no folder of it is one. Three system calls (an open, a readlink of /proc/self/fd, a
    close), where an lstat of each folder of a path 8 deep was 8. False when that cannot be
    told (not Linux, no /proc, a folder missing): the caller looks at each folder."""
    if _FD_LINKS is None:
        return False
    try:
        fd = os.open(folder, _FOLDER_FLAGS)
    except OSError:
        return False
    try:
        return os.readlink(f"{_FD_LINKS}{fd}") == folder
    except OSError:
        return False
    finally:
        os.close(fd)


# what a forked child of a baseline runs, made silent there (forked.py)
_SILENCED = (sys.modules[__name__], exclusions, patterns, git_index, shadow_repo, loose)

# a stage from an empty tree with at least this many paths writes its trees as one pack
PACKED_TREES_MIN = 256
# files of a folder `Scanner._prove_listed` proves between two looks for early captures
_PROVE_SLICE = 256

# a forked child's answer with its run of a fresh baseline's trees (`Scanner._trees_aside`):
# after the first byte, its runs, the paths' count and the root's entries (pickled); or the
# second byte alone (this process makes them)
_TREES_ITEMS, _TREES_HERE = b"T", b"H"
# the child's share of the paths whose trees it writes (~200 ms at 100k files in all), in whole
# top-level folders (`_trees_share`)
_TREES_CHILD_SHARE = 0.5

# the fewest bytes an index entry takes (62 of fields, a name's byte and its NUL, in any version):
# an index smaller than `split_min_files` of them holds too few entries to split a baseline
_INDEX_ENTRY_MIN = 64


class WatchPlacer(exclusions.FolderWatch, Protocol):
    """A deferred watcher start's watches, placed by a baseline's scan (`inotify.FolderWatches`)."""

    @property
    def finished(self) -> bool:
        ...

    def placed(self) -> tuple[list[tuple[int, bytes]], tuple[int, bytes] | None, float]:
        """In a forked child: the watches it placed, the limit that stopped it, the time spent."""
        ...

    def adopt(self, placed: list[tuple[int, bytes]], refused: tuple[int, bytes] | None,
              spent_ms: float = 0.0) -> None:
        """Take over the watches a child placed."""
        ...

    def finish(self) -> None:
        """Every folder the scan lists is watched."""
        ...

    def abandon(self) -> None:
        """The scan did not place them all: the rest by a walk."""
        ...


def _tree_files(cache: StatCache, paths: Sequence[RepoPath]) -> Iterator[tuple[str, int, bytes]]:
    """`paths` of `cache` as the tree writers take them: (path, git mode, raw blob id). `paths`
    is read twice (with the states it maps to): a sequence, never an iterator."""
    return tree_files(paths, list(map(cache.entries.__getitem__, paths)))


def _folder_span(ordered: Sequence[str], folder: str) -> tuple[int, int]:
    """Where the paths below `folder` lie in `ordered` (sorted): [lo, hi)."""
    lo = bisect.bisect_left(ordered, folder + "/")
    return lo, bisect.bisect_left(ordered, folder + "0", lo)  # "0" follows "/"


def _whole_folders(trees: Mapping[str, tuple[int, bytes]], ordered: Sequence[str],
                   unproven: Sequence[str]) -> dict[str, tuple[int, bytes]]:
    """The outermost folders of `trees` (the index's, `IndexProof.trees`) whose tree may be
    taken: git knows it, the paths below them in `ordered` are as many as the index's tree
    covers, and none is `unproven` (sorted). Folders holding none of the paths are not entered."""
    children: dict[str, list[str]] = {}
    for folder in trees:
        if folder:
            children.setdefault(folder.rpartition("/")[0], []).append(folder)
    taken: dict[str, tuple[int, bytes]] = {}
    pending = list(children.get("", ()))
    while pending:
        folder = pending.pop()
        lo, hi = _folder_span(ordered, folder)
        if lo == hi:
            continue
        tree = trees[folder]
        first, end = _folder_span(unproven, folder)
        if hi - lo == tree[0] and first == end:
            taken[folder] = tree
        else:
            pending.extend(children.get(folder, ()))
    return taken


def _files_around(cache: StatCache, ordered: Sequence[RepoPath],
                  taken: Mapping[str, tuple[int, bytes]]) -> Iterator[tuple[str, int, bytes]]:
    """`_tree_files` of `ordered`, each folder of `taken` given as its tree instead of its
    files: ("folder/", MODE_TREE, raw tree id), where its paths would be (`_trees_of_sorted`)."""
    spans = sorted((*_folder_span(ordered, folder), folder) for folder in taken)
    at = 0
    for lo, hi, folder in spans:
        yield from _tree_files(cache, ordered[at:lo])
        yield f"{folder}/", MODE_TREE, taken[folder][1]
        at = hi
    yield from _tree_files(cache, ordered[at:])


def _top_below(folder: str, above: Collection[str]) -> str | None:
    """The outermost of `folder` and the folders above it that is not in `above` (the folders
    above a split walk's units): the unit, or the folder of this side, whose tree holds
    `folder`'s files; None for the root and the folders in `above` (their files go into the
    trees written around the others, `_files_around`)."""
    if not folder or folder in above:
        return None
    at = folder.find("/")
    while at >= 0 and folder[:at] in above:
        at = folder.find("/", at + 1)
    return folder if at < 0 else folder[:at]


def _encoded(joined: str) -> list[bytes]:
    """A folder's names joined by NAME_SEP (a listing's), each as bytes: one encode and one
    split in C, not one encode a name."""
    return joined.encode(sys.getfilesystemencoding(), sys.getfilesystemencodeerrors()).split(NAME_SEP.encode())


def _listed_trees(repo: ShadowRepo, listed: Mapping[str, FolderFiles], unclean: Collection[str],
                  above: Collection[str], poll: Callable[[], None] | None = None) -> dict[str, tuple[int, bytes]]:
    """The trees of the whole folders one side of a split baseline walked (`_top_below`: the
    child's units, this process's folders of no unit and above none), from the entries of the
    files the index proved there (`listed`, by folder): {folder: (its files' count, raw id)}.
    A folder holding one of `unclean` (a folder with a file the index could not prove: new,
    changed, racy, gone) is left out: the trees around the others hold it.

    Raises:
        StorageFailedError: the docs root refused the write.
    """
    tops: dict[str, list[str]] = {}
    for folder in listed:
        top = _top_below(folder, above)
        if top is not None:
            tops.setdefault(top, []).append(folder)
    for folder in unclean:
        top = _top_below(folder, above)
        if top is not None:
            tops.pop(top, None)
    return repo.write_folder_trees(tops, listed, poll) if tops else {}


Runs = tuple[tuple[int, int], ...]  # ranges [lo, hi) of a sorted list of paths, in order


def _trees_share(ordered: Sequence[str], share: float) -> Runs:
    """The child's part of a baseline's trees: whole top-level folders (and root files) holding
    about `share` of the paths (sorted), the largest first, as ranges of `ordered`: no
    folder's trees are split between two writers. Not a prefix of the paths: at 100k files
    the top-level folders by name cut at 28% or 58% (the larger writer ~35 ms behind). A file
    and a folder of one name may still fall on both sides (`write_root_tree` refuses them)."""
    groups: list[tuple[int, int]] = []
    lo = 0
    while lo < len(ordered):
        top, sep, _ = ordered[lo].partition("/")
        hi = bisect.bisect_left(ordered, top + "0", lo) if sep else lo + 1  # "0" follows "/"
        groups.append((lo, hi))
        lo = hi
    want = len(ordered) * share
    taken: list[tuple[int, int]] = []
    count = 0
    for lo, hi in sorted(groups, key=lambda g: g[0] - g[1]):  # the largest first
        if count + hi - lo <= want:
            taken.append((lo, hi))
            count += hi - lo
    return tuple(sorted(taken))


def _other_runs(runs: Runs, count: int) -> Runs:
    """The ranges of [0, count) that `runs` leaves."""
    out: list[tuple[int, int]] = []
    at = 0
    for lo, hi in runs:
        if at < lo:
            out.append((at, lo))
        at = hi
    if at < count:
        out.append((at, count))
    return tuple(out)


def _unit_runs(ordered: Sequence[str], units: Iterable[str]) -> Runs:
    """Where the paths below each of `units` (folders, none inside another) lie in `ordered`
    (sorted), in order."""
    return tuple(sorted(_folder_span(ordered, unit) for unit in units))


def _in_runs(ordered: Sequence[RepoPath], runs: Runs) -> list[RepoPath]:
    return [path for lo, hi in runs for path in ordered[lo:hi]]


class SkipReason(enum.Enum):
    """Why a file was left out of a snapshot (reported on the checkpoint, never silent)."""

    TOO_LARGE = "over the size cap"
    UNREADABLE = "unreadable"
    VANISHED = "vanished while being read"
    NOT_REGULAR = "not a regular file"
    # the docs root's file system or the process's file-size limit refused its blob (EFBIG)
    UNSTORABLE = "could not be stored"


_UNREADABLE_FOLDER = "a folder that cannot be read"
_SKIP_REASONS = {FailureKind.VANISHED: SkipReason.VANISHED, FailureKind.UNREADABLE: SkipReason.UNREADABLE,
                 FailureKind.TOO_LARGE: SkipReason.TOO_LARGE, FailureKind.UNSTORABLE: SkipReason.UNSTORABLE}


@dataclass(frozen=True, slots=True)
class Skipped:
    path: RepoPath
    reason: SkipReason
    detail: str = ""

    @property
    def reason_text(self) -> str:
        """The checkpoint warning's `reason`: a file that could not be stored names the cause,
        a folder that could not be read says so (its files are not known, not gone)."""
        text: str = self.reason.value
        if self.reason is SkipReason.UNSTORABLE:
            return f"{self.path} {text} in the shadow repository ({self.detail})"
        if self.reason is SkipReason.UNREADABLE and self.detail.startswith(_UNREADABLE_FOLDER):
            return f"{text}: {self.detail}; its files are left out, not taken for deleted"
        return text


@dataclass(frozen=True, slots=True)
class StageOptions:
    """Per-root staging settings derived from `Settings`."""

    max_file_bytes: int = 100 * 1024 * 1024
    workers: BlobWorkerOptions = field(default_factory=BlobWorkerOptions)
    # a rescan of at least this many files makes its stat pass on two cores (None: never)
    split_min_files: int | None = field(default_factory=default_split_min)


@dataclass(slots=True)
class StageStats:
    """What one staging did."""

    examined: int = 0
    hashed: int = 0
    # ids taken from the user's git index (a baseline of a git repository: git_index.py)
    borrowed: int = 0
    changed: int = 0
    rescan: bool = False
    skipped: list[Skipped] = field(default_factory=list)
    duration_ms: float = 0.0
    # rescans only: tracked paths the walk did not reach (excluded, yet tracked: force-added)
    outside_walk: list[RepoPath] = field(default_factory=list)
    # the paths whose entry changed (added, modified, deleted): a round's part of the restore scope
    changed_paths: Sequence[RepoPath] = ()


@dataclass(slots=True)
class _Staging:
    """The running state of one `Scanner.stage` call."""

    cache: StatCache
    stats: StageStats
    now_ns: int
    changes: dict[RepoPath, TreeEntry | None] = field(default_factory=dict)
    originals: dict[RepoPath, TreeEntry | None] = field(default_factory=dict)
    # rescans only: files queued for the blob worker processes, recorded when they answer
    batch: BlobWorkers | None = None
    # a baseline's paths to capture first (SPEC §3), None elsewhere
    capture: EarlyCapture | None = None
    # a baseline of a git repository: the user's index, which proves files unchanged (read
    # from `index_fd`, opened before a split scan's child is forked: both read the same file)
    proof: IndexProof | None = None
    borrow: bool = False
    index_fd: int | None = None
    # a deferred watcher start's watches, placed as the scan lists each folder
    watches: WatchPlacer | None = None
    borrowed: list[RepoPath] = field(default_factory=list)  # paths whose blob id the index gave
    # a fresh baseline's files proven by the index, recorded together (`Scanner._keep_proven`)
    proven_paths: list[RepoPath] = field(default_factory=list)
    proven_states: list[FileState] = field(default_factory=list)
    alternate_added: bool = False
    # a split fresh baseline: the trees of whole folders its two walkers wrote (`_unit_trees`,
    # `_own_trees`), and the paths recorded since (`_taken_units`)
    unit_trees: dict[str, tuple[int, bytes]] = field(default_factory=dict)
    touched: set[RepoPath] = field(default_factory=set)
    # a split fresh baseline's own folders whose every file the index proved, with their tree
    # entries (`_prove_listed`), and those with one it could not (hashed): (prefix, names
    # joined), their entries made once the hashes are in (`_own_trees`)
    listed: dict[str, FolderFiles] | None = None
    unproven_folders: list[tuple[str, str]] = field(default_factory=list)
    # paths whose unchanged stat proves them unchanged even when racy (`StagePlan.vouched`)
    vouched: frozenset[RepoPath] = frozenset()
    # paths that exist but could not be read (a folder without read or search permission, an
    # I/O error), each left out with one warning: what is tracked below one is covered by it
    unreadable: set[RepoPath] = field(default_factory=set)
    # a rescan from nothing (an empty cache, no tree): every path it records is new, so the
    # cache alone says what changed; `changes` and `originals` stay empty (they cost ~11 MiB
    # of a 100k-file baseline's peak memory)
    fresh: bool = False
    # a round without a rescan: the inodes of the files it looked at that have other names (hard
    # links), whose changes no event names (`StatCache.with_inodes` finds those names)
    linked: set[int] = field(default_factory=set)


@dataclass(frozen=True, slots=True)
class StageResult:
    tree: str | None
    changed: bool
    stats: StageStats


class Scanner:
    """Reads one root and writes blobs and trees into its shadow repo."""

    def __init__(self, root: Path, repo: ShadowRepo, rules: ExclusionRules, options: StageOptions) -> None:
        self.root = root
        # the root as a str, for the paths of one round's files: a `Path` joined there cost
        # ~3 us a time, ~10 times a round
        self._root = os.fspath(root)
        self.repo = repo
        self.rules = rules
        self.options = options

    # ------------------------------------------------------------------ entry points

    def stage(self, plan: StagePlan, cache: StatCache, capture: EarlyCapture | None = None,
              borrow: bool = False, watches: WatchPlacer | None = None) -> StageResult:
        """Apply `plan` to `cache` (the tracked set) and write the resulting tree.

        `capture` (a rescan only): paths edit tools are about to change, captured as soon as they
        are asked for and kept at that content for the rest of the scan. `borrow` (a baseline's
        rescan): take the blob ids of files the user's git index proves unchanged (git_index.py).
        `watches` (a rescan only): a deferred watcher start's, placed folder by folder as the
        scan lists them; finished (or abandoned, when the scan fails) before this returns.
        A scan from nothing (a baseline) runs with the garbage collector held off (`gc_pause`).
        """
        fresh = plan.rescan and cache.tree is None and not cache.entries
        with collection_paused() if fresh else contextlib.nullcontext():
            return self._stage(plan, cache, capture, borrow, watches, fresh)

    def _stage(self, plan: StagePlan, cache: StatCache, capture: EarlyCapture | None, borrow: bool,
               watches: WatchPlacer | None, fresh: bool) -> StageResult:
        start = time.perf_counter()
        run = _Staging(cache, StageStats(rescan=plan.rescan), time.time_ns(), capture=capture if plan.rescan else None,
                       vouched=plan.vouched, fresh=fresh, borrow=borrow and plan.rescan,
                       watches=watches if plan.rescan else None)
        try:
            if run.borrow:
                with contextlib.suppress(IndexDoubt):
                    run.index_fd = open_index(self.root / ".git" / "index") if (self.root / ".git").is_dir() else None
            self._invalidate_rules(plan.forced | plan.watched)
            if plan.rescan:
                run.batch = BlobWorkers(self.repo.git_dir, self.root, self.options.max_file_bytes,
                                        self.options.workers)
                try:
                    self._rescan(run)
                    self._finish(run, run.batch.flush())
                finally:
                    run.batch.close()
                    run.batch = None
        finally:
            if run.index_fd is not None:
                os.close(run.index_fd)
            if watches is not None and not watches.finished:
                watches.abandon()
        if not plan.rescan:
            for path in sorted(plan.watched - plan.forced):
                self._stage_path(run, path, forced=False)
        # forced paths last: they win over every exclusion
        for path in sorted(plan.forced):
            self._stage_path(run, path, forced=True)
        if run.linked:
            # Other names of hard links it met: a write through one name changes them all, but
            # the watcher's event (or an edit tool's report) names only the one written.
            looked_at = plan.watched | plan.forced
            for path in run.cache.with_inodes(run.linked):
                if path not in looked_at:
                    self._stage_path(run, path, forced=False)
        # from nothing, every path changed: sorted once, for the trees too (at 1M files each
        # list of the paths is 7 MiB, held at a baseline's peak memory), and before the trees'
        # child is forked, which takes the list as it is (sorting it there took ~28 ms at 100k,
        # the fork's copy-on-write included, against ~10 ms here)
        ordered = sorted(cache.entries) if run.fresh else None
        taken = self._index_trees(run, cache, ordered) if ordered else None
        units = self._taken_units(run, ordered) if ordered and taken is None else {}
        split = ordered if taken is None and not units else None  # the trees written in two processes
        runs = _trees_share(split, _TREES_CHILD_SHARE) if split is not None else ()
        trees = self._trees_aside(cache, split, runs) if split is not None else None
        try:
            changed_paths = ordered if ordered is not None else tuple(run.changes)
            if changed_paths:
                if taken is not None:
                    cache.tree = taken
                elif units and ordered is not None:
                    cache.tree = self._trees_around(run, cache, ordered, units)
                elif trees is not None:
                    child, trees = trees, None
                    cache.tree = self._trees_beside(run, cache, changed_paths, child, runs)
                else:
                    cache.tree = self._write_tree(run, cache, changed_paths if run.fresh else None)
        finally:
            if trees is not None:
                trees.abandon()
        self._note_borrowed(run)
        run.stats.changed = len(changed_paths)
        run.stats.changed_paths = changed_paths
        run.stats.duration_ms = (time.perf_counter() - start) * 1e3
        log.debug("scanner.staged", root=str(self.root), examined=run.stats.examined,
                  hashed=run.stats.hashed, borrowed=run.stats.borrowed, changed=run.stats.changed,
                  rescan=run.stats.rescan, duration_ms=round(run.stats.duration_ms, 2))
        return StageResult(cache.tree, bool(changed_paths), run.stats)

    def stage_edited_files(self, paths: Collection[RepoPath], cache: StatCache) -> StageResult | None:
        """`stage` of a round's common case, in a straight line: edit tools reported `paths`,
        and each is a tracked file (not a link) that is still a regular file of at most
        `max_file_bytes`, in a folder no symlink leads to, and not an ignore or attributes file.

        Returns None as soon as one is not, or when a blob or tree cannot be made here; `cache`
        is unchanged then and `stage` takes the plan (which warns, repairs or rescans). The
        same outcome as `stage(StagePlan(forced=paths), cache)` otherwise, in one function where
        the general staging calls ~20: each distinct function costs a round ~1-2.5 us more once
        the CPU's caches went cold (`benchmarks/cold_probe.py`). tests/unit/test_straight_round.py
        holds the two to the same trees and stat cache.
        """
        start = time.perf_counter()
        now_ns = time.time_ns()  # before the reads, as `stage` takes it (the racy rule)
        entries, root, cap = cache.entries, self._root, self.options.max_file_bytes
        read: list[tuple[RepoPath, FileState, bytes, os.stat_result]] = []
        examined = 0
        for path in sorted(paths):
            known = entries.get(path)
            if known is None or state_mode(known) == MODE_LINK or is_rules_file(path):
                return None
            folder = path.rpartition("/")[0]
            if folder and not is_real_folder(f"{root}/{folder}"):
                return None
            full = f"{root}/{path}"
            try:
                st = os.lstat(full)
                if not stat.S_ISREG(st.st_mode) or st.st_size > cap or st.st_nlink > 1:
                    return None  # a hard link: `stage` looks at its other names too
                examined += 1
                if is_clean(known, st):
                    continue
                data, st = read_file(full, cap)
            except OSError:
                return None
            if len(data) > cap:
                return None
            read.append((path, known, data, st))
        states: list[tuple[RepoPath, FileState]] = []
        changes: dict[RepoPath, TreeEntry | None] = {}
        try:
            for path, known, data, st in read:
                entry = file_entry(self.repo.write_blob(data), st.st_mode)
                states.append((path, state_of(st, entry, now_ns)))
                if entry != state_entry(known):
                    changes[path] = entry
            tree = self.repo.patch_tree(cache.tree, changes) if changes else cache.tree
        except (FileNotStorableError, RepoError):
            return None
        for path, state in states:
            cache.set(path, state)
        cache.tree = tree
        stats = StageStats(examined=examined, hashed=len(states), changed=len(changes), changed_paths=tuple(changes),
                           duration_ms=(time.perf_counter() - start) * 1e3)
        return StageResult(tree, bool(changes), stats)

    def capture(self, capture: EarlyCapture, cache: StatCache) -> None:
        """Before a baseline's scan begins: record the paths edit tools asked for so far into
        `cache` and its tree, pinned for the scan that follows (SPEC §3)."""
        run = _Staging(cache, StageStats(), time.time_ns(), capture=capture)
        self._capture_early(run)
        if run.changes:
            cache.tree = self.repo.patch_tree(cache.tree, run.changes)

    # ------------------------------------------------------------------ internals

    def _index_trees(self, run: _Staging, cache: StatCache, ordered: Sequence[RepoPath]) -> str | None:
        """A fresh baseline's tree with the trees of whole folders taken from the user's index
        (its cache-tree, `IndexProof.trees`), the rest written around them; None when none is
        taken (all written as without an index).

        A folder's tree is taken when the walk proved every file below it unchanged (the
        index's ids and modes, `_keep_proven`) and found exactly as many as the index's tree
        covers: the files are the index's, none added or left out, so git's tree of them is
        byte for byte the one this process would write. Like the borrowed blobs, the trees
        are read from the user's objects until the background copy (`borrowed.py`) made them
        this repository's own.

        A big baseline (two processes write its trees: `_trees_aside`) takes the root's tree
        only: finding the whole folders below an incomplete root and writing the rest in one
        process took longer than writing every tree in two (~180 against ~130 ms at 100k files
        when a tracked image in most folders is left out by the built-in rules)."""
        proof = run.proof
        if proof is None or proof.doubt is not None or proof.cache_tree is None or not run.borrowed:
            return None
        root = proof.trees(root_only=True).get("")
        if root is not None and root[0] == len(ordered) and not self._unproven(run, cache):  # -1: not known
            taken = {"": root}
        elif self._trees_split(cache):
            return None
        else:
            taken = _whole_folders(proof.trees(), ordered, self._unproven(run, cache))
        readable = set(self.repo.readable([raw.hex() for _, raw in taken.values()]))
        taken = {folder: tree for folder, tree in taken.items() if tree[1].hex() in readable}
        if not taken:
            return None
        if "" in taken:
            return taken[""][1].hex()
        try:
            return self.repo.write_tree_packed(_files_around(cache, ordered, taken))
        except ValueError:
            return None  # a path that is both a file and a folder: written as without an index

    @staticmethod
    def _taken_units(run: _Staging, ordered: Sequence[RepoPath]) -> dict[str, tuple[int, bytes]]:
        """The trees of whole folders a split baseline's walkers wrote (the child's units,
        `_unit_trees`; this process's own, `_own_trees`) that still hold: the paths below the
        folder are as many as it was written with, and none of them was recorded since
        (`touched`) or captured early. {} when they hold less than a third of the paths: the
        trees are then written in two processes (`_trees_aside`)."""
        if not run.unit_trees or run.proof is None:
            return {}
        changed = sorted(run.touched | (run.capture.pinned if run.capture is not None else set()))
        taken: dict[str, tuple[int, bytes]] = {}
        for unit, (count, raw) in run.unit_trees.items():
            lo, hi = _folder_span(ordered, unit)
            first, end = _folder_span(changed, unit)
            if hi - lo == count and first == end:
                taken[unit] = (count, raw)
        return taken if 3 * sum(count for count, _ in taken.values()) >= len(ordered) else {}

    def _trees_around(self, run: _Staging, cache: StatCache, ordered: Sequence[RepoPath],
                      units: Mapping[str, tuple[int, bytes]]) -> str | None:
        """A fresh baseline's tree written here around the trees of `units` (`_taken_units`):
        the few folders above the walkers' own, and any whose tree no longer held."""
        try:
            return self.repo.write_tree_packed(_files_around(cache, ordered, units))
        except ValueError:
            return self._write_tree(run, cache, ordered)  # a path both a file and a folder: patched

    @staticmethod
    def _unproven(run: _Staging, cache: StatCache) -> list[RepoPath]:
        """The tracked paths (sorted) whose entry is not the index's: hashed, captured early."""
        pinned = run.capture.pinned if run.capture is not None else set()
        if len(run.borrowed) == len(cache.entries) and not pinned:
            return []  # every path was proven (the borrowed ones are tracked, each once)
        return sorted(cache.entries.keys() - set(run.borrowed) | (pinned & cache.entries.keys()))

    def _trees_aside(self, cache: StatCache, ordered: Sequence[RepoPath], runs: Runs) -> Forked | None:
        """A big baseline's trees below the root of the paths of `runs` (ranges of `ordered`,
        the cache's paths sorted: `_trees_share`), written by a forked child (the second core)
        while this process writes the rest (`_trees_beside`); None: all written here."""
        if not self._trees_split(cache):
            return None

        def trees_in_child() -> bytes:
            try:
                items = self._subtrees(cache, _in_runs(ordered, runs))
            except ValueError:
                return _TREES_HERE  # a path that is both a file and a folder: patched there
            return _TREES_ITEMS + pickle.dumps((runs, len(ordered), items), protocol=pickle.HIGHEST_PROTOCOL)

        return Forked.start(trees_in_child, _SILENCED)

    def _trees_split(self, cache: StatCache) -> bool:
        """Whether a fresh baseline of `cache` writes its trees in two processes (`_trees_aside`)."""
        least = self.options.split_min_files
        return least is not None and len(cache.entries) >= max(least, PACKED_TREES_MIN)

    def _trees_beside(self, run: _Staging, cache: StatCache, ordered: Sequence[RepoPath], child: Forked,
                      runs: Runs) -> str | None:
        """The trees of a fresh baseline whose paths in `runs` (whole top-level folders) a child
        writes (`_trees_aside`): the rest written here meanwhile, then the root over both. A
        child that failed leaves its runs to this process; a path that is both a file and a
        folder, the whole to `_write_tree`."""
        try:
            mine: RootItems | None = self._subtrees(cache, _in_runs(ordered, _other_runs(runs, len(ordered))))
        except ValueError:
            mine = None
        answer = child.result()
        theirs: RootItems | None = None
        if answer is not None and answer[:1] == _TREES_ITEMS:
            their_runs, count, items = pickle.loads(answer[1:])
            if (their_runs, count) == (runs, len(ordered)):  # the same paths: never otherwise by design
                theirs = items
        if theirs is None and mine is not None:
            try:
                theirs = self._subtrees(cache, _in_runs(ordered, runs))
            except ValueError:
                pass
        if mine is not None and theirs is not None:
            try:
                return self.repo.write_root_tree([theirs, mine])
            except ValueError:
                pass  # a file in one run, a folder of the same name in the other
        return self._write_tree(run, cache, ordered)

    def _subtrees(self, cache: StatCache, paths: Sequence[RepoPath]) -> RootItems:
        """The trees below the root of `paths` (sorted), written as one pack (`write_subtrees_packed`).

        Raises:
            ValueError: a path is both a file and a folder.
        """
        return self.repo.write_subtrees_packed(_tree_files(cache, paths))

    def _packed_trees(self, cache: StatCache, ordered: Sequence[RepoPath] | None) -> str | None:
        """Every tree of `cache` (built from nothing) written as one pack; `ordered`: its paths
        sorted, if the caller has them.

        Raises:
            ValueError: a path is both a file and a folder.
        """
        return self.repo.write_tree_packed(_tree_files(cache, sorted(cache.entries) if ordered is None else ordered))

    def _write_tree(self, run: _Staging, cache: StatCache, ordered: Sequence[RepoPath] | None) -> str | None:
        """The tree of `cache` after this staging: its old tree patched with the changes, or,
        from nothing, every tree written as one pack (not thousands of loose objects).
        `ordered`: the tracked paths sorted, if the caller has them."""
        if cache.tree is not None:
            return self.repo.patch_tree(cache.tree, run.changes)
        if len(cache.entries) >= PACKED_TREES_MIN:
            try:
                return self._packed_trees(cache, ordered)
            except ValueError:
                pass  # a path that is both a file and a folder: patched, as below
        return self.repo.patch_tree(None, {p: state_entry(st) for p, st in cache.entries.items()})

    def _invalidate_rules(self, paths: Iterable[RepoPath]) -> None:
        for p in paths:
            name = p.rsplit("/", 1)[-1]
            if name in (".gitignore", ".gitattributes", ".gitmodules") or is_git_component(name):
                parent = RepoPath(p.rsplit("/", 1)[0] if "/" in p else "")
                self.rules.invalidate(parent)

    def _rescan(self, run: _Staging) -> None:
        if run.fresh or run.capture is not None or run.borrow:
            self._first_scan(run)
            return
        entries = run.cache.entries
        tracked_before = len(entries)
        unlisted: dict[str, str] = {}
        folders = list(self.rules.walk_folders(watch=run.watches, unlisted=unlisted))
        self._skip_unlisted(run, unlisted)
        if run.watches is not None:
            run.watches.finish()
        # looked up by plain str: a RepoPath is one
        found = split_pass(os.path.join(self.root, ""), folders, cast(Mapping[str, FileState], entries),
                           self.options.split_min_files)
        run.stats.examined += found.clean
        for path in found.unproven:
            self._stage_listed(run, RepoPath(path))
        if found.reached < tracked_before:
            self._stage_unwalked(run, unwalked(entries, ((prefix, joined) for prefix, joined, _ in folders)), set())

    def _lstat_in_folder(self, path: RepoPath) -> os.stat_result | None:
        """lstat `path` from its folder, never through a symlink that replaced a parent folder;
        None when it is gone.

        Raises:
            OSError: it is there but cannot be examined (`is_gone` is false).
        """
        folder, _, name = path.rpartition("/")
        try:
            fd = os.open(self.root / folder, DIR_FLAGS)
            try:
                return os.lstat(name, dir_fd=fd)
            finally:
                os.close(fd)
        except OSError as exc:
            if is_gone(exc):
                return None
            raise

    def _stage_listed(self, run: _Staging, path: RepoPath) -> None:
        """Stage a file its folder's listing named, which a stat pass left to this process."""
        try:
            st = self._lstat_in_folder(path)
        except OSError as exc:
            self._unreadable(run, path, exc)
            return
        if st is None:
            self._record(run, path, None)  # gone since its folder was listed
        else:
            self._stage_stat(run, path, st)

    def _unreadable(self, run: _Staging, path: RepoPath, exc: OSError) -> None:
        """`path` is there but cannot be examined now (a folder above it lacks search
        permission, an I/O error): left out with a warning as an unreadable file is, never taken
        for deleted (a restore keeps what a checkpoint left out, and what is under it), and the
        tracked paths under it with it. One warning covers a path and everything under it."""
        if not at_or_under(path, run.unreadable):
            self._skip(run, path, SkipReason.UNREADABLE, exc.strerror or str(exc))
            run.unreadable.add(path)
        else:
            self._record(run, path, None)
        for tracked in run.cache.under(path):
            self._record(run, tracked, None)

    def _skip_unlisted(self, run: _Staging, unlisted: Mapping[str, str]) -> None:
        """The folders a walk could not read (`note_unlisted`): each left out with one warning,
        its files not known to be gone (a restore leaves them alone)."""
        for rel, why in sorted(unlisted.items()):
            folder = RepoPath(rel)
            if at_or_under(folder, run.unreadable):
                continue
            self._skip(run, folder, SkipReason.UNREADABLE, f"{_UNREADABLE_FOLDER} ({why})")
            run.unreadable.add(folder)

    def _stage_unwalked(self, run: _Staging, paths: Iterable[str], pinned: set[RepoPath]) -> None:
        """Tracked paths the walk did not reach: deleted, or tracked despite an exclusion
        (force-added earlier); git semantics: exclusions apply to untracked files only."""
        for path in [RepoPath(p) for p in paths if p not in pinned]:
            run.stats.outside_walk.append(path)
            self._stage_path(run, path, forced=True, expand_dirs=False)

    def _first_scan(self, run: _Staging) -> None:
        """The rescan of a baseline: few or no paths are known yet, edit tools' paths may be
        captured along the way, the user's git index may prove files unchanged, and a deferred
        watcher start's watches are placed as the folders are listed.

        A git repository's baseline at `split_min_files` or more entries gives about half of
        its folders (by the index's count) to a forked child, which walks them, lstats their
        files and proves them with the index (`_share_in_child`); this process does the rest,
        then takes the child's answer. The child is forked first and both parse the index at
        once (~80 ms each at 100k entries), from the one descriptor. Early captures are served
        all along (SPEC §3)."""
        entries = run.cache.entries
        tracked_before = len(entries)
        # (prefix, the names joined), to find tracked paths the walk misses; none are tracked
        # in a baseline (at 1M files, ~27 MiB of its peak)
        walked: list[tuple[str, str]] | None = [] if tracked_before else None
        capture = run.capture
        pinned: set[RepoPath] = capture.pinned if capture is not None else set()
        child = self._fork_share(run, walked is not None)
        unlisted: dict[str, str] = {}
        try:
            if run.index_fd is not None:
                run.proof = IndexProof.load(self.root, fd=run.index_fd)
            theirs = self._split(run)
            if child is not None and theirs is None:
                child.abandon()  # it found the same: nothing to split
                child = None
            mine = None if child is None or theirs is None else WalkPart(theirs.units, inside=False)
            if mine is not None and run.proof is not None:  # the child's entries are looked up there
                run.proof.keep(_other_runs(_unit_runs(run.proof.paths, mine.units), len(run.proof.paths)))
                if run.fresh:
                    run.listed = {}  # this side's trees are made of its files' entries (`_own_trees`)
            reached, clean, files_done = self._scan_folders(
                run, self.rules.walk_folders(part=mine, watch=run.watches, stats=True, unlisted=unlisted), walked, 0)
            if theirs is not None and run.fresh and run.proof is not None:
                self._own_trees(run, theirs)
        except BaseException:
            if child is not None:
                child.abandon()
            raise
        if child is not None and theirs is not None:
            serve = partial(self._serve_pending, run)
            try:
                share = self._take_share(run, theirs, child.part(serve), walked, unlisted)
                if share is not None:  # its files recorded while it writes its trees, then those taken
                    self._keep_proven(run)
                    self._take_trees(run, child.result(serve))
            finally:
                child.abandon()  # one still working (its answer unreadable, or this process failed)
            if share is None:  # the child failed: its folders are walked here
                if run.proof is not None:
                    run.proof.keep(((0, len(run.proof.paths)),))
                share = self._scan_folders(
                    run, self.rules.walk_folders(keep=False, part=theirs, watch=run.watches, stats=True,
                                                 unlisted=unlisted), walked, files_done)[:2]
            reached += share[0]
            clean += share[1]
        self._keep_proven(run)
        self._skip_unlisted(run, unlisted)
        if run.watches is not None:
            run.watches.finish()
        run.stats.examined += clean
        if capture is not None:
            self._capture_early(run)  # a request that came after the last file
        if reached == tracked_before or walked is None:
            return  # every tracked path was walked
        self._stage_unwalked(run, unwalked(entries, walked), pinned)

    def _fork_share(self, run: _Staging, want_walked: bool) -> Forked | None:
        """The child of a split baseline, forked before the index is parsed here; None when the
        index is too small to be split."""
        least = self.options.split_min_files
        if run.index_fd is None or least is None:
            return None
        try:
            size = os.fstat(run.index_fd).st_size
        except OSError:
            return None
        if size < least * _INDEX_ENTRY_MIN:
            return None
        # the answer (half the paths, each with a 47-byte state) is well under the index's size
        return Forked.start(partial(self._share_in_child, run, want_walked), _SILENCED, shared=size + (1 << 20))

    def _scan_folders(self, run: _Staging, folders: Iterable[Listed], walked: list[tuple[str, str]] | None,
                      files_done: int) -> tuple[int, int, int]:
        """The hot loop of a baseline (100k files): one lstat per file, and its index entry.
        Returns how many tracked files it reached, how many of those were clean, and the
        files done so far (the test seam's count)."""
        entries = run.cache.entries
        reached = clean = 0
        root = os.path.join(self.root, "")
        proven_paths, proven_states = run.proven_paths, run.proven_states
        capture = run.capture
        pinned: set[RepoPath] = capture.pinned if capture is not None else set()

        def serve() -> None:
            self._capture_early(run)

        for prefix, joined, listed in folders:
            if walked is not None:
                walked.append((prefix, joined))
            names = joined.split(NAME_SEP)
            if run.proof is not None and not run.proof.attributes_clear(self.root, prefix, self.rules.lists_attributes):
                self._unborrow(run)  # "any doubt: hash", the ids taken so far included
            # the walk's own lstat of each file (a folder it listed anew), else one now; a file
            # captured early meanwhile keeps its capture (SPEC §3), whatever its stat
            stats: Sequence[os.stat_result | None] = listed if listed is not None else lstat_names(root + prefix,
                                                                                                   names)
            if run.fresh and run.proof is not None and (capture is None
                                                        or not capture.holds_within(files_done, len(names))):
                files_done += len(names)
                self._prove_listed(run, prefix, names, stats, joined)
                continue
            if run.listed is not None:
                run.unproven_folders.append((prefix, joined))  # its files recorded one by one
            for name, st in zip(names, stats, strict=True):
                path = RepoPath(prefix + name)
                if capture is not None:
                    files_done += 1
                    if capture.has_pending:
                        serve()
                    capture.hold_point(files_done, serve)
                    if path in pinned:
                        continue  # captured early: never a later content
                if st is None:
                    self._stage_listed(run, path)  # gone since its folder was listed, or unreadable
                    continue
                known = entries.get(path)
                if known is not None:
                    reached += 1
                    if is_clean(known, st):
                        clean += 1
                        continue
                elif run.proof is not None and st.st_size <= self.options.max_file_bytes:
                    state = run.proof.prove(path, st, run.now_ns)
                    if state is not None:
                        if run.fresh:  # recorded together once the walk is over (`_keep_proven`)
                            proven_paths.append(path)
                            proven_states.append(state)
                        else:
                            self._keep_borrowed(run, path, state)
                        continue
                self._stage_stat(run, path, st)
        return reached, clean, files_done

    def _prove_listed(self, run: _Staging, prefix: str, names: Sequence[str],
                      stats: Sequence[os.stat_result | None], joined: str) -> None:
        """`_scan_folders` over the files of one folder of a fresh baseline, the index proving
        them (`IndexProof.prove_folder`) `_PROVE_SLICE` at a time: early captures are served
        between two slices, not between two files (a folder of 10k files proven whole would
        keep an edit tool waiting ~20 ms), and a file captured early keeps its capture
        (`_keep_proven` leaves out one proven meanwhile; one the index cannot prove is not
        staged). A split baseline keeps the folder's tree entries when it proves every file
        (`_Staging.listed`; `joined`: the names as listed, joined by NAME_SEP)."""
        assert run.proof is not None
        capture = run.capture
        max_bytes = self.options.max_file_bytes
        entries: list[bytes] | None = [] if run.listed is not None else None
        encoded = _encoded(joined) if entries is not None else None
        clean = True
        for lo in range(0, len(names), _PROVE_SLICE):
            some_names, some_stats, some_encoded = (names, stats, encoded) if len(names) <= _PROVE_SLICE else (
                names[lo:lo + _PROVE_SLICE], stats[lo:lo + _PROVE_SLICE],
                encoded[lo:lo + _PROVE_SLICE] if encoded is not None else None)
            if capture is not None and capture.has_pending:
                self._capture_early(run)
            # the proven paths are walked ones: RepoPaths
            for i in run.proof.prove_folder(prefix, some_names, some_stats, run.now_ns, max_bytes,
                                            cast(list[str], run.proven_paths), run.proven_states, some_encoded,
                                            entries):
                clean = False
                path = RepoPath(prefix + some_names[i])
                st = some_stats[i]
                if capture is not None and path in capture.pinned:
                    continue  # captured early: never a later content
                if st is None:
                    self._stage_listed(run, path)  # gone since its folder was listed, or unreadable
                else:
                    self._stage_stat(run, path, st)
        if entries is not None and run.listed is not None:
            if clean:
                run.listed[prefix[:-1]] = FolderFiles.of(entries, joined.isascii())
            else:
                run.unproven_folders.append((prefix, joined))

    def _serve_pending(self, run: _Staging) -> None:
        if run.capture is not None and run.capture.has_pending:
            self._capture_early(run)

    def _split(self, run: _Staging) -> WalkPart | None:
        """The child's part of a git repository's baseline, if it is split."""
        least = self.options.split_min_files
        if run.proof is None or least is None or len(run.proof.paths) < least:
            return None
        return WalkPart.halving(run.proof.paths, inside=True, left_out=self.rules.left_out_by_name)

    def _share_in_child(self, run: _Staging, want_walked: bool) -> Iterator[bytes]:
        """In the forked child: the index parsed from the shared descriptor and split as this
        process splits it (`_split`); then the stat pass over its part (from nothing: each
        folder's files proven with the index, `IndexProof.prove_folder`; else `check_folders`,
        the files without an entry proven with it), nothing recorded, and the watches of its
        folders placed. Answers in two parts (`Forked.part`, then `Forked.result`): its part,
        the files the index proves (with their states), the others (for the parent to examine)
        and the watches, as soon as its walk is over; then the trees of its units
        (`_unit_trees`), written while the parent records the first part. None (pickled), then
        no trees, when there is no part."""
        self.rules.forked()
        found_proof = IndexProof.read(self.root, fd=run.index_fd)
        run.proof = proof = found_proof if isinstance(found_proof, IndexProof) else None
        part = self._split(run)
        if part is None:
            yield pickle.dumps(None)
            yield pickle.dumps({})
            return
        if proof is not None:
            proof.keep(_unit_runs(proof.paths, part.units))
        max_bytes = self.options.max_file_bytes
        now_ns = run.now_ns
        doubt: str | None = None
        proven: list[str] = []
        states: list[bytes] = []
        walked: list[tuple[str, str]] = []
        # a fresh baseline's folders whose every file the index proved, with their tree entries
        # (the units' trees are made of them), and the folders with a file it could not prove
        proven_folders: dict[str, FolderFiles] = {}
        unclean: set[str] = set()
        unlisted: dict[str, str] = {}

        def folders() -> Iterator[Listed]:
            nonlocal doubt
            for prefix, joined, stats in self.rules.walk_folders(keep=False, part=part, watch=run.watches, stats=True,
                                                                 unlisted=unlisted):
                if want_walked:
                    walked.append((prefix, joined))
                if doubt is None and proof is not None \
                        and not proof.attributes_clear(self.root, prefix, self.rules.lists_attributes):
                    doubt = proof.doubt or "a conversion attribute"
                yield prefix, joined, stats

        def prove(path: str, st: os.stat_result) -> bool:
            if doubt is not None or proof is None or st.st_size > max_bytes:
                return False
            state = proof.prove(path, st, now_ns)
            if state is None:
                return False
            proven.append(path)
            states.append(state)
            return True

        root = os.path.join(self.root, "")
        if run.cache.entries or proof is None:
            found = check_folders(root, folders(), cast(Mapping[str, FileState], run.cache.entries), prove)
            reached, clean, others = found.reached, found.clean, found.unproven  # new, changed, racy, too large, gone
        else:  # nothing tracked yet (a fresh baseline): each folder proven in one call
            reached = clean = 0
            others = []
            for prefix, joined, stats in folders():
                names = joined.split(NAME_SEP)
                listed = stats if stats is not None else lstat_names(root + prefix, names)
                entries: list[bytes] = []
                left = proof.prove_folder(prefix, names, listed, now_ns, max_bytes, proven, states, _encoded(joined),
                                          entries)
                if left:
                    others += [prefix + names[i] for i in left]
                    unclean.add(prefix[:-1])
                else:
                    proven_folders[prefix[:-1]] = FolderFiles.of(entries, joined.isascii())
        if doubt is not None:  # "any doubt: hash", the ids taken before it included
            others = proven + others
            proven, states = [], []
        placed = run.watches.placed() if run.watches is not None else None
        yield pickle.dumps((sorted(part.units), reached, clean, doubt, NAME_SEP.join(proven),
                            states, others, walked, placed, unlisted), protocol=pickle.HIGHEST_PROTOCOL)
        trees = self._unit_trees(part, proven_folders, unclean) if proven and not run.cache.entries else {}
        yield pickle.dumps(trees, protocol=pickle.HIGHEST_PROTOCOL)

    def _unit_trees(self, part: WalkPart, proven: Mapping[str, FolderFiles],
                    unclean: Collection[str]) -> dict[str, tuple[int, bytes]]:
        """In a split baseline's child: the tree of each of its units whose files it proved all
        (none in an `unclean` folder), made of their entries (`proven`, by folder) while the
        parent still walks its own part: {unit: (its files' count, raw tree id)}. The parent
        takes a tree whose files it then holds unchanged (`_taken_units`); {} when they cannot
        be written (the parent writes them)."""
        try:
            return _listed_trees(self.repo, proven, unclean, part.above)
        except StorageFailedError:
            return {}

    def _own_trees(self, run: _Staging, theirs: WalkPart) -> None:
        """In a split fresh baseline, once this process walked its part and while the child
        still walks or writes its own trees: the trees of this part's folders (those of no
        unit and above none, `_top_below`) whose every file the index proved, made of their
        entries (`_Staging.listed`), for `_taken_units` with the child's. Files still with the
        hashing workers are recorded first: the entries of a folder with a file the index could
        not prove are then made from what is recorded. Early captures are served meanwhile (a
        path captured now is pinned: its folder's tree is not taken)."""
        if run.batch is not None:
            self._finish(run, run.batch.flush())
        self._keep_proven(run)
        listed, run.listed = run.listed, None
        if listed is None:
            return
        entries = run.cache.entries
        for prefix, joined in run.unproven_folders:
            made: list[bytes] = []
            for name, encoded in zip(joined.split(NAME_SEP), _encoded(joined), strict=True):
                state = entries.get(RepoPath(prefix + name))
                if state is not None:  # not one gone, left out or unreadable
                    made.append(b"%o %s\0%s" % (state_mode(state), encoded, state_oid(state)))
            if made:
                listed[prefix[:-1]] = FolderFiles.of(made, joined.isascii())
        run.unproven_folders = []
        if listed:
            run.unit_trees.update(_listed_trees(self.repo, listed, (), theirs.above, partial(self._serve_pending, run)))

    def _take_share(self, run: _Staging, theirs: WalkPart, answer: bytes | None,
                    walked: list[tuple[str, str]] | None, unlisted: dict[str, str]) -> tuple[int, int] | None:
        """Record the child's answer (paths captured early meanwhile keep their capture), the
        folders it could not read into `unlisted`; None if there is none, or it walked another
        part than `theirs` (which this process then walks). The watches it placed are taken
        over either way."""
        if answer is None:
            return None
        try:
            loaded = pickle.loads(answer)
            if loaded is None:
                return None
            units, reached, clean, doubt, joined, states, others, child_walked, placed, child_unlisted = loaded
        except Exception:  # a whole answer that is not one: the caller walks the folders itself
            log.info("scanner.child_answer_unreadable")
            return None
        if placed is not None and run.watches is not None:
            run.watches.adopt(*placed)
        if frozenset(units) != theirs.units:  # it read another index than this process's: never by design
            log.info("scanner.child_split_differs", root=str(self.root))
            return None
        pinned = run.capture.pinned if run.capture is not None else set()
        if walked is not None:
            walked.extend(child_walked)
        unlisted.update(child_unlisted)
        proven: list[str] = joined.split(NAME_SEP) if joined else []
        if doubt is not None and run.proof is not None:
            run.proof.doubt = doubt
            self._unborrow(run)
        if run.proof is None:  # doubted, here or there: the proven files are hashed too
            others = proven + others
            proven = []
        if run.fresh:  # recorded with this process's own (`_keep_proven`)
            run.proven_paths.extend(cast(list[RepoPath], proven))
            run.proven_states.extend(states[:len(proven)])  # none when doubted (`proven` emptied)
        else:
            for path, state in zip(proven, states[:len(proven)], strict=True):
                if path not in pinned:
                    self._keep_borrowed(run, RepoPath(path), state)
        for path in others:
            if path not in pinned:
                self._stage_listed(run, RepoPath(path))
        return reached, clean

    def _take_trees(self, run: _Staging, answer: bytes | None) -> None:
        """Take the trees of the child's units (the second part of its answer) while the ids
        it proved hold: none when it failed, or the index was doubted meanwhile."""
        if answer is None or run.proof is None or not run.fresh:
            return
        try:
            trees = pickle.loads(answer)
        except Exception:  # a whole answer that is not one: the trees are written here
            log.info("scanner.child_answer_unreadable")
            return
        run.unit_trees.update(trees)

    def _keep_borrowed(self, run: _Staging, path: RepoPath, state: FileState) -> None:
        """Record `state`, which holds a blob id from the index (`IndexProof.prove`, here or in a child)."""
        self._borrowing(run)
        run.stats.examined += 1
        run.stats.borrowed += 1
        if run.fresh:
            run.cache.set(path, state)  # from nothing, the cache alone holds what changed (`_record`)
        else:
            self._record(run, path, TreeEntry(state_oid(state).hex(), state_mode(state)), state)
        run.borrowed.append(path)

    def _borrowing(self, run: _Staging) -> None:
        """Before the first borrowed id is used: the user's objects become readable here (read-only)."""
        assert run.proof is not None
        if not run.alternate_added:
            borrowed.begin(self.repo, run.proof.objects_dir)
            run.alternate_added = True

    def _keep_proven(self, run: _Staging) -> None:
        """Record the files a fresh baseline's walk proved, here and in its child (100k: ~50 ms
        less than one by one), but those captured early meanwhile: they keep their capture."""
        paths, states = run.proven_paths, run.proven_states
        if not paths:
            return
        run.proven_paths, run.proven_states = [], []
        pinned = run.capture.pinned if run.capture is not None else set()
        if pinned:
            kept = [i for i, path in enumerate(paths) if path not in pinned]
            paths, states = [paths[i] for i in kept], [states[i] for i in kept]
        if not paths:
            return
        self._borrowing(run)
        run.stats.examined += len(paths)
        run.stats.borrowed += len(paths)
        run.cache.set_many(zip(paths, states, strict=True))  # from nothing, the cache holds what changed
        run.borrowed.extend(paths)

    def _unborrow(self, run: _Staging) -> None:
        """Take no more ids from the index, and hash the files whose id was taken."""
        assert run.proof is not None
        self._keep_proven(run)  # those too
        log.info("git_index.doubted", root=str(self.root), reason=run.proof.doubt, action="hashing every file",
                 rehashing=len(run.borrowed))
        run.proof = None
        run.unit_trees = {}  # written from the index's ids
        run.listed, run.unproven_folders = None, []
        taken, run.borrowed = run.borrowed, []
        run.stats.borrowed -= len(taken)
        for path in taken:
            run.stats.examined -= 1
            run.cache.remove(path)
            try:
                st = os.lstat(self.root / path)
            except OSError:
                self._record(run, path, None)
                continue
            self._stage_stat(run, path, st)

    def _note_borrowed(self, run: _Staging) -> None:
        """Write down, before any commit names it, the tree whose blobs may still be read from
        the user's repository: one line, whatever the count (the copy lists the tree's blobs
        and copies those the shadow repository lacks). At 100k files, a line per blob took
        ~60 ms of every baseline."""
        if run.borrowed and run.cache.tree is not None:
            borrowed.record_tree(self.repo.git_dir, run.cache.tree)

    def _capture_early(self, run: _Staging) -> None:
        """Record the current content of the paths edit tools asked for, and pin them (SPEC §3).

        Hashed on this thread, after the files the workers hold were recorded: the captured
        content is the newest the scan records for them. A folder is not captured (the tool may
        change anything in it): its request then waits for the whole scan.
        """
        assert run.capture is not None
        capture = run.capture
        for req in capture.take():
            batch, run.batch = run.batch, None
            try:
                if batch is not None:
                    self._finish(run, batch.flush())
                for path in req.paths:
                    if path in capture.pinned:
                        continue
                    if os.path.isdir(self.root / path) and not os.path.islink(self.root / path):
                        req.needs_whole_scan = True
                        continue
                    capture.pinned.add(path)
                    self._stage_path(run, path, forced=False, expand_dirs=False)
            finally:
                run.batch = batch
                req.done.set()
        log.debug("scanner.captured_early", root=str(self.root), pinned=len(capture.pinned))

    def _stage_path(self, run: _Staging, path: RepoPath, *, forced: bool, expand_dirs: bool = True) -> None:
        if run.batch is not None:
            # files still with the workers are recorded first, as if hashed when submitted
            self._finish(run, run.batch.flush())
        cache = run.cache
        link_parent = self._symlink_ancestor(path)
        if link_parent is not None:
            # git never stages a path beyond a symlink: the link itself is what changed.
            for tracked in [path, *cache.under(link_parent)]:
                self._record(run, tracked, None)
            self._stage_path(run, link_parent, forced=forced, expand_dirs=False)
            return
        try:
            st = os.lstat(f"{self._root}/{path}" if path else self._root)
        except OSError as exc:
            if not is_gone(exc):
                self._unreadable(run, path, exc)
                return
            self._record(run, path, None)
            for tracked in cache.under(path):
                self._record(run, tracked, None)
            return
        for folder in folders_above(path):
            if folder in cache.entries:
                # A folder now stands where a tracked file was, and this path is in it. Its
                # tree drops the file anyway; the stat cache kept it, and a later rescan, finding
                # a folder there, recorded the file as gone: that took the folder's files out
                # of the tree (tests/property/test_model.py found it).
                self._record(run, folder, None)
        if stat.S_ISDIR(st.st_mode):
            self._record(run, path, None)
            if not expand_dirs or (not forced and self.rules.is_excluded(path, is_dir=True)):
                return
            # Even a forced folder is not entered when it is a nested repository (SPEC §4):
            # otherwise its files were snapshotted, and a restore would write or delete them.
            if forced and self.rules.is_nested_repo(path):
                return
            seen: set[RepoPath] = set()
            unlisted: dict[str, str] = {}
            for child, dirent in self._walk_dir(path, forced, unlisted):
                seen.add(child)
                try:
                    cst = dirent.stat(follow_symlinks=False)
                except OSError as exc:
                    if is_gone(exc):
                        self._record(run, child, None)
                    else:
                        self._unreadable(run, child, exc)
                    continue
                self._stage_stat(run, child, cst)
            self._skip_unlisted(run, unlisted)
            for tracked in cache.under(path):
                if tracked not in seen:
                    self._stage_path(run, tracked, forced=True, expand_dirs=False)
            return
        # A file or link now stands where a tracked folder was: the folder's files are gone.
        # (Without this the tree dropped them but the stat cache kept them, and a later
        # folder with the same files was taken for "unchanged" and left out of the tree.)
        for tracked in cache.under(path):
            self._record(run, tracked, None)
        if not forced and path not in cache.entries and self.rules.is_excluded(path, is_dir=False):
            return
        self._stage_stat(run, path, st)

    def _walk_dir(self, path: RepoPath, forced: bool,
                  unlisted: dict[str, str]) -> Iterator[tuple[RepoPath, os.DirEntry[str]]]:
        """The files under the folder `path`; the folders it cannot read go into `unlisted`."""
        if not forced:
            yield from self.rules.walk(path, unlisted)
            return
        # A directory an edit tool reported: everything in it but git dirs and nested repos.
        stack = [path]
        while stack:
            current = stack.pop()
            try:
                with os.scandir(self.root / current) as it:
                    entries = list(it)
            except OSError as exc:
                note_unlisted(unlisted, current, exc)
                continue
            for dirent in entries:
                if is_git_component(dirent.name):
                    continue
                child = RepoPath(f"{current}/{dirent.name}")
                if dirent.is_dir(follow_symlinks=False):
                    if not self.rules.is_nested_repo(child):
                        stack.append(child)
                else:
                    yield child, dirent

    def _symlink_ancestor(self, path: RepoPath) -> RepoPath | None:
        """The folder above `path` that is a symlink now, if one is (the nearest the root)."""
        parts = path.split("/")
        if len(parts) > _FOLDERS_AT_ONCE and is_real_folder(f"{self._root}/{path.rpartition('/')[0]}"):
            return None
        current = self._root
        for i, part in enumerate(parts[:-1]):
            current = f"{current}/{part}"
            try:
                st = os.lstat(current)
            except OSError:
                return None
            if stat.S_ISLNK(st.st_mode):
                return RepoPath("/".join(parts[: i + 1]))
            if not stat.S_ISDIR(st.st_mode):
                return None
        return None

    def _record(self, run: _Staging, path: RepoPath, entry: TreeEntry | None,
                state: FileState | None = None) -> None:
        """Note the new content of `path`; a path back at its original content is no change."""
        cache = run.cache
        if run.unit_trees:
            run.touched.add(path)
        if not run.fresh:  # from nothing, the cache alone holds what changed
            if path not in run.originals:
                run.originals[path] = cache.entry(path)
            if entry == run.originals[path]:
                run.changes.pop(path, None)
            else:
                run.changes[path] = entry
        if entry is None:
            cache.remove(path)
        elif state is not None:
            cache.set(path, state)

    def _stage_stat(self, run: _Staging, path: RepoPath, st: os.stat_result) -> None:
        run.stats.examined += 1
        if st.st_nlink > 1 and not run.stats.rescan and stat.S_ISREG(st.st_mode):
            run.linked.add(st.st_ino)
        known = run.cache.entries.get(path)
        if known is not None and (is_clean(known, st) or (path in run.vouched and same_stat(known, st))):
            return
        mode = st.st_mode
        if stat.S_ISLNK(mode):
            try:
                target = os.readlink(self.root / path)
            except OSError as exc:
                reason = SkipReason.VANISHED if exc.errno == errno.ENOENT else SkipReason.UNREADABLE
                self._skip(run, path, reason, str(exc))
                return
            entry = TreeEntry(self.repo.write_blob(os.fsencode(target)), MODE_LINK)
            run.stats.hashed += 1
            self._record(run, path, entry, state_of(st, entry, run.now_ns))
        elif stat.S_ISREG(mode):
            if st.st_size > self.options.max_file_bytes:
                self._skip(run, path, SkipReason.TOO_LARGE, f"{st.st_size} bytes")
            elif run.batch is not None:
                self._finish(run, run.batch.submit(path, st.st_size))
            else:
                self._hash_file(run, path)
        else:
            self._skip(run, path, SkipReason.NOT_REGULAR, "")

    def _hash_file(self, run: _Staging, path: RepoPath) -> None:
        """Read and write one regular file on this thread."""
        self._finish(run, [(path, snapshot_file(lambda: self._read_file(path), self.options.max_file_bytes,
                                                self.repo.write_blob))])

    def _finish(self, run: _Staging, results: list[Result]) -> None:
        """Record what became of files (on the workers or here); hash the ones given back."""
        for path, outcome in results:
            if outcome is None:
                self._hash_file(run, path)
            elif isinstance(outcome, HashedFile):
                self._record_file(run, path, outcome.oid, outcome.stat)
            else:
                self._skip(run, path, _SKIP_REASONS[outcome.kind], outcome.detail)

    def _record_file(self, run: _Staging, path: RepoPath, oid: str, st: os.stat_result) -> None:
        entry = file_entry(oid, st.st_mode)
        run.stats.hashed += 1
        self._record(run, path, entry, state_of(st, entry, run.now_ns))

    def _read_file(self, path: RepoPath) -> tuple[bytes, os.stat_result]:
        return read_file(f"{self._root}/{path}", self.options.max_file_bytes)

    def _skip(self, run: _Staging, path: RepoPath, reason: SkipReason, detail: str) -> None:
        run.stats.skipped.append(Skipped(path, reason, detail))
        self._record(run, path, None)
        log.warning("scanner.skipped", root=str(self.root), path=path, reason=reason.value, detail=detail)
