"""`ExclusionRules`: the one place that decides what a snapshot scan includes (SPEC §4).

Built-in categories, `.gitignore` files (git's semantics), Git LFS, extra patterns, `.git`, nested
repositories. The scanner walks with it and filters watcher paths through it, on the engine thread
or the baseline future. It only reads: never writes, renames, or follows a symlink.
"""

from __future__ import annotations

import os
import re
import stat
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Final

import structlog

from shadowpoint.config.exclusion_data import BUILTIN_EXCLUSIONS
from shadowpoint.workspace import RepoPath

log = structlog.get_logger(__name__)

GIT_DIR: Final = ".git"
GITIGNORE: Final = ".gitignore"
GITATTRIBUTES: Final = ".gitattributes"
GITMODULES: Final = ".gitmodules"
RULE_FILES: Final = frozenset({GITIGNORE, GITATTRIBUTES, GITMODULES})
"""Files whose change calls for `ExclusionRules.invalidate` (and any `.git`, in any case)."""

_WORKSPACE_ROOT: Final = RepoPath("")
_NEGATED: Final = ""  # what `_PatternSet.decide` returns when a `!pattern` decides
_WILDCARDS: Final = frozenset("*?[\\")
_MAX_RULE_FILE_BYTES: Final = 16 * 1024 * 1024
_OPEN_FLAGS: Final = (
    os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)
)

# git's wildmatch classes are ASCII-only (sane_ctype), so are these.
_POSIX_CLASSES: Final[Mapping[str, str]] = {
    "alnum": "a-zA-Z0-9",
    "alpha": "a-zA-Z",
    "blank": " \\t",
    "cntrl": "\\x00-\\x1f\\x7f",
    "digit": "0-9",
    "graph": "\\x21-\\x7e",
    "lower": "a-z",
    "print": "\\x20-\\x7e",
    "punct": "!-/:-@\\[-`{-~",
    "space": " \\t\\n\\r\\f\\v",
    "upper": "A-Z",
    "xdigit": "0-9A-Fa-f",
}
_C_ESCAPES: Final[Mapping[str, str]] = dict(zip('abfnrtv\\"', '\a\b\f\n\r\t\v\\"', strict=True))


# ---------------------------------------------------------------- pattern syntax


class _Unmatchable(Exception):
    """A glob that git's wildmatch aborts on (unclosed `[`, unknown `[:class:]`): it matches nothing."""


@dataclass(frozen=True, slots=True)
class _Pattern:
    glob: str  # without the `!`, the trailing `/` and a leading `/`
    negated: bool
    dir_only: bool
    anchored: bool  # matched against the path below the rule file's folder, else the basename


def _trim_trailing_spaces(line: str) -> str:
    """git's trim_trailing_spaces: drop trailing spaces unless backslash-escaped."""
    end = 0
    i = 0
    n = len(line)
    while i < n:
        c = line[i]
        if c == "\\":
            i += 2
            end = min(i, n)
        else:
            i += 1
            if c != " ":
                end = i
    return line[:end]


def _parse_glob(text: str, *, allow_negation: bool) -> _Pattern | None:
    """git's parse_path_pattern; None for patterns that can match nothing."""
    negated = text.startswith("!")
    if negated:
        if not allow_negation:
            return None  # gitattributes forbids negative patterns; git ignores the line
        text = text[1:]
    dir_only = text.endswith("/")
    if dir_only:
        text = text[:-1]
    anchored = "/" in text
    if text.startswith("/"):
        text = text[1:]
    if not text:
        return None
    return _Pattern(text, negated, dir_only, anchored)


def _parse_ignore_line(line: str) -> _Pattern | None:
    """One line of a `.gitignore` (or of the built-in and extra lists)."""
    if not line or line[0] == "#":
        return None
    return _parse_glob(_trim_trailing_spaces(line), allow_negation=True)


