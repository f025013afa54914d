"""Unit tests for `shadowpoint.store.checkpoints`: the task timeline, atomic writes and task folders."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from shadowpoint.errors import UnknownCheckpointError, UnknownTaskError
from shadowpoint.store.checkpoints import (
    JOURNAL_FILE,
    TASK_FILE,
    CheckpointRecord,
    CheckpointStore,
    TaskRecord,
    checkpoint_or_raise,
    write_json_atomic,
)


def cp(ts: int, kind: str = "round", **kw: object) -> CheckpointRecord:
    hashes = kw.pop("hashes", {"proj": f"{ts:040x}"} if kind != "compaction" else {})
    return CheckpointRecord(ts=ts, kind=kind, hashes=hashes, **kw)  # type: ignore[arg-type]


def task(*cps: CheckpointRecord) -> TaskRecord:
    rec = TaskRecord(task_id="t", roots={"proj": "/w/proj"})
    for c in cps:
        rec.add_checkpoint(c)
    return rec


# ---- TaskRecord -------------------------------------------------------------------------------


def test_add_checkpoint_clears_restored_marks() -> None:
    rec = task(cp(0, "baseline"), cp(10), cp(20))
    rec.mark_restored(rec.checkpoint(10))
    rec.mark_restored(rec.checkpoint(0))
    rec.add_checkpoint(cp(30))
    assert [c.restored for c in rec.checkpoints] == [False] * 4


def test_a_checkpoint_taken_back_leaves_the_marks_and_base_as_before() -> None:
    rec = task(cp(0, "baseline"), cp(10), cp(20))
    rec.mark_restored(rec.checkpoint(10))
    rec.base = {"proj": "b" * 40}
    before = rec.timeline_mark()
    for added in (cp(30), cp(20, hashes={"proj": "c" * 40})):  # appended, and replacing one
        rec.add_checkpoint(added)
        assert not rec.checkpoint(10).restored and rec.base is None
        rec.take_back_checkpoint(added, before)
        assert [(c.ts, c.restored) for c in rec.checkpoints] == [(0, False), (10, True), (20, False)]
        assert rec.checkpoint(20).hashes == {"proj": f"{20:040x}"} and rec.base == {"proj": "b" * 40}
    rec.add_checkpoint(cp(40))  # the mark put back is cleared by the next checkpoint as any other
    assert not any(c.restored for c in rec.checkpoints)


def test_a_loaded_mark_is_cleared_by_the_next_checkpoint() -> None:
    rec = task(cp(0, "baseline"), cp(10))
    rec.mark_restored(rec.checkpoint(0))
    loaded = TaskRecord.from_json(json.loads(json.dumps(rec.to_json())))
    assert loaded.checkpoint(0).restored
    loaded.add_checkpoint(cp(20))
    assert not any(c.restored for c in loaded.checkpoints)


def test_add_checkpoint_replaces_same_ts_and_keeps_order() -> None:
    rec = task(cp(0, "baseline"), cp(20), cp(10))
    assert [c.ts for c in rec.checkpoints] == [0, 10, 20]
    rec.add_checkpoint(cp(10, "completion"))
    assert [c.ts for c in rec.checkpoints] == [0, 10, 20]
    assert rec.checkpoint(10).kind == "completion"
    with pytest.raises(UnknownCheckpointError):
        rec.checkpoint(15)


def test_last_snapshot_skips_compaction() -> None:
    rec = task(cp(0, "baseline"), cp(10), cp(20, "compaction"))
    last = rec.last_snapshot()
    assert last is not None and last.ts == 10
    assert not rec.checkpoint(20).has_snapshot
    assert task().last_snapshot() is None
    assert not cp(5, "round", hashes={}).has_snapshot


def test_cut_after_drops_later_messages_and_checkpoints() -> None:
    rec = task(cp(0, "baseline"), cp(10), cp(20), cp(30, "completion"))
    for ts in (0, 5, 10, 15, 20, 25, 30):
        rec.add_message(ts, "user" if ts % 10 else "assistant", f"m{ts}")
    rec.cut_after(15)
    assert [c.ts for c in rec.checkpoints] == [0, 10]
    assert [m.ts for m in rec.messages] == [0, 5, 10, 15]
    assert rec.timeline_ts() == [0, 5, 10, 15]


def test_cut_before_baseline_keeps_the_baseline() -> None:
    rec = task(cp(100, "baseline"), cp(110))
    rec.add_message(100, "user", "first")
    rec.cut_after(50)
    assert [c.ts for c in rec.checkpoints] == [100]
    assert rec.messages == []


def test_messages_update_role_and_text() -> None:
    rec = task()
    rec.add_message(20, "assistant", None)
    rec.add_message(10, "user", "hello")
    assert [m.ts for m in rec.messages] == [10, 20]
    rec.add_message(20, "user", "now text")
    rec.add_message(10, "assistant", None)  # None keeps the known text
    m10, m20 = rec.message(10), rec.message(20)
    assert m10 is not None and (m10.role, m10.text) == ("assistant", "hello")
    assert m20 is not None and (m20.role, m20.text) == ("user", "now text")
    assert len(rec.messages) == 2
    assert rec.message(99) is None


def test_checkpoint_or_raise_checks_type() -> None:
    rec = task(cp(0, "baseline"))
    assert checkpoint_or_raise(rec, 0).kind == "baseline"
    for bad in ("0", 0.0, True, None, [0]):
        with pytest.raises(UnknownCheckpointError):
            checkpoint_or_raise(rec, bad)


def test_to_wire() -> None:
    w: dict[str, Any] = cp(5, "round", hashes={"a": "1" * 40, "b": "2" * 40}, reused=True,
                           warnings=[{"path": "x", "reason": "over the size cap"}]).value("b").to_wire()
    assert w["hash"] == "2" * 40 and w["hashes"] == {"a": "1" * 40, "b": "2" * 40}
    assert w["reused"] is True and w["restored"] is False and w["warnings"][0]["path"] == "x"
    assert w["createdAt"].endswith("Z")
    comp = cp(6, "compaction").value("a").to_wire()
    assert comp["hash"] is None and comp["hashes"] == {} and comp["kind"] == "compaction"


def test_json_round_trip() -> None:
    rec = task(cp(0, "baseline"), cp(10, warnings=[{"path": "p", "reason": "r"}]))
    rec.add_message(10, "user", "ünï \udcff text")
    rec.edited = {"proj": ["a", "b/c"]}
    rec.note_scope("proj", ["a", "made/by/shell"], 10)
    rec.restores = [{"n": 1, "op": "restore", "ts": 0, "roots": {"proj": {"safety": "s" * 40, "after": "a" * 40,
                                                                      "paths": ["a"]}}}]
    rec.undo_stack, rec.redo_stack = [1], []
    rec.base = {"proj": "a" * 40}
    rec.disabled = True
    rec.mark_restored(rec.checkpoint(10))
    again = TaskRecord.from_json(json.loads(json.dumps(rec.to_json())))
    assert again == rec


# ---- atomic writes ----------------------------------------------------------------------------


def _write_forever(path: str) -> None:
    i = 0
    while True:
        i += 1
        write_json_atomic(Path(path), {"n": i, "pad": "x" * 20000})


def test_atomic_write_leaves_old_or_new_file(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "f.json"
    write_json_atomic(path, {"n": 0, "pad": ""})
    ctx = multiprocessing.get_context("spawn")
    proc = ctx.Process(target=_write_forever, args=(str(path),), name="shadowpoint-test-writer")
    proc.start()
    assert proc.pid is not None
    try:
        seen: set[int] = set()
        deadline = time.monotonic() + 30
        while len(seen) < 50 and time.monotonic() < deadline:
            data = json.loads(path.read_text())  # never a partial file
            seen.add(data["n"])
            assert len(data["pad"]) in (0, 20000)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.join()
    data = json.loads(path.read_text())
    assert isinstance(data["n"], int)
    assert len(seen) > 1  # the writer did replace the file while we read it
    leftovers = [p.name for p in path.parent.iterdir() if p.name != "f.json"]
    assert all(n.startswith(".f.json.") and n.endswith(".tmp") for n in leftovers)


def test_atomic_write_failure_keeps_old_file(tmp_path: Path) -> None:
    path = tmp_path / "store" / "f.json"
    write_json_atomic(path, {"v": "old"})
    with pytest.raises(TypeError):
        write_json_atomic(path, {"v": object()})
    assert json.loads(path.read_text()) == {"v": "old"}
    assert [p.name for p in path.parent.iterdir()] == ["f.json"], "no temporary file is left behind"


# ---- CheckpointStore --------------------------------------------------------------------------


def test_store_save_load_delete(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "docs")
    rec = task(cp(0, "baseline"))
    store.save(rec)
    assert store.exists("t")
    assert (tmp_path / "docs" / "tasks" / "t" / TASK_FILE).is_file()
    assert store.load("t") == rec
    assert store.task_ids() == ["t"]
    store.delete("t")
    assert not store.exists("t") and store.task_ids() == []
    with pytest.raises(UnknownTaskError):
        store.load("t")


@pytest.mark.parametrize("content", [b"", b"{not json", b"\0\0\0", b"[]", b'{"no_task_id": 1}', b'"str"'])
def test_load_corrupt_task_is_unknown_task(tmp_path: Path, content: bytes) -> None:
    store = CheckpointStore(tmp_path / "docs")
    folder = store.task_dir("t")
    folder.mkdir(parents=True)
    (folder / TASK_FILE).write_bytes(content)
    with pytest.raises(UnknownTaskError) as info:
        store.load("t")
    assert info.value.kind == "unknown_task"


def test_load_unknown_task(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "docs")
    with pytest.raises(UnknownTaskError, match="nope"):
        store.load("nope")
    assert store.task_ids() == []


def test_load_refuses_a_folder_of_another_task(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "docs")
    rec = TaskRecord(task_id="other", roots={})
    write_json_atomic(store.task_dir("t") / TASK_FILE, rec.to_json())
    with pytest.raises(UnknownTaskError):
        store.load("t")


TRICKY_IDS = ["simple", "with/slash", "../../escape", "..", ".", "a b c", "ünïcödé", "日本語", "x" * 500,
              "a/b", "a_b", "CON", "-rf", ".hidden", "t.lock", "tab\tnew\nline", "\udcff", "", "a\\b"]


def test_task_ids_map_to_safe_distinct_folders(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    store = CheckpointStore(docs)
    folders = set()
    for tid in TRICKY_IDS:
        folder = store.task_dir(tid)
        assert folder.parent == docs / "tasks", tid
        assert folder.name not in ("", ".", "..") and "/" not in folder.name and "\0" not in folder.name
        assert len(os.fsencode(folder.name)) <= 255
        folders.add(folder)
        store.save(TaskRecord(task_id=tid, roots={}))
    assert len(folders) == len(TRICKY_IDS)
    for tid in TRICKY_IDS:
        assert store.load(tid).task_id == tid
    assert sorted(store.task_ids()) == sorted(TRICKY_IDS)
    assert sorted(p.name for p in docs.iterdir()) == ["tasks"]
    assert not (tmp_path / "escape").exists()
    store.delete("../../escape")
    assert sorted(store.task_ids()) == sorted(t for t in TRICKY_IDS if t != "../../escape")
    assert docs.is_dir()


def test_journal_write_read_clear(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "docs")
    assert store.read_journal("t") is None
    store.write_journal("t", {"plans": [], "safety": {"proj": "a" * 40}})
    assert store.read_journal("t") == {"plans": [], "safety": {"proj": "a" * 40}}
    assert (store.task_dir("t") / JOURNAL_FILE).is_file()
    (store.task_dir("t") / JOURNAL_FILE).write_text("[1, 2]")
    assert store.read_journal("t") is None
    (store.task_dir("t") / JOURNAL_FILE).write_text("{trunc")
    assert store.read_journal("t") is None
    store.clear_journal("t")
    store.clear_journal("t")
    assert store.read_journal("t") is None


def test_a_journal_cut_short_is_none_and_a_cleared_one_is_gone(tmp_path: Path) -> None:
    """The journal is written in place (no rename): a kill or a full disk that cuts it short
    must leave no journal a restart would act on, at any length."""
    store = CheckpointStore(tmp_path / "docs")
    journal = {"plans": [{"root": "proj", "ops": [["a.txt", "1" * 40, "100644"], ["b/c.txt", None, None]]}],
               "entry": {"n": 3, "op": "restore", "roots": {"proj": {"safety": "a" * 40}}}}
    store.write_journal("t", journal)
    path = store.task_dir("t") / JOURNAL_FILE
    whole = path.read_bytes()
    assert store.read_journal("t") == journal
    for cut in range(len(whole)):
        path.write_bytes(whole[:cut])
        assert store.read_journal("t") is None, f"a journal cut at byte {cut} was read as one"
    store.write_journal("t", journal)
    store.clear_journal("t")
    assert not path.exists() and store.read_journal("t") is None
    path.write_bytes(b"")  # an emptied journal (as versions before 2026-12-04 left one) is none too
    assert store.read_journal("t") is None
    store.write_journal("t", {"plans": [], "entry": {"n": 4}})  # the next restore's, over the emptied file
    assert store.read_journal("t") == {"plans": [], "entry": {"n": 4}}


def test_a_1_0_undo_record_becomes_the_undo_stack() -> None:
    data = task(cp(0, "baseline"), cp(10)).to_json()
    data.pop("restores"), data.pop("undo_stack")
    data["last_restore"] = {"proj": {"safety": "s" * 40, "paths": ["a"]}}
    rec = TaskRecord.from_json(data)
    assert rec.undo_stack == [1] and rec.last_restore is None
    assert rec.restores[0]["roots"] == {"proj": {"safety": "s" * 40, "after": None, "paths": ["a"]}}


def test_scope_keeps_the_first_ts_and_a_fork_takes_it_up_to_its_ts() -> None:
    from shadowpoint.store.checkpoints import fork_record

    rec = task(cp(0, "baseline"), cp(10), cp(20), cp(30))
    rec.edited = {"proj": ["a", "b"]}
    rec.note_scope("proj", ["a", "s"], 10)
    rec.note_scope("proj", ["a", "b", "t"], 30)
    assert rec.scope["proj"] == {"a": 10, "s": 10, "b": 30, "t": 30}
    fork = fork_record(rec, 25, "f")
    assert [c.ts for c in fork.checkpoints] == [0, 10, 20]
    assert fork.scope_paths("proj") == ["a", "s"] and fork.edited == {"proj": ["a"]}
    assert fork.forked_from is not None and fork.forked_from["ts"] == 20


# ---- the task's log (append-only rounds) ------------------------------------------------------


def _round(rec: TaskRecord, ts: int, path: str) -> CheckpointRecord:
    """What the engine records in one edit round (end_round + _checkpoint)."""
    known = rec.message(ts)
    rec.add_message(ts, known.role if known else "assistant", None)
    rec.note_edited("proj", path)
    rec.note_scope("proj", [path], ts)
    rec.note_scope("proj", [path, f"made/{ts}.txt"], ts)  # what the round's staging changed
    c = cp(ts, warnings=[{"path": path, "reason": "x"}] if ts % 7 == 0 else [], created_at=f"at {ts}")
    rec.add_checkpoint(c)
    return c


def test_400_rounds_load_as_the_whole_record_written_every_round(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    import shadowpoint.store.checkpoints as module

    monkeypatch.setattr(module, "LOG_COMPACT_MIN", 4096)  # several compactions on the way
    logged, whole = CheckpointStore(tmp_path / "logged"), CheckpointStore(tmp_path / "whole")
    rec, ref = task(cp(0, "baseline", created_at="at 0")), task(cp(0, "baseline", created_at="at 0"))
    ref.created_at = rec.created_at  # the same record twice, not two made a millisecond apart
    logged.save(rec)
    whole.save(ref)
    log_file = logged.task_dir("t") / module.LOG_FILE
    lines_seen = 0
    for i in range(1, 401):
        for r in (rec, ref):
            r.add_message(i * 10 - 1, "user", f"ask {i}")
            _round(r, i * 10, f"src/f{i % 13}.py")
        logged.append(rec)
        whole.save(ref)  # the old format: the whole record every round
        if log_file.exists():
            lines_seen = max(lines_seen, log_file.read_bytes().count(b"\n"))
    assert lines_seen > 10, "rounds were appended, not rewritten"
    assert logged.load("t").to_json() == whole.load("t").to_json() == ref.to_json()
    assert logged.load("t").to_json() == rec.to_json()


def test_a_torn_last_line_is_ignored_then_cut_off(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "docs")
    rec = task(cp(0, "baseline"))
    store.save(rec)
    _round(rec, 10, "a.py")
    store.append(rec)
    before = store.load("t").to_json()
    log_file = store.task_dir("t") / "task.log"
    good = log_file.read_bytes()
    log_file.write_bytes(good + b'{"g":1,"ops":[{"op":"cp","ts":20,"kin')  # a kill mid-append
    assert store.load("t").to_json() == before
    loaded = store.load("t")
    _round(loaded, 30, "b.py")
    store.append(loaded)
    assert log_file.read_bytes().startswith(good) and log_file.read_bytes().count(b"\n") == 2
    again = store.load("t")
    assert [c.ts for c in again.checkpoints] == [0, 10, 30]
    assert again.to_json() == loaded.to_json()


def test_lines_of_an_older_generation_are_not_applied_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A kill between the compaction (task.json of the next generation) and the log's removal."""
    import shadowpoint.store.checkpoints as module

    store = CheckpointStore(tmp_path / "docs")
    rec = task(cp(0, "baseline"))
    store.save(rec)
    for ts in (10, 20):
        _round(rec, ts, "a.py")
        store.append(rec)
    # a restore: marks a checkpoint restored, records a base; the log's lines would clear both
    rec.mark_restored(rec.checkpoint(10))
    rec.base = {"proj": "f" * 40}
    monkeypatch.setattr(module, "drop_log", lambda path: None)  # killed before the log went
    store.save(rec)
    assert (store.task_dir("t") / "task.log").read_bytes().count(b"\n") == 2
    loaded = store.load("t")
    assert loaded.checkpoint(10).restored and loaded.base == {"proj": "f" * 40}
    assert loaded.to_json() == rec.to_json()
    monkeypatch.undo()
    _round(loaded, 30, "b.py")  # appended after the stale lines, with the new generation
    store.append(loaded)
    again = store.load("t")
    assert [c.ts for c in again.checkpoints] == [0, 10, 20, 30] and not again.checkpoint(10).restored
    assert again.to_json() == loaded.to_json()


