"""Writing the packs of a garbage collection fast: what a collection keeps, and pack files.

libgit2's PackBuilder re-reads, re-compresses and re-indexes every object it writes and
searches deltas for all of them: on a 30,000-file shadow repository it took twice the CPU of
`git gc --prune=now` (issue 13). Most objects of a shadow repository exist in one version
only (a baseline's files), and deltas only pay between versions of one path. So
`ShadowRepo.collect_garbage` packs:

- objects whose path has one version only (and commits) with `write_pack`, a plain pack
  writer: zlib on two threads, no delta search, the `.idx` written directly (git's pack v2
  format; libgit2 and git read it);
- objects whose path has several versions with libgit2's PackBuilder, given their names so
  that its delta search compares versions of the same file.

Packs that hold only reachable objects are kept as they are, so a collection interrupted
after installing some packs resumes from there. Runs on the caller's thread (plus the
compression threads it starts and joins).
"""

from __future__ import annotations

import hashlib
import itertools
import os
import struct
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, BinaryIO, TypeVar

import pygit2
from pygit2.ffi import C, ffi

from shadowpoint.errors import RepoError
from shadowpoint.store.loose import stored_zlib

MODE_TREE = 0o040000
MODE_GITLINK = 0o160000
_IDX_MAGIC = b"\xfftOc"
_BATCH = 256  # objects compressed per round trip to the threads

T = TypeVar("T")
Progress = Callable[[int, int], None]
"""(objects written so far, objects to write)."""


# Below this many objects a walk keeps the path of every one (a small collection writes them
# all with the delta search, ordered and named by path); past it, only those of `multi`.
NAME_ALL_BELOW = 5_000


@dataclass(slots=True)
class Reachable:
    """What the refs reach: every object's raw id (20 bytes), in the order the walk met them
    (folder by folder): commits and trees in `order`, blobs in `blobs`.

    `multi` holds trees and blobs whose path has several versions among the reachable
    commits (delta candidates); `names` their path, for the delta search's ordering (and
    every object's, in a walk that met fewer than NAME_ALL_BELOW).
    """

    objects: set[bytes] = field(default_factory=set)
    names: dict[bytes, str] = field(default_factory=dict)
    multi: set[bytes] = field(default_factory=set)
    order: list[bytes] = field(default_factory=list)
    blobs: list[bytes] = field(default_factory=list)
    naming_all: bool = True  # `names` holds every object's path (until NAME_ALL_BELOW were met)

    def hex_ids(self) -> HexIds:
        """`objects`, asked with hex ids."""
        return HexIds(self.objects)


class HexIds:
    """A set of raw ids asked with hex ones (what libgit2 and the object folders name)."""

    def __init__(self, raw: set[bytes]) -> None:
        self._raw = raw

    def __contains__(self, oid: object) -> bool:
        if not isinstance(oid, str) or len(oid) != 40:
            return False
        try:
            return bytes.fromhex(oid) in self._raw
        except ValueError:
            return False


def reachable(repo: pygit2.Repository, tips: Iterable[str]) -> Reachable:
    """Walk commits (parents included) and trees from `tips`, noting which objects share a path.

    Kept small: a collection's walk is a sidecar's peak memory (at 100k files it held a hex
    id and a hash of a path per object, 23 MiB; libgit2 cached every tree it read, ~10 MiB).
    Ids are held raw; trees are read raw from the object database (no cache) and parsed here;
    a path is held only while the walk is in its folder.

    The versions of a path are found beside the commit the walk came from: a commit's new
    trees are walked beside the same folders of its child (for another tip, of the first tree
    walked), and an entry whose id differs there is a second version of its path: both are
    delta candidates. Every version of a path in one line of history meets the next one so. A
    path deleted in a child and back in a later commit is missed: it costs only compression.
    """
    out = Reachable()
    seen = out.objects
    odb = repo.odb
    # (commit or tree id, the tree beside its own: its child's)
    stack: list[tuple[str, bytes | None]] = [(tip, None) for tip in tips]
    first: bytes | None = None
    while stack:
        oid, beside = stack.pop()
        raw = bytes.fromhex(oid)
        if raw in seen:
            continue
        obj: Any = repo[oid]
        if isinstance(obj, pygit2.Commit):
            seen.add(raw)
            out.order.append(raw)
            root = obj.tree_id.raw
            stack.extend((str(p), root) for p in obj.parent_ids)
        else:
            root = raw
        if beside is None and first != root:
            beside = first  # another tip: beside the first tree walked
        if first is None:
            first = root
        _walk_tree(out, odb, root, beside)
    return out


