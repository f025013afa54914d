"""WorkspaceWatcher with real watchdog observers on real temporary trees.

Every test runs on both observers (the `observer` fixture): shadowpoint's inotify observer and
watchdog's stock one, what macOS and Windows get. The portable one has no flush barrier: its rounds
are never healthy, and a test waits until the changes it made are recorded (late events of earlier
changes may still follow, so it checks those paths are there, not that nothing else is). A test of
an inotify-only feature says why on its `inotify_only` line.
"""

from __future__ import annotations

import errno
import os
import posixpath
import shutil
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog
from structlog.testing import capture_logs

from shadowpoint.observe import inotify as watcher_inotify
from shadowpoint.observe.journal import JournalSnapshot, PathJournal
from shadowpoint.observe.watcher import UNPROVEN_ROUND, ObserverKind, WorkspaceWatcher
from shadowpoint.workspace import RepoPath
from tests.conftest import wait_for

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="inotify specifics")
inotify_only = pytest.mark.parametrize("observer", ["inotify"])

WAIT_S = 20.0  # generous: only ever waited on, never asserted as a duration

MakeWatcher = Callable[..., WorkspaceWatcher]


# --------------------------------------------------------------------------------------- fixtures


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    root.mkdir()
    return Path(os.path.realpath(root))


def build(root: Path, tree: dict[str, str]) -> Path:
    """Create `tree` ({"a/b.txt": "content", "empty/": ""}) under `root`."""
    for rel, content in tree.items():
        path = root / rel
        if rel.endswith("/"):
            path.mkdir(parents=True, exist_ok=True)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(content)
    return root


