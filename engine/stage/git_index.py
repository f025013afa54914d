"""Object ids from the user's own git index, where they are provably byte-exact (issue 14).

A baseline of a workspace that is a git repository may take the blob id of a file from
git's index instead of hashing the file, when the index proves the file unchanged:

- `read_index` parses `.git/index` (versions 2, 3 and 4) in pure Python, read-only (the
  file is opened O_RDONLY and never locked); a split index (`link`), a sparse index
  (`sdir`), any other required extension, a bad checksum or anything unexpected raises
  `IndexDoubt`, and then no id is taken at all;
- `IndexProof.load` adds what must hold for the whole repository (no conversion can be in
  effect: no `core.autocrlf` other than false, no `core.eol`, `core.attributesFile`,
  `include`, no attributes file mentioning text/eol/crlf/ident/filter/encoding, no
  `GIT_*` override in the environment); any doubt returns None ("hash everything");
- `IndexProof.prove` is the per-file proof: a stage-0 entry without assume-valid,
  skip-worktree or intent-to-add, whose stat data equals the file's lstat as git compares
  it, and which is not racy (older than the index file by the stat cache's margin);
- `open_index` and `read_index_at` let a baseline's forked child read the same index file
  as the scan that forked it (the scanner's split baseline parses it in both at once);
- `IndexProof.trees` reads the cache-tree extension: the tree ids git knows for folders,
  which a baseline takes for a folder whose every file it proved (`Scanner._index_trees`).

The engine never runs git and never writes the user's `.git`: the shadow repository reads
the borrowed blobs through an alternate until `borrowed.py` copied them (see there).
Configuration is read as text, conservatively: libgit2's config is isolated by the engine.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
import struct
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from shadowpoint.stage.stat_cache import (
    CODE_EXEC,
    CODE_FILE,
    CODE_LINK,
    RACY_MARGIN_NS,
    STATE_LAYOUT,
    TRUSTED,
    FileState,
)

log = structlog.get_logger(__name__)

_HEADER = struct.Struct(">4sII")
# ctime s, ns, mtime s, ns, dev, ino, mode, uid, gid, size, oid, flags
_ENTRY = struct.Struct(">10I20sH")
_FLAGS_AT = _ENTRY.size - 2
_EXT = struct.Struct(">H")  # the extended flags after the entry's own (version 3 and later)
_FLAG_ASSUME_VALID = 0x8000
_FLAG_EXTENDED = 0x4000
_FLAG_STAGE = 0x3000
_FLAG_NAME = 0x0FFF
_EXT_SKIP_WORKTREE = 0x4000
_EXT_INTENT_TO_ADD = 0x2000
_EXT_KNOWN = _EXT_SKIP_WORKTREE | _EXT_INTENT_TO_ADD
# optional extensions git writes (an upper-case first letter means "optional" anyway)
_EMPTY_BLOB = bytes.fromhex("e69de29bb2d1d6434b8b29ae775ad8c2e48c5391")
_ATTRIBUTES = ".gitattributes"
_U32 = 0xFFFFFFFF
_TYPE_BITS = 0o170000  # stat.S_IFMT's
_S_IFREG, _S_IFLNK = stat.S_IFREG, stat.S_IFLNK
_NO_LIMIT = 1 << 63  # `prove`'s size limit: none (its callers compare)
# a proven file's mode in its tree entry, by its state's code (git's three modes of files)
_ENTRY_MODES = {CODE_FILE: b"100644 ", CODE_EXEC: b"100755 ", CODE_LINK: b"120000 "}

# words whose mention in an attributes file may mean a conversion on `git add`
_ATTR_WORDS = re.compile(rb"text|eol|crlf|ident|filter|encoding", re.IGNORECASE)
# environment variables that could point git at another index, config or object store
_ENV_PREFIXES = ("GIT_DIR", "GIT_INDEX_FILE", "GIT_CONFIG", "GIT_WORK_TREE", "GIT_OBJECT_DIRECTORY",
                 "GIT_ALTERNATE_OBJECT_DIRECTORIES", "GIT_COMMON_DIR", "GIT_ATTR", "GIT_NAMESPACE")


class IndexDoubt(Exception):
    """The index (or the repository) cannot prove anything: hash every file."""


@dataclass(slots=True)
class IndexEntry:
    """One entry of git's index, as stored (32-bit fields). Not frozen: a frozen dataclass's
    __init__ cost most of parsing a 100k-entry index."""

    path: str
    ctime_s: int
    ctime_ns: int
    mtime_s: int
    mtime_ns: int
    dev: int
    ino: int
    mode: int
    uid: int
    gid: int
    size: int
    oid: str
    flags: int
    ext_flags: int = 0

    @property
    def stage(self) -> int:
        return (self.flags & _FLAG_STAGE) >> 12

    @property
    def assume_valid(self) -> bool:
        return bool(self.flags & _FLAG_ASSUME_VALID)

    @property
    def skip_worktree(self) -> bool:
        return bool(self.ext_flags & _EXT_SKIP_WORKTREE)

    @property
    def intent_to_add(self) -> bool:
        return bool(self.ext_flags & _EXT_INTENT_TO_ADD)


@dataclass(frozen=True, slots=True)
class GitIndex:
    """A parsed index. Its entries stay in `body` until asked for: building an object for each
    of 100k entries was most of a git repository's baseline start (~0.4 s); a proof reads the
    fields of the entries the walk reaches, once each."""

    version: int
    body: bytes
    paths: list[str]  # the entries' paths, in the index's order
    starts: list[int]  # where each path's entry starts in `body`
    extensions: tuple[str, ...]
    mtime_ns: int  # the index file's own mtime (git's racy-git rule)
    unmerged: frozenset[str] = frozenset()  # paths with an entry of a stage other than 0
    # where the cache-tree extension ("TREE") lies in `body`: (start, end), if there is one
    cache_tree: tuple[int, int] | None = None

    @property
    def entries(self) -> list[IndexEntry]:
        return [entry_at(self.body, path, at) for path, at in zip(self.paths, self.starts, strict=True)]


def entry_at(body: bytes, path: str, at: int) -> IndexEntry:
    """The entry of `path` that starts at `at` in an index's `body`."""
    (ctime_s, ctime_ns, mtime_s, mtime_ns, dev, ino, mode, uid, gid, size, raw_oid,
     flags) = _ENTRY.unpack_from(body, at)
    ext = _EXT.unpack_from(body, at + _ENTRY.size)[0] if flags & _FLAG_EXTENDED else 0
    return IndexEntry(path, ctime_s, ctime_ns, mtime_s, mtime_ns, dev, ino, mode, uid, gid, size, raw_oid.hex(),
                      flags, ext)


