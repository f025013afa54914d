"""Unit tests for `shadowpoint.stage.git_index`: the index reader against `git ls-files --debug` and
`git ls-files -s` (the git CLI as oracle) on random repositories, versions 2, 3 and 4, and the
conditions that put the whole index in doubt."""

from __future__ import annotations

import hashlib
import os
import random
import re
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from shadowpoint.stage.git_index import IndexDoubt, IndexProof, _attribute_files, read_index
from shadowpoint.stage.stat_cache import RACY_MARGIN_NS, FileState, is_clean, pack_state, state_oid
from shadowpoint.store.values import MODE_EXEC, MODE_FILE, MODE_LINK
from tests.gitrepo import backdate, git, make_repo


def random_files(rng: random.Random, n: int) -> dict[str, bytes]:
    files: dict[str, bytes] = {}
    dirs = ["", "src/", "src/deep/er/", "docs/", "a-very-long-folder-name-" + "x" * 40 + "/", "ü/"]
    for i in range(n):
        name = rng.choice(dirs) + f"file{i}-" + "n" * rng.randrange(0, 90) + rng.choice([".py", ".txt", ""])
        files[name] = rng.randbytes(rng.randrange(0, 300))
    return files


def oracle(root: Path) -> dict[str, dict[str, int | str]]:
    """What git says about its index: `ls-files -s` and `ls-files --debug`."""
    out: dict[str, dict[str, int | str]] = {}
    for line in git(root, "-c", "core.quotePath=false", "ls-files", "-s", "-z").split(b"\0"):
        if not line:
            continue
        meta, path = line.split(b"\t", 1)
        mode, oid, stage = meta.split()
        out[os.fsdecode(path)] = {"mode": int(mode, 8), "oid": oid.decode(), "stage": int(stage)}
    debug = git(root, "-c", "core.quotePath=false", "ls-files", "--debug").decode()
    for block in re.finditer(r"^(\S.*)\n  ctime: (\d+):(\d+)\n  mtime: (\d+):(\d+)\n  dev: (\d+)\tino: (\d+)\n"
                             r"  uid: (\d+)\tgid: (\d+)\n  size: (\d+)\tflags: ([0-9a-f]+)", debug, re.M):
        fields = out[block.group(1)]
        for key, value in zip(("ctime_s", "ctime_ns", "mtime_s", "mtime_ns", "dev", "ino", "uid", "gid", "size"),
                              block.groups()[1:10], strict=True):
            fields[key] = int(value)
    return out


@pytest.mark.parametrize("version", [2, 3, 4])
@pytest.mark.parametrize("seed", [1, 2])
def test_reader_matches_git(tmp_path: Path, version: int, seed: int) -> None:
    rng = random.Random(seed * 10 + version)
    root = make_repo(tmp_path / "repo", random_files(rng, 60))
    (root / "link").symlink_to("src")
    os.chmod(next(iter(sorted(root.glob("src/*")))), 0o755)
    git(root, "add", "-A")
    # staged but uncommitted content; from version 3 an intent-to-add entry and skip-worktree
    # (extended flags: git writes version 3 at least then), and assume-valid
    (root / "new.txt").write_bytes(b"new\n")
    names = sorted(p for p in oracle(root) if p.startswith("docs/"))
    if version >= 3:
        git(root, "add", "-N", "new.txt")
        if names:
            git(root, "update-index", "--skip-worktree", names[0])
    else:
        git(root, "add", "new.txt")
    if len(names) > 1:
        git(root, "update-index", "--assume-unchanged", names[1])
    git(root, "update-index", "--index-version", str(version))
    index = read_index(root / ".git" / "index")
    expected = oracle(root)
    assert index.version == version
    assert [e.path for e in index.entries] == list(expected)
    for e in index.entries:
        want = expected[e.path]
        got = {"mode": e.mode, "oid": e.oid, "stage": e.stage, "ctime_s": e.ctime_s, "ctime_ns": e.ctime_ns,
               "mtime_s": e.mtime_s, "mtime_ns": e.mtime_ns, "dev": e.dev, "ino": e.ino, "uid": e.uid,
               "gid": e.gid, "size": e.size}
        assert got == {k: want[k] for k in got}, e.path
    by_path = {e.path: e for e in index.entries}
    assert by_path["new.txt"].intent_to_add == (version >= 3)
    if names:
        assert by_path[names[0]].skip_worktree == (version >= 3) and not by_path[names[0]].assume_valid
    if len(names) > 1:
        assert by_path[names[1]].assume_valid
    if version >= 3:
        # tags of `ls-files -v`: S skip-worktree, lower case assume-valid
        tags = dict(line.split(" ", 1)[::-1] for line in git(root, "ls-files", "-v").decode().splitlines())
        for path, e in by_path.items():
            if e.skip_worktree:
                assert tags[path] == "S"


