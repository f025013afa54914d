"""Objects a baseline borrowed from the user's git object store, until they are copied (issue 14).

A baseline that took blob ids from the user's index (`git_index.py`), and the tree ids of
whole folders from its cache-tree (`Scanner._index_trees`), reads those objects from the
user's `objects` folder, read-only (`ShadowRepo.borrow_from`: a read-only odb
backend, never an `objects/info/alternates` line, whose writers would touch the user's
files and skip storing objects found there). The ledger,
`<shadow git dir>/shadowpoint/borrowed` (JSON lines: the alternate, then a `{tree}` line naming
the baseline's tree, written durably before the baseline's commit; earlier versions wrote one
`{oid, path}` line per borrowed file instead, still read). `copy_borrowed`, run on a
background thread soon after the baseline (and on the next open after a crash), lists the
blobs and trees of those trees, copies every one the shadow repository lacks into it as one pack, then
drops the ledger (every handle
opened afterwards reads its own objects only), so that no snapshot depends on the user's
repository for long.

A blob the user's repository lost before the copy (`git gc --prune=now`, a deleted repo) is
hashed again from the file when the file still holds it; otherwise the loss is logged as an
error and the root is told to verify its tracked set (the next stage re-hashes that path). A
lost tree is reported the same way; the root's check writes it again from the tracked files
(`RootState._verify`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import stat
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from json.encoder import encode_basestring_ascii
from pathlib import Path

import structlog

from shadowpoint.errors import RepoError, ShadowpointError
from shadowpoint.store.atomic import write_atomic
from shadowpoint.store.shadow_repo import BORROWED_LEDGER, ShadowRepo
from shadowpoint.store.values import MODE_GITLINK

log = structlog.get_logger(__name__)

LEDGER = Path(BORROWED_LEDGER)
_STAGING_PREFIX = "borrowed-"  # objects/borrowed-<pid>-<thread>: where a copy writes its pack
_ATTEMPTS = 3
# ids checked between two calls of the copy's `pause` (~20 ms of the interpreter at 100k)
_CHECK_CHUNK = 2048
_OID = re.compile(r"[0-9a-f]{40}")


class _Stopped(Exception):
    """A copy's `pause` said stop (the root closes): raised and caught in `copy_borrowed`."""


def ledger_path(git_dir: Path) -> Path:
    return git_dir / LEDGER


@dataclass(slots=True)
class Ledger:
    alternates: list[str] = field(default_factory=list)
    items: dict[str, str] = field(default_factory=dict)  # oid -> one path that holds it
    trees: list[str] = field(default_factory=list)  # trees whose blobs may be borrowed


def read_ledger(git_dir: Path) -> Ledger | None:
    """The ledger, or None when there is none. A damaged line is skipped (the copy then checks
    every tree's blobs through `RootState._verify` instead: see `copy_borrowed`)."""
    text = _ledger_text(git_dir)
    return None if text is None else parse_ledger(text)


def _ledger_text(git_dir: Path) -> str | None:
    try:
        return ledger_path(git_dir).read_text("utf-8", "surrogateescape")
    except FileNotFoundError:
        return None


def parse_ledger(text: str) -> Ledger:
    """The ledger's lines, read as one JSON array (one C-speed parse: 87,000 `json.loads` held
    the interpreter ~0.3 s), or line by line when a damaged line fails it."""
    lines = text.splitlines()
    try:
        records = json.loads("[" + ",".join(lines) + "]")
    except ValueError:
        records = []
        for line in lines:
            with contextlib.suppress(ValueError):
                records.append(json.loads(line))
    out = Ledger()
    for rec in records:
        if isinstance(rec, dict):
            if isinstance(rec.get("alt"), str) and rec["alt"] not in out.alternates:
                out.alternates.append(rec["alt"])
            elif isinstance(tree := rec.get("tree"), str) and _OID.fullmatch(tree):
                if tree not in out.trees:
                    out.trees.append(tree)
            elif isinstance(oid := rec.get("oid"), str) and _OID.fullmatch(oid) and isinstance(rec.get("path"), str):
                out.items[oid] = rec["path"]  # an id of any other form is a damaged line
    return out


