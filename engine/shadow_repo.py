"""The shadow repository: the only module that imports pygit2.

Owns libgit2's process-wide isolation (no user/system/XDG git config, no filters, hooks
or fsmonitor), blob/tree/commit writing (trees are patched from the previous tree, so a
round costs O(changed paths)), refs, tree listing, diffs and object reachability. Callers
serialise access per repository (`RootState.lock` in engine.py); no thread of its own.
"""

from __future__ import annotations

import collections
import contextlib
import os
import re
import shutil
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pygit2
import structlog

from shadowpoint.errors import RepoError, ShadowRepoMismatchError
from shadowpoint.workspace import RepoPath

log = structlog.get_logger(__name__)

MODE_FILE = 0o100644
MODE_EXEC = 0o100755
MODE_LINK = 0o120000
MODE_TREE = 0o040000
MODE_GITLINK = 0o160000

COMMITTER_NAME = "shadowpoint Checkpoint"
COMMITTER_EMAIL = "checkpoint@shadowpoint.invalid"
TASK_TRAILER = "Shadowpoint-Task"
HEAD_REF = "refs/shadowpoint/head"

_configured = False

# Parallel loose-object writers for baselines and rescans; measured on this 2-core machine:
# 4,000 blobs took 3.5 s on 1 thread, 1.6 s on 4, 1.5 s on 8 (I/O-bound, GIL released).
BLOB_WRITER_THREADS = 4


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


@contextlib.contextmanager
def translated(action: str) -> Iterator[None]:
    """Turn libgit2 failures into `RepoError` (the one place that catches pygit2 errors)."""
    try:
        yield
    except (pygit2.GitError, KeyError, ValueError) as exc:
        raise RepoError(f"Shadow repository failed to {action}: {exc}") from exc


@dataclass(frozen=True, slots=True)
class TreeEntry:
    """One file of a snapshot: blob id (hex) and git file mode."""

    oid: str
    mode: int


Changes = Mapping[RepoPath, TreeEntry | None]


@dataclass(frozen=True, slots=True)
class DeltaRecord:
    """One changed path between two trees."""

    status: str  # added | modified | deleted | renamed
    path: RepoPath
    old_path: RepoPath | None
    old_oid: str | None
    new_oid: str | None
    old_mode: int | None
    new_mode: int | None


_SAFE_REF = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,100}$")


def ref_component(task_id: str) -> str:
    """A ref-name-safe component for a task id (non-safe ids get a readable hashed form)."""
    if _SAFE_REF.match(task_id) and not task_id.endswith(".lock") and ".." not in task_id:
        return task_id
    import hashlib

    cleaned = re.sub(r"[^A-Za-z0-9._-]", "_", task_id)[:60].strip("._") or "task"
    cleaned = re.sub(r"\.{2,}", "_", cleaned)  # ".." is invalid in a ref name ("a/../b" -> "a_.._b")
    return f"{cleaned}-{hashlib.sha256(task_id.encode('utf-8', 'surrogateescape')).hexdigest()[:12]}"


def task_ref(task_id: str) -> str:
    return f"refs/shadowpoint/tasks/{ref_component(task_id)}"


def safety_ref(task_id: str) -> str:
    return f"refs/shadowpoint/safety/{ref_component(task_id)}"


class BlobBatch:
    """Writes many blobs on worker threads; ids are computed at once on the caller's thread.

    Writing a loose object is a small-file create and rename, I/O-bound, and libgit2
    releases the GIL for it: several writers in parallel (each with its own Repository,
    as libgit2 requires) roughly halve a baseline here. `close()` waits for every write,
    so no tree is written before its blobs exist.
    """

    def __init__(self, git_dir: Path, threads: int = BLOB_WRITER_THREADS, max_pending: int = 512) -> None:
        import concurrent.futures

        self._git_dir = git_dir
        self._local = threading.local()
        self._pool = concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="shadowpoint-blobs")
        self._pending: collections.deque[concurrent.futures.Future[None]] = collections.deque()
        self._max_pending = max_pending

    def _write(self, data: bytes) -> None:
        repo = getattr(self._local, "repo", None)
        if repo is None:
            repo = self._local.repo = pygit2.Repository(str(self._git_dir),
                                                        pygit2.enums.RepositoryOpenFlag.NO_SEARCH)
        repo.create_blob(data)

    def add(self, data: bytes) -> str:
        """Queue `data` for writing; returns its blob id."""
        with translated("hash a blob"):
            oid = str(pygit2.hash(data))
        while len(self._pending) >= self._max_pending:
            self._pending.popleft().result()
        self._pending.append(self._pool.submit(self._write, data))
        return oid

    def close(self) -> None:
        """Wait for every queued write. Raises RepoError if one failed."""
        try:
            with translated("write blobs"):
                while self._pending:
                    self._pending.popleft().result()
        finally:
            self._pool.shutdown(wait=True, cancel_futures=True)


