"""The shadow repository: the only module that imports pygit2 (with `packing`, its pack writer).

Owns libgit2's process-wide isolation (no user/system/XDG git config, no filters, hooks
or fsmonitor), blob/tree/commit writing (trees are patched from the previous tree, so a
round costs O(changed paths)), refs, tree listing, diffs and object reachability. Callers
serialise access per repository (`RootState.locked` in roots.py); no thread of its own.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import os
import re
import shutil
import sys
import tempfile
import threading
import time
import zlib
from collections.abc import Callable, Collection, Container, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pygit2
import structlog

from shadowpoint.errors import (
    FileNotStorableError,
    ObjectMissingError,
    RepoError,
    ShadowRepoMismatchError,
    StorageFailedError,
)
from shadowpoint.store import loose, packing
from shadowpoint.store.atomic import write_atomic
from shadowpoint.store.locking import flocked, is_flocked
from shadowpoint.store.loose import DAMAGE_ERRNOS, FilePool, storage_message, write_all
from shadowpoint.store.values import (
    COMMITTER_EMAIL,
    COMMITTER_NAME,
    MODE_GITLINK,
    MODE_TREE,
    TASK_TRAILER,
    Changes,
    DeltaRecord,
    TreeEntry,
    restore_ref_prefix,
    safety_ref,
    task_ref,
)
from shadowpoint.workspace import RepoPath

log = structlog.get_logger(__name__)

GC_STAGING_PREFIX = "gc-"  # objects/gc-*: where a collection writes its new pack
GC_BUSY_FILE = ".busy"  # flocked inside a staging folder by the collection using it
# loose files removed between two pauses of a collection (`_remove_packed`, `_prune_unreachable`)
_PRUNE_BATCH = 1_000
GC_PACK_OBJECTS = 50_000  # objects per pack a collection writes (each installed when complete)
# Packs this big that hold no garbage are kept by a collection; smaller ones are merged into
# its new pack (cheap), so that the number of packs stays small.
GC_KEEP_PACK_OBJECTS = 5_000
# Rewritten (a new value) by every collection before it removes packs. A libgit2 handle keeps
# the packs it loaded, removed or not, and takes an object it finds in one as written: within
# 2 s of its last "freshen" of that pack it writes nothing (odb_pack.c, FRESHEN_FREQUENCY), so
# a checkpoint named a blob that another process's collection had just removed (three sidecars
# on one workspace, tests/faults/test_concurrency.py). A handle that sees a new value reopens.
GC_GENERATION_FILE = "shadowpoint/gc-generation"
# Empty files made ahead of time for the loose objects and refs a round writes (loose.py)
FILE_POOL_FOLDER = "shadowpoint/pool"
# Trees kept in memory from the last patches (raw id: entries): the next round's base
RECENT_TREES_MAX = 512
RECENT_COMMITS_MAX = 64  # commit: tree, of the commits written last (a round asks for its parent's)
VALID_REFS_MAX = 256  # ref names `set_ref` remembers as valid (a task's ref and the head, mostly)
# A round's trees and commit (a restore's too) are held in memory and written as one small pack
# (`ShadowRepo.flush`): two files where one loose object each made ~10 (a restore ~20), each
# new file ~45 us of a ~2 ms round on the benchmark disk.
# A round's blobs go in that pack too (`ShadowRepo.blobs_for_ref`): one file fewer a round, and
# no loose object left for the background to pack.
_PACKED_KINDS = {b"commit": 1, b"tree": 2, b"blob": 3}
_BLOB = _PACKED_KINDS[b"blob"]
HELD_MAX = 4096  # objects held before a flush is due anyway (a rebuild, a huge restore: memory stays small)
# bytes of blobs held at most; a blob beyond them is written loose at once. A pack this size
# stays far under any file-size limit a blob alone passes (RLIMIT_FSIZE: tests/faults/test_storage.py).
HELD_BLOB_BYTES = 1 << 20
# bytes of the blobs of the last flush's pack kept to read from memory (`read_blob`): a restore
# keeping an outside edit writes the merged blob there, then writes it to the workspace, and
# libgit2 would rescan its pack folder and open the new pack to read it back
FLUSHED_BLOB_BYTES = 256 << 10
PACKED_IDS_MAX = 50_000  # ids this handle wrote into packs, answered without libgit2 (`has_object`)
MERGE_PACKS_AT = 16  # small packs written by a handle before it asks for `merge_small_packs`
SMALL_PACK_OBJECTS = 2_000  # packs with fewer objects are merged (`merge_small_packs`)
ORPHAN_PACK_S = 3600.0  # a `.pack` without its `.idx` this old is a killed writer's: removed
_HEX_ID = re.compile(r"[0-9a-f]{40}")
_EMPTY_TREE = loose.object_id(b"tree", b"")
_TREE_MODE = b"%o " % MODE_TREE
_TREE_TYPE = int(pygit2.enums.ObjectType.TREE)
_T = TypeVar("_T")
# A tree's entries as patched: name -> the entry's bytes in the tree (mode, space, name, NUL,
# raw id), in the tree's order. Kept in memory for the trees a patch wrote, a round neither
# parses its base trees nor formats their unchanged entries again (~8 + 4 us a folder).
TreeRecords = dict[bytes, bytes]


def _entry_of(record: bytes) -> tuple[int, bytes]:
    """(mode, raw id) of one entry's bytes in a tree."""
    return int(record[:record.index(b" ")], 8), record[-20:]

_configured = False


def isolate_libgit2() -> None:
    """Empty libgit2's config search paths once, before any thread starts.

    libgit2 options are process-global: with empty search paths the user's global, XDG
    and system git configuration (autocrlf, excludesFile, hooksPath, filters, fsmonitor,
    gpgSign) has no effect. libgit2 reads no GIT_* environment variable when a repository
    is opened by path, and runs no filter, hook or fsmonitor for the calls used here.
    """
    global _configured
    if _configured:
        return
    for level in (
        pygit2.enums.ConfigLevel.SYSTEM,
        pygit2.enums.ConfigLevel.XDG,
        pygit2.enums.ConfigLevel.GLOBAL,
        pygit2.enums.ConfigLevel.PROGRAMDATA,
    ):
        with contextlib.suppress(Exception):
            pygit2.settings.search_path[level] = ""
    with contextlib.suppress(Exception):
        pygit2.settings.owner_validation = False
    _configured = True


