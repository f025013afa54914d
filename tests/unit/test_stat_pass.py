"""Unit tests for `shadowpoint.stage.stat_pass`: a rescan's stat pass, half of it in a forked child."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from shadowpoint.stage.exclusions import NAME_SEP, ExclusionRules
from shadowpoint.stage.stat_cache import RACY_MARGIN_NS, FileState, state_of
from shadowpoint.stage.stat_pass import Folder, StatPass, _halves, check_folders, split_pass
from shadowpoint.store.values import MODE_FILE, TreeEntry

ENTRY = TreeEntry("1" * 40, MODE_FILE)


def make_workspace(root: Path, folders: int = 12, files: int = 9) -> dict[str, FileState]:
    """Files in several folders, each recorded in a stat cache as clean (stat older than the
    racy margin)."""
    entries: dict[str, FileState] = {}
    for d in range(folders):
        (root / f"d{d}").mkdir(parents=True)
        for f in range(files):
            rel = f"d{d}/f{f}.txt"
            (root / rel).write_text(f"{d}/{f}")
            st = os.lstat(root / rel)
            entries[rel] = state_of(st, ENTRY, st.st_mtime_ns + RACY_MARGIN_NS + 1)
    return entries


def walk(root: Path) -> list[Folder]:
    return list(ExclusionRules(root).walk_folders())


def change_some(root: Path, entries: dict[str, FileState]) -> set[str]:
    """In folders spread over both halves: an edit, a new file, a racy entry, and a file gone
    after the walk listed it (the caller walks first). Returns what no stat proves."""
    (root / "d1/f1.txt").write_text("edited, longer")
    (root / "d10/new.txt").write_text("new")
    st = os.lstat(root / "d7/f3.txt")
    entries["d7/f3.txt"] = state_of(st, ENTRY, st.st_mtime_ns)  # recorded in its own tick: racy
    return {"d1/f1.txt", "d10/new.txt", "d7/f3.txt", "d4/f2.txt"}


def run_both(root: Path, entries: Mapping[str, FileState], folders: Sequence[Folder], **kw: object) -> StatPass:
    (root / "d4/f2.txt").unlink(missing_ok=True)  # listed by the walk, gone before its lstat
    return split_pass(f"{root}/", folders, entries, 1, **kw)  # type: ignore[arg-type]


def test_a_split_pass_finds_exactly_what_one_pass_finds(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    entries = make_workspace(root)
    expected = change_some(root, entries)
    folders = walk(root)
    found = run_both(root, entries, folders)
    alone = check_folders(f"{root}/", folders, entries)
    assert sorted(found.unproven) == sorted(alone.unproven) == sorted(expected)
    assert (found.reached, found.clean) == (alone.reached, alone.clean)
    # every tracked file but the one gone was reached; all but the edited and the racy are clean
    assert found.reached == len(entries) - 1
    assert found.clean == len(entries) - 3


def test_the_halves_hold_about_as_many_files_each() -> None:
    sizes = [40, 1, 1, 7, 30, 2, 9, 9, 1, 20]
    folders: list[Folder] = [(f"d{i}/", NAME_SEP.join(f"f{j}" for j in range(n)), None) for i, n in enumerate(sizes)]
    mine, theirs = _halves(folders)
    count = [sum(j.count(NAME_SEP) + 1 for _, j, _ in part) for part in (mine, theirs)]
    assert sorted(f[:2] for f in mine + theirs) == sorted(f[:2] for f in folders)
    assert abs(count[0] - count[1]) <= max(sizes)
    assert abs(count[0] - count[1]) < sum(sizes) // 4


def test_below_the_threshold_no_child_is_started(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    entries = make_workspace(root, folders=2, files=2)

    def failing_child(*_: object) -> StatPass:
        raise AssertionError("a child was started")

    found = split_pass(f"{root}/", walk(root), entries, 5, child_check=failing_child)
    assert (found.reached, found.clean, found.unproven) == (4, 4, [])
    found = split_pass(f"{root}/", walk(root), entries, None, child_check=failing_child)
    assert found.clean == 4


def dies(root: str, folders: Sequence[Folder], entries: Mapping[str, FileState]) -> StatPass:
    os._exit(3)


def killed(root: str, folders: Sequence[Folder], entries: Mapping[str, FileState]) -> StatPass:
    os.kill(os.getpid(), signal.SIGKILL)
    raise AssertionError("not reached")


def lies(root: str, folders: Sequence[Folder], entries: Mapping[str, FileState]) -> StatPass:
    return StatPass(0, 0, [])  # a complete answer the parent cannot tell from the truth


def raises(root: str, folders: Sequence[Folder], entries: Mapping[str, FileState]) -> StatPass:
    raise RuntimeError("the child's check failed")


def test_a_child_that_fails_leaves_its_folders_to_this_process(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    entries = make_workspace(root)
    expected = change_some(root, entries)
    folders = walk(root)
    for child in (dies, killed, raises):
        found = run_both(root, entries, folders, child_check=child)
        assert sorted(found.unproven) == sorted(expected), child.__name__
        assert found.reached == len(entries) - 1
    # the seam does reach the child: an answer of nothing loses its half's changes
    found = run_both(root, entries, folders, child_check=lies)
    assert set(found.unproven) < expected


def test_a_signal_in_the_child_runs_none_of_this_process_handlers(tmp_path: Path) -> None:
    """The sidecar's SIGTERM handler and wake-up fd belong to it: a child that gets the signal
    dies by it, and this process does its folders."""
    root = tmp_path / "ws"
    entries = make_workspace(root)
    expected = change_some(root, entries)
    folders = walk(root)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    handled: list[int] = []
    old_handler = signal.signal(signal.SIGTERM, lambda sig, _frame: handled.append(sig))
    old_wakeup = signal.set_wakeup_fd(wake_w)

    def terminated(root_s: str, part: Sequence[Folder], known: Mapping[str, FileState]) -> StatPass:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(60)  # never reached: the default action ends the child at once
        return check_folders(root_s, part, known)

    try:
        found = run_both(root, entries, folders, child_check=terminated)
    finally:
        signal.set_wakeup_fd(old_wakeup)
        signal.signal(signal.SIGTERM, old_handler)
    os.set_blocking(wake_r, False)
    try:
        woken = os.read(wake_r, 16)
    except BlockingIOError:
        woken = b""
    os.close(wake_r)
    os.close(wake_w)
    assert sorted(found.unproven) == sorted(expected)
    assert handled == [] and woken == b""


def test_the_child_never_writes_this_process_buffered_output(tmp_path: Path) -> None:
    """The sidecar's stdout carries only the protocol: text waiting in its buffer at the fork
    comes out once, from this process."""
    root = tmp_path / "ws"
    make_workspace(root, folders=3, files=2)
    script = (
        "import os, sys\n"
        "from shadowpoint.stage.exclusions import ExclusionRules\n"
        "from shadowpoint.stage.stat_pass import split_pass\n"
        "sys.stdout.write('before-fork;')\n"
        f"found = split_pass({str(root)!r} + '/', list(ExclusionRules({str(root)!r}).walk_folders()), {{}}, 1)\n"
        "sys.stdout.write(f'unproven={len(found.unproven)}')\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout == "before-fork;unproven=6"
