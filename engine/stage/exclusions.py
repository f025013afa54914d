"""`ExclusionRules`: the one place that decides what a snapshot scan includes (SPEC §4).

Built-in categories, `.gitignore` files (git's semantics), Git LFS, extra patterns, `.git`, nested
repositories. The scanner walks with it and filters watcher paths through it, on the engine thread
or the baseline future. It only reads: never writes, renames, or follows a symlink.
"""

from __future__ import annotations

import bisect
import contextlib
import errno
import itertools
import operator
import os
import stat
import struct
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from operator import attrgetter
from pathlib import Path
from typing import Final, Protocol

import structlog

from shadowpoint.config.exclusion_data import BUILTIN_EXCLUSIONS
from shadowpoint.stage.patterns import (
    NEGATED,
    PatternSet,
    lfs_patterns,
    parse_ignore_line,
    read_rule_file,
    rule_lines,
    submodule_paths,
)
from shadowpoint.workspace import RepoPath

log = structlog.get_logger(__name__)

GIT_DIR: Final = ".git"
GITIGNORE: Final = ".gitignore"
GITATTRIBUTES: Final = ".gitattributes"
GITMODULES: Final = ".gitmodules"
RULE_FILES: Final = frozenset({GITIGNORE, GITATTRIBUTES, GITMODULES})
"""Files whose change calls for `ExclusionRules.invalidate` (and any `.git`, in any case)."""

_WORKSPACE_ROOT: Final = RepoPath("")
# A folder listing is reused only if the folder's ctime is older than the listing by more than
# the kernel's coarse file clock (a jiffy) and small clock steps: an entry added in the same
# clock tick as the listing would otherwise leave the times unchanged (git's racy-clean rule).
_RACY_MARGIN_NS: Final = 1_000_000_000
_NO_GIT_MAX: Final = 65_536  # folders remembered without a `.git` (`in_nested_repo`)
_entry_name = attrgetter("name")  # a folder's entries are listed in name order

# a folder's (mtime, ctime, inode) as one small bytes: a tuple of three big ints took ~180 bytes
_STAMP: Final = struct.Struct("<qqQ")


def _stamp(st: os.stat_result) -> bytes | None:
    """The folder's listing stamp, None if a time lies past what int64 nanoseconds hold."""
    try:
        return _STAMP.pack(st.st_mtime_ns, st.st_ctime_ns, st.st_ino)
    except struct.error:
        return None


# ---------------------------------------------------------------- the rules


_ACCESS_NOFOLLOW = os.access in os.supports_follow_symlinks  # not on Windows


def _exists(path: str) -> bool:
    """Whether `path` exists (a symlink counts, whatever it points at): `os.path.lexists`
    without the exception a missing path raises inside it (most folders have neither a
    `.gitignore` nor a `.git`: ~2 us less a folder, 8,800 folders at each watcher start)."""
    if _ACCESS_NOFOLLOW:
        return os.access(path, os.F_OK, follow_symlinks=False)
    return os.path.lexists(path)


def _scan(folder: str) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(folder) as it:
            return list(it)
    except OSError:
        return []


def _entry_dirs(entries: Sequence[os.DirEntry[str]]) -> list[bool]:
    """Whether each entry is a folder (not following symlinks; one that vanished is not)."""
    out = []
    for entry in entries:
        try:
            out.append(entry.is_dir(follow_symlinks=False))
        except OSError:
            out.append(False)
    return out


def _entry_is_file(entries: Sequence[os.DirEntry[str]], i: int) -> bool:
    try:
        return entries[i].is_file(follow_symlinks=False)
    except OSError:
        return False


def _is_file_at(stats: Sequence[os.stat_result], i: int) -> bool:
    return stat.S_ISREG(stats[i].st_mode)


def _is_file_in(folder: str, names: Sequence[str], i: int) -> bool:
    try:
        return stat.S_ISREG(os.lstat(os.path.join(folder, names[i])).st_mode)
    except OSError:
        return False


# how a walk opens a folder to read it or lstat its entries from it: never through a symlink
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _read_with_types(folder: str) -> tuple[os.stat_result, list[str], list[bool], None]:
    """The folder's stat, its entries' names in name order and whether each is a folder (from
    the listing's types: no lstat each).

    Raises:
        OSError: it cannot be read.
    """
    st = os.lstat(folder)
    with os.scandir(folder) as it:
        entries = sorted(it, key=_entry_name)
    return st, [entry.name for entry in entries], _entry_dirs(entries), None


def _read_with_stats(folder: str) -> tuple[os.stat_result, list[str], list[bool], list[os.stat_result]]:
    """`_read_with_types` with each entry's lstat (an entry gone before it is left out), all
    through one descriptor of the folder, opened without following a symlink.

    Raises:
        OSError: it cannot be read.
    """
    fd = os.open(folder, DIR_FLAGS)
    try:
        st = os.fstat(fd)
        names = os.listdir(fd)
        names.sort()
        kept: list[str] = []
        stats: list[os.stat_result] = []
        lstat = os.lstat
        for entry_name in names:
            try:
                stats.append(lstat(entry_name, dir_fd=fd))
            except OSError as exc:
                if not is_gone(exc):
                    raise  # the folder cannot be read (listed without search permission)
                continue  # gone since the listing
            kept.append(entry_name)
    finally:
        os.close(fd)
    return st, kept, [stat.S_ISDIR(entry.st_mode) for entry in stats], stats


def is_gone(exc: OSError) -> bool:
    """Whether an lstat or open that failed with `exc` found nothing there any more: the path
    is gone, or a parent is no folder now (a symlink or file replaced it: ELOOP when opened
    without following it). Anything else (permissions, an I/O error) is a path that may still
    hold files, which cannot be read now."""
    return isinstance(exc, (FileNotFoundError, NotADirectoryError)) or exc.errno == errno.ELOOP


