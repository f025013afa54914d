"""The shadow repository's plain values, without pygit2: git file modes, a snapshot's tree
entries and the changes a round makes to them, a diff's delta records, and the ref names of a
task (its checkpoints, safety checkpoints and restores).

Imported by the stages that only need the values (the stat cache, the stager's callers, the
verifier, the checkpoint store) and by `shadow_repo`, the only module that imports pygit2
(tests/unit/test_store_values.py checks that importing this one does not). No thread, no I/O.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass

from shadowpoint.workspace import RepoPath

MODE_FILE = 0o100644
MODE_EXEC = 0o100755
MODE_LINK = 0o120000
MODE_TREE = 0o040000
MODE_GITLINK = 0o160000

COMMITTER_NAME = "shadowpoint Checkpoint"
COMMITTER_EMAIL = "checkpoint@shadowpoint.invalid"
TASK_TRAILER = "Shadowpoint-Task"
HEAD_REF = "refs/shadowpoint/head"


@dataclass(frozen=True, slots=True)
class TreeEntry:
    """One file of a snapshot: blob id (hex) and git file mode."""

    oid: str
    mode: int


def file_entry(oid: str, st_mode: int) -> TreeEntry:
    """A regular file's entry: executable in git when its owner may execute it."""
    return TreeEntry(oid, MODE_EXEC if st_mode & 0o100 else MODE_FILE)


Changes = Mapping[RepoPath, TreeEntry | None]


@dataclass(frozen=True, slots=True)
class DeltaRecord:
    """One changed path between two trees."""

    status: str  # added | modified | deleted | renamed
    path: RepoPath
    old_path: RepoPath | None
    old_oid: str | None
    new_oid: str | None
    old_mode: int | None
    new_mode: int | None


_SAFE_REF = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,100}$")


def ref_component(task_id: str) -> str:
    """A ref-name-safe component for a task id (non-safe ids get a readable hashed form)."""
    if _SAFE_REF.match(task_id) and not task_id.endswith(".lock") and ".." not in task_id:
        return task_id
    cleaned = re.sub(r"[^A-Za-z0-9._-]", "_", task_id)[:60].strip("._") or "task"
    cleaned = re.sub(r"\.{2,}", "_", cleaned)  # ".." is invalid in a ref name ("a/../b" -> "a_.._b")
    return f"{cleaned}-{hashlib.sha256(task_id.encode('utf-8', 'surrogateescape')).hexdigest()[:12]}"


def task_ref(task_id: str) -> str:
    return f"refs/shadowpoint/tasks/{ref_component(task_id)}"


def safety_ref(task_id: str) -> str:
    return f"refs/shadowpoint/safety/{ref_component(task_id)}"


def restore_ref(task_id: str, n: int) -> str:
    """The ref keeping a task's file restore `n` (its after-state commit, whose parent is the
    safety checkpoint taken before it): safety checkpoints live as long as their task."""
    return f"{restore_ref_prefix(task_id)}{n}"


def restore_ref_prefix(task_id: str) -> str:
    return f"refs/shadowpoint/restores/{ref_component(task_id)}/"
