"""`BlobWorkers`: worker processes that read workspace files and write their blobs during big scans.

pygit2 holds the GIL while it hashes, deflates and writes a blob, so only processes hash in
parallel. The scanner's thread queues paths (never contents) and records the answers; each
worker (`python -m shadowpoint.stage.blob_workers`, the `serve` loop) reads a file with `read_file`
and answers with the blob id and the file's fstat. One reader thread per worker parses its answers.
"""

from __future__ import annotations

import collections
import enum
import errno
import os
import queue
import signal
import stat
import struct
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import IO

import structlog

from shadowpoint.errors import FileNotStorableError, RepoError, StorageFailedError
from shadowpoint.store.shadow_repo import open_blob_writer
from shadowpoint.workspace import RepoPath

log = structlog.get_logger(__name__)

# O_NOFOLLOW: a file swapped for a symlink after the walk is never read through;
# O_NONBLOCK: a FIFO swapped in after the lstat does not hang the read.
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC

# More processes than cores only add switching: each worker keeps a core busy on its own.
MAX_WORKERS = 4

_HELLO = b"shadowpoint-blob-worker 1\n"  # a worker's first bytes, once its repository is open
_LEN = struct.Struct("<I")
# size, mtime (s, ns), ctime (s, ns), st_mode, inode: seconds and nanoseconds apart, as a
# time after 2262 overflows a signed 64-bit count of nanoseconds (ext4 stores up to 2446)
_STAT = struct.Struct("<QqIqIIQ")
_OID_BYTES = 20
_OK, _VANISHED, _UNREADABLE, _TOO_LARGE, _UNSTORABLE = b"K", b"V", b"U", b"L", b"N"
_REPO_FAILED, _STORAGE_FAILED = b"R", b"S"


def default_worker_count() -> int:
    """Worker processes for this machine: one per usable core, none on a single core."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return min(cpus, MAX_WORKERS) if cpus > 1 else 0


@dataclass(frozen=True, slots=True)
class BlobWorkerOptions:
    """When a scan hands its hashing to worker processes, and in what portions.

    Starting a worker (an interpreter importing pygit2 and structlog) took 0.17 s here, about
    what the scanner's own thread takes to hash 500 small files, so smaller scans stay in
    process (benchmarks: `python -m benchmarks --only baseline`).
    """

    workers: int = field(default_factory=default_worker_count)
    min_files: int = 512
    min_bytes: int = 32 * 1024 * 1024
    batch_paths: int = 128
    batch_bytes: int = 4 * 1024 * 1024  # by lstat size: large files spread over the workers
    batches_per_worker: int = 2  # one being hashed and one waiting: a worker never idles on the pipe


class FailureKind(enum.Enum):
    VANISHED = "vanished"
    UNREADABLE = "unreadable"
    TOO_LARGE = "too large"
    UNSTORABLE = "not storable"  # beyond a file-size limit of the docs root's file system or the process


@dataclass(frozen=True, slots=True)
class HashedFile:
    """A file a worker read and wrote: its blob id and the fstat of what it read."""

    oid: str
    stat: os.stat_result


@dataclass(frozen=True, slots=True)
class ReadFailure:
    """A file a worker could not snapshot, with the error as the scanner's own read words it."""

    kind: FailureKind
    detail: str


@dataclass(frozen=True, slots=True)
class _RepoFailed:
    detail: str
    storage: bool = False  # the docs root refused the write (StorageFailedError), else a RepoError


Outcome = HashedFile | ReadFailure | None
"""None: no worker answered for the path (none started, or it failed); the caller hashes it."""
Result = tuple[RepoPath, Outcome]


def read_file(path: str | Path, max_bytes: int) -> tuple[bytes, os.stat_result]:
    """Read a regular file, never through a symlink, and at most `max_bytes + 1` bytes of it.

    Returns the bytes and the fstat taken before reading them; more than `max_bytes` bytes
    means the file is over the cap.

    Raises:
        OSError: the file cannot be read (FileNotFoundError when it is gone; EINVAL when it
            is no longer a regular file; ELOOP when a symlink stands in its place).
    """
    fd = os.open(path, _READ_FLAGS)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
        chunks: list[bytes] = []
        left = max_bytes + 1
        while left > 0:
            # first read sized from fstat: a file that did not grow is read in one call
            chunk = os.read(fd, min(left, (1 << 20) if chunks else st.st_size + 1))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks), st
    finally:
        os.close(fd)


