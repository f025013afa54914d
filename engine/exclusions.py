"""`ExclusionRules`: the one place that decides what a snapshot scan includes (SPEC §4).

Built-in categories, `.gitignore` files (git's semantics), Git LFS, extra patterns, `.git`, nested
repositories. The scanner walks with it and filters watcher paths through it, on the engine thread
or the baseline future. It only reads: never writes, renames, or follows a symlink.
"""

from __future__ import annotations

import os
import stat
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import structlog

from shadowpoint.config.exclusion_data import BUILTIN_EXCLUSIONS
from shadowpoint.patterns import (
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
# ---------------------------------------------------------------- the rules


@dataclass(frozen=True, slots=True)
class _DirInfo:
    """What is known about one folder: why it is excluded, or the rule files for its entries."""

    reason: str | None  # set when the folder itself, or an ancestor, is excluded
    chain: tuple[tuple[PatternSet, str], ...] = ()  # (.gitignore, path prefix), deepest first
    is_link: bool = False  # a symlink: nothing lies "under" it


class ExclusionRules:
    """Decides which workspace paths a scan includes (SPEC §4 "Exclusions").

    A path is excluded when any rule says so (the rules are a union): a `.git` component
    (any letter case), a nested repository or submodule, a built-in category, an extra
    pattern, the `.gitignore` files (git's semantics, nested files included), or a Git LFS
    pattern of the root `.gitattributes`. Folder decisions are cached per folder; call
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
        self._extra = None if extra_set.is_empty else extra_set
        self._lfs: PatternSet | None = None
        self._submodules: frozenset[str] = frozenset()
        self._dirs: dict[str, _DirInfo] = {}
        self._dirs_lock = threading.Lock()  # guards iteration and writes of _dirs, never I/O

    # ------------------------------------------------------------ public API

    def walk(self, start: RepoPath = _WORKSPACE_ROOT) -> Iterator[tuple[RepoPath, os.DirEntry[str]]]:
        """Yield every included non-folder entry under `start`, pruning excluded folders.

        Regular files, symlinks (a symlink to a folder is a leaf, never followed), fifos and
        the like are yielded; excluded folders and nested repositories are never entered.
        Walking from the root re-reads every rule file; a walk from a sub-folder uses the
        cached decisions for its ancestors. Nothing is yielded if `start` is excluded or
        is not a folder.

        Args:
            start: The folder to walk, "" for the whole workspace.

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
        entry_reason = self._entry_reason
        while pending:
            rel, name, parent_info = pending.pop()
            folder = os.path.join(self._root, rel) if rel else self._root
            try:
                with os.scandir(folder) as it:
                    entries = list(it)
            except OSError as exc:
                log.debug("exclusions.folder_skipped", path=rel, error=str(exc))
                continue
            if rel:
                info = self._listed_dir_info(rel, name, parent_info, folder, entries)
                with self._dirs_lock:
                    self._dirs[rel] = info
                if info.reason is not None:
                    continue
            else:
                info = parent_info
            prefix = f"{rel}/" if rel else ""
            for entry in entries:
                entry_name = entry.name
                child = prefix + entry_name
                try:
                    is_dir = entry.is_dir(follow_symlinks=False)
                except OSError:
                    is_dir = False
                if entry_reason(info, child, entry_name, is_dir) is not None:
                    continue
                if is_dir:
                    pending.append((child, entry_name, info))
                else:
                    yield RepoPath(child), entry

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
        parent, _, name = path.rpartition("/")
        parent_info = self._dir_info(parent)
        if parent_info.reason is not None:
            return parent_info.reason
        if parent_info.is_link:
            return "beyond_symlink"
        reason = self._entry_reason(parent_info, path, name, is_dir)
        if reason is not None or not is_dir:
            return reason
        return self._dir_info(path).reason

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
        return os.path.lexists(os.path.join(folder, GIT_DIR))

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
                return
            prefix = f"{target}/"
            for key in [k for k in self._dirs if k == target or k.startswith(prefix)]:
                del self._dirs[key]

    # ------------------------------------------------------------ internals

    def _entry_reason(self, info: _DirInfo, rel: str, name: str, is_dir: bool) -> str | None:
        """Rules for one entry of a folder that is not excluded itself (the hot path)."""
        if len(name) == 4 and name.lower() == GIT_DIR:
            return "git_dir"
        if self._submodules and rel in self._submodules:
            return "submodule"
        builtin = self._builtin
        if builtin is not None:
            label = builtin.decide(rel, name, is_dir)
            if label:
                return label
        extra = self._extra
        if extra is not None:
            label = extra.decide(rel, name, is_dir)
            if label:
                return label
        for rules, prefix in info.chain:
            label = rules.decide(prefix + name, name, is_dir)
            if label is not None:
                if label:
                    return label
                break
        lfs = self._lfs
        if lfs is not None and not is_dir and lfs.decide(rel, name, False):
            return "lfs"
        return None

    def _load_root(self) -> _DirInfo:
        attributes = read_rule_file(os.path.join(self._root, GITATTRIBUTES))
        lfs = PatternSet(lfs_patterns(attributes)) if attributes is not None else None
        self._lfs = None if lfs is None or lfs.is_empty else lfs
        modules = read_rule_file(os.path.join(self._root, GITMODULES))
        self._submodules = submodule_paths(modules) if modules is not None else frozenset()
        own = self._load_gitignore("")
        info = _DirInfo(None, ((own, ""),) if own is not None else ())
        with self._dirs_lock:
            self._dirs[""] = info
        return info

    def _load_gitignore(self, rel: str) -> PatternSet | None:
        file_rel = f"{rel}/{GITIGNORE}" if rel else GITIGNORE
        text = read_rule_file(os.path.join(self._root, file_rel))
        if text is None:
            return None
        label = f"gitignore:{file_rel}"
        rules = PatternSet(
            (pattern, label) for line in rule_lines(text) if (pattern := parse_ignore_line(line)) is not None
        )
        return None if rules.is_empty else rules

    @staticmethod
    def _child_chain(parent: _DirInfo, name: str, own: PatternSet | None) -> tuple[tuple[PatternSet, str], ...]:
        chain = tuple((rules, f"{prefix}{name}/") for rules, prefix in parent.chain)
        return ((own, ""), *chain) if own is not None else chain

    def _listed_dir_info(
        self, rel: str, name: str, parent: _DirInfo, folder: str, entries: Sequence[os.DirEntry[str]]
    ) -> _DirInfo:
        """Info for a folder whose entries were just listed (the walk's way)."""
        gitignore: os.DirEntry[str] | None = None
        for entry in entries:
            entry_name = entry.name
            if entry_name == GITIGNORE:
                gitignore = entry
            elif len(entry_name) == 4 and entry_name.lower() == GIT_DIR:
                # `.GIT` makes a repository only where the file system ignores case.
                if entry_name == GIT_DIR or os.path.lexists(os.path.join(folder, GIT_DIR)):
                    return _DirInfo("nested_repo")
        own = None
        if gitignore is not None and gitignore.is_file(follow_symlinks=False):
            own = self._load_gitignore(rel)
        return _DirInfo(None, self._child_chain(parent, name, own))

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
        folder = os.path.join(self._root, rel)
        try:
            mode = os.lstat(folder).st_mode
        except OSError:
            mode = 0  # gone (a deleted folder reported by the watcher): only its ancestors count
        if stat.S_ISLNK(mode):
            return _DirInfo(None, is_link=True)
        own = None
        if stat.S_ISDIR(mode):
            if os.path.lexists(os.path.join(folder, GIT_DIR)):
                return _DirInfo("nested_repo")
            own = self._load_gitignore(rel)
        return _DirInfo(None, self._child_chain(parent, name, own))

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
