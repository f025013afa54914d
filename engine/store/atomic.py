"""The one atomic-write helper: a temporary file beside the target, renamed over it when whole.

A process killed midway leaves the old file or the new one, whole, never a mix; a failure
(disk full, an exception while writing) removes the temporary file and leaves the old file
as it was. Used for the task records (checkpoints), the stat cache, the borrowed-object
ledger, loose blobs written past libgit2 (shadow_repo), the hook endpoint's secret and the
agents' settings files (adapters). Runs on its caller's thread.

No fsync: every caller accepts losing the newest version to a power cut (the task records
measured two fsyncs at ~1 ms of a 4 ms round, see checkpoints.py). Writers that sync keep
their own code for a reason: the restore writer (safe_fs) works on directory descriptors
without following links, the pack writer names its file by a checksum known only at the end,
and the lean hook command (hookrun) imports no shadowpoint module.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO


def temp_path(path: Path) -> Path:
    """The default temporary name: hidden, beside `path`, unique per process and thread."""
    return path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")


@contextlib.contextmanager
def atomic_writer(path: Path, *, tmp: Path | None = None, perm: int = 0o666) -> Iterator[BinaryIO]:
    """A binary file to write `path`'s new content into; renamed over `path` when the block ends.

    Args:
        path: The file to replace (its folder must exist).
        tmp: The temporary file (default `temp_path(path)`); on the same file system as
            `path`, e.g. where a sweep of stale temporary files looks.
        perm: The permission bits the temporary file is created with (the umask applies);
            change them further with `os.fchmod` on the yielded file.

    Raises:
        OSError: the write or the rename failed; the temporary file is gone, `path` untouched.
    """
    tmp = tmp or temp_path(path)
    try:
        with open(tmp, "wb", opener=lambda name, flags: os.open(name, flags | os.O_CLOEXEC, perm)) as fh:
            yield fh
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def write_atomic(path: Path, data: bytes, *, tmp: Path | None = None, perm: int = 0o666) -> None:
    """Replace `path` with `data` atomically (`atomic_writer` in one call)."""
    with atomic_writer(path, tmp=tmp, perm=perm) as fh:
        fh.write(data)
