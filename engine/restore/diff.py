"""Compare: turns tree-to-tree deltas into the protocol's `Diff` (SPEC §5).

Called by the engine with trees it already has (a checkpoint's, or a fresh uncommitted
snapshot of the workspace); reads blobs through `ShadowRepo`. Binary files are decided
from their content (a NUL byte in the first 8 KiB) and carry no content.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from shadowpoint.results import Wire
from shadowpoint.store.shadow_repo import ShadowRepo
from shadowpoint.store.values import MODE_LINK, DeltaRecord
from shadowpoint.workspace import RepoPath

TITLE_SINCE = "Changes since snapshot"
TITLE_NEW = "New changes"
BINARY_SNIFF_BYTES = 8192


def is_binary(data: bytes) -> bool:
    return b"\0" in data[:BINARY_SNIFF_BYTES]


def decode_text(data: bytes) -> str:
    """Text for the wire: UTF-8, with undecodable bytes as lone surrogates (surrogateescape)."""
    return data.decode("utf-8", "surrogateescape")


@dataclass(frozen=True, slots=True)
class FileChange:
    """One changed file of a Diff."""

    path: str
    status: str
    old_path: str | None
    binary: bool
    before: str | None
    after: str | None
    before_bytes: bytes | None
    after_bytes: bytes | None
    old_mode: int | None
    new_mode: int | None

    def to_wire(self) -> Wire:
        """PROTOCOL.md `Diff.files[]`."""
        out: Wire = {
            "path": self.path,
            "status": self.status,
            "binary": self.binary,
            "before": self.before,
            "after": self.after,
        }
        if self.old_path is not None:
            out["oldPath"] = self.old_path
        return out


def file_changes(
    repo: ShadowRepo, old_tree: str | None, new_tree: str | None, display: Callable[[RepoPath], str]
) -> list[FileChange]:
    """Every changed file between two trees of one root, paths shown through `display`."""
    out = []
    for d in repo.diff_trees(old_tree, new_tree):
        out.append(_change(repo, d, display))
    return out


def _change(repo: ShadowRepo, d: DeltaRecord, display: Callable[[RepoPath], str]) -> FileChange:
    before = repo.read_blob(d.old_oid) if d.old_oid else None
    after = repo.read_blob(d.new_oid) if d.new_oid else None
    binary = any(
        b is not None and mode != MODE_LINK and is_binary(b)
        for b, mode in ((before, d.old_mode), (after, d.new_mode))
    )
    return FileChange(
        path=display(d.path),
        status=d.status,
        old_path=display(d.old_path) if d.old_path else None,
        binary=binary,
        before=None if binary or before is None else decode_text(before),
        after=None if binary or after is None else decode_text(after),
        before_bytes=before,
        after_bytes=after,
        old_mode=d.old_mode,
        new_mode=d.new_mode,
    )


def by_path(changes: list[FileChange]) -> tuple[FileChange, ...]:
    """A Diff's files in the order it lists them."""
    return tuple(sorted(changes, key=lambda c: c.path))