def snapshot_file(read: Callable[[], tuple[bytes, os.stat_result]], max_bytes: int,
                  write_blob: Callable[[bytes], str]) -> HashedFile | ReadFailure:
    """What one regular file makes in a snapshot, the same in a worker and on the scanner's
    thread: its blob (written) and fstat, or why it was left out.

    Args:
        read: `read_file` of the file (or the scanner's seam around it).

    Raises:
        RepoError: `write_blob` failed.
        StorageFailedError: the docs root refused the write (disk full, quota, I/O error); a
            blob that alone is too large to store is a `ReadFailure` (UNSTORABLE) instead.
    """
    try:
        data, st = read()
    except FileNotFoundError as exc:
        return ReadFailure(FailureKind.VANISHED, str(exc))
    except OSError as exc:
        return ReadFailure(FailureKind.UNREADABLE, str(exc))
    if len(data) > max_bytes:
        return ReadFailure(FailureKind.TOO_LARGE, f"{max(len(data), st.st_size)} bytes")
    try:
        return HashedFile(write_blob(data), st)
    except FileNotStorableError as exc:
        return ReadFailure(FailureKind.UNSTORABLE, str(exc))


# ---------------------------------------------------------------------- the scanner's side


@dataclass(eq=False)
class _Worker:
    proc: subprocess.Popen[bytes]
    outstanding: collections.deque[list[RepoPath]] = field(default_factory=collections.deque)
    reader: threading.Thread | None = None
    alive: bool = True
    failure: str = ""  # why the reader stopped, set before it queues its end marker
    broken_pipe: bool = False
    returncode: int | None = None
    stopped: bool = False

    def send(self, paths: list[RepoPath]) -> None:
        self.outstanding.append(paths)
        if self.broken_pipe:
            return  # it is exiting: its reader's end marker gives these paths back
        payload = b"\0".join(os.fsencode(p) for p in paths)
        stdin = self.proc.stdin
        assert stdin is not None
        view = memoryview(_LEN.pack(len(payload)) + payload)
        try:
            while view:
                view = view[stdin.write(view) or 0:]
        except OSError:
            self.broken_pipe = True

    def stop(self, *, terminate: bool) -> int | None:
        """End the process (EOF on its stdin; SIGTERM too when it holds work) and reap it."""
        if self.stopped:
            return self.returncode
        self.stopped = True
        self.alive = False
        if self.proc.stdin is not None:
            try:
                self.proc.stdin.close()
            except OSError:
                pass
        if terminate and self.proc.poll() is None:
            self.proc.terminate()
        try:
            code = self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        if self.reader is not None:
            self.reader.join()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self.returncode = code
        return code


def _read_replies(worker: _Worker, replies: queue.Queue[tuple[_Worker, list[Outcome | _RepoFailed] | None]]) -> None:
    """Reader thread of one worker: owns its stdout; queues each parsed answer, then None."""
    stream = worker.proc.stdout
    assert stream is not None
    try:
        if _read_exact(stream, len(_HELLO)) != _HELLO:
            worker.failure = "exited before it was ready"
            return
        while True:
            payload = _read_frame(stream)
            if payload is None:
                worker.failure = "exited"
                return
            replies.put((worker, _parse_reply(payload)))
    except Exception as exc:  # a garbled answer: the worker is given up, its paths come back
        worker.failure = f"sent a garbled answer: {exc!r}"
    finally:
        replies.put((worker, None))