def _walk_tree(out: Reachable, odb: Any, root: bytes, beside: bytes | None) -> None:
    """Note every object of the tree `root` not seen yet; `beside`: the same folder in the
    commit the walk came from (`reachable`)."""
    seen = out.objects
    trees: list[tuple[bytes, str, bytes | None]] = [(root, "", beside)]
    while trees:
        tid, path, other = trees.pop()
        if tid in seen:
            continue
        seen.add(tid)
        out.order.append(tid)
        _named(out, tid, path)
        there: dict[str, tuple[int, bytes]] | None = None
        if other is not None:
            _versions(out, path, tid, other)
            there = {name: (mode, eid) for mode, name, eid in _tree_entries(odb.read(other.hex())[1])}
        prefix = f"{path}/" if path else ""
        for mode, name, eid in _tree_entries(odb.read(tid.hex())[1]):
            if mode == MODE_GITLINK or eid in seen:
                continue
            old = there.get(name) if there is not None else None
            if mode == MODE_TREE:
                trees.append((eid, prefix + name, old[1] if old is not None and old[0] == MODE_TREE else None))
                continue
            seen.add(eid)
            out.blobs.append(eid)
            if out.naming_all:  # the path is made only while the walk names every object
                _named(out, eid, prefix + name)
            # every id of a tree walked before is seen: `old` is another version
            if old is not None and old[0] not in (MODE_TREE, MODE_GITLINK):
                _versions(out, prefix + name, eid, old[1])


def _tree_entries(data: bytes) -> Iterator[tuple[int, str, bytes]]:
    """(mode, name, raw id) of each entry of a raw tree (`<octal mode> <name>\\0<20-byte id>`)."""
    pos, end = 0, len(data)
    while pos < end:
        space = data.index(b" ", pos)
        nul = data.index(b"\0", space)
        yield int(data[pos:space], 8), data[space + 1:nul].decode("utf-8", "surrogateescape"), data[nul + 1:nul + 21]
        pos = nul + 21


def _named(out: Reachable, oid: bytes, path: str) -> None:
    """Name `oid` while the walk names every object (until NAME_ALL_BELOW were met)."""
    if not out.naming_all:
        return
    if len(out.order) + len(out.blobs) >= NAME_ALL_BELOW:  # many: from now on, the delta candidates' alone
        out.names = {o: out.names[o] for o in out.multi if o in out.names}
        out.naming_all = False
        return
    out.names.setdefault(oid, path)


def _versions(out: Reachable, path: str, oid: bytes, other: bytes) -> None:
    """`oid` and `other` are two versions of `path`: delta candidates, named by it."""
    out.multi.add(oid)
    out.multi.add(other)
    out.names.setdefault(oid, path)
    out.names.setdefault(other, path)


# ---------------------------------------------------------------- existing packs


def pack_objects(idx: Path) -> list[str]:
    """The object ids a version-2 `.idx` file lists.

    Raises:
        RepoError: not a version-2 index.
    """
    return [raw.hex() for raw in pack_ids(idx)]


def pack_ids(idx: Path) -> list[bytes]:
    """`pack_objects`, raw (20 bytes each)."""
    data = idx.read_bytes()
    count = _listed_count(data, idx)
    raw = data[_IDX_HEAD : _IDX_HEAD + 20 * count]
    return [raw[i : i + 20] for i in range(0, len(raw), 20)]


