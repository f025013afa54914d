"""The straight staging of a round's edited files (`Scanner.stage_edited_files`) against the
general one (`Scanner.stage` of the same forced paths), over random workspaces and edits.

Both stage the same disk from the same tracked set, one after the other, in one real shadow
repo. The straight one must either decline and leave its tracked set as it was, or come to
the same tree, the same stat cache entries and the same counts; and it must not decline the
case it is for (every reported path a tracked regular file, small enough, in real folders,
and no ignore or attributes file), so a version that always declines fails here too.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from shadowpoint.stage.exclusions import ExclusionRules
from shadowpoint.stage.scanner import Scanner, StageOptions, StageResult
from shadowpoint.stage.stager import StagePlan, is_rules_file
from shadowpoint.stage.stat_cache import StatCache, stat_fields, state_entry
from shadowpoint.store.shadow_repo import ShadowRepo
from shadowpoint.store.values import MODE_EXEC, MODE_FILE
from shadowpoint.workspace import RepoPath

MAX_BYTES = 64  # the size cap, small so that "too large" comes up
DIRS = ["", "d", "d/e/f/g"]  # the deep one is checked at once (`is_real_folder`)
NAMES = ["a", "b.sh", ".gitignore", "x.log"]  # x.log: excluded, tracked only once forced
PATHS = [f"{d}/{n}" if d else n for d in DIRS for n in NAMES]
PLAIN = [p for p in PATHS if not p.endswith((".gitignore", ".log"))]  # drawn more often: the case itself
CONTENTS = [b"", b"one\n", b"two\r\nlines\r\n", b"same size 1", b"same size 2", b"\x00bin\xff", b"x" * 65]

step = st.one_of(
    st.tuples(st.just("write"), st.sampled_from(PATHS), st.sampled_from(CONTENTS)),
    st.tuples(st.just("chmod"), st.sampled_from(PATHS)),
    st.tuples(st.just("delete"), st.sampled_from(PATHS)),
    st.tuples(st.just("link"), st.sampled_from(PATHS)),  # a file becomes a symlink
    st.tuples(st.just("folder"), st.sampled_from(PATHS)),  # a file becomes a folder
    st.tuples(st.just("dirlink"), st.sampled_from(["d", "d/e/f"])),  # a folder becomes a symlink to a copy
    st.tuples(st.just("restamp"), st.sampled_from(PATHS)),  # same size, its old times put back
    st.tuples(st.just("stage"), st.sets(st.sampled_from(PLAIN) | st.sampled_from(PATHS), min_size=1, max_size=3)),
    st.tuples(st.just("stage"), st.sets(st.sampled_from(PLAIN), min_size=1, max_size=2)),
)


def _apply(root: Path, op: tuple[Any, ...]) -> None:
    kind, target = op[0], root / op[1]
    if kind == "write":
        if target.is_symlink() or target.is_dir():
            _remove(target)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(op[2])
    elif kind == "chmod" and target.is_file() and not target.is_symlink():
        target.chmod(target.stat().st_mode ^ 0o111)
    elif kind == "delete" and (target.is_symlink() or target.exists()):
        _remove(target)
    elif kind == "link" and target.parent.is_dir():
        _remove(target)
        target.symlink_to("a")
    elif kind == "folder" and target.parent.is_dir():
        _remove(target)
        (target / "inside").mkdir(parents=True)
        (target / "inside" / "a").write_bytes(b"under a new folder\n")
    elif kind == "dirlink" and target.is_dir() and not target.is_symlink():
        copy = target.with_name(target.name + "-copy")
        shutil.rmtree(copy, ignore_errors=True)
        target.rename(copy)
        target.symlink_to(copy.name)
    elif kind == "restamp" and target.is_file() and not target.is_symlink():
        st = target.stat()
        data = target.read_bytes()
        target.write_bytes(bytes(reversed(data)) if data != data[::-1] else data + b"")
        os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns))


def _remove(path: Path) -> None:
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.is_dir():
        shutil.rmtree(path)


def _copy(cache: StatCache) -> StatCache:
    return StatCache(tree=cache.tree, base_commit=cache.base_commit, entries=dict(cache.entries))


def _comparable(cache: StatCache) -> dict[str, Any]:
    """Entries and stat data, without the `trusted` flag: the two stagings run a moment apart."""
    return {p: (state_entry(s), stat_fields(s)[:5]) for p, s in cache.entries.items()}


def _straight_case(root: Path, cache: StatCache, paths: set[str]) -> bool:
    """Whether every path is the case the straight staging is for, told from the disk."""
    for path in paths:
        known = cache.entries.get(RepoPath(path))
        if known is None or state_entry(known).mode not in (MODE_FILE, MODE_EXEC) or is_rules_file(RepoPath(path)):
            return False
        full = root / path
        if os.path.realpath(full.parent) != str(full.parent) or full.is_symlink() or not full.is_file():
            return False
        if full.stat().st_size > MAX_BYTES:
            return False
    return True


def _same_stats(a: StageResult, b: StageResult) -> None:
    assert a.tree == b.tree
    assert a.changed == b.changed
    assert sorted(a.stats.changed_paths) == sorted(b.stats.changed_paths)
    assert (a.stats.examined, a.stats.hashed, a.stats.changed) == (b.stats.examined, b.stats.hashed, b.stats.changed)
    assert not b.stats.skipped and not a.stats.skipped


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(start=st.dictionaries(st.sampled_from(PATHS), st.sampled_from(CONTENTS[:-1]), min_size=4),
       steps=st.lists(step, min_size=1, max_size=14))
def test_straight_staging_matches_the_general_one(start: dict[str, bytes], steps: list[tuple[Any, ...]]) -> None:
    with tempfile.TemporaryDirectory(prefix="straight-") as tmp:
        root = Path(os.path.realpath(tmp)) / "proj"
        for path, content in start.items():
            _apply(root, ("write", path, content))
        repo = ShadowRepo.open_or_init(Path(tmp) / "shadow" / ".git", root)
        try:
            scanner = Scanner(root, repo, ExclusionRules(root), StageOptions(max_file_bytes=MAX_BYTES))
            general = StatCache()
            scanner.stage(StagePlan(rescan=True), general)
            for op in steps:
                if op[0] != "stage":
                    _apply(root, op)
                    continue
                paths = frozenset(RepoPath(p) for p in op[1])
                straight, before = _copy(general), _copy(general)
                expected_straight = _straight_case(root, general, set(op[1]))
                ours = scanner.stage_edited_files(paths, straight)
                theirs = scanner.stage(StagePlan(forced=paths), general)
                if ours is None:
                    event("declined")
                    assert not expected_straight, f"declined its own case: {sorted(paths)}"
                    assert straight.tree == before.tree and straight.entries == before.entries
                else:
                    event("straight")
                    assert expected_straight
                    _same_stats(ours, theirs)
                    assert _comparable(straight) == _comparable(general)
        finally:
            repo.close()


def test_straight_staging_takes_a_changed_file_and_its_mode(tmp_path: Path) -> None:
    """A plain case by hand: two tracked files, one edited, one made executable; the tree the
    git CLI would read holds both changes, and nothing is staged twice."""
    root = tmp_path / "proj"
    (root / "d/e/f/g").mkdir(parents=True)
    (root / "d/e/f/g/deep.txt").write_bytes(b"v1\n")
    (root / "run.sh").write_bytes(b"echo\n")
    repo = ShadowRepo.open_or_init(tmp_path / "shadow" / ".git", root)
    try:
        scanner = Scanner(root, repo, ExclusionRules(root), StageOptions())
        cache = StatCache()
        first = scanner.stage(StagePlan(rescan=True), cache)
        (root / "d/e/f/g/deep.txt").write_bytes(b"v2, longer\n")
        (root / "run.sh").chmod(0o755)
        result = scanner.stage_edited_files({RepoPath("d/e/f/g/deep.txt"), RepoPath("run.sh")}, cache)
        assert result is not None and result.changed and result.tree != first.tree
        listing = repo.list_tree(result.tree)
        assert repo.read_blob(listing[RepoPath("d/e/f/g/deep.txt")].oid) == b"v2, longer\n"
        assert listing[RepoPath("run.sh")].mode == MODE_EXEC
        assert result.stats.hashed == 2 and sorted(result.stats.changed_paths) == ["d/e/f/g/deep.txt", "run.sh"]
        # unchanged since: examined, no change
        again = scanner.stage_edited_files({RepoPath("run.sh")}, cache)
        assert again is not None and not again.changed and again.tree == result.tree
        assert again.stats.examined == 1
    finally:
        repo.close()