def test_unmerged_entries_have_stages(tmp_path: Path) -> None:
    root = make_repo(tmp_path / "repo", {"f.txt": b"base\n"})
    git(root, "checkout", "-q", "-b", "other")
    (root / "f.txt").write_bytes(b"theirs\n")
    git(root, "commit", "-qam", "theirs")
    git(root, "checkout", "-q", "main")
    (root / "f.txt").write_bytes(b"ours\n")
    git(root, "commit", "-qam", "ours")
    with pytest.raises(Exception):  # noqa: B017 - the merge conflicts: git exits non-zero
        git(root, "merge", "-q", "other")
    stages = sorted(e.stage for e in read_index(root / ".git" / "index").entries if e.path == "f.txt")
    assert stages == [1, 2, 3]
    proof = IndexProof.load(root)
    assert proof is not None and "f.txt" not in proof.entries


def test_split_index_is_doubt(tmp_path: Path) -> None:
    root = make_repo(tmp_path / "repo", {"a.txt": b"a\n", "b.txt": b"b\n"})
    git(root, "update-index", "--split-index")
    with pytest.raises(IndexDoubt, match="split or sparse"):
        read_index(root / ".git" / "index")
    assert IndexProof.load(root) is None


def test_bad_checksum_and_truncation_are_doubt(tmp_path: Path) -> None:
    root = make_repo(tmp_path / "repo", {"a.txt": b"a\n"})
    data = (root / ".git" / "index").read_bytes()
    bad = tmp_path / "bad"
    bad.write_bytes(data[:40] + bytes([data[40] ^ 1]) + data[41:])
    with pytest.raises(IndexDoubt, match="checksum"):
        read_index(bad)
    bad.write_bytes(data[:30])
    with pytest.raises(IndexDoubt):
        read_index(bad)


def test_a_name_holding_a_nul_is_doubt(tmp_path: Path) -> None:
    """The names are checked together, after the loop: one that holds a NUL within its
    recorded length is still refused."""
    root = make_repo(tmp_path / "repo", {"ab.txt": b"a\n", "cd.txt": b"c\n"})
    data = bytearray((root / ".git" / "index").read_bytes())
    at = data.index(b"ab.txt")
    data[at + 1] = 0  # "a\0.txt", the length field unchanged
    body = bytes(data[:-20])
    bad = tmp_path / "bad"
    bad.write_bytes(body + hashlib.sha1(body).digest())
    with pytest.raises(IndexDoubt, match="NUL"):
        read_index(bad)


def test_attribute_files_are_found_among_the_joined_paths() -> None:
    paths = [".gitattributes", "a/.gitattributes", "a/x.gitattributes", "b/.gitattributesx", "x",
             ".gitattributes/y", "c/d/.gitattributes", "e/.gitattributes.gitattributes"]
    assert _attribute_files("\0".join(paths)) == [".gitattributes", "a/.gitattributes", "c/d/.gitattributes"]
    assert _attribute_files("") == [] and _attribute_files("src/app.py\0README") == []


