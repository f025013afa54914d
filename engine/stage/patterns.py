"""Gitignore-style patterns as git's wildmatch reads them, compiled for set lookups, and the
parsers of the rule files that feed `ExclusionRules` (`.gitignore`, LFS entries of
`.gitattributes`, `.gitmodules` paths).

Pure functions and immutable compiled sets: no state, safe on any thread.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Final, cast

import structlog

log = structlog.get_logger(__name__)

NEGATED: Final = ""  # what `PatternSet.decide` returns when a `!pattern` decides
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
class Pattern:
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


def _parse_glob(text: str, *, allow_negation: bool) -> Pattern | None:
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
    return Pattern(text, negated, dir_only, anchored)


def parse_ignore_line(line: str) -> Pattern | None:
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
        "active", "endings", "fold_types", "name_rx", "names", "needles", "path_rx", "paths", "prefixes",
        "screen_folders", "screen_rx", "suffixes", "unscreened",
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
        # for `_Screen`: the folders (below the rule file's) whose entries a literal path
        # pattern names; a regex for the names a wildcard pattern may match (the last part of
        # an anchored one), case-folded or not; whether some pattern may match any name
        self.screen_folders: set[str] = set()
        self.screen_rx: list[tuple[str, bool]] = []
        self.unscreened = False

    def add(self, pattern: Pattern, label: str, *, casefold: bool) -> None:
        glob = pattern.glob
        self.active = True
        if not _WILDCARDS.intersection(glob):
            (self.paths if pattern.anchored else self.names).setdefault(glob, label)
            if pattern.anchored:
                self.screen_folders.add(glob.rpartition("/")[0])
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
        self._screen_wildcard(pattern, source, fold)

    def _screen_wildcard(self, pattern: Pattern, source: str, fold: bool) -> None:
        """What `_Screen` looks for in the names of a folder for a pattern that became a regex:
        the regex itself for a name pattern; for an anchored one, its last part's (the entry's
        name must match it: `*` stays within a part), unless that part may be any name."""
        if pattern.anchored:
            last = pattern.glob.rpartition("/")[2]
            if "\\/" in pattern.glob or not last.strip("*"):
                self.unscreened = True
                return
            try:
                source = _glob_regex(last, pathname=False)
            except _Unmatchable:
                return  # matches nothing
        # a name's regex knows "/" as the one character no name holds; the screen's names are
        # joined by NUL
        self.screen_rx.append((source.replace("[^/", "[^\\x00").replace("(?!/)", "(?!\\x00)"), fold))

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


_WHOLE, _OPEN = object(), object()  # `_trie_source`'s ends of a word: the name's, or anything may follow
_NAME_END = r"(?=\x00|\Z)"


def _trie_source(words: Iterable[tuple[str, bool]]) -> str | None:
    """A regex source matching any of `words` where it starts: each (text, whole), whole text
    ending a name (followed by a NUL or the end), else followed by anything. Written as a
    trie, so a search tries each character once, not each word (the built-in list holds
    ~130 endings); None when there are no words."""
    root: dict[object, dict[object, object]] = {}
    for text, whole in words:
        node = root
        for ch in text:
            node = cast(dict[object, dict[object, object]], node.setdefault(ch, {}))
        node[_WHOLE if whole else _OPEN] = {}
    if not root:
        return None

    def source(node: dict[object, Any]) -> str:
        if _OPEN in node:
            return ""
        alternatives = [re.escape(ch) + source(child) for ch, child in sorted(
            (key, child) for key, child in node.items() if isinstance(key, str))]
        if _WHOLE in node:
            alternatives.append(_NAME_END)
        return alternatives[0] if len(alternatives) == 1 else f"(?:{'|'.join(alternatives)})"

    return source(root)


class _Screen:
    """Which entries of a folder a pattern set may match, from the folder's names joined by
    NUL (ASCII only: `str.lower` then folds each name as the patterns do): a few regex
    searches in C instead of a decision per entry. Most entries match no pattern, and a walk
    of 100k files spent ~0.3 s of its ~0.9 s deciding each one. Never leaves out a name a
    pattern matches; a name it gives is only one to decide."""

    __slots__ = ("fold", "folders", "plain", "typed", "unscreened")

    def __init__(self, bucket: _Bucket) -> None:
        self.unscreened = bucket.unscreened
        self.folders = frozenset(bucket.screen_folders)
        self.fold = bucket.fold_types
        names = _trie_source([*((n, True) for n in bucket.names), *((p, False) for p, _ in bucket.prefixes)])
        plain = [names] if names is not None else []
        plain += [f"(?:{rx}){_NAME_END}" for rx, folded in bucket.screen_rx if not folded]
        plain += [f"(?i:{rx}){_NAME_END}" for rx, folded in bucket.screen_rx if folded]
        # searched in the names after a NUL: a literal first character, which the search finds in C
        self.plain = re.compile(f"\x00(?:{'|'.join(plain)})") if plain else None
        typed = _trie_source([*((s, True) for s in bucket.suffixes), *((e, True) for e, _ in bucket.endings),
                              *((n, False) for n, _ in bucket.needles)])
        self.typed = re.compile(typed) if typed is not None else None

    def candidates(self, names: str, lowered: str, folder: str) -> list[int] | None:
        """Where the names that a pattern may match start in `names` (a folder's, joined by
        NUL, ASCII; `lowered`: the same in lower case; `folder`: its path below the rule
        file's folder, "" for that folder): a match's first offset, or the NUL before the
        name; None: any name may match."""
        if self.unscreened or folder in self.folders:
            return None
        # in `NUL + names`, a match starts at the NUL before its name: at the name in `names`
        found = [m.start() for m in self.plain.finditer(f"\x00{names}")] if self.plain is not None else []
        if self.typed is not None:
            found += [m.start() for m in self.typed.finditer(lowered if self.fold else names)]
        return found


class _Run:
    """Consecutive patterns of the same polarity: any match in it decides the same way."""

    __slots__ = ("any", "dirs", "include")

    def __init__(self, include: bool) -> None:
        self.include = include
        self.any = _Bucket()
        self.dirs = _Bucket()  # `pattern/`: folders only


_MATCHES = "matches"  # the filters' one label: their regexes merge into one


class PatternSet:
    """An ordered gitignore-style pattern list, last match wins (one rule file, or a list)."""

    __slots__ = ("_any_filter", "_dir_filter", "_runs", "_screen")

    def __init__(self, patterns: Iterable[tuple[Pattern, str]], *, casefold: bool = False) -> None:
        runs: list[_Run] = []
        # Every pattern once more, whatever its polarity, in one bucket for files and one for
        # folders: most entries match no pattern at all, which one lookup tells instead of one
        # per run (the built-in list has three runs; a scan decides every file).
        self._any_filter, self._dir_filter = _Bucket(), _Bucket()
        for pattern, label in patterns:
            include = not pattern.negated
            if not runs or runs[-1].include != include:
                runs.append(_Run(include))
            run = runs[-1]
            (run.dirs if pattern.dir_only else run.any).add(pattern, label, casefold=casefold)
            if not pattern.dir_only:
                self._any_filter.add(pattern, _MATCHES, casefold=casefold)
            self._dir_filter.add(pattern, _MATCHES, casefold=casefold)
        runs.reverse()
        for run in runs:
            run.any.finish()
            run.dirs.finish()
        self._any_filter.finish()
        self._dir_filter.finish()
        self._runs = tuple(runs)
        self._screen = _Screen(self._dir_filter)  # every pattern, folders' and files' alike

    def candidates(self, names: str, lowered: str, folder: str) -> list[int] | None:
        """Where the entries of a folder that a pattern may match start (`_Screen.candidates`)."""
        return self._screen.candidates(names, lowered, folder)

    @property
    def is_empty(self) -> bool:
        return not self._runs

    def decide(self, rel: str, name: str, is_dir: bool) -> str | None:
        """Label of the deciding pattern, `NEGATED` if a `!pattern` decides, None if none matches."""
        if (self._dir_filter if is_dir else self._any_filter).match(rel, name) is None:
            return None  # no pattern of any run matches
        for run in self._runs:
            label = run.any.match(rel, name) if run.any.active else None
            if label is None and is_dir and run.dirs.active:
                label = run.dirs.match(rel, name)
            if label is not None:
                return label if run.include else NEGATED
        return None


# ---------------------------------------------------------------- rule files


def read_rule_file(path: str) -> str | None:
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


def rule_lines(text: str) -> Iterator[str]:
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


def lfs_patterns(text: str) -> list[tuple[Pattern, str]]:
    """Patterns whose `filter` attribute the root `.gitattributes` sets to `lfs` (or resets)."""
    macros: dict[str, list[str]] = {}
    out: list[tuple[Pattern, str]] = []
    for raw in rule_lines(text):
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


def submodule_paths(text: str) -> frozenset[str]:
    """`path = …` values of the `[submodule "…"]` sections of a `.gitmodules` file."""
    paths: set[str] = set()
    in_submodule = False
    for raw in rule_lines(text):
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