def _lines(alternate: str | None, items: Iterable[tuple[str, str]], trees: Iterable[str] = ()) -> Iterator[str]:
    if alternate is not None:
        yield json.dumps({"alt": alternate}) + "\n"
    for tree in trees:
        yield f'{{"tree": "{tree}"}}\n'
    quoted = encode_basestring_ascii  # json.dumps's own string encoder: one dumps per blob took ~0.2 s at 100k
    for oid, path in items:
        # an id is 40 hex digits (`bytes.hex()` here, checked by `parse_ledger` there): JSON takes them as they are
        yield f'{{"oid": "{oid}", "path": {quoted(path)}}}\n'


def begin(repo: ShadowRepo, objects_dir: Path) -> None:
    """Before the first borrowed id is used: note the alternate in the ledger, then add it.
    Lock held."""
    ledger_path(repo.git_dir).parent.mkdir(parents=True, exist_ok=True)
    _append(repo.git_dir, _lines(str(objects_dir), ()))
    repo.borrow_from(objects_dir)


def record_tree(git_dir: Path, tree: str) -> None:
    """Append `tree`, whose blobs may be read from the user's repository, durably, before a
    commit names it. Lock held."""
    _append(git_dir, _lines(None, (), (tree,)))


def _append(git_dir: Path, lines: Iterable[str]) -> None:
    with open(ledger_path(git_dir), "a", encoding="utf-8", errors="surrogateescape") as fh:
        fh.writelines(lines)
        fh.flush()
        os.fsync(fh.fileno())


@dataclass(slots=True)
class CopyReport:
    copied: int = 0
    rehashed: int = 0
    lost: list[str] = field(default_factory=list)  # paths whose blob is nowhere now
    finished: bool = False
    stopped: bool = False  # its `pause` said stop: the ledger stays for the next open


def _blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _disk_content(path: Path) -> bytes | None:
    """What git would store for `path` now (no conversion), or None."""
    try:
        st = os.lstat(path)
        if stat.S_ISLNK(st.st_mode):
            return os.fsencode(os.readlink(path))
        if not stat.S_ISREG(st.st_mode):
            return None
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as fh:
            return fh.read()
    except OSError:
        return None


def copy_borrowed(git_dir: Path, worktree: Path, locked: Callable[[], contextlib.AbstractContextManager[object]],
                  pause: Callable[[], bool] | None = None) -> CopyReport:
    """Copy every object the ledger names into the shadow repository, then drop the ledger
    (under `locked()`, the workspace lock). Runs without the lock otherwise: it
    only reads objects and installs one new pack. `pause`: called between batches of
    objects (the engine's `yield_to_rounds`: the copy never competes with a round for the
    interpreter); its False ends the copy early (`stopped`: the ledger stays for the next
    open). Returns what it did.

    Raises:
        ShadowpointError: the shadow repository cannot be opened or written.
    """
    report = CopyReport()

    def step() -> None:
        if pause is not None and not pause():
            raise _Stopped

    with locked():  # only the read: a round may wait for this lock
        text = _ledger_text(git_dir)
    if text is None:
        report.finished = True
        return report
    try:
        step()  # parsing 87,000 lines holds the interpreter ~0.2 s: at a quiet moment
        ledger = parse_ledger(text)
        repo = ShadowRepo.open_existing(git_dir)
        try:
            return _copy(repo, ledger, text, git_dir, worktree, locked, step, report)
        finally:
            repo.close()
    except _Stopped:
        report.stopped = True
        return report


