"""`CheckpointStore`: each task's checkpoint metadata under `<docs-root>/tasks/<task-id>/`.

Owns the timeline of a task (messages and checkpoints by `ts`), the restored marks, the
files edit tools reported, the undo record of the last file restore and the restore
journal; every change is written atomically (temp file, rename), so a killed process leaves
the old or the new file, never a torn one. Not synced to disk: a power cut may lose the last
changes, like the loose objects libgit2 writes without fsync (only the user's files that a
restore writes are synced, in safe_fs). Used by the engine under the task's lock; knows
nothing of git.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import threading
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import structlog

from shadowpoint.errors import StorageFailedError, TaskMetadataError, UnknownCheckpointError, UnknownTaskError
from shadowpoint.shadow_repo import ref_component

log = structlog.get_logger(__name__)

TASK_FILE = "task.json"
JOURNAL_FILE = "restore-journal.json"
SNAPSHOT_KINDS = ("baseline", "round", "completion")


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass(slots=True)
class CheckpointRecord:
    """One checkpoint of a task, attached to the message `ts`."""

    ts: int
    kind: str  # baseline | round | completion | compaction
    hashes: dict[str, str]
    reused: bool = False
    restored: bool = False
    created_at: str = field(default_factory=now_iso)
    warnings: list[dict[str, str]] = field(default_factory=list)

    @property
    def has_snapshot(self) -> bool:
        return self.kind in SNAPSHOT_KINDS and bool(self.hashes)

    def to_wire(self, first_root: str) -> dict[str, Any]:
        """The protocol's `Checkpoint` object."""
        return {
            "ts": self.ts,
            "kind": self.kind,
            "hash": self.hashes.get(first_root) if self.has_snapshot else None,
            "hashes": dict(self.hashes) if self.has_snapshot else {},
            "reused": self.reused,
            "restored": self.restored,
            "createdAt": self.created_at,
            "warnings": list(self.warnings),
        }


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
    last_restore: dict[str, Any] | None = None  # undo record of the last file restore
    disabled: bool = False
    created_at: str = field(default_factory=now_iso)

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

    def add_checkpoint(self, cp: CheckpointRecord) -> None:
        """Append (or replace one at the same ts); a new checkpoint clears every restored mark."""
        for other in self.checkpoints:
            other.restored = False
        self.checkpoints = [c for c in self.checkpoints if c.ts != cp.ts]
        self.checkpoints.append(cp)
        self.checkpoints.sort(key=lambda c: c.ts)

    def add_message(self, ts: int, role: str, text: str | None) -> None:
        for m in self.messages:
            if m.ts == ts:
                m.role = role
                if text is not None:
                    m.text = text
                return
        self.messages.append(MessageRecord(ts, role, text))
        self.messages.sort(key=lambda m: m.ts)

    def message(self, ts: int) -> MessageRecord | None:
        return next((m for m in self.messages if m.ts == ts), None)

    def cut_after(self, keep_through: int) -> None:
        """Drop the messages and checkpoints after `keep_through` (the baseline always stays)."""
        self.messages = [m for m in self.messages if m.ts <= keep_through]
        self.checkpoints = [
            c for c in self.checkpoints if c.ts <= keep_through or (c.kind == "baseline" and c is self.checkpoints[0])
        ]

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
            "last_restore": self.last_restore,
            "disabled": self.disabled,
            "created_at": self.created_at,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TaskRecord:
        rec = cls(task_id=data["task_id"], roots=dict(data.get("roots", {})))
        rec.checkpoints = [CheckpointRecord(**c) for c in data.get("checkpoints", [])]
        rec.messages = [MessageRecord(**m) for m in data.get("messages", [])]
        rec.edited = {k: list(v) for k, v in data.get("edited", {}).items()}
        rec.last_restore = data.get("last_restore")
        rec.disabled = bool(data.get("disabled", False))
        rec.created_at = data.get("created_at", now_iso())
        # a hand-edited or damaged file may hold anything: refuse what would fail later
        if not isinstance(rec.task_id, str) or not all(
            isinstance(c.ts, int) and isinstance(c.hashes, dict) and isinstance(c.kind, str) for c in rec.checkpoints
        ) or not all(isinstance(m.ts, int) for m in rec.messages):
            raise ValueError("task.json fields have the wrong types")
        return rec


