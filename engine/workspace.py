"""Workspace roots: validation, canonical paths, the workspace hash, and `RepoPath` conversion.

`RepoPath` (a POSIX, root-relative `str`) is never a disk path; only this module converts
between the two. Used by every thread; holds no mutable state.
"""

from __future__ import annotations

import hashlib
import os
import posixpath
import stat
from collections.abc import Container, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NewType

from shadowpoint.errors import (
    InvalidParamsError,
    NoWorkspaceError,
    PathOutsideWorkspaceError,
    ProtectedDirectoryError,
)

RepoPath = NewType("RepoPath", str)

HASH_DIGITS = 13


def folders_above(path: RepoPath) -> Iterator[RepoPath]:
    """The folders `path` is under, from the top: "a", "a/b" for "a/b/c"."""
    parts = path.split("/")
    for depth in range(1, len(parts)):
        yield RepoPath("/".join(parts[:depth]))


def at_or_under(path: str, paths: Container[str]) -> bool:
    """Whether `path` or a folder above it is one of `paths` (root-relative, "/"-separated)."""
    return path in paths or any(folder in paths for folder in folders_above(RepoPath(path)))


def workspace_hash(real_root: Path) -> str:
    """13 decimal digits from the sha256 of the canonical path (the seed's 32-bit hash collides)."""
    digest = hashlib.sha256(os.fsencode(str(real_root))).digest()
    return str(int.from_bytes(digest[:16], "big") % 10**HASH_DIGITS).zfill(HASH_DIGITS)


def is_git_component(name: str) -> bool:
    """True for `.git` and its case variants, which no request path may name."""
    return name.lower() == ".git"


# Code points HFS+ ignores in names (git's utf8.c list), so ".g\u200cit" is ".git" on macOS.
_HFS_IGNORABLE = dict.fromkeys([*range(0x200C, 0x2010), *range(0x202A, 0x202F), *range(0x206A, 0x2070), 0xFEFF])


def is_git_lookalike(name: str) -> bool:
    """True for every name some file system may take for `.git` (git's protectHFS/protectNTFS
    rules): any case, HFS+-ignorable code points anywhere, NTFS trailing dots and spaces or an
    alternate data stream, and the 8.3 short name `git~1`. Request paths naming one are
    refused, as git refuses them in trees, whatever the OS we run on."""
    if name.isascii() and "git" not in name.lower():  # most names: every look-alike holds "git"
        return False
    folded = name.translate(_HFS_IGNORABLE).casefold()
    if folded.rstrip(". ") == ".git" or folded == "git~1":
        return True
    return folded.startswith(".git:")


@dataclass(frozen=True, slots=True)
class Workspace:
    """One workspace root and where its shadow repo lives."""

    root: Path
    name: str
    hash: str
    git_dir: Path

    def disk_path(self, path: RepoPath) -> Path:
        """The location of `path` on disk (not resolved: symlinks are not followed)."""
        return self.root / path if path else self.root


# Folders that are never a project themselves (SPEC §7); projects inside them are fine
# (`/srv/app`, `/opt/tool`, and `/tmp/x`, where every test lives).
SYSTEM_FOLDERS: frozenset[str] = frozenset({
    "/bin", "/boot", "/dev", "/etc", "/home", "/lib", "/lib32", "/lib64", "/libx32", "/media", "/mnt",
    "/opt", "/proc", "/root", "/run", "/sbin", "/srv", "/sys", "/tmp", "/usr", "/usr/bin", "/usr/lib",
    "/usr/local", "/usr/share", "/usr/src", "/var", "/var/lib", "/var/tmp", "/snap", "/nix", "/nix/store",
    # macOS
    "/Applications", "/Library", "/System", "/Users", "/Volumes", "/private", "/private/tmp",
    "/private/var", "/private/etc", "/cores",
})
# Pseudo file systems: nothing under them is a project either.
PSEUDO_FOLDERS: tuple[str, ...] = ("/proc", "/sys", "/dev")