class ShadowRepo:
    """A shadow git dir whose `core.worktree` is a workspace root."""

    def __init__(self, repo: pygit2.Repository, git_dir: Path, worktree: Path) -> None:
        self._repo = repo
        self.git_dir = git_dir
        self.worktree = worktree
        self._sig = pygit2.Signature(COMMITTER_NAME, COMMITTER_EMAIL)

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
        if (git_dir / "objects").is_dir():
            repo = cls._open_existing(git_dir, worktree)
        else:
            with translated("initialise"):
                git_dir.parent.mkdir(parents=True, exist_ok=True)
                repo = pygit2.init_repository(str(git_dir), bare=True)
            cls._write_config(repo, worktree)
            log.info("shadow_repo.created", git_dir=str(git_dir))
        return cls(repo, git_dir, worktree)

    @classmethod
    def _open_existing(cls, git_dir: Path, worktree: Path) -> pygit2.Repository:
        cls._clear_stale_locks(git_dir)
        try:
            # libgit2 reads a NUL-filled config as empty but refuses to write it, so look first.
            if b"\0" in (git_dir / "config").read_bytes():
                raise ValueError("the config file holds NUL bytes")
            repo = pygit2.Repository(str(git_dir), pygit2.enums.RepositoryOpenFlag.NO_SEARCH)
            recorded = repo.config["core.worktree"] if "core.worktree" in repo.config else None
        except (pygit2.GitError, KeyError, ValueError, OSError) as exc:
            return cls._repair(git_dir, worktree, str(exc))
        if recorded is None:
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
            for key, value in (
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
            ):
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

    @classmethod
    def open_existing(cls, git_dir: Path) -> ShadowRepo:
        """Open a shadow repo for maintenance (report, gc) without creating or checking it.

        Raises:
            RepoError: missing or unreadable.
        """
        isolate_libgit2()
        with translated(f"open {git_dir}"):
            repo = pygit2.Repository(str(git_dir), pygit2.enums.RepositoryOpenFlag.NO_SEARCH)
            worktree = repo.config["core.worktree"] if "core.worktree" in repo.config else ""
        return cls(repo, git_dir, Path(worktree or ""))

    def object_size(self, oid: str) -> int:
        """Uncompressed size of an object (0 when it is missing)."""
        try:
            _, size = self._repo.odb.read_header(pygit2.Oid(hex=oid))
            return int(size)
        except (pygit2.GitError, KeyError, ValueError):
            return 0

    def clear_stale_locks(self) -> None:
        self._clear_stale_locks(self.git_dir)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._repo.free()

    # ------------------------------------------------------------------ objects

    def write_blob(self, data: bytes) -> str:
        with translated("write a blob"):
            return str(self._repo.create_blob(data))

    def blob_batch(self) -> BlobBatch:
        return BlobBatch(self.git_dir)

    def read_blob(self, oid: str) -> bytes:
        with translated(f"read blob {oid}"):
            obj = self._obj(oid)
            return bytes(obj.read_raw())

    def has_object(self, oid: str) -> bool:
        try:
            return oid in self._repo
        except (pygit2.GitError, ValueError):
            return False

    def patch_tree(self, base_tree: str | None, changes: Changes) -> str | None:
        """Apply `changes` to `base_tree` touching only the trees above changed paths.

        Returns the new tree id, or None for an empty tree.
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
        with translated("write a tree"):
            base = self._obj(base_tree) if base_tree else None
            oid = self._patch(base, nested)
            return str(oid) if oid is not None else None

    def _patch(self, tree: Any, changes: dict[str, Any]) -> Any:
        tb = self._repo.TreeBuilder(tree) if tree is not None else self._repo.TreeBuilder()
        count = len(tree) if tree is not None else 0
        for name, change in changes.items():
            existing = tb.get(name)
            if isinstance(change, dict):
                direct = change.pop("", None)
                sub = None
                if existing is not None and existing.filemode == MODE_TREE:
                    sub = self._obj(existing.id)
                new_sub = self._patch(sub, change) if change else (None if direct is not None else sub and sub.id)
                if direct is not None:
                    new = (direct.oid, direct.mode)
                elif new_sub is not None:
                    new = (new_sub, MODE_TREE)
                else:
                    new = None
            elif change is None:
                new = None
            else:
                new = (change.oid, change.mode)
            if new is None:
                if existing is not None:
                    tb.remove(name)
                    count -= 1
            else:
                if existing is None:
                    count += 1
                tb.insert(name, pygit2.Oid(hex=str(new[0])), new[1])
        if count <= 0:
            return None
        return tb.write()

    def empty_tree(self) -> str:
        with translated("write the empty tree"):
            return str(self._repo.TreeBuilder().write())

    def commit(self, tree: str | None, parents: Iterable[str], message: str, task_id: str) -> str:
        """Write a commit carrying the task id as a trailer; refs are moved separately."""
        # A line break in a task id would end the trailer and could forge another one: fold it
        # (git reads an indented line as the trailer's continuation).
        folded = "\n ".join(part for part in re.split(r"[\r\n]+", task_id) if part.strip())
        body = f"{message}\n\n{TASK_TRAILER}: {folded}\n"
        with translated("write a commit"):
            tree_oid = pygit2.Oid(hex=tree) if tree else self._repo.TreeBuilder().write()
            oid = self._repo.create_commit(
                None, self._sig, self._sig, body, tree_oid, [pygit2.Oid(hex=p) for p in parents]
            )
            return str(oid)

    def tree_or_empty(self, tree: str | None) -> str:
        return tree if tree else self.empty_tree()

    def commit_tree(self, commit: str) -> str | None:
        with translated(f"read commit {commit}"):
            obj = self._obj(commit)
            tree = obj.peel(pygit2.Tree)
            return str(tree.id) if len(tree) else None

    def tree_of_commit_or_none(self, commit: str) -> str | None:
        try:
            return self.commit_tree(commit)
        except RepoError:
            return None

    def list_tree(self, tree: str | None, prefix: str = "") -> dict[RepoPath, TreeEntry]:
        """Every file of a tree, flattened: {path: TreeEntry}."""
        out: dict[RepoPath, TreeEntry] = {}
        if tree is None:
            return out
        with translated(f"read tree {tree}"):
            self._walk(self._obj(tree), prefix, out)
        return out

    def _obj(self, oid: Any) -> Any:
        """An object by id, typed loosely: pygit2's stubs type lookups as the base Object."""
        return self._repo[oid]

    def _walk(self, tree: Any, prefix: str, out: dict[RepoPath, TreeEntry]) -> None:
        for entry in tree:
            path = f"{prefix}{entry.name}"
            if entry.filemode == MODE_TREE:
                self._walk(self._obj(entry.id), path + "/", out)
            else:
                out[RepoPath(path)] = TreeEntry(str(entry.id), entry.filemode)

    def lookup(self, tree: str | None, path: RepoPath) -> TreeEntry | None:
        """The entry at `path` in `tree`, or None."""
        if tree is None:
            return None
        try:
            entry = self._obj(tree)[path]
        except (KeyError, pygit2.GitError, ValueError):
            return None
        return TreeEntry(str(entry.id), entry.filemode)

    # ------------------------------------------------------------------ refs

    def read_ref(self, name: str) -> str | None:
        try:
            ref = self._repo.references.get(name)
        except (pygit2.GitError, ValueError):
            return None
        if ref is None:
            return None
        try:
            return str(ref.resolve().target)
        except (pygit2.GitError, KeyError):
            return None

    def set_ref(self, name: str, commit: str) -> None:
        with translated(f"move {name}"):
            try:
                self._repo.references.create(name, pygit2.Oid(hex=commit), force=True)
            except (pygit2.GitError, OSError):  # pygit2 raises OSError for "failed to lock file"
                # A stale `<ref>.lock` of a killed writer: we hold the workspace lock.
                self._clear_stale_locks(self.git_dir)
                self._repo.references.create(name, pygit2.Oid(hex=commit), force=True)

    def delete_ref(self, name: str) -> None:
        with contextlib.suppress(pygit2.GitError, KeyError, ValueError):
            self._repo.references.delete(name)

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

    def diff_trees(self, old: str | None, new: str | None) -> list[DeltaRecord]:
        """Changes from tree `old` to tree `new`, exact and similar renames detected."""
        with translated("compare trees"):
            a = self._obj(old) if old else self._obj(self.empty_tree())
            b = self._obj(new) if new else self._obj(self.empty_tree())
            diff = a.diff_to_tree(b)
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

    # ------------------------------------------------------------------ storage

    def reachable_objects(self, tips: Iterable[str]) -> set[str]:
        """Every object id reachable from `tips` (commits or trees): commits, trees, blobs."""
        seen: set[str] = set()
        stack_commits = [t for t in tips]
        seen_trees: set[str] = set()
        with translated("walk history"):
            while stack_commits:
                cid = stack_commits.pop()
                if cid in seen:
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
                    if tid in seen_trees:
                        continue
                    seen_trees.add(tid)
                    for entry in tree:
                        if entry.filemode == MODE_TREE:
                            trees.append(self._obj(entry.id))
                        elif entry.filemode != MODE_GITLINK:
                            seen.add(str(entry.id))
        return seen | seen_trees

    def collect_garbage(self, grace_s: float = 3600.0) -> tuple[int, int]:
        """Repack what every ref reaches into one pack and drop everything else.

        libgit2 has no gc: reachability is computed here and a fresh pack written with
        PackBuilder; loose objects and old packs are removed only after the new pack is
        in place. Unreachable loose objects younger than `grace_s` stay: another process
        may be about to reference them. Returns (objects kept, bytes freed).
        """
        before = disk_usage(self.git_dir)
        tips = list(self.list_refs().values())
        keep = self.reachable_objects(tips)
        objects = self.git_dir / "objects"
        pack_dir = objects / "pack"
        pack_dir.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix="gc-", dir=objects))
        try:
            with translated("collect garbage"):
                if keep:
                    pb = pygit2.PackBuilder(self._repo)
                    pb.set_threads(0)
                    for oid in keep:
                        pb.add(pygit2.Oid(hex=oid))
                    pb.write(str(staging))
            old_packs = sorted(pack_dir.glob("pack-*"))
            new_packs = sorted(staging.glob("pack-*"))
            # the new pack (its .pack before its .idx) is in place before anything is removed
            for p in sorted(new_packs, key=lambda q: q.suffix != ".pack"):
                os.replace(p, pack_dir / p.name)
            new_names = {p.name for p in new_packs}
            for p in old_packs:
                if p.name not in new_names:
                    with contextlib.suppress(OSError):
                        p.unlink()
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        cutoff = time.time() - grace_s
        for sub in objects.iterdir():
            if len(sub.name) != 2 or not sub.is_dir():
                continue
            for obj in sub.iterdir():
                with contextlib.suppress(OSError):
                    if grace_s <= 0 or obj.stat().st_mtime < cutoff:
                        obj.unlink()
            with contextlib.suppress(OSError):
                sub.rmdir()
        with translated("reopen after garbage collection"):
            self._repo.free()
            self._repo = pygit2.Repository(str(self.git_dir), pygit2.enums.RepositoryOpenFlag.NO_SEARCH)
        freed = max(0, before - disk_usage(self.git_dir))
        log.info("storage.collected", git_dir=str(self.git_dir), kept=len(keep), freed_bytes=freed)
        return len(keep), freed


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