def read_index(path: Path) -> GitIndex:
    """Parse git's index file at `path` (read-only, never locked).

    Raises:
        IndexDoubt: unreadable, bad checksum, an unknown version, a split or sparse index, a
            required extension this reader does not know, or anything malformed.
    """
    fd = open_index(path)
    try:
        return read_index_at(fd)
    finally:
        os.close(fd)


def open_index(path: Path) -> int:
    """A descriptor of git's index file at `path`, for `read_index_at`.

    Raises:
        IndexDoubt: it cannot be opened.
    """
    try:
        return os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError as exc:
        raise IndexDoubt(f"the index cannot be opened: {exc}") from exc


def read_index_at(fd: int) -> GitIndex:
    """Parse the index open at `fd` (`open_index`). Positioned reads: processes that share the
    descriptor (a forked child) read the same file, whatever git renamed over its path since.

    Raises:
        IndexDoubt: as `read_index`.
    """
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise IndexDoubt("the index is not a regular file")
        # one read of the size fstat gave (and a byte more, to see it grew), not chunks joined:
        # each copy of a 100k-file index is ~12 MB
        chunks = [os.pread(fd, st.st_size + 1, 0)]
        at = len(chunks[0])
        while chunk := os.pread(fd, 1 << 20, at):
            chunks.append(chunk)
            at += len(chunk)
        data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
    except OSError as exc:
        raise IndexDoubt(f"the index cannot be read: {exc}") from exc
    try:
        return _parse(data, st.st_mtime_ns)
    except (struct.error, IndexError, UnicodeDecodeError, ValueError) as exc:
        raise IndexDoubt(f"the index is malformed: {exc}") from exc


