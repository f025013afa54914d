"""`CheckpointStore`: each task's checkpoint metadata under `<docs-root>/tasks/<task-id>/`.

Owns the timeline of a task (messages and checkpoints by `ts`), the restored marks, the
files edit tools reported, the undo record of the last file restore and the restore
journal. A task's record is `task.json` (its compacted form, written atomically: temp file,
rename) plus `task.log`, an append-only log of what changed since: a round adds one line
(one `write`), so a round costs the same at the 400th round of a task as at the 4th (SPEC
§9); a file restore, undo or redo adds one line too. Structural changes (cuts, forks) and a
log grown past the size of task.json rewrite task.json with the next generation number,
then remove the log; a log line carries its generation, so one left by a kill between the
two is never applied twice, and a torn last line (a kill mid-append) is ignored on load and
cut off before the next append.
The restore journal (`restore-journal.json`) is written in place and removed once its
restore is recorded (`write_journal`, `clear_journal`).
Not synced to disk: a power cut may lose the last changes, like the loose objects libgit2
writes without fsync (and the files a restore writes: safe_fs).
Used by the engine under the task's lock; knows nothing of git.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

from shadowpoint.errors import StorageFailedError, TaskMetadataError, UnknownCheckpointError, UnknownTaskError
from shadowpoint.kinds import CheckpointKind
from shadowpoint.store.atomic import write_atomic
from shadowpoint.store.loose import FilePool, place, write_all
from shadowpoint.store.values import ref_component

if TYPE_CHECKING:
    from shadowpoint.results import Checkpoint

log = structlog.get_logger(__name__)

TASK_FILE = "task.json"
LOG_FILE = "task.log"
# the log is compacted into task.json when it would pass this or the size of task.json (so the
# rewrite's cost, O(task), is spread over as many rounds as the task has: O(1) per round)
LOG_COMPACT_MIN = 64 * 1024
JOURNAL_FILE = "restore-journal.json"
# compact ASCII JSON: one encoder for every record, log line and journal (`json.dumps` with
# these options makes a new one each call)
_COMPACT = json.JSONEncoder(ensure_ascii=True, separators=(",", ":"))


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass(slots=True)
class CheckpointRecord:
    """One checkpoint of a task, attached to the message `ts`."""

    ts: int
    kind: CheckpointKind
    hashes: dict[str, str]
    reused: bool = False
    restored: bool = False
    created_at: str = field(default_factory=now_iso)
    warnings: list[dict[str, str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        # task.json and task.log hold the plain string (a ValueError: a record of the wrong shape)
        self.kind = CheckpointKind(self.kind)

    @property
    def has_snapshot(self) -> bool:
        return self.kind.has_snapshot and bool(self.hashes)

    def value(self, first_root: str) -> Checkpoint:
        """The record as the protocol's `Checkpoint`, frozen as it is now."""
        # imported here: `delete-task` (quick.py) reads task records without the results'
        # dataclasses, about 10 ms of its start-up (python -X importtime)
        from shadowpoint.results import Checkpoint, SkipWarning

        return Checkpoint(
            ts=self.ts,
            kind=self.kind,
            hash=self.hashes.get(first_root) if self.has_snapshot else None,
            hashes=dict(self.hashes) if self.has_snapshot else {},
            reused=self.reused,
            restored=self.restored,
            created_at=self.created_at,
            warnings=tuple(SkipWarning(w["path"], w["reason"]) for w in self.warnings),
        )


@dataclass(frozen=True, slots=True)
class TimelineMark:
    """A task's checkpoints, restored marks and base before a checkpoint is added
    (`TaskRecord.timeline_mark`), to take it back when its record cannot be written."""

    checkpoints: list[CheckpointRecord]
    marked: list[CheckpointRecord]
    base: dict[str, str] | None


@dataclass(slots=True)
class MessageRecord:
    ts: int
    role: str
    text: str | None = None