def _copy(repo: ShadowRepo, ledger: Ledger, text: str, git_dir: Path, worktree: Path,
          locked: Callable[[], contextlib.AbstractContextManager[object]], step: Callable[[], None],
          report: CopyReport) -> CopyReport:
    """`copy_borrowed`'s work on an open repository (`text`: the ledger as it was read)."""
    staging = git_dir / "objects" / f"{_STAGING_PREFIX}{os.getpid()}-{threading.get_ident()}"
    folders: dict[str, str] = {}
    items = ledger_objects(repo, ledger, step, folders)
    for _ in range(_ATTEMPTS):
        todo = _in_chunks(repo.own_missing, list(items), step)
        if not todo:
            break
        readable = _in_chunks(repo.readable, todo, step)
        found = set(readable)
        for oid in todo:
            if oid in found:
                continue
            rel = items[oid]
            if oid in folders:  # a tree the user's repository lost: rebuilt by the root's check
                if rel not in report.lost:
                    report.lost.append(rel)
                    log.error("borrowed.object_lost", git_dir=str(git_dir), path=rel, oid=oid,
                              reason="the user's repository lost the folder's tree before the copy")
                continue
            data = _disk_content(worktree / rel)
            if data is not None and _blob_id(data) == oid:
                repo.write_blob(data)
                report.rehashed += 1
                log.warning("borrowed.rehashed", git_dir=str(git_dir), path=rel, oid=oid,
                            reason="the user's repository lost the blob before the copy")
            elif rel not in report.lost:
                report.lost.append(rel)
                log.error("borrowed.object_lost", git_dir=str(git_dir), path=rel, oid=oid,
                          reason="the user's repository lost the blob and the file changed since")
        try:
            repo.copy_objects(readable, staging, step)
            report.copied += len(readable)
        except RepoError as exc:  # an object vanished while it was copied: look again
            log.warning("borrowed.copy_retried", git_dir=str(git_dir), reason=str(exc))
            repo.reopen()
            continue
    remaining = set(_in_chunks(repo.own_missing, list(items), step))
    if remaining - {oid for oid, p in items.items() if p in report.lost}:
        log.warning("borrowed.copy_unfinished", git_dir=str(git_dir), missing=len(remaining))
        return report
    with locked():
        # a later baseline may have borrowed more meanwhile: keep its part for the next copy
        now_text = _ledger_text(git_dir)
        now = Ledger() if now_text is None or now_text == text else parse_ledger(now_text)
        left = {oid: p for oid, p in now.items.items() if oid not in ledger.items}
        left_trees = [tree for tree in now.trees if tree not in ledger.trees]
        if left or left_trees:
            alternate = now.alternates[-1] if now.alternates else None
            write_atomic(ledger_path(git_dir), "".join(_lines(alternate, left.items(), left_trees)).encode(
                "utf-8", "surrogateescape"))
            return report
        with contextlib.suppress(FileNotFoundError):
            ledger_path(git_dir).unlink()
    report.finished = True
    log.info("borrowed.copied", git_dir=str(git_dir), copied=report.copied, rehashed=report.rehashed,
             lost=len(report.lost))
    return report


def ledger_objects(repo: ShadowRepo, ledger: Ledger, step: Callable[[], None] | None = None,
                   folders: dict[str, str] | None = None) -> dict[str, str]:
    """The objects `ledger` names (oid -> a path that holds it), those of its trees included:
    every blob and tree of such a tree (a baseline takes the trees of whole folders from the
    user's index too), the copy skips those the shadow repository holds. A tree the
    repository lost names nothing (no commit that names it is readable either). `step`:
    called before each tree is listed; `folders` gets the trees' ids (id -> folder path)."""
    items = dict(ledger.items)
    trees: dict[str, str] = {} if folders is None else folders
    for tree in ledger.trees:
        if step is not None:
            step()
        try:
            listing = repo.list_tree(tree, folders=trees)  # ~0.1 s at 100k files
        except ShadowpointError as exc:
            log.warning("borrowed.tree_unreadable", git_dir=str(repo.git_dir), tree=tree, reason=str(exc))
            continue
        for path, entry in listing.items():
            if entry.mode != MODE_GITLINK:
                items.setdefault(entry.oid, path)
    for oid, folder in trees.items():
        items.setdefault(oid, folder)
    return items


def _in_chunks(check: Callable[[list[str]], list[str]], oids: list[str], pause: Callable[[], None]) -> list[str]:
    """`check(oids)`, a chunk at a time with `pause()` before each (a check of 87,000 ids holds
    the interpreter for ~2 s)."""
    out: list[str] = []
    for start in range(0, len(oids), _CHECK_CHUNK):
        pause()
        out += check(oids[start:start + _CHECK_CHUNK])
    return out


def sweep_staging(git_dir: Path) -> None:
    """Remove the staging folders of copies whose process is gone."""
    for folder in (git_dir / "objects").glob(f"{_STAGING_PREFIX}*"):
        pid = folder.name[len(_STAGING_PREFIX):].split("-", 1)[0]
        with contextlib.suppress(ValueError, OSError):
            if int(pid) == os.getpid():
                continue
            try:
                os.kill(int(pid), 0)
                continue  # alive
            except ProcessLookupError:
                pass
            for child in folder.iterdir():
                child.unlink()
            folder.rmdir()