def _bracket_regex(glob: str, i: int) -> tuple[str, int]:
    """Translate the bracket expression opening at `glob[i]`; returns (regex, index after it)."""
    n = len(glob)
    j = i + 1
    negated = j < n and glob[j] in "!^"
    if negated:
        j += 1
    parts: list[str] = []
    prev: str | None = None  # a single character that may start a range
    first = True
    while True:
        if j >= n:
            raise _Unmatchable
        c = glob[j]
        if c == "]" and not first:
            j += 1
            break
        first = False
        if c == "\\":
            j += 1
            if j >= n:
                raise _Unmatchable
            prev = glob[j]
            parts.append(re.escape(prev))
            j += 1
        elif c == "-" and prev is not None and j + 1 < n and glob[j + 1] != "]":
            j += 1
            high = glob[j]
            if high == "\\":
                j += 1
                if j >= n:
                    raise _Unmatchable
                high = glob[j]
            parts.pop()
            if prev <= high:  # git: a reversed range matches nothing
                parts.append(f"{re.escape(prev)}-{re.escape(high)}")
            prev = None
            j += 1
        elif c == "[" and j + 1 < n and glob[j + 1] == ":":
            close = glob.find("]", j + 2)
            if close < 0:
                raise _Unmatchable
            if close - (j + 2) >= 1 and glob[close - 1] == ":":
                name = glob[j + 2 : close - 1]
                if name not in _POSIX_CLASSES:
                    raise _Unmatchable
                parts.append(_POSIX_CLASSES[name])
                prev = None
                j = close + 1
            else:  # not a `[:class:]`: the `[` is an ordinary member
                prev = "["
                parts.append(re.escape("["))
                j += 1
        else:
            prev = c
            parts.append(re.escape(c))
            j += 1
    body = "".join(parts)
    if negated:
        return f"[^/{body}]", j
    if not body:
        return "(?!)", j
    return f"(?!/)[{body}]", j


def _glob_regex(glob: str, *, pathname: bool) -> str:
    """git's wildmatch (WM_PATHNAME for anchored patterns) as a regex for `fullmatch`."""
    out: list[str] = []
    n = len(glob)
    # git compares the literal prefix first and wildmatches the rest, so a `**` that starts
    # the rest counts as "at the start of the pattern".
    first_wild = next((k for k, ch in enumerate(glob) if ch in _WILDCARDS), n)
    i = 0
    while i < n:
        c = glob[i]
        if c == "*":
            j = i
            while j < n and glob[j] == "*":
                j += 1
            special = (
                pathname
                and j - i >= 2
                and (i == first_wild or glob[i - 1] == "/")
                and (j == n or glob[j] == "/" or glob[j : j + 2] == "\\/")
            )
            if not special:
                out.append("[^/]*")
            elif j == n:
                out.append(".*")
            else:  # `**/`: zero or more folders
                out.append("(?:.*/)?")
                j += 2 if glob[j] == "\\" else 1
            i = j
        elif c == "?":
            out.append("[^/]")
            i += 1
        elif c == "[":
            part, i = _bracket_regex(glob, i)
            out.append(part)
        elif c == "\\":
            if i + 1 >= n:
                raise _Unmatchable
            out.append(re.escape(glob[i + 1]))
            i += 2
        else:
            out.append(re.escape(c))
            i += 1
    return "".join(out)


# ---------------------------------------------------------------- compiled pattern lists