class BlobWorkers:
    """Hands the files of one scan to worker processes; used on the scanner's thread only.

    Paths queue up until the scan has `min_files` files or `min_bytes` bytes to hash, then
    the workers start. `submit` and `flush` return the results that are in, each exactly once
    per submitted path; `close` stops and reaps the workers.
    """

    def __init__(self, git_dir: Path, root: Path, max_file_bytes: int, options: BlobWorkerOptions) -> None:
        self._git_dir = git_dir
        self._root = root
        self._max_file_bytes = max_file_bytes
        self._options = options
        self._workers: list[_Worker] = []
        self._started = False
        self._given_up = options.workers < 1
        self._waiting: collections.deque[tuple[RepoPath, int]] = collections.deque()  # not sent yet
        self._waiting_bytes = 0
        self._queued_files = 0
        self._queued_bytes = 0
        self._pending: set[RepoPath] = set()  # submitted, no result returned yet
        self._replies: queue.Queue[tuple[_Worker, list[Outcome | _RepoFailed] | None]] = queue.Queue()
        self.answered = 0  # paths the workers hashed or reported
        self.given_back = 0  # paths returned unanswered after the workers started

    def worker_pids(self) -> list[int]:
        """Process ids of the running workers (for fault tests)."""
        return [w.proc.pid for w in self._workers if w.alive]

    def submit(self, path: RepoPath, size: int) -> list[Result]:
        """Queue a regular file of `size` bytes (its lstat); returns the results in so far.

        Raises:
            RepoError: a worker failed to write a blob.
            StorageFailedError: the docs root refused a worker's write.
        """
        if self._given_up:
            return [*self._give_back_waiting(), (path, None)]
        # a path queued twice: its first answer is recorded first
        done = self.flush() if path in self._pending else []
        self._pending.add(path)
        self._waiting.append((path, size))
        self._waiting_bytes += size
        self._queued_files += 1
        self._queued_bytes += size
        if not self._started:
            if self._queued_files < self._options.min_files and self._queued_bytes < self._options.min_bytes:
                return done
            self._start()
        return done + self._pump(final=False)

    def flush(self) -> list[Result]:
        """Wait for every queued path; returns their results.

        Raises:
            RepoError: a worker failed to write a blob.
            StorageFailedError: the docs root refused a worker's write.
        """
        if not self._started:
            return self._give_back_waiting()
        done = self._pump(final=True)
        while any(w.outstanding for w in self._workers):
            done += self._next_reply()
        return done

    def close(self) -> None:
        """Stop and reap every worker; idempotent. Unanswered paths are dropped (a failed scan)."""
        for worker in self._workers:
            worker.stop(terminate=bool(worker.outstanding))
        if self._started:
            log.debug("blob_workers.closed", root=str(self._root), workers=len(self._workers),
                      answered=self.answered, given_back=self.given_back)
        self._workers = []

    # ------------------------------------------------------------------ internals

    def _start(self) -> None:
        self._started = True
        argv = [sys.executable, "-P", "-m", "shadowpoint.stage.blob_workers", str(self._git_dir), str(self._root),
                str(self._max_file_bytes), str(os.getpid())]
        for _ in range(self._options.workers):
            try:
                if not sys.executable:
                    raise OSError(errno.ENOENT, "no Python interpreter path (sys.executable is empty)")
                proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0,
                                        close_fds=True)
            except (OSError, ValueError) as exc:
                log.warning("blob_workers.failed", root=str(self._root), reason=f"could not start: {exc}")
                break
            worker = _Worker(proc)
            worker.reader = threading.Thread(target=_read_replies, args=(worker, self._replies), daemon=True,
                                             name=f"shadowpoint-blob-reader-{proc.pid}")
            worker.reader.start()
            self._workers.append(worker)
        if not self._workers:
            self._given_up = True
        log.debug("blob_workers.started", root=str(self._root), workers=len(self._workers),
                  queued=self._queued_files)

    def _pump(self, *, final: bool) -> list[Result]:
        """Send full batches (every waiting path if `final`), collecting answers on the way."""
        done: list[Result] = []
        while not self._replies.empty():
            done += self._next_reply()
        opts = self._options
        while self._waiting and (final or len(self._waiting) >= opts.batch_paths
                                 or self._waiting_bytes >= opts.batch_bytes):
            live = [w for w in self._workers if w.alive]
            if not live:
                done += self._give_back_waiting()
                break
            worker = min(live, key=lambda w: len(w.outstanding))
            if len(worker.outstanding) >= opts.batches_per_worker:
                done += self._next_reply()  # bounds the paths in flight
                continue
            batch: list[RepoPath] = []
            batch_bytes = 0
            while self._waiting and len(batch) < opts.batch_paths and batch_bytes < opts.batch_bytes:
                path, size = self._waiting.popleft()
                batch.append(path)
                batch_bytes += size
            self._waiting_bytes -= batch_bytes
            worker.send(batch)
        return done

    def _next_reply(self) -> list[Result]:
        worker, reply = self._replies.get()
        if not worker.alive:
            return []  # a failed worker's late answer: its paths were given back already
        if reply is None:
            return self._fail(worker)
        paths = worker.outstanding.popleft()
        if len(reply) != len(paths):
            worker.outstanding.appendleft(paths)
            worker.failure = f"answered {len(reply)} paths of {len(paths)}"
            return self._fail(worker)
        done: list[Result] = []
        for path, outcome in zip(paths, reply, strict=True):
            if isinstance(outcome, _RepoFailed):
                raise (StorageFailedError if outcome.storage else RepoError)(outcome.detail)
            self._pending.discard(path)
            done.append((path, outcome))
        self.answered += len(done)
        return done

    def _fail(self, worker: _Worker) -> list[Result]:
        """A worker died or misbehaved: reap it and give its paths back to the caller."""
        paths = [p for batch in worker.outstanding for p in batch]
        worker.outstanding.clear()
        code = worker.stop(terminate=True)
        log.warning("blob_workers.failed", root=str(self._root), pid=worker.proc.pid, returncode=code,
                    reason=worker.failure, given_back=len(paths))
        if not any(w.alive for w in self._workers):
            self._given_up = True
        self._pending.difference_update(paths)
        self.given_back += len(paths)
        return [(p, None) for p in paths]

    def _give_back_waiting(self) -> list[Result]:
        paths = [p for p, _ in self._waiting]
        self._waiting.clear()
        self._waiting_bytes = 0
        self._pending.difference_update(paths)
        if self._started:
            self.given_back += len(paths)
        return [(p, None) for p in paths]