def _parse(data: bytes, index_mtime_ns: int) -> GitIndex:
    if len(data) < _HEADER.size + 20:
        raise IndexDoubt("the index is truncated")
    # the entries are read where they lie in `data`, up to the trailer (no copy without it)
    body, size = data, len(data) - 20
    trailer = data[size:]
    # index.skipHash (feature.manyFiles) writes a zero trailer, which git itself accepts
    if trailer != bytes(20) and hashlib.sha1(memoryview(data)[:size]).digest() != trailer:
        raise IndexDoubt("the index checksum does not match")
    sig, version, count = _HEADER.unpack_from(body, 0)
    if sig != b"DIRC":
        raise IndexDoubt("not a git index")
    if version not in (2, 3, 4):
        raise IndexDoubt(f"index version {version} is not supported")
    if version == 4:
        paths, starts, pos, staged = _entries_v4(body, count, size)
    else:
        paths, starts, pos, staged = _entries_v2(body, count, version, size)
    exts: list[str] = []
    cache_tree: tuple[int, int] | None = None
    while pos < size:
        if pos + 8 > size:
            raise IndexDoubt("a truncated index extension")
        sig_raw, ext_size = struct.unpack_from(">4sI", body, pos)
        name_ext = sig_raw.decode("latin-1")
        if name_ext in ("link", "sdir") or not ("A" <= name_ext[:1] <= "Z"):
            raise IndexDoubt(f"the index has the required extension {name_ext!r} (split or sparse index)")
        exts.append(name_ext)
        if name_ext == "TREE":
            cache_tree = (pos + 8, pos + 8 + ext_size)
        pos += 8 + ext_size
    if pos != size:
        raise IndexDoubt("index extensions overrun the file")
    return GitIndex(version, body, paths, starts, tuple(exts), index_mtime_ns,
                    frozenset(paths[i] for i in staged), cache_tree)


Entries = tuple[list[str], list[int], int, list[int]]
"""An index's paths, where each one's entry starts, where the extensions start, and which
entries are of a stage other than 0 (a merge's)."""


def _entries_v2(body: bytes, count: int, version: int, size: int) -> Entries:
    """The paths of a version 2 or 3 index, where their entries start, where the extensions
    start, and which entries are of a stage other than 0 (a merge's). The hot part of a git
    repository's baseline start (100k entries: ~50 ms without the garbage collector, against
    ~70 ms decoding and checking each name on its own): the names are checked and decoded
    together. Slicing them together after a loop that only finds where entries start was
    slower still (~70 ms: a slice object and a bytes object per name either way)."""
    pos = _HEADER.size
    starts: list[int] = []
    names: list[bytes] = []
    staged: list[int] = []
    add_start, add_name, find = starts.append, names.append, body.index
    # the module's constants as locals: ~2-3 of the ~47 ms at 100k entries were their lookups
    entry_size, flags_at = _ENTRY.size, _FLAGS_AT
    extended, name_mask, stage_mask = _FLAG_EXTENDED, _FLAG_NAME, _FLAG_STAGE
    for _ in range(count):
        flags = (body[pos + flags_at] << 8) | body[pos + flags_at + 1]
        at = pos + entry_size
        if flags & extended:
            if version < 3:
                raise IndexDoubt("an extended entry in a version-2 index")
            if ((body[at] << 8) | body[at + 1]) & ~_EXT_KNOWN:
                raise IndexDoubt(f"unknown extended entry flags {(body[at] << 8) | body[at + 1]:#x}")
            at += 2
        length = flags & name_mask
        if length < name_mask:
            end = at + length
            if end >= size or body[end]:
                raise IndexDoubt("an entry's name is not NUL-terminated")
        else:
            end = find(b"\0", at)
        if end == at:
            raise IndexDoubt("an empty entry name")
        if flags & stage_mask:
            staged.append(len(starts))
        add_start(pos)
        add_name(body[at:end])
        # entries are padded with 1-8 NULs to a multiple of 8 bytes
        pos += (end - pos + 8) & ~7
    if pos > size:
        raise IndexDoubt("the index is truncated")
    joined = b"\0".join(names)
    if not names:
        return [], [], pos, staged
    if joined.count(b"\0") != len(names) - 1:
        raise IndexDoubt("an entry's name holds a NUL")
    return joined.decode("utf-8", "surrogateescape").split("\0"), starts, pos, staged