def limit_mapped_memory(limit_bytes: int) -> None:
    """Cap how much of the pack files libgit2 keeps mapped (process-wide; default 8 GiB, in
    1 GiB windows), never raising a cap the program already set lower. Without it, reading
    the objects of a big pack keeps every page touched resident for the life of the process:
    a sidecar that opened a collected 100k-file shadow repository sat at 321 MiB, 250 of them
    mapped pack pages (`storage`, a collection and an engine read every tree)."""
    with contextlib.suppress(Exception):
        settings = pygit2.settings
        if settings.mwindow_mapped_limit > limit_bytes:
            settings.mwindow_size = min(settings.mwindow_size, max(1 << 20, limit_bytes // 4))
            settings.mwindow_mapped_limit = limit_bytes


def full_id(oid: str) -> str:
    """`oid` as a full object id in lowercase hex.

    Raises:
        ValueError: it is not one (pygit2.Oid pads a short one with zeros; this refuses it).
    """
    lowered = oid.lower()
    if _HEX_ID.fullmatch(lowered) is None:
        raise ValueError(f"not an object id: {oid!r}")
    return lowered


@contextlib.contextmanager
def translated(action: str) -> Iterator[None]:
    """Turn libgit2 failures into `RepoError` (the one place that translates pygit2 errors; the
    few other catches answer "not found", repair or retry, and say so)."""
    try:
        yield
    except (pygit2.GitError, KeyError, ValueError) as exc:
        raise RepoError(f"Shadow repository failed to {action}: {exc}") from exc


_OPEN_FLAGS = pygit2.enums.RepositoryOpenFlag.NO_SEARCH


def _recorded_worktree(repo: pygit2.Repository) -> str | None:
    """The work tree a shadow repository's config records (`core.worktree`), if any."""
    return repo.config["core.worktree"] if "core.worktree" in repo.config else None


def open_repo(git_dir: Path) -> pygit2.Repository:
    """libgit2's handle on an existing shadow repository.

    libgit2 will not open a repository whose work tree (`core.worktree`) is gone, as when a
    task removed its whole project. No shadowpoint work uses libgit2's work tree, so such a
    repository is opened as bare: its checkpoints stay readable, to restore into the folder
    made again, to report and to collect (`doctor` said "does not open", `storage` "unreadable").

    Raises:
        pygit2.GitError: it cannot be opened, and not for a work tree that is gone.
    """
    try:
        return pygit2.Repository(str(git_dir), _OPEN_FLAGS)
    except pygit2.GitError as exc:
        refused = exc
    try:
        repo = pygit2.Repository(str(git_dir), _OPEN_FLAGS | pygit2.enums.RepositoryOpenFlag.BARE)
    except pygit2.GitError:
        raise refused from None
    worktree = _recorded_worktree(repo)
    if worktree is None or os.path.isdir(worktree):
        repo.free()
        raise refused
    return repo


# The probe `written` writes when libgit2 failed: a docs root without this much room is full.
STORAGE_PROBE_BYTES = 64 * 1024


@contextlib.contextmanager
def written(git_dir: Path, action: str) -> Iterator[None]:
    """`translated` for writes: a failure the file system caused becomes `StorageFailedError`.

    libgit2 reports a write the file system refused as "no error" (the errno is lost; seen
    with a full tmpfs and under RLIMIT_FSIZE), so after a failure a probe file is written to
    ask the file system directly (tests/faults/test_storage.py).
    """
    try:
        yield
    except (pygit2.GitError, KeyError, ValueError, OSError) as exc:
        cause = _storage_cause(git_dir)
        if cause is not None:
            raise StorageFailedError(storage_message(git_dir, action, cause)) from exc
        raise RepoError(f"Shadow repository failed to {action}: {exc}") from exc


def _storage_cause(git_dir: Path) -> OSError | None:
    """The file system's refusal to write into `git_dir/objects` (disk full, quota, read-only,
    I/O error), or None when it accepts a probe or the folder is gone (damage, not storage)."""
    probe = git_dir / "objects" / f"tmp_shadowpoint_probe_{os.getpid()}_{threading.get_ident()}"
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            write_all(fd, bytes(STORAGE_PROBE_BYTES))
        finally:
            os.close(fd)
    except OSError as exc:
        return None if exc.errno in DAMAGE_ERRNOS else exc
    finally:
        with contextlib.suppress(OSError):
            probe.unlink()
    return None


def delete_task_refs(repo: ShadowRepo, task_id: str) -> None:
    """Remove every ref of a task: its checkpoints, its restores and their safety checkpoints."""
    repo.delete_ref(task_ref(task_id))
    repo.delete_ref(safety_ref(task_id))
    for name in repo.list_refs(restore_ref_prefix(task_id)):
        repo.delete_ref(name)


def task_tips(repo: ShadowRepo, task_id: str) -> list[str]:
    """The commits every ref of a task points at."""
    tips = [repo.read_ref(task_ref(task_id)), repo.read_ref(safety_ref(task_id)),
            *repo.list_refs(restore_ref_prefix(task_id)).values()]
    return [t for t in tips if t]


def open_blob_writer(git_dir: Path) -> Callable[[bytes], bytes]:
    """For a blob worker process (blob_workers.py): open `git_dir`, return a blob writer.

    The writer returns the blob's raw id. libgit2 writes a loose object to a temporary file
    renamed into place, so several processes may write into one repository at once.

    Raises:
        RepoError: the repository cannot be opened (the writer raises `loose.write_object`'s
            errors when a write fails).
    """
    isolate_libgit2()
    with translated(f"open {git_dir}"):
        repo = open_repo(git_dir)

    def write(data: bytes) -> bytes:
        try:
            return bytes(repo.create_blob(data).raw)
        except pygit2.GitError:  # not translated: libgit2 lost the errno, our own write keeps it
            return bytes.fromhex(loose.write_object(git_dir, b"blob", data))

    return write


BORROWED_LEDGER = "shadowpoint/borrowed"  # borrowed.py's ledger, relative to the git dir


def _ledger_alternates(git_dir: Path) -> list[dict[str, Any]]:
    """The ledger's alternate lines (`borrowed._lines` writes them as `{"alt": …}`; the others,
    `{"tree": …}` or, from earlier versions, `{"oid": …}` per blob, are not parsed here)."""
    try:
        text = (git_dir / BORROWED_LEDGER).read_text("utf-8", "surrogateescape")
    except OSError:
        return []
    out = []
    for line in text.splitlines():
        if not line.startswith('{"alt"'):
            continue
        with contextlib.suppress(ValueError):
            rec = json.loads(line)
            if isinstance(rec, dict):
                out.append(rec)
    return out


class _ReadOnlyObjects(pygit2.OdbBackend):
    """The user's object store as a read-only odb backend (see `ShadowRepo.borrow_from`)."""

    def __init__(self, odb: Any) -> None:
        super().__init__()
        self._odb = odb

    def read_cb(self, oid: Any) -> tuple[Any, bytes]:
        kind, data = self._odb.read(oid)
        return kind, data

    def read_prefix_cb(self, oid: Any) -> tuple[Any, bytes, Any]:
        kind, data = self._odb.read(oid)
        return kind, data, oid

    def read_header_cb(self, oid: Any) -> tuple[Any, int]:
        kind, size = self._odb.read_header(oid)
        return kind, size

    def exists_cb(self, oid: Any) -> bool:
        return False  # never "found" for a write: nothing is freshened, every write lands here

    def exists_prefix_cb(self, oid: Any) -> None:
        return None

    def refresh_cb(self) -> None:
        return None

    def __iter__(self) -> Iterator[Any]:
        return iter(())


class _NotATree(Exception):
    """Paths that no tree can hold (unsorted, or a path both a file and a folder)."""


@dataclass(frozen=True, slots=True)
class FolderFiles:
    """The tree entries of one folder's files (`<octal mode> <name>\\0<raw id>` each, as its
    tree holds them), joined in the order the folder was listed: one bytes a folder, not one
    a file (at 1M files, ~25 MiB less of each baseline process's peak); `in_order`: that
    order is git's (the names sorted as bytes: all ASCII). Made as a baseline proves a
    folder's files with the user's index (`IndexProof.prove_folder`), for
    `ShadowRepo.write_folder_trees`."""

    data: bytes
    count: int
    in_order: bool

    @classmethod
    def of(cls, entries: list[bytes], in_order: bool) -> FolderFiles:
        return cls(b"".join(entries), len(entries), in_order)

    def items(self) -> list[tuple[bytes, bytes]]:
        """(name, entry) of each file, to be sorted with a folder's sub-folders."""
        data = self.data
        out = []
        pos, end = 0, len(data)
        while pos < end:
            nul = data.index(b"\0", pos + _FILE_MODE_LEN)
            out.append((data[pos + _FILE_MODE_LEN:nul], data[pos:nul + 21]))
            pos = nul + 21
        return out


def _tree_made(items: list[tuple[bytes, bytes]], add: Callable[[bytes, int, bytes], None]) -> bytes:
    """The tree of `items` ((git sort key, entry bytes), sorted here), handed to `add`; its raw id."""
    items.sort()
    return _tree_of_data(b"".join([entry for _, entry in items]), add)


def _tree_of_data(data: bytes, add: Callable[[bytes, int, bytes], None]) -> bytes:
    raw = hashlib.sha1(b"tree %d\0" % len(data) + data).digest()
    add(raw, _TREE_TYPE, data)
    return raw


def _folder_item(name: bytes, raw: bytes) -> tuple[bytes, bytes]:
    """A sub-folder as an item of its parent's tree: git sorts its name as if it ended with "/"."""
    return name + b"/", b"40000 %s\0%s" % (name, raw)


# `_tree_of_listed` polls every this many folders (a baseline serves early captures there: a
# top-level folder of 50k files is ~40 ms of trees)
_POLL_FOLDERS = 64
# the length of a file entry's mode and space (`100644 `, `100755 `, `120000 `): a name lies
# between it and the NUL before the 20-byte id
_FILE_MODE_LEN = 7


def _tree_of_listed(top: str, below: Iterable[str], files: Mapping[str, FolderFiles],
                    add: Callable[[bytes, int, bytes], None], poll: Callable[[], None] | None = None
                    ) -> tuple[int, bytes]:
    """The tree of folder `top` made from the entries of the folders `below` it that hold files
    (`top` among them or not), deepest first, each handed to `add` as it is made: (its files'
    count, its raw id). Folders holding only folders are made as their children are. A folder
    of files listed in git's order is its entries joined; any other has its items sorted as
    git sorts them (a folder's name as if it ended with "/"). `poll`: run every
    `_POLL_FOLDERS` folders."""
    encoding, errors = sys.getfilesystemencoding(), sys.getfilesystemencodeerrors()
    levels: dict[int, dict[str, None]] = {}  # folders to make, by depth (a dict as an ordered set)
    for folder in below:
        levels.setdefault(folder.count("/"), {})[folder] = None
    top_level = top.count("/")
    levels.setdefault(top_level, {})[top] = None
    subtrees: dict[str, list[tuple[bytes, bytes]]] = {}  # folder -> its sub-folders' (sort key, entry)
    counts: dict[str, int] = {}
    made = 0
    for level in range(max(levels), top_level - 1, -1):
        for folder in levels.pop(level, ()):
            made += 1
            if poll is not None and made % _POLL_FOLDERS == 0:
                poll()
            own = files.get(folder)
            subs = subtrees.pop(folder, None)
            count = counts.pop(folder, 0)
            if own is not None:
                count += own.count
            if subs is None and own is not None and own.in_order:
                raw = _tree_of_data(own.data, add)
            else:
                raw = _tree_made([*(own.items() if own is not None else ()), *(subs or ())], add)
            if level == top_level:
                return count, raw
            parent, _, name = folder.rpartition("/")
            subtrees.setdefault(parent, []).append(_folder_item(name.encode(encoding, errors), raw))
            counts[parent] = counts.get(parent, 0) + count
            levels.setdefault(level - 1, {})[parent] = None
    raise AssertionError("the top folder is always made")  # pragma: no cover


def _trees_of_sorted(files: Iterable[tuple[str, int, bytes]], add: Callable[[bytes, int, bytes], None],
                     root_items: RootItems | None = None) -> bytes | None:
    """Make the trees holding `files` (path, git mode, raw blob id; sorted by path; a path
    ending in "/" is a whole folder, its tree's id given with mode 040000), handing
    each to `add(raw id, type, data)` as it is made; the root tree's raw id (None: empty).
    `root_items`: the root tree is not made, its entries are added there instead (None is
    returned).

    One pass with a stack of the open folders: a folder's tree is made as soon as the paths
    leave it (sorted paths keep every folder's together), so no map of the whole listing is
    held (that map and its split names were ~18 MiB of a 100k-file baseline's peak). The loop
    runs once per file of a baseline (100k): the open folder's lists are kept in locals, names
    are encoded without `os.fsencode`'s call and modes formatted once (156 -> ~100 ms at 97k files).
    """
    encoding, errors = sys.getfilesystemencoding(), sys.getfilesystemencodeerrors()
    # the open folders, root first: (folder path, its items as (git sort key, entry bytes), names)
    stack: list[tuple[str, list[tuple[bytes, bytes]], set[bytes]]] = [("", [], set())]
    modes: dict[int, bytes] = {}

    def close() -> None:
        folder, items, _ = stack.pop()
        name = folder.rpartition("/")[2].encode(encoding, errors)
        _, parent_items, parent_names = stack[-1]
        if name in parent_names:
            raise _NotATree(f"{name!r}: both a file and a folder")
        parent_names.add(name)
        parent_items.append(_folder_item(name, _tree_made(items, add)))

    previous: str | None = None
    current = ""  # the innermost open folder
    items, names = stack[0][1], stack[0][2]
    for path, mode, raw in files:
        if previous is not None and path <= previous:
            raise _NotATree(f"{path}: paths not sorted")
        previous = path
        parent, _, name = path.rpartition("/")
        whole = not name
        if whole:  # "folder/": a whole folder, given as its tree's id (mode 040000)
            parent, _, name = parent.rpartition("/")
        if parent != current:
            while current and parent != current and not parent.startswith(current + "/"):
                close()
                current = stack[-1][0]
            if parent != current:
                for part in parent[len(current) + 1 if current else 0:].split("/"):
                    current = f"{current}/{part}" if current else part
                    if part.encode(encoding, errors) in stack[-1][2]:
                        raise _NotATree(f"{current}: both a file and a folder")
                    stack.append((current, [], set()))
            items, names = stack[-1][1], stack[-1][2]
        # a file's name is new here (the paths increase strictly); it is kept for the folder
        # check above (a later folder of the same name)
        encoded = name.encode(encoding, errors)
        names.add(encoded)
        mode_bytes = modes.get(mode)
        if mode_bytes is None:
            mode_bytes = modes[mode] = b"%o" % mode
        items.append((encoded + b"/" if whole else encoded, b"%s %s\0%s" % (mode_bytes, encoded, raw)))
    while len(stack) > 1:
        close()
    if root_items is not None:
        root_items.entries.extend(stack[0][1])
        root_items.names.update(stack[0][2])
        return None
    return _tree_made(stack[0][1], add) if stack[0][1] else None


@dataclass(slots=True)
class RootItems:
    """A root tree's entries, made by `ShadowRepo.write_subtrees_packed` from a run of paths
    and written by `write_root_tree` with those of the other runs."""

    entries: list[tuple[bytes, bytes]] = field(default_factory=list)  # (git's sort key, entry bytes)
    names: set[bytes] = field(default_factory=set)


def _config(worktree: Path) -> tuple[tuple[str, bool | int | str], ...]:
    """The shadow repository's configuration (`ShadowRepo._create`, `_write_config`)."""
    return (
        ("core.repositoryformatversion", 0),
        ("core.bare", False),
        ("core.worktree", str(worktree)),
        ("core.autocrlf", False),
        ("core.filemode", True),
        ("core.symlinks", True),
        ("core.fsmonitor", False),
        ("core.hooksPath", os.devnull),
        ("commit.gpgSign", False),
        ("gc.auto", 0),
        ("user.name", COMMITTER_NAME),
        ("user.email", COMMITTER_EMAIL),
    )


def _config_text(worktree: Path) -> str:
    """`_config` as git's config file: a section per key's first part, strings quoted (a
    backslash, a quote and the control characters git escapes escaped)."""
    lines: list[str] = []
    section = ""
    for key, value in _config(worktree):
        head, _, name = key.partition(".")
        if head != section:
            lines.append(f"[{head}]")
            section = head
        if isinstance(value, bool):
            text = "true" if value else "false"
        elif isinstance(value, int):
            text = str(value)
        else:
            text = '"' + value.translate(_CONFIG_ESCAPES) + '"'
        lines.append(f"\t{name} = {text}")
    return "\n".join(lines) + "\n"


_CONFIG_ESCAPES = str.maketrans({"\\": "\\\\", '"': '\\"', "\n": "\\n", "\t": "\\t", "\b": "\\b"})


def _head_of(path: str) -> bytes:
    """The first 64 bytes of a small file (empty when it cannot be read): a plain open and
    read, no pathlib (the head ref and the gc generation are read under every lock)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return b""
    try:
        return os.read(fd, 64)
    except OSError:
        return b""
    finally:
        os.close(fd)


class ShadowRepo:
    """A shadow git dir whose `core.worktree` is a workspace root."""

    def __init__(self, repo: pygit2.Repository, git_dir: Path, worktree: Path) -> None:
        self._repo = repo
        self.git_dir = git_dir
        self.worktree = worktree
        self._recent_trees: dict[bytes, TreeRecords] = {}  # raw id: entries, of the last patches' trees
        self._recent_commits: dict[str, str | None] = {}  # id: tree (None: empty), of commits written here
        self._pending: dict[bytes, tuple[int, bytes]] = {}  # raw id: (pack kind, content), not yet written
        self._packed_ids: set[bytes] = set()  # raw ids this handle wrote into packs (cleared by `reopen`)
        self._flushed_blobs: dict[bytes, bytes] = {}  # raw id: content, of the last flush's pack (`read_blob`)
        self._holding_blobs = False  # inside `blobs_for_ref`
        self._held_blob_bytes = 0  # the content bytes of the blobs in `_pending`
        self._packs_written = 0  # small packs `flush` wrote since the last merge
        self._objects_dir = os.fspath(git_dir / "objects")
        self._pool = FilePool(git_dir / FILE_POOL_FOLDER, anchor=git_dir, open_ahead=loose.OPEN_AHEAD,
                              folders=[os.path.join(git_dir, "objects", f"{i:02x}") for i in range(256)])
        self._borrowed: dict[str, _ReadOnlyObjects] = {}
        self._open_refs: dict[str, int] = {}  # refs moved in place (`loose.rewrite_ref`): path -> fd
        # ref names `set_ref` found valid: libgit2 is asked once a name (a round moves two refs)
        self._valid_refs: set[str] = set()
        self._gc_file = os.fspath(git_dir / GC_GENERATION_FILE)
        self._gc_seen = self._gc_generation()
        self._attach_recorded()

    # ------------------------------------------------------------------ opening

    @classmethod
    def open_or_init(cls, git_dir: Path, worktree: Path) -> ShadowRepo:
        """Open the shadow repo of `worktree`, creating or repairing it.

        Raises:
            ShadowRepoMismatchError: the repo records another worktree (hash collision or a
                moved workspace); it is never used blindly.
            RepoError: libgit2 failed.
        """
        isolate_libgit2()
        if not (git_dir / "objects").is_dir() and cls._create(git_dir, worktree):
            with translated("open it"):  # just made: nothing to check or repair
                repo = pygit2.Repository(str(git_dir), pygit2.enums.RepositoryOpenFlag.NO_SEARCH)
        else:
            repo = cls._open_existing(git_dir, worktree)
        return cls(repo, git_dir, worktree)

    @classmethod
    def _create(cls, git_dir: Path, worktree: Path) -> bool:
        """Lay out a new shadow repository at `git_dir`, whole or not at all: made aside and
        renamed into place; False when another opener made one first (it is kept). libgit2's
        init and its config written key by key took ~20 ms of every first baseline; this ~1 ms.

        Raises:
            OSError: the docs root refused it (nothing is left behind).
        """
        git_dir.parent.mkdir(parents=True, exist_ok=True)
        aside = git_dir.with_name(f"{git_dir.name}.new-{os.getpid()}-{threading.get_ident()}")
        shutil.rmtree(aside, ignore_errors=True)
        try:
            for folder in ("objects/pack", "objects/info", "refs/heads", "refs/tags"):
                os.makedirs(aside / folder)
            (aside / "HEAD").write_bytes(b"ref: refs/heads/main\n")
            (aside / "config").write_bytes(_config_text(worktree).encode("utf-8", "surrogateescape"))
            try:
                os.rename(aside, git_dir)
            except OSError:
                if not (git_dir / "objects").is_dir():
                    raise
                return False  # made meanwhile by another opener
        finally:
            shutil.rmtree(aside, ignore_errors=True)
        log.info("shadow_repo.created", git_dir=str(git_dir))
        return True

    @classmethod
    def _open_existing(cls, git_dir: Path, worktree: Path) -> pygit2.Repository:
        cls._clear_stale_locks(git_dir)
        try:
            # libgit2 reads a NUL-filled config as empty but refuses to write it, so look first.
            if b"\0" in (git_dir / "config").read_bytes():
                raise ValueError("the config file holds NUL bytes")
            repo = pygit2.Repository(str(git_dir), pygit2.enums.RepositoryOpenFlag.NO_SEARCH)
            recorded = _recorded_worktree(repo)
        except (pygit2.GitError, KeyError, ValueError, OSError) as exc:  # not translated: repaired
            return cls._repair(git_dir, worktree, str(exc))
        if recorded is None:
            # an existing repo always records its worktree: an empty or cut config lost it
            log.warning("shadow_repo.repaired", git_dir=str(git_dir), reason="the config lost core.worktree")
            try:
                cls._write_config(repo, worktree)
            except RepoError as exc:  # readable but not writable (garbled): rebuild it
                return cls._repair(git_dir, worktree, str(exc))
        elif os.path.realpath(recorded) != str(worktree):
            raise ShadowRepoMismatchError(
                f"The shadow repository {git_dir} belongs to {recorded}, not {worktree} "
                "(a workspace hash collision or a moved workspace). Move it aside to start afresh."
            )
        return repo

    @classmethod
    def _repair(cls, git_dir: Path, worktree: Path, reason: str) -> pygit2.Repository:
        """A truncated or garbled config: rebuild it, keeping every object that survives."""
        log.warning("shadow_repo.repaired", git_dir=str(git_dir), reason=reason)
        cfg = git_dir / "config"
        with contextlib.suppress(OSError):
            cfg.unlink()
        for name in ("HEAD",):
            if not (git_dir / name).is_file() or (git_dir / name).stat().st_size == 0:
                (git_dir / name).write_text("ref: refs/heads/main\n")
        with translated("repair"):
            (git_dir / "refs").mkdir(exist_ok=True)
            cfg.write_text("[core]\n\trepositoryformatversion = 0\n\tbare = true\n")
            repo = pygit2.Repository(str(git_dir), pygit2.enums.RepositoryOpenFlag.NO_SEARCH)
        cls._write_config(repo, worktree)
        return repo

    @staticmethod
    def _write_config(repo: pygit2.Repository, worktree: Path) -> None:
        with translated("write its config"):
            cfg = repo.config
            for key, value in _config(worktree):
                cfg[key] = value

    @staticmethod
    def _clear_stale_locks(git_dir: Path) -> None:
        """Remove `*.lock` files left by a killed writer; callers hold the workspace lock."""
        candidates = [git_dir / "config.lock", git_dir / "HEAD.lock", git_dir / "index.lock",
                      git_dir / "packed-refs.lock"]
        refs = git_dir / "refs"
        if refs.is_dir():
            for dp, _, files in os.walk(refs):
                candidates.extend(Path(dp) / f for f in files if f.endswith(".lock"))
        for lock in candidates:
            if lock.exists():
                with contextlib.suppress(OSError):
                    lock.unlink()
                    log.warning("shadow_repo.stale_lock_removed", path=str(lock))
        # A garbage collection killed midway leaves its staging folder (a partial pack), and
        # libgit2 its temporary object files (objects/tmp_object_git2_*: loose objects are only
        # written under the workspace lock, which the caller holds). A collection writes its
        # pack without that lock, so a staging folder goes only when no live collection holds
        # the flock on its busy file (the kernel drops it when the collector dies).
        objects = git_dir / "objects"
        stale = [s for s in objects.glob(f"{GC_STAGING_PREFIX}*") if not _staging_in_use(s)]
        # A `.pack` whose `.idx` never came (a writer killed between the two renames) is never
        # read; a collection installs the two a moment apart without the lock, so only old ones.
        cutoff = time.time() - ORPHAN_PACK_S
        orphans = [p for p in objects.glob("pack/pack-*.pack")
                   if not p.with_suffix(".idx").exists() and _mtime(p) < cutoff]
        for junk in [*stale, *orphans, *objects.glob("tmp_*"), *objects.glob("pack/tmp_*"),
                     *objects.glob("pack/pack_git2_*")]:
            with contextlib.suppress(OSError):
                if junk.is_dir() and not junk.is_symlink():
                    shutil.rmtree(junk)
                else:
                    junk.unlink()
                log.warning("shadow_repo.stale_temp_removed", path=str(junk))

    @classmethod
    def open_existing(cls, git_dir: Path) -> ShadowRepo:
        """Open a shadow repo for maintenance (report, gc) without creating or checking it.

        Raises:
            RepoError: missing or unreadable.
        """
        isolate_libgit2()
        with translated(f"open {git_dir}"):
            repo = open_repo(git_dir)
            worktree = _recorded_worktree(repo)
        return cls(repo, git_dir, Path(worktree or ""))

    def object_size(self, oid: str) -> int:
        """Uncompressed size of an object (0 when it is missing)."""
        self.flush()
        try:
            _, size = self._repo.odb.read_header(pygit2.Oid(hex=oid))
            return int(size)
        except (pygit2.GitError, KeyError, ValueError):  # not translated: a missing object is the answer
            return 0

    def reopen(self) -> None:
        """A fresh libgit2 handle: its in-memory object cache can hide trees lost on disk. What
        this handle knows of objects it wrote goes too (a collection may have removed them)."""
        self.flush()
        seen = self._gc_generation()
        self._reload()
        self._gc_seen = seen
        self._recent_trees = {}
        self._recent_commits = {}
        self._packed_ids = set()
        self._flushed_blobs = {}

    def _reload(self) -> None:
        """A fresh libgit2 handle, which sees the packs as they are now."""
        with translated("reopen"):
            self._repo.free()
            self._repo = open_repo(self.git_dir)
        self._attach_recorded()

    def _gc_generation(self) -> bytes:
        return _head_of(self._gc_file)  # read on every staging

    def reopen_after_collection(self) -> bool:
        """Reopen if a garbage collection (of any process) removed packs since this handle was
        opened: the packs it still holds could make a write of their objects a no-op. Call with
        the workspace lock held (collections remove packs only under it). True if reopened."""
        if self._gc_generation() == self._gc_seen:
            return False
        log.info("shadow_repo.reopened_after_collection", git_dir=str(self.git_dir))
        self.reopen()
        return True

    def _note_collection(self) -> None:
        """Tell every handle on this repository that packs are about to go (GC_GENERATION_FILE)."""
        path = self.git_dir / GC_GENERATION_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, os.urandom(8).hex().encode())

    def clear_stale_locks(self) -> None:
        self._clear_stale_locks(self.git_dir)

    def close(self) -> None:
        try:
            self.flush()
        except (RepoError, StorageFailedError) as exc:  # held objects no ref names yet: nothing lost
            log.warning("shadow_repo.flush_failed", git_dir=str(self.git_dir), reason=str(exc))
        self._pool.close()
        for fd in self._open_refs.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        self._open_refs.clear()
        with contextlib.suppress(Exception):
            self._repo.free()

    # ------------------------------------------------------------------ objects

    def write_blob(self, data: bytes) -> str:
        """Store a blob; returns its id.

        Raises:
            FileNotStorableError: this blob alone is too large for the docs root's file system
                or the process's file-size limit (the caller leaves its file out).
            StorageFailedError: the docs root refused the write (disk full, quota, I/O error).
        """
        if self._holding_blobs and self._held_blob_bytes + len(data) <= HELD_BLOB_BYTES:
            oid = loose.object_id(b"blob", data)
            # one held loose already is only freshened, as `loose.write_object` does
            return oid if loose.freshened(self.git_dir, oid) else self._hold(b"blob", data, oid)
        return loose.write_object(self.git_dir, b"blob", data, self._pool)

    @contextlib.contextmanager
    def blobs_for_ref(self) -> Iterator[None]:
        """Within: blobs (`write_blob`, up to HELD_BLOB_BYTES together) are held with the trees
        and the commit, and go into the small pack the next `set_ref` writes: a round's, whose
        task ref names them. Every other flush, and the end of the block, writes the blobs
        still held as loose objects: a pack gets no grace period from a collection, so a blob
        goes into one only with the ref that names it (a stat cache may name a blob of a round
        whose commit failed, or was not wanted)."""
        self._holding_blobs = True
        try:
            yield
        finally:
            self._holding_blobs = False
            if self._held_blob_bytes:
                self._write_blobs_loose()

    def _hold(self, kind: bytes, data: bytes, oid: str | None = None, raw: bytes | None = None) -> str:
        """Keep an object (`oid`, `raw`: its id, if known) to be written by the next `flush`; its id."""
        if oid is None:
            oid = loose.object_id(kind, data)
        if raw is None:
            raw = bytes.fromhex(oid)
        if raw not in self._pending and raw not in self._packed_ids:
            packed_kind = _PACKED_KINDS[kind]
            self._pending[raw] = (packed_kind, data)
            if packed_kind == _BLOB:
                self._held_blob_bytes += len(data)
            if len(self._pending) >= HELD_MAX:
                self.flush()
        return oid

    def _write_blobs_loose(self) -> None:
        """Write the blobs held as loose objects (the trees and commits stay held).

        Raises:
            StorageFailedError, RepoError: as `loose.write_object`; the blobs not yet written are
                dropped (a stage that fails so resets its stat cache: `RootState._stage_or_reset`).
        """
        self._write_loose([raw for raw, (kind, _) in self._pending.items() if kind == _BLOB])

    def _write_loose(self, blobs: list[bytes]) -> None:
        """Write these held blobs (raw ids in `_pending`) as loose objects; they are held no more."""
        try:
            for raw in blobs:
                data = self._pending.pop(raw)[1]
                self._held_blob_bytes -= len(data)
                loose.write_object(self.git_dir, b"blob", data, self._pool, known_new=True)
        finally:
            for raw in blobs:
                if (held := self._pending.pop(raw, None)) is not None:
                    self._held_blob_bytes -= len(held[1])

    def flush(self, *, naming: bool = False) -> None:
        """Write the objects held since the last flush (a round's trees, commit and blobs) as
        one small pack: the `.pack`, then its `.idx`, each renamed into place whole (a reader
        sees the pack once its index is there). Done before a ref moves (`set_ref`), before libgit2 reads an object and
        when the workspace lock is let go (`RootState.locked`), so nothing on disk names an
        object before it is written, and no other process looks for one before a ref names it.

        Packs get no grace period from a collection (loose objects do), which is safe because
        a held object is written in the lock hold that moves the ref naming it. The packs are
        merged now and then (`merge_small_packs`). Blobs held (`blobs_for_ref`) go into the
        pack only when `naming`: the flush of the ref move that names them; else loose.

        Raises:
            StorageFailedError: the docs root refused the write: the held objects are dropped,
                and every tree and commit this handle remembered writing is forgotten (a
                round patching one finds it missing and rebuilds, `roots.RootState._verify`,
                which checks the blobs too: a new blob held went with a new tree above it).
            RepoError: the object store is damaged (likewise).
        """
        if self._held_blob_bytes and not naming:
            self._write_blobs_loose()
        pending = self._pending
        if not pending:
            return
        self._pending = {}
        self._flushed_blobs = {}
        held_blob_bytes, self._held_blob_bytes = self._held_blob_bytes, 0
        try:
            name, pack, idx = packing.small_pack((raw, kind, data) for raw, (kind, data) in pending.items())
            base = os.path.join(self._objects_dir, "pack", name)
            loose.write_file(self.git_dir, pack, base + ".pack", self._pool, "write a pack")
            loose.write_file(self.git_dir, idx, base + ".idx", self._pool, "write a pack")
        except BaseException as exc:
            self._recent_trees = {}
            self._recent_commits = {}
            if type(exc) is FileNotStorableError:  # the pack as a whole, not one file of the workspace
                raise StorageFailedError(str(exc)) from exc
            raise
        if len(self._packed_ids) + len(pending) > PACKED_IDS_MAX:
            self._packed_ids = set()
        self._packed_ids.update(pending)
        self._packs_written += 1
        if held_blob_bytes and held_blob_bytes <= FLUSHED_BLOB_BYTES:
            self._flushed_blobs = {raw: data for raw, (kind, data) in pending.items() if kind == _BLOB}

    @property
    def merge_due(self) -> bool:
        """Whether this handle wrote enough small packs for `merge_small_packs` to be worth it."""
        return self._packs_written >= MERGE_PACKS_AT

    def merge_small_packs(self) -> int:
        """Write the objects of every small pack (fewer than SMALL_PACK_OBJECTS: the rounds'
        own, `flush`) into one pack and remove them, so that the packs libgit2 searches stay
        few. Every object stays held: nothing is collected here, so no ref needs reading.
        Call with the workspace lock held. Returns how many packs went.

        Raises:
            StorageFailedError: the docs root refused the new pack (the small packs stay).
            RepoError: an object cannot be read (likewise).
        """
        self.flush()
        self._packs_written = 0
        pack_dir = Path(self._objects_dir) / "pack"
        small = [idx for idx in sorted(pack_dir.glob("pack-*.idx"))
                 if 0 <= packing.pack_object_count(idx) < SMALL_PACK_OBJECTS and idx.with_suffix(".pack").is_file()]
        if len(small) < 2:
            return 0
        oids = sorted({oid for idx in small for oid in packing.pack_objects(idx)})
        staging = Path(self._objects_dir) / f"tmp_merge_{os.getpid()}_{threading.get_ident()}"
        merged = self._write_own_pack(oids, staging, "merge small packs")
        for idx in small:
            if idx.stem != merged:
                for part in (idx, idx.with_suffix(".pack")):  # the index first: a pack without one is never read
                    with contextlib.suppress(OSError):
                        part.unlink()
        self._reload()  # libgit2 lets go of the removed packs; every object this handle knows is still held
        log.info("shadow_repo.packs_merged", git_dir=str(self.git_dir), packs=len(small), objects=len(oids))
        return len(small)

    def read_blob(self, oid: str) -> bytes:
        # A blob held for the next flush is read from memory: asking libgit2 would flush first,
        # a pack and loose blobs written in the middle of a restore (its merge reads the safety
        # checkpoint's blob of each file it merges), and the ref's flush wrote another pack.
        # So is a small blob of the last flush's pack (FLUSHED_BLOB_BYTES): the merged blob.
        if (self._pending or self._flushed_blobs) and _HEX_ID.fullmatch(oid):
            raw = bytes.fromhex(oid)
            held = self._pending.get(raw)
            if held is not None and held[0] == _BLOB:
                return held[1]
            flushed = self._flushed_blobs.get(raw)
            if flushed is not None:
                return flushed
        data = self._read_loose(oid, b"blob")
        if data is not None:
            return data
        with translated(f"read blob {oid}"):
            return self._raw(pygit2.Oid(hex=oid))

    def _read_loose(self, oid: str, kind: bytes) -> bytes | None:
        """The content of `oid` when it is a loose object of `kind` whose bytes check out (its
        header and its id); None otherwise, and libgit2 then reads it (a packed object) or
        reports the damage. One file and one inflate: libgit2 searches every pack first
        (136 us of a 3.3 ms one-file restore on the 100k tree)."""
        path = self._loose_file(oid)
        if path is None:
            return None
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            chunks = []
            while chunk := os.read(fd, 1 << 20):
                chunks.append(chunk)
            data = zlib.decompress(b"".join(chunks))
        except (OSError, zlib.error):
            return None
        finally:
            os.close(fd)
        header, sep, body = data.partition(b"\0")
        if not sep or header != b"%s %d" % (kind, len(body)) or loose.object_id(kind, body) != oid:
            return None
        return body

    def merge_file(self, path: str, base: TreeEntry, ours: TreeEntry, theirs: TreeEntry) -> bytes | None:
        """libgit2's three-way merge of one file's contents; None when the changes overlap (or
        the merged text is not UTF-8, which pygit2 cannot hand back)."""
        # libgit2 reads the three blobs: one held (the person's edit, staged by the safety
        # checkpoint) is written loose first. Only the blobs: the trees and commits stay held for
        # the restore ref's pack, one pack per restore instead of two.
        ids = {bytes.fromhex(e.oid) for e in (base, ours, theirs)}
        held = [raw for raw in ids if self._pending.get(raw, (None,))[0] == _BLOB]
        if held:
            self._write_loose(held)
        with translated(f"merge {path}"):
            b, o, t = (pygit2.IndexEntry(path, pygit2.Oid(hex=e.oid), pygit2.enums.FileMode(e.mode))
                       for e in (base, ours, theirs))
            try:
                result = self._repo.merge_file_from_index(b, o, t)
            except UnicodeDecodeError:
                return None
        if not result.automergeable:
            return None
        merged: bytes = result.contents.encode("utf-8")
        return merged

    # ------------------------------------------------------------------ borrowed objects (issue 14)

    def borrow_from(self, objects_dir: Path) -> None:
        """Read objects from the user's `objects_dir` too, read-only, in this handle.

        Not a line in `objects/info/alternates`: every libgit2 (and git) writer "freshens" an
        object it finds in an alternate instead of writing it (a utime on the user's object
        or pack file: a write into the user's `.git`), and the object is then not stored here
        at all (a tree equal to one of the user's commit was missing once the alternate went).
        `_ReadOnlyObjects` answers reads only and says "absent" to existence checks, so every
        write lands in the shadow repository and nothing of the user's is touched. Handles of
        other processes attach it from the ledger (`borrowed.py`) when they open the repo.
        """
        key = str(objects_dir)
        if key in self._borrowed:
            return
        with translated("read the user's objects"):
            backend = _ReadOnlyObjects(pygit2.Odb(key))
            self._repo.odb.add_backend(backend, 0)  # asked last: own objects first
        self._borrowed[key] = backend

    @property
    def borrowing(self) -> list[str]:
        """The object stores this handle reads borrowed objects from."""
        return list(self._borrowed)

    def _attach_recorded(self) -> None:
        self._borrowed = {}
        for line in _ledger_alternates(self.git_dir):
            alt = line.get("alt")
            if isinstance(alt, str) and os.path.isdir(alt):
                with contextlib.suppress(RepoError):
                    self.borrow_from(Path(alt))

    def own_missing(self, oids: Iterable[str]) -> list[str]:
        """Those of `oids` that this repository's own object store lacks (alternates not read)."""
        objects = str(self.git_dir / "objects")
        self.flush()
        with translated("open its own object store"):
            odb = pygit2.Odb()
            odb.add_backend(pygit2.OdbBackendPack(objects), 2)
            odb.add_backend(pygit2.OdbBackendLoose(objects, 1, False), 1)
            return [oid for oid in oids if not odb.exists(oid)]

    def readable(self, oids: Iterable[str]) -> list[str]:
        """Those of `oids` this handle can read (borrowed ones included), by their headers only."""
        out = []
        self.flush()
        odb = self._repo.odb
        for oid in oids:
            try:
                odb.read_header(pygit2.Oid(hex=oid))
            except (pygit2.GitError, KeyError, ValueError):  # not translated: unreadable is the answer
                continue
            out.append(oid)
        return out

    def copy_objects(self, oids: list[str], staging: Path, pause: Callable[[], None] | None = None) -> None:
        """Write `oids` (readable here, e.g. through an alternate) into this repository's own
        store as one pack (written in `staging`, then installed: `.pack` before `.idx`);
        `pause` is called before each batch of objects is read (`packing.write_pack`).

        Raises:
            RepoError: an object cannot be read (gone from the alternate).
            StorageFailedError: the docs root refused the write.
        """
        if oids:
            # level 1: the copy shortens the time a snapshot depends on the user's repository
            self._write_own_pack(oids, staging, "copy borrowed objects", pause)

    def _write_own_pack(self, oids: list[str], staging: Path, action: str,
                        pause: Callable[[], None] | None = None) -> str:
        """Write `oids` (readable by this handle) as one pack, deflated at level 1, in `staging`
        (removed afterwards), then install it (`.pack` before `.idx`); its name.

        Raises:
            RepoError: an object cannot be read.
            StorageFailedError: the docs root refused the write.
        """
        self.flush()
        with written(self.git_dir, action):
            staging.mkdir(parents=True, exist_ok=True)
            try:
                packing.write_pack(self._repo, oids, staging, level=1, pause=pause)
                return self._install_packs(staging, self.git_dir / "objects" / "pack")
            finally:
                shutil.rmtree(staging, ignore_errors=True)

    def has_object(self, oid: str) -> bool:
        # What this handle wrote is known (a round asks for its parent commit, which the round
        # before wrote) and a loose object is one file to look for; libgit2 looks in every pack
        # first. Objects held for the next `flush` count: they are written before a ref names them.
        if _HEX_ID.fullmatch(oid):
            raw = bytes.fromhex(oid)
            if raw in self._pending or raw in self._packed_ids \
                    or os.path.exists(os.path.join(self._objects_dir, oid[:2], oid[2:])):
                return True
        try:
            return oid in self._repo
        except (pygit2.GitError, ValueError):  # not translated: a malformed id is not held
            return False

    def patch_tree(self, base_tree: str | None, changes: Changes, *, expect_new: bool = True) -> str | None:
        """Apply `changes` to `base_tree` touching only the trees above changed paths.

        Returns the new tree id, or None for an empty tree. `expect_new`: the trees are most
        likely new (a round's), so the repository is not asked whether it holds them (a tree
        it holds is written again, harmlessly); a restore, which puts back old trees, passes False.
        """
        nested: dict[str, Any] = {}
        for path, entry in changes.items():
            node = nested
            parts = path.split("/")
            for part in parts[:-1]:
                child = node.setdefault(part, {})
                if not isinstance(child, dict):
                    # `part` itself is also being set (a file or link replacing a folder)
                    child = {"": child}
                    node[part] = child
                node = child
            leaf = parts[-1]
            existing = node.get(leaf)
            if isinstance(existing, dict):
                existing[""] = entry
            else:
                node[leaf] = entry
        with written(self.git_dir, "write a tree"):
            written_now: dict[bytes, TreeRecords] = {}
            oid, _ = self._patch(bytes.fromhex(base_tree) if base_tree else None, nested, written_now, expect_new)
            # the next round patches these trees: keep them, not the disk, as its base (cleared
            # when a collection may have removed objects: `reopen`)
            if len(self._recent_trees) + len(written_now) > RECENT_TREES_MAX:
                # the last written: the root and the folders above the last paths (trees are made children first)
                self._recent_trees = dict(list(written_now.items())[-RECENT_TREES_MAX:])
            else:
                self._recent_trees.update(written_now)
            return oid

    def differ_only_at(self, old: str | None, new: str | None, paths: Collection[str]) -> bool:
        """True when every file that differs between trees `old` and `new` is one of `paths`
        (file paths); stops at the first other one (`_differing_files`). A restore asks this of
        the two trees its writes go on, the newest snapshot's and the workspace's, which the
        rounds just wrote (read from memory).

        Raises:
            ObjectMissingError: the repository does not hold a tree to read.
        """
        wanted = {os.fsencode(p) for p in paths}
        with translated("compare trees"):
            return all(path in wanted for path, _, _ in self._differing_files(old, new))

    def write_tree_packed(self, files: Iterable[tuple[str, int, bytes]]) -> str | None:
        """The tree holding exactly `files` (path, git mode, raw blob id; sorted by path), built
        from nothing: every tree written into one pack as it is made, not one loose object per
        folder (a fresh baseline of 100k files writes ~17k trees). Returns the root tree's id
        (None: empty).

        Raises:
            ValueError: the paths are not sorted, or a path is both a file and a folder (the
                caller patches instead).
            StorageFailedError: the docs root refused the write.
        """
        root = self._packed(files, None)
        return root.hex() if root is not None else None

    def write_subtrees_packed(self, files: Iterable[tuple[str, int, bytes]]) -> RootItems:
        """`write_tree_packed` for one run of the paths, without the root tree: its entries
        are returned for `write_root_tree` (two processes write the trees of a big baseline,
        each a run of top-level names).

        Raises:
            as `write_tree_packed`.
        """
        items = RootItems()
        self._packed(files, items)
        return items

    def write_root_tree(self, parts: Sequence[RootItems]) -> str | None:
        """The root tree of `parts` (`write_subtrees_packed`'s, of runs of paths that share no
        top-level name); None when all are empty.

        Raises:
            ValueError: a name is in two parts (a file in one, a folder in another).
            StorageFailedError: the docs root refused the write.
        """
        entries: list[tuple[bytes, bytes]] = []
        names: set[bytes] = set()
        for part in parts:
            if not names.isdisjoint(part.names):
                raise ValueError(f"{sorted(names & part.names)[0]!r}: both a file and a folder")
            names.update(part.names)
            entries.extend(part.entries)
        if not entries:
            return None
        entries.sort()
        if self._pending:
            self.flush()  # as `_in_pack`
        return loose.write_object(self.git_dir, b"tree", b"".join(body for _, body in entries), self._pool)

    def write_folder_trees(self, tops: Mapping[str, Sequence[str]], files: Mapping[str, FolderFiles],
                           poll: Callable[[], None] | None = None) -> dict[str, tuple[int, bytes]]:
        """The tree of each folder of `tops` (folder -> the folders below it that hold files, in
        `files`), all into one pack, made from their files' entries: {folder: (its files'
        count, raw id)}. Each process of a split baseline writes the trees of the whole folders
        it walked this way: no path is split or sorted, the walk gave the folders and their
        entries (at 100k files, ~37 ms a process against ~70 ms making them from sorted
        paths, `write_tree_packed`'s way). `poll`: run before each folder of `tops` and every
        `_POLL_FOLDERS` folders.

        Raises:
            StorageFailedError: the docs root refused the write.
        """
        out: dict[str, tuple[int, bytes]] = {}

        def make(add: Callable[[bytes, int, bytes], None]) -> bool:
            for top, below in tops.items():
                if poll is not None:
                    poll()
                out[top] = _tree_of_listed(top, below, files, add, poll)
            return bool(out)

        self._in_pack(make)
        return out

    def _packed(self, files: Iterable[tuple[str, int, bytes]], root_items: RootItems | None) -> bytes | None:
        root: bytes | None = None

        def make(add: Callable[[bytes, int, bytes], None]) -> bool:
            nonlocal root
            root = _trees_of_sorted(files, add, root_items)
            return root is not None or (root_items is not None and bool(root_items.entries))

        self._in_pack(make)
        return root

    def _in_pack(self, make: Callable[[Callable[[bytes, int, bytes], None]], bool]) -> None:
        """Run `make(add)`, which hands each tree it makes to `add`, and install them as one
        pack; none when `make` says it made nothing (False)."""
        if self._pending:
            self.flush()  # what the trees name is on disk before they are (`_held` counts on it)
        staging = self.git_dir / "objects" / f"tmp_treepack_{os.getpid()}_{threading.get_ident()}"
        try:
            with written(self.git_dir, "write a tree"):
                staging.mkdir(exist_ok=True)
                try:
                    with packing.PackStream(staging) as pack:
                        if not make(pack.add):
                            return
                        pack.finish()
                    self._install_packs(staging, self.git_dir / "objects" / "pack")
                finally:
                    shutil.rmtree(staging, ignore_errors=True)
        except _NotATree as exc:
            raise ValueError(str(exc)) from None

    def _entries(self, raw: bytes) -> TreeRecords:
        """The entries of tree `raw` (a copy, to change): those of a tree a recent patch wrote
        from memory, any other's read from the repository.

        Raises:
            ObjectMissingError: the repository does not hold it.
        """
        known = self._recent_trees.get(raw)
        if known is not None:
            return dict(known)
        # parsed by libgit2 (read from the packs first), not read raw: a raw read asks the loose
        # objects first, a lookup of a missing file in a folder of hundreds (`_raw`)
        tree = self._obj(pygit2.Oid(raw=raw))
        return {e.raw_name: b"%o %s\0%s" % (e.filemode, e.raw_name, e.id.raw) for e in tree}

    def _patch(self, tree: bytes | None, changes: dict[str, Any], written_now: dict[bytes, TreeRecords],
               expect_new: bool) -> tuple[str | None, bool]:
        """Write tree `tree` (raw id; None: an empty one) with `changes` applied: the new tree's
        id (None when nothing is left in it), and whether it was written as new. git's tree
        format is written here, names as bytes (a name that is not UTF-8 comes as a lone
        surrogate, surrogateescape; test_hostile.py), and the object held for the next `flush`;
        `written_now` gets every tree written (raw id: entries).

        Without `expect_new` the repository is asked whether it holds a tree before it is
        written, except for a tree holding one just written as new, or a blob held for the next
        flush: a tree the repository held would hold only objects it held (a restore keeping an
        outside edit writes a new chain of trees above its merged blob: no question, where each
        was ~15 us and a rescan of libgit2's pack folder when the answer is no). A blob held
        again that a pack holds already makes its trees be written again, harmlessly."""
        entries = self._entries(tree) if tree is not None else {}
        added = False
        above_new = False
        for name, change in changes.items():
            key = os.fsencode(name)
            record = entries.get(key)
            new, fresh = self._new_entry(_entry_of(record) if record is not None else None, change, written_now,
                                         expect_new)
            above_new = above_new or fresh
            if new is None:
                entries.pop(key, None)
            else:
                added = added or record is None
                entries[key] = b"%o %s\0%s" % (new[1], key, bytes.fromhex(new[0]))
        if not entries:
            return None, False
        if added:
            # git sorts tree entries by name, a folder's name compared as if it ended with "/";
            # a tree read back is in that order already, so only a new name needs a sort
            entries = {n: entries[n] for n in sorted(
                entries, key=lambda n: n + b"/" if entries[n].startswith(_TREE_MODE) else n)}
        data = b"".join(entries.values())
        oid = loose.object_id(b"tree", data)
        raw = bytes.fromhex(oid)
        fresh = False
        if raw not in written_now and raw not in self._recent_trees \
                and (expect_new or above_new or not self.has_object(oid)):
            self._hold(b"tree", data, oid, raw)  # hashed above, not again
            fresh = True
        written_now[raw] = entries
        return oid, fresh

    def _new_entry(self, existing: tuple[int, bytes] | None, change: Any, written_now: dict[bytes, TreeRecords],
                   expect_new: bool) -> tuple[tuple[str, int] | None, bool]:
        """What one name of a tree becomes: (id, mode), or None when it goes away; and whether
        it is new: a tree just written as new, or a blob held for the next flush."""
        if isinstance(change, dict):
            direct = change.pop("", None)
            if direct is not None:  # a file or link replaces the folder: its changes do not matter
                return (direct.oid, direct.mode), False
            folder = existing[1] if existing is not None and existing[0] == MODE_TREE else None
            if not change:
                return ((folder.hex(), MODE_TREE) if folder is not None else None), False
            new_sub, fresh = self._patch(folder, change, written_now, expect_new)
            if new_sub is not None:
                return (new_sub, MODE_TREE), fresh
            return None, False
        if change is None:
            return None, False
        return (change.oid, change.mode), self._held(change.oid)

    def empty_tree(self) -> str:
        return self._hold(b"tree", b"")

    def commit(self, tree: str | None, parents: Iterable[str], message: str, task_id: str) -> str:
        """Write a commit carrying the task id as a trailer; refs are moved separately. The
        tree and parents must be held (callers check a parent read back from a record)."""
        # A line break in a task id would end the trailer and could forge another one: fold it
        # (git reads an indented line as the trailer's continuation).
        # Bytes that are not UTF-8 (lone surrogates from JSON) cannot go in a commit message:
        # written as \x escapes, they made every commit of such a task fail (test_hostile.py).
        printable = task_id.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
        folded = "\n ".join(part for part in printable.replace("\r", "\n").split("\n") if part.strip())
        body = f"{message}\n\n{TASK_TRAILER}: {folded}\n"
        with written(self.git_dir, "write a commit"):
            tree_id = tree or self.empty_tree()
            when = time.time()
            offset = time.localtime(when).tm_gmtoff // 60
            ident = (f"{COMMITTER_NAME} <{COMMITTER_EMAIL}> {int(when)} "
                     f"{'-' if offset < 0 else '+'}{abs(offset) // 60:02d}{abs(offset) % 60:02d}")
            head = "".join([f"tree {full_id(tree_id)}\n", *(f"parent {full_id(p)}\n" for p in parents),
                            f"author {ident}\ncommitter {ident}\n\n"])
            oid = self._hold(b"commit", (head + body).encode())
        if len(self._recent_commits) >= RECENT_COMMITS_MAX:
            del self._recent_commits[next(iter(self._recent_commits))]
        self._recent_commits[oid] = tree if tree and tree != _EMPTY_TREE else None
        return oid

    def tree_or_empty(self, tree: str | None) -> str:
        return tree if tree else self.empty_tree()

    def commit_tree(self, commit: str) -> str | None:
        """The tree of `commit` (None: empty); one this handle wrote is known without a read.

        Raises:
            RepoError: the repository does not hold the commit (or it is not one).
        """
        if commit in self._recent_commits:
            return self._recent_commits[commit]
        with translated(f"read commit {commit}"):
            obj = self._obj(commit)
            tree = obj.peel(pygit2.Tree)
            return str(tree.id) if len(tree) else None

    def tree_of_commit_or_none(self, commit: str) -> str | None:
        try:
            return self.commit_tree(commit)
        except RepoError:
            return None

    def list_tree(self, tree: str | None, prefix: str = "",
                  folders: dict[str, str] | None = None) -> dict[RepoPath, TreeEntry]:
        """Every file of a tree, flattened: {path: TreeEntry}. `folders`: given, it gets the id
        of every tree below `tree` (and of `tree`, as ""): {id: folder path}."""
        out: dict[RepoPath, TreeEntry] = {}
        if tree is None:
            return out
        if folders is not None:
            folders.setdefault(tree, prefix.rstrip("/"))
        with translated(f"read tree {tree}"):
            self._walk(self._obj(tree), prefix, out, folders)
        return out

    def _obj(self, oid: Any) -> Any:
        """An object by id, typed loosely: pygit2's stubs type lookups as the base Object.

        Raises:
            ObjectMissingError: the repository does not hold it (damage: a lost loose object or pack).
        """
        return self._read(oid, self._repo.__getitem__)

    def _raw(self, oid: pygit2.Oid) -> bytes:
        """An object's content, read once from the object database. `_obj(oid).read_raw()` read
        it twice. This one read is still libgit2's prefix read, which asks the loose objects
        first: a lookup of a missing file in a folder of hundreds (~0.1-0.2 ms when its blocks
        are not cached) for an object in a pack. A tree a patch reads back avoids even that
        (`_entries`).

        Raises:
            ObjectMissingError: the repository does not hold it (damage: a lost loose object or pack).
        """
        return self._read(oid, lambda found: bytes(self._repo.odb.read(found)[1]))

    def _read(self, oid: Any, read: Callable[[Any], _T]) -> _T:
        """`read(oid)`, once a copy of `oid` held for the next flush is written; a missing
        object raises ObjectMissingError."""
        if self._pending and self._held(oid):
            self.flush()
        try:
            return read(oid)
        except KeyError as exc:  # pygit2's NotFoundError is a KeyError too
            raise ObjectMissingError(
                f"The shadow repository {self.git_dir} is missing object {oid} (lost or damaged).") from exc

    def _held(self, oid: Any) -> bool:
        """Whether `oid` may be an object held for the next flush (any name not an id: maybe).

        Only the object asked for counts, since what a written tree or commit names was written
        with it or before: a flush writes all that is held, and the trees written without one
        (a tree built from nothing, in packs: `_in_pack`, `write_root_tree`) flush first. So a
        lookup in an old tree, the restore's target, reads no held object and writes nothing.
        libgit2 is never asked for a held blob either: `read_blob` serves it, `merge_file`
        writes it first."""
        if isinstance(oid, pygit2.Oid):
            return oid.raw in self._pending
        if isinstance(oid, str) and _HEX_ID.fullmatch(oid):
            return bytes.fromhex(oid) in self._pending
        return True

    def _walk(self, tree: Any, prefix: str, out: dict[RepoPath, TreeEntry], folders: dict[str, str] | None) -> None:
        for entry in tree:
            path = f"{prefix}{entry.name}"
            if entry.filemode == MODE_TREE:
                if folders is not None:
                    folders.setdefault(str(entry.id), path)
                self._walk(self._obj(entry.id), path + "/", out, folders)
            else:
                out[RepoPath(path)] = TreeEntry(str(entry.id), entry.filemode)

    def lookup(self, tree: str | None, path: RepoPath) -> TreeEntry | None:
        """The entry at `path` in `tree`, or None."""
        if tree is None:
            return None
        try:
            entry = self._obj(tree)[path]
        except (KeyError, pygit2.GitError, ValueError):  # not translated: "not found" is the answer
            return None
        return TreeEntry(str(entry.id), entry.filemode)

    def missing_trees(self, tree: str | None, limit: int = 10) -> list[str]:
        """Ids of trees below `tree` (itself included) the repo cannot read; [] when whole."""
        if tree is None:
            return []
        missing: list[str] = []
        stack = [tree]
        seen: set[str] = set()
        while stack and len(missing) < limit:
            tid = stack.pop()
            if tid in seen:
                continue
            seen.add(tid)
            try:
                with translated(f"read tree {tid}"):
                    obj = self._obj(tid)
                    stack.extend(str(e.id) for e in obj if e.filemode == MODE_TREE)
            except RepoError:
                missing.append(tid)
        return missing

    def commit_chain(self, tip: str) -> list[tuple[str, str]]:
        """(commit id, message) from `tip` back along first parents, oldest first; stops at
        the first commit the repo cannot read (what survives of a damaged history)."""
        out: list[tuple[str, str]] = []
        current: str | None = tip
        seen: set[str] = set()
        while current is not None and current not in seen:
            seen.add(current)
            try:
                with translated(f"read commit {current}"):
                    obj = self._obj(current)
                    message = str(obj.message)
                    parents = [str(p) for p in obj.parent_ids]
            except RepoError:
                break
            out.append((current, message))
            current = parents[0] if parents else None
        out.reverse()
        return out

    # ------------------------------------------------------------------ refs

    def read_ref(self, name: str) -> str | None:
        # A loose ref holding an id is read here (it overrides packed-refs, as git reads it):
        # the head is read under every lock. Anything else (packed, symbolic) goes to libgit2.
        if name.startswith("refs/") and ".." not in name:
            content = _head_of(os.path.join(self.git_dir, name))
            target = content[:40].decode("ascii", "replace")
            if len(content) == 41 and content[40:] == b"\n" and _HEX_ID.fullmatch(target):
                return target
        try:
            ref = self._repo.references.get(name)
        except (pygit2.GitError, ValueError):  # not translated: an invalid or unreadable ref is no ref
            return None
        if ref is None:
            return None
        try:
            return str(ref.resolve().target)
        except (pygit2.GitError, KeyError):  # not translated: a dangling symbolic ref is no ref
            return None

    def set_ref(self, name: str, commit: str, *, durable: bool = True, in_place: bool = False) -> None:
        """Point ref `name` at object `commit` (a commit, or the head's tree); the caller holds
        the workspace lock (so no `<ref>.lock` is taken: `loose.write_ref`, which says what
        `durable=False` gives up). `in_place` (implied by `durable=False`), for a ref moved
        every round: its file is written over (`loose.rewrite_ref`).

        Raises:
            RepoError: `name` is not a valid ref name, or a file or folder is in the way.
            StorageFailedError: the docs root refused the write.
        """
        if name not in self._valid_refs:
            if not pygit2.reference_is_valid_name(name) or not name.startswith("refs/"):
                raise RepoError(f"Shadow repository failed to move {name}: not a valid ref name")
            if len(self._valid_refs) >= VALID_REFS_MAX:
                self._valid_refs.clear()
            self._valid_refs.add(name)
        with translated(f"move {name}"):
            target = full_id(commit)
        self.flush(naming=True)
        if durable and not in_place:
            loose.write_ref(self.git_dir, name, target, self._pool)
        else:
            loose.rewrite_ref(self.git_dir, name, target, self._open_refs, self._pool, durable=durable)

    def delete_ref(self, name: str) -> None:
        for attempt in range(2):
            try:
                self._repo.references.delete(name)
                return
            except KeyError:
                return  # no such ref
            except (pygit2.GitError, ValueError, OSError):  # not translated: cleared, retried, then logged
                if attempt:
                    log.warning("shadow_repo.ref_not_deleted", ref=name)
                    return
                # A stale `<ref>.lock` kept the ref (and every object it reaches) alive for
                # good before (tests/faults/test_damage.py); we hold the workspace lock.
                self._clear_stale_locks(self.git_dir)

    def list_refs(self, prefix: str = "refs/shadowpoint/") -> dict[str, str]:
        out: dict[str, str] = {}
        with translated("list refs"):
            for name in self._repo.references:
                if name.startswith(prefix):
                    target = self.read_ref(name)
                    if target:
                        out[name] = target
        return out

    # ------------------------------------------------------------------ diff

    def diff_trees(self, old: str | None, new: str | None, *, renames: bool = True) -> list[DeltaRecord]:
        """Changes from tree `old` to tree `new` (identical subtrees are skipped, so this
        costs O(changes)); exact and similar renames detected unless `renames` is False."""
        if old == new:
            return []
        with translated("compare trees"):
            changed = self._changed_entries(old, new)
            gone = any(o is not None and n is None for _, o, n in changed)
            came = any(o is None and n is not None for _, o, n in changed)
            if not (renames and gone and came):
                # no rename to find: the pruned walk is the answer (libgit2's tree diff reads
                # every tree of both sides, 140 ms and 12 MB of peak memory at 100k files)
                return [DeltaRecord("added" if o is None else "deleted" if n is None else "modified", path, None,
                                    o[0] if o else None, n[0] if n else None, o[1] if o else None, n[1] if n else None)
                        for path, o, n in changed]
            a = self._obj(old) if old else self._obj(self.empty_tree())
            b = self._obj(new) if new else self._obj(self.empty_tree())
            diff = a.diff_to_tree(b)
            if renames:
                diff.find_similar(flags=pygit2.enums.DiffFind.FIND_RENAMES)
            out = []
            for delta in diff.deltas:
                st = delta.status
                D = pygit2.enums.DeltaStatus
                if st == D.ADDED:
                    status = "added"
                elif st == D.DELETED:
                    status = "deleted"
                elif st == D.RENAMED:
                    status = "renamed"
                else:
                    status = "modified"
                old_present = st not in (D.ADDED,)
                new_present = st not in (D.DELETED,)
                out.append(
                    DeltaRecord(
                        status,
                        RepoPath(delta.new_file.path if new_present else delta.old_file.path),
                        RepoPath(delta.old_file.path) if st == D.RENAMED else None,
                        str(delta.old_file.id) if old_present else None,
                        str(delta.new_file.id) if new_present else None,
                        delta.old_file.mode if old_present else None,
                        delta.new_file.mode if new_present else None,
                    )
                )
            return out

    def _changed_entries(self, old: str | None, new: str | None
                         ) -> list[tuple[RepoPath, tuple[str, int] | None, tuple[str, int] | None]]:
        """(path, old (blob id, mode), new) of every file that differs, in git's path order."""
        out = [(path, (a[1].hex(), a[0]) if a else None, (b[1].hex(), b[0]) if b else None)
               for path, a, b in self._differing_files(old, new)]
        out.sort(key=lambda item: item[0])
        return [(RepoPath(os.fsdecode(path)), a, b) for path, a, b in out]

    def _differing_files(self, old: str | None, new: str | None
                         ) -> Iterator[tuple[bytes, tuple[int, bytes] | None, tuple[int, bytes] | None]]:
        """(path, old (mode, raw id), new) of each file that differs between two trees, in no
        set order; a file on one side only has None on the other. Subtrees with the same id on
        both sides are never read, and a tree a recent patch wrote is read from memory
        (`_entries`).

        Raises:
            ObjectMissingError: the repository does not hold a tree to read.
        """
        stack: list[tuple[bytes, bytes | None, bytes | None]] = [
            (b"", bytes.fromhex(old) if old else None, bytes.fromhex(new) if new else None)]
        while stack:
            prefix, a, b = stack.pop()
            if a == b:
                continue
            a_entries = self._entries(a) if a else {}
            b_entries = self._entries(b) if b else {}
            for name in a_entries.keys() | b_entries.keys():
                ra, rb = a_entries.get(name), b_entries.get(name)
                if ra == rb:
                    continue
                ea = _entry_of(ra) if ra is not None else None
                eb = _entry_of(rb) if rb is not None else None
                path = prefix + name
                a_sub = ea[1] if ea is not None and ea[0] == MODE_TREE else None
                b_sub = eb[1] if eb is not None and eb[0] == MODE_TREE else None
                if a_sub is not None or b_sub is not None:
                    stack.append((path + b"/", a_sub, b_sub))
                was = ea if a_sub is None else None
                now = eb if b_sub is None else None
                if was is not None or now is not None:
                    yield path, was, now

    # ------------------------------------------------------------------ storage

    def reachable_objects(self, tips: Iterable[str], known: Container[str] | None = None) -> set[str]:
        """Every object id reachable from `tips` (commits or trees): commits, trees, blobs.

        Commits and trees in `known` are not entered (an incremental walk).
        """
        known = known or set()
        seen: set[str] = set()
        stack_commits = [t for t in tips]
        seen_trees: set[str] = set()
        with translated("walk history"):
            while stack_commits:
                cid = stack_commits.pop()
                if cid in seen or cid in known:
                    continue
                obj = self._obj(cid)
                trees: list[Any]
                if isinstance(obj, pygit2.Tree):
                    trees = [obj]
                else:
                    seen.add(cid)
                    stack_commits.extend(str(p) for p in obj.parent_ids)
                    trees = [obj.tree]
                while trees:
                    tree = trees.pop()
                    tid = str(tree.id)
                    if tid in seen_trees or tid in known:
                        continue
                    seen_trees.add(tid)
                    for entry in tree:
                        if entry.filemode == MODE_TREE:
                            trees.append(self._obj(entry.id))
                        elif entry.filemode != MODE_GITLINK:
                            seen.add(str(entry.id))
        return seen | seen_trees

    def _loose_file(self, oid: str) -> str | None:
        """Where the loose object `oid` would be; None for anything but 40 lowercase hex digits
        (which could name a file outside `objects/`)."""
        return os.path.join(self._objects_dir, oid[:2], oid[2:]) if _HEX_ID.fullmatch(oid) else None

    def _has_loose(self, oid: str) -> bool:
        """Whether `oid` is held as a loose object (its file exists)."""
        path = self._loose_file(oid)
        return path is not None and os.path.exists(path)

    def collect_garbage(self, grace_s: float = 3600.0,
                        locked: Callable[[], contextlib.AbstractContextManager[Any]] | None = None,
                        progress: Callable[[int, int], None] | None = None,
                        pause: Callable[[], None] | None = None) -> tuple[int, int]:
        """Pack what every ref reaches and drop everything else (`packing` says how).

        Big packs holding only reachable objects stay; the other reachable objects are written
        into new packs without holding the workspace lock (the long part), each installed as
        soon as it is complete, so an interrupted collection leaves a valid repository and
        the next one resumes from the packs already written. Then, under `locked()`, what
        the refs reach now is checked, old packs holding garbage are removed, loose objects
        now packed are removed, and unreachable loose objects older than `grace_s` too
        (younger ones may be about to be referenced by another process). If a ref now
        reaches an object that only an old pack holds, nothing is removed (the next
        collection will do it). `progress(done, total)` follows the objects written.

        `pause`, called between batches of objects read, and of loose files removed (a
        background collection yields to the agent's rounds there). The lock is held in short
        spells: loose files the new packs hold go after it (`_remove_packed`), unreachable
        ones in batches (`_prune_unreachable`). Held for all of it, it kept an agent's rounds
        waiting ~0.8 s while a 10k-file baseline's loose objects went.
        Returns (objects kept, bytes freed).
        """
        self.flush()
        before = disk_usage(self.git_dir)
        tips = self.list_refs()
        with translated("walk history"):
            reach = packing.reachable(self._repo, tips.values())
        keep = reach.objects  # raw ids
        keep_hex = reach.hex_ids()
        objects = self.git_dir / "objects"
        pack_dir = objects / "pack"
        pack_dir.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=GC_STAGING_PREFIX, dir=objects))
        # held until the staging folder is gone: a stale-leftover sweep must not remove it
        # under a live collection (its old packs went next, with no new pack in place)
        with flocked(staging / GC_BUSY_FILE):
            try:
                kept_packs: set[str] = set()
                packed: set[bytes] = set()
                # Only packs present now may go: one installed meanwhile (a baseline's trees, a
                # borrowed copy) may hold objects only a stat cache reaches yet, and packs get no grace.
                old_packs = {idx.stem for idx in pack_dir.glob("pack-*.idx")}
                for idx in sorted(pack_dir.glob("pack-*.idx")):
                    try:
                        listed = packing.pack_ids(idx)
                    except OSError:  # merged meanwhile (`merge_small_packs`, under the lock): not kept
                        continue
                    if len(listed) >= GC_KEEP_PACK_OBJECTS and all(o in keep for o in listed):
                        kept_packs.add(idx.stem)
                        packed.update(listed)
                # What to write, in lists: no set of it beside `keep` (~4 MiB at 100k objects).
                # The plain ones in the walk's order: folder by folder, as sorting by path put
                # them, and commits and trees before every blob, as git writes them: a walk of
                # the trees (the next collection's, a stat cache's rebuild) then reads one
                # stretch of the pack. Spread between the blobs, it touched nearly every page
                # of a 100k-file pack (250 MiB mapped, `limit_mapped_memory`).
                deltas = sorted((o for o in reach.multi if o not in packed), key=lambda o: reach.names.get(o, ""))
                plain = [o for o in itertools.chain(reach.order, reach.blobs)
                         if o not in packed and o not in reach.multi]
                if len(plain) < GC_KEEP_PACK_OBJECTS:  # small: one pack
                    deltas, plain = sorted([*deltas, *plain], key=lambda o: reach.names.get(o, "")), []
                reach.order, reach.blobs = [], []  # their ids are in the lists now (~0.8 MiB)
                total, done = len(deltas) + len(plain), 0
                with translated("collect garbage"):
                    for i in range(0, len(plain), GC_PACK_OBJECTS):
                        chunk = plain[i:i + GC_PACK_OBJECTS]
                        packing.write_pack(self._repo, chunk, staging, progress, done, total, pause=pause)
                        kept_packs.add(self._install_packs(staging, pack_dir))
                        done += len(chunk)
                    if deltas:
                        packing.write_delta_pack(self._repo, deltas, reach.names, staging)
                        kept_packs.add(self._install_packs(staging, pack_dir))
                        done += len(deltas)
                        if progress is not None:
                            progress(done, total)
                lock = locked if locked is not None else contextlib.nullcontext
                with lock():
                    now_tips = self.list_refs()
                    moved = [t for name, t in now_tips.items() if tips.get(name) != t]
                    extra = {o for o in self.reachable_objects(moved, known=keep_hex)
                             if o not in keep_hex} if moved else set()
                    # what the refs reach now must be loose or in a pack that stays: one written
                    # meanwhile (a round's, `flush`; a kept one holds no `extra` object)
                    staying: set[str] = set()
                    if extra:
                        wanted = {bytes.fromhex(o) for o in extra}
                        for idx in pack_dir.glob("pack-*.idx"):
                            if idx.stem not in old_packs:
                                staying.update(raw.hex() for raw in packing.pack_holds(idx, wanted))
                    only_in_old_packs = [o for o in extra if o not in staying and not self._has_loose(o)]
                    if only_in_old_packs:
                        log.info("storage.collect_deferred", git_dir=str(self.git_dir), objects=len(only_in_old_packs))
                        return len(keep), 0
                    self._note_collection()
                    for p in pack_dir.glob("pack-*"):
                        name = p.name.partition(".")[0]
                        if name in old_packs and name not in kept_packs:
                            with contextlib.suppress(OSError):
                                p.unlink()
                    self.reopen()
                    self._packs_written = 0
                unreachable = self._remove_packed(keep, extra, pause)
                self._prune_unreachable(unreachable, keep_hex, now_tips, grace_s, lock, pause)
            finally:
                shutil.rmtree(staging, ignore_errors=True)
        freed = max(0, before - disk_usage(self.git_dir))
        log.info("storage.collected", git_dir=str(self.git_dir), kept=len(keep), freed_bytes=freed)
        return len(keep), freed

    @staticmethod
    def _install_packs(staging: Path, pack_dir: Path) -> str:
        """Move the one pack written into `staging` into place (.pack before .idx); its name.

        Raises:
            RepoError: no complete pack is there (nothing is removed without one).
        """
        idx = sorted(staging.glob("pack-*.idx"))
        if len(idx) != 1 or not idx[0].with_suffix(".pack").is_file():
            raise RepoError(f"Garbage collection lost its new pack in {staging}; nothing was removed.")
        stem = idx[0].stem
        for p in sorted(staging.glob(f"{stem}.*"), key=lambda q: q.suffix != ".pack"):
            os.replace(p, pack_dir / p.name)
        return stem

    def _remove_packed(self, packed: set[bytes], reached: set[str], pause: Callable[[], None] | None) -> list[str]:
        """Remove the loose copies of the objects in `packed`, which installed packs hold (git's
        prune-packed): without the lock, since any reader finds each of them in a pack. Returns
        the other loose objects `reached` (what refs moved meanwhile reach) does not hold."""
        objects = self.git_dir / "objects"
        others: list[str] = []
        removed = 0
        for sub in sorted(os.listdir(objects)):
            if len(sub) != 2:
                continue
            try:
                names = os.listdir(objects / sub)
            except OSError:  # not a folder, or gone
                continue
            for name in names:
                oid = sub + name
                if len(name) != 38:
                    continue
                try:
                    raw = bytes.fromhex(oid)
                except ValueError:  # not an object's file
                    continue
                if raw in packed:
                    with contextlib.suppress(OSError):
                        os.unlink(objects / sub / name)
                    removed += 1
                    if removed % _PRUNE_BATCH == 0 and pause is not None:
                        pause()
                elif oid not in reached:
                    others.append(oid)
        return others

    def _prune_unreachable(self, oids: list[str], reached: Container[str], tips: dict[str, str], grace_s: float,
                           lock: Callable[[], contextlib.AbstractContextManager[Any]],
                           pause: Callable[[], None] | None) -> None:
        """Remove the loose objects of `oids` older than `grace_s` (all with 0) that no ref
        reaches, a batch per hold of the lock; then the empty fan-out folders. A ref moved
        since `tips` (a round between two batches) is walked first, down to what `reached`
        holds: what it reaches stays."""
        cutoff = time.time() - grace_s
        fresh: set[str] = set()  # reached through refs moved since `tips`
        for i in range(0, len(oids), _PRUNE_BATCH):
            if i and pause is not None:
                pause()
            with lock():
                now = self.list_refs()
                moved = [t for name, t in now.items() if tips.get(name) != t]
                if moved:
                    fresh |= self.reachable_objects(moved, known=reached)
                tips = now
                for oid in oids[i:i + _PRUNE_BATCH]:
                    if oid in fresh:
                        continue
                    path = self.git_dir / "objects" / oid[:2] / oid[2:]
                    with contextlib.suppress(OSError):
                        if grace_s <= 0 or path.stat().st_mtime < cutoff:
                            path.unlink()
        with lock():  # a writer under the lock makes a fan-out folder and renames into it
            self._remove_empty_fanout()

    def _remove_empty_fanout(self) -> None:
        objects = self.git_dir / "objects"
        for sub in os.listdir(objects):
            if len(sub) == 2:
                with contextlib.suppress(OSError):  # not empty (or not a folder)
                    os.rmdir(objects / sub)


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return float("inf")  # gone meanwhile: nothing to remove


def pack_count(git_dir: Path) -> int:
    """How many packs the repo has (their indexes counted)."""
    try:
        return sum(1 for name in os.listdir(git_dir / "objects" / "pack") if name.endswith(".idx"))
    except OSError:
        return 0


def _staging_in_use(staging: Path) -> bool:
    """True while a live collection holds the flock on the staging folder's busy file (no busy
    file: a dead collection's, or one that will fail to start)."""
    return is_flocked(staging / GC_BUSY_FILE)


def _is_utf8(name: str) -> bool:
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def loose_object_estimate(git_dir: Path) -> int:
    """Loose objects in the repo, estimated from one fan-out folder as git's gc.auto does."""
    try:
        return len(os.listdir(git_dir / "objects" / "17")) * 256
    except OSError:
        return 0


def disk_usage(path: Path) -> int:
    """Bytes used by the files below `path` (not following symlinks)."""
    total = 0
    for dp, _, files in os.walk(path):
        for f in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dp, f)).st_blocks * 512
    return total