def pack_holds(idx: Path, wanted: Iterable[bytes]) -> set[bytes]:
    """Which of `wanted` (raw ids) the version-2 index `idx` lists: a binary search of its
    sorted ids from the fan-out table, not a set of them all (a collection asked about a few
    objects of two 50k-object packs that way took 13 MiB, its sidecar's peak memory).

    Raises:
        RepoError: not a version-2 index.
    """
    data = idx.read_bytes()
    _listed_count(data, idx)
    found = set()
    for raw in wanted:
        lo = struct.unpack_from(">I", data, 8 + 4 * (raw[0] - 1))[0] if raw[0] else 0
        hi = struct.unpack_from(">I", data, 8 + 4 * raw[0])[0]
        while lo < hi:
            mid = (lo + hi) // 2
            here = data[_IDX_HEAD + 20 * mid:_IDX_HEAD + 20 * mid + 20]
            if here == raw:
                found.add(raw)
                break
            if here < raw:
                lo = mid + 1
            else:
                hi = mid
    return found


def pack_object_count(idx: Path) -> int:
    """How many objects a version-2 `.idx` lists, from its header alone; -1 when it cannot be
    read or is not one."""
    try:
        with open(idx, "rb") as fh:
            return _listed_count(fh.read(_IDX_HEAD), idx)
    except (OSError, RepoError):
        return -1


_IDX_HEAD = 8 + 256 * 4  # magic, version, fan-out: the ids follow


def _listed_count(head: bytes, idx: Path) -> int:
    """The object count of an index starting with `head` (its last fan-out entry).

    Raises:
        RepoError: not a version-2 index.
    """
    if len(head) < _IDX_HEAD or head[:4] != _IDX_MAGIC or struct.unpack_from(">I", head, 4)[0] != 2:
        raise RepoError(f"{idx} is not a version-2 pack index.")
    count: int = struct.unpack_from(">I", head, _IDX_HEAD - 4)[0]
    return count


# ---------------------------------------------------------------- writing packs


def _object_header(kind: int, size: int) -> bytes:
    if size < 0x800:  # two bytes at most (most trees)
        return bytes(((kind << 4) | size,)) if size < 0x10 else bytes(
            ((kind << 4) | (size & 0x0F) | 0x80, size >> 4))
    out = bytearray()
    byte = (kind << 4) | (size & 0x0F)
    size >>= 4
    while size:
        out.append(byte | 0x80)
        byte = size & 0x7F
        size >>= 7
    out.append(byte)
    return bytes(out)


def _stored_object(kind: int, data: bytes) -> bytes:
    """One object as a pack holds it, its content stored without deflating (`PackStream`)."""
    return _object_header(kind, len(data)) + stored_zlib(data)


def _compressed(items: Sequence[tuple[bytes, int, bytes]], level: int = 6) -> list[tuple[bytes, bytes]]:
    """Each of `items` (raw id, kind, content) as a pack holds it, deflated: (raw id, object)."""
    return [(raw, _object_header(kind, len(data)) + zlib.compress(data, level)) for raw, kind, data in items]


def write_pack(repo: pygit2.Repository, oids: Sequence[str | bytes], folder: Path,
               progress: Progress | None = None, done: int = 0, total: int = 0, level: int = 6,
               pause: Callable[[], None] | None = None) -> Path:
    """Write `oids` (all readable from `repo`; hex, or raw as a collection's walk holds them)
    as one pack without deltas into `folder`.

    The `.pack` is written first, then its `.idx`; both under temporary names, renamed to
    `pack-<checksum>.*` when complete. Returns the `.idx` path. `pause`: called before each
    batch of objects is read (a background copy yields to the agent's rounds there).

    Raises:
        RepoError: an object cannot be read.
    """
    odb = repo.odb

    def read(batch: Sequence[str | bytes]) -> list[tuple[bytes, int, bytes]]:
        if pause is not None:
            pause()
        items = []
        for oid in batch:
            hex_id = oid if isinstance(oid, str) else oid.hex()
            try:
                kind, data = odb.read(hex_id)
            # not `shadow_repo.translated` (that module imports this one): one context manager
            # per object of a collection costs ~1 µs each, and this message names the object
            except (KeyError, pygit2.GitError, ValueError) as exc:
                raise RepoError(f"Object {hex_id} cannot be read: {exc}") from exc
            items.append((bytes.fromhex(oid) if isinstance(oid, str) else oid, int(kind), bytes(data)))
        return items

    return _write_pack_items(len(oids), (read(batch) for batch in _batches(oids, _BATCH)), folder, progress,
                             done, total, level)