def write_json_atomic(path: Path, data: Any) -> None:
    """Write `data` as JSON to `path` so that a killed process leaves the old or the new file,
    whole. No fsync (two per write cost ~1 ms of a 4 ms round; see the module docstring).

    Raises:
        StorageFailedError: the docs root refused the write (disk full, quota, I/O error); the
            old file is left as it was.
    """
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "w", encoding="utf-8", errors="surrogateescape") as fh:
            # compact: with `indent` json falls back to its pure-Python encoder (measured: 5 ms
            # of a 15 ms round on a 130-checkpoint task)
            fh.write(json.dumps(data, ensure_ascii=True, separators=(",", ":")))
        os.replace(tmp, path)
    except BaseException as exc:
        # a failed write (unserialisable data, disk full) must not leave its temp file behind
        with contextlib.suppress(OSError):
            tmp.unlink()
        if isinstance(exc, OSError):
            raise StorageFailedError(
                f"Could not write {path}: {exc.strerror or exc}. Nothing was half-written; free space in the "
                "docs root (or fix the disk) and repeat the request.") from exc
        raise


class CheckpointStore:
    """Task folders under `<docs-root>/tasks/`."""

    def __init__(self, docs_dir: Path) -> None:
        self.docs_dir = docs_dir
        self.tasks_dir = docs_dir / "tasks"

    def task_dir(self, task_id: str) -> Path:
        return self.tasks_dir / ref_component(task_id)

    def exists(self, task_id: str) -> bool:
        return (self.task_dir(task_id) / TASK_FILE).is_file()

    def load(self, task_id: str) -> TaskRecord:
        """Raises UnknownTaskError when the task has no (readable) folder."""
        path = self.task_dir(task_id) / TASK_FILE
        try:
            with open(path, encoding="utf-8", errors="surrogateescape") as fh:
                data = json.load(fh)
        except FileNotFoundError:
            raise UnknownTaskError(f"Unknown task {task_id!r}: start it with task/start first.") from None
        except (OSError, ValueError) as exc:
            raise TaskMetadataError(f"Task {task_id!r} has unreadable metadata ({exc}).") from exc
        try:
            rec = TaskRecord.from_json(data)
        except Exception as exc:  # valid JSON of the wrong shape: any field may be off
            raise TaskMetadataError(f"Task {task_id!r} has unreadable metadata ({exc!r}).") from exc
        if rec.task_id != task_id:
            raise TaskMetadataError(f"Task folder {path.parent} belongs to {rec.task_id!r}, not {task_id!r}.")
        return rec

    def set_aside(self, task_id: str) -> Path | None:
        """Rename an unreadable task.json out of the way, keeping it for a person to inspect."""
        path = self.task_dir(task_id) / TASK_FILE
        aside = path.with_name(f"{TASK_FILE}.damaged-{datetime.now(UTC).strftime('%Y%m%dT%H%M%S%f')}")
        try:
            os.replace(path, aside)
        except OSError:
            return None
        return aside

    def has_any_task(self) -> bool:
        """True if any task folder holds a task.json, readable or not (a damaged one still counts)."""
        if not self.tasks_dir.is_dir():
            return False
        return any((d / TASK_FILE).is_file() for d in self.tasks_dir.iterdir())

    def save(self, rec: TaskRecord) -> None:
        write_json_atomic(self.task_dir(rec.task_id) / TASK_FILE, rec.to_json())

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
        write_json_atomic(self.task_dir(task_id) / JOURNAL_FILE, journal)

    def read_journal(self, task_id: str) -> dict[str, Any] | None:
        try:
            with open(self.task_dir(task_id) / JOURNAL_FILE, encoding="utf-8", errors="surrogateescape") as fh:
                data = json.load(fh)
                return data if isinstance(data, dict) else None
        except (OSError, ValueError):
            return None

    def clear_journal(self, task_id: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            (self.task_dir(task_id) / JOURNAL_FILE).unlink()


def checkpoint_or_raise(rec: TaskRecord, ts: Any) -> CheckpointRecord:
    if not isinstance(ts, int) or isinstance(ts, bool):
        raise UnknownCheckpointError(f"No checkpoint at ts={ts!r}.")
    return rec.checkpoint(ts)