class _Bucket:
    """Patterns of one polarity run, indexed for set lookups; only odd ones become regexes."""

    __slots__ = (
        "active", "endings", "fold_types", "name_rx", "names", "needles", "path_rx", "paths", "prefixes", "suffixes",
    )  # fmt: skip

    def __init__(self) -> None:
        self.names: dict[str, str] = {}  # literal basename
        self.paths: dict[str, str] = {}  # literal path below the rule file's folder
        self.suffixes: dict[str, str] = {}  # `*.ext` -> ".ext"
        self.endings: list[tuple[str, str]] = []  # `*literal`
        self.needles: list[tuple[str, str]] = []  # `*literal*`
        self.prefixes: list[tuple[str, str]] = []  # `literal*`
        self.name_rx: list[tuple[re.Pattern[str], str]] = []
        self.path_rx: list[tuple[re.Pattern[str], str]] = []
        self.fold_types = False  # suffixes, endings and needles are lower case; compare folded names
        self.active = False

    def add(self, pattern: _Pattern, label: str, *, casefold: bool) -> None:
        glob = pattern.glob
        self.active = True
        if not _WILDCARDS.intersection(glob):
            (self.paths if pattern.anchored else self.names).setdefault(glob, label)
            return
        # Only type patterns (`*.png`) ignore case: a `pods/` folder is not CocoaPods' `Pods/`.
        fold = casefold and glob[0] == "*"
        if fold:
            glob = glob.lower()
            self.fold_types = True
        if not pattern.anchored and glob[0] == "*":
            rest = glob[1:]
            if rest and not _WILDCARDS.intersection(rest):
                if rest[0] == ".":
                    self.suffixes.setdefault(rest, label)
                else:
                    self.endings.append((rest, label))
                return
            inner = glob[1:-1]
            if glob[-1] == "*" and inner and not _WILDCARDS.intersection(inner):
                self.needles.append((inner, label))
                return
        if not pattern.anchored and glob[-1] == "*" and not _WILDCARDS.intersection(glob[:-1]):
            self.prefixes.append((glob[:-1], label))
            return
        try:
            source = _glob_regex(pattern.glob, pathname=pattern.anchored)
        except _Unmatchable:
            return
        regex = re.compile(source, re.DOTALL | (re.IGNORECASE if fold else 0))
        (self.path_rx if pattern.anchored else self.name_rx).append((regex, label))

    def finish(self) -> None:
        """Merge regexes that share a label: one regex call per path, not one per pattern."""
        self.name_rx = _merge_regexes(self.name_rx)
        self.path_rx = _merge_regexes(self.path_rx)

    def match(self, rel: str, name: str) -> str | None:
        names = self.names
        if names:
            label = names.get(name)
            if label is not None:
                return label
        typed = name.lower() if self.fold_types else name
        suffixes = self.suffixes
        if suffixes:
            i = typed.find(".")
            while i >= 0:
                label = suffixes.get(typed[i:])
                if label is not None:
                    return label
                i = typed.find(".", i + 1)
        for ending, label in self.endings:
            if typed.endswith(ending):
                return label
        for needle, label in self.needles:
            if needle in typed:
                return label
        for start, label in self.prefixes:
            if name.startswith(start):
                return label
        paths = self.paths
        if paths:
            label = paths.get(rel)
            if label is not None:
                return label
        for regex, label in self.name_rx:
            if regex.fullmatch(name) is not None:
                return label
        for regex, label in self.path_rx:
            if regex.fullmatch(rel) is not None:
                return label
        return None


def _merge_regexes(regexes: list[tuple[re.Pattern[str], str]]) -> list[tuple[re.Pattern[str], str]]:
    groups: dict[tuple[str, int], list[re.Pattern[str]]] = {}
    for regex, label in regexes:
        groups.setdefault((label, regex.flags), []).append(regex)
    merged: list[tuple[re.Pattern[str], str]] = []
    for (label, flags), group in groups.items():
        if len(group) == 1:
            merged.append((group[0], label))
        else:  # the fragments hold no capturing groups, so any alternative may match
            merged.append((re.compile("|".join(f"(?:{r.pattern})" for r in group), flags), label))
    return merged


class _Run:
    """Consecutive patterns of the same polarity: any match in it decides the same way."""

    __slots__ = ("any", "dirs", "include")

    def __init__(self, include: bool) -> None:
        self.include = include
        self.any = _Bucket()
        self.dirs = _Bucket()  # `pattern/`: folders only