@pytest.mark.parametrize(("where", "text", "doubted"), [
    ("config", "[core]\n\tautocrlf = true\n", True),
    ("config", "[core]\n\tautocrlf = input\n", True),
    ("config", "[core]\n\tautocrlf\n", True),
    ("config", "[core]\n\tautocrlf = false\n", False),
    ("config", "[core]\n\teol = crlf\n", True),
    ("config", "[core]\n\tattributesFile = /x\n", True),
    ("config", "[include]\n\tpath = /x\n", True),
    ('config', '[includeIf "gitdir:/x/"]\n\tpath = /x\n', True),
    ("config", '[filter "lfs"]\n\tclean = git-lfs clean -- %f\n', False),
    ("config", "[extensions]\n\tobjectFormat = sha256\n", True),
    ("global", "[core]\n\tautocrlf = true\n", True),
    ("xdg", "[core]\n\teol = lf\n", True),
    ("attributes", "*.txt text\n", True),
    ("attributes", "*.png binary\n", False),
    ("xdg-attributes", "* filter=x\n", True),
])
def test_configuration_doubt(tmp_path: Path, where: str, text: str, doubted: bool) -> None:
    root = make_repo(tmp_path / "repo", {"a.txt": b"a\n"})
    home = Path(os.environ["HOME"])
    target = {"config": root / ".git" / "config", "global": home / ".gitconfig",
              "xdg": Path(os.environ["XDG_CONFIG_HOME"]) / "git" / "config",
              "attributes": root / ".git" / "info" / "attributes",
              "xdg-attributes": Path(os.environ["XDG_CONFIG_HOME"]) / "git" / "attributes"}[where]
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target, "a") as fh:
        fh.write(text)
    assert (IndexProof.load(root) is None) == doubted


def test_environment_override_is_doubt(tmp_path: Path) -> None:
    root = make_repo(tmp_path / "repo", {"a.txt": b"a\n"})
    assert IndexProof.load(root, environ={"HOME": os.environ["HOME"]}) is not None
    assert IndexProof.load(root, environ={"HOME": os.environ["HOME"], "GIT_INDEX_FILE": "/x"}) is None
    assert IndexProof.load(root, environ={"HOME": os.environ["HOME"], "GIT_CONFIG_GLOBAL": "/x"}) is None


def test_worktree_git_file_and_no_repo_are_not_proofs(tmp_path: Path) -> None:
    main = make_repo(tmp_path / "repo", {"a.txt": b"a\n"})
    git(main, "worktree", "add", "-q", str(tmp_path / "wt"))
    assert (tmp_path / "wt" / ".git").is_file()
    assert IndexProof.load(tmp_path / "wt") is None
    plain = tmp_path / "plain"
    plain.mkdir()
    assert IndexProof.load(plain) is None


def _proven_oid(proof: IndexProof, path: str, st: os.stat_result) -> bytes | None:
    state = proof.prove(path, st, time.time_ns())
    return None if state is None else state_oid(state)


def test_a_proof_gives_the_state_a_hash_would(tmp_path: Path) -> None:
    """A proven file's state (`IndexProof.prove`) is the one `stat_cache` packs for its stat and
    the index's id with our git mode: a plain file, an executable, a symlink; trusted (clean at
    the next scan) unless the walk began within the racy margin of its mtime."""
    root = make_repo(tmp_path / "repo", {"seed.txt": b"s\n"}, commit=False)
    (root / "plain.txt").write_bytes(b"p\n")
    (root / "run.sh").write_bytes(b"r\n")
    os.chmod(root / "run.sh", 0o755)
    (root / "link").symlink_to("plain.txt")
    backdate(root, "plain.txt", "run.sh", "link")
    git(root, "add", "plain.txt", "run.sh", "link")  # new entries: the stat after the backdate
    proof = IndexProof.load(root)
    assert proof is not None
    oids = {e.path: bytes.fromhex(e.oid) for e in read_index(root / ".git" / "index").entries}
    now = time.time_ns()
    for path, mode in (("plain.txt", MODE_FILE), ("run.sh", MODE_EXEC), ("link", MODE_LINK)):
        st = os.lstat(root / path)
        state: FileState | None = proof.prove(path, st, now)
        assert state == pack_state(st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_mode, st.st_ino, now, mode,
                                   oids[path]), path
        assert state is not None and is_clean(state, st)
        young = proof.prove(path, st, st.st_mtime_ns + RACY_MARGIN_NS)  # the walk began as it changed
        assert young is not None and not is_clean(young, st) and state_oid(young) == oids[path]