@dataclass(slots=True)
class TaskRecord:
    """Everything persisted about one task."""

    task_id: str
    roots: dict[str, str]  # root name -> canonical root path
    checkpoints: list[CheckpointRecord] = field(default_factory=list)
    messages: list[MessageRecord] = field(default_factory=list)
    edited: dict[str, list[str]] = field(default_factory=dict)  # root name -> paths edit tools reported
    # root name -> path -> ts of the round that first recorded it: the restore scope (PROTOCOL 1.1
    # "Scope": edit tools' paths and what changed while a round was open), by ts so that a fork
    # up to a ts takes exactly the scope of then
    scope: dict[str, dict[str, int]] = field(default_factory=dict)
    last_restore: dict[str, Any] | None = None  # 1.0 undo record (read from old files only)
    # every file restore, undo and redo, oldest first: {n, op, ts, createdAt, roots: {name:
    # {safety, after, paths}}, of?}; `safety` (before) and `after` commits are kept by refs
    restores: list[dict[str, Any]] = field(default_factory=list)
    undo_stack: list[int] = field(default_factory=list)  # `n` of the restores an undo walks back
    redo_stack: list[int] = field(default_factory=list)  # `n` of the undone ones a redo walks forward
    # the task's own newest state after a file restore (root -> commit), until a new snapshot:
    # its newest snapshot with the restores' writes (never outside edits); the base of
    # `keepOutsideEdits` (PROTOCOL 1.1)
    base: dict[str, str] | None = None
    forked_from: dict[str, Any] | None = None  # {taskId, ts, createdAt} of a fork's source
    forks: list[dict[str, Any]] = field(default_factory=list)  # {taskId, ts, createdAt} made from this task
    disabled: bool = False
    created_at: str = field(default_factory=now_iso)
    # ---- persistence state (not part of the record's value)
    # the changes since the record was last written, as log operations (see `apply_op`)
    pending: list[dict[str, Any]] = field(default_factory=list, compare=False, repr=False)
    full_write: bool = field(default=True, compare=False, repr=False)  # next write: task.json
    log_gen: int = field(default=0, compare=False, repr=False)  # generation of task.json's log
    log_size: int = field(default=0, compare=False, repr=False)  # bytes of the log's whole lines
    json_size: int = field(default=0, compare=False, repr=False)  # bytes of task.json
    # the checkpoints that may carry a restored mark (every marked one is among them): a new
    # checkpoint clears the marks without a walk of the whole timeline (~100 µs a round at 2,000)
    marked: list[CheckpointRecord] = field(default_factory=list, compare=False, repr=False)

    # ---------------------------------------------------------------- timeline

    def checkpoint(self, ts: int) -> CheckpointRecord:
        for cp in self.checkpoints:
            if cp.ts == ts:
                return cp
        raise UnknownCheckpointError(f"Task {self.task_id} has no checkpoint at ts={ts}.")

    def last_snapshot(self) -> CheckpointRecord | None:
        for cp in reversed(self.checkpoints):
            if cp.has_snapshot:
                return cp
        return None

    def mark_restored(self, cp: CheckpointRecord) -> None:
        """Mark `cp` restored (a whole restore to it): the files are as it holds them."""
        cp.restored = True
        self.marked.append(cp)

    def _clear_marks(self) -> None:
        for cp in self.marked:
            cp.restored = False
        self.marked.clear()

    def add_checkpoint(self, cp: CheckpointRecord) -> None:
        """Append (or replace one at the same ts); a new checkpoint clears every restored mark."""
        self._clear_marks()
        if cp.has_snapshot:
            self.base = None  # the task's newest state is this snapshot now
        if self.checkpoints and self.checkpoints[-1].ts < cp.ts:
            self.checkpoints.append(cp)  # the usual case, without a copy of the whole list
        else:
            self.checkpoints = [c for c in self.checkpoints if c.ts != cp.ts]
            self.checkpoints.append(cp)
            self.checkpoints.sort(key=lambda c: c.ts)
        self.pending.append({"op": "cp", "ts": cp.ts, "kind": cp.kind, "hashes": cp.hashes, "reused": cp.reused,
                             "created_at": cp.created_at, "warnings": cp.warnings})

    def timeline_mark(self) -> TimelineMark:
        """The timeline as it is, for `take_back_checkpoint` (a copy of the list, not a walk)."""
        return TimelineMark(list(self.checkpoints), [c for c in self.marked if c.restored], self.base)

    def take_back_checkpoint(self, cp: CheckpointRecord, before: TimelineMark) -> None:
        """Undo `add_checkpoint(cp)` whose write failed: `before` is the timeline before it
        (`timeline_mark`). Its log operation goes too; the other pending ones (the round's
        message and scope) stay for the next write, as they stay in memory."""
        self.checkpoints = list(before.checkpoints)
        self._clear_marks()
        for c in before.marked:
            self.mark_restored(c)
        self.base = before.base
        for i in range(len(self.pending) - 1, -1, -1):
            op = self.pending[i]
            if op.get("op") == "cp" and op.get("ts") == cp.ts and op.get("hashes") is cp.hashes:
                del self.pending[i]
                break

    def add_message(self, ts: int, role: str, text: str | None) -> None:
        self.pending.append({"op": "msg", "ts": ts, "role": role, "text": text})
        # newest first: a round's message is the last one or a new one
        for m in reversed(self.messages):
            if m.ts == ts:
                m.role = role
                if text is not None:
                    m.text = text
                return
            if m.ts < ts:
                break
        if self.messages and self.messages[-1].ts < ts:
            self.messages.append(MessageRecord(ts, role, text))
            return
        self.messages.append(MessageRecord(ts, role, text))
        self.messages.sort(key=lambda m: m.ts)

    def message(self, ts: int) -> MessageRecord | None:
        for m in reversed(self.messages):
            if m.ts == ts:
                return m
            if m.ts < ts:
                return None
        return None

    def cut_after(self, keep_through: int) -> None:
        """Drop the messages and checkpoints after `keep_through` (the baseline always stays)."""
        self.messages = [m for m in self.messages if m.ts <= keep_through]
        self.checkpoints = [
            c for c in self.checkpoints
            if c.ts <= keep_through or (c.kind is CheckpointKind.BASELINE and c is self.checkpoints[0])
        ]

    def note_scope(self, root: str, paths: Iterable[str], ts: int) -> None:
        """Add `paths` of `root` to the restore scope, first recorded at the round `ts`."""
        bucket = self.scope.setdefault(root, {})
        added = [p for p in paths if p not in bucket]
        for path in added:
            bucket[path] = ts
        if added:
            self.pending.append({"op": "scope", "root": root, "paths": added, "ts": ts})

    def note_edited(self, root: str, path: str) -> None:
        """Record `path` of `root` as reported by an edit tool."""
        bucket = self.edited.setdefault(root, [])
        if path not in bucket:
            bucket.append(path)
            self.pending.append({"op": "edited", "root": root, "path": path})

    def apply_op(self, op: dict[str, Any]) -> None:
        """Replay one log operation, through the method that recorded it (same effect)."""
        kind = op["op"]
        if kind == "cp":
            cp = CheckpointRecord(ts=op["ts"], kind=op["kind"], hashes=dict(op["hashes"]), reused=bool(op["reused"]),
                                  created_at=op["created_at"], warnings=list(op["warnings"]))
            if not (isinstance(cp.ts, int)
                    and all(isinstance(v, str) for v in cp.hashes.values())):
                raise ValueError(f"a checkpoint of the wrong shape: {op!r}")
            self.add_checkpoint(cp)
        elif kind == "msg":
            if not isinstance(op["ts"], int):
                raise ValueError(f"a message of the wrong shape: {op!r}")
            self.add_message(op["ts"], str(op["role"]), op["text"])
        elif kind == "scope":
            self.note_scope(str(op["root"]), [str(p) for p in op["paths"]], int(op["ts"]))
        elif kind == "edited":
            self.note_edited(str(op["root"]), str(op["path"]))
        elif kind == "restore":
            if not isinstance(op["entry"], dict) or not isinstance(op["mark"], int | None):
                raise ValueError(f"a restore of the wrong shape: {op!r}")
            self.record_restore(op["entry"], op["mark"])
        else:
            raise ValueError(f"unknown log operation {kind!r}")

    def record_restore(self, entry: dict[str, Any], mark_ts: int | None = None) -> None:
        """Put a written restore on the task's history and undo/redo stacks: an undo or redo
        takes its restore off the top of its stack (`of`); the task's base becomes the state
        the restore left; the checkpoint `mark_ts` (a whole restore to it) is marked restored.
        One log operation (a restore costs a line of task.log, not a rewrite of task.json)."""
        self.restores.append(entry)
        op = entry["op"]
        if op == "restore":
            self.undo_stack.append(entry["n"])
            self.redo_stack.clear()
        elif op == "undo":
            if self.undo_stack and self.undo_stack[-1] == entry.get("of"):
                self.undo_stack.pop()
            self._clear_marks()  # the files are no longer as a restore left them
            undone = self.restore_entry(entry["of"])
            if undone is not None and all(r.get("after") for r in undone["roots"].values()):
                self.redo_stack.append(entry["of"])
        elif op == "redo":
            if self.redo_stack and self.redo_stack[-1] == entry.get("of"):
                self.redo_stack.pop()
            self.undo_stack.append(entry["of"])
        self.base = {**(self.base or {}), **{name: r.get("base") or r["after"] for name, r in entry["roots"].items()}}
        if mark_ts is not None:
            for cp in self.checkpoints:
                if cp.ts == mark_ts:
                    self.mark_restored(cp)
        self.pending.append({"op": "restore", "entry": entry, "mark": mark_ts})

    def scope_paths(self, root: str) -> list[str]:
        """The restore scope of `root`: every path the task changed (PROTOCOL 1.1 "Scope")."""
        return sorted(set(self.scope.get(root, ())) | set(self.edited.get(root, ())))

    def has_scope(self) -> bool:
        """Whether the task has any record of what it changed (else a restore resets every file)."""
        return any(self.scope.values()) or any(self.edited.values())

    def next_restore_n(self) -> int:
        return self.restores[-1]["n"] + 1 if self.restores else 1

    def restore_entry(self, n: int) -> dict[str, Any] | None:
        return next((e for e in self.restores if e.get("n") == n), None)

    def timeline_ts(self) -> list[int]:
        return sorted({m.ts for m in self.messages} | {c.ts for c in self.checkpoints})

    # ---------------------------------------------------------------- (de)serialisation

    def to_json(self) -> dict[str, Any]:
        # by hand: dataclasses.asdict deep-copies recursively and dominated a round's cost
        return {
            "task_id": self.task_id,
            "roots": dict(self.roots),
            "checkpoints": [
                {"ts": c.ts, "kind": c.kind, "hashes": c.hashes, "reused": c.reused, "restored": c.restored,
                 "created_at": c.created_at, "warnings": c.warnings}
                for c in self.checkpoints
            ],
            "messages": [{"ts": m.ts, "role": m.role, "text": m.text} for m in self.messages],
            "edited": self.edited,
            "scope": self.scope,
            "last_restore": self.last_restore,
            "restores": self.restores,
            "undo_stack": self.undo_stack,
            "redo_stack": self.redo_stack,
            "base": self.base,
            "forked_from": self.forked_from,
            "forks": self.forks,
            "disabled": self.disabled,
            "created_at": self.created_at,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TaskRecord:
        rec = cls(task_id=data["task_id"], roots=dict(data.get("roots", {})))
        rec.checkpoints = [CheckpointRecord(**c) for c in data.get("checkpoints", [])]
        rec.marked = [c for c in rec.checkpoints if c.restored]
        rec.messages = [MessageRecord(**m) for m in data.get("messages", [])]
        rec.edited = {k: list(v) for k, v in data.get("edited", {}).items()}
        rec.scope = {k: {str(p): int(t) for p, t in v.items()} for k, v in data.get("scope", {}).items()}
        rec.last_restore = data.get("last_restore")
        if isinstance(rec.last_restore, dict) and rec.last_restore and not data.get("restores"):
            # a 1.0 record: its one undoable restore becomes the undo stack
            data["restores"] = [{"n": 1, "op": "restore", "ts": None, "createdAt": rec.created_at, "roots": {
                name: {"safety": info.get("safety"), "after": None, "paths": list(info.get("paths", []))}
                for name, info in rec.last_restore.items() if isinstance(info, dict)}}]
            data["undo_stack"] = [1]
        rec.last_restore = None
        rec.restores = list(data.get("restores", []))
        rec.undo_stack = [int(n) for n in data.get("undo_stack", [])]
        rec.redo_stack = [int(n) for n in data.get("redo_stack", [])]
        rec.base = data.get("base")
        rec.forked_from = data.get("forked_from")
        rec.forks = list(data.get("forks", []))
        rec.disabled = bool(data.get("disabled", False))
        rec.created_at = data.get("created_at", now_iso())
        # a hand-edited or damaged file may hold anything: refuse what would fail later
        if not isinstance(rec.task_id, str) or not all(
            isinstance(c.ts, int) and isinstance(c.hashes, dict) for c in rec.checkpoints
        ) or not all(isinstance(m.ts, int) for m in rec.messages):
            raise ValueError("task.json fields have the wrong types")
        return rec


def append_line(path: str | Path, line: bytes, expected: int) -> bool:
    """Append `line` to the log `path` in one `write`; False (nothing written) when the log
    is shorter than the `expected` bytes its record holds (removed or cut under us). Bytes
    past `expected` are a torn line of a killed append: cut off first. A failed or short write
    is cut off too, so the log ends with whole lines.

    Raises:
        OSError: the write failed (disk full, quota, I/O error); FileNotFoundError when the
            task folder is gone.
    """
    # a descriptor, not a file object: Python's `open` adds a seek and a second fstat, and
    # this runs every round
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o666)
    try:
        size = os.fstat(fd).st_size
        if size < expected:
            return False
        if size > expected:
            os.ftruncate(fd, expected)
        try:
            written = os.write(fd, line)
            if written != len(line):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        except BaseException:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, expected)
            raise
    finally:
        os.close(fd)
    return True