class _PatternSet:
    """An ordered gitignore-style pattern list, last match wins (one rule file, or a list)."""

    __slots__ = ("_runs",)

    def __init__(self, patterns: Iterable[tuple[_Pattern, str]], *, casefold: bool = False) -> None:
        runs: list[_Run] = []
        for pattern, label in patterns:
            include = not pattern.negated
            if not runs or runs[-1].include != include:
                runs.append(_Run(include))
            run = runs[-1]
            (run.dirs if pattern.dir_only else run.any).add(pattern, label, casefold=casefold)
        runs.reverse()
        for run in runs:
            run.any.finish()
            run.dirs.finish()
        self._runs = tuple(runs)

    @property
    def is_empty(self) -> bool:
        return not self._runs

    def decide(self, rel: str, name: str, is_dir: bool) -> str | None:
        """Label of the deciding pattern, `_NEGATED` if a `!pattern` decides, None if none matches."""
        for run in self._runs:
            label = run.any.match(rel, name) if run.any.active else None
            if label is None and is_dir and run.dirs.active:
                label = run.dirs.match(rel, name)
            if label is not None:
                return label if run.include else _NEGATED
        return None


# ---------------------------------------------------------------- rule files


def _read_rule_file(path: str) -> str | None:
    """Text of a regular file (never through a symlink, never blocking on a fifo), else None."""
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(_MAX_RULE_FILE_BYTES)
    except OSError as exc:
        log.debug("exclusions.rule_file_unreadable", path=path, error=str(exc))
        return None
    finally:
        os.close(fd)
    text = data.decode("utf-8", "surrogateescape")
    return text[1:] if text.startswith("\ufeff") else text


def _lines(text: str) -> Iterator[str]:
    for line in text.split("\n"):
        yield line[:-1] if line.endswith("\r") else line


def _unquote_c(text: str) -> tuple[str, str] | None:
    """Split `"c-quoted pattern" rest` (git's unquote_c_style); None if malformed."""
    buf = bytearray()
    i = 1
    n = len(text)
    while i < n:
        c = text[i]
        if c == '"':
            return buf.decode("utf-8", "surrogateescape"), text[i + 1 :]
        if c != "\\":
            buf += c.encode("utf-8", "surrogateescape")
            i += 1
            continue
        i += 1
        if i >= n:
            return None
        e = text[i]
        if e in _C_ESCAPES:
            buf.append(ord(_C_ESCAPES[e]))
            i += 1
        elif e in "0123" and len(text[i : i + 3]) == 3 and all(d in "01234567" for d in text[i : i + 3]):
            buf.append(int(text[i : i + 3], 8))
            i += 3
        else:
            return None
    return None


def _filter_is_lfs(tokens: Sequence[str], macros: Mapping[str, Sequence[str]], depth: int = 0) -> bool | None:
    """What the attribute tokens of one line say about `filter`: lfs, something else, or nothing."""
    state: bool | None = None
    for token in tokens:
        if token.startswith("filter="):
            state = token == "filter=lfs"
        elif token in ("filter", "-filter", "!filter"):
            state = False
        elif token in macros and depth < 8:
            expanded = _filter_is_lfs(macros[token], macros, depth + 1)
            if expanded is not None:
                state = expanded
    return state


def _lfs_patterns(text: str) -> list[tuple[_Pattern, str]]:
    """Patterns whose `filter` attribute the root `.gitattributes` sets to `lfs` (or resets)."""
    macros: dict[str, list[str]] = {}
    out: list[tuple[_Pattern, str]] = []
    for raw in _lines(text):
        line = raw.lstrip(" \t\r\n")
        if not line or line[0] == "#":
            continue
        quoted = _unquote_c(line) if line[0] == '"' else None
        if quoted is not None:
            pattern_text, rest = quoted
        else:
            fields = line.split(None, 1)
            pattern_text, rest = fields[0], (fields[1] if len(fields) > 1 else "")
        tokens = rest.split()
        if pattern_text.startswith("[attr]"):
            macros[pattern_text[len("[attr]") :]] = tokens
            continue
        lfs = _filter_is_lfs(tokens, macros)
        if lfs is None:
            continue
        pattern = _parse_glob(pattern_text, allow_negation=False)
        if pattern is None or pattern.dir_only:  # attributes never apply to folders' contents
            continue
        out.append((replace(pattern, negated=not lfs), "lfs"))
    return out