def test_proof_per_file(tmp_path: Path) -> None:
    root = make_repo(tmp_path / "repo", {"same.txt": b"same\n", "edited.txt": b"old\n", "exec.sh": b"x\n"})
    proof = IndexProof.load(root)
    assert proof is not None
    oids = {e.path: e.oid for e in read_index(root / ".git" / "index").entries}
    assert _proven_oid(proof, "same.txt", os.lstat(root / "same.txt")) == bytes.fromhex(oids["same.txt"])
    (root / "edited.txt").write_bytes(b"new\n")  # same size, new content
    assert proof.prove("edited.txt", os.lstat(root / "edited.txt"), time.time_ns()) is None
    os.chmod(root / "exec.sh", 0o755)  # the exec bit differs from the entry's mode
    assert proof.prove("exec.sh", os.lstat(root / "exec.sh"), time.time_ns()) is None
    assert proof.prove("absent.txt", os.lstat(root / "same.txt"), time.time_ns()) is None
    st = os.lstat(root / "same.txt")
    for field in ("st_mtime_ns", "st_ctime_ns", "st_size", "st_ino"):  # one nanosecond, byte or inode off
        fields = {f: getattr(st, f) for f in ("st_mode", "st_ino", "st_uid", "st_gid", "st_size", "st_mtime_ns",
                                               "st_ctime_ns")}
        fields[field] += 1
        assert proof.prove("same.txt", SimpleNamespace(**fields), time.time_ns()) is None, field  # type: ignore[arg-type]


def test_a_folder_is_proven_as_its_files_one_by_one(tmp_path: Path) -> None:
    """`IndexProof.prove_folder` proves what `prove` proves of each file, in order, and gives
    the others' places: changed, not in the index, gone since the listing (no stat), and one
    over the size limit."""
    root = make_repo(tmp_path / "repo", {"d/a.txt": b"a\n", "d/big.bin": b"b" * 64, "d/c.txt": b"c\n",
                                         "d/edited.txt": b"old\n", "d/gone.txt": b"g\n"})
    (root / "d" / "edited.txt").write_bytes(b"new\n")
    (root / "d" / "new.txt").write_bytes(b"n\n")
    proof = IndexProof.load(root)
    assert proof is not None
    names = ["a.txt", "big.bin", "c.txt", "edited.txt", "gone.txt", "new.txt"]
    stats = [None if name == "gone.txt" else os.lstat(root / "d" / name) for name in names]
    now = time.time_ns()
    proven: list[str] = ["before"]
    states: list[FileState] = []
    others = proof.prove_folder("d/", names, stats, now, 63, proven, states)
    assert others == [1, 3, 4, 5]
    assert proven == ["before", "d/a.txt", "d/c.txt"]
    assert states == [proof.prove(path, os.lstat(root / path), now) for path in proven[1:]]
    assert proof.prove("d/big.bin", os.lstat(root / "d" / "big.bin"), now) is not None  # only over the limit


def test_a_proof_kept_to_runs_of_its_paths_proves_those_alone(tmp_path: Path) -> None:
    """`IndexProof.keep`: one side of a split walk looks up the paths of its runs of the
    index's (sorted) paths only; the others are not proven there (hashed), until all are kept
    again (the child failed: its folders are walked here)."""
    files = {f"{folder}/f{i}.txt": f"{folder} {i}\n".encode() for folder in ("a", "b", "c") for i in range(3)}
    root = make_repo(tmp_path / "repo", files)
    proof = IndexProof.load(root)
    assert proof is not None and proof.paths == sorted(files)
    assert proof._entries is None  # loading (its log line) made no map of every path: each side makes its own
    now = time.time_ns()

    def proven() -> set[str]:
        return {path for path in files if proof.prove(path, os.lstat(root / path), now) is not None}

    assert proven() == set(files)
    proof.keep([(0, 3), (6, 9)])
    assert len(proof.entries) == 6
    assert proven() == {path for path in files if not path.startswith("b/")}
    proof.keep([(0, len(proof.paths))])
    assert proven() == set(files)