def refusal(real: Path, protected: Mapping[str, Path], docs_dir: Path | None = None) -> str | None:
    """Why `real` (a canonical path) may not be a workspace, in SPEC §7's words; None if it may.

    Refused: the file-system root, a system folder (or anything under /proc, /sys, /dev), a
    protected folder (home, Desktop, Documents, Downloads), the docs root and any folder
    that contains it (its checkpoints would snapshot themselves) or lies inside it.
    """
    text = str(real)
    if real == Path(real.anchor):
        return "Cannot use checkpoints in the file-system root directory"
    if text in SYSTEM_FOLDERS or any(text.startswith(p + "/") for p in PSEUDO_FOLDERS):
        return f"Cannot use checkpoints in system {text} directory"
    for name, folder in protected.items():
        if os.path.realpath(folder) == text:
            return f"Cannot use checkpoints in {name} directory"
    if docs_dir is not None:
        docs = Path(os.path.realpath(docs_dir))
        if docs == real or docs in real.parents:
            return f"Cannot use checkpoints in the checkpoint store's {text} directory"
        if real in docs.parents:
            return (f"Cannot use checkpoints in {text} directory: it holds the checkpoint store {docs} "
                    "(choose a project folder inside it, or move the store with SHADOWPOINT_DOCS_DIR)")
    return None


def canonical_root(raw: str | os.PathLike[str], protected: Mapping[str, Path], docs_dir: Path | None = None) -> Path:
    """Validate a workspace root and return its canonical real path (nothing is scanned).

    Raises:
        NoWorkspaceError: empty, missing or not a directory.
        ProtectedDirectoryError: a folder `refusal` names.
    """
    if not str(raw).strip():
        raise NoWorkspaceError()
    real = Path(os.path.realpath(os.path.expanduser(str(raw))))
    if not real.is_dir():
        raise NoWorkspaceError(f"No workspace detected: {raw} is not a directory.")
    why = refusal(real, protected, docs_dir)
    if why is not None:
        raise ProtectedDirectoryError(why)
    return real


def open_workspaces(
    roots: Sequence[str | os.PathLike[str]], docs_dir: Path, protected: Mapping[str, Path]
) -> list[Workspace]:
    """Validate `roots` and name them (base names made unique), in order.

    Raises:
        NoWorkspaceError: no roots, or a root that is not a directory.
        ProtectedDirectoryError: a root is a protected folder, a system folder or holds the docs root.
    """
    if not roots:
        raise NoWorkspaceError()
    reals = [canonical_root(r, protected, docs_dir) for r in roots]
    if len(set(reals)) != len(reals):
        dup = next(r for r in reals if reals.count(r) > 1)
        raise InvalidParamsError(f"The workspace root {dup} is given twice.")
    names: list[str] = []
    for real in reals:
        base = real.name or "root"
        name, n = base, 2
        while name in names:
            name, n = f"{base}-{n}", n + 1
        names.append(name)
    out = []
    for real, name in zip(reals, names, strict=True):
        h = workspace_hash(real)
        out.append(Workspace(real, name, h, docs_dir / "checkpoints" / h / ".git"))
    return out


