"""Unit tests for `shadowpoint.restore.safe_fs`: real temp dirs, with an `outside/` canary next to the workspace."""

from __future__ import annotations

import errno
import hashlib
import itertools
import os
import stat
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from structlog.testing import capture_logs

from shadowpoint.errors import NoWorkspaceError, PathOutsideWorkspaceError, RestoreFailedError
from shadowpoint.restore.safe_fs import TEMP_PREFIX, FileRead, SafeWriter, cleanup_temp_files
from shadowpoint.workspace import RepoPath

# ---- helpers ---------------------------------------------------------------------------------


def snapshot(root: Path) -> dict[str, object]:
    """Every entry under root without following links: dirs end in '/', files carry content and mode."""
    out: dict[str, object] = {}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for name in dirnames + filenames:
            full = Path(dirpath, name)
            rel = full.relative_to(root).as_posix()
            st_ = full.lstat()
            if stat.S_ISLNK(st_.st_mode):
                out[rel] = ("link", os.readlink(os.fsencode(full)))
            elif stat.S_ISDIR(st_.st_mode):
                out[rel + "/"] = ("dir", stat.S_IMODE(st_.st_mode))
            else:
                out[rel] = ("file", full.read_bytes(), stat.S_IMODE(st_.st_mode))
    return out


def digest(root: Path) -> str:
    return hashlib.sha256(repr(sorted(snapshot(root).items())).encode()).hexdigest()


def temp_leftovers(root: Path) -> list[str]:
    found = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        found += [os.path.join(dirpath, n) for n in dirnames + filenames if n.startswith(TEMP_PREFIX)]
    return found