def _entries_v4(body: bytes, count: int, size: int) -> Entries:
    """`_entries_v2` for version 4, whose names are prefix-compressed."""
    pos = _HEADER.size
    paths: list[str] = []
    starts: list[int] = []
    staged: list[int] = []
    prev = b""
    unpack_flags = _EXT.unpack_from  # the same 16-bit layout
    for _ in range(count):
        start = pos
        (flags,) = unpack_flags(body, pos + _FLAGS_AT)
        pos += _ENTRY.size
        if flags & _FLAG_EXTENDED:
            (ext,) = unpack_flags(body, pos)
            pos += 2
            if ext & ~_EXT_KNOWN:
                raise IndexDoubt(f"unknown extended entry flags {ext:#x}")
        strip, pos = _varint(body, pos)
        end = body.index(b"\0", pos)
        if strip > len(prev):
            raise IndexDoubt("a v4 path strips more than the previous path")
        name = prev[: len(prev) - strip] + body[pos:end]
        pos = end + 1
        if not name or b"\0" in name:
            raise IndexDoubt("an empty entry name")
        if pos > size:
            raise IndexDoubt("the index is truncated")
        prev = name
        if flags & _FLAG_STAGE:
            staged.append(len(paths))
        paths.append(name.decode("utf-8", "surrogateescape"))
        starts.append(start)
    return paths, starts, pos, staged


def cached_trees(body: bytes, span: tuple[int, int], root_only: bool = False) -> dict[str, tuple[int, bytes]]:
    """The trees of git's cache-tree extension ("TREE", at `span` of an index's `body`): folder
    ("" for the root, else "a/b") -> (how many index entries it covers, its raw tree id); a
    folder whose tree git no longer knows (it writes -1 entries and no id) as (-1, b"").
    `root_only`: the root's entry only (the first).

    The entries come depth first, each a NUL-ended name (relative to its parent), the decimal
    entry count and subtree count, a newline and, when valid, the 20-byte id.

    Raises:
        IndexDoubt: the extension is malformed.
    """
    start, end = span
    out: dict[str, tuple[int, bytes]] = {}
    # the open folders: [prefix of their children, subtrees still to come]
    open_folders: list[list[Any]] = []
    pos = start
    try:
        while pos < end:
            nul = body.index(b"\0", pos, end)
            line = body.index(b"\n", nul, end)
            count_text, subtrees_text = body[nul + 1:line].split(b" ")
            count, subtrees = int(count_text), int(subtrees_text)
            name = body[pos:nul].decode("utf-8", "surrogateescape")
            pos = line + 1
            if open_folders:
                parent = open_folders[-1]
                parent[1] -= 1
                path = parent[0] + name
            elif name:
                raise IndexDoubt("the cache-tree's first entry is not the root")
            else:
                path = ""
            if count >= 0:
                if pos + 20 > end:
                    raise IndexDoubt("a truncated cache-tree entry")
                out[path] = (count, body[pos:pos + 20])
                pos += 20
            else:
                out[path] = (-1, b"")
            if root_only:
                return out
            if subtrees < 0 or (open_folders and open_folders[-1][1] < 0):
                raise IndexDoubt("a cache-tree entry with more subtrees than its folder holds")
            open_folders.append([f"{path}/" if path else "", subtrees])
            while open_folders and open_folders[-1][1] == 0:
                open_folders.pop()
    except ValueError as exc:  # no NUL or newline, a count that is not a number
        raise IndexDoubt(f"the cache-tree extension is malformed: {exc}") from exc
    if open_folders:
        raise IndexDoubt("the cache-tree extension ends inside a folder")
    return out


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    """git's offset varint (varint.c)."""
    c = data[pos]
    pos += 1
    val = c & 0x7F
    while c & 0x80:
        c = data[pos]
        pos += 1
        val = ((val + 1) << 7) | (c & 0x7F)
    return val, pos