# ---------------------------------------------------------------------- the wire format


def _read_exact(stream: IO[bytes], n: int) -> bytes | None:
    """`n` bytes, or None at a clean end of stream. Raises EOFError when cut in the middle."""
    parts: list[bytes] = []
    got = 0
    while got < n:
        chunk = stream.read(n - got)
        if not chunk:
            if got:
                raise EOFError(f"stream ended {n - got} bytes short")
            return None
        parts.append(chunk)
        got += len(chunk)
    return b"".join(parts)


def _read_frame(stream: IO[bytes]) -> bytes | None:
    header = _read_exact(stream, _LEN.size)
    if header is None:
        return None
    (size,) = _LEN.unpack(header)
    payload = _read_exact(stream, size) if size else b""
    if payload is None:
        raise EOFError("stream ended inside a frame")
    return payload


def _write_frame(stream: IO[bytes], payload: bytes) -> None:
    stream.write(_LEN.pack(len(payload)) + payload)
    stream.flush()


def _failure_record(kind: bytes, detail: str) -> bytes:
    text = detail.encode("utf-8", "surrogatepass")
    return kind + _LEN.pack(len(text)) + text


_FAILURE_KINDS = {_VANISHED: FailureKind.VANISHED, _UNREADABLE: FailureKind.UNREADABLE,
                  _TOO_LARGE: FailureKind.TOO_LARGE, _UNSTORABLE: FailureKind.UNSTORABLE}
_FAILURE_CODES = {kind: code for code, kind in _FAILURE_KINDS.items()}