def note_unlisted(unlisted: dict[str, str] | None, rel: str, exc: OSError) -> None:
    """A folder a walk could not read: into `unlisted` (its path, why), unless it is gone
    (removed since its parent was listed, or no longer a folder). A folder that exists but
    cannot be read (permissions, an I/O error) is no empty folder: its files are not known to
    be gone, and its caller says so (SPEC §7: never silently)."""
    if is_gone(exc):
        log.debug("exclusions.folder_gone", path=rel, error=str(exc))
        return
    log.debug("exclusions.folder_unreadable", path=rel, error=str(exc))
    if unlisted is not None:
        unlisted[rel] = exc.strerror or str(exc)


def _deciding_line(lines: Sequence[str], rel: str, name: str, is_dir: bool, *,
                   casefold: bool = False) -> tuple[int, str] | None:
    """(1-based line number, text) of the last line of a rule list that matches, if it excludes."""
    for number in range(len(lines), 0, -1):
        line = lines[number - 1]
        pattern = parse_ignore_line(line)
        if pattern is None:
            continue
        label = PatternSet([(pattern, "x")], casefold=casefold).decide(rel, name, is_dir)
        if label is not None:
            return (number, line.strip()) if label else None
    return None


def ignored_changes(root: Path, since: float, *, extra: Sequence[str] = (), max_file_bytes: int | None = None,
                    docs_dir: Path | None = None) -> list[dict[str, str]]:
    """Files (and folders) changed after `since` (a POSIX time) that checkpoints leave out, each
    with the rule that does: `{path, why, rule}` (a folder's path ends in "/"). Files above
    `max_file_bytes` count too (the scanner skips them). Sorted by path.
    """
    rules_extra = list(extra)
    store: str | None = None
    if docs_dir is not None:
        with contextlib.suppress(ValueError):
            store = str(Path(os.path.realpath(docs_dir)).relative_to(root))
            rules_extra.append(f"/{store}/")
    rules = ExclusionRules(root, extra=rules_extra)
    out: list[dict[str, str]] = []
    for path, entry, reason in rules.walk_excluded():
        if path == store:
            continue  # the checkpoint store itself: never a project file
        try:
            is_dir = entry.is_dir(follow_symlinks=False)
            newest = entry.stat(follow_symlinks=False).st_mtime
            if is_dir:
                newest = max([newest, *(e.stat(follow_symlinks=False).st_mtime for e in _scan(entry.path))])
        except OSError:
            continue
        if newest > since:
            out.append({"path": path + ("/" if is_dir else ""), "rule": reason,
                        "why": rules.explain(path, reason, is_dir=is_dir)})
    if max_file_bytes is not None:
        for path, entry in rules.walk():
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode) and st.st_size > max_file_bytes and st.st_mtime > since:
                out.append({"path": path, "rule": "size_cap",
                            "why": f"larger than the size cap ({st.st_size:,} > {max_file_bytes:,} bytes, "
                                   "max_file_bytes)"})
    return sorted(out, key=lambda e: e["path"])


# The .gitignore files that decide a folder's entries, deepest first: (its rules, the length of
# its folder's prefix, "a/b/" → 4), so that a path's part below that folder is `path[base:]`.
# A folder without a .gitignore of its own shares its parent's chain (and `_DirInfo`): at 1M
# files, one tuple with one prefix string per folder took ~50 MiB.
Chain = tuple[tuple[PatternSet, int], ...]


@dataclass(frozen=True, slots=True)
class _DirInfo:
    """What is known about one folder: why it is excluded, or the rule files for its entries."""

    reason: str | None  # set when the folder itself, or an ancestor, is excluded
    chain: Chain = ()
    is_link: bool = False  # a symlink: nothing lies "under" it


_NO_RULE_FILES = _DirInfo(None)

# what joins the names of a folder's files in `walk_folders` (no file name holds a NUL)
NAME_SEP = "\0"
_FRAMED_GITIGNORE = f"{NAME_SEP}{GITIGNORE}{NAME_SEP}"
_FRAMED_GIT_DIR = f"{NAME_SEP}{GIT_DIR}{NAME_SEP}"  # any letter case: looked for in the lowered names
# a folder of a walk (`ExclusionRules.walk_folders`): its prefix ("" or "a/b/"), its files'
# names joined by NAME_SEP, and their lstat when the walk read them (else None)
Listed = tuple[str, str, list[os.stat_result] | None]


def unwalked(paths: Iterable[str], walked: Iterable[tuple[str, str]]) -> list[str]:
    """The `paths` that a walk did not yield, `walked` being what `walk_folders` yielded (prefix,
    the names joined). Looked up folder by folder in the walk's own strings: a set of every
    walked path took ~100 MiB at 1M files."""
    folders = dict(walked)
    out = []
    for path in paths:
        cut = path.rfind("/") + 1
        joined = folders.get(path[:cut])
        if joined is None or not _has_name(joined, path[cut:]):
            out.append(path)
    return out


def _has_name(joined: str, name: str) -> bool:
    """True if `name` is one of the NAME_SEP-joined names."""
    end = len(joined)
    at = joined.find(name)
    while at >= 0:
        after = at + len(name)
        if (at == 0 or joined[at - 1] == NAME_SEP) and (after == end or joined[after] == NAME_SEP):
            return True
        at = joined.find(name, at + 1)
    return False


def _folder_groups(paths: Sequence[str], lo: int, hi: int, prefix: str) -> list[tuple[str, int, int, int]]:
    """The sub-folders of `prefix` among `paths[lo:hi]` (sorted, all starting with `prefix`):
    (folder, how many paths it holds, their range)."""
    out = []
    start = len(prefix)
    i = lo
    while i < hi:
        slash = paths[i].find("/", start)
        if slash < 0:
            i += 1  # a file of `prefix` itself
            continue
        folder = paths[i][:slash]
        end = bisect.bisect_left(paths, folder + "0", i, hi)  # "0" sorts right after "/"
        end = max(end, i + 1)  # an unsorted run (names git sorts by bytes otherwise) moves on
        out.append((folder, end - i, i, end))
        i = end
    return out