def marker_files_only(watcher: WorkspaceWatcher, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every flush of `watcher` writes a marker file, as when the reader is busy: the barrier
    without a file (`ShadowObserver.barrier`) is not tried (its own tests say when it is)."""
    monkeypatch.setattr(watcher._observer, "barrier", lambda marker, timeout_s: None)


@pytest.fixture
def watchers(observer: ObserverKind) -> Iterator[MakeWatcher]:
    """Make watchers; all are stopped at teardown, which must leave no watcher thread behind."""
    made: list[WorkspaceWatcher] = []

    def make(root: Path, **kwargs: Any) -> WorkspaceWatcher:
        watcher = WorkspaceWatcher(root, observer_kind=observer, **kwargs)
        made.append(watcher)
        return watcher

    yield make
    for watcher in made:
        watcher.stop()
    assert watcher_threads() == []


@pytest.fixture
def started(ws: Path, watchers: MakeWatcher) -> Callable[..., WorkspaceWatcher]:
    def start(tree: dict[str, str] | None = None, **kwargs: Any) -> WorkspaceWatcher:
        build(ws, tree or {})
        watcher = watchers(ws, **kwargs)
        watcher.start()
        assert watcher.is_healthy
        return watcher

    return start


def watcher_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("shadowpoint-watcher")]


def only_emitter(watcher: WorkspaceWatcher) -> Any:
    """The inotify observer's one emitter (its internals are watchdog's and ours, untyped here)."""
    observer = watcher._observer
    assert observer is not None, "the watcher is not started"
    (emitter,) = observer.emitters
    return emitter


def thread_named(name: str) -> Any:
    return next(t for t in threading.enumerate() if t.name == name)


def next_round(watcher: WorkspaceWatcher, *expected: str) -> JournalSnapshot:
    """End a round once the changes made so far are recorded: the flush barrier proves it; the
    portable observer cannot (its flush fails), so wait until the `expected` paths are recorded."""
    if watcher.has_flush_barrier:
        assert watcher.flush(WAIT_S)
    else:
        assert not watcher.flush(WAIT_S)
        wait_until(lambda: set(expected) <= watcher.journal.current_paths())
    return watcher.swap()


def check(watcher: WorkspaceWatcher, snapshot: JournalSnapshot, paths: set[str]) -> None:
    """A round recorded exactly `paths`, healthy; with the portable observer at least `paths`
    (late events of earlier changes may follow) and never healthy, saying why."""
    if watcher.has_flush_barrier:
        assert snapshot == JournalSnapshot(frozenset(RepoPath(p) for p in paths), healthy=True, reasons=())
    else:
        assert paths <= snapshot.paths
        assert not snapshot.healthy and UNPROVEN_ROUND in snapshot.reasons


def wait_until(predicate: Callable[[], bool]) -> None:
    wait_for(predicate, "condition not reached", WAIT_S)


def watched_inodes() -> set[int]:
    """Inodes of every inotify watch this process holds, read from the kernel (/proc)."""
    inodes: set[int] = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}") != "anon_inode:inotify":
                continue
            text = Path(f"/proc/self/fdinfo/{fd}").read_text()
        except OSError:
            continue
        for line in text.splitlines():
            if line.startswith("inotify wd:"):
                fields = dict(part.split(":", 1) for part in line.split()[1:])
                inodes.add(int(fields["ino"], 16))
    return inodes


def inode(path: Path) -> int:
    return os.stat(path).st_ino


# ------------------------------------------------------------------------------- files and folders


def test_create_modify_delete_of_files_are_recorded(ws: Path, started: Callable[..., WorkspaceWatcher]) -> None:
    watcher = started({"src/a.py": "1", "src/b.py": "2"})

    (ws / "src/new.py").write_text("new")
    created = next_round(watcher, "src/new.py")
    (ws / "src/a.py").write_text("changed")
    modified = next_round(watcher, "src/a.py")
    (ws / "src/b.py").unlink()
    deleted = next_round(watcher, "src/b.py")
    idle = next_round(watcher)

    check(watcher, created, {"src/new.py"})
    check(watcher, modified, {"src/a.py"})
    check(watcher, deleted, {"src/b.py"})
    check(watcher, idle, set())


def test_rename_records_source_and_destination(ws: Path, started: Callable[..., WorkspaceWatcher]) -> None:
    watcher = started({"src/a.py": "1", "docs/": ""})

    os.rename(ws / "src/a.py", ws / "docs/a.md")

    check(watcher, next_round(watcher, "src/a.py", "docs/a.md"), {"src/a.py", "docs/a.md"})


def test_mode_change_is_recorded(ws: Path, started: Callable[..., WorkspaceWatcher]) -> None:
    watcher = started({"run.sh": "echo"})

    os.chmod(ws / "run.sh", 0o755)

    check(watcher, next_round(watcher, "run.sh"), {"run.sh"})


def test_new_directory_is_recorded_as_the_directory(ws: Path, started: Callable[..., WorkspaceWatcher]) -> None:
    watcher = started()

    (ws / "pkg/deep/er").mkdir(parents=True)
    (ws / "pkg/deep/er/mod.py").write_text("x")
    paths = next_round(watcher, "pkg").paths
    (ws / "pkg/deep/er/later.py").write_text("y")

    assert "pkg" in paths
    check(watcher, next_round(watcher, "pkg/deep/er/later.py"), {"pkg/deep/er/later.py"})  # new folders are watched


def test_directory_move_records_both_paths_and_keeps_watching_the_contents(
    ws: Path, started: Callable[..., WorkspaceWatcher]
) -> None:
    watcher = started({"pkg/a.py": "1", "pkg/sub/b.py": "2"})

    os.rename(ws / "pkg", ws / "lib")
    moved = next_round(watcher, "pkg", "lib")
    (ws / "lib/sub/c.py").write_text("3")

    check(watcher, moved, {"pkg", "lib"})  # the folder paths cover their contents
    check(watcher, next_round(watcher, "lib/sub/c.py"), {"lib/sub/c.py"})


def test_directory_delete_records_the_directory(ws: Path, started: Callable[..., WorkspaceWatcher]) -> None:
    watcher = started({"pkg/a.py": "1", "pkg/sub/b.py": "2", "keep.txt": "k"})

    shutil.rmtree(ws / "pkg")
    paths = next_round(watcher, "pkg").paths

    assert "pkg" in paths
    assert paths <= {"pkg", "pkg/a.py", "pkg/sub", "pkg/sub/b.py"}


def test_directory_moved_out_of_the_workspace_counts_as_deleted(
    ws: Path, tmp_path: Path, started: Callable[..., WorkspaceWatcher]
) -> None:
    watcher = started({"pkg/a.py": "1"})

    os.rename(ws / "pkg", tmp_path / "elsewhere")

    # The unpaired IN_MOVED_FROM is held back for pairing; the barrier still waits for it.
    check(watcher, next_round(watcher, "pkg"), {"pkg"})


@inotify_only
def test_a_folder_moved_into_a_new_folder_keeps_its_watches_under_the_new_path(
    ws: Path, started: Callable[..., WorkspaceWatcher]
) -> None:
    """`mkdir n && mv d n/m`, faster than `n`'s watch: the move's halves do not pair, so `d`
    is forgotten as moved out of the tree, after the pairing delay; by then the walk of `n`
    may have taken `d`'s watches (the same inodes) under `n/m`. Forgetting `d` then removed
    them, and nothing below `n/m` was recorded again (the model's soak found it, in about
    half of its runs). The order is set here by hand: the stale names, then the forgetting."""
    watcher = started({"d/e/a.txt": "1"})
    os.mkdir(ws / "n")
    os.rename(ws / "d", ws / "n/m")
    next_round(watcher)
    group = only_emitter(watcher).group
    root = os.fsencode(ws)
    with group._lock:
        by_path = group._active_callbacks_by_path
        kept = {new: by_path[root + new] for new in (b"/n/m", b"/n/m/e")}
        by_path[root + b"/d"], by_path[root + b"/d/e"] = kept[b"/n/m"], kept[b"/n/m/e"]
    group.forget_tree(root + b"/d")
    assert {new: group._active_callbacks_by_path.get(root + new) for new in kept} == kept
    assert root + b"/d" not in group._active_callbacks_by_path
    (ws / "n/m/e/b.txt").write_text("2")
    check(watcher, next_round(watcher, "n/m/e/b.txt"), {"n/m/e/b.txt"})


def test_paths_inside_git_folders_are_ignored(ws: Path, started: Callable[..., WorkspaceWatcher]) -> None:
    watcher = started({".git/HEAD": "ref", "vendor/lib/.GIT/config": "x", "src/a.py": "1"})

    (ws / ".git/index").write_text("i")
    (ws / ".git/objects/ab").mkdir(parents=True)
    (ws / ".git/objects/ab/cdef").write_text("o")
    (ws / "vendor/lib/.GIT/config").write_text("y")
    (ws / "sub/.Git").mkdir(parents=True)
    (ws / "sub/.Git/HEAD").write_text("z")
    (ws / "control.txt").write_text("c")
    snapshot = next_round(watcher, "control.txt", "sub")

    check(watcher, snapshot, {"control.txt", "sub"})
    assert not [p for p in snapshot.paths if ".git" in p.lower().split("/")]


@linux_only
@inotify_only  # watch placement: the stock observer watches every folder
def test_git_folders_get_no_watch(ws: Path, started: Callable[..., WorkspaceWatcher]) -> None:
    started({".git/objects/ab/x": "o", "src/a.py": "1"})

    watched = watched_inodes()

    assert inode(ws / "src") in watched
    assert not {inode(ws / ".git"), inode(ws / ".git/objects"), inode(ws / ".git/objects/ab")} & watched


# ------------------------------------------------------------------------------------ the barrier


@inotify_only  # the flush barrier: the portable observer has none (next test)
def test_a_write_before_flush_is_in_that_round_and_never_the_next(
    ws: Path, started: Callable[..., WorkspaceWatcher]
) -> None:
    watcher = started({"src/": ""})
    previous: set[str] = set()

    for i in range(50):
        name = f"src/f{i}.txt"
        if i % 2:  # an editor's atomic save: write a temporary file, rename it over the target
            (ws / f"src/.f{i}.tmp").write_text(str(i))
            os.replace(ws / f"src/.f{i}.tmp", ws / name)
        else:
            (ws / name).write_text(str(i))
        assert watcher.flush(WAIT_S)
        snapshot = watcher.swap()

        assert name in snapshot.paths
        assert snapshot.healthy
        assert not previous & snapshot.paths
        previous = set(snapshot.paths)


@inotify_only
def test_flush_markers_are_files_made_ahead_and_renamed(
    ws: Path, started: Callable[..., WorkspaceWatcher], monkeypatch: pytest.MonkeyPatch
) -> None:
    watcher = started({"src/": ""})
    marker_files_only(watcher, monkeypatch)
    pool = watcher._marker_pool
    assert pool is not None
    for i in range(pool.size + 3):  # a marker is made afresh when no file is ready
        if i % 3 == 0:
            pool.fill()
        ahead = pool._ready[0] if pool.ready else None
        (ws / f"src/f{i}.txt").write_text(str(i))
        assert watcher.flush(WAIT_S)
        snapshot = watcher.swap()
        assert snapshot.healthy and snapshot.paths == {f"src/f{i}.txt"}  # the pool's files are not the workspace's
        if ahead is not None:
            assert not os.path.exists(ahead)
    assert watcher._marker_dir is not None
    assert not [n for n in os.listdir(watcher._marker_dir) if n.startswith("flush-")]  # every marker went


@inotify_only
def test_a_flush_makes_one_event_and_none_after_it(
    ws: Path, started: Callable[..., WorkspaceWatcher], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only the marker's appearance reaches the emitter: the marker's removal after its flush and
    the files made ahead of it (refilled after each flush) make no event that would take the
    interpreter from the flush's caller while it goes on."""
    watcher = started({"src/": ""})
    marker_files_only(watcher, monkeypatch)
    pool, marker_dir = watcher._marker_pool, watcher._marker_dir
    assert pool is not None and marker_dir is not None
    seen: list[str] = []
    plain = watcher._handler.dispatch

    def noting(event: Any) -> None:
        for path in (event.src_path, getattr(event, "dest_path", "")):
            if os.fsdecode(path).startswith(marker_dir):
                seen.append(os.fsdecode(path))
        plain(event)

    watcher._handler.dispatch = noting  # type: ignore[method-assign]
    flushes = pool.size + 2  # the pool runs dry and refills (a marker made afresh too)
    for i in range(flushes):
        if i == 3:
            pool.fill()
        assert watcher.flush(WAIT_S)
    assert watcher.flush(WAIT_S)  # the barrier: whatever earlier flushes caused is in by now
    markers = [p for p in seen if os.path.basename(p).startswith("flush-")]
    assert seen == markers and len(markers) == flushes + 1, seen