def drop_log(path: Path) -> None:
    """Remove a log whose lines task.json holds now (a failure only leaves lines ignored on load)."""
    try:
        path.unlink()
    except FileNotFoundError:
        pass
    except OSError as exc:
        log.warning("task.log_not_removed", path=str(path), reason=str(exc))


def write_json_atomic(path: Path, data: Any, pool: FilePool | None = None) -> int:
    """Write `data` as JSON to `path` so that a killed process leaves the old or the new file,
    whole; returns its size in bytes. No fsync (two per write cost ~1 ms of a 4 ms round; see
    the module docstring). `pool`: files made ahead to write into (`loose.FilePool`).

    Raises:
        StorageFailedError: the docs root refused the write (disk full, quota, I/O error); the
            old file is left as it was.
    """
    # compact: with `indent` json falls back to its pure-Python encoder (measured: 5 ms of a
    # 15 ms round on a 130-checkpoint task); ASCII only, so its length is its size in bytes
    text = _COMPACT.encode(data).encode("ascii")
    try:
        if not place(pool, text, path):
            try:
                write_atomic(path, text)
            except FileNotFoundError:  # a new task's folder (made here, not looked for every time)
                path.parent.mkdir(parents=True, exist_ok=True)
                write_atomic(path, text)
        return len(text)
    except OSError as exc:
        raise StorageFailedError(
            f"Could not write {path}: {exc.strerror or exc}. Nothing was half-written; free space in the "
            "docs root (or fix the disk) and repeat the request.") from exc


