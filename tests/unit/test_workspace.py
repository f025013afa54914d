"""Unit tests for `shadowpoint.workspace`: the workspace hash, protected folders and `PathResolver`."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from shadowpoint.errors import NoWorkspaceError, PathOutsideWorkspaceError, ProtectedDirectoryError
from shadowpoint.workspace import (
    HASH_DIGITS,
    PathResolver,
    RepoPath,
    Workspace,
    canonical_root,
    open_workspaces,
    workspace_hash,
)


@pytest.fixture
def protected(tmp_path: Path) -> dict[str, Path]:
    home = tmp_path / "home"
    out = {"home": home}
    for name in ("Desktop", "Documents", "Downloads"):
        (home / name).mkdir(parents=True, exist_ok=True)
        out[name] = home / name
    return out


def one(root: Path, docs: Path) -> Workspace:
    return open_workspaces([root], docs, {})[0]


# ---- workspace hash ---------------------------------------------------------------------------


def test_hash_is_13_decimal_digits_and_stable(tmp_path: Path) -> None:
    paths = [tmp_path / "a", Path("/"), Path("/x/y/z"), tmp_path / "ünïcode dir"]
    for p in paths:
        h = workspace_hash(p)
        assert len(h) == HASH_DIGITS == 13
        assert h.isdigit() and h.isascii()
        assert workspace_hash(Path(str(p))) == h


def test_hash_differs_for_different_paths() -> None:
    hashes = {workspace_hash(Path(f"/work/project-{i}")) for i in range(2000)}
    assert len(hashes) == 2000
    assert workspace_hash(Path("/a/b")) != workspace_hash(Path("/a/b/c"))


def test_hash_is_the_sha256_derivation() -> None:
    import hashlib

    digest = hashlib.sha256(b"/some/workspace").digest()
    expected = str(int.from_bytes(digest[:16], "big") % 10**13).zfill(13)
    assert workspace_hash(Path("/some/workspace")) == expected


def test_open_workspaces_places_shadow_repo_under_docs(tmp_path: Path, workspace: Path) -> None:
    docs = tmp_path / "docs"
    ws = one(workspace, docs)
    assert ws.root == workspace
    assert ws.name == "proj"
    assert ws.hash == workspace_hash(workspace)
    assert ws.git_dir == docs / "checkpoints" / ws.hash / ".git"


def test_root_given_through_a_symlink_is_canonical(tmp_path: Path, workspace: Path) -> None:
    link = tmp_path / "alias"
    link.symlink_to(workspace)
    ws = one(link, tmp_path / "docs")
    assert ws.root == workspace
    assert ws.hash == workspace_hash(workspace)


# ---- roots that are refused -------------------------------------------------------------------


@pytest.mark.parametrize("name", ["home", "Desktop", "Documents", "Downloads"])
def test_protected_directories_refused_with_spec_message(protected: dict[str, Path], name: str) -> None:
    with pytest.raises(ProtectedDirectoryError) as info:
        canonical_root(protected[name], protected)
    assert str(info.value) == f"Cannot use checkpoints in {name} directory"
    assert info.value.kind == "protected_directory"


def test_protected_directory_reached_through_symlink_is_refused(tmp_path: Path, protected: dict[str, Path]) -> None:
    link = tmp_path / "docs-link"
    link.symlink_to(protected["Documents"])
    with pytest.raises(ProtectedDirectoryError, match="Documents"):
        canonical_root(link, protected)


def test_project_inside_protected_directory_is_fine(protected: dict[str, Path]) -> None:
    proj = protected["Documents"] / "proj"
    proj.mkdir()
    assert canonical_root(proj, protected) == Path(os.path.realpath(proj))


@pytest.mark.parametrize("folder", ["/", "/usr", "/etc", "/var", "/proc", "/sys", "/dev", "/tmp", "/proc/self"])
def test_root_and_system_folders_refused_before_any_scan(folder: str, tmp_path: Path) -> None:
    if not os.path.isdir(folder):
        pytest.skip(f"{folder} does not exist here")
    with pytest.raises(ProtectedDirectoryError) as info:
        open_workspaces([folder], tmp_path / "docs", {})
    assert re.fullmatch(r"Cannot use checkpoints in .+ directory", str(info.value))
    assert not (tmp_path / "docs").exists()


def test_projects_under_tmp_and_srv_stay_usable(tmp_path: Path) -> None:
    proj = tmp_path / "proj"
    proj.mkdir()
    assert canonical_root(proj, {}, tmp_path / "docs") == Path(os.path.realpath(proj))


def test_the_docs_root_and_its_ancestors_are_refused(tmp_path: Path) -> None:
    docs = tmp_path / "store" / "shadowpoint"
    docs.mkdir(parents=True)
    with pytest.raises(ProtectedDirectoryError, match="checkpoint store"):
        canonical_root(docs, {}, docs)
    with pytest.raises(ProtectedDirectoryError, match=r"holds the checkpoint store"):
        canonical_root(tmp_path / "store", {}, docs)
    with pytest.raises(ProtectedDirectoryError, match=r"holds the checkpoint store"):
        canonical_root(tmp_path, {}, docs)
    inside = docs / "checkpoints"
    inside.mkdir()
    with pytest.raises(ProtectedDirectoryError, match="checkpoint store"):
        canonical_root(inside, {}, docs)


@pytest.mark.parametrize("raw", ["", "   "])
def test_empty_root_is_no_workspace(raw: str, protected: dict[str, Path]) -> None:
    with pytest.raises(NoWorkspaceError) as info:
        canonical_root(raw, protected)
    assert str(info.value) == (
        "No workspace detected. Please open shadowpoint in a workspace to use checkpoints."
    )


def test_missing_or_file_root_is_no_workspace(tmp_path: Path, protected: dict[str, Path]) -> None:
    (tmp_path / "file").write_text("x")
    for raw in (tmp_path / "missing", tmp_path / "file"):
        with pytest.raises(NoWorkspaceError):
            canonical_root(raw, protected)
    with pytest.raises(NoWorkspaceError):
        open_workspaces([], tmp_path / "docs", protected)


# ---- PathResolver, one root -------------------------------------------------------------------


@pytest.fixture
def resolver(tmp_path: Path, workspace: Path) -> PathResolver:
    return PathResolver([one(workspace, tmp_path / "docs")])


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("a.txt", "a.txt"),
        ("src/a.py", "src/a.py"),
        ("./src//a.py", "src/a.py"),
        ("src/../b.py", "b.py"),
        ("src/x/../../c", "c"),
        ("new/dir/that/does/not/exist.txt", "new/dir/that/does/not/exist.txt"),
        (".gitignore", ".gitignore"),
        (".github/workflows/ci.yml", ".github/workflows/ci.yml"),
        ("a.git/x", "a.git/x"),
    ],
)
def test_relative_paths_resolve(resolver: PathResolver, raw: str, expected: str) -> None:
    ws, rel = resolver.resolve(raw)
    assert ws is resolver.workspaces[0]
    assert rel == expected


def test_absolute_path_inside_root_resolves(resolver: PathResolver, workspace: Path) -> None:
    assert resolver.resolve(str(workspace / "src" / "a.py"))[1] == "src/a.py"
    assert resolver.resolve(str(workspace) + "/x/../y")[1] == "y"


@pytest.mark.parametrize(
    "raw",
    ["..", "../x", "a/../../x", "a/b/../../../x", ".", "./", "", "a\0b"],
)
def test_escaping_relative_paths_refused(resolver: PathResolver, raw: str) -> None:
    with pytest.raises(PathOutsideWorkspaceError) as info:
        resolver.resolve(raw)
    assert info.value.kind == "path_outside_workspace"


def test_absolute_paths_outside_refused(resolver: PathResolver, workspace: Path, tmp_path: Path) -> None:
    for raw in (
        "/etc/passwd",
        str(tmp_path / "elsewhere" / "x"),
        str(workspace),  # the root itself is not a file path
        str(workspace) + "-sibling/x",  # a sibling sharing the root's name as a prefix
        str(workspace) + "/../outside",
        str(workspace) + "/a/../../outside",
    ):
        with pytest.raises(PathOutsideWorkspaceError):
            resolver.resolve(raw)


@pytest.mark.parametrize("raw", [".git", ".git/config", "a/.git/HEAD", ".GIT/config", "sub/.Git", "x/.gIt/y/z"])
def test_git_components_refused_in_any_case(resolver: PathResolver, raw: str) -> None:
    with pytest.raises(PathOutsideWorkspaceError, match=r"\.git"):
        resolver.resolve(raw)


def test_git_component_refused_in_absolute_path(resolver: PathResolver, workspace: Path) -> None:
    with pytest.raises(PathOutsideWorkspaceError):
        resolver.resolve(str(workspace / ".GIT" / "hooks" / "pre-commit"))


def test_symlinked_parent_leading_outside_refused(resolver: PathResolver, workspace: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (workspace / "out").symlink_to(outside)
    (workspace / "deep" / "er").mkdir(parents=True)
    (workspace / "deep" / "er" / "up").symlink_to("../../..")
    for raw in ("out/file.txt", "out/sub/file.txt", str(workspace / "out" / "x"), "deep/er/up/z"):
        with pytest.raises(PathOutsideWorkspaceError, match="symlink"):
            resolver.resolve(raw)


def test_symlinked_parent_staying_inside_is_fine(resolver: PathResolver, workspace: Path) -> None:
    (workspace / "real").mkdir()
    (workspace / "alias").symlink_to("real")
    assert resolver.resolve("alias/file.txt")[1] == "alias/file.txt"


def test_final_component_symlink_leading_outside_is_the_link_itself(
    resolver: PathResolver, workspace: Path, tmp_path: Path
) -> None:
    # the link is a workspace entry of its own; only parents are followed
    (workspace / "link").symlink_to(tmp_path)
    assert resolver.resolve("link")[1] == "link"


def test_resolver_with_alias_base(tmp_path: Path, workspace: Path) -> None:
    ws = one(workspace, tmp_path / "docs")
    res = PathResolver([ws], aliases={ws.name: ["/mnt/alias/proj"]})
    assert res.resolve("/mnt/alias/proj/a/b.txt") == (ws, "a/b.txt")
    with pytest.raises(PathOutsideWorkspaceError):
        res.resolve("/mnt/alias/projX/a")


def test_absolute_path_through_a_symlinked_root_resolves(tmp_path: Path, workspace: Path) -> None:
    """A host that was given the root as a symlink (macOS /tmp) sends absolute paths through it."""
    alias = tmp_path / "alias"
    alias.symlink_to(workspace)
    ws = one(alias, tmp_path / "docs")
    res = PathResolver([ws])
    assert res.resolve(str(alias / "src" / "a.py")) == (ws, "src/a.py")
    assert res.resolve(str(alias / "new" / "dir" / "f")) == (ws, "new/dir/f")
    outside = tmp_path / "outside"
    outside.mkdir()
    (workspace / "out").symlink_to(outside)
    for bad in (str(alias / ".git" / "config"), str(alias / "out" / "x"), str(alias), str(alias) + "/../x",
                str(tmp_path / "aliasx" / "y")):
        with pytest.raises(PathOutsideWorkspaceError):
            res.resolve(bad)


# ---- several roots ----------------------------------------------------------------------------


@pytest.fixture
def two_roots(tmp_path: Path) -> PathResolver:
    a = tmp_path / "one" / "app"
    b = tmp_path / "two" / "lib"
    a.mkdir(parents=True)
    b.mkdir(parents=True)
    return PathResolver(open_workspaces([a, b], tmp_path / "docs", {}))


def test_multi_root_relative_paths_need_a_root_prefix(two_roots: PathResolver) -> None:
    app, lib = two_roots.workspaces
    assert two_roots.multi
    assert two_roots.resolve("app/src/x.py") == (app, "src/x.py")
    assert two_roots.resolve("lib/y.py") == (lib, "y.py")
    for raw in ("src/x.py", "other/x", "app", "app/", "app/../../x"):
        with pytest.raises(PathOutsideWorkspaceError):
            two_roots.resolve(raw)


def test_a_root_itself_resolves_only_where_asked(resolver: PathResolver, two_roots: PathResolver,
                                                  workspace: Path) -> None:
    """A restore's `paths` may name a root (a folder stands for the files under it): "" then;
    a tool's path never (the root is no file)."""
    for raw in (".", "./", str(workspace), str(workspace) + "/", str(workspace) + "/a/.."):
        assert resolver.resolve(raw, root_ok=True)[1] == ""
        with pytest.raises(PathOutsideWorkspaceError):
            resolver.resolve(raw)
    for raw in ("..", "../x", str(workspace) + "/..", str(workspace) + "-sibling", ".git"):
        with pytest.raises(PathOutsideWorkspaceError):
            resolver.resolve(raw, root_ok=True)
    app, lib = two_roots.workspaces
    assert two_roots.resolve("lib", root_ok=True) == (lib, "")
    assert two_roots.resolve(str(app.root), root_ok=True) == (app, "")
    for raw in (".", "other"):
        with pytest.raises(PathOutsideWorkspaceError):
            two_roots.resolve(raw, root_ok=True)