@inotify_only
def test_events_are_recorded_on_the_emitter_thread_not_through_the_observers_queue(
    ws: Path, started: Callable[..., WorkspaceWatcher]
) -> None:
    # One thread wake-up less per event and per flush barrier: recording and the barrier must
    # not wait for the observer's dispatcher, held here by its lock (what it takes to dispatch).
    watcher = started({"src/": ""})
    observer = thread_named("shadowpoint-watcher:ws")
    recorded_on: list[str] = []
    handler = watcher._handler
    plain = handler.dispatch

    def noting(event: Any) -> None:
        marker = handler.marker_prefix
        if not (marker and os.fsdecode(event.src_path).startswith(marker)):  # the marker may pass on another
            recorded_on.append(threading.current_thread().name)
        plain(event)

    handler.dispatch = noting  # type: ignore[method-assign]
    with observer._lock:
        (ws / "src/a.txt").write_text("a")
        assert watcher.flush(WAIT_S)
        snapshot = watcher.swap()
    assert snapshot.healthy and "src/a.txt" in snapshot.paths
    assert recorded_on and set(recorded_on) == {"shadowpoint-watcher-emitter:ws"}, recorded_on


def _noting_dispatch(watcher: WorkspaceWatcher, hold_on: str, entered: threading.Event,
                     release: threading.Event) -> list[tuple[str, str]]:
    """Record (thread, "marker" or path) of every event the handler gets, holding the thread that
    handles `hold_on`'s event until `release` is set."""
    handler = watcher._handler
    plain = handler.dispatch
    seen: list[tuple[str, str]] = []

    def noting(event: Any) -> None:
        path = os.fsdecode(event.src_path)
        what = "marker" if handler.marker_prefix and path.startswith(handler.marker_prefix) else path
        if what.endswith(hold_on):
            entered.set()
            assert release.wait(WAIT_S)
        plain(event)
        seen.append((threading.current_thread().name, what))

    handler.dispatch = noting  # type: ignore[method-assign]
    return seen