class CheckpointStore:
    """Task folders under `<docs-root>/tasks/`."""

    def __init__(self, docs_dir: Path, *, made_ahead: bool = False) -> None:
        """`made_ahead`: write the restore journal and task.json into files made ahead by a
        thread (`loose.FilePool`; the engine's store, closed with `close`)."""
        self.docs_dir = docs_dir
        self.tasks_dir = docs_dir / "tasks"
        # a task folder's name never starts with "." (ref_component)
        self.pool = FilePool(self.tasks_dir / ".file-pool", size=8, anchor=docs_dir) if made_ahead else None

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()

    def task_dir(self, task_id: str) -> Path:
        return self.tasks_dir / ref_component(task_id)

    def exists(self, task_id: str) -> bool:
        return (self.task_dir(task_id) / TASK_FILE).is_file()

    def load(self, task_id: str) -> TaskRecord:
        """task.json, then the lines of its log generation replayed in order.

        Raises UnknownTaskError when the task has no (readable) folder.
        """
        folder = self.task_dir(task_id)
        path = folder / TASK_FILE
        try:
            with open(path, encoding="utf-8", errors="surrogateescape") as fh:
                text = fh.read()
            data = json.loads(text)
        except FileNotFoundError:
            raise UnknownTaskError(f"Unknown task {task_id!r}: start it with task/start first.") from None
        except (OSError, ValueError) as exc:
            raise TaskMetadataError(f"Task {task_id!r} has unreadable metadata ({exc}).") from exc
        try:
            rec = TaskRecord.from_json(data)
            gen = data.get("log_gen", 0)
            if not isinstance(gen, int):
                raise ValueError("log_gen is not a number")
        except Exception as exc:  # valid JSON of the wrong shape: any field may be off
            raise TaskMetadataError(f"Task {task_id!r} has unreadable metadata ({exc!r}).") from exc
        if rec.task_id != task_id:
            raise TaskMetadataError(f"Task folder {path.parent} belongs to {rec.task_id!r}, not {task_id!r}.")
        rec.log_gen, rec.json_size = gen, len(text)
        rec.log_size = self._replay(rec, folder / LOG_FILE)
        rec.pending.clear()
        rec.full_write = False
        return rec

    @staticmethod
    def _replay(rec: TaskRecord, log_path: Path) -> int:
        """Apply the log lines of `rec.log_gen` to `rec`; the bytes of its whole lines (a torn
        last line, a killed append, is not one: the next append cuts it off)."""
        try:
            with open(log_path, "rb") as fh:
                raw = fh.read()
        except FileNotFoundError:
            return 0
        except OSError as exc:
            raise TaskMetadataError(f"Task {rec.task_id!r} has an unreadable log ({exc}).") from exc
        whole = raw.rfind(b"\n") + 1
        if whole < len(raw):
            log.warning("task.log_torn_line_ignored", task_id=rec.task_id, bytes=len(raw) - whole)
        for n, line in enumerate(raw[:whole].splitlines(), 1):
            try:
                entry = json.loads(line)
                if not isinstance(entry, dict) or entry.get("g") != rec.log_gen:
                    continue  # an older generation, already in task.json (a kill before the log went)
                for op in entry["ops"]:
                    rec.apply_op(op)
            except Exception as exc:  # a damaged line: the others still count
                log.warning("task.log_line_skipped", task_id=rec.task_id, line=n, reason=repr(exc)[:200])
        return whole

    def set_aside(self, task_id: str) -> Path | None:
        """Rename an unreadable task.json out of the way, keeping it for a person to inspect."""
        path = self.task_dir(task_id) / TASK_FILE
        aside = path.with_name(f"{TASK_FILE}.damaged-{datetime.now(UTC).strftime('%Y%m%dT%H%M%S%f')}")
        try:
            os.replace(path, aside)
        except OSError:
            return None
        # its log goes with it: its lines belong to that file, not to the record rebuilt next
        with contextlib.suppress(OSError):
            os.replace(path.with_name(LOG_FILE), aside.with_name(aside.name.replace(TASK_FILE, LOG_FILE)))
        return aside

    def has_any_task(self) -> bool:
        """True if any task folder holds a task.json, readable or not (a damaged one still counts)."""
        if not self.tasks_dir.is_dir():
            return False
        return any((d / TASK_FILE).is_file() for d in self.tasks_dir.iterdir())

    def save(self, rec: TaskRecord) -> None:
        """Write the whole record: task.json of the next log generation, then the log goes.

        Raises:
            StorageFailedError: task.json could not be written; the old files are intact and
                the next write (`save` or `append`) writes the whole record again.
        """
        folder = self.task_dir(rec.task_id)
        data = rec.to_json()
        data["log_gen"] = rec.log_gen + 1
        try:
            rec.json_size = write_json_atomic(folder / TASK_FILE, data, self.pool)
        except BaseException:
            rec.full_write = True
            raise
        rec.log_gen += 1
        rec.pending.clear()
        rec.full_write = False
        # a kill here leaves a log of the previous generation: ignored on load, cut below
        drop_log(folder / LOG_FILE)
        rec.log_size = 0

    def append(self, rec: TaskRecord) -> None:
        """Write the changes since the last write as one log line (one `write`); the whole
        record instead when it was never written, a write of it failed, the log has gone
        missing or would pass the compaction size.

        Raises:
            StorageFailedError: the docs root refused the write; nothing was added to the
                record on disk and `rec.pending` still holds the changes.
        """
        if rec.full_write:
            self.save(rec)
            return
        if not rec.pending:
            return
        line = _COMPACT.encode({"g": rec.log_gen, "ops": rec.pending}).encode("ascii") + b"\n"
        if rec.log_size + len(line) > max(LOG_COMPACT_MIN, rec.json_size):
            log.debug("task.log_compacted", task_id=rec.task_id, log_bytes=rec.log_size)
            self.save(rec)
            return
        name = ref_component(rec.task_id)
        log_path = f"{self.tasks_dir}/{name}/{LOG_FILE}"  # a str: a `Path` made every round costs as much as the write
        try:
            intact = append_line(log_path, line, rec.log_size)
            if intact and rec.log_size == 0 and not (self.tasks_dir / name / TASK_FILE).is_file():
                intact = False  # the task folder went away: the log alone would be no record
        except FileNotFoundError:
            intact = False  # the task folder is gone (deleted under a running engine)
        except OSError as exc:
            raise StorageFailedError(
                f"Could not write {log_path} (the log of {TASK_FILE}): {exc.strerror or exc}. Nothing was "
                "half-written; free space in the docs root (or fix the disk) and repeat the request.") from exc
        if not intact:
            log.warning("task.log_lost", task_id=rec.task_id, hint="the whole record is written again")
            self.save(rec)
            return
        rec.log_size += len(line)
        rec.pending.clear()

    def delete(self, task_id: str) -> None:
        shutil.rmtree(self.task_dir(task_id), ignore_errors=True)

    def task_ids(self) -> list[str]:
        """Ids of every task of the docs root (all workspaces)."""
        out: list[str] = []
        if not self.tasks_dir.is_dir():
            return out
        for d in sorted(self.tasks_dir.iterdir()):
            f = d / TASK_FILE
            if f.is_file():
                try:
                    with open(f, encoding="utf-8", errors="surrogateescape") as fh:
                        out.append(str(json.load(fh)["task_id"]))
                except (OSError, ValueError, KeyError):
                    continue
        return out

    # ---------------------------------------------------------------- restore journal

    def write_journal(self, task_id: str, journal: dict[str, Any]) -> None:
        """Write the task's restore journal in place (one file per task, removed once its restore
        is recorded: `clear_journal`).

        No temporary file and rename, as every other record has: a journal that a kill or a full
        disk cut short is no JSON and reads as none, and that is right, since a restore moves
        its first file only once its journal is whole. (A rename over the old journal made ext4
        write the new one back at once: ~0.4 ms of a ~5 ms one-file restore.)

        Raises:
            StorageFailedError: the docs root refused the write (emptied again where it can be).
        """
        path = self.task_dir(task_id) / JOURNAL_FILE
        text = _COMPACT.encode(journal).encode("ascii")
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC
        try:
            try:
                fd = os.open(path, flags, 0o644)
            except FileNotFoundError:  # a task folder not written yet (made here, as write_json_atomic does)
                path.parent.mkdir(parents=True, exist_ok=True)
                fd = os.open(path, flags, 0o644)
            try:
                write_all(fd, text)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.ftruncate(fd, 0)
                raise
            finally:
                os.close(fd)
        except OSError as exc:
            raise StorageFailedError(
                f"Could not write {path}: {exc.strerror or exc}. Nothing was restored; free space in the docs "
                "root (or fix the disk) and repeat the request.") from exc

    def read_journal(self, task_id: str) -> dict[str, Any] | None:
        try:
            with open(self.task_dir(task_id) / JOURNAL_FILE, encoding="utf-8", errors="surrogateescape") as fh:
                data = json.load(fh)
                return data if isinstance(data, dict) else None
        except (OSError, ValueError):
            return None

    def clear_journal(self, task_id: str) -> None:
        """Remove the task's restore journal (a missing or empty journal is none). Removed, not
        emptied: truncating a file whose bytes are not yet written back costs ext4 ~80 us (the
        file goes through its orphan list), removing it ~3 us, and the next journal is a new
        file, made as cheaply as an emptied one is opened again."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.task_dir(task_id) / JOURNAL_FILE)


def fork_record(source: TaskRecord, ts: int, new_task_id: str) -> TaskRecord:
    """The record of a fork of `source` at `ts`: its messages and checkpoints up to `ts` (sharing
    their snapshots), its scope up to `ts`; no restore history, no marks.

    Raises:
        UnknownCheckpointError: no checkpoint of `source` at or before `ts`.
    """
    kept = [c for c in source.checkpoints if c.ts <= ts]
    if not kept:
        raise UnknownCheckpointError(f"Task {source.task_id} has no checkpoint at or before ts={ts}.")
    rec = TaskRecord(task_id=new_task_id, roots=dict(source.roots))
    rec.checkpoints = [CheckpointRecord(ts=c.ts, kind=c.kind, hashes=dict(c.hashes), reused=c.reused,
                                        created_at=c.created_at, warnings=[dict(w) for w in c.warnings])
                       for c in kept]
    rec.messages = [MessageRecord(m.ts, m.role, m.text) for m in source.messages if m.ts <= ts]
    rec.scope = {root: {p: t for p, t in paths.items() if t <= ts} for root, paths in source.scope.items()}
    # edit tools' paths of records older than the scope's ts came with no ts: all of them
    rec.edited = {root: [p for p in paths if source.scope.get(root, {}).get(p, ts) <= ts]
                  for root, paths in source.edited.items()}
    rec.forked_from = {"taskId": source.task_id, "ts": kept[-1].ts, "createdAt": rec.created_at}
    return rec


def checkpoint_or_raise(rec: TaskRecord, ts: object) -> CheckpointRecord:
    """The checkpoint at `ts`; `unknown_checkpoint` for anything else (a library caller's `None`)."""
    if not isinstance(ts, int) or isinstance(ts, bool):
        raise UnknownCheckpointError(f"No checkpoint at ts={ts!r}.")
    return rec.checkpoint(ts)