class PathResolver:
    """Turns request paths into (workspace, RepoPath) and result paths back (PROTOCOL.md)."""

    def __init__(self, workspaces: Sequence[Workspace], aliases: Mapping[str, Sequence[str]] | None = None):
        self.workspaces = list(workspaces)
        self._aliases = aliases or {}

    @property
    def multi(self) -> bool:
        return len(self.workspaces) > 1

    def by_name(self, name: str) -> Workspace:
        for ws in self.workspaces:
            if ws.name == name:
                return ws
        raise KeyError(name)

    def display(self, ws: Workspace, path: RepoPath) -> str:
        """A result path: root-relative, name-prefixed when there are several roots."""
        return f"{ws.name}/{path}" if self.multi else str(path)

    def resolve(self, raw: str, folders: dict[str, os.stat_result] | None = None, *,
                root_ok: bool = False) -> tuple[Workspace, RepoPath]:
        """Resolve one request path. `folders`, if given, gets the lstat this took of each
        folder above the path (by root-relative path), for the caller's next look at them
        (`ExclusionRules.in_nested_repo`). `root_ok`: a path naming a root itself (".", its
        absolute path, its name with several roots) resolves to "" (a restore's `paths`: a
        folder stands for the files under it); elsewhere it is refused.

        Raises:
            PathOutsideWorkspaceError: escapes every root, goes through `.git` or through a
                symlink that leads outside.
        """
        if not isinstance(raw, str) or not raw or "\0" in raw:
            raise PathOutsideWorkspaceError(f"Invalid path {raw!r}.")
        if os.path.isabs(raw):
            norm = posixpath.normpath(raw)
            for ws in self.workspaces:
                for base in (str(ws.root), *self._aliases.get(ws.name, ())):
                    base = base.rstrip("/")
                    if norm == base or norm.startswith(base + "/"):
                        return ws, self._checked(ws, norm[len(base) + 1 :], raw, folders, root_ok)
            # The host may name the root through a symlink (macOS /tmp, a linked home folder):
            # the shortest ancestor whose real path is a root stands for that root.
            found = self._through_root_alias(norm)
            if found is not None:
                return found[0], self._checked(found[0], found[1], raw, folders, root_ok)
            raise PathOutsideWorkspaceError(f"{raw} is outside the workspace.")
        norm = posixpath.normpath(raw.replace("\\", "/") if os.sep == "\\" else raw)
        if self.multi:
            name, _, rest = norm.partition("/")
            try:
                ws = self.by_name(name)
            except KeyError:
                raise PathOutsideWorkspaceError(
                    f"{raw}: with several workspace roots a relative path starts with a root's name "
                    f"({', '.join(w.name for w in self.workspaces)})."
                ) from None
            return ws, self._checked(ws, rest, raw, folders, root_ok)
        return self.workspaces[0], self._checked(self.workspaces[0], norm, raw, folders, root_ok)

    def _through_root_alias(self, norm: str) -> tuple[Workspace, str] | None:
        parts = norm.split("/")
        roots = {str(ws.root): ws for ws in self.workspaces}
        for i in range(2, len(parts) + 1):
            ws = roots.get(os.path.realpath("/".join(parts[:i])))
            if ws is not None:
                return ws, "/".join(parts[i:])
        return None

    def _checked(self, ws: Workspace, rel: str, raw: str, folders: dict[str, os.stat_result] | None = None,
                 root_ok: bool = False) -> RepoPath:
        rel = posixpath.normpath(rel) if rel else ""
        if root_ok and rel in ("", "."):
            return RepoPath("")
        if not rel or rel == "." or rel == ".." or rel.startswith("../") or rel.startswith("/"):
            raise PathOutsideWorkspaceError(f"{raw} is outside the workspace {ws.root}.")
        parts = rel.split("/")
        # look-alikes too (".GIT", ".git\u200c", "git~1"): the same folder on some file systems
        if any(is_git_lookalike(p) for p in parts):
            raise PathOutsideWorkspaceError(f"{raw} is inside a .git folder, which checkpoints never touch.")
        # A path through a symlinked folder that leads outside is refused (PROTOCOL.md).
        root = str(ws.root)
        current = root
        for i, part in enumerate(parts[:-1]):
            current = f"{current}/{part}"
            try:
                st = os.lstat(current)
            except OSError:
                break  # the rest does not exist yet
            mode = st.st_mode
            if folders is not None:
                folders["/".join(parts[:i + 1])] = st
            if stat.S_ISLNK(mode):
                target = os.path.realpath(current)
                if target != root and not target.startswith(root + os.sep):
                    raise PathOutsideWorkspaceError(f"{raw} goes through a symlink that leads outside.")
        return RepoPath(rel)
