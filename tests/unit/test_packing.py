"""Garbage collection's own pack writer and its packs kept between collections (issue 13):
git itself (`fsck`, `verify-pack`) is the oracle for the files written."""

from __future__ import annotations

import hashlib
import os
import random
import subprocess
import zlib
from collections.abc import Collection, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar, cast

import pygit2
import pytest

from shadowpoint.engine import ENGINE_MAPPED_BYTES
from shadowpoint.errors import RepoError
from shadowpoint.stage.early_capture import EarlyCapture
from shadowpoint.stage.exclusions import WalkPart
from shadowpoint.stage.scanner import (
    Scanner,
    StageStats,
    _encoded,
    _in_runs,
    _listed_trees,
    _other_runs,
    _Staging,
    _top_below,
    _trees_share,
)
from shadowpoint.stage.stat_cache import StatCache
from shadowpoint.store import loose, packing, shadow_repo, values
from shadowpoint.store.shadow_repo import ShadowRepo
from shadowpoint.store.values import task_ref
from shadowpoint.workspace import RepoPath
from tests.unit.test_shadow_repo import blob, build, git

P = TypeVar("P", bound=str)  # a path: RepoPath, or a plain str


@pytest.fixture
def repo(tmp_path: Path, workspace: Path) -> Iterator[ShadowRepo]:
    r = ShadowRepo.open_or_init(tmp_path / "shadow" / ".git", workspace)
    yield r
    r.close()


@pytest.fixture
def small_packs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pack sizes of a big repository, scaled down to a test's."""
    monkeypatch.setattr(shadow_repo, "GC_PACK_OBJECTS", 7)
    monkeypatch.setattr(shadow_repo, "GC_KEEP_PACK_OBJECTS", 5)


def _history(repo: ShadowRepo, task: str, files: int, rounds: int, seed: int) -> tuple[str, dict[str, bytes]]:
    rng = random.Random(seed)
    content = {f"d{i % 4}/f{i}.txt": rng.randbytes(rng.randint(0, 3000)) for i in range(files)}
    content["big.bin"] = rng.randbytes(70_000)  # a size header of several bytes
    tree = build(repo, {p: blob(repo, d) for p, d in content.items()})
    head = repo.commit(tree, [], "baseline", task)
    for r in range(rounds):
        path = f"d0/f{r % 3 * 4}.txt"
        content[path] = content[path] + f"round {r}\n".encode()
        tree = repo.patch_tree(tree, {RepoPath(path): blob(repo, content[path])})
        head = repo.commit(tree, [head], f"round {r}", task)
    repo.set_ref(task_ref(task), head)
    return head, content


def _packs(repo: ShadowRepo) -> set[str]:
    return {p.stem for p in (repo.git_dir / "objects" / "pack").glob("pack-*.pack")}


def test_collection_packs_everything_git_can_verify(repo: ShadowRepo, small_packs: None) -> None:
    head, content = _history(repo, "t1", files=30, rounds=6, seed=1)
    doomed, _ = _history(repo, "t2", files=12, rounds=1, seed=2)
    repo.delete_ref(task_ref("t2"))
    seen: list[tuple[int, int]] = []
    before = _packs(repo)  # t1's trees and commits, one pack (`flush`): all reachable, so kept
    kept, freed = repo.collect_garbage(grace_s=0, progress=lambda done, total: seen.append((done, total)))
    assert kept == len(repo.reachable_objects([head])) and freed > 0
    new_packs = _packs(repo) - before
    written = sum(len(packing.pack_objects(repo.git_dir / "objects" / "pack" / f"{s}.idx")) for s in new_packs)
    assert not repo.has_object(doomed)
    assert git(repo, "fsck", "--full", "--strict", "--no-dangling").returncode == 0
    packs = _packs(repo)
    assert len(packs) >= 2, "the plain packs (several, GC_PACK_OBJECTS each) and the delta pack"
    for stem in packs:
        verify = git(repo, "verify-pack", "-v", str(repo.git_dir / "objects" / "pack" / f"{stem}.idx"))
        assert "ok" in verify.stdout.splitlines()[-1]
    assert seen and seen[-1][0] == seen[-1][1] == written < kept
    assert not any((repo.git_dir / "objects").glob("[0-9a-f][0-9a-f]/*")), "no loose object is left"
    listed = repo.list_tree(repo.commit_tree(head))
    for path, data in content.items():
        assert repo.read_blob(listed[RepoPath(path)].oid) == data