def _config_value(raw: str) -> str:
    """A git-config value: quotes removed, escapes resolved, trailing comment dropped."""
    out: list[str] = []
    quoted = False
    i = 0
    n = len(raw)
    while i < n:
        c = raw[i]
        if c == '"':
            quoted = not quoted
        elif c == "\\" and i + 1 < n:
            i += 1
            out.append({"n": "\n", "t": "\t", "b": "\b"}.get(raw[i], raw[i]))
        elif c in "#;" and not quoted:
            break
        else:
            out.append(c)
        i += 1
    return "".join(out).strip()


def _submodule_paths(text: str) -> frozenset[str]:
    """`path = …` values of the `[submodule "…"]` sections of a `.gitmodules` file."""
    paths: set[str] = set()
    in_submodule = False
    for raw in _lines(text):
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line[0] == "[":
            in_submodule = line[1:].lstrip().lower().startswith("submodule")
            continue
        key, eq, value = line.partition("=")
        if not in_submodule or not eq or key.strip().lower() != "path":
            continue
        value = _config_value(value)
        parts = [p for p in value.replace("\\", "/").split("/") if p and p != "."]
        if parts and ".." not in parts and not value.startswith("/"):
            paths.add("/".join(parts))
    return frozenset(paths)


# ---------------------------------------------------------------- the rules


@dataclass(frozen=True, slots=True)
class _DirInfo:
    """What is known about one folder: why it is excluded, or the rule files for its entries."""

    reason: str | None  # set when the folder itself, or an ancestor, is excluded
    chain: tuple[tuple[_PatternSet, str], ...] = ()  # (.gitignore, path prefix), deepest first
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
        builtin_set = _PatternSet(
            (
                (pattern, f"builtin:{category}")
                for category, lines in categories.items()
                for line in lines
                if (pattern := _parse_ignore_line(line)) is not None
            ),
            casefold=True,
        )
        extra_set = _PatternSet(
            (pattern, "extra") for line in extra if (pattern := _parse_ignore_line(line)) is not None
        )
        self._builtin = None if builtin_set.is_empty else builtin_set
        self._extra = None if extra_set.is_empty else extra_set
        self._lfs: _PatternSet | None = None
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
        attributes = _read_rule_file(os.path.join(self._root, GITATTRIBUTES))
        lfs = _PatternSet(_lfs_patterns(attributes)) if attributes is not None else None
        self._lfs = None if lfs is None or lfs.is_empty else lfs
        modules = _read_rule_file(os.path.join(self._root, GITMODULES))
        self._submodules = _submodule_paths(modules) if modules is not None else frozenset()
        own = self._load_gitignore("")
        info = _DirInfo(None, ((own, ""),) if own is not None else ())
        with self._dirs_lock:
            self._dirs[""] = info
        return info

    def _load_gitignore(self, rel: str) -> _PatternSet | None:
        file_rel = f"{rel}/{GITIGNORE}" if rel else GITIGNORE
        text = _read_rule_file(os.path.join(self._root, file_rel))
        if text is None:
            return None
        label = f"gitignore:{file_rel}"
        rules = _PatternSet(
            (pattern, label) for line in _lines(text) if (pattern := _parse_ignore_line(line)) is not None
        )
        return None if rules.is_empty else rules

    @staticmethod
    def _child_chain(parent: _DirInfo, name: str, own: _PatternSet | None) -> tuple[tuple[_PatternSet, str], ...]:
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