def _write_pack_items(count: int, batches: Iterable[list[tuple[bytes, int, bytes]]], folder: Path,
                      progress: Progress | None = None, done: int = 0, total: int = 0, level: int = 6) -> Path:
    compress = partial(_compressed, level=level)
    tmp_pack = folder / "tmp_pack_sp"
    entries: list[bytes] = []  # `_index_record`s
    digest = hashlib.sha1()  # git's pack checksum
    with open(tmp_pack, "wb") as fh, ThreadPoolExecutor(2, thread_name_prefix="shadowpoint-pack") as pool:
        head = b"PACK" + struct.pack(">II", 2, count)
        fh.write(head)
        digest.update(head)
        offset = len(head)
        batch_iter = iter(batches)
        while (items := next(batch_iter, None)) is not None:
            done += len(items)
            # a half of the batch for each thread (zlib lets go of the GIL while it deflates),
            # not a future per object: those set off 860 young and 78 middle collections in a
            # 60k-object pack, and in an engine of a 100k-file root after 200 rounds 11 full
            # ones of ~23 ms, each holding the GIL against the agent's rounds (none now)
            half = (len(items) + 1) // 2
            compressed = itertools.chain.from_iterable(pool.map(compress, (items[:half], items[half:])))
            del items  # each object's content goes once compressed, not after the next batch is read
            for raw, blob in compressed:
                fh.write(blob)
                digest.update(blob)
                entries.append(_index_record(raw, blob, offset))
                offset += len(blob)
            if progress is not None:
                progress(done, total or count)
        if len(entries) != count:
            raise RepoError(f"A pack of {count} objects got {len(entries)}.")
        checksum = digest.digest()
        fh.write(checksum)
        fh.flush()
        os.fsync(fh.fileno())
    return _name_pack(folder, tmp_pack, entries, checksum)


def _name_pack(folder: Path, tmp_pack: Path, entries: list[bytes], checksum: bytes) -> Path:
    """Give a written pack its name and write its index; the index's path."""
    name = f"pack-{checksum.hex()}"
    os.chmod(tmp_pack, 0o444)  # as git and libgit2 leave packs
    os.replace(tmp_pack, folder / f"{name}.pack")
    idx = folder / f"{name}.idx"
    _write_index(folder / "tmp_idx_sp", entries, checksum)
    os.chmod(folder / "tmp_idx_sp", 0o444)
    os.replace(folder / "tmp_idx_sp", idx)
    return idx


_NO_ID = bytes(20)