def _flushing(watcher: WorkspaceWatcher) -> tuple[threading.Thread, list[bool]]:
    passed: list[bool] = []
    flusher = threading.Thread(target=lambda: passed.append(watcher.flush(WAIT_S)))
    flusher.start()
    return flusher, passed


@pytest.mark.parametrize("observer", ["inotify"])
def test_a_marker_with_nothing_ahead_passes_on_the_inotify_thread_and_waits_behind_an_event(
    ws: Path, started: Callable[..., WorkspaceWatcher], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The barrier's marker is reported by the inotify thread itself when no event is queued or
    being handled (one thread hop less); behind an event the emitter is still handling, it
    waits its turn: the barrier never passes before an earlier event is recorded."""
    watcher = started({"src/": ""})
    marker_files_only(watcher, monkeypatch)
    entered, release = threading.Event(), threading.Event()
    seen = _noting_dispatch(watcher, "slow.txt", entered, release)
    assert watcher.flush(WAIT_S)
    assert seen[-1] == ("shadowpoint-watcher-inotify:ws", "marker"), seen

    (ws / "src/slow.txt").write_text("s")
    assert entered.wait(WAIT_S)  # the emitter is in the middle of handling it
    flusher, passed = _flushing(watcher)
    emitter = only_emitter(watcher)
    queue = emitter.group._move_event_grouper._queue
    marker_dir = os.fsencode(os.path.dirname(watcher._handler.marker_prefix or "/"))
    wait_for(lambda: any(getattr(item[0], "path", b"").startswith(marker_dir) for item in list(queue._queue)),
             "the marker was never queued behind the event")
    assert not passed and [what for _, what in seen].count("marker") == 1, "the barrier passed an event still handled"
    release.set()
    flusher.join(WAIT_S)
    assert passed == [True]
    assert [what for _, what in seen[-2:]] == [str(ws / "src/slow.txt"), "marker"], seen
    assert seen[-1][0] == "shadowpoint-watcher-emitter:ws"


def _handed_over(watcher: WorkspaceWatcher) -> bool:
    """Every event the kernel queued is read and handed to the emitter's queue."""
    observer = watcher._observer
    assert isinstance(observer, watcher_inotify.ShadowObserver)
    fd = observer._inotify_fd
    assert isinstance(fd, watcher_inotify._HoldingInotifyFD)
    with fd.batch_lock:
        return fd.all_handed_over()


def _marker_files(watcher: WorkspaceWatcher) -> list[str]:
    assert watcher._marker_dir is not None
    return [n for n in os.listdir(watcher._marker_dir) if n.startswith("flush-")]


@inotify_only
def test_a_barrier_with_every_event_read_passes_without_a_marker_or_waits_behind_one_being_recorded(
    ws: Path, started: Callable[..., WorkspaceWatcher]
) -> None:
    """Every event the kernel queued is read and handled: the barrier passes at once, with no
    marker file and no thread hop. Events the emitter has still to record: the barrier goes in
    its queue behind them, with no file either, and passes only when they are recorded."""
    watcher = started({"src/": ""})
    assert watcher._marker_pool is not None
    made_ahead = watcher._marker_pool.ready
    entered, release = threading.Event(), threading.Event()
    seen = _noting_dispatch(watcher, "slow.txt", entered, release)
    assert watcher.flush(WAIT_S)
    assert seen == [] and watcher._marker_pool.ready == made_ahead  # no marker made or reported

    (ws / "src/slow.txt").write_text("s")
    assert entered.wait(WAIT_S)  # the emitter is in the middle of handling it
    wait_for(lambda: _handed_over(watcher), "the reader never handed the file's other events over")
    flusher, passed = _flushing(watcher)
    emitter = only_emitter(watcher)
    queue = emitter.group._move_event_grouper._queue
    wait_for(lambda: any(isinstance(item[0], watcher_inotify._Barrier) for item in list(queue._queue)),
             "the barrier was never queued behind the event")
    assert not passed and not seen, "the barrier passed an event still being recorded"
    release.set()
    flusher.join(WAIT_S)
    assert passed == [True]
    assert seen[-1] == ("shadowpoint-watcher-emitter:ws", "marker"), seen
    assert set(seen[:-1]) == {("shadowpoint-watcher-emitter:ws", str(ws / "src/slow.txt"))}, seen
    assert watcher._marker_pool.ready == made_ahead and not _marker_files(watcher)


@inotify_only
def test_a_stopped_emitters_last_read_logs_no_error(
    ws: Path, started: Callable[..., WorkspaceWatcher], caplog: pytest.LogCaptureFixture
) -> None:
    """Its stop closes the emitter's group while the emitter's thread may still be about to
    read: that read ends quietly (watchdog logged an error for it at nearly every stop)."""
    watcher = started({"src/": ""})
    emitter = only_emitter(watcher)
    watcher.stop()
    assert emitter._inotify is None  # what the stop leaves to a read still to come
    with caplog.at_level("DEBUG", logger="watchdog"):
        emitter.queue_events(0.0)
    assert [r.getMessage() for r in caplog.records if r.levelname == "ERROR"] == []


@inotify_only
def test_a_barrier_while_the_reader_handles_a_batch_waits_for_the_batch_without_a_marker(
    ws: Path, started: Callable[..., WorkspaceWatcher], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Events read from the kernel but not yet handed to the emitter are in neither queue: the
    barrier waits for the reader's batch to close, then passes behind its events."""
    watcher = started({"src/": ""})
    observer = watcher._observer
    assert isinstance(observer, watcher_inotify.ShadowObserver) and observer.group is not None
    fd = observer._inotify_fd
    assert isinstance(fd, watcher_inotify._HoldingInotifyFD)
    group = observer.group
    plain = group.on_event
    entered, release = threading.Event(), threading.Event()

    def holding(event: Any) -> None:
        if event.name == b"slow.txt":
            entered.set()
            assert release.wait(WAIT_S)
        plain(event)

    monkeypatch.setattr(group, "on_event", holding)
    (ws / "src/slow.txt").write_text("s")
    assert entered.wait(WAIT_S)  # the reader is in the middle of its batch
    flusher, passed = _flushing(watcher)
    wait_for(lambda: len(fd.batch_closed._waiters) == 1,  # type: ignore[attr-defined]
             "the barrier never waited for the reader's batch")
    assert not passed and "src/slow.txt" not in watcher.journal.current_paths()
    release.set()
    flusher.join(WAIT_S)
    assert passed == [True]
    assert "src/slow.txt" in watcher.swap().paths
    assert not _marker_files(watcher)


@inotify_only
def test_a_barrier_while_a_scan_holds_the_events_writes_a_marker_behind_them(
    ws: Path, started: Callable[..., WorkspaceWatcher], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Events held back (a deferred start's scan placing the watches) are in no queue the barrier
    can see: it writes its marker file, which is held behind them and passes once they are handled."""
    watcher = started({"src/": ""})
    observer = watcher._observer
    assert isinstance(observer, watcher_inotify.ShadowObserver)
    fd = observer._inotify_fd
    assert isinstance(fd, watcher_inotify._HoldingInotifyFD)
    with fd._hold_lock:
        fd._held = []  # as a deferred start holds them until `release()`
    (ws / "src/held.txt").write_text("h")
    flusher, passed = _flushing(watcher)
    wait_for(lambda: _marker_files(watcher), "no marker file was written")
    wait_for(lambda: any(b"flush-" in event.name for event in list(fd._held or [])),
             "the marker's event was never held")
    assert not passed and "src/held.txt" not in watcher.journal.current_paths()
    assert fd.release()
    flusher.join(WAIT_S)
    assert passed == [True]
    assert "src/held.txt" in watcher.swap().paths


@inotify_only
def test_an_event_the_reader_has_not_read_yet_is_seen_by_the_barrier(
    ws: Path, started: Callable[..., WorkspaceWatcher]
) -> None:
    """While the reader waits to open its batch, an event left in the kernel's queue (FIONREAD)
    keeps the barrier from passing without a marker."""
    watcher = started({"src/": ""})
    observer = watcher._observer
    assert isinstance(observer, watcher_inotify.ShadowObserver)
    fd = observer._inotify_fd
    assert isinstance(fd, watcher_inotify._HoldingInotifyFD)
    wait_for(lambda: _handed_over(watcher), "the reader never finished the start's events")
    with fd.batch_lock:
        (ws / "src/a.txt").write_text("a")  # the reader wakes and waits for the lock, unread
        assert not fd.all_handed_over()
    wait_for(lambda: "src/a.txt" in watcher.journal.current_paths(), "the event was never recorded")
    wait_for(lambda: _handed_over(watcher), "the reader never handed the file's events over")
    assert watcher.flush(WAIT_S)


@pytest.mark.parametrize("observer", ["portable"])
def test_the_portable_observer_never_proves_a_round_complete(
    ws: Path, started: Callable[..., WorkspaceWatcher]
) -> None:
    watcher = started({"src/": ""})

    (ws / "src/a.py").write_text("a")
    flushed = watcher.flush(WAIT_S)
    wait_until(lambda: "src/a.py" in watcher.journal.current_paths())
    after_flush = watcher.swap()
    (ws / "src/b.py").write_text("b")
    wait_until(lambda: "src/b.py" in watcher.journal.current_paths())
    without_flush = watcher.swap()

    assert not flushed and not watcher.has_flush_barrier
    assert watcher.is_healthy  # the watcher is fine; only its rounds are unproven, so they rescan
    assert "src/a.py" in after_flush.paths and "src/b.py" in without_flush.paths
    assert after_flush.reasons == without_flush.reasons == (UNPROVEN_ROUND,)


@inotify_only  # the fallback of the inotify setting where its overrides cannot run
def test_without_the_inotify_overrides_the_watcher_takes_the_portable_observer(
    ws: Path, watchers: MakeWatcher, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(watcher_inotify, "AVAILABLE", False)  # another OS, or an untested watchdog

    with capture_logs() as logs:
        watcher = watchers(ws)
        watcher.start()

    assert watcher.is_healthy and not watcher.has_flush_barrier
    assert not watcher.flush(WAIT_S)
    assert [e["observer"] for e in logs if e["event"] == "watcher.started"] == ["portable"]
    assert any(e["event"] == "watcher.inotify_unavailable" for e in logs)


def test_writes_racing_the_swaps_are_all_recorded(ws: Path, started: Callable[..., WorkspaceWatcher]) -> None:
    watcher = started({"out/": ""})
    names = [f"out/{i}.txt" for i in range(400)]

    def write() -> None:
        for name in names:
            (ws / name).write_text("x")

    writer = threading.Thread(target=write, name="test-writer")
    writer.start()
    rounds = []
    while writer.is_alive():
        rounds.append(next_round(watcher))
    writer.join()
    rounds.append(next_round(watcher))

    def recorded() -> bool:
        return set(names) <= set().union(*(r.paths for r in rounds))

    while not watcher.has_flush_barrier and not recorded():  # the portable observer's late events
        wait_until(lambda: bool(watcher.journal.current_paths()))
        rounds.append(watcher.swap())
    assert recorded()
    assert all(r.healthy == watcher.has_flush_barrier for r in rounds)


# ---------------------------------------------------------------------------------------- skipping


def _node_modules(path: RepoPath) -> bool:
    return posixpath.basename(path) == "node_modules"


@inotify_only  # skipped folders: the stock observer records them, the stager drops excluded paths
def test_writes_inside_skipped_folders_are_not_recorded(ws: Path, started: Callable[..., WorkspaceWatcher]) -> None:
    tree = {"src/a.py": "1", "node_modules/pkg/index.js": "m", "web/node_modules/y/z.js": "z"}
    watcher = started(tree, skip_dirs=_node_modules)

    (ws / "node_modules/pkg/index.js").write_text("changed")
    (ws / "node_modules/pkg/new.js").write_text("new")
    (ws / "web/node_modules/y/z.js").write_text("changed")
    (ws / "src/a.py").write_text("changed")

    assert next_round(watcher).paths == {"src/a.py"}


@linux_only
@inotify_only  # watch placement: the stock observer watches every folder
def test_skipped_folders_get_no_watch(ws: Path, started: Callable[..., WorkspaceWatcher]) -> None:
    tree = {
        "src/a.py": "1",
        "node_modules/pkg/lib/x.js": "m",
        "web/node_modules/y/z.js": "z",
        "tmpdeps/pkg/x.js": "t",
        "cache/pkg/y.js": "c",
        "lib/": "",
    }
    watcher = started(tree, skip_dirs=_node_modules)
    skipped = [
        ws / "node_modules",
        ws / "node_modules/pkg",
        ws / "node_modules/pkg/lib",
        ws / "web/node_modules",
    ]

    watched = watched_inodes()
    assert {inode(ws), inode(ws / "src"), inode(ws / "web"), inode(ws / "tmpdeps/pkg")} <= watched
    assert not {inode(p) for p in skipped} & watched
    assert watcher.watch_count == len(watched) - 1  # every watch but the barrier's marker folder

    # A skipped folder created later gets no watch either...
    (ws / "app/node_modules/q").mkdir(parents=True)
    # ...and a watched folder moved into a skipped one, or renamed to a skipped name, gives its
    # watches back.
    given_back = {
        inode(ws / "tmpdeps"),
        inode(ws / "tmpdeps/pkg"),
        inode(ws / "cache"),
        inode(ws / "cache/pkg"),
    }
    os.rename(ws / "tmpdeps", ws / "web/node_modules/tmpdeps")
    os.rename(ws / "cache", ws / "lib/node_modules")
    paths = next_round(watcher).paths

    watched = watched_inodes()
    assert inode(ws / "app") in watched
    assert inode(ws / "app/node_modules") not in watched
    assert inode(ws / "app/node_modules/q") not in watched
    assert not given_back & watched
    # The skipped folder itself appeared in a watched one: recorded (the stager drops it); not its content.
    assert paths - {"app/node_modules"} == {"app", "tmpdeps", "cache", "lib/node_modules"}


# ------------------------------------------------------------------------------------------ health


@linux_only
@inotify_only  # overflow injection through our inotify reader; the stock observer reports no overflow
def test_queue_overflow_spoils_the_round_then_the_watcher_recovers(
    ws: Path, started: Callable[..., WorkspaceWatcher]
) -> None:
    from watchdog.observers.inotify_c import InotifyConstants, InotifyEvent, WatchDescriptor

    degraded: list[str] = []
    watcher = started({"src/a.py": "1"}, on_degraded=degraded.append)
    reader = thread_named("shadowpoint-watcher-inotify:ws")
    overflow = InotifyEvent(WatchDescriptor(-1), InotifyConstants.IN_Q_OVERFLOW, 0, b"")

    (ws / "src/before.py").write_text("b")
    with capture_logs() as logs:
        reader.handle_event(overflow)  # what the kernel's IN_Q_OVERFLOW goes through
    spoiled = watcher.swap()
    (ws / "src/after.py").write_text("a")
    recovered = next_round(watcher)
    reader.handle_event(overflow)
    again = watcher.swap()

    assert not spoiled.healthy
    assert any("overflow" in reason for reason in spoiled.reasons)
    assert recovered.healthy  # the watches were rebuilt: the next round can use the watcher
    assert "src/after.py" in recovered.paths
    assert not again.healthy
    assert len(degraded) == 2  # once per healthy → unhealthy transition
    assert "overflow" in degraded[0]
    degraded_logs = [e for e in logs if e["event"] == "watcher.degraded"]
    assert degraded_logs and degraded_logs[0]["kind"] == "queue_overflow"
    assert any(e["event"] == "watcher.recovered" for e in logs)


@linux_only
@inotify_only  # the stock observer reports no overflow (its rounds rescan anyway)
def test_a_real_kernel_queue_overflow_is_detected_and_recovered(
    ws: Path, started: Callable[..., WorkspaceWatcher]
) -> None:
    queued = int(Path("/proc/sys/fs/inotify/max_queued_events").read_text())
    if queued > 200_000:
        pytest.skip(f"max_queued_events={queued} is too large to overflow quickly")
    stalled, release = threading.Event(), threading.Event()

    def skip_dirs(path: RepoPath) -> bool:
        if path == "stall":  # runs on the inotify reader: holding it here stops the queue draining
            stalled.set()
            release.wait(WAIT_S)
        return False

    degraded: list[str] = []
    watcher = started({"src/": ""}, skip_dirs=skip_dirs, on_degraded=degraded.append)
    (ws / "stall").mkdir()
    assert stalled.wait(WAIT_S)
    for i in range(queued // 2 + 100):  # created + modified + closed: 1.5 events per queue slot
        (ws / f"src/f{i}").write_text("x")
    release.set()
    wait_until(lambda: bool(degraded))
    wait_until(lambda: watcher.is_healthy)
    spoiled = watcher.swap()
    (ws / "src/after.py").write_text("a")
    recovered = next_round(watcher)

    assert len(degraded) == 1 and "overflow" in degraded[0]
    assert not spoiled.healthy
    assert recovered.healthy
    assert "src/after.py" in recovered.paths


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_dead_observer_spoils_rounds_until_it_is_restarted(ws: Path, started: Callable[..., WorkspaceWatcher]) -> None:
    degraded: list[str] = []
    watcher = started({"src/a.py": "1"}, on_degraded=degraded.append)
    observer = thread_named("shadowpoint-watcher:ws")

    observer.event_queue.put(("not an event", None))  # the dispatcher crashes on it
    observer.join(WAIT_S)
    assert not observer.is_alive()
    assert not watcher.is_healthy
    with capture_logs() as logs:
        assert not watcher.flush(WAIT_S)  # notices the dead thread, restarts it in the background
        spoiled = watcher.swap()
        wait_until(lambda: watcher.is_healthy)
    (ws / "src/c.py").write_text("c")
    next_round(watcher, "src/c.py")  # the round in which the restart happened may or may not have started degraded
    (ws / "src/d.py").write_text("d")
    healthy = next_round(watcher, "src/d.py")

    assert not spoiled.healthy
    assert any("died" in reason for reason in spoiled.reasons)
    assert len(degraded) == 1 and "died" in degraded[0]
    assert [e["event"] for e in logs if e["event"].startswith("watcher.")][:3] == [
        "watcher.degraded",
        "watcher.started",
        "watcher.recovered",
    ]
    check(watcher, healthy, {"src/d.py"})
    assert watcher_threads().count("shadowpoint-watcher:ws") == 1


def test_failure_to_start_is_reported_not_raised(tmp_path: Path, watchers: MakeWatcher) -> None:
    degraded: list[str] = []
    watcher = watchers(tmp_path / "missing", on_degraded=degraded.append)

    with capture_logs() as logs:
        watcher.start()

    assert not watcher.is_healthy
    assert len(degraded) == 1 and "missing" in degraded[0]
    assert [e["event"] for e in logs if e["log_level"] == "warning"] == ["watcher.degraded"]
    assert not watcher.flush(1.0)
    assert not watcher.swap().healthy
    assert watcher_threads() == []


@linux_only
@inotify_only  # the stock observer ignores a folder it cannot watch (its rounds rescan anyway)
def test_watch_limit_degrades_and_says_how_to_raise_it(
    ws: Path, watchers: MakeWatcher, monkeypatch: pytest.MonkeyPatch
) -> None:
    from watchdog.observers.inotify_c import InotifyFD

    build(ws, {"a/deep/x.py": "1", "b/y.py": "2"})
    real_add = InotifyFD.add_callback

    def add_callback(self: Any, path: bytes, *args: Any) -> Any:
        if path.endswith(b"/deep"):
            raise OSError(errno.ENOSPC, "inotify watch limit reached")
        return real_add(self, path, *args)

    monkeypatch.setattr(InotifyFD, "add_callback", add_callback)
    degraded: list[str] = []
    watcher = watchers(ws, on_degraded=degraded.append)

    with capture_logs() as logs:
        watcher.start()
    (ws / "b/y.py").write_text("changed")
    assert watcher.flush(WAIT_S)
    first = watcher.swap()
    second = watcher.swap()

    assert not watcher.is_healthy
    assert len(degraded) == 1
    assert "sysctl fs.inotify.max_user_watches=" in degraded[0]
    event = next(e for e in logs if e["event"] == "watcher.degraded")
    assert event["kind"] == "watch_limit" and "sysctl fs.inotify.max_user_watches=" in event["reason"]
    assert not first.healthy and "b/y.py" in first.paths  # what is watched is still recorded
    assert not second.healthy  # the limit lasts until a restart


def test_handler_failure_spoils_the_round_and_watching_goes_on(
    ws: Path, started: Callable[..., WorkspaceWatcher]
) -> None:
    class FailingJournal(PathJournal):
        def add(self, path: RepoPath) -> None:
            if path.endswith("boom.txt"):
                raise RuntimeError("injected")
            super().add(path)

    watcher = started(journal=FailingJournal())

    with capture_logs() as logs:
        (ws / "boom.txt").write_text("x")
        wait_until(lambda: any(e["event"] == "watcher.handler_failed" for e in logs))
        spoiled = next_round(watcher)
    (ws / "fine.txt").write_text("y")
    fine = next_round(watcher, "fine.txt")

    assert not spoiled.healthy and any("handler failed" in reason for reason in spoiled.reasons)
    check(watcher, fine, {"fine.txt"})


def test_stop_leaves_no_thread_running(ws: Path, watchers: MakeWatcher) -> None:
    build(ws, {"src/a.py": "1"})
    before = set(threading.enumerate())
    watcher = watchers(ws)

    watcher.start()
    running = set(threading.enumerate()) - before
    watcher.stop()

    named = {"shadowpoint-watcher:ws", "shadowpoint-watcher-emitter:ws"}
    if watcher.has_flush_barrier:
        named.add("shadowpoint-watcher-inotify:ws")
    assert {t.name for t in running} >= named
    assert running and not any(t.is_alive() for t in running)
    assert set(threading.enumerate()) - before == set()
    assert not watcher.swap().healthy  # a stopped watcher records nothing


def test_a_stopped_watcher_can_start_again(ws: Path, watchers: MakeWatcher) -> None:
    build(ws, {"src/a.py": "1"})
    watcher = watchers(ws)
    watcher.start()
    watcher.stop()
    (ws / "src/missed.py").write_text("m")

    watcher.start()
    (ws / "src/seen.py").write_text("s")
    spanning = next_round(watcher, "src/seen.py")
    (ws / "src/next.py").write_text("n")

    assert not spanning.healthy  # the round spanned the stop: src/missed.py was not seen
    assert any("stopped" in reason for reason in spanning.reasons)
    assert "src/seen.py" in spanning.paths
    check(watcher, next_round(watcher, "src/next.py"), {"src/next.py"})


def test_loggers_are_not_cached() -> None:
    # capture_logs in these tests relies on the module logger staying a lazy proxy.
    assert not structlog.get_config()["cache_logger_on_first_use"]


@inotify_only  # skip_dirs: the stock observer has no skipped folders
def test_on_placed_follows_each_placement_of_the_watches(ws: Path, started: Callable[..., WorkspaceWatcher]) -> None:
    """`on_placed` (where a root drops the exclusion decisions it cached for every folder) is
    called once per start or restart, after every folder was asked about; later questions
    are about new folders only, and still decide their watches."""
    asked: list[str] = []
    placed: list[int] = []

    def skip(path: RepoPath) -> bool:
        asked.append(path)
        return _node_modules(path)

    watcher = started({"src/a.py": "1", "node_modules/pkg/x.js": "m"}, skip_dirs=skip,
                      on_placed=lambda: placed.append(len(asked)))
    assert placed == [len(asked)] and {"src", "node_modules"} <= set(asked)
    asked.clear()
    (ws / "src/new").mkdir()
    (ws / "node_modules/later").mkdir()  # below a skipped folder: never asked about
    next_round(watcher)
    assert asked == ["src/new"]
    (ws / "src/new/b.py").write_text("b")
    assert "src/new/b.py" in next_round(watcher).paths
    watcher.restart()
    assert len(placed) == 2 and watcher.is_healthy


@inotify_only  # only the inotify observer starts deferred
def test_events_held_past_the_cap_are_an_overflow_then_the_watcher_recovers(
    ws: Path, watchers: MakeWatcher, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A deferred start holds every event until its scan placed the watches; past the cap the
    rest are dropped and handled as the kernel's queue overflow: the round is unhealthy (it
    rescans), the watches are rebuilt and later changes are recorded."""
    monkeypatch.setattr(watcher_inotify, "HOLD_MAX_EVENTS", 5)
    build(ws, {"src/a.py": "1"})
    degraded: list[str] = []
    watcher = watchers(ws, on_degraded=degraded.append)
    watcher.start(deferred=True)
    placer = watcher.take_placer()
    assert placer is not None
    held = watcher._observer._inotify_fd  # type: ignore[union-attr]
    for i in range(20):
        (ws / f"f{i}.txt").write_text("x")  # the root is watched from the start
    wait_until(lambda: held._held_overflow)
    placer.add(str(ws / "src"))  # as the scan does, before listing the folder
    placer.finish()
    watcher.placed()
    wait_until(lambda: watcher.is_healthy)
    spoiled = watcher.swap()
    (ws / "src" / "after.py").write_text("a")
    recovered = next_round(watcher)

    assert not spoiled.healthy and any("overflow" in reason for reason in spoiled.reasons)
    assert len(degraded) == 1 and "overflow" in degraded[0]
    assert recovered.healthy and "src/after.py" in recovered.paths
