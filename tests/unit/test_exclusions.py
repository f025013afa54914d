"""ExclusionRules: the git CLI is the oracle for `.gitignore` and `.gitattributes` semantics.

Trees are dict literals written into pytest's tmp_path. Git runs with no user or system
configuration (`GIT_CONFIG_GLOBAL=/dev/null`, `GIT_CONFIG_NOSYSTEM=1`, a private HOME/XDG).
"""

from __future__ import annotations

import hashlib
import os
import random
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from shadowpoint.config.exclusion_data import BUILTIN_EXCLUSIONS
from shadowpoint.stage import exclusions
from shadowpoint.stage.exclusions import NAME_SEP, ExclusionRules, WalkPart
from shadowpoint.workspace import RepoPath

needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="the git CLI is the oracle")


@dataclass(frozen=True)
class Link:
    """A symlink in a tree literal."""

    target: str


TreeValue = str | bytes | Link | Mapping[str, "TreeValue"]


def make_tree(root: Path, tree: Mapping[str, TreeValue]) -> Path:
    """Write a tree literal: "a/b.txt": "text", "dir/": {...}, "link": Link("target")."""
    root.mkdir(parents=True, exist_ok=True)
    for name, value in tree.items():
        path = root / name.rstrip("/")
        if isinstance(value, Mapping):
            make_tree(path, value)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(value, Link):
            os.symlink(value.target, path)
        else:
            path.write_bytes(value if isinstance(value, bytes) else value.encode())
    return root


def walked(root: Path, *, builtin: Mapping[str, Sequence[str]] | None = None,
           extra: Sequence[str] = ()) -> set[str]:
    return {str(path) for path, _ in ExclusionRules(root, builtin=builtin, extra=extra).walk()}


def all_paths(root: Path) -> tuple[set[str], set[str]]:
    """(non-folder paths, folder paths) on disk, symlinks not followed, `.git` folders included."""
    files: set[str] = set()
    dirs: set[str] = set()
    for current, dirnames, filenames in os.walk(root):
        rel = Path(current).relative_to(root).as_posix()
        prefix = "" if rel == "." else f"{rel}/"
        for d in list(dirnames):
            if os.path.islink(os.path.join(current, d)):
                files.add(prefix + d)
                dirnames.remove(d)
            else:
                dirs.add(prefix + d)
        files.update(prefix + f for f in filenames)
    return files, dirs


def tree_digest(root: Path) -> str:
    """Names, types, modes, contents, link targets, mtimes and ctimes of everything below root."""
    h = hashlib.sha256()
    for current, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted([*dirnames, *filenames, "."]):
            path = os.path.join(current, name)
            st = os.lstat(path)
            h.update(f"{path}|{st.st_mode}|{st.st_mtime_ns}|{st.st_ctime_ns}|{st.st_size}".encode())
            if stat.S_ISLNK(st.st_mode):
                h.update(os.readlink(path).encode())
            elif stat.S_ISREG(st.st_mode):
                h.update(Path(path).read_bytes())
    return h.hexdigest()