class OidSet:
    """An exact set of raw object ids (20 bytes) in one flat buffer: open addressing, linear
    probing, at most 3/4 full, so ~27-53 bytes per id where a `set` of `bytes` took ~90 (the
    19 MiB a 1M-file baseline's 171k trees cost at its peak memory). An all-zero slot is empty.

    The first `small` ids are held in a `set` instead (~0.2 us an id against ~1 us here: a
    split baseline's writers add ~8k trees each at 100k files), then moved to the buffer.
    """

    def __init__(self, capacity: int = 1024, small: int = 0) -> None:
        self._slots = bytearray(20 * capacity)
        self._mask = capacity - 1  # capacity: a power of two
        self._count = 0
        self._has_zero = False  # the all-zero id, which marks empty slots
        self._small: set[bytes] | None = set() if small > 0 else None
        self._small_max = small

    def __len__(self) -> int:
        return self._count + self._has_zero + (len(self._small) if self._small is not None else 0)

    def add(self, raw: bytes) -> bool:
        """Add `raw`; False if it was in the set already."""
        small = self._small
        if small is not None:
            if raw in small:
                return False
            small.add(raw)
            if len(small) > self._small_max:
                self._small = None
                for held in small:
                    self._add(held)
            return True
        return self._add(raw)

    def _add(self, raw: bytes) -> bool:
        if raw == _NO_ID:
            added, self._has_zero = not self._has_zero, True
            return added
        slots = self._slots
        i = int.from_bytes(raw[:4], "little") & self._mask  # ids are hashes: any 4 bytes spread
        while True:
            at = 20 * i
            slot = slots[at:at + 20]
            if slot == raw:
                return False
            if slot == _NO_ID:
                break
            i = (i + 1) & self._mask
        slots[at:at + 20] = raw
        self._count += 1
        if 4 * self._count > 3 * (self._mask + 1):
            self._grow()
        return True

    def _grow(self) -> None:
        old = self._slots
        self._slots = bytearray(2 * len(old))
        self._mask = 2 * self._mask + 1
        self._count = 0
        for at in range(0, len(old), 20):
            raw = bytes(old[at:at + 20])
            if raw != _NO_ID:
                self._add(raw)