# ---------------------------------------------------------------- repository-wide conditions


def _config_doubt(text: str) -> str | None:
    """Why a git config file (read as text) could make `git add` convert content, else None."""
    section = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("["):
            close = line.find("]")
            if close < 0:
                return "an unparsable config section"
            header = line[1:close].strip()
            section = header.split(None, 1)[0].split(".", 1)[0].strip('"').lower() if header else ""
            if section in ("include", "includeif"):
                return "the git config includes other files"
            rest = line[close + 1:].strip()
            if not rest or rest[0] in "#;":
                continue
            line = rest  # `[core] autocrlf = true` on one line
        key, sep, value = line.partition("=")
        key = key.strip().lower()
        value = value.split("#", 1)[0].split(";", 1)[0].strip().strip('"').lower()
        if section == "core":
            if key == "autocrlf" and (not sep or value not in ("false", "no", "off", "0")):
                return f"core.autocrlf = {value or 'true'}"
            if key in ("eol", "attributesfile", "worktree", "bare"):
                if key == "bare" and value in ("false", "no", "off", "0"):
                    continue
                return f"core.{key} is set"
        elif section == "extensions":
            return f"extensions.{key} is set"
        elif section.startswith("include"):
            return "the git config includes other files"
        if raw.rstrip().endswith("\\"):
            return "a continued config line"
    return None


def _read_text(path: Path) -> str | None:
    try:
        return path.read_bytes().decode("utf-8", "surrogateescape")
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise IndexDoubt(f"{path} cannot be read: {exc}") from exc


def attributes_doubt(data: bytes) -> bool:
    """True if an attributes file's text mentions anything that may convert content."""
    return _ATTR_WORDS.search(data) is not None


def user_config_files(git_dir: Path, environ: Mapping[str, str]) -> list[Path]:
    home = environ.get("HOME") or os.path.expanduser("~")
    xdg = environ.get("XDG_CONFIG_HOME") or os.path.join(home, ".config")
    return [git_dir / "config", Path(home) / ".gitconfig", Path(xdg) / "git" / "config",
            Path("/etc/gitconfig"), Path("/usr/local/etc/gitconfig")]


def user_attribute_files(git_dir: Path, environ: Mapping[str, str]) -> list[Path]:
    home = environ.get("HOME") or os.path.expanduser("~")
    xdg = environ.get("XDG_CONFIG_HOME") or os.path.join(home, ".config")
    return [git_dir / "info" / "attributes", Path(xdg) / "git" / "attributes",
            Path("/etc/gitattributes"), Path("/usr/local/etc/gitattributes")]


