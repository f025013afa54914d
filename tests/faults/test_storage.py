"""The docs root refusing writes (SPEC §7, PROTOCOL 1.1 "Errors and signals").

- A file whose blob the file system refuses (beyond RLIMIT_FSIZE, SIGXFSZ ignored) is left
  out with a warning naming it and the cause; every other file is committed, in the
  baseline, in the scanner's own thread and in the blob worker processes.
- A full docs root (a small tmpfs, or an injected ENOSPC) fails the request with
  `storage_failed`, writes nothing half-way, and the round after space is freed holds every
  change of the failed rounds.

The sidecars run as real processes with the limit set in `preexec_fn`; the git CLI is the oracle.
"""

from __future__ import annotations

import contextlib
import errno
import os
import resource
import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import make_tree
from tests.faults.support import (
    edit_round,
    fsck_problems,
    git,
    git_tree,
    shadow_git_dir,
    start_sidecar,
)
from tests.rpc import RpcError, SidecarProcess

LIMIT_BYTES = 2048 * 1024  # `ulimit -f 2048`
BIG_BYTES = 3 * 1024 * 1024


def _file_size_limit() -> None:
    """In the sidecar's child process: `ulimit -f 2048` with SIGXFSZ ignored (writes get EFBIG)."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (LIMIT_BYTES, LIMIT_BYTES))


def _big() -> bytes:
    return os.urandom(BIG_BYTES)  # incompressible: its loose object is over the limit too


def _blob_paths(git_dir: Path, commit: str) -> set[str]:
    return set(git_tree(git_dir, commit))


def _checkpoints(sc: SidecarProcess, task: str) -> list[dict[str, Any]]:
    listing = sc.call("checkpoint/list", {"taskId": task})
    assert listing["state"] == "ready", listing
    cps: list[dict[str, Any]] = listing["checkpoints"]
    return cps


def _assert_left_out(cp: dict[str, Any], path: str) -> None:
    warned = [w for w in cp["warnings"] if w["path"] == path]
    assert warned, f"{path} is left out with a warning on the checkpoint: {cp['warnings']}"
    reason = warned[0]["reason"]
    assert path in reason and "File too large" in reason, f"the reason names the file and the cause: {reason!r}"


@pytest.mark.parametrize("workers", [0, 2], ids=["in-process", "blob-workers"])
def test_a_file_the_file_system_refuses_never_blocks_a_checkpoint(tmp_path: Path, docs: Path, workers: int) -> None:
    # 600 files start the blob worker processes of the baseline (they inherit the limit)
    small = {f"src/m{i:03d}.txt": f"module {i}\n" for i in range(600 if workers else 5)}
    root = make_tree(tmp_path / "work" / "proj", {**small, "big.dat": _big(), "notes.txt": "n0\n"})
    git_dir = shadow_git_dir(docs, root)
    sc = start_sidecar(root, "t", ts=1, settings={}, env={"SHADOWPOINT_HASH_WORKERS": str(workers)},
                       preexec_fn=_file_size_limit)
    try:
        baseline = _checkpoints(sc, "t")[0]
        assert baseline["kind"] == "baseline" and baseline["hash"], baseline
        _assert_left_out(baseline, "big.dat")
        assert _blob_paths(git_dir, baseline["hash"]) == {*small, "notes.txt"}

        # a round naming only another, small file
        cp = edit_round(sc, "t", 2, ["notes.txt"], lambda: (root / "notes.txt").write_text("n1\n"))
        assert cp["hash"] and cp["hash"] != baseline["hash"]
        assert git(git_dir, "cat-file", "blob", f"{cp['hash']}:notes.txt").stdout == b"n1\n"

        # a round naming the big file and a small one: the small one is committed
        def write() -> None:
            (root / "big.dat").write_bytes(_big())
            (root / "src" / "m001.txt").write_text("changed\n")
        cp = edit_round(sc, "t", 3, ["big.dat", "src/m001.txt"], write)
        _assert_left_out(cp, "big.dat")
        assert git(git_dir, "cat-file", "blob", f"{cp['hash']}:src/m001.txt").stdout == b"changed\n"
        assert "big.dat" not in _blob_paths(git_dir, cp["hash"])

        # a command round rescans (no watcher): the big file is reported again, the rest committed
        sc.call("round/begin", {"taskId": "t"})
        sc.call("tool/begin", {"taskId": "t", "tool": "execute_command", "kind": "command"})
        (root / "src" / "m002.txt").write_text("by a command\n")
        sc.call("tool/end", {"taskId": "t", "tool": "execute_command", "kind": "command"})
        cp = sc.call("round/end", {"taskId": "t", "ts": 4})["checkpoint"]
        assert git(git_dir, "cat-file", "blob", f"{cp['hash']}:src/m002.txt").stdout == b"by a command\n"
        assert not fsck_problems(git_dir)
        leftovers = [p.name for p in (git_dir / "objects").iterdir() if p.name.startswith("tmp")]
        assert not leftovers, f"no half-written object is left: {leftovers}"
    finally:
        sc.close()
    assert sc.proc.returncode == 0


# ---- a full docs root ------------------------------------------------------------------------------


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 4 MiB tmpfs as the docs root (root only: skipped where mount is refused)."""
    mnt = tmp_path / "tmpfs"
    mnt.mkdir()
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)], capture_output=True)
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {res.stderr.decode(errors='replace').strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def _fill(folder: Path) -> Path:
    """Write a filler file until the file system is full (by ENOSPC, not by a size guess)."""
    filler = folder / "filler"
    chunk = b"\0" * 65536
    with open(filler, "wb", buffering=0) as fh:
        with contextlib.suppress(OSError):
            while True:
                fh.write(chunk)
        # the last bytes: a partial chunk still fits
        for size in (4096, 512, 1):
            with contextlib.suppress(OSError):
                while True:
                    fh.write(chunk[:size])
    probe = folder / "probe"
    with pytest.raises(OSError) as exc, open(probe, "wb", buffering=0) as fh:
        fh.write(b"x" * 4096)
    probe.unlink(missing_ok=True)
    assert exc.value.errno == errno.ENOSPC
    return filler


def _task_json(docs: Path) -> bytes:
    """The task record on disk: task.json and its log."""
    found = list((docs / "tasks").glob("*/task.json"))
    assert len(found) == 1
    log = found[0].with_name("task.log")
    return found[0].read_bytes() + b"\0" + (log.read_bytes() if log.exists() else b"")


def _refs(git_dir: Path) -> str:
    return git(git_dir, "for-each-ref").stdout.decode()


def test_a_full_docs_root_answers_storage_failed_and_loses_nothing(tmp_path: Path, small_tmpfs: Path) -> None:
    docs = small_tmpfs / "docs"
    root = make_tree(tmp_path / "work" / "proj", {"a.txt": "a0\n", "b.txt": "b0\n", "c.txt": "c0\n"})
    git_dir = shadow_git_dir(docs, root)
    sc = start_sidecar(root, "t", ts=1, env={"SHADOWPOINT_DOCS_DIR": str(docs)})
    try:
        first = edit_round(sc, "t", 2, ["a.txt"], lambda: (root / "a.txt").write_text("a1\n"))
        record, refs = _task_json(docs), _refs(git_dir)
        filler = _fill(small_tmpfs)
        failed = []
        # an edit round and a command round on the full disk: both fail, nothing changes
        for ts, path, body in ((3, "b.txt", "b1 " * 30000), (4, "c.txt", "c1 " * 30000)):
            with pytest.raises(RpcError) as err:
                edit_round(sc, "t", ts, [path], lambda p=path, b=body: (root / p).write_text(b))
            assert err.value.kind == "storage_failed", err.value.error
            assert "No space left on device" in str(err.value)
            failed.append((path, body))
        assert _task_json(docs) == record, "the task record is not half-written"
        assert _refs(git_dir) == refs, "no ref moved"
        assert not [p for p in (git_dir / "objects").iterdir() if p.name.startswith("tmp")]
        assert not list((docs / "tasks").glob("*/.*.tmp")), "no temp record is left"
        listed = sc.call("checkpoint/list", {"taskId": "t"})["checkpoints"]
        assert [c["ts"] for c in listed] == [1, 2], "the failed rounds added no checkpoint"

        filler.unlink()
        # the next round (naming another file) holds every change of the failed rounds
        cp = edit_round(sc, "t", 5, ["a.txt"], lambda: (root / "a.txt").write_text("a2\n"))
        tree = git_tree(git_dir, cp["hash"])
        assert set(tree) == {"a.txt", "b.txt", "c.txt"}
        for path, body in [("a.txt", "a2\n"), *failed]:
            assert git(git_dir, "cat-file", "blob", f"{cp['hash']}:{path}").stdout == body.encode()
        assert git(git_dir, "rev-parse", f"{cp['hash']}^").stdout.decode().strip() == first["hash"]
        assert not fsck_problems(git_dir)
    finally:
        sc.close()
    assert sc.proc.returncode == 0
    shutil.rmtree(docs, ignore_errors=True)


def _task_refs(git_dir: Path) -> str:
    return git(git_dir, "for-each-ref", "refs/shadowpoint/tasks/").stdout.decode()


def test_a_task_record_that_cannot_be_written_takes_the_round_back(tmp_path: Path, docs: Path) -> None:
    """The objects and the commit are written, the task record is not (its own full tmpfs):
    the checkpoint and the task ref are taken back, and the next round holds the change."""
    tasks = docs / "tasks"
    tasks.mkdir(parents=True)
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(tasks)], capture_output=True)
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {res.stderr.decode(errors='replace').strip()}")
    try:
        root = make_tree(tmp_path / "work" / "proj", {"a.txt": "a0\n", "b.txt": "b0\n"})
        git_dir = shadow_git_dir(docs, root)
        sc = start_sidecar(root, "t", ts=1)
        try:
            first = edit_round(sc, "t", 2, ["a.txt"], lambda: (root / "a.txt").write_text("a1\n"))
            record, refs = _task_json(docs), _task_refs(git_dir)
            filler = _fill(tasks)
            # a round's record is one line appended to the task's log, which can fit in the log
            # file's last block even on a full tmpfs: this round reports paths enough (an edit
            # tool's paths are recorded, written or not) for its line to need blocks of its own
            reported = ["b.txt", *(f"reported/{i:03d}-{'x' * 100}.txt" for i in range(80))]
            with pytest.raises(RpcError) as err:
                edit_round(sc, "t", 3, reported, lambda: (root / "b.txt").write_text("b1\n"))
            assert err.value.kind == "storage_failed" and "task.json" in str(err.value), err.value.error
            assert _task_json(docs) == record and _task_refs(git_dir) == refs
            assert [c["ts"] for c in sc.call("checkpoint/list", {"taskId": "t"})["checkpoints"]] == [1, 2]
            filler.unlink()
            cp = edit_round(sc, "t", 4, ["a.txt"], lambda: (root / "a.txt").write_text("a2\n"))
            assert git(git_dir, "cat-file", "blob", f"{cp['hash']}:b.txt").stdout == b"b1\n"
            assert git(git_dir, "cat-file", "blob", f"{cp['hash']}:a.txt").stdout == b"a2\n"
            assert git(git_dir, "rev-parse", f"{cp['hash']}^").stdout.decode().strip() == first["hash"]
            assert [c["ts"] for c in sc.call("checkpoint/list", {"taskId": "t"})["checkpoints"]] == [1, 2, 4]
        finally:
            sc.close()
    finally:
        subprocess.run(["umount", "-l", str(tasks)], check=False)