class PackStream:
    """A pack written object by object, for objects made one at a time (a baseline's trees).

    Each object is compressed and written as it comes, so that only its index entry stays in
    memory (holding a million-file baseline's 171k trees until the end took ~120 MiB); the
    object count goes into the header at the end and the checksum is read back from disk.
    Objects added twice are written once.

    Objects are stored in zlib streams without deflating them (`loose.stored_zlib`):
    a tree is mostly raw 20-byte ids, which deflate does not shrink, and deflating each of a
    100k-file baseline's ~17k small trees cost ~20 us apiece, 0.35 s of the baseline, for
    ~30% less tree data (3.2 MB against 4.6 MB). A garbage collection that rewrites the pack
    compresses them.
    """

    def __init__(self, folder: Path) -> None:
        self._folder = folder
        self._tmp = folder / "tmp_pack_sp"
        self._fh: BinaryIO | None = open(self._tmp, "w+b")  # closed by finish or close
        self._fh.write(b"PACK" + struct.pack(">II", 2, 0))
        self._offset = 12
        self._entries: list[bytes] = []  # `_index_record`s
        # a 100k-file baseline's 17k trees without growing it (~5 rehashes); a split baseline's
        # writer's ~8k in a `set`
        self._seen = OidSet(1 << 15, small=1 << 14)

    def add(self, raw_oid: bytes, kind: int, data: bytes) -> None:
        assert self._fh is not None, "the pack is finished"
        if not self._seen.add(raw_oid):
            return
        blob = _stored_object(kind, data)
        self._fh.write(blob)
        self._entries.append(_index_record(raw_oid, blob, self._offset))
        self._offset += len(blob)

    def finish(self) -> Path:
        """Complete the pack and write its index; the index's path."""
        fh = self._fh
        assert fh is not None, "the pack is finished"
        fh.seek(8)
        fh.write(struct.pack(">I", len(self._entries)))
        fh.seek(0)
        digest = hashlib.sha1()  # git's pack checksum, over the header as it is now
        while chunk := fh.read(1 << 20):
            digest.update(chunk)
        checksum = digest.digest()
        fh.seek(0, os.SEEK_END)
        fh.write(checksum)
        fh.flush()
        os.fsync(fh.fileno())
        fh.close()
        self._fh = None
        return _name_pack(self._folder, self._tmp, self._entries, checksum)

    def close(self) -> None:
        """Let go of an unfinished pack's file (the caller removes its folder)."""
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    def __enter__(self) -> PackStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _batches(items: Sequence[T], size: int) -> Iterator[Sequence[T]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


# One object's line of a pack index, as one small bytes: raw id, crc32 (big-endian, as the
# index stores it) and offset; sorted as bytes, the records are in the index's order (by id).
# A tuple of three objects per pack object took ~200 bytes (34 MiB of a 1M-file baseline's trees).
_RECORD = struct.Struct(">20sIQ")


def _index_record(raw_oid: bytes, blob: bytes, offset: int) -> bytes:
    return _RECORD.pack(raw_oid, zlib.crc32(blob), offset)


def small_pack(objects: Iterable[tuple[bytes, int, bytes]]) -> tuple[str, bytes, bytes]:
    """A pack of `objects` (raw id, kind, content; no id twice) made in memory, for the few
    trees, the commit and the blobs of one round: its name (`pack-<checksum>`), the `.pack`'s
    bytes and the `.idx`'s. Stored, not deflated (`PackStream` says why; deflating a round's
    7 KB source file took ~70 us of a ~1.3 ms round): the background's merge of the small
    packs (`ShadowRepo.merge_small_packs`), or a collection, compresses them."""
    entries: list[bytes] = []
    parts = [b""]
    offset = 12
    for raw, kind, data in objects:
        blob = _stored_object(kind, data)
        entries.append(_index_record(raw, blob, offset))
        parts.append(blob)
        offset += len(blob)
    parts[0] = b"PACK" + struct.pack(">II", 2, len(entries))
    pack = b"".join(parts)
    checksum = hashlib.sha1(pack).digest()
    return f"pack-{checksum.hex()}", pack + checksum, _index_bytes(entries, checksum)


def _write_index(path: Path, entries: list[bytes], pack_checksum: bytes) -> None:
    """Write `_index_bytes` piece by piece (no copy of the whole index: a collection's peak
    memory is at this moment)."""
    digest = hashlib.sha1()
    with open(path, "wb") as fh:
        for part in _index_parts(entries, pack_checksum):
            fh.write(part)
            digest.update(part)
        fh.write(digest.digest())  # git's index checksum
        fh.flush()
        os.fsync(fh.fileno())


def _index_bytes(entries: list[bytes], pack_checksum: bytes) -> bytes:
    """A version-2 pack index of `entries` (`_index_record`s; sorted here), its checksum included."""
    body = b"".join(_index_parts(entries, pack_checksum))
    return body + hashlib.sha1(body).digest()  # git's index checksum


def _index_parts(entries: list[bytes], pack_checksum: bytes) -> list[bytes | bytearray]:
    """The pieces of a version-2 pack index of `entries` (sorted here), but its checksum."""
    entries.sort()
    fanout = [0] * 256
    ids = bytearray()
    crcs = bytearray()
    small = bytearray()
    big: list[int] = []
    # column by column, record by record: no list of pieces per column (at 171k objects each
    # was ~10 MiB at the moment of a baseline's peak memory)
    for record in entries:
        fanout[record[0]] += 1
        ids += record[:20]
        crcs += record[20:24]
        off = int.from_bytes(record[24:], "big")
        if off < 0x80000000:
            small += off.to_bytes(4, "big")
        else:
            small += (0x80000000 | len(big)).to_bytes(4, "big")
            big.append(off)
    return [_IDX_MAGIC, struct.pack(">I", 2), struct.pack(">256I", *itertools.accumulate(fanout)), ids, crcs, small,
            b"".join(struct.pack(">Q", o) for o in big), pack_checksum]


def write_delta_pack(repo: pygit2.Repository, oids: Iterable[bytes], names: dict[bytes, str], folder: Path) -> None:
    """Write `oids` (raw) with libgit2's PackBuilder and its delta search, each named by its
    path (PackBuilder orders delta candidates by name; pygit2's `add` passes none)."""
    pb = pygit2.PackBuilder(repo)
    pb.set_threads(0)
    raw = ffi.new("git_oid *")
    for oid in oids:
        ffi.buffer(raw)[:] = oid
        name = names.get(oid)
        err = C.git_packbuilder_insert(pb._packbuilder, raw, ffi.new("char[]", name.encode("utf-8", "surrogateescape"))
                                       if name else ffi.NULL)
        if err < 0:
            raise RepoError(f"Object {oid.hex()} cannot be packed (libgit2 error {err}).")
    pb.write(str(folder))
