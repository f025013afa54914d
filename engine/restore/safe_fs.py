"""The restore's own file writer: writes, removes and reads workspace paths without following symlinks.

Every path is walked component by component from an open root directory descriptor with
`O_NOFOLLOW`, so nothing outside the workspace is ever written, deleted or read. `plan.py`
calls it on the engine thread; a `SafeWriter` holds file descriptors and is not thread-safe.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Literal, Protocol

import structlog

from shadowpoint.errors import NoWorkspaceError, PathOutsideWorkspaceError, RestoreFailedError
from shadowpoint.workspace import RepoPath

log = structlog.get_logger(__name__)

TEMP_PREFIX = ".shadowpoint-tmp-"
"""Name prefix of the temporary entries renamed into place; `cleanup_temp_files` removes leftovers."""

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_TEMP_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
# O_NONBLOCK: a FIFO swapped in after the lstat must not hang the read.
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
# Linux reports a symlink opened with O_NOFOLLOW as ELOOP (ENOTDIR with O_DIRECTORY if dangling),
# FreeBSD-derived kernels as EMLINK; all mean "not a directory we may enter".
_NOT_A_DIR_ERRNOS = frozenset({errno.ENOENT, errno.ENOTDIR, errno.ELOOP, errno.EMLINK})
_SYMLINK_ERRNOS = frozenset({errno.ELOOP, errno.EMLINK})
_NOT_EMPTY_ERRNOS = frozenset({errno.ENOTEMPTY, errno.EEXIST})
# Bound on retries when an entry keeps changing type under us (an adversary racing the walk).
_MAX_RACE_RETRIES = 8
_READ_CHUNK_BYTES = 1 << 20
# Code points HFS+ ignores in names, so ".g\u200cit" is ".git" on macOS (same list as git's utf8.c).
_HFS_IGNORABLE = dict.fromkeys(
    [*range(0x200C, 0x2010), *range(0x202A, 0x202F), *range(0x206A, 0x2070), 0xFEFF]
)


@dataclass(frozen=True, slots=True)
class FileRead:
    """What `SafeWriter.read` found at a path.

    Attributes:
        kind: "file" for a regular file, "symlink" for a symbolic link.
        data: the file's content, or the link's target as stored (never resolved).
        executable: the owner-execute bit of a file (git's notion); always False for a link.
    """

    kind: Literal["file", "symlink"]
    data: bytes
    executable: bool


class FaultHook(Protocol):
    """Seam for fault tests: called when a temporary entry is complete, just before its rename."""

    def before_rename(self, path: RepoPath, temp_name: str) -> None: ...


def _is_dotgit(name: str) -> bool:
    return name.translate(_HFS_IGNORABLE).casefold() == ".git"


def _components(path: RepoPath) -> list[str]:
    """Split a RepoPath, refusing anything that is not a plain root-relative path (callers check too)."""
    if not path or path.startswith("/") or "\x00" in path:
        raise PathOutsideWorkspaceError(f"Refusing path {path!r}: not a relative path inside the workspace.")
    parts: list[str] = path.split("/")
    for part in parts:
        if part in ("", ".", ".."):
            raise PathOutsideWorkspaceError(
                f"Refusing path {path!r}: empty, '.' or '..' components may leave the workspace."
            )
        if _is_dotgit(part):
            raise PathOutsideWorkspaceError(
                f"Refusing path {path!r}: restore never touches a .git directory."
            )
    return parts


@contextmanager
def _os_errors_as_restore_failed(path: RepoPath, action: str) -> Iterator[None]:
    try:
        yield
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise RestoreFailedError(
            f"Could not {action} {path!r}: {reason}. Fix the cause and restore again."
        ) from exc


def _lstat_or_none(name: str, dir_fd: int) -> os.stat_result | None:
    try:
        return os.lstat(name, dir_fd=dir_fd)
    except FileNotFoundError:
        return None


def _unlink_quietly(name: str, dir_fd: int) -> None:
    try:
        os.unlink(name, dir_fd=dir_fd)
    except OSError:
        log.debug("safe_fs.temp_unlink_failed", name=name)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _read_all(fd: int) -> bytes:
    chunks: list[bytes] = []
    while chunk := os.read(fd, _READ_CHUNK_BYTES):
        chunks.append(chunk)
    return b"".join(chunks)


def _kind_name(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "symlink"
    if stat.S_ISREG(mode):
        return "file"
    return "other"


class SafeWriter:
    """Writes, removes and reads paths under one workspace root, never following a symlink.

    Use as a context manager, or call `close()`; every method raises ValueError once closed.
    """

    def __init__(self, root: Path, *, fault_hook: FaultHook | None = None) -> None:
        """Open the workspace root.

        Args:
            root: the workspace root; a symlink to it is resolved once, here.
            fault_hook: test seam called before each rename; None in production.

        Raises:
            NoWorkspaceError: the root is missing or not a directory.
        """
        self._root_path = os.path.realpath(root)
        self._fault_hook = fault_hook
        try:
            self._root_fd: int | None = os.open(self._root_path, _DIR_FLAGS)
        except OSError as exc:
            raise NoWorkspaceError(
                f"Cannot open workspace root {self._root_path!r} for restore: {exc.strerror or exc}."
            ) from exc

    def close(self) -> None:
        """Close the root descriptor; calling it again does nothing."""
        if self._root_fd is not None:
            os.close(self._root_fd)
            self._root_fd = None

    def __enter__(self) -> SafeWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # ---- public operations -------------------------------------------------------------------

    def write_file(self, path: RepoPath, data: bytes, *, executable: bool) -> int:
        """Write a regular file atomically (temporary name, then a rename over the old one);
        returns its inode.

        A symlink or file standing where a parent directory belongs is replaced by a directory;
        a symlink or file at the final name is replaced, never written through.

        Args:
            path: where to write, relative to the root.
            data: the full content.
            executable: mode 0o755 if True, else 0o644, minus the process umask.

        Raises:
            PathOutsideWorkspaceError: the path is not a plain path inside the workspace, or names `.git`.
            RestoreFailedError: a non-empty directory is in the way, or the OS refused a step.
        """
        parts = _components(path)
        wanted_mode = 0o755 if executable else 0o644
        with _os_errors_as_restore_failed(path, "write"), self._parent_dirs(parts, path, create=True) as fds:
            assert fds is not None  # create=True never yields None
            temp_name, ino = self._create_temp_file(fds[-1], data, wanted_mode)
            self._move_into_place(fds[-1], temp_name, parts[-1], path)
        log.debug("safe_fs.wrote", path=path, kind="file", size=len(data), executable=executable)
        return ino

    def write_symlink(self, path: RepoPath, target: bytes) -> None:
        """Create a symbolic link atomically (temporary name, rename); the target is stored, not checked.

        Args:
            path: where to create the link, relative to the root.
            target: the link's target, as bytes; it may point anywhere, since it is never followed here.

        Raises:
            PathOutsideWorkspaceError: the path is not a plain path inside the workspace, or names `.git`.
            RestoreFailedError: the target is empty or holds NUL, a non-empty directory is in the way,
                or the OS refused a step.
        """
        parts = _components(path)
        if not target or b"\x00" in target:
            raise RestoreFailedError(f"Cannot restore symlink {path!r}: its target {target!r} is not valid.")
        with _os_errors_as_restore_failed(path, "write"), self._parent_dirs(parts, path, create=True) as fds:
            assert fds is not None
            temp_name = self._create_temp_symlink(fds[-1], target)
            self._move_into_place(fds[-1], temp_name, parts[-1], path)
        log.debug("safe_fs.wrote", path=path, kind="symlink")

    def remove(self, path: RepoPath) -> bool:
        """Remove the file or symlink at path, then prune parent directories left empty.

        A path under a symlinked or file parent is not inside the workspace, so nothing is removed.
        A directory at path is left alone (it may hold the user's files). Pruning stops at the
        first non-empty directory and never removes the root.

        Args:
            path: what to remove, relative to the root.

        Returns:
            True if an entry was removed, False if there was nothing (removable) there.

        Raises:
            PathOutsideWorkspaceError: the path is not a plain path inside the workspace, or names `.git`.
            RestoreFailedError: the OS refused the removal.
        """
        parts = _components(path)
        name = parts[-1]
        with (
            _os_errors_as_restore_failed(path, "remove"),
            self._parent_dirs(parts, path, create=False) as fds,
        ):
            if fds is None:
                return False
            st = _lstat_or_none(name, fds[-1])
            if st is None:
                return False
            if stat.S_ISDIR(st.st_mode):
                log.debug("safe_fs.remove_skipped", path=path, reason="directory")
                return False
            try:
                os.unlink(name, dir_fd=fds[-1])
            except FileNotFoundError:
                return False
            self._prune_empty_parents(fds, parts)
        log.debug("safe_fs.removed", path=path, kind=_kind_name(st.st_mode))
        return True

    def read(self, path: RepoPath) -> FileRead | None:
        """Read the file or symlink at path, for a snapshot of the current state.

        Args:
            path: what to read, relative to the root.

        Returns:
            The entry, or None when it is missing, is neither a file nor a symlink, or sits
            under a symlinked or file parent (so it is not really in the workspace).

        Raises:
            PathOutsideWorkspaceError: the path is not a plain path inside the workspace, or names `.git`.
            RestoreFailedError: the entry exists but could not be read.
        """
        parts = _components(path)
        with _os_errors_as_restore_failed(path, "read"), self._parent_dirs(parts, path, create=False) as fds:
            if fds is None:
                return None
            for _ in range(_MAX_RACE_RETRIES):
                found = self._read_entry(fds[-1], parts[-1])
                if found != "retry":
                    return found
        raise RestoreFailedError(f"Could not read {path!r}: it kept changing type while being read.")

    def cleanup_temp_files(self, paths: Iterable[RepoPath]) -> int:
        """Remove leftover temporary entries in the parent directories of paths (after a crash).

        Args:
            paths: the paths an interrupted restore was writing.

        Returns:
            How many temporary entries were removed.

        Raises:
            PathOutsideWorkspaceError: a path is not a plain path inside the workspace, or names `.git`.
            RestoreFailedError: the OS refused to list a directory or remove an entry.
        """
        removed = 0
        seen: set[tuple[str, ...]] = set()
        for path in paths:
            parts = _components(path)
            parent_key = tuple(parts[:-1])
            if parent_key in seen:
                continue
            seen.add(parent_key)
            with (
                _os_errors_as_restore_failed(path, "clean up temporary files next to"),
                self._parent_dirs(parts, path, create=False) as fds,
            ):
                if fds is not None:
                    removed += self._remove_temp_entries(fds[-1])
        if removed:
            log.debug("safe_fs.temp_files_removed", count=removed)
        return removed

    # ---- internals ---------------------------------------------------------------------------

    def _root(self) -> int:
        if self._root_fd is None:
            raise ValueError("SafeWriter is closed")
        return self._root_fd

    @contextmanager
    def _parent_dirs(self, parts: list[str], path: RepoPath, *, create: bool) -> Iterator[list[int] | None]:
        """Yield descriptors from the root down to the final parent, or None if a parent is not a real dir."""
        fds = [self._root()]
        try:
            for name in parts[:-1]:
                fd = self._open_child_dir(fds[-1], name, path, create=create)
                if fd is None:
                    yield None
                    return
                fds.append(fd)
            yield fds
        finally:
            for fd in fds[1:]:
                os.close(fd)

    def _open_child_dir(self, dir_fd: int, name: str, path: RepoPath, *, create: bool) -> int | None:
        for _ in range(_MAX_RACE_RETRIES):
            try:
                return os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
            except OSError as exc:
                if exc.errno not in _NOT_A_DIR_ERRNOS:
                    raise
            st = _lstat_or_none(name, dir_fd)
            if st is not None and stat.S_ISDIR(st.st_mode):
                continue  # became a directory between open and lstat: open it again
            if not create:
                return None
            if st is not None:
                # unlink removes the entry itself, never a symlink's target, and refuses a directory,
                # so a directory raced in here cannot be deleted by mistake.
                try:
                    os.unlink(name, dir_fd=dir_fd)
                except FileNotFoundError:
                    pass
                except OSError:
                    now = _lstat_or_none(name, dir_fd)
                    if now is not None and stat.S_ISDIR(now.st_mode):
                        continue
                    raise
                log.debug(
                    "safe_fs.replaced_in_the_way", path=path, component=name, was=_kind_name(st.st_mode)
                )
            try:
                os.mkdir(name, 0o755, dir_fd=dir_fd)
            except FileExistsError:
                continue
        raise RestoreFailedError(
            f"Could not restore {path!r}: the directory {name!r} kept changing while it was opened."
        )

    def _create_temp_file(self, dir_fd: int, data: bytes, wanted_mode: int) -> tuple[str, int]:
        for _ in range(_MAX_RACE_RETRIES):
            temp_name = TEMP_PREFIX + secrets.token_hex(8)
            try:
                fd = os.open(temp_name, _TEMP_FLAGS, wanted_mode, dir_fd=dir_fd)
            except FileExistsError:
                continue
            try:
                try:
                    _write_all(fd, data)
                    # The kernel applied the umask at creation. os.umask() cannot be read without
                    # setting it, which would race with other threads creating files, so narrow
                    # the created mode instead: never wider than wanted, never setuid/setgid/sticky.
                    created = os.fstat(fd)
                    created_mode = stat.S_IMODE(created.st_mode)
                    if created_mode & ~wanted_mode:  # the usual file needs no chmod (nor its watcher event)
                        os.fchmod(fd, created_mode & wanted_mode)
                    # No fsync, as git's checkout: see `_move_into_place`.
                finally:
                    os.close(fd)
            except BaseException:
                _unlink_quietly(temp_name, dir_fd)
                raise
            return temp_name, created.st_ino
        raise FileExistsError(errno.EEXIST, "no free temporary name")

    def _create_temp_symlink(self, dir_fd: int, target: bytes) -> str:
        for _ in range(_MAX_RACE_RETRIES):
            temp_name = TEMP_PREFIX + secrets.token_hex(8)
            try:
                os.symlink(target, temp_name, dir_fd=dir_fd)
            except FileExistsError:
                continue
            return temp_name
        raise FileExistsError(errno.EEXIST, "no free temporary name")

    def _move_into_place(self, dir_fd: int, temp_name: str, name: str, path: RepoPath) -> None:
        try:
            if self._fault_hook is not None:
                self._fault_hook.before_rename(path, temp_name)
            self._clear_empty_dir(dir_fd, name, path)
            # rename replaces whatever entry is at name (a symlink included) instead of following it.
            os.rename(temp_name, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except BaseException:
            _unlink_quietly(temp_name, dir_fd)
            raise
        # Nothing is synced, as git's checkout syncs no work-tree file. A kill at any point
        # leaves the old file or the new one, whole (the rename). A power cut is the file
        # system's: ext4 (auto_da_alloc) and btrfs write a file renamed over another before
        # the rename counts; a file new to its folder may come back empty. Either way what a
        # restore writes is the checkpoint's content, which the shadow repo holds. The
        # person's version it replaces is in the safety checkpoint, whose objects are not
        # synced either (atomic.py's rule for the shadow repo's small writes). Syncing the
        # file cost 0.3-1.7 ms of a ~3 ms restore, most when git had written just before (the
        # sync waits for the journal's commit of all written then).

    def _clear_empty_dir(self, dir_fd: int, name: str, path: RepoPath) -> None:
        st = _lstat_or_none(name, dir_fd)
        if st is None or not stat.S_ISDIR(st.st_mode):
            return
        # Folders left holding only empty folders (an agent deleted b/d/e, b/d/ stayed) go too,
        # as git removes them; anything else in them makes the directory "with content".
        self._remove_empty_subdirs(dir_fd, name)
        try:
            os.rmdir(name, dir_fd=dir_fd)
        except OSError as exc:
            if exc.errno in _NOT_EMPTY_ERRNOS:
                raise RestoreFailedError(
                    f"Cannot restore {path!r}: a directory with content is in the way. "
                    "Move or delete that directory, then restore again."
                ) from exc
            raise
        log.debug("safe_fs.replaced_in_the_way", path=path, component=name, was="empty_directory")

    def _remove_empty_subdirs(self, parent_fd: int, name: str, depth: int = 0) -> None:
        if depth > 64:
            return
        try:
            fd = os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
        except OSError:
            return
        try:
            with os.scandir(fd) as it:
                children = [e.name for e in it if e.is_dir(follow_symlinks=False)]
            for child in children:
                self._remove_empty_subdirs(fd, child, depth + 1)
                try:
                    os.rmdir(child, dir_fd=fd)
                except OSError:
                    pass  # not empty: it holds a file, so the whole directory stays
        finally:
            os.close(fd)

    def _prune_empty_parents(self, fds: list[int], parts: list[str]) -> None:
        # fds[i] is the directory parts[i - 1]; it is removed from its parent fds[i - 1].
        # rmdir only ever removes an empty directory, so this cannot delete content.
        for i in range(len(fds) - 1, 0, -1):
            try:
                os.rmdir(parts[i - 1], dir_fd=fds[i - 1])
            except OSError:
                return

    def _read_entry(self, dir_fd: int, name: str) -> FileRead | Literal["retry"] | None:
        st = _lstat_or_none(name, dir_fd)
        if st is None:
            return None
        if stat.S_ISLNK(st.st_mode):
            try:
                target = os.readlink(os.fsencode(name), dir_fd=dir_fd)
            except FileNotFoundError:
                return None
            except OSError as exc:
                if exc.errno == errno.EINVAL:  # no longer a symlink
                    return "retry"
                raise
            return FileRead(kind="symlink", data=target, executable=False)
        if not stat.S_ISREG(st.st_mode):
            return None
        try:
            fd = os.open(name, _READ_FLAGS, dir_fd=dir_fd)
        except FileNotFoundError:
            return None
        except OSError as exc:
            if exc.errno in _SYMLINK_ERRNOS:  # became a symlink after the lstat
                return "retry"
            raise
        try:
            opened = os.fstat(fd)
            if not stat.S_ISREG(opened.st_mode):
                return None
            data = _read_all(fd)
        finally:
            os.close(fd)
        return FileRead(kind="file", data=data, executable=bool(opened.st_mode & stat.S_IXUSR))

    def _remove_temp_entries(self, dir_fd: int) -> int:
        removed = 0
        for name in os.listdir(dir_fd):
            if not name.startswith(TEMP_PREFIX):
                continue
            st = _lstat_or_none(name, dir_fd)
            if st is None or stat.S_ISDIR(st.st_mode):
                continue
            try:
                os.unlink(name, dir_fd=dir_fd)
            except FileNotFoundError:
                continue
            removed += 1
        return removed


def make_root_again(root: Path) -> bool:
    """Make the workspace root again when it is gone, so that a task that removed its whole
    project (`rm -rf` of the folder itself) can still have its files restored; only the root,
    never its parents: a missing parent (an unmounted drive, a moved tree) is no place to write.

    Args:
        root: the workspace's canonical root (`Workspace.root`); a folder above it that became
            a link since is not followed to make it.

    Returns:
        True if the root was made, False if it was there (as a directory).

    Raises:
        NoWorkspaceError: the root is not a directory, or is gone and cannot be made.
    """
    path = os.path.realpath(root)
    made = False
    if not os.path.lexists(path):
        if path != os.fspath(root):
            # a folder above the root became a link since the root was opened: not followed to make it
            raise NoWorkspaceError(f"The workspace root {os.fspath(root)!r} is gone and the path to it now leads "
                                   f"to {path!r}: it is not made again there.")
        try:
            os.mkdir(path)  # 0o777 minus the umask, as mkdir(1) makes it
            made = True
        except FileExistsError:
            pass  # made meanwhile, or something else put there: the open says which
        except OSError as exc:
            raise NoWorkspaceError(
                f"The workspace root {path!r} is gone and cannot be made again for the restore: "
                f"{exc.strerror or exc}.") from exc
    try:
        os.close(os.open(path, _DIR_FLAGS))
    except OSError as exc:
        raise NoWorkspaceError(f"Cannot open workspace root {path!r} for restore: {exc.strerror or exc}.") from exc
    if not made:
        return False
    log.warning("restore.root_made_again", root=path)
    return True


def cleanup_temp_files(root: Path, paths: Iterable[RepoPath]) -> int:
    """Remove `.shadowpoint-tmp-*` leftovers next to the given paths, e.g. after a crashed restore.

    Args:
        root: the workspace root.
        paths: the paths the interrupted restore was writing; only their parent directories are cleaned.

    Returns:
        How many temporary entries were removed.

    Raises:
        NoWorkspaceError: the root is missing.
        PathOutsideWorkspaceError: a path is not a plain path inside the workspace, or names `.git`.
        RestoreFailedError: the OS refused to list a directory or remove an entry.
    """
    with SafeWriter(root) as writer:
        return writer.cleanup_temp_files(paths)