def _parse_reply(payload: bytes) -> list[Outcome | _RepoFailed]:
    out: list[Outcome | _RepoFailed] = []
    pos = 0
    end = len(payload)
    while pos < end:
        kind = payload[pos:pos + 1]
        pos += 1
        if kind == _OK:
            if pos + _OID_BYTES + _STAT.size > end:
                raise ValueError("a record is cut short")
            oid = payload[pos:pos + _OID_BYTES].hex()
            pos += _OID_BYTES
            size, m_s, m_ns, c_s, c_ns, mode, ino = _STAT.unpack_from(payload, pos)
            pos += _STAT.size
            # FileState reads size, mtime_ns, ctime_ns, mode and inode; the rest is unknown here
            st = os.stat_result((mode, ino, 0, 0, 0, 0, size, m_s, m_s, c_s),
                                {"st_mtime_ns": m_s * 1_000_000_000 + m_ns, "st_ctime_ns": c_s * 1_000_000_000 + c_ns})
            out.append(HashedFile(oid, st))
            continue
        (length,) = _LEN.unpack_from(payload, pos)
        pos += _LEN.size
        if pos + length > end:
            raise ValueError("a record is cut short")
        detail = payload[pos:pos + length].decode("utf-8", "surrogatepass")
        pos += length
        if kind in (_REPO_FAILED, _STORAGE_FAILED):
            out.append(_RepoFailed(detail, storage=kind == _STORAGE_FAILED))
        elif kind in _FAILURE_KINDS:
            out.append(ReadFailure(_FAILURE_KINDS[kind], detail))
        else:
            raise ValueError(f"unknown record kind {kind!r}")
    return out


# ---------------------------------------------------------------------- the worker's side


def _hash_one(path: Path, max_bytes: int, write_blob: Callable[[bytes], bytes]) -> bytes:
    """One answer record: what the scanner's own read would have made of `path`."""
    try:
        outcome = snapshot_file(lambda: read_file(path, max_bytes), max_bytes, lambda data: write_blob(data).hex())
    except StorageFailedError as exc:
        return _failure_record(_STORAGE_FAILED, str(exc))
    except RepoError as exc:
        return _failure_record(_REPO_FAILED, str(exc))
    if isinstance(outcome, ReadFailure):
        return _failure_record(_FAILURE_CODES[outcome.kind], outcome.detail)
    st = outcome.stat
    m_s, m_ns = divmod(st.st_mtime_ns, 1_000_000_000)
    c_s, c_ns = divmod(st.st_ctime_ns, 1_000_000_000)
    return _OK + bytes.fromhex(outcome.oid) + _STAT.pack(st.st_size, m_s, m_ns, c_s, c_ns, st.st_mode, st.st_ino)


def serve(git_dir: Path, root: Path, max_bytes: int, parent_pid: int, inp: IO[bytes], out: IO[bytes]) -> int:
    """The worker loop: answer each batch of NUL-separated root-relative paths, until EOF.

    Raises:
        RepoError: the shadow repository cannot be opened.
    """
    write_blob = open_blob_writer(git_dir)
    out.write(_HELLO)
    out.flush()
    while True:
        payload = _read_frame(inp)
        if payload is None:
            return 0  # the scan is over, or its process died
        records: list[bytes] = []
        for raw in payload.split(b"\0"):
            if os.getppid() != parent_pid:
                return 0  # orphaned (the scanning process was killed): nobody wants the rest
            records.append(_hash_one(root / os.fsdecode(raw), max_bytes, write_blob))
        _write_frame(out, b"".join(records))


def _stop(signum: int, frame: FrameType | None) -> None:
    # Python runs this between bytecodes, so never inside a blob write (no torn temp file).
    raise SystemExit(0)


def main(argv: list[str] | None = None) -> int:
    """`python -m shadowpoint.stage.blob_workers GIT_DIR ROOT MAX_FILE_BYTES PARENT_PID`: one worker."""
    args = sys.argv[1:] if argv is None else argv
    git_dir, root, max_bytes, parent_pid = Path(args[0]), Path(args[1]), int(args[2]), int(args[3])
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C is for the scanning process
    signal.signal(signal.SIGTERM, _stop)
    # stdout carries the protocol only: anything printed goes to stderr
    out = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    try:
        return serve(git_dir, root, max_bytes, parent_pid, sys.stdin.buffer, out)
    except RepoError as exc:
        print(f"shadowpoint blob worker: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        return 0  # the scanning process is gone


if __name__ == "__main__":
    sys.exit(main())
