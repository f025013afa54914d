"""Unit tests for `shadowpoint.store.loose`: objects and refs written into files made ahead of
time, read back by the git CLI as the independent witness (`cat-file`, `fsck --strict`)."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from shadowpoint.errors import RepoError
from shadowpoint.store import loose
from shadowpoint.store.loose import POOL_STALE_S, FilePool, object_id, write_object, write_ref
from shadowpoint.store.shadow_repo import FILE_POOL_FOLDER, ShadowRepo
from shadowpoint.store.values import MODE_FILE, MODE_TREE, TASK_TRAILER, TreeEntry, task_ref
from shadowpoint.workspace import RepoPath
from tests.conftest import wait_for


@pytest.fixture
def repo(tmp_path: Path, workspace: Path) -> Iterator[ShadowRepo]:
    r = ShadowRepo.open_or_init(tmp_path / "shadow" / ".git", workspace)
    yield r
    r.close()


def _git_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env["GIT_CONFIG_NOSYSTEM"] = "1"
    return env


def git(git_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", f"--git-dir={git_dir}", *args], capture_output=True, text=True, env=_git_env(),
                          check=True)


def git_bytes(git_dir: Path, *args: str) -> bytes:
    """git's output as bytes (names that are not UTF-8)."""
    return subprocess.run(["git", f"--git-dir={git_dir}", *args], capture_output=True, env=_git_env(),
                          check=True).stdout


def cat(git_dir: Path, oid: str) -> bytes:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    return subprocess.run(["git", f"--git-dir={git_dir}", "cat-file", "-p", oid], capture_output=True,
                          env=env, check=True).stdout


def pool_of(repo: ShadowRepo) -> FilePool:
    pool = repo._pool
    assert isinstance(pool, FilePool)
    return pool