def test_multi_root_absolute_paths_pick_their_root(two_roots: PathResolver) -> None:
    app, lib = two_roots.workspaces
    assert two_roots.resolve(str(lib.root / "z" / "w.txt")) == (lib, "z/w.txt")
    assert two_roots.resolve(str(app.root / "q")) == (app, "q")


def test_multi_root_display_prefixes_name(two_roots: PathResolver) -> None:
    app, lib = two_roots.workspaces
    assert two_roots.display(app, RepoPath("src/x.py")) == "app/src/x.py"
    assert two_roots.display(lib, RepoPath("y")) == "lib/y"
    assert two_roots.by_name("lib") is lib
    with pytest.raises(KeyError):
        two_roots.by_name("nope")


def test_single_root_display_is_unprefixed(resolver: PathResolver) -> None:
    assert resolver.display(resolver.workspaces[0], RepoPath("src/x.py")) == "src/x.py"


def test_root_names_made_unique(tmp_path: Path) -> None:
    roots = []
    for parent in ("a", "b", "c"):
        r = tmp_path / parent / "proj"
        r.mkdir(parents=True)
        roots.append(r)
    (tmp_path / "proj-2").mkdir()
    roots.append(tmp_path / "proj-2")
    wss = open_workspaces(roots, tmp_path / "docs", {})
    names = [w.name for w in wss]
    assert len(set(names)) == len(names) == 4
    assert names[:3] == ["proj", "proj-2", "proj-3"]
    assert len({w.hash for w in wss}) == 4
    assert len({w.git_dir for w in wss}) == 4