def git_env(tmp: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    home = tmp / "git-home"
    (home / "xdg").mkdir(parents=True, exist_ok=True)
    env.update(
        GIT_CONFIG_GLOBAL=os.devnull,
        GIT_CONFIG_NOSYSTEM="1",
        HOME=str(home),
        XDG_CONFIG_HOME=str(home / "xdg"),
        GIT_TERMINAL_PROMPT="0",
    )
    return env


def git(root: Path, env: dict[str, str], *args: str, stdin: bytes | None = None) -> bytes:
    return subprocess.run(["git", "-C", str(root), *args], env=env, input=stdin, capture_output=True, check=True).stdout


def git_untracked(root: Path, env: dict[str, str]) -> set[str]:
    """What git itself would add: `git ls-files --others --exclude-standard` in a fresh repo."""
    if not (root / ".git").exists():
        git(root, env, "init", "-q", "--template=", ".")
    out = git(root, env, "ls-files", "--others", "--exclude-standard", "-z")
    paths = {os.fsdecode(p) for p in out.split(b"\0") if p}
    assert not any(p.endswith("/") for p in paths), "oracle trees must not hold nested repositories"
    return paths


def assert_matches_git(root: Path, tmp: Path) -> set[str]:
    ours = walked(root, builtin={})
    theirs = git_untracked(root, git_env(tmp))
    assert ours == theirs, f"only ours: {sorted(ours - theirs)}; only git's: {sorted(theirs - ours)}"
    return ours


# ---------------------------------------------------------------- .gitignore vs git


GITIGNORE_CASES: dict[str, dict[str, TreeValue]] = {
    "nested_file_overrides_parent": {
        ".gitignore": "*.txt\n",
        "a.txt": "x",
        "b.md": "x",
        "sub/.gitignore": "!keep.txt\n",
        "sub/keep.txt": "x",
        "sub/other.txt": "x",
        "sub/deeper/keep.txt": "x",
        "other/keep.txt": "x",
    },
    "negation_later_line_wins": {
        ".gitignore": "*.log\n!important.log\nimportant.log.old\n",
        "a.log": "x",
        "important.log": "x",
        "x/important.log": "x",
        "important.log.old": "x",
    },
    "anchored_patterns": {
        ".gitignore": "/top.txt\ndocs/*.md\na/**/b\n**/cache\nsrc/gen/\n",
        "top.txt": "x",
        "sub/top.txt": "x",
        "docs/a.md": "x",
        "docs/deep/a.md": "x",
        "x/docs/a.md": "x",
        "a/b": "x",
        "a/x/y/b": "x",
        "a/bb": "x",
        "z/cache/f": "x",
        "cache": "x",
        "src/gen/f.py": "x",
        "other/src/gen/f.py": "x",
    },
    "dir_only_patterns": {
        ".gitignore": "logs/\nout/\n",
        "logs/a.txt": "x",
        "x/logs/b.txt": "x",
        "y/logs": "a file named like the folder pattern",
        "out": Link("y"),
    },
    "no_reinclude_inside_excluded_dir": {
        ".gitignore": "build/\n!build/keep.txt\nsecret/*\n!secret/ok.txt\nfoo/**\n!foo/keep.txt\n",
        "build/keep.txt": "x",
        "build/x.txt": "x",
        "secret/ok.txt": "x",
        "secret/no.txt": "x",
        "foo/keep.txt": "x",
        "foo/sub/keep.txt": "x",
    },
    "deeper_dir_negation_does_not_reinclude_files": {
        ".gitignore": "*.txt\nfoo/\n",
        "sub/.gitignore": "!foo/\n",
        "sub/foo/x.txt": "x",
        "sub/foo/y.md": "x",
        "foo/y.md": "x",
    },
    "syntax_edges": {
        ".gitignore": (
            "\ufeff# a comment\n\\#hash\n\\!bang\ntrailing.txt   \nspace\\ \r\nwin.txt\r\n"
            "[a-c]*.py\n[!x]y\n[[:digit:]]*.dat\nq?.md\nab**/c\n"
        ),
        "#hash": "x",
        "!bang": "x",
        "# a comment": "x",
        "trailing.txt": "x",
        "space ": "x",
        "space": "x",
        "win.txt": "x",
        "apple.py": "x",
        "zebra.py": "x",
        "ay": "x",
        "xy": "x",
        "7.dat": "x",
        "a7.dat": "x",
        "q1.md": "x",
        "q12.md": "x",
        "abz/y/c": "x",
        "ab/c": "x",
    },
    "symlinked_rule_files_are_not_read": {
        ".gitignore": Link("rules.txt"),
        "rules.txt": "*.log\n",
        "a.log": "x",
        "sub/.gitignore": Link("../rules.txt"),
        "sub/b.log": "x",
    },
    "non_utf8_names": {
        ".gitignore": "*.tmpx\n",
        os.fsdecode(b"caf\xe9.txt"): "x",
        os.fsdecode(b"caf\xe9.tmpx"): "x",
    },
    "symlinks_are_leaves": {
        ".gitignore": "*.secret\n",
        "real/a.txt": "x",
        "real/b.secret": "x",
        "link": Link("real"),
        "dangling": Link("nowhere"),
        "x.secret": Link("real"),
    },
}


@needs_git
@pytest.mark.parametrize("case", sorted(GITIGNORE_CASES))
def test_gitignore_semantics_match_git(tmp_path: Path, case: str) -> None:
    root = make_tree(tmp_path / "ws", GITIGNORE_CASES[case])
    ours = assert_matches_git(root, tmp_path)
    assert ours, "every case keeps something"
    assert ".gitignore" in ours or case == "syntax_edges"
    assert not any(p.endswith((".tmpx", "b.secret")) for p in ours)


_FUZZ_PATTERNS = [
    "*.txt", "!*.txt", "a", "!a", "a/", "!a/", "/a", "b/", "/b/", "*.log", "!keep.log", "x/*", "!x/keep",
    "**/c", "a/**", "a/**/d", "!a/**/d", "[ab]*", "?.md", "*", "!*/", "!*.md", "c/", "build", "d/*.txt",
    "/d/", "\\!bang", "#comment", "", "   ", "*.txt  ", "foo\\ ", "a*/", "ab**/c", "**/", "*/", "!**/keep*",
    "[!a]", "[[:digit:]]*", "d/**/e/", "logs/**", "!logs/keep.log", "e", "!e/", "x/", "!x/", "**/b/*",
    "[a-", "\\", "sub/a", "!sub/", "*.md/", "a?c",
]  # fmt: skip
_FUZZ_DIRS = ["a", "b", "c", "d", "e", "x", "build", "logs", "sub", "ab"]
_FUZZ_FILES = ["a", "b", "c", "e", "x.txt", "y.log", "keep.log", "keep", "keep.txt", "z.md", "1.dat", "!bang",
               "foo ", "abc", "#comment", "d.txt"]  # fmt: skip


def _random_tree(rng: random.Random, depth: int = 0) -> dict[str, TreeValue]:
    tree: dict[str, TreeValue] = {}
    for _ in range(rng.randint(2, 6)):
        if depth < 3 and rng.random() < 0.45:
            tree[rng.choice(_FUZZ_DIRS)] = _random_tree(rng, depth + 1)
        elif rng.random() < 0.05:
            tree[rng.choice(_FUZZ_FILES)] = Link(rng.choice(_FUZZ_DIRS))
        else:
            tree[rng.choice(_FUZZ_FILES)] = "x"
    if rng.random() < 0.6:
        tree[".gitignore"] = "\n".join(rng.choice(_FUZZ_PATTERNS) for _ in range(rng.randint(1, 6))) + "\n"
    return tree


@needs_git
@pytest.mark.parametrize("seed", range(40))
def test_random_gitignore_trees_match_git(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    root = make_tree(tmp_path / "ws", _random_tree(rng))
    assert_matches_git(root, tmp_path)


# ---------------------------------------------------------------- built-in categories


def test_builtin_categories_exclude_their_files(tmp_path: Path) -> None:
    root = make_tree(
        tmp_path / "ws",
        {
            "node_modules/lib/index.js": "x",
            "web/node_modules/x.js": "x",
            "build/out.js": "x",
            "Build/out.js": "x",
            "img.png": b"\x89PNG",
            "photos/IMG_0001.JPG": b"jpg",
            "app.log": "x",
            "Cargo.lock": "x",
            "deps.lock": "x",
            ".env": "SECRET=1",
            ".env.local": "SECRET=1",
            "prod.env": "SECRET=1",
            "settings.local": "x",
            "data/points.csv": "1,2",
            "dist.tar.gz": b"gz",
            "db.sqlite3": b"db",
            "__pycache__/m.cpython-311.pyc": b"pyc",
            "pkg.egg-info/PKG-INFO": "x",
            "src/main.py": "print()",
            "src/app.environment.ts": "export {}",
            "src/build.py": "x",
            "README.md": "x",
        },
    )
    # Type patterns ignore case (IMG_0001.JPG); names do not (`Build/` is not `build/`).
    # Dependency lock files are snapshotted although `*.lock` is left out (SPEC §4).
    assert walked(root) == {"src/main.py", "src/app.environment.ts", "src/build.py", "README.md", "Build/out.js",
                            "Cargo.lock"}
    rules = ExclusionRules(root)
    reasons = {
        "img.png": "builtin:media",
        "photos/IMG_0001.JPG": "builtin:media",
        "app.log": "builtin:cache_and_logs",
        "deps.lock": "builtin:cache_and_logs",
        ".env": "builtin:environment",
        ".env.local": "builtin:environment",
        "prod.env": "builtin:environment",
        "settings.local": "builtin:environment",
        "data/points.csv": "builtin:geodata",
        "dist.tar.gz": "builtin:archives_and_binaries",
        "db.sqlite3": "builtin:databases",
        "node_modules/lib/index.js": "builtin:dependencies_and_build",
        "web/node_modules/x.js": "builtin:dependencies_and_build",
    }
    for path, reason in reasons.items():
        assert rules.excluded_reason(RepoPath(path), is_dir=False) == reason, path
    assert rules.excluded_reason(RepoPath("src/main.py"), is_dir=False) is None


def test_builtin_list_is_data_with_the_spec_categories() -> None:
    required = {
        "vcs": {".git/"},
        "dependencies_and_build": {"node_modules/", "dist/", "build/", "out/", "bin/", "obj/", "vendor/",
                                   "venv/", ".venv/", "coverage/", ".vscode/", ".idea/", "__pycache__/"},
        "media": {"*.png", "*.jpg", "*.gif", "*.mp4", "*.mp3"},
        "cache_and_logs": {"*.log", "*.lock", "*.tmp"},
        "environment": {"*.local"},
        "archives_and_binaries": {"*.zip", "*.exe", "*.dll"},
        "databases": {"*.db", "*.sqlite"},
        "geodata": {"*.csv", "*.shp", "*.geojson"},
    }  # fmt: skip
    for category, patterns in required.items():
        assert patterns <= set(BUILTIN_EXCLUSIONS[category]), category
    flat = [p for patterns in BUILTIN_EXCLUSIONS.values() for p in patterns]
    assert len(flat) == len(set(flat)), "a pattern belongs to one category"


def test_builtin_dir_pattern_spares_files_and_symlinks_of_that_name(tmp_path: Path) -> None:
    root = make_tree(tmp_path / "ws", {"notes/build": "a file", "target": Link("notes")})
    assert walked(root) == {"notes/build", "target"}


def test_extra_patterns_are_root_anchored_gitignore_lines(tmp_path: Path) -> None:
    root = make_tree(
        tmp_path / "ws",
        {
            "generated/a.py": "x",
            "src/generated/b.py": "x",
            "snap/x.snap": "x",
            "snap/keep.snap": "x",
            "src/c.py": "x",
        },
    )
    extra = ["/generated/", "*.snap", "!keep.snap"]
    assert walked(root, extra=extra) == {"src/generated/b.py", "snap/keep.snap", "src/c.py"}
    rules = ExclusionRules(root, extra=extra)
    assert rules.excluded_reason(RepoPath("generated/a.py"), is_dir=False) == "extra"
    assert rules.excluded_reason(RepoPath("snap/x.snap"), is_dir=False) == "extra"


def test_gitignore_reason_names_the_rule_file(tmp_path: Path) -> None:
    root = make_tree(tmp_path / "ws", {"sub/.gitignore": "*.gen\n", "sub/x/a.gen": "x", "a.gen": "x"})
    rules = ExclusionRules(root, builtin={})
    assert rules.excluded_reason(RepoPath("sub/x/a.gen"), is_dir=False) == "gitignore:sub/.gitignore"
    assert rules.excluded_reason(RepoPath("a.gen"), is_dir=False) is None


# ---------------------------------------------------------------- Git LFS


LFS_ATTRIBUTES = (
    "# git lfs track output, and hand-written variants\n"
    "*.pt filter=lfs diff=lfs merge=lfs -text\n"
    "assets/*.bin\tfilter=lfs\tdiff=lfs\tmerge=lfs\t-text\n"
    '"my file.dat" filter=lfs diff=lfs merge=lfs -text\n'
    "my[[:space:]]model.onnx filter=lfs diff=lfs merge=lfs -text\n"
    "[attr]big filter=lfs diff=lfs merge=lfs -text\n"
    "*.ckpt big\n"
    "small.pt -filter\n"
    "*.txt text eol=lf\n"
    "/anchored.weights filter=lfs\n"
)


@needs_git
def test_lfs_patterns_of_root_gitattributes_match_git_check_attr(tmp_path: Path) -> None:
    root = make_tree(
        tmp_path / "ws",
        {
            ".gitattributes": LFS_ATTRIBUTES,
            "model.pt": "x",
            "small.pt": "x",
            "deep/w.pt": "x",
            "assets/a.bin": "x",
            "assets/sub/b.bin": "x",
            "my file.dat": "x",
            "other file.dat": "x",
            "my model.onnx": "x",
            "run.ckpt": "x",
            "anchored.weights": "x",
            "sub/anchored.weights": "x",
            "notes.txt": "x",
            "sub/.gitattributes": "*.md filter=lfs\n",
            "sub/readme.md": "nested .gitattributes files are not read",
        },
    )
    rules = ExclusionRules(root, builtin={})
    files, _ = all_paths(root)
    ours = {p for p in files if rules.excluded_reason(RepoPath(p), is_dir=False) == "lfs"}
    env = git_env(tmp_path)
    git(root, env, "init", "-q", "--template=", ".")
    (root / "sub/.gitattributes").unlink()  # git would read it; the spec says root only
    out = git(root, env, "check-attr", "-z", "--stdin", "filter", stdin=b"\0".join(map(os.fsencode, files)))
    fields = out.split(b"\0")
    theirs = {os.fsdecode(fields[i]) for i in range(0, len(fields) - 2, 3) if fields[i + 2] == b"lfs"}
    theirs.discard("sub/.gitattributes")
    assert ours == theirs
    assert ours == {
        "model.pt", "deep/w.pt", "assets/a.bin", "my file.dat", "my model.onnx", "run.ckpt", "anchored.weights",
    }  # fmt: skip
    assert walked(root, builtin={}).isdisjoint(ours)


def test_lfs_reads_only_the_root_file_and_applies_to_files(tmp_path: Path) -> None:
    root = make_tree(
        tmp_path / "ws",
        {".gitattributes": "*.bin filter=lfs\n", "x.bin/inner.txt": "a folder named like the pattern", "y.bin": "x"},
    )
    assert walked(root, builtin={}) == {".gitattributes", "x.bin/inner.txt"}


# ---------------------------------------------------------------- .git and nested repositories


def test_user_git_and_nested_repos_are_excluded_whole(tmp_path: Path) -> None:
    root = make_tree(
        tmp_path / "ws",
        {
            ".git/HEAD": "ref: refs/heads/main\n",
            ".git/config": "[core]\n",
            "app.py": "x",
            "vendored/.git/HEAD": "ref: refs/heads/main\n",
            "vendored/lib.py": "x",
            "worktree/.git": "gitdir: /elsewhere/.git/worktrees/w\n",
            "worktree/code.py": "x",
            "libs/mod/code.py": "x",
            "libs/other/code.py": "x",
            ".gitmodules": '[submodule "mod"]\n\tpath = libs/mod\n\turl = https://example.invalid/m.git\n'
            '[submodule "quoted"]\n\tpath = "q dir" ; comment\n',
            "q dir/x.py": "x",
        },
    )
    assert walked(root) == {"app.py", "libs/other/code.py", ".gitmodules"}
    rules = ExclusionRules(root)
    assert rules.excluded_reason(RepoPath("vendored"), is_dir=True) == "nested_repo"
    assert rules.excluded_reason(RepoPath("vendored/lib.py"), is_dir=False) == "nested_repo"
    assert rules.excluded_reason(RepoPath("worktree/code.py"), is_dir=False) == "nested_repo"
    assert rules.excluded_reason(RepoPath("libs/mod/code.py"), is_dir=False) == "submodule"
    assert rules.excluded_reason(RepoPath("q dir/x.py"), is_dir=False) == "submodule"
    assert rules.excluded_reason(RepoPath(".git/HEAD"), is_dir=False) == "git_dir"
    assert rules.excluded_reason(RepoPath("libs"), is_dir=True) is None
    assert list(rules.walk(RepoPath("vendored"))) == []
    assert list(rules.walk(RepoPath("libs/mod"))) == []
    assert [rules.is_nested_repo(RepoPath(p)) for p in ("vendored", "worktree", "libs/mod", "libs", "")] == [
        True, True, True, False, False,
    ]  # fmt: skip


def test_git_lookalikes_in_any_case_are_excluded(tmp_path: Path) -> None:
    root = make_tree(
        tmp_path / "ws",
        {".GIT/config": "x", "sub/.Git": "a file", "sub/keep.py": "x", "x/.git.txt": "not a git dir"},
    )
    rules = ExclusionRules(root)
    assert rules.excluded_reason(RepoPath(".GIT/config"), is_dir=False) == "git_dir"
    assert rules.excluded_reason(RepoPath("sub/.Git"), is_dir=False) == "git_dir"
    case_insensitive_fs = (root / "sub/.git").exists()
    expected = {"x/.git.txt"} if case_insensitive_fs else {"x/.git.txt", "sub/keep.py"}
    assert walked(root) == expected
    assert rules.is_nested_repo(RepoPath("sub")) is case_insensitive_fs


def test_symlink_to_folder_is_a_leaf_never_followed(tmp_path: Path) -> None:
    outside = make_tree(tmp_path / "outside", {"secret.py": "x"})
    root = make_tree(tmp_path / "ws", {"real/a.py": "x", "link": Link("real"), "out": Link(str(outside))})
    rules = ExclusionRules(root)
    entries = {str(p): e for p, e in rules.walk()}
    assert set(entries) == {"real/a.py", "link", "out"}
    assert entries["link"].is_symlink() and entries["out"].is_symlink()
    assert rules.excluded_reason(RepoPath("link/a.py"), is_dir=False) == "beyond_symlink"
    assert list(rules.walk(RepoPath("link"))) == []


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no fifos here")
def test_fifos_are_yielded_and_a_fifo_gitignore_does_not_block(tmp_path: Path) -> None:
    root = make_tree(tmp_path / "ws", {"sub/a.py": "x"})
    os.mkfifo(root / "pipe")
    os.mkfifo(root / "sub" / ".gitignore")
    assert walked(root) == {"pipe", "sub/a.py", "sub/.gitignore"}


# ---------------------------------------------------------------- single paths, caches, safety


def _rich_random_tree(seed: int) -> dict[str, TreeValue]:
    rng = random.Random(seed)
    return {
        "r": _random_tree(rng),
        ".gitignore": "r/**/keep.log\n",
        ".gitattributes": "*.pt filter=lfs\n",
        "m.pt": "x",
        "node_modules/x/y.js": "x",
        "img/a.png": "x",
        "nested/.git/HEAD": "x",
        "nested/a.py": "x",
        "link": Link("sub"),
        "sub/z.py": "x",
    }


@pytest.mark.parametrize("seed", range(8))
def test_is_excluded_agrees_with_walk_on_every_path(tmp_path: Path, seed: int) -> None:
    root = make_tree(tmp_path / "ws", _rich_random_tree(seed))
    walker = ExclusionRules(root)
    included = {str(p) for p, _ in walker.walk()}
    files, dirs = all_paths(root)
    assert included <= files and "nested/a.py" not in included and "sub/z.py" in included
    for rules in (walker, ExclusionRules(root)):  # warm cache from the walk, and a cold one
        for path in sorted(files):
            assert rules.is_excluded(RepoPath(path), is_dir=False) == (path not in included), path
        for path in sorted(dirs):
            if any(p.startswith(f"{path}/") for p in included):
                assert not rules.is_excluded(RepoPath(path), is_dir=True), path
            if rules.is_excluded(RepoPath(path), is_dir=True):
                assert list(rules.walk(RepoPath(path))) == [], path


def test_walk_from_a_subfolder_applies_ancestor_rules(tmp_path: Path) -> None:
    root = make_tree(
        tmp_path / "ws",
        {".gitignore": "*.gen\n", "src/a.py": "x", "src/b.gen": "x", "src/pkg/c.py": "x", "top.py": "x"},
    )
    rules = ExclusionRules(root)
    assert {str(p) for p, _ in rules.walk(RepoPath("src"))} == {"src/a.py", "src/pkg/c.py"}
    assert list(rules.walk(RepoPath("src/a.py"))) == []
    make_tree(root, {"node_modules/x.js": "x"})
    assert list(rules.walk(RepoPath("node_modules"))) == []


def test_invalidate_picks_up_new_rule_files_and_repos(tmp_path: Path) -> None:
    root = make_tree(tmp_path / "ws", {"sub/a.gen": "x", "lib/x.py": "x", "w.pt": "x"})
    rules = ExclusionRules(root, builtin={})
    for path in ("sub/a.gen", "lib/x.py", "w.pt"):
        assert not rules.is_excluded(RepoPath(path), is_dir=False)

    (root / "sub/.gitignore").write_text("*.gen\n")
    rules.invalidate(RepoPath("sub/.gitignore"))
    assert rules.excluded_reason(RepoPath("sub/a.gen"), is_dir=False) == "gitignore:sub/.gitignore"

    (root / "sub/.gitignore").write_text("")
    rules.invalidate(RepoPath("sub"))  # the folder holding the rule file works too
    assert not rules.is_excluded(RepoPath("sub/a.gen"), is_dir=False)

    (root / "lib/.git").mkdir()
    rules.invalidate(RepoPath("lib/.git"))
    assert rules.excluded_reason(RepoPath("lib/x.py"), is_dir=False) == "nested_repo"
    assert rules.is_nested_repo(RepoPath("lib"))

    (root / ".gitattributes").write_text("*.pt filter=lfs\n")
    rules.invalidate(RepoPath(".gitattributes"))
    assert rules.excluded_reason(RepoPath("w.pt"), is_dir=False) == "lfs"


def test_walk_and_checks_never_modify_the_tree(tmp_path: Path) -> None:
    root = make_tree(tmp_path / "ws", _rich_random_tree(7))
    make_tree(root, {"nested/.git/config": "[core]\n", "nested/.git/objects/ab/cdef": b"\x00\x01"})
    os.chmod(root / "nested/.git", 0o755)
    before = tree_digest(root)
    rules = ExclusionRules(root)
    list(rules.walk())
    list(rules.walk(RepoPath("sub")))
    for path in all_paths(root)[0]:
        rules.is_excluded(RepoPath(path), is_dir=False)
    rules.is_nested_repo(RepoPath("nested"))
    rules.invalidate(RepoPath(""))
    list(rules.walk())
    assert tree_digest(root) == before
    assert (root / "nested/.git/HEAD").is_file()


# ---------------------------------------------------------------- walk_folders: listings reused


def folders_walked(rules: ExclusionRules) -> set[str]:
    return {prefix + name for prefix, joined, _ in rules.walk_folders() for name in joined.split(NAME_SEP)}


def _settle() -> None:
    """Until the coarse file clock has moved on, so a later change gives a folder new times
    (a condition on the clock itself: a probe file's mtime changes, not a delay)."""
    with tempfile.TemporaryDirectory() as tmp:
        probe = Path(tmp) / "probe"
        probe.touch()
        first = probe.stat().st_mtime_ns
        while probe.stat().st_mtime_ns == first:
            probe.touch()


@pytest.fixture
def trusting(monkeypatch: pytest.MonkeyPatch) -> None:
    """Trust listings at once (no 1 s racy margin), so a test can reach the reuse path."""
    monkeypatch.setattr(exclusions, "_RACY_MARGIN_NS", 0)


@pytest.mark.usefixtures("trusting")
def test_walk_folders_reuses_listings_and_sees_every_change(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = make_tree(tmp_path / "ws", _rich_random_tree(11))
    make_tree(root, {"src/a.py": "a", "src/deep/b.py": "b", "docs/x.md": "x", ".gitignore": "*.log\n"})
    rules = ExclusionRules(root)
    assert folders_walked(rules) == walked(root)
    _settle()
    assert _count_scandirs(rules, monkeypatch) == 0  # an unchanged tree: no folder read again

    changes: list[tuple[str, object]] = [
        ("new file", lambda: (root / "src/deep/c.py").write_text("c")),
        ("deleted file", lambda: (root / "src/a.py").unlink()),
        ("nested .gitignore added", lambda: (root / "src/.gitignore").write_text("deep/\n")),
        ("nested .gitignore edited in place", lambda: (root / "src/.gitignore").write_text("*.py\n")),
        ("root .gitignore edited in place", lambda: (root / ".gitignore").write_text("docs/\n")),
        ("LFS pattern added", lambda: (root / ".gitattributes").write_text("*.md filter=lfs -text\n")),
        ("nested repository appears", lambda: (root / "src/deep/.git").mkdir()),
        ("folder renamed", lambda: (root / "docs").rename(root / "manual")),
        ("file then folder times set back", lambda: _add_and_reset_times(root / "manual", "hidden.txt")),
    ]
    for label, change in changes:
        _settle()
        change()  # type: ignore[operator]
        _settle()
        assert folders_walked(rules) == walked(root), label


def _add_and_reset_times(folder: Path, name: str) -> None:
    st = folder.stat()
    (folder / name).write_text("new")
    os.utime(folder, ns=(st.st_atime_ns, st.st_mtime_ns))  # mtime back; the ctime still moves


def _count_scandirs(rules: ExclusionRules, monkeypatch: pytest.MonkeyPatch) -> int:
    """How many folders one `rules.walk_folders()` reads from disk."""
    calls = 0
    real = os.scandir

    def counting(path: str) -> object:
        nonlocal calls
        calls += 1
        return real(path)

    with monkeypatch.context() as patch:
        patch.setattr(os, "scandir", counting)
        list(rules.walk_folders())
    return calls


@pytest.mark.usefixtures("trusting")
def test_a_walk_with_stats_gives_each_listed_files_lstat(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`walk_folders(stats=True)` (a baseline's) yields what a walk without them yields, with
    each file's lstat where it listed the folder anew (its entries' types read from those:
    a symlink to a folder is a file, a `.gitignore` that is a folder no rule file), None
    where it reused a listing; an entry gone between the listing and its lstat is left out."""
    root = make_tree(tmp_path / "ws", {**_rich_random_tree(5), "src/a.py": "a", "src/deep/b.py": "b",
                                       "odd/.gitignore/x.txt": "x", "odd/keep.log": "k", ".gitignore": "*.log\n"})
    (root / "src" / "link").symlink_to("deep")
    plain = [(prefix, joined) for prefix, joined, _ in ExclusionRules(root).walk_folders(keep=False)]
    rules = ExclusionRules(root)
    listed = list(rules.walk_folders(stats=True))
    assert [(prefix, joined) for prefix, joined, _ in listed] == plain
    assert "src/link" in {prefix + name for prefix, joined in plain for name in joined.split(NAME_SEP)}
    assert "odd/.gitignore/x.txt" in {prefix + name for prefix, joined in plain for name in joined.split(NAME_SEP)}
    for prefix, joined, stats in listed:
        assert stats is not None
        for name, st in zip(joined.split(NAME_SEP), stats, strict=True):
            want = os.lstat(root / (prefix + name))
            assert (st.st_ino, st.st_mode, st.st_mtime_ns) == (want.st_ino, want.st_mode, want.st_mtime_ns), name
    _settle()
    assert all(stats is None for _, _, stats in rules.walk_folders(stats=True))  # every listing reused
    real_lstat = os.lstat

    def vanishing(path: Any, *args: Any, **kwargs: Any) -> os.stat_result:
        if path == "a.py":
            raise FileNotFoundError(path)  # removed between the folder's listing and its lstat
        return real_lstat(path, *args, **kwargs)

    monkeypatch.setattr(os, "lstat", vanishing)
    fresh = {prefix + name for prefix, joined, _ in ExclusionRules(root).walk_folders(keep=False, stats=True)
             for name in joined.split(NAME_SEP)}
    assert "src/a.py" not in fresh and "src/deep/b.py" in fresh


def test_walk_folders_lists_again_what_changed_within_the_racy_margin(tmp_path: Path) -> None:
    root = make_tree(tmp_path / "ws", {"a/x.txt": "x", "b/y.txt": "y"})
    rules = ExclusionRules(root)
    assert folders_walked(rules) == {"a/x.txt", "b/y.txt"}
    # listed right after they were made: not trusted, so a same-tick addition is still seen
    (root / "a/z.txt").write_text("z")
    assert folders_walked(rules) == {"a/x.txt", "a/z.txt", "b/y.txt"}


def test_unwalked_finds_exactly_the_paths_a_walk_did_not_yield(tmp_path: Path) -> None:
    """`unwalked` looks paths up in the walk's own (prefix, joined names) pairs: a name that is
    part of another name, or the first or last of its folder, is told apart exactly; a real
    walk agrees with the set of paths it yielded."""
    walked_pairs = [("", NAME_SEP.join(["ab", "b.txt", "c"])), ("d/", "x"), ("d/e/", NAME_SEP.join(["xy", "z"]))]
    paths = ["ab", "a", "b", "b.txt", "c", "ab.txt", "d/x", "d/xy", "d/e/xy", "d/e/x", "d/e/z", "f/x", "d/e"]
    assert exclusions.unwalked(paths, walked_pairs) == ["a", "b", "ab.txt", "d/xy", "d/e/x", "f/x", "d/e"]
    root = make_tree(tmp_path / "ws", {"a/b.txt": "1", "a/bb.txt": "2", "node_modules/m.js": "3", "top": "4",
                                       ".gitignore": "*.log\n", "k.log": "5"})
    pairs = [(prefix, joined) for prefix, joined, _ in ExclusionRules(root).walk_folders()]
    yielded = {prefix + name for prefix, joined in pairs for name in joined.split(NAME_SEP)}
    candidates = ["a/b.txt", "a/bb.txt", "a/b", "node_modules/m.js", "top", "k.log", "gone", ".gitignore"]
    assert exclusions.unwalked(candidates, pairs) == [p for p in candidates if p not in yielded]
    assert "a/b.txt" in yielded and "node_modules/m.js" not in yielded


def test_walk_folders_without_keep_yields_the_same_and_keeps_nothing(tmp_path: Path) -> None:
    """`keep=False` (the verifier's walks) yields what a keeping walk yields, and leaves no
    listing or folder decision behind, also none an earlier keeping walk made."""
    root = make_tree(tmp_path / "ws", {"a/b.txt": "1", "a/c/d.txt": "2", "node_modules/m.js": "3",
                                       "e/.gitignore": "*.tmp\n", "e/x.tmp": "4", "e/y.txt": "5"})
    rules = ExclusionRules(root)
    kept = folders_walked(rules)
    assert rules._listings and rules._dirs
    unkept = {prefix + name for prefix, joined, _ in rules.walk_folders(keep=False) for name in joined.split(NAME_SEP)}
    assert unkept == kept == {"a/b.txt", "a/c/d.txt", "e/.gitignore", "e/y.txt"}
    assert not rules._listings and set(rules._dirs) <= {""}  # the root's own rules only
    assert rules.is_excluded(RepoPath("e/z.tmp"), is_dir=False)  # single checks still decide


@pytest.mark.usefixtures("trusting")
def test_walk_folders_walks_in_name_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each folder's names in order, its sub-folders walked in order: a baseline's paths come
    nearly sorted, which its sort of every path (for the trees) takes in a fraction of the time."""
    names = ["m.py", "a.py", "Z.txt", "b-c.py", "b.py", "k/x.py", "c/y.py", "c/a/z.py", "c.txt"]
    root = make_tree(tmp_path / "ws", {name: name for name in names})
    rules = ExclusionRules(root)
    list(rules.walk_folders())
    _settle()
    assert _count_scandirs(rules, monkeypatch) == 0  # the next walk reuses every listing
    for keep in (True, False):  # the listings reused, and read again
        pairs = list(rules.walk_folders(keep=keep))
        assert [prefix for prefix, _, _ in pairs] == ["", "c/", "c/a/", "k/"]
        assert pairs[0][1].split(NAME_SEP) == ["Z.txt", "a.py", "b-c.py", "b.py", "c.txt", "m.py"]


# ---------------------------------------------------------------- walk_folders split in two parts


def _part_files(rules: ExclusionRules, part: WalkPart | None) -> list[str]:
    return [prefix + name for prefix, joined, _ in rules.walk_folders(keep=False, part=part)
            for name in joined.split(NAME_SEP)]


@pytest.mark.parametrize("seed", [3, 11, 29])
def test_the_two_parts_of_a_split_walk_are_the_whole_walk(tmp_path: Path, seed: int) -> None:
    """A baseline split between two processes (scanner.py) walks each file exactly once, with
    the rules that reach it: a .gitignore above a unit still applies inside it."""
    root = make_tree(tmp_path / "ws", _rich_random_tree(seed))
    make_tree(root, {"r/.gitignore": "*.skip\n", "r/u/a.skip": "x", "r/u/b.py": "x", "r/u/deep/c.py": "x",
                     "r/v.py": "x", "top.py": "x"})
    whole = sorted(_part_files(ExclusionRules(root), None))
    assert "r/u/b.py" in whole and "r/u/a.skip" not in whole
    for units in ({"r/u"}, {"r"}, {"r/u", "img", "sub"}, {"no/such"}, {"r/u/deep"}):
        inside = _part_files(ExclusionRules(root), WalkPart(frozenset(units), inside=True))
        outside = _part_files(ExclusionRules(root), WalkPart(frozenset(units), inside=False))
        assert sorted(inside + outside) == whole, units  # every file once, none twice
        assert all(any(p.startswith(u + "/") for u in units) for p in inside), units


def test_halving_picks_folders_holding_about_half_of_the_paths() -> None:
    paths = sorted([f"big/sub{i}/f{j}" for i in range(6) for j in range(10)]  # 60: too big alone
                   + [f"mid/f{j}" for j in range(25)] + [f"small/f{j}" for j in range(5)]
                   + [f"root{j}" for j in range(10)] + [f"big/own{j}" for j in range(10)])
    part = WalkPart.halving(paths, inside=True)
    assert part is not None and part.inside
    held = [p for p in paths if any(p.startswith(u + "/") for u in part.units)]
    assert 0.4 * len(paths) <= len(held) <= 0.6 * len(paths)
    assert "big" not in part.units  # 70 of 110 paths: split into its sub-folders instead
    assert WalkPart.halving(sorted(f"flat{j}" for j in range(100)), inside=True) is None  # no folders
    assert WalkPart.halving(sorted(f"one/f{j}" for j in range(100)), inside=True) is None  # one folder of files


def test_halving_counts_only_what_the_walk_enters(tmp_path: Path) -> None:
    """A committed `node_modules` is in the index but never walked: its paths count for
    neither side, so the units hold about half of what is walked (the built-in rules say which
    folders are left out, at any depth the halving looks)."""
    paths = sorted([f"node_modules/p{i}/f{j}" for i in range(8) for j in range(10)]  # 80, never walked
                   + [f"big/sub{i}/f{j}" for i in range(4) for j in range(10)]
                   + [f"big/node_modules/f{j}" for j in range(30)]  # inside a folder split up
                   + [f"mid/f{j}" for j in range(20)] + [f"small/f{j}" for j in range(20)]
                   + [f"r{j}" for j in range(20)])
    rules = ExclusionRules(tmp_path)
    walked = [p for p in paths if "node_modules/" not in p]
    part = WalkPart.halving(paths, inside=True, left_out=rules.left_out_by_name)
    assert part is not None
    assert not any("node_modules" in unit for unit in part.units)
    held = [p for p in walked if any(p.startswith(u + "/") for u in part.units)]
    assert 0.45 * len(walked) <= len(held) <= 0.6 * len(walked), sorted(part.units)
    blind = WalkPart.halving(paths, inside=True)  # counted, node_modules would be a unit
    assert blind is not None and any("node_modules" in unit for unit in blind.units)
    assert rules.left_out_by_name("node_modules") and rules.left_out_by_name("big/node_modules")
    assert not rules.left_out_by_name("big") and rules.left_out_by_name("a/.git")


def test_in_nested_repo_is_any_folder_on_the_path_being_one(tmp_path: Path) -> None:
    """The one-pass check (a `.git` lookup per level) agrees with `is_nested_repo` on every
    prefix: repositories, a `.git` file, submodules, a symlink to a repository, a file named
    like a folder on the way, and paths that do not exist yet."""
    outside = make_tree(tmp_path / "outside", {".git/HEAD": "x", "in.py": "x"})
    root = make_tree(tmp_path / "ws", {
        "vendored/.git/HEAD": "x", "vendored/deep/lib.py": "x",
        "worktree/.git": "gitdir: /elsewhere", "worktree/code.py": "x",
        "libs/mod/code.py": "x", "libs/other/code.py": "x",
        ".gitmodules": '[submodule "mod"]\n\tpath = libs/mod\n\turl = https://example.invalid/m.git\n',
        "plain/file.py": "x", "plain/.git_not/x": "x",
    })
    os.symlink(outside, root / "plain" / "link")
    rules = ExclusionRules(root)
    for path in ("vendored", "vendored/deep/lib.py", "vendored/new/x.py", "worktree/code.py", "libs/mod/code.py",
                 "libs/mod", "libs/other/code.py", "libs", "plain/file.py", "plain/file.py/below",
                 "plain/link", "plain/link/in.py", "plain/.git_not/x", "missing/a/b.py", "app.py"):
        parts = path.split("/")
        expected = any(rules.is_nested_repo(RepoPath("/".join(parts[:i]))) for i in range(1, len(parts) + 1))
        assert rules.in_nested_repo(RepoPath(path)) is expected, path
    assert rules.in_nested_repo(RepoPath("vendored/deep/lib.py"))
    assert not rules.in_nested_repo(RepoPath("plain/link/in.py"))  # a symlink to a repository is not one


def test_in_nested_repo_skips_a_folder_only_while_its_stamp_holds(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Given the folders' lstat (a request's path check took them), a folder found without a
    `.git` is not looked into again while its times and inode are the same; a `.git` made in
    it, or the folder made anew, is found."""
    monkeypatch.setattr(exclusions, "_RACY_MARGIN_NS", 0)  # every folder old enough to be remembered
    root = make_tree(tmp_path / "ws", {"a/b/c.py": "x", "a/other.py": "x"})
    rules = ExclusionRules(root)
    looked: list[str] = []
    lstat = os.lstat

    def counting(path: Any, *args: Any, **kwargs: Any) -> os.stat_result:
        if str(path).endswith("/.git"):
            looked.append(str(path)[len(str(root)) + 1:])
        return lstat(path, *args, **kwargs)

    def folders() -> dict[str, os.stat_result]:
        return {f: lstat(root / f) for f in ("a", "a/b") if (root / f).exists()}

    monkeypatch.setattr(os, "lstat", counting)
    assert not rules.in_nested_repo(RepoPath("a/b/c.py"), folders())
    assert looked == ["a/.git", "a/b/.git", "a/b/c.py/.git"]
    looked.clear()
    assert not rules.in_nested_repo(RepoPath("a/b/c.py"), folders())
    assert looked == ["a/b/c.py/.git"]  # both folders unchanged: not looked into
    assert not rules.in_nested_repo(RepoPath("a/b/c.py"))  # without their lstat: every level
    (root / "a" / "b" / ".git").mkdir()
    looked.clear()
    assert rules.in_nested_repo(RepoPath("a/b/c.py"), folders())
    assert looked == ["a/b/.git"]  # a's stamp holds; a/b's moved
    shutil.rmtree(root / "a" / "b")
    shutil.rmtree(root / "a")
    make_tree(root, {"a/.git/HEAD": "x", "a/b/c.py": "x"})  # the folder made anew, a repository now
    assert rules.in_nested_repo(RepoPath("a/b/c.py"), folders())


SCREEN_GITIGNORE = (
    "*.tmp\n"          # a type
    "*~\n"             # an ending
    "*cache*\n"        # a needle
    "draft*\n"         # a prefix
    "Thumbs.db\n"      # a name
    "*.py[co]\n"       # a wildcard name
    "/top-only.txt\n"  # an anchored path
    "docs/*.old2\n"    # an anchored wildcard: its last part screens the names
    "*.zzz\n"
    "!keep.zzz\n"
)


def test_a_folders_names_screened_together_decide_as_each_alone(tmp_path: Path) -> None:
    """`ExclusionRules._undecided` keeps the entries no pattern may match without deciding them:
    every kind of pattern (built-in types in any case, a `.gitignore`'s names, prefixes,
    endings, wildcards, anchored paths) leaves out exactly what a decision per path does, in
    folders of plain names and of names that are not ASCII; and most names are not decided."""
    names = ["a.py", "b.tmp", "keep.tmp", "c~", "my_cache_dir.txt", "draft-1.md", "Thumbs.db", "x.pyc",
             "x.PYC", "IMG.PNG", "photo.png", "top-only.txt", "notes.old2", "plain.txt", "README", ".env.local",
             "node_modules", "x.ignored", "a.zzz", "A.ZZZ", "keep.zzz"]
    tree: dict[str, TreeValue] = {".gitignore": SCREEN_GITIGNORE}
    for folder in ("", "docs/", "src/deep/", "ünï/"):
        for name in names:
            tree[f"{folder}{name}"] = "x"
        tree[f"{folder}f{'é' if folder == 'ünï/' else ''}.txt"] = "x"
        tree.update({f"{folder}bulk/n{i:03d}.txt": "x" for i in range(40)})
    tree["ünï/bulk/café.txt"] = "x"
    root = make_tree(tmp_path / "ws", tree)
    rules = ExclusionRules(root)
    decided: list[str] = []
    real = rules._entry_reason

    def counted(info: object, rel: str, name: str, is_dir: bool) -> str | None:
        decided.append(rel)
        return real(info, rel, name, is_dir)  # type: ignore[arg-type]

    rules._entry_reason = counted  # type: ignore[method-assign]
    included = {str(p) for p, _ in rules.walk()}
    files, _ = all_paths(root)
    fresh = ExclusionRules(root)
    assert included == {p for p in files if not fresh.is_excluded(RepoPath(p), is_dir=False)}
    assert {"plain.txt", "keep.zzz", "A.ZZZ", "notes.old2", "src/deep/top-only.txt"} <= included
    assert not {"b.tmp", "a.zzz", "top-only.txt", "docs/notes.old2", "IMG.PNG", "c~", "docs/draft-1.md"} & included
    # the bulk folders' names were kept undecided; a folder with a name that is not ASCII decides each
    assert not any("/bulk/" in rel for rel in decided if not rel.startswith("ünï/"))
    assert any(rel.startswith("ünï/bulk/") for rel in decided)


def test_a_walk_tells_which_folders_hold_an_attributes_file(tmp_path: Path) -> None:
    """`lists_attributes`: from the walk's own listings (a baseline's proof then opens no
    `.gitattributes` that is not there), None for a folder the walk never listed."""
    root = make_tree(tmp_path / "ws", {".gitattributes": "*.md text\n", "a/x.txt": "x", "b/.gitattributes": "",
                                       "b/c/y.txt": "y", ".gitignore": "ignored/\n", "ignored/z.txt": "z"})
    rules = ExclusionRules(root)
    assert rules.lists_attributes("") is None
    list(rules.walk_folders())
    assert [rules.lists_attributes(f) for f in ("", "a", "b", "b/c", "ignored")] == [True, False, True, False, None]
    list(rules.walk_folders())  # the listings reused: the same answers
    assert [rules.lists_attributes(f) for f in ("", "a", "b", "b/c")] == [True, False, True, False]