@pytest.mark.parametrize("size", [0, 1, 500, 3000, 4070, 4071, 5000, 40_000, (1 << 20) + 17])
def test_blob_ids_and_bytes_are_gits(repo: ShadowRepo, tmp_path: Path, size: int) -> None:
    data = os.urandom(size // 2).hex().encode() + b"x" * (size % 2)
    oid = write_object(repo.git_dir, b"blob", data, pool_of(repo))
    src = tmp_path / "data"
    src.write_bytes(data)
    assert oid == git(repo.git_dir, "hash-object", str(src)).stdout.strip()
    assert cat(repo.git_dir, oid) == data
    assert object_id(b"blob", data) == oid


def _descriptors_to(folder: Path) -> list[str]:
    """What this process's open descriptors name inside `folder` (Linux's /proc)."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/self/fd/{fd}")
            if target.startswith(f"{folder}/"):
                found.append(target)
    return found


def test_a_pooled_object_write_takes_a_file_made_ahead_read_only_and_open(repo: ShadowRepo) -> None:
    """No open and no chmod in the round: the file was made read-only, and its descriptor from
    then writes it."""
    pool = pool_of(repo)
    assert pool.fill() == pool.size
    before = pool.ready
    ahead, _ = pool._opened[0]
    inode = os.stat(ahead).st_ino
    assert os.stat(ahead).st_mode & 0o777 == 0o444
    oid = repo.write_blob(b"made ahead\n")
    final = repo.git_dir / "objects" / oid[:2] / oid[2:]
    assert os.stat(final).st_ino == inode  # the very file the pool made, renamed into place
    assert not os.path.exists(ahead)
    assert pool.ready == before - 1
    assert final.stat().st_mode & 0o777 == 0o444  # as git and libgit2 leave a loose object
    assert cat(repo.git_dir, oid) == b"made ahead\n"
    assert str(final) not in _descriptors_to(repo.git_dir)  # its descriptor was closed


def test_a_pooled_ref_write_takes_a_closed_file_made_ahead(repo: ShadowRepo) -> None:
    pool = pool_of(repo)
    pool.fill()
    opened = len(pool._opened)
    ahead = pool._ready[0]
    inode = os.stat(ahead).st_ino
    oid = repo.write_blob(b"for a ref\n")
    write_ref(repo.git_dir, "refs/heads/made-ahead", oid, pool)
    final = repo.git_dir / "refs" / "heads" / "made-ahead"
    assert os.stat(final).st_ino == inode
    assert final.stat().st_mode & 0o777 == 0o644
    assert len(pool._opened) == opened - 1  # the blob's
    assert git(repo.git_dir, "rev-parse", "refs/heads/made-ahead").stdout.strip() == oid


def test_a_pool_holds_open_only_its_open_ahead_files_and_close_lets_them_go(tmp_path: Path) -> None:
    folder = tmp_path / "pool"
    pool = FilePool(folder, size=8, open_ahead=3)
    assert pool.fill() == 8
    assert len(_descriptors_to(folder)) == 3 and pool.ready == 8
    assert sorted(_descriptors_to(folder)) == sorted(path for path, _ in pool._opened)
    taken = pool.take_open()
    assert taken is not None
    path, fd = taken
    os.write(fd, b"written by the descriptor that made it")
    os.close(fd)
    assert Path(path).read_bytes() == b"written by the descriptor that made it"
    assert pool._thread is None and not pool._wake.is_set(), "woken with most of them open"
    second = pool.take_open()  # half taken: the refill is woken
    assert second is not None and pool._thread is not None
    os.close(second[1])
    os.unlink(second[0])
    wait_for(lambda: len(pool._opened) == 3, "the open files made again")
    pool.close()
    assert _descriptors_to(folder) == []
    assert sorted(os.listdir(folder)) == [os.path.basename(path)]  # only the one taken


def test_an_open_file_swept_away_meanwhile_is_noticed(repo: ShadowRepo) -> None:
    pool = pool_of(repo)
    pool.fill()
    os.unlink(pool._opened[0][0])  # another process's sweep: its descriptor writes nowhere
    oid = repo.write_blob(b"swept while open\n")
    assert cat(repo.git_dir, oid) == b"swept while open\n"


def test_without_a_pool_file_the_write_makes_its_own(repo: ShadowRepo) -> None:
    pool = pool_of(repo)
    pool.close()  # takes nothing more
    oid = repo.write_blob(b"no pool\n")
    assert cat(repo.git_dir, oid) == b"no pool\n"
    assert not list((repo.git_dir / "objects").glob("tmp_*"))


def test_a_pool_file_swept_away_meanwhile_is_noticed(repo: ShadowRepo) -> None:
    pool = pool_of(repo)
    pool.fill()
    os.unlink(pool._ready[0])  # another process's sweep
    oid = repo.write_blob(b"swept\n")
    assert cat(repo.git_dir, oid) == b"swept\n"


def test_a_missing_fan_out_folder_is_made(tmp_path: Path) -> None:
    git_dir = tmp_path / "g.git"
    subprocess.run(["git", "init", "-q", "--bare", str(git_dir)], check=True)
    pool = FilePool(git_dir / FILE_POOL_FOLDER)
    pool.fill()
    oid = write_object(git_dir, b"blob", b"fan out\n", pool)
    assert (git_dir / "objects" / oid[:2]).is_dir()
    assert cat(git_dir, oid) == b"fan out\n"
    pool.close()


def test_an_object_already_held_is_freshened_not_rewritten(repo: ShadowRepo) -> None:
    oid = repo.write_blob(b"old\n")
    final = repo.git_dir / "objects" / oid[:2] / oid[2:]
    os.utime(final, (1_000_000, 1_000_000))
    inode = final.stat().st_ino
    assert repo.write_blob(b"old\n") == oid
    assert final.stat().st_ino == inode
    assert final.stat().st_mtime > time.time() - 3600  # a collection's grace period counts from now


def test_trees_and_commits_pass_gits_strict_check(repo: ShadowRepo) -> None:
    pool_of(repo).fill()
    f = TreeEntry(repo.write_blob(b"f\n"), MODE_FILE)
    g = TreeEntry(repo.write_blob(b"g\n"), MODE_FILE)
    # git's order compares a folder's name as if it ended with "/": "a.b" < "a/" < "a0"
    names = {"a.b": f, "a/x": g, "a0": f, "a-b": g, "b/c/d/e": f, "\udcff-not-utf8": g}
    tree = repo.patch_tree(None, {RepoPath(p): e for p, e in names.items()})
    assert tree is not None
    tree2 = repo.patch_tree(tree, {RepoPath("a/y"): f, RepoPath("a.b"): None, RepoPath("b/c/d/e"): None})
    assert tree2 is not None
    c1 = repo.commit(tree, [], "first", "task-1")
    c2 = repo.commit(tree2, [c1], "second\n\nwith a body", "task-1")
    repo.set_ref(task_ref("task-1"), c2)
    git(repo.git_dir, "fsck", "--strict", "--no-dangling")
    listed = git_bytes(repo.git_dir, "ls-tree", "-r", "--name-only", "-z", c2).split(b"\0")
    assert listed[:-1] == [b"a-b", b"a/x", b"a/y", b"a0", b"\xff-not-utf8"]
    assert git(repo.git_dir, "ls-tree", c2, "a").stdout.split()[:2] == [f"{MODE_TREE:06o}", "tree"]
    assert git(repo.git_dir, "rev-list", task_ref("task-1")).stdout.split() == [c2, c1]
    assert repo.commit_chain(c2) == [(c1, f"first\n\n{TASK_TRAILER}: task-1\n"),
                                     (c2, f"second\n\nwith a body\n\n{TASK_TRAILER}: task-1\n")]


def test_a_ref_overrides_a_packed_one_and_bad_names_are_refused(repo: ShadowRepo) -> None:
    tree = repo.patch_tree(None, {RepoPath("a"): TreeEntry(repo.write_blob(b"a"), MODE_FILE)})
    c1 = repo.commit(tree, [], "one", "t")
    c2 = repo.commit(tree, [c1], "two", "t")
    repo.set_ref(task_ref("t"), c1)
    git(repo.git_dir, "pack-refs", "--all")
    assert not (repo.git_dir / task_ref("t")).exists()
    repo.set_ref(task_ref("t"), c2)
    assert git(repo.git_dir, "rev-parse", task_ref("t")).stdout.strip() == c2
    assert repo.read_ref(task_ref("t")) == c2
    for bad in ["refs/shadowpoint/a..b", "refs/x.lock", "HEAD/../config", "refs/a b", "nope"]:
        with pytest.raises(RepoError):
            repo.set_ref(bad, c1)
    assert not (repo.git_dir / "config.lock").exists()
    with pytest.raises(RepoError):  # a folder of refs is in the way
        repo.set_ref("refs/shadowpoint/tasks", c1)


def test_write_ref_makes_its_folders(tmp_path: Path) -> None:
    git_dir = tmp_path / "g.git"
    subprocess.run(["git", "init", "-q", "--bare", str(git_dir)], check=True)
    oid = write_object(git_dir, b"blob", b"x")
    tree = write_object(git_dir, b"tree", b"100644 x\0" + bytes.fromhex(oid))
    write_ref(git_dir, "refs/deep/er/name", tree)
    assert git(git_dir, "rev-parse", "refs/deep/er/name").stdout.strip() == tree


def test_close_removes_the_ready_files_and_sweep_only_old_foreign_ones(tmp_path: Path) -> None:
    folder = tmp_path / "pool"
    mine, other = FilePool(folder, size=4), FilePool(folder, size=3)
    mine.fill()
    other.fill()
    old = sorted(other._ready)[:2]
    for path in old:
        os.utime(path, (time.time() - POOL_STALE_S - 10,) * 2)
    assert mine.sweep() == 2
    assert sorted(os.listdir(folder)) == sorted(os.path.basename(p) for p in [*mine._ready, *other._ready]
                                                if p not in old)
    mine.close()
    assert all(os.path.basename(p) not in os.listdir(folder) for p in mine._ready)
    assert len(os.listdir(folder)) == 1
    assert mine.take() is None  # closed


def test_the_refill_is_woken_once_half_the_pool_is_taken(tmp_path: Path) -> None:
    """Not at every take: a woken refill thread wants the interpreter while the round that took
    the file still runs."""
    pool = FilePool(tmp_path / "pool", size=8)
    assert pool.fill() == 8
    taken = [pool.take() for _ in range(3)]
    assert all(taken) and pool.ready == 5
    assert pool._thread is None and not pool._wake.is_set(), "woken with most of the pool ready"
    assert pool.take() is not None  # half taken
    assert pool._thread is not None
    wait_for(lambda: pool.ready == 8, "the pool refilled")
    pool.close()


def test_a_forked_child_takes_nothing_from_its_parents_pool(tmp_path: Path) -> None:
    pool = FilePool(tmp_path / "pool", size=2)
    pool.fill()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os._exit(0 if pool.take() is None else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert pool.ready == 2
    pool.close()


def test_a_refused_refill_stops_and_writes_go_on(tmp_path: Path) -> None:
    git_dir = tmp_path / "g.git"
    subprocess.run(["git", "init", "-q", "--bare", str(git_dir)], check=True)
    blocker = git_dir / "shadowpoint"
    blocker.write_text("a file where the pool's folder would go")
    pool = FilePool(git_dir / FILE_POOL_FOLDER)
    assert pool.fill() == 0
    assert pool.take() is None
    oid = write_object(git_dir, b"blob", b"still written\n", pool)
    assert cat(git_dir, oid) == b"still written\n"
    pool.close()


def test_the_live_pools_are_listed(tmp_path: Path) -> None:
    pool = FilePool(tmp_path / "pool", size=1)
    assert pool in loose.live_pools()
    pool.close()


@pytest.mark.parametrize("size", [1, 700, 4070])
def test_a_small_object_fits_one_block(repo: ShadowRepo, size: int) -> None:
    """Objects up to 4 KiB are stored without deflating (deflating small trees cost tens of µs
    each): the loose file still fits one 4 KiB block, and git reads it."""
    data = os.urandom(size // 2).hex().encode() + b"x" * (size % 2)
    oid = write_object(repo.git_dir, b"blob", data, pool_of(repo))
    final = repo.git_dir / "objects" / oid[:2] / oid[2:]
    assert final.stat().st_size <= 4096
    assert cat(repo.git_dir, oid) == data


def test_the_head_is_moved_in_place_and_a_replaced_file_is_noticed(tmp_path: Path) -> None:
    """`rewrite_ref` keeps the ref's file open and writes each new target over the old one; a
    file another writer replaced (or one of another length) is written the usual way."""
    git_dir = tmp_path / "shadow"
    (git_dir / "objects").mkdir(parents=True)
    ref = git_dir / "refs" / "shadowpoint" / "head"
    open_refs: dict[str, int] = {}
    try:
        loose.rewrite_ref(git_dir, "refs/shadowpoint/head", "a" * 40, open_refs)
        first = ref.stat().st_ino
        for c in "bcd":
            loose.rewrite_ref(git_dir, "refs/shadowpoint/head", c * 40, open_refs)
            assert ref.read_text() == c * 40 + "\n"
        assert ref.stat().st_ino == first  # the same file, written over
        loose.write_ref(git_dir, "refs/shadowpoint/head", "e" * 40)  # another writer: a new file
        loose.rewrite_ref(git_dir, "refs/shadowpoint/head", "f" * 40, open_refs)
        assert ref.read_text() == "f" * 40 + "\n"
        ref.write_text("ref: refs/heads/other\n")  # another length
        loose.rewrite_ref(git_dir, "refs/shadowpoint/head", "1" * 40, open_refs)
        assert ref.read_text() == "1" * 40 + "\n"
        ref.unlink()
        loose.rewrite_ref(git_dir, "refs/shadowpoint/head", "2" * 40, open_refs)
        assert ref.read_text() == "2" * 40 + "\n"
        assert list(open_refs) == [str(ref)]
    finally:
        for fd in open_refs.values():
            os.close(fd)


def test_refs_moved_in_place_keep_the_last_moved_open_and_write_a_missing_one_durably(tmp_path: Path) -> None:
    """A task's ref is moved in place too (`durable=True`): a missing file is written through a
    new file and a rename, and only the `OPEN_REFS_MAX` refs moved last keep their files open."""
    git_dir = tmp_path / "shadow"
    (git_dir / "objects").mkdir(parents=True)
    open_refs: dict[str, int] = {}
    names = [f"refs/shadowpoint/tasks/t{i}" for i in range(loose.OPEN_REFS_MAX + 3)]
    try:
        for i, name in enumerate(names):
            loose.rewrite_ref(git_dir, name, f"{i:x}" * 40 if i < 16 else "a" * 40, open_refs, durable=True)
        assert len(open_refs) == loose.OPEN_REFS_MAX
        assert list(open_refs) == [str(git_dir / n) for n in names[-loose.OPEN_REFS_MAX:]]
        first = git_dir / names[0]
        inode = first.stat().st_ino
        loose.rewrite_ref(git_dir, names[0], "b" * 40, open_refs, durable=True)  # closed: a new file
        assert first.read_text() == "b" * 40 + "\n" and first.stat().st_ino != inode
        inode = first.stat().st_ino
        loose.rewrite_ref(git_dir, names[0], "c" * 40, open_refs, durable=True)  # open now: written over
        assert first.read_text() == "c" * 40 + "\n" and first.stat().st_ino == inode
        assert len(open_refs) == loose.OPEN_REFS_MAX and str(first) in open_refs
    finally:
        for fd in open_refs.values():
            os.close(fd)


def test_a_repository_closes_the_refs_it_keeps_open(repo: ShadowRepo) -> None:
    tree = repo.patch_tree(None, {RepoPath("a.txt"): TreeEntry(repo.write_blob(b"1"), MODE_FILE)})
    assert tree is not None
    repo.set_ref("refs/shadowpoint/head", tree, durable=False)
    repo.set_ref("refs/shadowpoint/head", tree, durable=False)
    fds = list(repo._open_refs.values())
    assert len(fds) == 1
    repo.close()
    with pytest.raises(OSError):
        os.fstat(fds[0])


def test_a_pool_never_makes_its_anchor_again(tmp_path: Path) -> None:
    """A pool whose repository was removed (another process deleted the task) refills nothing
    and makes none of the repository's folders again; with the anchor there, it makes its
    folder a level at a time."""
    git_dir = tmp_path / "checkpoints" / "h" / ".git"
    git_dir.mkdir(parents=True)
    pool = FilePool(git_dir / FILE_POOL_FOLDER, size=2, anchor=git_dir)
    assert pool.fill() == 2 and (git_dir / FILE_POOL_FOLDER).is_dir()
    shutil.rmtree(tmp_path / "checkpoints" / "h")
    pool._ready.clear()  # taken (no refill thread: nothing was taken through `take`)
    assert pool.fill() == 0
    assert not (tmp_path / "checkpoints" / "h").exists()
    pool.close()