def test_a_collection_writes_commits_and_trees_before_the_blobs(repo: ShadowRepo,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """As git orders a pack: a walk of the trees then reads one stretch of it, not pages spread
    through every blob (a sidecar kept 250 MiB of a 100k-file pack mapped)."""
    monkeypatch.setattr(shadow_repo, "GC_KEEP_PACK_OBJECTS", 30)  # the rounds' pack of trees is merged
    _history(repo, "t1", files=40, rounds=3, seed=4)
    before = _packs(repo)
    repo.collect_garbage(grace_s=0)
    (plain,) = [s for s in _packs(repo) - before
                if len(packing.pack_objects(repo.git_dir / "objects" / "pack" / f"{s}.idx")) >= 30]
    verify = git(repo, "verify-pack", "-v", str(repo.git_dir / "objects" / "pack" / f"{plain}.idx")).stdout
    rows = [line.split() for line in verify.splitlines()]
    kinds = [kind for _, kind in sorted((int(row[4]), row[1]) for row in rows
                                        if len(row) >= 5 and row[1] in ("commit", "tree", "blob"))]
    assert {"commit", "tree", "blob"} <= set(kinds)
    assert kinds.index("blob") == len(kinds) - kinds.count("blob"), kinds
    assert git(repo, "fsck", "--full", "--strict", "--no-dangling").returncode == 0


def test_packs_without_garbage_are_kept_and_an_interrupted_collection_resumes(
        repo: ShadowRepo, small_packs: None, monkeypatch: pytest.MonkeyPatch) -> None:
    head, _ = _history(repo, "t1", files=40, rounds=4, seed=3)
    written: list[str] = []
    real_write = packing.write_pack

    def interrupted_after_two(*args: object, **kwargs: object) -> Path:
        if len(written) == 2:
            raise KeyboardInterrupt  # Ctrl-C in the middle of a collection
        idx: Path = real_write(*args, **kwargs)  # type: ignore[arg-type]
        written.append(idx.stem)
        return idx

    monkeypatch.setattr(packing, "write_pack", interrupted_after_two)
    with pytest.raises(KeyboardInterrupt):
        repo.collect_garbage(grace_s=0)
    assert git(repo, "fsck", "--full", "--no-dangling").returncode == 0, "an interrupted collection breaks nothing"
    assert set(written) <= _packs(repo)
    monkeypatch.setattr(packing, "write_pack", real_write)
    repo.collect_garbage(grace_s=0)
    assert set(written) <= _packs(repo), "the packs an interrupted collection installed are kept"
    assert git(repo, "fsck", "--full", "--no-dangling").returncode == 0
    before = _packs(repo)
    repo.collect_garbage(grace_s=0)
    big = {s for s in before if len(packing.pack_objects(repo.git_dir / "objects" / "pack" / f"{s}.idx")) >= 5}
    assert big <= _packs(repo), "a collection with nothing to free rewrites no big pack"
    assert repo.reachable_objects([head]) <= {o for s in _packs(repo) for o in
                                              packing.pack_objects(repo.git_dir / "objects" / "pack" / f"{s}.idx")}


def test_a_baseline_tree_written_as_one_pack_equals_the_patched_tree(repo: ShadowRepo, tmp_path: Path) -> None:
    """`write_tree_packed` gives the very tree `patch_tree` writes (git's name order with
    folders sorted as "name/", modes, names that are not UTF-8), as one pack git verifies."""
    rng = random.Random(7)
    names = ["a", "a.b", "a-b", "a0", "b", "é", "x\udcff", "z z"]
    entries: dict[RepoPath, values.TreeEntry | None] = {}
    for i in range(400):
        parts = [rng.choice(names) + (str(rng.randrange(3)) if d < 2 else "") for d in range(rng.randrange(1, 5))]
        path = RepoPath("/".join(parts) + f"/f{i}" if rng.random() < 0.8 else "/".join(parts))
        if any(p.startswith(path + "/") or path.startswith(p + "/") for p in entries):
            continue  # a path that is both a file and a folder
        mode = rng.choice([values.MODE_FILE, values.MODE_EXEC, values.MODE_LINK])
        entries[path] = values.TreeEntry(repo.write_blob(f"content {i % 50}".encode()), mode)
    entries[RepoPath("gone")] = None
    packs_before = _packs(repo)
    packed = repo.write_tree_packed(_sorted_files(entries))
    assert len(_packs(repo) - packs_before) == 1
    patched = repo.patch_tree(None, entries)
    assert packed == patched
    assert repo.list_tree(packed) == {p: e for p, e in entries.items() if e is not None}
    assert git(repo, "fsck", "--no-dangling", "--strict").returncode == 0
    some = entries[next(iter(entries))]
    for both in ({"a": some, "a/b": some}, {"a": some, "a-b": some, "a/b": some}, {"a/b/c": some, "a/b": some}):
        with pytest.raises(ValueError):
            repo.write_tree_packed(_sorted_files(both))
    with pytest.raises(ValueError):  # not sorted
        repo.write_tree_packed(reversed(_sorted_files(entries)))
    assert repo.write_tree_packed([]) is None


def test_a_root_over_runs_of_subtrees_equals_the_whole_tree(repo: ShadowRepo) -> None:
    """Two writers (a baseline's child and this process) each write the trees of one run of
    the sorted paths, cut at a top-level folder's end; the root over both is the tree one
    writer makes. A name in both runs (a file and a folder) is refused."""
    one, two = blob(repo, "one"), blob(repo, "two")
    entries: dict[str, values.TreeEntry | None] = {
        "a.txt": one, "a/x": one, "a/y/z": two, "a0": two, "b/c": one, "b-d": two, "c": one, "d/e/f": two}
    files = _sorted_files(entries)
    whole = repo.write_tree_packed(files)
    for cut in range(len(files) + 1):
        if 0 < cut < len(files) and files[cut - 1][0].split("/")[0] == files[cut][0].split("/")[0] \
                and "/" in files[cut][0]:
            continue  # inside a folder: `_trees_share` never cuts there
        parts = [repo.write_subtrees_packed(files[:cut]), repo.write_subtrees_packed(files[cut:])]
        assert repo.write_root_tree(parts) == whole, cut
    assert git(repo, "fsck", "--no-dangling", "--strict").returncode == 0
    assert repo.write_root_tree([repo.write_subtrees_packed([])]) is None
    clash = [repo.write_subtrees_packed(_sorted_files({"a": one})),
             repo.write_subtrees_packed(_sorted_files({"a/b": one}))]
    with pytest.raises(ValueError, match="both a file and a folder"):
        repo.write_root_tree(clash)


def test_the_trees_share_is_whole_top_level_folders() -> None:
    """The child's part of a baseline's trees: whole top-level folders and root files, the
    largest first, up to the share; the rest is this process's; together every path once."""
    paths = sorted(RepoPath(p) for p in ["a", "a.txt", "a/x", "a/y/z", "a0", "b/c", "b/d", "b/e", "c", "d/1", "d/2"])
    assert _trees_share(paths, 0.0) == ()
    assert _in_runs(paths, _trees_share(paths, 1.0)) == paths
    for share in (i / 20 for i in range(21)):
        runs = _trees_share(paths, share)
        mine = _in_runs(paths, _other_runs(runs, len(paths)))
        theirs = _in_runs(paths, runs)
        assert sorted(mine + theirs) == paths and len(theirs) <= len(paths) * share
        folders = {p.partition("/")[0] for p in theirs if "/" in p}
        assert not folders & {p.partition("/")[0] for p in mine if "/" in p}, share  # no folder on both sides
    assert _in_runs(paths, _trees_share(paths, 0.5)) == ["a/x", "a/y/z", "b/c", "b/d", "b/e"]  # 3 + 2 of 11


def test_a_tree_beyond_one_stored_block_is_read_by_git(repo: ShadowRepo) -> None:
    """Trees are kept in zlib's stored blocks of at most 65,535 bytes (`loose.stored_zlib`): a
    folder of 2,500 files (a ~100 KiB tree) takes two blocks, and git reads the pack."""
    one = blob(repo, "same content")
    entries: dict[RepoPath, values.TreeEntry | None] = {RepoPath(f"big/file-{i:05d}.txt"): one for i in range(2500)}
    entries[RepoPath("small/a")] = one
    packed = repo.write_tree_packed(_sorted_files(entries))
    assert packed is not None
    big = git(repo, "rev-parse", f"{packed}:big").stdout.strip()
    assert int(git(repo, "cat-file", "-s", big).stdout) > 0xFFFF
    assert packed == repo.patch_tree(None, entries)
    assert git(repo, "ls-tree", "-r", "--name-only", packed).stdout.split() == sorted(entries)
    assert git(repo, "fsck", "--no-dangling", "--strict").returncode == 0


@pytest.mark.parametrize("size", [0, 1, 300, 0xFFFE, 0xFFFF, 0x10000, 0x1FFFE, 0x1FFFF, 0x30001])
def test_stored_zlib_is_one_whole_zlib_stream(size: int) -> None:
    data = random.Random(size).randbytes(size)
    stream = zlib.decompressobj()
    assert stream.decompress(loose.stored_zlib(data)) == data
    assert stream.eof and not stream.unused_data


def _sorted_files(entries: Mapping[P, values.TreeEntry | None]) -> list[tuple[str, int, bytes]]:
    return sorted((p, e.mode, bytes.fromhex(e.oid)) for p, e in entries.items() if e is not None)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_pack_holds_answers_as_the_set_of_the_indexs_ids(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    ids = {rng.randbytes(20) for _ in range(rng.randint(0, 300))}
    ids |= {bytes(20), b"\xff" * 20, b"\x00" + b"\xff" * 19, b"\x7f" + bytes(19)}  # the fan-out's ends
    listed = set(rng.sample(sorted(ids), len(ids) // 2)) | {bytes(20), b"\xff" * 20}
    idx = tmp_path / "pack-test.idx"
    idx.write_bytes(packing._index_bytes([packing._index_record(raw, b"x", 12 + i) for i, raw in enumerate(listed)],
                                         bytes(20)))
    assert set(packing.pack_ids(idx)) == listed
    wanted = ids | {rng.randbytes(20) for _ in range(50)}
    assert packing.pack_holds(idx, wanted) == listed & wanted
    assert packing.pack_holds(idx, []) == set()
    idx.write_bytes(b"not an index")
    with pytest.raises(RepoError):
        packing.pack_holds(idx, wanted)


@pytest.fixture
def pack_windows() -> Iterator[None]:
    """libgit2's pack window settings (process-wide) as a fresh process has them, and back."""
    settings = pygit2.settings
    before = settings.mwindow_size, settings.mwindow_mapped_limit
    settings.mwindow_size, settings.mwindow_mapped_limit = 1 << 30, 8 << 30  # libgit2's defaults (64-bit)
    yield
    settings.mwindow_size, settings.mwindow_mapped_limit = before


def _mapped_pack_bytes(pack_dir: Path) -> int:
    """Bytes of `pack_dir`'s files resident in this process's mappings (/proc/self/smaps)."""
    total, in_pack = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()
        if head and "-" in head[0] and len(head) >= 5:  # a mapping's first line: range, perms, ..., path
            in_pack = len(head) >= 6 and head[5].startswith(str(pack_dir))
        elif in_pack and head[:1] == ["Rss:"]:
            total += int(head[1]) * 1024
    return total


def test_an_engine_keeps_at_most_its_limit_of_a_pack_mapped(repo: ShadowRepo, workspace: Path, make_engine: Any,
                                                            pack_windows: None) -> None:
    """Every object of a pack read: without a limit the pages stay mapped as long as the
    handle lives (a sidecar opened on a collected 100k-file shadow repository: 321 MiB); an
    engine lowers libgit2's limit for its process, and never raises a lower one."""
    rng = random.Random(5)
    oids = [repo.write_blob(rng.randbytes(1 << 20)) for _ in range(48)]  # incompressible: a 48 MiB pack
    pack_dir = repo.git_dir / "objects" / "pack"
    pack_dir.mkdir(parents=True, exist_ok=True)
    packing.write_pack(repo._repo, oids, pack_dir, level=1)
    for oid in oids:
        (repo.git_dir / "objects" / oid[:2] / oid[2:]).unlink()

    def read_all() -> int:
        repo.reopen()
        for oid in oids:
            assert len(repo.read_blob(oid)) == 1 << 20
        return _mapped_pack_bytes(pack_dir)

    assert read_all() > ENGINE_MAPPED_BYTES, "libgit2's default keeps the whole pack mapped"
    make_engine(workspace)
    assert pygit2.settings.mwindow_mapped_limit == ENGINE_MAPPED_BYTES
    assert 0 < read_all() <= ENGINE_MAPPED_BYTES
    pygit2.settings.mwindow_mapped_limit = 8 << 20  # a program's own, lower limit stays
    make_engine(workspace)
    assert pygit2.settings.mwindow_mapped_limit == 8 << 20


def test_a_handle_reopens_once_another_collection_removed_its_packs(repo: ShadowRepo, workspace: Path) -> None:
    """libgit2 takes an object found in a pack it loaded as written, even after another
    process's collection removed that pack (within 2 s of its last freshen of the pack): a
    checkpoint then named a missing blob. The collection leaves a new generation behind, and a
    handle that sees it reopens before writing."""
    data = b"garbage soon\n"
    head = repo.commit(build(repo, {"a.txt": blob(repo, data)}), [], "round", "t1")
    repo.set_ref(task_ref("t1"), head)
    repo.collect_garbage(grace_s=0)  # the blob is packed; this handle has that pack loaded
    oid = repo.write_blob(data)  # found in the pack: libgit2 freshens it and remembers when
    other = ShadowRepo.open_or_init(repo.git_dir, workspace)  # another process's handle
    try:
        other.delete_ref(task_ref("t1"))
        other.collect_garbage(grace_s=0)
        assert not other.has_object(oid), "the collection removed the pack holding the blob"
        assert repo.reopen_after_collection(), "the handle sees the collection and reopens"
        assert not repo.reopen_after_collection(), "once"
        assert repo.write_blob(data) == oid
        other.reopen()
        assert other.has_object(oid), "the write after the reopen is on disk"
        assert git(repo, "cat-file", "-e", oid).returncode == 0
    finally:
        other.close()


def test_a_pack_written_object_by_object_is_one_git_verifies(tmp_path: Path) -> None:
    """`PackStream` writes each object as it comes (an object added twice once), fills the
    count in at the end, and leaves a pack and index that `git verify-pack` accepts; one that
    is closed unfinished is only a temp file in its folder."""
    folder = tmp_path / "packs"
    folder.mkdir()
    made = {}
    with packing.PackStream(folder) as pack:
        for i in range(300):
            data = f"object {i % 200}\n".encode() * (i % 7 + 1)
            raw = hashlib.sha1(b"blob %d\0" % len(data) + data).digest()
            pack.add(raw, 3, data)
            made[raw.hex()] = data
        # larger than the stored stream's window, and than one stored block (64 KiB)
        for size in (513, 70_000, 300_000):
            data = random.Random(size).randbytes(size)
            raw = hashlib.sha1(b"blob %d\0" % len(data) + data).digest()
            pack.add(raw, 3, data)
            made[raw.hex()] = data
        idx = pack.finish()
    assert sorted(packing.pack_objects(idx)) == sorted(made)
    out = subprocess.run(["git", "verify-pack", "-v", str(idx)], capture_output=True, text=True, check=True).stdout
    assert sum(1 for line in out.splitlines() if " blob " in line) == len(made)
    unfinished = tmp_path / "unfinished"
    unfinished.mkdir()
    with packing.PackStream(unfinished) as pack:
        pack.add(b"\1" * 20, 3, b"x")
    assert [p.name for p in unfinished.iterdir()] == ["tmp_pack_sp"]


@pytest.mark.parametrize(("seed", "small"), [(0, 0), (1, 0), (2, 0), (3, 100), (4, 1000)])
def test_oid_set_is_exactly_a_set(seed: int, small: int) -> None:
    """`OidSet` (the pack writer's flat set of ids) answers as a `set` of the same ids would,
    through its growth, ids that share their first bytes (the same start slot), the all-zero
    id (its empty-slot marker), and the move of its first `small` ids from a `set` to it."""
    rng = random.Random(seed)
    prefixes = [rng.randbytes(4) for _ in range(5)]
    pool = [rng.randbytes(20) for _ in range(3000)]
    pool += [rng.choice(prefixes) + rng.randbytes(16) for _ in range(500)]
    pool += [bytes(20), b"\0" * 4 + b"\1" * 16]
    oids, expected = packing.OidSet(capacity=4, small=small), set()
    for _ in range(9000):
        raw = rng.choice(pool)
        assert oids.add(raw) == (raw not in expected)
        expected.add(raw)
        assert len(oids) == len(expected)
    assert all(not oids.add(raw) for raw in expected)


def test_a_folders_tree_is_that_of_the_outermost_folder_above_none_of_the_units() -> None:
    """Which tree of a split baseline holds a folder's files (`_top_below`): the unit the
    child walked, or this side's outermost folder that is above no unit; none for the root
    and the folders above units (their files are written around the others)."""
    theirs = WalkPart(frozenset({"a/deep/u", "c"}), inside=True)
    above = theirs.above
    assert above == {"a", "a/deep"}
    found = {folder: _top_below(folder, above) for folder in
             ("", "a", "a/deep", "a/deep/u", "a/deep/u/k/l", "a/deep/v", "a/deep/v/w", "a/y", "b", "b/c", "c", "c/d",
              "c.d", "c0/e")}
    assert found == {"": None, "a": None, "a/deep": None, "a/deep/u": "a/deep/u", "a/deep/u/k/l": "a/deep/u",
                     "a/deep/v": "a/deep/v", "a/deep/v/w": "a/deep/v", "a/y": "a/y", "b": "b", "b/c": "b", "c": "c",
                     "c/d": "c", "c.d": "c.d", "c0/e": "c0"}


def _folder_files(entries: dict[str, values.TreeEntry | None]) -> dict[str, shadow_repo.FolderFiles]:
    """The files of each folder of `entries`, as a walk lists them (by name) and proves them."""
    folders: dict[str, list[tuple[str, values.TreeEntry]]] = {}
    for path, entry in entries.items():
        assert entry is not None
        folder, _, name = path.rpartition("/")
        folders.setdefault(folder, []).append((name, entry))
    return {folder: shadow_repo.FolderFiles.of(
        [b"%o %s\0%s" % (entry.mode, os.fsencode(name), bytes.fromhex(entry.oid)) for name, entry in sorted(files)],
        all(name.isascii() for name, _ in files)) for folder, files in folders.items()}


def test_trees_of_listed_folders_equal_the_subtrees_of_the_whole_tree(repo: ShadowRepo) -> None:
    """The trees a split baseline's processes make of the entries of the folders they walked
    (`_listed_trees`, one pack) are the subtrees git's tree of all the files holds, in git's
    order (a folder sorts as if its name ended with "/", names by their bytes) and counting
    the files below them; a folder with an unproven file (`unclean`) leaves its own out."""
    one, two, link = blob(repo, "one"), blob(repo, "two"), values.TreeEntry(blob(repo, "x").oid, values.MODE_LINK)
    run = values.TreeEntry(two.oid, values.MODE_EXEC)
    entries: dict[str, values.TreeEntry | None] = {
        "r.txt": one, "a/x": one, "a/y/z": two, "a/y.txt": two, "a/y-z": run, "a/y0": link, "a/b/deep/er/f": one,
        "b/c": one, "b/d/e": two, "b/\u00e9t\u00e9": one, "b/zz": two, "b/\udcff.bin": one, "c/u/1": one, "c/v/2": two}
    whole = repo.write_tree_packed(_sorted_files(entries))
    listed = _folder_files(entries)
    assert not listed["b"].in_order and listed["a"].in_order
    polled: list[int] = []
    trees = _listed_trees(repo, listed, set(), {"c"}, lambda: polled.append(1))
    assert set(trees) == {"a", "b", "c/u", "c/v"} and polled  # a baseline serves early captures meanwhile
    for folder, (count, raw) in trees.items():
        sub = git(repo, "rev-parse", f"{whole}:{folder}").stdout.strip()
        assert (count, raw.hex()) == (len([p for p in entries if p.startswith(folder + "/")]), sub), folder
    assert set(_listed_trees(repo, listed, {"a/y", "c/v"}, {"c"})) == {"b", "c/u"}
    assert _listed_trees(repo, {}, set(), set()) == {}
    assert git(repo, "fsck", "--no-dangling", "--strict").returncode == 0


def test_a_listings_names_are_encoded_as_the_file_system_names_them() -> None:
    names = ["a.txt", "\u00e9t\u00e9", "\udcff.bin"]
    assert _encoded("\0".join(names)) == [os.fsencode(name) for name in names]


def test_trees_the_walkers_wrote_are_taken_only_where_they_still_hold() -> None:
    """A walker's tree of a folder is taken when the folder's paths are as many as it wrote it
    with and none was recorded since or captured early; none are taken when those left cover
    under a third of the paths (the trees are then written in two processes)."""
    ordered = sorted([*(f"a/{i}" for i in range(4)), *(f"b/{i}" for i in range(4)), *(f"c/{i}" for i in range(5))])

    def taken(trees: dict[str, tuple[int, bytes]], touched: Collection[str] = (), pinned: Collection[str] = ()
              ) -> set[str]:
        capture = EarlyCapture()
        capture.pinned.update(cast(Collection[RepoPath], pinned))
        run = _Staging(StatCache(), StageStats(), 0, capture=capture, unit_trees=trees,
                       touched=set(cast(Collection[RepoPath], touched)))
        run.proof = cast(Any, object())  # not doubted
        return set(Scanner._taken_units(run, cast(list[RepoPath], ordered)))

    ids = {folder: bytes([i]) * 20 for i, folder in enumerate("abc")}
    every = {"a": (4, ids["a"]), "b": (4, ids["b"]), "c": (5, ids["c"])}
    assert taken(every) == {"a", "b", "c"}
    assert taken(every, touched={"b/2"}) == {"a", "c"}
    assert taken(every, pinned={"a/0"}, touched={"zz"}) == {"b", "c"}
    assert taken({**every, "c": (4, ids["c"])}) == {"a", "b"}  # a path more than it was written with
    assert taken(every, touched={"a/1", "b/1"}) == {"c"}  # 5 of 13 paths: a third or more
    assert taken({"a": every["a"]}) == set()  # 4 of 13: under a third


@pytest.mark.parametrize("walk", ["small", "big", "passed by a commit"])
def test_the_walk_reaches_what_git_does_and_names_the_delta_candidates(
        repo: ShadowRepo, monkeypatch: pytest.MonkeyPatch, walk: str) -> None:
    """`reachable` against `git rev-list --objects`: the same objects, each once, commits and
    trees in `order`, blobs in `blobs`, a folder's objects together; `multi` is the paths with
    several versions (also between two tips: another task's version of a file), `names` their
    paths (every object's, in a small walk), also past the point where a big walk stops naming
    the others, whether an object of a tree or a commit passed it."""
    head, _ = _history(repo, "t1", files=30, rounds=6, seed=3)
    other = repo.commit(repo.patch_tree(repo.commit_tree(head), {RepoPath("d2/f2.txt"): blob(repo, "t2's")}), [],
                        "another task's", "t2")
    repo.flush()
    commits = set(git(repo, "rev-list", head, other).stdout.split())
    # the count the walk has when it appends its second commit (head): the other tip and its whole tree
    tip_tree = {line.split()[2] for line in git(repo, "ls-tree", "-r", "-t", other).stdout.splitlines()}
    threshold = {"small": 5_000, "big": 3,
                 "passed by a commit": 1 + len(tip_tree | {repo.commit_tree(other)}) + 1}[walk]
    monkeypatch.setattr(packing, "NAME_ALL_BELOW", threshold)
    reach = packing.reachable(repo._repo, [head, other])
    listed = git(repo, "rev-list", "--objects", other, head).stdout.split("\n")
    oracle = {line.split(" ", 1)[0]: line.partition(" ")[2] for line in listed if line}
    kinds = dict(line.split() for line in git(repo, "cat-file", "--batch-all-objects",
                                                "--batch-check=%(objectname) %(objecttype)").stdout.splitlines())
    order, blobs = [o.hex() for o in reach.order], [o.hex() for o in reach.blobs]
    assert {o.hex() for o in reach.objects} == set(oracle) and sorted(order + blobs) == sorted(oracle)
    assert {kinds[o] for o in order} == {"commit", "tree"} and {kinds[o] for o in blobs} == {"blob"}
    # the files the rounds edited, the other task's, their folders
    changed = {f"d0/f{r % 3 * 4}.txt" for r in range(6)} | {"d2/f2.txt", "d0", "d2", ""}
    multi = {o.hex() for o in reach.multi}
    assert multi == {oid for oid, path in oracle.items() if path in changed and oid not in commits}
    names = {o.hex(): path for o, path in reach.names.items()}
    assert all(names[o] == oracle[o] for o in multi)
    if threshold > len(oracle):
        assert names == {o: p for o, p in oracle.items() if o not in commits}
    else:
        assert set(names) == multi
    blobs_of_d1 = [i for i, o in enumerate(blobs) if oracle[o].startswith("d1/")]
    assert blobs_of_d1 == list(range(blobs_of_d1[0], blobs_of_d1[0] + len(blobs_of_d1))), "d1's objects together"
