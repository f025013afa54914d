"""A round's trees and commit go into one small pack (`ShadowRepo.flush`), written before a ref
names them or libgit2 reads them; small packs are merged; a collection running while rounds
land still completes. Real repositories; the git CLI is the witness of what is on disk."""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from shadowpoint.errors import ObjectMissingError, StorageFailedError
from shadowpoint.store import loose, packing, shadow_repo
from shadowpoint.store.shadow_repo import ShadowRepo
from shadowpoint.store.values import MODE_FILE, TreeEntry, task_ref
from shadowpoint.workspace import RepoPath
from tests.unit.test_shadow_repo import blob, build, git


@pytest.fixture
def repo(tmp_path: Path, workspace: Path) -> Iterator[ShadowRepo]:
    r = ShadowRepo.open_or_init(tmp_path / "shadow" / ".git", workspace)
    yield r
    r.close()


def _pack_dir(repo: ShadowRepo) -> Path:
    return repo.git_dir / "objects" / "pack"


def _packs(repo: ShadowRepo) -> dict[str, set[str]]:
    """Every pack's name: the ids its index lists."""
    return {idx.stem: set(packing.pack_objects(idx)) for idx in _pack_dir(repo).glob("pack-*.idx")}


def _loose_ids(repo: ShadowRepo) -> set[str]:
    objects = repo.git_dir / "objects"
    return {p.parent.name + p.name for p in objects.glob("[0-9a-f][0-9a-f]/*")}


def _on_disk(repo: ShadowRepo, oid: str) -> bool:
    return git(repo, "cat-file", "-e", oid, check=False, flush=False).returncode == 0


def _trees_and_commit(repo: ShadowRepo, commit: str) -> set[str]:
    trees = git(repo, "ls-tree", "-r", "-t", commit).stdout.splitlines()
    return {commit, git(repo, "rev-parse", f"{commit}^{{tree}}").stdout.strip(),
            *(line.split()[2] for line in trees if line.split()[1] == "tree")}


def _fsck(repo: ShadowRepo) -> None:
    fsck = git(repo, "fsck", "--full", "--strict", "--no-dangling", check=False)
    assert fsck.returncode == 0, fsck.stdout + fsck.stderr


def _first_round(repo: ShadowRepo, files: dict[str, TreeEntry]) -> tuple[str | None, str]:
    """A task's first round holding `files`, its ref moved: (its tree, its commit)."""
    tree = build(repo, files)
    commit = repo.commit(tree, [], "round 1", "t")
    repo.set_ref(task_ref("t"), commit)
    return tree, commit


def test_a_round_is_one_pack_written_when_its_ref_moves(repo: ShadowRepo) -> None:
    one = blob(repo, "one")
    base = build(repo, {"a/b/c/file.txt": one, "a/side.txt": one, "top.txt": one})
    c1 = repo.commit(base, [], "round 1", "t")
    # held in memory until a ref names them: nothing on disk yet but the blob, and the
    # repository answers for them all the same (a round asks for its parent)
    assert _packs(repo) == {} and _loose_ids(repo) == {one.oid}
    assert not _on_disk(repo, c1)
    assert repo.has_object(c1) and base is not None and repo.has_object(base)
    repo.set_ref(task_ref("t"), c1)
    packs = _packs(repo)
    assert list(packs.values()) == [_trees_and_commit(repo, c1)]  # one pack: the 4 trees and the commit
    assert _loose_ids(repo) == {one.oid}
    assert git(repo, "cat-file", "-p", f"{task_ref('t')}:a/b/c/file.txt").stdout == "one"
    # the next round's pack holds only what it changed: the trees above the file, its commit
    two = blob(repo, "two")
    tree2 = repo.patch_tree(base, {RepoPath("a/b/c/file.txt"): two})
    c2 = repo.commit(tree2, [c1], "round 2", "t")
    repo.set_ref(task_ref("t"), c2, in_place=True)
    (new,) = set(_packs(repo)) - set(packs)
    unchanged = git(repo, "rev-parse", f"{c2}:a/side.txt", f"{c1}:a/side.txt").stdout.split()
    assert unchanged[0] == unchanged[1]
    assert _packs(repo)[new] == _trees_and_commit(repo, c2) - {git(repo, "rev-parse", f"{c2}:top.txt").stdout.strip()}
    assert len(_packs(repo)[new]) == 5  # the commit, the root, a, a/b, a/b/c
    assert git(repo, "log", "--format=%s", task_ref("t")).stdout.split("\n")[:2] == ["round 2", "round 1"]
    _fsck(repo)