def mode_of(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


@dataclass
class Env:
    ws: Path
    outside: Path
    writer: SafeWriter
    outside_digest: str

    def assert_outside_untouched(self) -> None:
        assert digest(self.outside) == self.outside_digest
        assert (self.outside / "secret.txt").read_bytes() == b"secret"


def make_outside(base: Path) -> Path:
    outside = base / "outside"
    (outside / "sub").mkdir(parents=True)
    (outside / "secret.txt").write_bytes(b"secret")
    (outside / "sub" / "keep.txt").write_bytes(b"keep")
    (outside / (TEMP_PREFIX + "bait")).write_bytes(b"bait")
    return outside


@pytest.fixture(autouse=True)
def fixed_umask() -> Iterator[None]:
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    ws = tmp_path / "ws"
    ws.mkdir()
    outside = make_outside(tmp_path)
    with SafeWriter(ws) as writer:
        e = Env(ws=ws, outside=outside, writer=writer, outside_digest=digest(outside))
        yield e
    # Every test, attack or not, must leave the canary alone.
    e.assert_outside_untouched()


def rp(s: str) -> RepoPath:
    return RepoPath(s)


# ---- writing files ---------------------------------------------------------------------------


def test_write_new_file_creates_missing_parents(env: Env) -> None:
    env.writer.write_file(rp("a/b/c.txt"), b"hello", executable=False)

    assert snapshot(env.ws) == {
        "a/": ("dir", 0o755),
        "a/b/": ("dir", 0o755),
        "a/b/c.txt": ("file", b"hello", 0o644),
    }


def test_overwrite_replaces_content(env: Env) -> None:
    (env.ws / "f.txt").write_bytes(b"old content that is longer")

    env.writer.write_file(rp("f.txt"), b"new", executable=False)

    assert (env.ws / "f.txt").read_bytes() == b"new"
    assert temp_leftovers(env.ws) == []


def test_write_empty_and_large_files(env: Env) -> None:
    big = os.urandom(3 * (1 << 20) + 17)
    env.writer.write_file(rp("empty"), b"", executable=False)
    env.writer.write_file(rp("big.bin"), big, executable=False)

    assert (env.ws / "empty").read_bytes() == b""
    assert (env.ws / "big.bin").read_bytes() == big
    assert env.writer.read(rp("big.bin")) == FileRead(kind="file", data=big, executable=False)


def test_executable_bit_on_then_off(env: Env) -> None:
    env.writer.write_file(rp("run.sh"), b"#!/bin/sh\n", executable=True)
    assert mode_of(env.ws / "run.sh") == 0o755

    env.writer.write_file(rp("run.sh"), b"#!/bin/sh\n", executable=False)
    assert mode_of(env.ws / "run.sh") == 0o644


def test_umask_narrows_file_and_dir_modes(env: Env) -> None:
    os.umask(0o077)

    env.writer.write_file(rp("d/x"), b"x", executable=True)
    env.writer.write_file(rp("d/y"), b"y", executable=False)

    assert mode_of(env.ws / "d") == 0o700
    assert mode_of(env.ws / "d" / "x") == 0o700
    assert mode_of(env.ws / "d" / "y") == 0o600


def test_never_setuid_setgid_or_sticky(env: Env) -> None:
    os.umask(0)
    sgid_dir = env.ws / "sg"
    sgid_dir.mkdir()
    os.chmod(sgid_dir, 0o2777)
    target = sgid_dir / "tool"
    target.write_bytes(b"old")
    os.chmod(target, 0o7777)

    env.writer.write_file(rp("sg/tool"), b"new", executable=True)
    env.writer.write_file(rp("sg/plain"), b"p", executable=False)

    assert mode_of(target) == 0o755
    assert mode_of(sgid_dir / "plain") == 0o644
    for p in (target, sgid_dir / "plain"):
        assert p.lstat().st_mode & (stat.S_ISUID | stat.S_ISGID | stat.S_ISVTX) == 0


def test_a_file_created_as_wanted_is_not_chmodded(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    """A chmod is a syscall and a watcher event in the middle of a restore: only a file the
    kernel created wider than wanted (here reported so) is narrowed."""
    chmods: list[int] = []
    real_fchmod, real_fstat = os.fchmod, os.fstat

    def fchmod(fd: int, mode: int) -> None:
        chmods.append(mode)
        real_fchmod(fd, mode)

    monkeypatch.setattr(os, "fchmod", fchmod)
    env.writer.write_file(rp("plain.txt"), b"p", executable=False)
    env.writer.write_file(rp("run.sh"), b"#!/bin/sh\n", executable=True)
    assert chmods == []
    assert (mode_of(env.ws / "plain.txt"), mode_of(env.ws / "run.sh")) == (0o644, 0o755)

    def wide_fstat(fd: int) -> os.stat_result:
        st = real_fstat(fd)
        return os.stat_result((st.st_mode | stat.S_ISGID | 0o022, *tuple(st)[1:]))

    monkeypatch.setattr(os, "fstat", wide_fstat)
    env.writer.write_file(rp("wide.txt"), b"w", executable=False)
    assert chmods == [0o644]


def test_write_does_not_modify_a_hard_linked_outside_file(env: Env) -> None:
    os.link(env.outside / "secret.txt", env.ws / "f.txt")

    env.writer.write_file(rp("f.txt"), b"restored", executable=False)

    assert (env.ws / "f.txt").read_bytes() == b"restored"
    env.assert_outside_untouched()


def test_empty_dir_at_final_name_is_replaced(env: Env) -> None:
    (env.ws / "a").mkdir()

    env.writer.write_file(rp("a"), b"now a file", executable=False)

    assert snapshot(env.ws) == {"a": ("file", b"now a file", 0o644)}


@pytest.mark.parametrize("kind", ["file", "symlink"])
def test_non_empty_dir_at_final_name_fails_and_keeps_content(env: Env, kind: str) -> None:
    (env.ws / "a" / "deep").mkdir(parents=True)
    (env.ws / "a" / "user.txt").write_bytes(b"precious")
    (env.ws / "a" / "deep" / "more.txt").write_bytes(b"more")
    before = snapshot(env.ws)

    with pytest.raises(RestoreFailedError, match="directory with content"):
        if kind == "file":
            env.writer.write_file(rp("a"), b"x", executable=False)
        else:
            env.writer.write_symlink(rp("a"), b"target")

    assert snapshot(env.ws) == before
    assert temp_leftovers(env.ws) == []


# ---- symlinks --------------------------------------------------------------------------------


@pytest.mark.parametrize("target_kind", ["relative", "absolute_outside", "dangling"])
def test_symlink_is_written_as_a_link(env: Env, target_kind: str) -> None:
    (env.ws / "real").mkdir()
    (env.ws / "real" / "t.txt").write_bytes(b"t")
    target = {
        "relative": b"../real/t.txt",
        "absolute_outside": os.fsencode(env.outside / "secret.txt"),
        "dangling": b"does/not/exist",
    }[target_kind]

    env.writer.write_symlink(rp("links/l"), target)

    link = env.ws / "links" / "l"
    assert link.is_symlink()
    assert os.readlink(os.fsencode(link)) == target
    assert env.writer.read(rp("links/l")) == FileRead(kind="symlink", data=target, executable=False)
    env.assert_outside_untouched()


def test_symlink_replaces_a_file_and_a_file_replaces_a_symlink(env: Env) -> None:
    (env.ws / "x").write_bytes(b"file")

    env.writer.write_symlink(rp("x"), b"elsewhere")
    assert snapshot(env.ws) == {"x": ("link", b"elsewhere")}

    env.writer.write_file(rp("x"), b"file again", executable=False)
    assert snapshot(env.ws) == {"x": ("file", b"file again", 0o644)}


def test_symlink_over_symlink_to_outside_replaces_the_link(env: Env) -> None:
    os.symlink(env.outside / "secret.txt", env.ws / "l")

    env.writer.write_symlink(rp("l"), b"inside")

    assert os.readlink(env.ws / "l") == "inside"
    env.assert_outside_untouched()


@pytest.mark.parametrize("bad", [b"", b"a\x00b"])
def test_invalid_symlink_target_is_refused(env: Env, bad: bytes) -> None:
    with pytest.raises(RestoreFailedError):
        env.writer.write_symlink(rp("l"), bad)
    assert snapshot(env.ws) == {}


# ---- attacks: symlinks and files in the way --------------------------------------------------


def test_write_replaces_a_symlink_to_an_outside_file(env: Env) -> None:
    os.symlink(env.outside / "secret.txt", env.ws / "config.txt")

    env.writer.write_file(rp("config.txt"), b"restored", executable=False)

    assert snapshot(env.ws) == {"config.txt": ("file", b"restored", 0o644)}
    env.assert_outside_untouched()


@pytest.mark.parametrize("link_target", ["outside_dir", "relative_outside", "dangling", "inside_dir"])
def test_write_under_symlinked_parent_creates_a_real_dir(env: Env, link_target: str) -> None:
    (env.ws / "inside").mkdir()
    target = {
        "outside_dir": str(env.outside),
        "relative_outside": "../outside",
        "dangling": "nowhere",
        "inside_dir": "inside",
    }[link_target]
    os.symlink(target, env.ws / "d")

    env.writer.write_file(rp("d/secret.txt"), b"mine", executable=False)
    env.writer.write_file(rp("d/sub/keep.txt"), b"mine too", executable=False)

    assert snapshot(env.ws) == {
        "inside/": ("dir", 0o755),
        "d/": ("dir", 0o755),
        "d/secret.txt": ("file", b"mine", 0o644),
        "d/sub/": ("dir", 0o755),
        "d/sub/keep.txt": ("file", b"mine too", 0o644),
    }
    env.assert_outside_untouched()


def test_write_under_a_deeper_symlinked_parent(env: Env) -> None:
    (env.ws / "a").mkdir()
    os.symlink(env.outside, env.ws / "a" / "b")

    env.writer.write_file(rp("a/b/sub/keep.txt"), b"x", executable=False)

    assert not (env.ws / "a" / "b").is_symlink()
    assert (env.ws / "a" / "b" / "sub" / "keep.txt").read_bytes() == b"x"
    env.assert_outside_untouched()


def test_write_under_a_file_parent_replaces_the_file(env: Env) -> None:
    (env.ws / "d").write_bytes(b"was a file")

    env.writer.write_symlink(rp("d/l"), b"t")

    assert snapshot(env.ws) == {"d/": ("dir", 0o755), "d/l": ("link", b"t")}


def test_replacing_a_parent_is_logged(env: Env) -> None:
    os.symlink(env.outside, env.ws / "d")

    with capture_logs() as logs:
        env.writer.write_file(rp("d/x"), b"x", executable=False)

    replaced = [e for e in logs if e["event"] == "safe_fs.replaced_in_the_way"]
    assert replaced and replaced[0]["component"] == "d" and replaced[0]["was"] == "symlink"


def test_remove_through_a_symlinked_parent_removes_nothing(env: Env) -> None:
    os.symlink(env.outside, env.ws / "d")

    assert env.writer.remove(rp("d/secret.txt")) is False
    assert env.writer.remove(rp("d/sub/keep.txt")) is False

    assert os.readlink(env.ws / "d") == str(env.outside)
    env.assert_outside_untouched()


def test_remove_under_a_file_parent_returns_false(env: Env) -> None:
    (env.ws / "d").write_bytes(b"file")

    assert env.writer.remove(rp("d/x")) is False
    assert (env.ws / "d").read_bytes() == b"file"


def test_remove_a_symlink_removes_the_link_not_its_target(env: Env) -> None:
    os.symlink(env.outside / "secret.txt", env.ws / "l")
    os.symlink(env.outside, env.ws / "dl")

    assert env.writer.remove(rp("l")) is True
    assert env.writer.remove(rp("dl")) is True

    assert snapshot(env.ws) == {}
    env.assert_outside_untouched()


def test_read_through_a_symlinked_or_file_parent_is_none(env: Env) -> None:
    os.symlink(env.outside, env.ws / "d")
    (env.ws / "f").write_bytes(b"file")

    assert env.writer.read(rp("d/secret.txt")) is None
    assert env.writer.read(rp("d/sub/keep.txt")) is None
    assert env.writer.read(rp("f/x")) is None


# ---- remove and prune ------------------------------------------------------------------------


def test_remove_prunes_empty_parents_but_not_non_empty_ones(env: Env) -> None:
    env.writer.write_file(rp("a/b/c/f.txt"), b"f", executable=False)
    env.writer.write_file(rp("a/keep.txt"), b"k", executable=False)

    assert env.writer.remove(rp("a/b/c/f.txt")) is True

    assert snapshot(env.ws) == {"a/": ("dir", 0o755), "a/keep.txt": ("file", b"k", 0o644)}


def test_remove_prunes_up_to_but_not_the_root(env: Env) -> None:
    env.writer.write_file(rp("x/y/z"), b"z", executable=False)

    assert env.writer.remove(rp("x/y/z")) is True

    assert snapshot(env.ws) == {}
    assert env.ws.is_dir()


def test_remove_last_top_level_file_keeps_the_root(env: Env) -> None:
    env.writer.write_file(rp("only"), b"o", executable=False)

    assert env.writer.remove(rp("only")) is True

    assert env.ws.is_dir() and snapshot(env.ws) == {}


def test_remove_missing_returns_false(env: Env) -> None:
    assert env.writer.remove(rp("nope")) is False
    assert env.writer.remove(rp("no/such/dir/f")) is False
    assert snapshot(env.ws) == {}


def test_remove_leaves_a_directory_alone(env: Env) -> None:
    (env.ws / "d").mkdir()
    (env.ws / "d" / "user.txt").write_bytes(b"u")
    (env.ws / "empty").mkdir()
    before = snapshot(env.ws)

    assert env.writer.remove(rp("d")) is False
    assert env.writer.remove(rp("empty")) is False

    assert snapshot(env.ws) == before


# ---- read ------------------------------------------------------------------------------------


def test_read_file_symlink_missing_and_special(env: Env) -> None:
    (env.ws / "plain").write_bytes(b"p")
    (env.ws / "tool").write_bytes(b"t")
    os.chmod(env.ws / "tool", 0o755)
    os.symlink("plain", env.ws / "l")
    os.mkfifo(env.ws / "fifo")
    (env.ws / "dir").mkdir()

    assert env.writer.read(rp("plain")) == FileRead(kind="file", data=b"p", executable=False)
    assert env.writer.read(rp("tool")) == FileRead(kind="file", data=b"t", executable=True)
    assert env.writer.read(rp("l")) == FileRead(kind="symlink", data=b"plain", executable=False)
    assert env.writer.read(rp("missing")) is None
    assert env.writer.read(rp("fifo")) is None
    assert env.writer.read(rp("dir")) is None


def test_read_symlink_to_outside_returns_the_target_not_the_content(env: Env) -> None:
    target = os.fsencode(env.outside / "secret.txt")
    os.symlink(target, env.ws / "l")

    found = env.writer.read(rp("l"))

    assert found == FileRead(kind="symlink", data=target, executable=False)
    assert found is not None and b"secret" != found.data


# ---- refused paths ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path", [".git", ".git/config", "sub/.GIT/HEAD", ".Git", "a/.gIt/x", ".g\u200cit/HEAD", "x/.git\ufeff"]
)
def test_dotgit_components_are_refused(env: Env, path: str) -> None:
    (env.ws / ".git").mkdir()
    (env.ws / ".git" / "config").write_bytes(b"cfg")
    before = snapshot(env.ws)

    with pytest.raises(PathOutsideWorkspaceError):
        env.writer.write_file(rp(path), b"x", executable=False)
    with pytest.raises(PathOutsideWorkspaceError):
        env.writer.write_symlink(rp(path), b"x")
    with pytest.raises(PathOutsideWorkspaceError):
        env.writer.remove(rp(path))
    with pytest.raises(PathOutsideWorkspaceError):
        env.writer.read(rp(path))

    assert snapshot(env.ws) == before


@pytest.mark.parametrize(
    "path",
    ["../outside/secret.txt", "a/../../outside/x", "..", "/etc/passwd", "", "a//b", "./a", "a/", "a\x00b"],
)
def test_escaping_or_malformed_paths_are_refused(env: Env, path: str) -> None:
    with pytest.raises(PathOutsideWorkspaceError):
        env.writer.write_file(rp(path), b"x", executable=False)
    with pytest.raises(PathOutsideWorkspaceError):
        env.writer.remove(rp(path))
    with pytest.raises(PathOutsideWorkspaceError):
        env.writer.read(rp(path))

    assert snapshot(env.ws) == {}
    env.assert_outside_untouched()


# ---- error paths leave no temporary files ----------------------------------------------------


class FailingHook:
    """Raises at the last moment before the rename, after the temporary entry is complete."""

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc
        self.seen_temp: list[Path] = []
        self.dir: Path | None = None

    def before_rename(self, path: RepoPath, temp_name: str) -> None:
        assert self.dir is not None
        temp = self.dir / temp_name
        assert temp.is_symlink() or temp.is_file()
        self.seen_temp.append(temp)
        raise self.exc


@pytest.mark.parametrize("kind", ["file", "symlink"])
def test_os_failure_before_rename_cleans_up_and_keeps_the_old_file(tmp_path: Path, kind: str) -> None:
    ws = tmp_path / "ws"
    (ws / "d").mkdir(parents=True)
    (ws / "d" / "f").write_bytes(b"old")
    hook = FailingHook(OSError(errno.ENOSPC, "No space left on device"))
    hook.dir = ws / "d"

    with SafeWriter(ws, fault_hook=hook) as writer, pytest.raises(RestoreFailedError, match="No space"):
        if kind == "file":
            writer.write_file(rp("d/f"), b"new", executable=False)
        else:
            writer.write_symlink(rp("d/f"), b"t")

    assert len(hook.seen_temp) == 1 and not os.path.lexists(hook.seen_temp[0])
    assert temp_leftovers(ws) == []
    assert snapshot(ws) == {"d/": ("dir", 0o755), "d/f": ("file", b"old", 0o644)}


def test_unexpected_exception_before_rename_propagates_and_cleans_up(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    hook = FailingHook(RuntimeError("boom"))
    hook.dir = ws

    with SafeWriter(ws, fault_hook=hook) as writer, pytest.raises(RuntimeError, match="boom"):
        writer.write_file(rp("f"), b"new", executable=True)

    assert temp_leftovers(ws) == []
    assert snapshot(ws) == {}


# ---- crash leftovers -------------------------------------------------------------------------


def test_cleanup_temp_files_only_in_parents_of_given_paths(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    outside = make_outside(tmp_path)
    outside_before = digest(outside)
    (ws / "a").mkdir(parents=True)
    (ws / "other").mkdir()
    (ws / (TEMP_PREFIX + "1")).write_bytes(b"")
    os.symlink("x", ws / (TEMP_PREFIX + "2"))
    (ws / "a" / (TEMP_PREFIX + "3")).write_bytes(b"")
    (ws / "a" / (TEMP_PREFIX + "dir")).mkdir()
    (ws / "a" / "real.txt").write_bytes(b"keep")
    (ws / "other" / (TEMP_PREFIX + "4")).write_bytes(b"")
    os.symlink(outside, ws / "linked")

    removed = cleanup_temp_files(
        ws, [rp("top.txt"), rp("a/x"), rp("a/y"), rp("linked/secret.txt"), rp("missing/dir/f")]
    )

    assert removed == 3
    assert snapshot(ws) == {
        "a/": ("dir", 0o755),
        "a/" + TEMP_PREFIX + "dir/": ("dir", 0o755),
        "a/real.txt": ("file", b"keep", 0o644),
        "other/": ("dir", 0o755),
        "other/" + TEMP_PREFIX + "4": ("file", b"", 0o644),
        "linked": ("link", os.fsencode(outside)),
    }
    assert digest(outside) == outside_before


# ---- root and lifecycle ----------------------------------------------------------------------


def test_root_reached_through_a_symlink(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    os.symlink(real, tmp_path / "alias")

    with SafeWriter(tmp_path / "alias") as writer:
        writer.write_file(rp("f"), b"x", executable=False)

    assert (real / "f").read_bytes() == b"x"
    assert (tmp_path / "alias").is_symlink()


def test_missing_root_raises_no_workspace(tmp_path: Path) -> None:
    with pytest.raises(NoWorkspaceError):
        SafeWriter(tmp_path / "nope")


def test_closed_writer_refuses_work_and_close_is_idempotent(tmp_path: Path) -> None:
    writer = SafeWriter(tmp_path)
    writer.close()
    writer.close()

    with pytest.raises(ValueError, match="closed"):
        writer.write_file(rp("f"), b"x", executable=False)
    assert not (tmp_path / "f").exists()


# ---- property: random operations against an in-memory model ----------------------------------

NAMES = ["a", "b"]
PATHS = ["/".join(p) for depth in (1, 2, 3) for p in itertools.product(NAMES, repeat=depth)]
OUTSIDE_TOKEN = b"@OUTSIDE@"

op_strategy = st.one_of(
    st.tuples(st.just("file"), st.sampled_from(PATHS), st.sampled_from([b"", b"1", b"22"]), st.booleans()),
    st.tuples(
        st.just("link"),
        st.sampled_from(PATHS),
        st.sampled_from([b"a", b"b/a", b"../outside", OUTSIDE_TOKEN, b"dangling"]),
        st.just(False),
    ),
    st.tuples(st.just("remove"), st.sampled_from(PATHS), st.just(b""), st.just(False)),
)


def _ancestors(path: str) -> list[str]:
    parts = path.split("/")
    return ["/".join(parts[:i]) for i in range(1, len(parts))]


def _expected_tree(model: dict[str, FileRead]) -> dict[str, object]:
    out: dict[str, object] = {}
    for path, entry in model.items():
        for anc in _ancestors(path):
            out[anc + "/"] = ("dir", 0o755)
        if entry.kind == "symlink":
            out[path] = ("link", entry.data)
        else:
            out[path] = ("file", entry.data, 0o755 if entry.executable else 0o644)
    return out


@settings(max_examples=120, deadline=None)
@given(ops=st.lists(op_strategy, max_size=25))
def test_random_operations_match_an_in_memory_model(ops: list[tuple[str, str, bytes, bool]]) -> None:
    with tempfile.TemporaryDirectory() as base_str:
        base = Path(base_str)
        ws = base / "ws"
        ws.mkdir()
        outside = make_outside(base)
        outside_before = digest(outside)
        model: dict[str, FileRead] = {}

        with SafeWriter(ws) as writer:
            for kind, path, payload, executable in ops:
                if payload == OUTSIDE_TOKEN:
                    payload = os.fsencode(outside)
                leaf_ancestor = any(a in model for a in _ancestors(path))
                has_children = any(p.startswith(path + "/") for p in model)
                if kind == "remove":
                    expected = not leaf_ancestor and path in model
                    assert writer.remove(rp(path)) is expected
                    if expected:
                        del model[path]
                    continue
                if has_children:
                    with pytest.raises(RestoreFailedError):
                        if kind == "file":
                            writer.write_file(rp(path), payload, executable=executable)
                        else:
                            writer.write_symlink(rp(path), payload)
                    continue
                if kind == "file":
                    writer.write_file(rp(path), payload, executable=executable)
                    entry = FileRead(kind="file", data=payload, executable=executable)
                else:
                    writer.write_symlink(rp(path), payload)
                    entry = FileRead(kind="symlink", data=payload, executable=False)
                for anc in _ancestors(path):
                    model.pop(anc, None)  # a file or link in the way became a directory
                model[path] = entry

            assert snapshot(ws) == _expected_tree(model)
            for path in PATHS:
                leaf_ancestor = any(a in model for a in _ancestors(path))
                assert writer.read(rp(path)) == (None if leaf_ancestor else model.get(path))

        assert temp_leftovers(ws) == []
        assert digest(outside) == outside_before