def _repo_doubt(git_dir: Path, environ: Mapping[str, str]) -> str | None:
    for name in environ:
        if name.startswith(_ENV_PREFIXES):
            return f"{name} is set in the environment"
    for path in user_config_files(git_dir, environ):
        text = _read_text(path)
        if text is not None and (why := _config_doubt(text)) is not None:
            return f"{path}: {why}"
    for path in user_attribute_files(git_dir, environ):
        text = _read_text(path)
        if text is not None and attributes_doubt(text.encode("utf-8", "surrogateescape")):
            return f"{path} mentions a conversion attribute"
    return None


# ---------------------------------------------------------------- the proof


@dataclass(slots=True)
class IndexProof:
    """The user's index, ready to prove files unchanged (one baseline)."""

    git_dir: Path
    objects_dir: Path
    body: bytes  # the index's entries, read by `prove` (`GitIndex.body`)
    paths: list[str]  # the index's paths, sorted (stage 0 only)
    starts: list[int]  # where each one's entry starts in `body`
    racy_before_ns: int  # an entry's mtime must be older than this
    checked: set[str] = field(default_factory=set)  # folders whose .gitattributes was read
    doubt: str | None = None  # why no more ids may be taken (set by attributes_clear)
    version: int = 0  # the index file's (for the log)
    extensions: tuple[str, ...] = ()  # its extensions' names (for the log)
    cache_tree: tuple[int, int] | None = None  # where its cache-tree extension lies in `body`
    _entries: dict[str, int] | None = None  # `entries`, once made

    @classmethod
    def load(cls, root: Path, environ: Mapping[str, str] | None = None, fd: int | None = None) -> IndexProof | None:
        """The proof for workspace `root` when it is a git repository and nothing is in doubt;
        `fd`: its index, opened already (`open_index`)."""
        return _logged(root, cls.read(root, environ, fd))

    @classmethod
    def read(cls, root: Path, environ: Mapping[str, str] | None = None,
             fd: int | None = None) -> IndexProof | str | None:
        """`load` without its log: the proof, why there is none (a str), or None when `root` is
        not a git repository."""
        env = os.environ if environ is None else environ
        git_dir = root / ".git"
        try:
            st = os.lstat(git_dir)
        except OSError:
            return None  # not a git repository: the ordinary baseline
        try:
            if not stat.S_ISDIR(st.st_mode):
                raise IndexDoubt("the workspace's .git is not a folder (a worktree or submodule)")
            objects = git_dir / "objects"
            if not (objects / "pack").is_dir() or (git_dir / "commondir").exists():
                raise IndexDoubt("the git dir has no object store of its own")
            why = _repo_doubt(git_dir, env)
            if why is not None:
                raise IndexDoubt(why)
            index = read_index(git_dir / "index") if fd is None else read_index_at(fd)
        except IndexDoubt as exc:
            return str(exc)
        body = index.body
        paths, starts = index.paths, index.starts
        if index.unmerged:  # unmerged: no stage proves anything
            kept = [i for i, path in enumerate(paths) if path not in index.unmerged]
            paths, starts = [paths[i] for i in kept], [starts[i] for i in kept]
        attributes = _attribute_files("\0".join(paths))
        for path in attributes:
            # git reads a tracked attributes file from the index when the worktree lacks it
            if not os.path.isfile(root / path) or os.path.islink(root / path):
                return f"{path} is tracked but not on disk"
        return cls(git_dir, objects.resolve(), body, paths, starts, index.mtime_ns - RACY_MARGIN_NS,
                   version=index.version, extensions=index.extensions, cache_tree=index.cache_tree)

    @property
    def entries(self) -> dict[str, int]:
        """path -> where its entry starts in `body`: every path, or those `keep` kept."""
        if self._entries is None:
            self._entries = dict(zip(self.paths, self.starts, strict=True))
        return self._entries

    def keep(self, runs: Iterable[tuple[int, int]]) -> None:
        """Look up only the paths in `runs` (ranges [lo, hi) of `paths`): one side of a split
        walk proves no other. Its map is made for those alone: each process of a split
        baseline made it for all 100k entries, ~13 ms."""
        paths, starts = self.paths, self.starts
        self._entries = {}
        for lo, hi in runs:
            self._entries.update(zip(paths[lo:hi], starts[lo:hi], strict=True))

    def trees(self, root_only: bool = False) -> dict[str, tuple[int, bytes]]:
        """The folders whose tree the index's cache-tree holds (`cached_trees`); {} when it has
        none or it is malformed (no tree is taken then: each is written as without an index)."""
        if self.cache_tree is None:
            return {}
        try:
            return cached_trees(self.body, self.cache_tree, root_only)
        except IndexDoubt as exc:
            log.info("git_index.cache_tree_unreadable", git_dir=str(self.git_dir), reason=str(exc))
            return {}

    def attributes_clear(self, root: Path, prefix: str, listed: Callable[[str], bool | None] | None = None) -> bool:
        """False if the folder `prefix` ("" or "a/b/") or one of its parents holds a
        `.gitattributes` that may convert content (or one that cannot be read). Each folder is
        read once; called before any file of the folder is proven. `listed(folder)`: whether
        the walk's listing of it held one (False: not opened; None: not listed, looked for)."""
        folder = prefix.rstrip("/")
        while folder not in self.checked:
            self.checked.add(folder)
            candidate = f"{root}/{folder}/.gitattributes" if folder else f"{root}/.gitattributes"
            try:
                if listed is not None and listed(folder) is False:
                    raise FileNotFoundError  # one open a folder less (~4 us, 8,800 folders at 100k files)
                fd = os.open(candidate, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
            except FileNotFoundError:
                fd = -1
            except OSError:
                self.doubt = f"{candidate} cannot be read"
                return False
            if fd >= 0:
                try:
                    with os.fdopen(fd, "rb") as fh:
                        data = fh.read()
                except OSError:
                    self.doubt = f"{candidate} cannot be read"
                    return False
                if attributes_doubt(data):
                    self.doubt = f"{candidate} mentions a conversion attribute"
                    return False
            if not folder:
                break
            folder = folder.rsplit("/", 1)[0] if "/" in folder else ""
        return self.doubt is None

    def prove(self, path: str, st: os.stat_result, checked_ns: int) -> FileState | None:
        """The file's state (`stat_cache`) with the index's blob id and mode if its entry
        proves the file at `st` unchanged; `checked_ns`: when the walk began (the state's
        racy-clean rule). `prove_folder` for one file."""
        states: list[FileState] = []
        self.prove_folder("", (path,), (st,), checked_ns, _NO_LIMIT, [], states)
        return states[0] if states else None

    def prove_folder(self, prefix: str, names: Sequence[str], stats: Sequence[os.stat_result | None],
                     checked_ns: int, max_bytes: int, proven: list[str], states: list[FileState],
                     encoded: Sequence[bytes] | None = None, entries: list[bytes] | None = None) -> list[int]:
        """Which files `names` of one folder (`prefix`: "" or "a/b/"), each with its lstat (None:
        gone), the index proves unchanged: a stage-0 entry without assume-valid, skip-worktree or
        intent-to-add whose stat data equals the lstat as git compares it, not racy, and a file
        no larger than `max_bytes`. Each proven path and its state (`stat_cache`, with the
        index's blob id and mode; `checked_ns`: when the walk began, the state's racy-clean
        rule) are added to `proven` and `states`; returns where the others are in `names`.

        `encoded` (the names as bytes) and `entries`: each proven file's tree entry is added to
        `entries` too (`<mode> <name>\\0<raw id>`), for its folder's tree
        (`ShadowRepo.write_folder_trees`) when every file of it is proven.

        A baseline's hot loop, one call a folder, not two or three a file: the times are
        compared whole (seconds and nanoseconds of the entry against the stat's nanoseconds; a
        time git's 32-bit seconds cannot hold never matches: hashed), in one expression, and the
        state packed here."""
        others: list[int] = []
        where = self.entries.get
        unpack = _ENTRY.unpack_from
        body = self.body
        racy_before = self.racy_before_ns
        trusted_before = checked_ns - RACY_MARGIN_NS
        pack = STATE_LAYOUT.pack
        add_path, add_state, add_other = proven.append, states.append, others.append
        add_entry = entries.append if entries is not None and encoded is not None else None
        encoded_names: Sequence[bytes] = encoded if encoded is not None else ()
        for i, st in enumerate(stats):
            if st is None:
                add_other(i)
                continue
            path = prefix + names[i]
            at = where(path)
            if at is None:
                add_other(i)
                continue
            (ctime_s, ctime_ns, mtime_s, mtime_ns, _dev, ino, e_mode, uid, gid, e_size, raw_oid,
             flags) = unpack(body, at)
            mode = st.st_mode
            mtime = st.st_mtime_ns
            ctime = st.st_ctime_ns
            size = st.st_size
            if (size > max_bytes
                    or flags & (_FLAG_ASSUME_VALID | _FLAG_EXTENDED)  # assume-valid, skip-worktree, intent-to-add
                    or size != e_size  # a size over 32 bits never equals the entry's
                    or (mode ^ e_mode) & _TYPE_BITS
                    or mtime != mtime_s * 1_000_000_000 + mtime_ns or mtime_ns >= 1_000_000_000
                    or ctime != ctime_s * 1_000_000_000 + ctime_ns or ctime_ns >= 1_000_000_000
                    or st.st_ino & _U32 != ino or st.st_uid & _U32 != uid or st.st_gid & _U32 != gid
                    # racy: recorded too close to the index write for the stat to prove the content
                    or mtime >= racy_before):
                add_other(i)
                continue
            kind = mode & _TYPE_BITS
            if kind == _S_IFREG:
                if (mode ^ e_mode) & 0o100 or (e_size == 0 and raw_oid != _EMPTY_BLOB):
                    add_other(i)  # the exec bit; a 0 size may be git's racy smudge
                    continue
                code = CODE_EXEC if e_mode & 0o100 else CODE_FILE  # git's modes of files are these two
            elif kind == _S_IFLNK:
                code = CODE_LINK
            else:
                add_other(i)
                continue
            add_path(path)
            # every field fits (32-bit size and inode, the times git holds): packed as is
            add_state(pack(size, mtime, ctime, mode, ino, (code | TRUSTED) if mtime < trusted_before else code,
                           raw_oid))
            if add_entry is not None:
                add_entry(_ENTRY_MODES[code] + encoded_names[i] + b"\0" + raw_oid)
        return others


def _attribute_files(joined: str) -> list[str]:
    """The attributes files among paths joined by NULs (a search in C, not a loop over 100k
    paths)."""
    found = []
    at = joined.find(_ATTRIBUTES)
    while at >= 0:
        end = at + len(_ATTRIBUTES)
        if (at == 0 or joined[at - 1] in "\0/") and (end == len(joined) or joined[end] == "\0"):
            found.append(joined[joined.rfind("\0", 0, at) + 1:end])
        at = joined.find(_ATTRIBUTES, end)
    return found


def _logged(root: Path, found: IndexProof | str | None) -> IndexProof | None:
    """`IndexProof.read`'s answer, logged: the proof, or None."""
    if isinstance(found, str):
        log.info("git_index.doubted", root=str(root), reason=found, action="hashing every file")
        return None
    if found is not None:
        # the paths' count, not `entries`' map: made here for every path, it cost a split
        # baseline ~14 ms before its walk, only to be replaced by its part's (`keep`)
        log.info("git_index.loaded", root=str(root), version=found.version, entries=len(found.paths),
                 extensions=list(found.extensions))
    return found