# the share of a split walk's files that its units hold (`WalkPart.halving`), the side the forked
# child walks. Half: the child also sorts its proven paths, writes its units' trees and pickles
# its answer, the parent its own trees and the rest. A 100k-file git repository's baseline:
# at 52 % the parent waited ~70 ms for the child's answer, at 50 % ~5 ms (and ~40 ms sooner
# ready, in-process, alternated), at 49 % the child waited for the parent.
_UNITS_SHARE = 0.50


def _walked_groups(groups: list[tuple[str, int, int, int]], left_out: Callable[[str], bool] | None
                   ) -> tuple[list[tuple[str, int, int, int]], int]:
    """`groups` (`_folder_groups`'s) but those `left_out` says the walk never enters, and how
    many paths those held."""
    if left_out is None:
        return groups, 0
    kept = [group for group in groups if not left_out(group[0])]
    return kept, sum(group[1] for group in groups) - sum(group[1] for group in kept)


class FolderWatch(Protocol):
    """Watches the folders a walk lists, each before it is listed (a deferred watcher start's
    watches: `inotify.FolderWatches`)."""

    def add(self, folder: str) -> None:
        """Watch `folder` (an absolute path), about to be listed."""
        ...

    def drop(self, folder: str) -> None:
        """`folder` turned out to be excluded once listed (a nested repository)."""
        ...


@dataclass(frozen=True, slots=True)
class WalkPart:
    """One side of a walk split in two: `units` are folders (no trailing "/") that one side
    walks whole and the other never enters. `inside=False`: everything but the units;
    `inside=True`: the units only (their parent folders are read for the rules that reach the
    units, but their files are the other side's)."""

    units: frozenset[str]
    inside: bool
    # every folder above a unit ("" is the root's), built from `units`
    above: frozenset[str] = field(init=False)

    def __post_init__(self) -> None:
        above: set[str] = set()
        for unit in self.units:
            while "/" in unit:
                unit = unit.rsplit("/", 1)[0]
                above.add(unit)
        object.__setattr__(self, "above", frozenset(above))

    @classmethod
    def halving(cls, paths: Sequence[str], inside: bool,
                left_out: Callable[[str], bool] | None = None) -> WalkPart | None:
        """Units holding about half of `paths` (file paths, sorted as git's index sorts them);
        None when no folder split comes near half (a flat tree, one huge folder of files).
        `left_out(folder)`: the walk will not enter it; its paths count for neither side (a
        committed `node_modules` of 8,000 files left the other side ~40 ms short of this one
        in a 100k-file baseline)."""
        groups = _folder_groups(paths, 0, len(paths), "")
        groups, skipped = _walked_groups(groups, left_out)
        want = int((len(paths) - skipped) * _UNITS_SHARE)
        units: list[str] = []
        taken = 0
        while groups and taken < want * 0.97:
            groups.sort(key=lambda g: g[1])
            folder, count, lo, hi = groups.pop()  # the largest left
            if taken + count <= want * 1.03:
                units.append(folder)
                taken += count
            else:  # too big: its sub-folders instead (its own files stay with the other side)
                subs, skipped = _walked_groups(_folder_groups(paths, lo, hi, folder + "/"), left_out)
                want -= int(skipped * _UNITS_SHARE)
                groups.extend(subs)
        if taken < want * 0.75:
            return None
        return cls(frozenset(units), inside)

    def descend(self, sub: str, parent_mine: bool) -> bool | None:
        """Whether the folder `sub` is walked (None: not), and if so whether its files are this
        side's. `parent_mine`: its parent's files are."""
        if not self.inside:
            return None if sub in self.units else True
        if parent_mine or sub in self.units:
            return True
        return False if sub in self.above else None


@dataclass(frozen=True, slots=True)
class _Listing:
    """The included entries of one folder as a whole-workspace walk found them.

    Valid while the folder's (mtime, ctime, inode) is `stamp` (entries added, removed or
    renamed change mtime and ctime; no tool can set a ctime back) and its entries are decided
    by the same `chain` of rule files.
    """

    stamp: bytes | None  # `_stamp` of the folder; None: listed too soon after a change to be trusted
    parent_chain: Chain  # the parent's rules when it was listed
    chain: Chain
    reason: str | None  # the folder itself is excluded (a nested repository)
    has_gitignore: bool
    has_attributes: bool  # it holds a `.gitattributes` (`ExclusionRules.lists_attributes`)
    # included entries that are not folders, joined by NAME_SEP: one string per folder, not
    # one per file (~5 MiB of a 100k-file sidecar's peak memory)
    files: str
    dirs: str  # included sub-folders, joined by NAME_SEP like `files`