def test_an_injected_enospc_on_the_record_is_storage_failed(make_engine: Any, workspace: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """The same without a mount: the record's writers (their modules' `open`: the atomic
    write and the log's append) refuse with ENOSPC."""
    import builtins

    import shadowpoint.store.atomic as atomic_module
    import shadowpoint.store.checkpoints as checkpoints_module
    from shadowpoint.errors import StorageFailedError
    from tests.faults.support import engine_edit, start

    make_tree(workspace, {"a.txt": "a0\n"})
    eng = make_engine(workspace)
    start(eng)
    full = True

    def refusing_open(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        if full and ("w" in mode or "a" in mode):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(file))
        return builtins.open(file, mode, *args, **kwargs)

    monkeypatch.setattr(checkpoints_module, "open", refusing_open, raising=False)
    monkeypatch.setattr(atomic_module, "open", refusing_open, raising=False)
    with pytest.raises(StorageFailedError, match="No space left on device"):
        engine_edit(eng, workspace, 2, {"a.txt": "a1\n"})
    assert [c["ts"] for c in eng.list_checkpoints("t").to_wire()["checkpoints"]] == [1]
    full = False
    engine_edit(eng, workspace, 3, {"b.txt": "b1\n"})
    cp = eng.list_checkpoints("t").to_wire()["checkpoints"][-1]
    git_dir = Path(eng.describe_roots()[0]["shadowGitDir"])
    assert git(git_dir, "cat-file", "blob", f"{cp['hash']}:a.txt").stdout == b"a1\n"
    assert not list(workspace.parent.parent.glob("docs/tasks/*/.*.tmp"))


def test_a_refused_round_pack_loses_no_blob_the_stat_cache_names(make_engine: Any, workspace: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A round's blobs go into the pack its ref move writes (`ShadowRepo.blobs_for_ref`). When
    that pack is refused, the stat cache already holds the edited file's new state: the next
    round, which does not name the file and sees it unchanged, must not reuse a blob that was
    never written (it checks them: `RootState._verify`), and holds the file's content."""
    from shadowpoint.errors import StorageFailedError
    from shadowpoint.store import loose
    from tests.faults.support import engine_command, engine_edit, start

    make_tree(workspace, {"a.txt": "a0\n", "b.txt": "b0\n"})
    eng = make_engine(workspace)
    start(eng)
    write_file = loose.write_file

    def refusing(git_dir: Path, content: bytes, final: str, *args: Any, **kwargs: Any) -> None:
        if final.endswith(".pack"):
            raise StorageFailedError(loose.storage_message(git_dir, "write a pack", OSError(errno.ENOSPC, "full")))
        write_file(git_dir, content, final, *args, **kwargs)

    monkeypatch.setattr(loose, "write_file", refusing)
    with pytest.raises(StorageFailedError, match="could not write a pack"):
        engine_edit(eng, workspace, 2, {"a.txt": "a1, in a pack that was refused\n"})
    with pytest.raises(StorageFailedError, match="could not write a pack"):  # what a command changed
        engine_command(eng, workspace, 3, lambda: make_tree(workspace, {"c.txt": "c1, by a command\n"}))
    monkeypatch.setattr(loose, "write_file", write_file)
    cp = engine_edit(eng, workspace, 4, {"b.txt": "b1\n"})
    commit = cp.hashes[eng.first_root]
    git_dir = Path(eng.describe_roots()[0]["shadowGitDir"])
    for path, body in (("a.txt", b"a1, in a pack that was refused\n"), ("b.txt", b"b1\n"),
                       ("c.txt", b"c1, by a command\n")):
        assert git(git_dir, "cat-file", "blob", f"{commit}:{path}").stdout == body
    assert not fsck_problems(git_dir)