def test_an_object_read_through_libgit2_is_written_first(repo: ShadowRepo) -> None:
    tree = build(repo, {"d/f.txt": blob(repo, "f"), "g.txt": blob(repo, "g")})
    other = ShadowRepo.open_existing(repo.git_dir)  # another process's view: the disk's
    try:
        assert not other.has_object(tree)  # type: ignore[arg-type]
        assert set(repo.list_tree(tree)) == {"d/f.txt", "g.txt"}  # read by libgit2: written first
        assert other.has_object(tree)  # type: ignore[arg-type]
        assert set(other.list_tree(tree)) == {"d/f.txt", "g.txt"}
    finally:
        other.close()
    # closing a handle writes what it still holds
    commit = repo.commit(tree, [], "held", "t")
    assert not _on_disk(repo, commit)
    repo.close()
    assert _on_disk(repo, commit)


def test_a_refused_pack_moves_no_ref_and_forgets_what_it_held(repo: ShadowRepo,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    one = blob(repo, "one")
    base, c1 = _first_round(repo, {"a/b/file.txt": one})
    tree2 = repo.patch_tree(base, {RepoPath("a/b/file.txt"): blob(repo, "two")})
    c2 = repo.commit(tree2, [c1], "round 2", "t")
    write_file = loose.write_file

    def full(git_dir: Path, content: bytes, final: str, *args: object, **kwargs: object) -> None:
        if final.endswith(".idx"):  # the .pack landed, its index did not
            raise StorageFailedError(loose.storage_message(git_dir, "write a pack", OSError(errno.ENOSPC, "full")))
        write_file(git_dir, content, final, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(loose, "write_file", full)
    with pytest.raises(StorageFailedError, match="could not write a pack: full"):
        repo.set_ref(task_ref("t"), c2)
    monkeypatch.setattr(loose, "write_file", write_file)
    assert repo.read_ref(task_ref("t")) == c1  # not moved
    assert not repo.has_object(c2) and not _on_disk(repo, c2)
    # the round's trees are not taken as held any more: patching on one finds it missing
    with pytest.raises(ObjectMissingError):
        repo.patch_tree(tree2, {RepoPath("x"): one})
    # the pack without its index is never read; the next round writes everything again
    assert len(list(_pack_dir(repo).glob("*.pack"))) == 2 and len(_packs(repo)) == 1
    tree2 = repo.patch_tree(base, {RepoPath("a/b/file.txt"): blob(repo, "two")})
    c2 = repo.commit(tree2, [c1], "round 2", "t")
    repo.set_ref(task_ref("t"), c2)
    assert git(repo, "cat-file", "-p", f"{task_ref('t')}:a/b/file.txt").stdout == "two"
    _fsck(repo)


def test_small_packs_are_merged_into_one_and_every_object_stays(repo: ShadowRepo,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shadow_repo, "SMALL_PACK_OBJECTS", 40)
    # a pack at least that big is not merged: the baseline's
    tree = build(repo, {f"d{i}/f{j}.txt": blob(repo, f"{i}.{j}") for i in range(40) for j in range(2)})
    head = repo.commit(tree, [], "baseline", "t")
    repo.set_ref(task_ref("t"), head)
    (big,) = _packs(repo)
    commits = [head]
    for r in range(shadow_repo.MERGE_PACKS_AT - 1):  # with the baseline's, MERGE_PACKS_AT packs written
        assert not repo.merge_due
        tree = repo.patch_tree(tree, {RepoPath(f"d{r}/f0.txt"): blob(repo, f"round {r}")})
        commits.append(repo.commit(tree, [commits[-1]], f"round {r}", "t"))
        repo.set_ref(task_ref("t"), commits[-1], in_place=True)
    assert repo.merge_due
    before = _packs(repo)
    assert len(before) == shadow_repo.MERGE_PACKS_AT
    assert repo.merge_small_packs() == shadow_repo.MERGE_PACKS_AT - 1
    after = _packs(repo)
    assert set(after) - {big} and len(after) == 2 and after[big] == before[big]
    (merged,) = set(after) - {big}
    assert after[merged] == set().union(*(ids for name, ids in before.items() if name != big))
    assert not repo.merge_due
    _fsck(repo)
    for c in commits:
        assert repo.has_object(c) and _on_disk(repo, c)
    # the handle goes on from memory: the next round patches the newest tree
    tree = repo.patch_tree(tree, {RepoPath("new.txt"): blob(repo, "new")})
    last = repo.commit(tree, [commits[-1]], "after the merge", "t")
    repo.set_ref(task_ref("t"), last, in_place=True)
    assert git(repo, "rev-list", "--count", task_ref("t")).stdout.strip() == str(len(commits) + 1)
    assert len(after[merged]) >= shadow_repo.SMALL_PACK_OBJECTS  # merged no further
    assert repo.merge_small_packs() == 0  # one small pack alone stays as it is
    assert len(_packs(repo)) == 3
    _fsck(repo)


def test_a_collection_completes_while_a_round_lands_during_its_walk(repo: ShadowRepo) -> None:
    one = blob(repo, "one")
    base = build(repo, {"a/file.txt": one, "b.txt": one})
    c1 = repo.commit(base, [], "round 1", "t1")
    repo.set_ref(task_ref("t1"), c1)
    doomed = repo.commit(build(repo, {"gone.txt": blob(repo, "a deleted task's")}), [], "doomed", "t2")
    repo.set_ref(task_ref("t2"), doomed)
    repo.delete_ref(task_ref("t2"))
    other = ShadowRepo.open_existing(repo.git_dir)  # the sidecar that checkpoints meanwhile
    landed: list[str] = []

    def progress(done: int, total: int) -> None:
        if not landed:  # the collection wrote its pack, without the lock: a round lands
            with other.blobs_for_ref():  # its blob in its pack, which the collection must keep
                # (written whole: a base tree read through libgit2 would write the blob loose first)
                tree = other.patch_tree(None, {RepoPath("a/file.txt"): TreeEntry(other.write_blob(b"two"), MODE_FILE),
                                               RepoPath("b.txt"): one})
                landed.append(other.commit(tree, [c1], "round 2", "t1"))
                other.set_ref(task_ref("t1"), landed[0], in_place=True)

    try:
        repo.collect_garbage(grace_s=0, progress=progress)
    finally:
        other.close()
    assert landed
    # not put off for the round's pack (its objects are in none of the packs removed)
    assert not _on_disk(repo, doomed)
    assert git(repo, "cat-file", "-p", f"{task_ref('t1')}:a/file.txt").stdout == "two"
    assert loose.object_id(b"blob", b"two") not in _loose_ids(repo)  # from the round's pack
    assert git(repo, "rev-list", task_ref("t1")).stdout.split() == [landed[0], c1]
    _fsck(repo)


def test_a_pack_left_without_its_index_is_removed_once_old(repo: ShadowRepo, workspace: Path) -> None:
    pack_dir = _pack_dir(repo)
    pack_dir.mkdir(parents=True, exist_ok=True)
    old, young = pack_dir / f"pack-{'1' * 40}.pack", pack_dir / f"pack-{'2' * 40}.pack"
    for orphan in (old, young):
        orphan.write_bytes(b"PACK\0\0\0\2\0\0\0\0")
    past = time.time() - shadow_repo.ORPHAN_PACK_S - 60
    os.utime(old, (past, past))
    c = repo.commit(build(repo, {"f": blob(repo, "f")}), [], "m", "t")
    repo.set_ref(task_ref("t"), c)
    (kept,) = _packs(repo)
    repo.close()
    again = ShadowRepo.open_or_init(repo.git_dir, workspace)  # an open sweeps what killed writers left
    try:
        assert not old.exists()
        assert young.exists()  # maybe a collection between its two renames
        assert set(_packs(again)) == {kept} and again.has_object(c)
    finally:
        again.close()


def test_a_big_patch_is_written_in_packs_of_at_most_held_max_objects(repo: ShadowRepo,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shadow_repo, "HELD_MAX", 4)
    files = {f"d{i}/e{j}/f.txt": blob(repo, f"{i}.{j}") for i in range(3) for j in range(3)}
    tree = build(repo, files)  # 3 * 3 + 3 + 1 trees: written 4 at a time as they are made
    assert [len(ids) for ids in _packs(repo).values()] == [4, 4, 4]
    c = repo.commit(tree, [], "m", "t")
    repo.set_ref(task_ref("t"), c)
    assert sorted(len(ids) for ids in _packs(repo).values()) == [2, 4, 4, 4]  # the root tree and the commit
    assert repo.list_tree(tree) == files
    _fsck(repo)


def _in_a_pack(repo: ShadowRepo, oid: str) -> bool:
    return any(oid in ids for ids in _packs(repo).values())


def test_a_rounds_blobs_go_into_the_pack_its_ref_move_writes(repo: ShadowRepo) -> None:
    base, c1 = _first_round(repo, {"a/file.txt": blob(repo, "one")})  # outside a round's block: loose
    loose_before, packs_before = _loose_ids(repo), _packs(repo)
    big = "".join(f"line {i} of a file larger than a block\n" for i in range(400))
    with repo.blobs_for_ref():
        two, small = blob(repo, big), blob(repo, "s")
        assert repo.has_object(two.oid) and not _on_disk(repo, two.oid)  # held, answered from memory
        tree2 = repo.patch_tree(base, {RepoPath("a/file.txt"): two, RepoPath("s.txt"): small})
        c2 = repo.commit(tree2, [c1], "round 2", "t")
        repo.set_ref(task_ref("t"), c2, in_place=True)
    assert _loose_ids(repo) == loose_before  # not one loose object for the round
    (new,) = set(_packs(repo)) - set(packs_before)
    assert {two.oid, small.oid} <= _packs(repo)[new] and c2 in _packs(repo)[new]
    assert git(repo, "cat-file", "-p", f"{task_ref('t')}:a/file.txt").stdout == big
    assert git(repo, "cat-file", "-p", f"{task_ref('t')}:s.txt").stdout == "s"
    _fsck(repo)


def test_a_held_blob_no_ref_move_names_is_written_loose(repo: ShadowRepo, monkeypatch: pytest.MonkeyPatch) -> None:
    # a round whose commit was not wanted: the block ends with the blob still held
    with repo.blobs_for_ref():
        kept = blob(repo, "a round not wanted")
        assert not _on_disk(repo, kept.oid)
    assert kept.oid in _loose_ids(repo) and not _in_a_pack(repo, kept.oid)
    # libgit2 reads: the trees go into a pack, the blob loose (no ref names it yet)
    with repo.blobs_for_ref():
        read = blob(repo, "read")
        tree = build(repo, {"r.txt": read})
        assert set(repo.list_tree(tree)) == {"r.txt"}
        assert read.oid in _loose_ids(repo) and not _in_a_pack(repo, read.oid)
        assert tree is not None and _in_a_pack(repo, tree)
    # a blob beyond what may be held is written at once
    monkeypatch.setattr(shadow_repo, "HELD_BLOB_BYTES", 10)
    with repo.blobs_for_ref():
        assert blob(repo, "0123456789").oid not in _loose_ids(repo)  # held: within the budget
        beyond = blob(repo, "over the budget")
        assert beyond.oid in _loose_ids(repo)
    _fsck(repo)


def test_a_held_blob_is_read_from_memory_and_nothing_is_written(repo: ShadowRepo) -> None:
    """A restore's merge reads the safety checkpoint's blobs while they are held: reading one
    writes nothing (no pack, no loose file in the middle of the restore), and the ref's move
    still puts them in its pack."""
    base, c1 = _first_round(repo, {"a.txt": blob(repo, "a")})
    loose_before, packs_before = _loose_ids(repo), _packs(repo)
    with repo.blobs_for_ref():
        held = blob(repo, "the person's version\n")
        tree = repo.patch_tree(base, {RepoPath("a.txt"): held})
        assert repo.read_blob(held.oid) == b"the person's version\n"
        assert repo.read_blob(blob(repo, "a").oid) == b"a"  # one on disk: read from there
        assert _loose_ids(repo) == loose_before and _packs(repo) == packs_before, "a read wrote something"
        c2 = repo.commit(tree, [c1], "safety", "t")
        repo.set_ref(task_ref("t"), c2)
    (new,) = set(_packs(repo)) - set(packs_before)
    assert held.oid in _packs(repo)[new] and _loose_ids(repo) == loose_before
    _fsck(repo)


def _asked(repo: ShadowRepo, method: str, monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """The ids `repo.<method>` is asked for from now on (it still answers)."""
    asked: list[object] = []
    plain = getattr(repo, method)

    def noting(oid: object) -> object:
        asked.append(oid)
        return plain(oid)

    monkeypatch.setattr(repo, method, noting)
    return asked


def test_the_last_packs_small_blobs_are_read_from_memory(repo: ShadowRepo, monkeypatch: pytest.MonkeyPatch) -> None:
    """A keep-mine restore writes its merged blob into the ref's pack, then into the workspace:
    read back from memory, without libgit2 (which would rescan its pack folder and open the
    new pack). Only the last flush's, and only up to FLUSHED_BLOB_BYTES of them."""
    base, c1 = _first_round(repo, {"a.txt": blob(repo, "a")})
    with repo.blobs_for_ref():
        merged = blob(repo, "the merged version\n")
        c2 = repo.commit(repo.patch_tree(base, {RepoPath("a.txt"): merged}), [c1], "restore", "t")
        repo.set_ref(task_ref("t"), c2)
    assert _in_a_pack(repo, merged.oid)

    def no_libgit2(oid: object) -> None:
        raise AssertionError(f"libgit2 was asked for {oid}")

    with monkeypatch.context() as m:
        m.setattr(repo, "_raw", no_libgit2)
        assert repo.read_blob(merged.oid) == b"the merged version\n"
    # the next flush lets them go; a pack's blobs beyond the budget are not kept
    monkeypatch.setattr(shadow_repo, "FLUSHED_BLOB_BYTES", 10)
    with repo.blobs_for_ref():
        big = blob(repo, "more than ten bytes")
        c3 = repo.commit(repo.patch_tree(base, {RepoPath("a.txt"): big}), [c2], "round", "t")
        repo.set_ref(task_ref("t"), c3)
    asked = _asked(repo, "_raw", monkeypatch)
    assert repo.read_blob(big.oid) == b"more than ten bytes" and asked
    asked.clear()
    assert repo.read_blob(merged.oid) == b"the merged version\n" and asked
    _fsck(repo)


def test_trees_above_a_held_blob_are_written_without_asking_the_repository(
    repo: ShadowRepo, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tree naming a blob held for the next flush is new (a tree on disk names only objects on
    disk): a restore's patch (`expect_new=False`) asks the repository only about trees above old
    blobs, each such miss a rescan of libgit2's pack folder."""
    old, c1 = _first_round(repo, {"a/b/c.txt": blob(repo, "c"), "a/b/d.txt": blob(repo, "d")})
    repo.reopen()  # the trees are not the handle's recent ones, as in a later task's restore
    asked = _asked(repo, "has_object", monkeypatch)
    with repo.blobs_for_ref():
        merged = blob(repo, "merged")
        assert not _on_disk(repo, merged.oid)
        tree = repo.patch_tree(old, {RepoPath("a/b/c.txt"): merged}, expect_new=False)
        assert asked == []
        back = repo.patch_tree(tree, {RepoPath("a/b/c.txt"): blob(repo, "c")}, expect_new=False)
        assert back == old and asked  # old blobs: the repository is asked, and holds the trees
        repo.set_ref(task_ref("t"), repo.commit(tree, [c1], "restore", "t"))
    assert git(repo, "cat-file", "-p", f"{task_ref('t')}:a/b/c.txt").stdout == "merged"
    _fsck(repo)


def test_reading_an_old_tree_or_merging_writes_only_what_libgit2_reads(repo: ShadowRepo) -> None:
    """A keep-mine restore looks up the target's entries in an old tree and merges with a held
    blob: the lookup writes nothing held, the merge writes only its held blob (loose), and the
    trees and commits wait for the ref's pack: one pack per restore."""
    old, c1 = _first_round(repo, {"a.txt": blob(repo, "one\ntwo\nthree\n")})
    loose_before, packs_before = _loose_ids(repo), _packs(repo)
    with repo.blobs_for_ref():
        mine = blob(repo, "one\ntwo\nthree\nmine\n")
        tree = repo.patch_tree(old, {RepoPath("a.txt"): mine})
        safety = repo.commit(tree, [c1], "safety", "t")
        assert repo.lookup(old, RepoPath("a.txt")) == blob(repo, "one\ntwo\nthree\n")
        assert repo.lookup(tree, RepoPath("a.txt")) == mine  # a held tree: written first
        assert _packs(repo) != packs_before
        loose_before, packs_before = _loose_ids(repo), _packs(repo)
        other = repo.commit(repo.patch_tree(tree, {RepoPath("b.txt"): blob(repo, "b")}), [safety], "b", "t")
        theirs = blob(repo, "zero\none\ntwo\nthree\n")
        assert _packs(repo) == packs_before and _loose_ids(repo) == loose_before
        assert repo.lookup(old, RepoPath("a.txt")) is not None
        merged = repo.merge_file("a.txt", blob(repo, "one\ntwo\nthree\n"), mine, theirs)
        assert merged == b"zero\none\ntwo\nthree\nmine\n"
        assert _packs(repo) == packs_before, "the lookup or the merge wrote the held trees"
        assert _loose_ids(repo) - loose_before == {theirs.oid}  # the held blob libgit2 read; not "b"
        repo.set_ref(task_ref("t"), other)
    (new,) = set(_packs(repo)) - set(packs_before)
    assert other in _packs(repo)[new]
    _fsck(repo)


def test_trees_written_without_a_flush_name_no_held_blob(repo: ShadowRepo) -> None:
    """A tree built from nothing goes straight into a pack: the blobs it names that are held
    are written first, so a written tree never names a held object (what lets a lookup in a
    written tree skip the flush)."""
    with repo.blobs_for_ref():
        held = blob(repo, "held while the trees are packed")
        assert not _on_disk(repo, held.oid)
        tree = repo.write_tree_packed([("a/b.txt", MODE_FILE, bytes.fromhex(held.oid))])
        assert _on_disk(repo, held.oid), "a packed tree names a blob not yet written"
        assert repo.lookup(tree, RepoPath("a/b.txt")) == held
        repo.set_ref(task_ref("t"), repo.commit(tree, [], "rebuilt", "t"))
    _fsck(repo)


def test_a_refused_pack_drops_its_blobs_with_its_trees(repo: ShadowRepo, monkeypatch: pytest.MonkeyPatch) -> None:
    write_file = loose.write_file

    def full(git_dir: Path, content: bytes, final: str, *args: object, **kwargs: object) -> None:
        if final.endswith(".pack"):
            raise StorageFailedError(loose.storage_message(git_dir, "write a pack", OSError(errno.ENOSPC, "full")))
        write_file(git_dir, content, final, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(loose, "write_file", full)
    with pytest.raises(StorageFailedError, match="could not write a pack: full"), repo.blobs_for_ref():
        lost = blob(repo, "held when the pack was refused")
        c1 = repo.commit(build(repo, {"x.txt": lost}), [], "round 1", "t")
        repo.set_ref(task_ref("t"), c1)
    monkeypatch.setattr(loose, "write_file", write_file)
    # the blob went with the trees above it, which the next round finds missing (and so
    # rebuilds the tracked set: tests/faults/test_storage.py)
    assert not repo.has_object(lost.oid) and not _on_disk(repo, lost.oid)
    assert repo.read_ref(task_ref("t")) is None and not repo.has_object(c1)
    with pytest.raises(ObjectMissingError):
        repo.commit_tree(c1)