class ExclusionRules:
    """Decides which workspace paths a scan includes (SPEC §4 "Exclusions").

    A path is excluded when any rule says so (the rules are a union): a `.git` component
    (any letter case), a nested repository or submodule, a built-in category, an extra
    pattern, the `.gitignore` files (git's semantics, nested files included), or a Git LFS
    pattern of the root `.gitattributes`. An extra `!pattern` re-includes what a built-in
    category leaves out (not what the project's `.gitignore` or LFS rules do). Folder decisions
    are cached per folder; call
    `invalidate` when a rule file or a `.git` changes. Built-in type patterns (`*.png`)
    ignore letter case; everything else is case-sensitive, like git on Linux.
    """

    def __init__(
        self,
        root: Path,
        *,
        builtin: Mapping[str, Sequence[str]] | None = None,
        extra: Sequence[str] = (),
    ) -> None:
        """Compile the built-in and extra patterns; nothing is read from disk yet.

        Args:
            root: The workspace root.
            builtin: Category -> gitignore-style patterns; None means `BUILTIN_EXCLUSIONS`.
            extra: More gitignore-style patterns, anchored at the root like a root `.gitignore`.
        """
        self.root = Path(root)
        self._root = os.fspath(root)
        categories = BUILTIN_EXCLUSIONS if builtin is None else builtin
        builtin_set = PatternSet(
            (
                (pattern, f"builtin:{category}")
                for category, lines in categories.items()
                for line in lines
                if (pattern := parse_ignore_line(line)) is not None
            ),
            casefold=True,
        )
        extra_set = PatternSet(
            (pattern, "extra") for line in extra if (pattern := parse_ignore_line(line)) is not None
        )
        self._builtin = None if builtin_set.is_empty else builtin_set
        self._builtin_source = None if builtin is None else builtin
        self._extra_lines = tuple(extra)
        self._extra = None if extra_set.is_empty else extra_set
        self._lfs: PatternSet | None = None
        self._submodules: frozenset[str] = frozenset()
        self._submodule_parents: frozenset[str] = frozenset()  # the folders that hold one
        # folder -> its stamp (`_stamp`) when `in_nested_repo` found no `.git` in it, the folder
        # unchanged for a second by then: while the stamp holds, none came (an entry made in a
        # folder moves its times), so the lookup is skipped
        self._no_git: dict[str, bytes] = {}
        # the folders the last `walk_folders` listed: whether each holds a `.gitattributes`
        self._attributes: dict[str, bool] = {}
        self._dirs: dict[str, _DirInfo] = {}
        self._dirs_lock = threading.Lock()  # guards iteration and writes of _dirs, never I/O
        # `walk_paths` state, kept from one whole-workspace walk to the next (its caller's thread)
        self._listings: dict[str, _Listing] = {}
        self._root_files: tuple[str | None, str | None] | None = None  # .gitattributes, .gitmodules
        self._lfs_text: str | None = None
        self._modules_text: str | None = None
        # .gitignore text and its compiled set per folder: unchanged text keeps the same set, so
        # a listing's `chain` still compares equal
        self._ignore_files: dict[str, tuple[str, PatternSet | None]] = {}

    # ------------------------------------------------------------ public API

    def forked(self) -> None:
        """In a forked child: a fresh lock (another thread of the parent may have held it)."""
        self._dirs_lock = threading.Lock()

    def walk(self, start: RepoPath = _WORKSPACE_ROOT, unlisted: dict[str, str] | None = None
             ) -> Iterator[tuple[RepoPath, os.DirEntry[str]]]:
        """Yield every included non-folder entry under `start`, pruning excluded folders.

        Regular files, symlinks (a symlink to a folder is a leaf, never followed), fifos and
        the like are yielded; excluded folders and nested repositories are never entered.
        Walking from the root re-reads every rule file; a walk from a sub-folder uses the
        cached decisions for its ancestors. Nothing is yielded if `start` is excluded or
        is not a folder.

        Args:
            start: The folder to walk, "" for the whole workspace.
            unlisted: receives each folder that could not be read, with why (`note_unlisted`).

        Returns:
            An iterator of (path, entry); `entry.stat(follow_symlinks=False)` is the caller's.
        """
        if not start:
            with self._dirs_lock:
                self._dirs.clear()
            root_info = self._load_root()
            pending: list[tuple[str, str, _DirInfo]] = [("", "", root_info)]
        else:
            parent, _, name = start.rpartition("/")
            parent_info = self._dir_info(parent)
            if parent_info.reason is not None or parent_info.is_link:
                return
            try:
                if not stat.S_ISDIR(os.lstat(os.path.join(self._root, start)).st_mode):
                    return
            except OSError:
                return
            if self._entry_reason(parent_info, start, name, True) is not None:
                return
            pending = [(start, name, parent_info)]
        while pending:
            rel, name, parent_info = pending.pop()
            folder = os.path.join(self._root, rel) if rel else self._root
            try:
                with os.scandir(folder) as it:
                    entries = list(it)
            except OSError as exc:
                note_unlisted(unlisted, rel, exc)
                continue
            if rel:
                info = self._listed_dir_info(rel, name, parent_info, folder, [entry.name for entry in entries],
                                             partial(_entry_is_file, entries))
                with self._dirs_lock:
                    self._dirs[rel] = info
                if info.reason is not None:
                    continue
            else:
                info = parent_info
            prefix = f"{rel}/" if rel else ""
            files, dirs = self._included(info, prefix, [entry.name for entry in entries], _entry_dirs(entries))
            for i in dirs:
                pending.append((prefix + entries[i].name, entries[i].name, info))
            for i in files:
                yield RepoPath(prefix + entries[i].name), entries[i]

    def walk_folders(self, keep: bool = True, part: WalkPart | None = None,
                     watch: FolderWatch | None = None, stats: bool = False,
                     unlisted: dict[str, str] | None = None) -> Iterator[Listed]:
        """Every included non-folder entry of the workspace, like `walk()` from the root, as
        (folder path with a trailing "/", or "" for the root; the names of its included entries,
        joined by `NAME_SEP`: the listing's own string, so that a caller that keeps it holds no copy).

        Reuses the listing of each folder whose times and rules are unchanged since the
        previous `walk_folders` (no directory read, no pattern matching there): a rescan of an
        unchanged tree then costs one lstat per folder. Folders changed less than a second
        before they were listed are listed again next time.

        `keep=False` keeps nothing for the next walk (no listings, no folder decisions: at 1M
        files those are ~70 MiB), so every folder is read again each time: for a walk that
        runs seldom and off the agent's path (the watcher's verification).

        `part`: only one side of a walk split in two (`WalkPart`); the folders of the other
        side are not kept, so the next walk lists them again.

        `watch`: given each folder whose files are this walk's before it is listed (dropped
        again when the listing shows it excluded).

        `stats`: a folder listed anew gives its files' lstat, read as it was listed (each entry's
        type is read from it): the caller needs no lstat of its own there (a baseline).

        `unlisted`: receives each folder that could not be read, with why (`note_unlisted`).

        Returns:
            An iterator of (folder prefix, entry names joined by NAME_SEP, never empty; their
            lstat in that order when `stats` and the folder was listed anew, else None: the
            caller's).
        """
        with self._dirs_lock:
            self._dirs.clear()
        root_info = self._load_root()
        root_files = (self._lfs_text, self._modules_text)
        if root_files != self._root_files:
            self._listings.clear()  # LFS patterns or submodules changed: every decision may have
            self._root_files = root_files
        old = self._listings
        if not keep:
            self._listings = old = {}
        new: dict[str, _Listing] = {}
        infos: dict[str, _DirInfo] = {}
        self._attributes = attributes = {}
        # the last field: whether the folder's files are this walk's (always, without a part)
        pending: list[tuple[str, str, _DirInfo, bool]] = [("", "", root_info, part is None or not part.inside)]
        while pending:
            rel, name, parent_info, mine = pending.pop()
            folder = f"{self._root}/{rel}" if rel else self._root
            if watch is not None and mine:
                watch.add(folder)
            listing = self._reused_listing(rel, name, parent_info, folder, old.get(rel))
            file_stats = None
            if listing is None:
                listed = self._list_folder(rel, name, parent_info, folder, stats, unlisted)
                if listed is None:
                    continue
                listing, file_stats = listed
            attributes[rel] = listing.has_attributes
            if listing.reason is not None:
                if watch is not None and mine:
                    watch.drop(folder)
                if keep:
                    new[rel], infos[rel] = listing, _DirInfo(listing.reason)
                continue
            info = parent_info if listing.chain is parent_info.chain else _DirInfo(None, listing.chain)
            if keep:
                new[rel], infos[rel] = listing, info
            prefix = f"{rel}/" if rel else ""
            if listing.files and mine:
                yield prefix, listing.files, file_stats
            # pushed last first: the sub-folders are walked in name order (see `_list_folder`)
            for dir_name in reversed(listing.dirs.split(NAME_SEP)) if listing.dirs else ():
                sub = prefix + dir_name
                if part is None:
                    pending.append((sub, dir_name, info, True))
                elif (sub_mine := part.descend(sub, mine)) is not None:
                    pending.append((sub, dir_name, info, sub_mine))
        self._listings = new
        infos.pop("", None)
        with self._dirs_lock:
            self._dirs.update(infos)  # later single-path checks start from these

    def lists_attributes(self, folder: str) -> bool | None:
        """Whether `folder` ("" for the root, else without a trailing "/") held a
        `.gitattributes` when the last (or running) `walk_folders` listed it; None: not listed."""
        return self._attributes.get(folder)

    def _reused_listing(self, rel: str, name: str, parent_info: _DirInfo, folder: str,
                        listing: _Listing | None) -> _Listing | None:
        """`listing` if it still holds for the folder, else None."""
        if listing is None or listing.stamp is None:
            return None
        try:
            st = os.lstat(folder)
        except OSError:
            return None
        if _stamp(st) != listing.stamp:
            return None
        if listing.reason is not None:
            return listing
        if not rel:
            return listing if parent_info.chain == listing.chain else None
        if not listing.has_gitignore and parent_info.chain is listing.parent_chain:
            return listing  # the same rules reached it (the common case: an unchanged tree)
        own = self._load_gitignore(rel) if listing.has_gitignore else None
        if self._child_chain(parent_info, rel, own) != listing.chain:
            return None
        # keep the tuple the sub-folders' listings were made with (their identity check)
        return replace(listing, parent_chain=parent_info.chain)

    def _list_folder(self, rel: str, name: str, parent_info: _DirInfo, folder: str, with_stats: bool,
                     unlisted: dict[str, str] | None = None) -> tuple[_Listing, list[os.stat_result] | None] | None:
        """Read the folder and decide each entry; None if it cannot be read. `with_stats`: each
        entry is lstat-ed here (its type read from it, not from the listing) and the included
        files' stats are given back with the listing, in its order: the walk's consumer then
        lstats them no more (a git repository's baseline at 100k files: ~45 ms less CPU, each
        folder opened once)."""
        listed_ns = time.time_ns()
        stats: list[os.stat_result] | None
        try:
            if with_stats:
                st, names, is_dir, stats = _read_with_stats(folder)
            else:
                st, names, is_dir, stats = _read_with_types(folder)
        except OSError as exc:
            note_unlisted(unlisted, rel, exc)
            return None
        if not stat.S_ISDIR(st.st_mode):
            return None
        newest = max(st.st_mtime_ns, st.st_ctime_ns)
        stamp = _stamp(st) if newest < listed_ns - _RACY_MARGIN_NS else None
        joined = NAME_SEP.join(names)
        framed = f"{NAME_SEP}{joined}{NAME_SEP}"
        has_gitignore = _FRAMED_GITIGNORE in framed
        has_attributes = f"{NAME_SEP}{GITATTRIBUTES}{NAME_SEP}" in framed
        info = parent_info
        if rel:
            info = self._listed_dir_info(rel, name, parent_info, folder, names,
                                         partial(_is_file_at, stats) if stats is not None else partial(_is_file_in,
                                                                                                        folder, names),
                                         framed)
        if info.reason is not None:
            return _Listing(stamp, parent_info.chain, (), info.reason, has_gitignore, has_attributes, "", ""), None
        files, dirs = self._included(info, f"{rel}/" if rel else "", names, is_dir, joined)
        if len(files) == len(names):  # files only, every one included (most folders): as listed
            listing = _Listing(stamp, parent_info.chain, info.chain, None, has_gitignore, has_attributes, joined, "")
            return listing, stats
        listing = _Listing(stamp, parent_info.chain, info.chain, None, has_gitignore, has_attributes,
                           NAME_SEP.join([names[i] for i in files]), NAME_SEP.join([names[i] for i in dirs]))
        return listing, [stats[i] for i in files] if stats is not None else None

    def _included(self, info: _DirInfo, prefix: str, names: Sequence[str], is_dir: Sequence[bool],
                  joined: str | None = None) -> tuple[list[int], list[int]]:
        """Which entries of a folder that is not excluded itself the rules keep: the indices of
        (non-folders, folders) among `names` (`is_dir`: whether each is a folder, not following
        symlinks). `joined`: the names joined by NUL, if the caller has them."""
        files: list[int] = []
        dirs: list[int] = []
        if joined is None:
            joined = NAME_SEP.join(names)
        undecided = self._undecided(info, prefix, names, joined)
        entry_reason = self._entry_reason
        if undecided is not None:  # only those decided, each by its rules; the rest sorted out in C
            left_out = {i for i in undecided if entry_reason(info, prefix + names[i], names[i], is_dir[i]) is not None}
            everyone = range(len(names))
            files = list(itertools.compress(everyone, map(operator.not_, is_dir)))
            dirs = list(itertools.compress(everyone, is_dir))
            if left_out:
                files = [i for i in files if i not in left_out]
                dirs = [i for i in dirs if i not in left_out]
            return files, dirs
        for i, entry_name in enumerate(names):  # every name decided
            folder = is_dir[i]
            if entry_reason(info, prefix + entry_name, entry_name, folder) is None:
                (dirs if folder else files).append(i)
        return files, dirs

    def _undecided(self, info: _DirInfo, prefix: str, names: Sequence[str], joined: str) -> set[int] | None:
        """Which of `names` (the folder `prefix`'s; `joined`: joined by NUL) a rule of
        `_entry_reason` may leave out, seen from their names together (`PatternSet.candidates`):
        the others are kept without a decision each. None: decide every one (names that are not
        ASCII, a `.git` or a submodule among them, a pattern that may match any name)."""
        if not names:
            return set()
        if not joined.isascii():
            return None
        lowered = joined.lower()
        if f"{NAME_SEP}{lowered}{NAME_SEP}".find(f"{NAME_SEP}{GIT_DIR}{NAME_SEP}") >= 0:
            return None
        folder = prefix[:-1]
        if folder in self._submodule_parents:
            return None
        found: list[int] = []
        for rules, base in ((self._extra, 0), (self._builtin, 0), (self._lfs, 0), *info.chain):
            if rules is not None:
                at = rules.candidates(joined, lowered, folder[base:])
                if at is None:
                    return None
                found += at
        if not found:
            return set()
        starts = list(itertools.accumulate((len(entry_name) + 1 for entry_name in names[:-1]), initial=0))
        # an offset is inside its name, or the NUL just before it
        return {bisect.bisect_right(starts, offset + 1) - 1 for offset in found}

    def walk_excluded(self) -> Iterator[tuple[RepoPath, os.DirEntry[str], str]]:
        """Every entry the rules leave out whose parent folder is included, with its reason
        (an excluded folder is yielded once, not entered; the workspace's own `.git` is not
        yielded). For `shadowpoint status --ignored`.
        """
        with self._dirs_lock:
            self._dirs.clear()
        pending: list[tuple[str, str, _DirInfo]] = [("", "", self._load_root())]
        while pending:
            rel, name, parent_info = pending.pop()
            folder = os.path.join(self._root, rel) if rel else self._root
            entries = _scan(folder)
            info = self._listed_dir_info(rel, name, parent_info, folder, [entry.name for entry in entries],
                                         partial(_entry_is_file, entries)) if rel else parent_info
            prefix = f"{rel}/" if rel else ""
            for entry in entries:
                try:
                    is_dir = entry.is_dir(follow_symlinks=False)
                except OSError:
                    is_dir = False
                path = prefix + entry.name
                reason = self._entry_reason(info, path, entry.name, is_dir)
                if reason is None and is_dir:
                    inside = _scan(entry.path)
                    sub = self._listed_dir_info(path, entry.name, info, entry.path, [e.name for e in inside],
                                                partial(_entry_is_file, inside))
                    if sub.reason is not None:
                        yield RepoPath(path), entry, sub.reason
                    else:
                        pending.append((path, entry.name, info))
                elif reason is not None and not (reason == "git_dir" and not rel):
                    yield RepoPath(path), entry, reason

    def explain(self, path: RepoPath, reason: str, *, is_dir: bool) -> str:
        """`reason` (from `excluded_reason`) in people's words, with the deciding rule: the
        built-in category and its pattern, the `.gitignore` file and line, and so on."""
        name = path.rpartition("/")[2]
        if reason.startswith("builtin:"):
            category = reason.partition(":")[2]
            lines = (BUILTIN_EXCLUSIONS if self._builtin_source is None else self._builtin_source).get(category, ())
            rule = _deciding_line(lines, path, name, is_dir, casefold=True)
            return f"built-in category {category}" + (f", pattern {rule[1]}" if rule else "")
        if reason.startswith("gitignore:"):
            file_rel = reason.partition(":")[2]
            base = file_rel[: -len(GITIGNORE)]
            text = read_rule_file(os.path.join(self._root, file_rel)) or ""
            rule = _deciding_line(list(rule_lines(text)), path[len(base):], name, is_dir)
            return f"{file_rel} line {rule[0]}: {rule[1]}" if rule else file_rel
        if reason == "extra":
            rule = _deciding_line(self._extra_lines, path, name, is_dir)
            return f"extra_exclusions pattern {rule[1]}" if rule else "extra_exclusions"
        return {
            "lfs": "Git LFS (filter=lfs in .gitattributes)",
            "nested_repo": "a nested repository (it has its own .git)",
            "submodule": "a submodule (.gitmodules)",
            "git_dir": "a .git folder",
            "beyond_symlink": "behind a symlink to a folder",
        }.get(reason, reason)

    def is_excluded(self, path: RepoPath, *, is_dir: bool) -> bool:
        """Whether a scan leaves `path` out, its ancestors' rules included.

        Args:
            path: A workspace path; "" (the root) is never excluded.
            is_dir: Whether `path` is a folder (`dir/` patterns match folders only).

        Returns:
            True if `path` or one of its ancestor folders is excluded.
        """
        return self.excluded_reason(path, is_dir=is_dir) is not None

    def excluded_reason(self, path: RepoPath, *, is_dir: bool) -> str | None:
        """Why `path` is excluded, for logs and tests.

        Args:
            path: A workspace path.
            is_dir: Whether `path` is a folder.

        Returns:
            None if included, else one of "git_dir", "submodule", "nested_repo",
            "beyond_symlink", "builtin:<category>", "extra", "gitignore:<rule file>", "lfs"
            (for a path inside an excluded folder: that folder's reason).
        """
        if not path:
            return None
        if is_dir:
            # the folder's own info decides it (its parent's reason, a symlink above it, its
            # entry's rules, a nested repository): one rules check, not one here and one there
            return self._dir_info(path).reason
        parent, _, name = path.rpartition("/")
        parent_info = self._dir_info(parent)
        if parent_info.reason is not None:
            return parent_info.reason
        if parent_info.is_link:
            return "beyond_symlink"
        return self._entry_reason(parent_info, path, name, False)

    def is_nested_repo(self, dir_path: RepoPath) -> bool:
        """Whether the folder is another repository: it holds a `.git` (folder or file) or is a submodule.

        Args:
            dir_path: A folder below the root; the root itself is never nested.

        Returns:
            True for a nested repository or a submodule path of the root `.gitmodules`.
        """
        if not dir_path:
            return False
        self._dir_info("")  # loads .gitmodules
        if dir_path in self._submodules:
            return True
        folder = os.path.join(self._root, dir_path)
        try:
            if not stat.S_ISDIR(os.lstat(folder).st_mode):
                return False
        except OSError:
            return False
        return _exists(os.path.join(folder, GIT_DIR))

    def in_nested_repo(self, path: RepoPath, folders: Mapping[str, os.stat_result] | None = None) -> bool:
        """Whether `path` or a folder above it is a nested repository (`is_nested_repo`).

        One lookup of `<folder>/.git` per level, as deep as the path goes: a folder that is
        not there, or is a file, has none. Only a hit is looked at again (a symlink to a
        repository is no nested repository of this one). `folders`: the lstat of folders
        above `path` taken just now (`PathResolver.resolve`'s), by path: one whose stamp
        is the one it had when it last held no `.git` is not looked into (a request's path
        nine folders deep: 9 lookups fewer)."""
        self._dir_info("")  # loads .gitmodules
        folder = self._root
        prefix = ""
        no_git = self._no_git
        for part in path.split("/"):
            folder = f"{folder}/{part}"
            prefix = f"{prefix}/{part}" if prefix else part
            if prefix in self._submodules:
                return True
            st = folders.get(prefix) if folders is not None else None
            stamp = _stamp(st) if st is not None else None
            if stamp is not None and no_git.get(prefix) == stamp:
                continue
            try:
                os.lstat(f"{folder}/{GIT_DIR}")
            except OSError:
                if st is not None and stamp is not None \
                        and max(st.st_mtime_ns, st.st_ctime_ns) < time.time_ns() - _RACY_MARGIN_NS:
                    if len(no_git) >= _NO_GIT_MAX:
                        no_git.clear()
                    no_git[prefix] = stamp
                continue
            if self.is_nested_repo(RepoPath(prefix)):
                return True
        return False

    def invalidate(self, path: RepoPath) -> None:
        """Forget cached decisions that a change at `path` may have made stale.

        Pass the rule file or `.git` that changed, or the folder it is in: the cache of that
        folder and everything below it is dropped (all of it for the root, where
        `.gitattributes` and `.gitmodules` are read too). Cost: one pass over the cache keys.

        Args:
            path: The changed path, or the folder holding the changed rule file.
        """
        parts = path.split("/") if path else []
        cut = len(parts)
        for i, part in enumerate(parts):
            if part in RULE_FILES or part.lower() == GIT_DIR:
                cut = i
                break
        target = "/".join(parts[:cut])
        with self._dirs_lock:
            if not target:
                self._dirs.clear()
                self._listings.clear()
                return
            prefix = f"{target}/"
            for key in [k for k in self._dirs if k == target or k.startswith(prefix)]:
                del self._dirs[key]
            for key in [k for k in self._listings if k == target or k.startswith(prefix)]:
                del self._listings[key]

    # ------------------------------------------------------------ internals

    def _entry_reason(self, info: _DirInfo, rel: str, name: str, is_dir: bool) -> str | None:
        """Rules for one entry of a folder that is not excluded itself (the hot path)."""
        if len(name) == 4 and name.lower() == GIT_DIR:
            return "git_dir"
        if self._submodules and rel in self._submodules:
            return "submodule"
        extra = self._extra
        reincluded = False
        if extra is not None:
            label = extra.decide(rel, name, is_dir)
            if label:
                return label
            reincluded = label == NEGATED  # `!pattern` in extra_exclusions overrides the built-ins
        builtin = self._builtin
        if builtin is not None and not reincluded:
            label = builtin.decide(rel, name, is_dir)
            if label:
                return label
        for rules, base in info.chain:
            label = rules.decide(rel[base:], name, is_dir)
            if label is not None:
                if label:
                    return label
                break
        lfs = self._lfs
        if lfs is not None and not is_dir and lfs.decide(rel, name, False):
            return "lfs"
        return None

    def left_out_by_name(self, folder: str) -> bool:
        """Whether the walk leaves out `folder` whatever the `.gitignore` files say: a `.git`
        component, a submodule, a built-in category, an extra pattern (its parents are not
        looked at). An estimate's question (`WalkPart.halving`), never a walk's."""
        return self._entry_reason(_NO_RULE_FILES, folder, folder.rpartition("/")[2], True) is not None

    def _load_root(self) -> _DirInfo:
        attributes = read_rule_file(os.path.join(self._root, GITATTRIBUTES))
        lfs = PatternSet(lfs_patterns(attributes)) if attributes is not None else None
        self._lfs = None if lfs is None or lfs.is_empty else lfs
        modules = read_rule_file(os.path.join(self._root, GITMODULES))
        self._lfs_text, self._modules_text = attributes, modules
        self._submodules = submodule_paths(modules) if modules is not None else frozenset()
        self._submodule_parents = frozenset(path.rpartition("/")[0] for path in self._submodules)
        own = self._load_gitignore("")
        info = _DirInfo(None, ((own, 0),) if own is not None else ())
        with self._dirs_lock:
            self._dirs[""] = info
        return info

    def _load_gitignore(self, rel: str) -> PatternSet | None:
        file_rel = f"{rel}/{GITIGNORE}" if rel else GITIGNORE
        file = f"{self._root}/{file_rel}"  # not os.path.join: ~1.5 us, once a folder
        text = read_rule_file(file) if _exists(file) else None
        if text is None:
            return None
        known = self._ignore_files.get(rel)
        if known is not None and known[0] == text:
            return known[1]
        label = f"gitignore:{file_rel}"
        rules: PatternSet | None = PatternSet(
            (pattern, label) for line in rule_lines(text) if (pattern := parse_ignore_line(line)) is not None
        )
        if rules is not None and rules.is_empty:
            rules = None
        self._ignore_files[rel] = (text, rules)
        return rules

    @staticmethod
    def _child_chain(parent: _DirInfo, rel: str, own: PatternSet | None) -> Chain:
        return ((own, len(rel) + 1), *parent.chain) if own is not None else parent.chain

    @classmethod
    def _child_info(cls, parent: _DirInfo, rel: str, own: PatternSet | None) -> _DirInfo:
        """The info of folder `rel` (not excluded) below `parent`: the parent's own object when
        `rel` has no .gitignore (shared, like its chain)."""
        if own is None and parent.reason is None and not parent.is_link:
            return parent
        return _DirInfo(None, cls._child_chain(parent, rel, own))

    def _listed_dir_info(self, rel: str, name: str, parent: _DirInfo, folder: str, names: Sequence[str],
                         is_file: Callable[[int], bool], framed: str | None = None) -> _DirInfo:
        """Info for a folder whose entries were just listed (the walk's way): `names`, and
        whether the entry at an index is a regular file (its `.gitignore` is read then).
        `framed`: the names joined by NAME_SEP with one before and after, if the caller has
        them: a folder holding no name like `.git` is then looked at without a loop over its
        names (a baseline's folders, ~5 ms of a walk of 50k files)."""
        if framed is not None and _FRAMED_GIT_DIR not in framed.lower():
            own = None
            if _FRAMED_GITIGNORE in framed:
                at = names.index(GITIGNORE)
                if is_file(at):
                    own = self._load_gitignore(rel)
            return self._child_info(parent, rel, own)
        gitignore = -1
        for i, entry_name in enumerate(names):
            if entry_name == GITIGNORE:
                gitignore = i
            elif len(entry_name) == 4 and entry_name.lower() == GIT_DIR:
                # `.GIT` makes a repository only where the file system ignores case.
                if entry_name == GIT_DIR or os.path.lexists(os.path.join(folder, GIT_DIR)):
                    return _DirInfo("nested_repo")
        own = None
        if gitignore >= 0 and is_file(gitignore):
            own = self._load_gitignore(rel)
        return self._child_info(parent, rel, own)

    def _probed_dir_info(self, rel: str, parent: _DirInfo) -> _DirInfo:
        """Info for a folder from a few lstat calls (the single-path check's way)."""
        if parent.reason is not None:
            return _DirInfo(parent.reason)
        if parent.is_link:
            return _DirInfo("beyond_symlink")
        name = rel.rpartition("/")[2]
        reason = self._entry_reason(parent, rel, name, True)
        if reason is not None:
            return _DirInfo(reason)
        folder = f"{self._root}/{rel}"
        try:
            mode = os.lstat(folder).st_mode
        except OSError:
            mode = 0  # gone (a deleted folder reported by the watcher): only its ancestors count
        if stat.S_ISLNK(mode):
            return _DirInfo(None, is_link=True)
        own = None
        if stat.S_ISDIR(mode):
            if _exists(f"{folder}/{GIT_DIR}"):
                return _DirInfo("nested_repo")
            own = self._load_gitignore(rel)
        return self._child_info(parent, rel, own)

    def _dir_info(self, rel: str) -> _DirInfo:
        info = self._dirs.get(rel)
        if info is not None:
            return info
        missing: list[str] = []
        current = rel
        while True:
            if not current:
                info = self._dirs.get("") or self._load_root()
                break
            missing.append(current)
            current = current.rpartition("/")[0]
            info = self._dirs.get(current)
            if info is not None:
                break
        for folder in reversed(missing):
            info = self._probed_dir_info(folder, info)
            with self._dirs_lock:
                self._dirs[folder] = info
        return info