def test_a_refused_append_changes_nothing_on_disk_and_keeps_the_changes(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins
    import errno

    import shadowpoint.store.atomic as atomic_module
    import shadowpoint.store.checkpoints as module
    from shadowpoint.errors import StorageFailedError

    store = CheckpointStore(tmp_path / "docs")
    rec = task(cp(0, "baseline"))
    store.save(rec)
    _round(rec, 10, "a.py")
    store.append(rec)
    folder = store.task_dir("t")
    on_disk = {p.name: p.read_bytes() for p in folder.iterdir()}

    def refusing_open(file: object, mode: str = "r", *args: object, **kwargs: object) -> object:
        if "a" in mode or "w" in mode:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(file))
        return builtins.open(file, mode, *args, **kwargs)  # type: ignore[call-overload]

    real_os_open = os.open

    def refusing_os_open(path: str | os.PathLike[str], flags: int, mode: int = 0o777, *,
                         dir_fd: int | None = None) -> int:
        # the log's append opens a descriptor (`append_line`)
        if flags & (os.O_WRONLY | os.O_RDWR):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        return real_os_open(path, flags, mode, dir_fd=dir_fd)

    before = rec.timeline_mark()
    c = _round(rec, 20, "b.py")
    monkeypatch.setattr(module, "open", refusing_open, raising=False)
    monkeypatch.setattr(atomic_module, "open", refusing_open, raising=False)
    monkeypatch.setattr(os, "open", refusing_os_open)
    with pytest.raises(StorageFailedError, match=r"task\.json"):
        store.append(rec)
    rec.take_back_checkpoint(c, before)  # what the engine does with the round
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == on_disk
    monkeypatch.undo()
    _round(rec, 30, "c.py")
    store.append(rec)
    loaded = store.load("t")
    assert [c.ts for c in loaded.checkpoints] == [0, 10, 30]
    assert loaded.scope["proj"]["b.py"] == 20, "the failed round's scope was written with the next one"
    assert loaded.to_json() == rec.to_json()


def test_a_log_removed_under_the_record_writes_the_whole_record(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "docs")
    rec = task(cp(0, "baseline"))
    store.save(rec)
    _round(rec, 10, "a.py")
    store.append(rec)
    (store.task_dir("t") / "task.log").unlink()
    _round(rec, 20, "b.py")
    store.append(rec)
    assert store.load("t").to_json() == rec.to_json()
    import shutil

    shutil.rmtree(store.task_dir("t"))  # the whole folder, right after a compaction
    _round(rec, 30, "c.py")
    store.append(rec)
    assert store.load("t").to_json() == rec.to_json()


def test_a_damaged_line_in_the_middle_skips_only_itself(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "docs")
    rec = task(cp(0, "baseline"))
    store.save(rec)
    for ts in (10, 20, 30):
        _round(rec, ts, f"f{ts}.py")
        store.append(rec)
    log_file = store.task_dir("t") / "task.log"
    lines = log_file.read_bytes().splitlines(keepends=True)
    log_file.write_bytes(lines[0] + b"\0garbage\n" + lines[2])
    assert [c.ts for c in store.load("t").checkpoints] == [0, 10, 30]