def test_proof_of_a_symlink_ignores_its_permission_bits(tmp_path: Path) -> None:
    root = make_repo(tmp_path / "repo", {"target.txt": b"t\n"}, commit=False)
    (root / "link").symlink_to("target.txt")
    backdate(root, "link")
    git(root, "add", "link")
    proof = IndexProof.load(root)
    assert proof is not None and os.lstat(root / "link").st_mode & 0o777 == 0o777
    oids = {e.path: e.oid for e in read_index(root / ".git" / "index").entries}
    assert _proven_oid(proof, "link", os.lstat(root / "link")) == bytes.fromhex(oids["link"])


def test_proof_refuses_flagged_entries(tmp_path: Path) -> None:
    """Assume-valid, skip-worktree and intent-to-add entries prove nothing, though their stat
    data may match the file: git itself does not look at the file behind them."""
    files = {name: name.encode() + b"\n" for name in ("plain.txt", "valid.txt", "skip.txt")}
    root = make_repo(tmp_path / "repo", files)
    (root / "ita.txt").write_bytes(b"")
    git(root, "add", "-N", "ita.txt")
    git(root, "update-index", "--assume-unchanged", "valid.txt")
    git(root, "update-index", "--skip-worktree", "skip.txt")
    index = read_index(root / ".git" / "index")
    flagged = {e.path: (e.assume_valid, e.skip_worktree, e.intent_to_add) for e in index.entries}
    assert flagged == {"plain.txt": (False, False, False), "valid.txt": (True, False, False),
                       "skip.txt": (False, True, False), "ita.txt": (False, False, True)}
    proof = IndexProof.load(root)
    assert proof is not None
    oids = {e.path: e.oid for e in index.entries}
    assert _proven_oid(proof, "plain.txt", os.lstat(root / "plain.txt")) == bytes.fromhex(oids["plain.txt"])
    for path in ("valid.txt", "skip.txt", "ita.txt"):
        assert proof.prove(path, os.lstat(root / path), time.time_ns()) is None, path


def test_the_cache_tree_holds_the_trees_git_knows() -> None:
    """`cached_trees` reads git's TREE extension: every folder's tree id and entry count as
    `git ls-tree` and the index's paths give them; a folder whose tree `git add` invalidated
    reads as unknown (-1); a damaged extension raises `IndexDoubt` and `trees()` gives none."""
    import tempfile

    from shadowpoint.stage.git_index import cached_trees

    with tempfile.TemporaryDirectory() as tmp:
        files = {f"{a}/{b}/f{i}.txt": f"{a}{b}{i}\n".encode() for a in ("x", "y") for b in ("p", "q") for i in range(3)}
        root = make_repo(Path(tmp) / "repo", {**files, "top.txt": b"top\n"})
        proof = IndexProof.read(root)
        assert isinstance(proof, IndexProof) and proof.cache_tree is not None
        trees = proof.trees()
        listed = {line.split(b"\t")[1].decode(): line.split()[2].decode()
                  for line in git(root, "ls-tree", "-r", "-d", "HEAD").splitlines()}
        listed[""] = git(root, "rev-parse", "HEAD^{tree}").decode().strip()
        assert {folder: oid.hex() for folder, (_, oid) in trees.items()} == listed
        paths = [*files, "top.txt"]
        assert all(count == sum(1 for p in paths if not folder or p.startswith(folder + "/"))
                   for folder, (count, _) in trees.items())
        assert proof.trees(root_only=True) == {"": trees[""]}
        (root / "x" / "q" / "f0.txt").write_bytes(b"changed\n")
        git(root, "add", "x/q/f0.txt")
        proof = IndexProof.read(root)
        assert isinstance(proof, IndexProof)
        after = proof.trees()
        assert {f for f, (count, _) in after.items() if count < 0} == {"", "x", "x/q"}
        assert after["y/p"] == trees["y/p"]
        start, end = proof.cache_tree or (0, 0)
        with pytest.raises(IndexDoubt):
            cached_trees(proof.body, (start, end - 7))  # cut inside an id
        proof.cache_tree = (start, end - 7)
        assert proof.trees() == {}
