"""A Hypothesis stateful model of a workspace, its rounds, restores and undos (SPEC §4, §6).

The machine edits a small workspace (write, delete, mkdir, symlink, chmod, renames of files
and folders, rm -rf, hard links, a folder replaced by a file of its name and back), runs
edit rounds (reporting some of the paths it touched) and command rounds, restores files to
any checkpoint (whole, named paths, or keeping outside edits) and undoes and redoes
restores, driving the `Engine` in-process. An in-memory model predicts:

- the tracked set after every round: an edit round (no watcher) stages exactly the reported
  paths, force-added past every exclusion, and the other tracked names of a reported file
  with hard links; a command round (or any round with the watcher) rescans: every file not
  excluded, plus every file already tracked, plus forced paths (with either observer: the
  inotify one records every change, the portable one makes rounds rescan);
- every restore: within the scope of SPEC §6 (only the paths edit tools ever reported, or
  every tracked path when there were none), or the named paths, the checkpoint's content
  byte for byte; an ignored file it writes over is saved first (and tracked from then on);
  a folder holding a file it does not delete, where it writes a file, is left whole;
- every undo and redo: exactly the paths the restore touched, as they were before it (or
  after it), or, when something made since is in the way of one, a refusal writing nothing.

After every step the disk must equal the model; after every round the checkpoint's tree
(read with `list_tree` + `read_blob`) must equal the model's tracked set.

Bounded for CI (`max_examples`, `stateful_step_count`); `SHADOWPOINT_SOAK=N` raises both.
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule, run_state_machine_as_test

from shadowpoint.config import DEFAULT_READ_ONLY_TOOLS
from shadowpoint.engine import Engine, EngineOptions
from shadowpoint.errors import AlreadyRestoredError, NothingToUndoError, RestoreConflictError, RestoreFailedError
from shadowpoint.kinds import RestoreMode, ToolKind
from shadowpoint.observe.watcher import ObserverKind
from shadowpoint.store.values import MODE_EXEC, MODE_FILE, MODE_LINK
from tests.conftest import Exe, Link, read_tree

SOAK = max(1, int(os.environ.get("SHADOWPOINT_SOAK") or 1))  # read at import: the hermetic fixture clears it

# Folder names and file names never overlap, so a path is always a file or always a folder,
# but for SWAPS: folders a build may replace with a file of the same name, and back.
DIRS = ["", "d", "d/e", "node_modules"]
NAMES = ["a", "b.txt", "x.log", "c.sh"]
PATHS = [f"{d}/{n}" if d else n for d in DIRS for n in NAMES]
# folders a rename or a removal takes whole; "m" and "n/m" are made only by a rename
FOLDERS = ["d", "d/e", "node_modules", "m", "n/m", "d/m"]
SWAPS = ["d/e", "node_modules"]  # `node_modules/` ignores the folder, not a file of the name
LINK_TARGETS = ["a", "../a", "d", "/nonexistent/abs", "../../../outside", "b.txt"]
# one text and two edits of it far apart: the three-way merges of keepOutsideEdits are clean
LINES = [b"l1\nl2\nl3\nl4\nl5\nl6\n", b"L1\nl2\nl3\nl4\nl5\nl6\n", b"l1\nl2\nl3\nl4\nl5\nL6\n"]
CONTENTS = [b"", b"one\n", b"two\r\nlines\r\n", b"\x00\x01binary\xff", b"same size 1", b"same size 2",
            b"x" * 3000, *LINES]


def excluded(path: str) -> bool:
    """The built-in rules that touch this universe: `*.log` and `node_modules/`."""
    return path.endswith(".log") or path.startswith("node_modules/")


def above(path: str) -> list[str]:
    """The folders above `path`, top down."""
    parts = path.split("/")
    return ["/".join(parts[:i]) for i in range(1, len(parts))]


def at_or_under(path: str, paths: set[str]) -> bool:
    return path in paths or any(f in paths for f in above(path))


File = tuple[bytes, bool]  # content, executable
Entry = Any  # ("file", bytes, bool) | ("link", str)


def wire(entry: Entry) -> Any:
    """An entry in `read_tree`'s shape."""
    if entry[0] == "link":
        return Link(entry[1])
    return Exe(entry[1]) if entry[2] else entry[1]


class WorkspaceModel(RuleBasedStateMachine):
    """One task on one workspace; see the module docstring."""

    watcher = False
    observer: ObserverKind = "inotify"

    def __init__(self) -> None:
        super().__init__()
        self.tmp = Path(tempfile.mkdtemp(prefix="shadowpoint-model-"))
        self.root = Path(os.path.realpath(self.tmp / "ws"))
        self.root.mkdir()
        self.disk: dict[str, Entry] = {}
        self.inode: dict[str, int] = {}  # a model inode per file name: hard links share one
        self.next_inode = 0
        for path, data in (("a", b"base a\n"), ("d/b.txt", b"base b\n"), ("x.log", b"log\n"),
                           ("node_modules/a", b"dep\n")):
            self._write(path, data, False)
        options = EngineOptions(docs_dir=self.tmp / "docs", read_only_tools=frozenset(DEFAULT_READ_ONLY_TOOLS),
                                watcher=self.watcher, watcher_observer=self.observer)
        self.engine = Engine([self.root], options)
        self.engine.start_task("t", 1)
        rt = self.engine._task("t")
        assert rt.baseline is not None
        rt.baseline.result(timeout=120)
        assert rt.state == "ready", rt.error
        self.ts = 1
        self.seen: dict[str, int | None] = {}  # the inode of each tracked file when last staged
        self.tracked: dict[str, Entry] = {}
        self._set_tracked(self._rescan({}, set()))
        self.checkpoints: list[tuple[int, dict[str, Entry]]] = [(1, dict(self.tracked))]
        self._check_checkpoint(1, self.tracked)
        self.restored: set[int] = set()
        self.edited: set[str] = set()
        # what the task's rounds changed (PROTOCOL 1.1 "Scope"): a rescanned round counts all it
        # found; with a watcher the writes of this model happen between rounds, not the task's
        self.changed: set[str] = set()
        self.pending: set[str] = set()
        # the undo and redo stacks: each restore's safety state, the state it left, its paths
        self.undo: list[tuple[dict[str, Entry], dict[str, Entry], list[str]]] = []
        self.redo: list[tuple[dict[str, Entry], dict[str, Entry], list[str]]] = []

    def teardown(self) -> None:
        self.engine.close()
        shutil.rmtree(self.tmp, ignore_errors=True)

    # ---- the disk ---------------------------------------------------------------------------------

    def _write(self, path: str, data: bytes, executable: bool) -> None:
        """Writes in place (as `echo > f`): through a hard link, every name of the file changes."""
        full = self.root / path
        full.parent.mkdir(parents=True, exist_ok=True)
        if full.is_symlink():
            full.unlink()
        full.write_bytes(data)
        full.chmod(0o755 if executable else 0o644)
        for name in self._names(path):
            self.disk[name] = ("file", data, executable)

    def _unseen(self, path: str) -> bool:
        """A change through an excluded name of a file that has other names: the watcher sees
        none (a folder like node_modules/ has no watch), so a round misses the other names'
        change until the verification scan (as for a link from outside the workspace)."""
        return excluded(path) and path in self.inode and len(self._names(path)) > 1

    def _drops_unseen(self, paths: list[str]) -> bool:
        """Removing a name of a hard-linked file changed since the last round: a watcher
        reported the change under the names it came through, and one of them is gone when the
        round stages it, so nothing shows its inode's other names changed (the verification
        scan finds them; looking up a removed file's other names by the stat cache's inodes
        would cost a trusted round ~20 ms at 100k files)."""
        return self.trusted and any(
            p in self.inode and len(names := self._names(p)) > 1 and any(n in self.pending for n in names)
            for p in paths)

    def _names(self, path: str) -> list[str]:
        """Every name of the file at `path` (a new file gets a fresh inode)."""
        if path not in self.inode:
            self.next_inode += 1
            self.inode[path] = self.next_inode
        return [p for p, i in self.inode.items() if i == self.inode[path]]

    def _rescan(self, tracked: dict[str, Entry], forced: set[str]) -> dict[str, Entry]:
        """A forced folder is staged with every file under it."""
        return {p: e for p, e in self.disk.items() if not excluded(p) or p in tracked or at_or_under(p, forced)}

    def _under(self, folder: str) -> list[str]:
        return [p for p in self.disk if p.startswith(f"{folder}/")]

    def _blocked(self, path: str) -> bool:
        """A file or link stands where a folder of `path` goes (a swapped folder): no rule
        but a restore writes there."""
        return any(f in self.disk for f in above(path))

    @rule(path=st.sampled_from(PATHS), data=st.sampled_from(CONTENTS), executable=st.booleans())
    def write(self, path: str, data: bytes, executable: bool) -> None:
        if self._unseen(path) or self._blocked(path):
            return
        self._write(path, data, executable)
        self.pending.add(path)

    @precondition(lambda self: bool(self.disk))
    @rule(data=st.data())
    def delete(self, data: st.DataObject) -> None:
        path = data.draw(st.sampled_from(sorted(self.disk)))
        if self._drops_unseen([path]):
            return
        (self.root / path).unlink()
        del self.disk[path]
        self.inode.pop(path, None)
        self.pending.add(path)

    @rule(path=st.sampled_from(PATHS), link_to=st.sampled_from(LINK_TARGETS))
    def symlink(self, path: str, link_to: str) -> None:
        if self._blocked(path) or self._drops_unseen([path]):
            return
        full = self.root / path
        full.parent.mkdir(parents=True, exist_ok=True)
        if full.is_symlink() or full.exists():
            full.unlink()
        full.symlink_to(link_to)
        self.disk[path] = ("link", link_to)
        self.inode.pop(path, None)
        self.pending.add(path)

    @precondition(lambda self: any(e[0] == "file" for e in self.disk.values()))
    @rule(data=st.data())
    def chmod(self, data: st.DataObject) -> None:
        path = data.draw(st.sampled_from(sorted(p for p, e in self.disk.items() if e[0] == "file")))
        if self._unseen(path):
            return
        _, content, executable = self.disk[path]
        (self.root / path).chmod(0o644 if executable else 0o755)
        for name in self._names(path):
            self.disk[name] = ("file", content, not executable)
            self.pending.add(name)

    @rule(folder=st.sampled_from(["d", "d/e", "node_modules", "empty", "d/empty"]))
    def mkdir(self, folder: str) -> None:
        if folder in self.disk or self._blocked(folder):
            return
        (self.root / folder).mkdir(parents=True, exist_ok=True)  # git keeps no empty folder: no model change

    @precondition(lambda self: bool(self.disk))
    @rule(data=st.data(), to=st.sampled_from(PATHS))
    def rename_file(self, data: st.DataObject, to: str) -> None:
        """An editor's save (a temporary file renamed over the file) or `mv a b`."""
        source = data.draw(st.sampled_from(sorted(self.disk)))
        if source == to or (source in self.inode and self.inode.get(to) == self.inode[source]):
            return  # two names of one file: rename(2) does nothing
        if self._blocked(to) or self._drops_unseen([to]):
            return
        (self.root / to).parent.mkdir(parents=True, exist_ok=True)
        os.rename(self.root / source, self.root / to)
        self.disk[to] = self.disk.pop(source)
        self.inode.pop(to, None)
        if source in self.inode:
            self.inode[to] = self.inode.pop(source)
        self.pending |= {source, to}

    @precondition(lambda self: any(e[0] == "file" for e in self.disk.values()))
    @rule(data=st.data(), to=st.sampled_from(PATHS))
    def hard_link(self, data: st.DataObject, to: str) -> None:
        """`ln src to`: a second name of one file; a write through either changes both (not
        through an excluded one: `_unseen`)."""
        source = data.draw(st.sampled_from(sorted(p for p, e in self.disk.items() if e[0] == "file")))
        if to in self.disk or self._blocked(to):
            return
        (self.root / to).parent.mkdir(parents=True, exist_ok=True)
        os.link(self.root / source, self.root / to)
        self._names(source)
        self.inode[to] = self.inode[source]
        self.disk[to] = self.disk[source]
        self.pending.add(to)

    @rule(source=st.sampled_from(FOLDERS), to=st.sampled_from(FOLDERS))
    def rename_folder(self, source: str, to: str) -> None:
        """`mv src lib`: a folder with everything in it moves (the watcher sees one event)."""
        if not (self.root / source).is_dir() or (self.root / to).exists() or f"{to}/".startswith(f"{source}/"):
            return
        (self.root / to).parent.mkdir(parents=True, exist_ok=True)
        os.rename(self.root / source, self.root / to)
        for path in [p for p in self.disk if p.startswith(f"{source}/")]:
            moved = to + path[len(source):]
            self.disk[moved] = self.disk.pop(path)
            if path in self.inode:
                self.inode[moved] = self.inode.pop(path)
            self.pending |= {path, moved}

    @rule(folder=st.sampled_from(FOLDERS))
    def remove_folder(self, folder: str) -> None:
        """`rm -rf folder`."""
        if not (self.root / folder).is_dir() or self._drops_unseen(self._under(folder)):
            return
        shutil.rmtree(self.root / folder)
        for path in [p for p in self.disk if p.startswith(f"{folder}/")]:
            del self.disk[path]
            self.inode.pop(path, None)
            self.pending.add(path)

    @rule(path=st.sampled_from(SWAPS), data=st.sampled_from(CONTENTS))
    def swap(self, path: str, data: bytes) -> None:
        """A build replaces the folder `path` with a file of that name (`rm -rf out && cc -o
        out`), or the file (or nothing) with a folder holding `a`."""
        full = self.root / path
        if self._drops_unseen([path, *self._under(path)]):
            return
        if full.is_dir() and not full.is_symlink():
            shutil.rmtree(full)
            for gone in self._under(path):
                del self.disk[gone]
                self.inode.pop(gone, None)
                self.pending.add(gone)
            self._write(path, data, False)
            self.pending.add(path)
            return
        if path in self.disk:
            full.unlink()
            del self.disk[path]
            self.inode.pop(path, None)
            self.pending.add(path)
        self._write(f"{path}/a", data, False)
        self.pending.add(f"{path}/a")

    # ---- rounds -----------------------------------------------------------------------------------------

    def _next_ts(self) -> int:
        self.ts += 1
        return self.ts

    @precondition(lambda self: bool(self.pending))
    @rule(data=st.data())
    def edit_round(self, data: st.DataObject) -> None:
        reported = data.draw(st.sets(st.sampled_from(sorted(self.pending)), min_size=1))
        ts = self._next_ts()
        eng = self.engine
        eng.begin_round("t")
        eng.tool_began("t", "write_to_file", ToolKind.EDIT, sorted(reported))
        eng.tool_ended("t", "write_to_file", sorted(reported), ToolKind.EDIT)
        cp = eng.end_round("t", ts)
        assert cp is not None
        self.edited |= reported
        if self.watcher:
            # the watcher records every change: the unreported ones are staged, minus exclusions
            # (a round of reported edits adds only its paths to the scope, even when it rescans:
            # what else changed meanwhile is not its commands' doing, PROTOCOL 1.1 "Scope")
            self._set_tracked(self._rescan(self.tracked, reported))
            self.pending.clear()
        else:
            # a reported file with other names: the tracked names the engine last saw on its
            # inode are staged too (the stat cache's inodes: a name that got the inode since
            # then, unreported, is not known to have it)
            # a reported folder is staged with every file under it (and a file or nothing there:
            # no tracked path under it is left)
            staged = {q for p in reported for q in (p, *self._under(p)) if q in self.disk}
            linked = {q for p in staged if p in self.inode and len(self._names(p)) > 1
                      for q, seen in self.seen.items() if seen == self.inode[p]}
            for path in reported | linked:
                for gone in [q for q in self.tracked if q.startswith(f"{path}/")]:
                    self._track(gone, None)
                self._track(path, self.disk.get(path))
            for path in staged:
                for folder in above(path):  # a tracked file where its folder is now
                    self._track(folder, None)
                self._track(path, self.disk[path])
            self.pending = {p for p in self.pending if not at_or_under(p, reported | linked)}
        self._round_done(ts)

    @rule()
    def command_round(self) -> None:
        ts = self._next_ts()
        eng = self.engine
        eng.begin_round("t")
        eng.tool_began("t", "execute_command", ToolKind.COMMAND, None)
        eng.tool_ended("t", "execute_command", None, ToolKind.COMMAND)
        cp = eng.end_round("t", ts)
        assert cp is not None
        before = self.tracked
        self._set_tracked(self._rescan(self.tracked, set()))
        if not self.trusted:
            self.changed |= {p for p in set(before) | set(self.tracked) if before.get(p) != self.tracked.get(p)}
        self.pending.clear()
        self._round_done(ts)

    @property
    def trusted(self) -> bool:
        """A watcher whose rounds are staged from its paths (not rescanned): the inotify observer."""
        return self.watcher and self.observer == "inotify"

    def _round_done(self, ts: int) -> None:
        self.checkpoints.append((ts, dict(self.tracked)))
        self.restored.clear()  # a new checkpoint clears every restored mark
        self._check_checkpoint(ts, self.tracked)

    def _check_checkpoint(self, ts: int, expected: dict[str, Entry]) -> None:
        root = self.engine.roots[self.engine.first_root]
        commit = next(c for c in self.engine.list_checkpoints("t").checkpoints if c.ts == ts).hash
        assert commit is not None, f"checkpoint ts={ts} has no snapshot"
        with root.locked() as locked:
            repo = locked.repo
            listing = repo.list_tree(repo.commit_tree(commit))
            got: dict[str, Entry] = {}
            for path, entry in listing.items():
                blob = repo.read_blob(entry.oid)
                if entry.mode == MODE_LINK:
                    got[path] = ("link", os.fsdecode(blob))
                else:
                    assert entry.mode in (MODE_FILE, MODE_EXEC)
                    got[path] = ("file", blob, entry.mode == MODE_EXEC)
        assert got == expected, f"checkpoint ts={ts}: snapshot differs from the model"

    # ---- restores ----------------------------------------------------------------------------------------

    @rule(data=st.data())
    def restore(self, data: st.DataObject) -> None:
        ts, target = data.draw(st.sampled_from(self.checkpoints))
        if ts in self.restored:
            with pytest.raises(AlreadyRestoredError):
                self.engine.restore("t", ts, RestoreMode.FILES)
            return
        scope = self.edited | self.changed
        if self._restored(lambda: self.engine.restore("t", ts, RestoreMode.FILES), target,
                          lambda p: not scope or at_or_under(p, scope), None):
            self.restored.add(ts)  # a partly failed restore marks nothing

    @rule(data=st.data())
    def restore_paths(self, data: st.DataObject) -> None:
        """A restore of named paths (PROTOCOL 1.1 `paths`): whatever the scope; a folder stands
        for the files under it; a path neither the checkpoint nor the newest snapshot holds is
        left alone; no restored mark."""
        ts, target = data.draw(st.sampled_from(self.checkpoints))
        known = {*target, *self._rescan(self.tracked, self.edited), *self.disk, *FOLDERS}
        named = data.draw(st.sets(st.sampled_from(sorted(known)), min_size=1, max_size=3))
        self._restored(lambda: self.engine.restore("t", ts, RestoreMode.FILES, paths=sorted(named)), target,
                       lambda p: any(p == n or p.startswith(f"{n}/") for n in named), self.checkpoints[-1][1])

    @rule(data=st.data())
    def restore_keeping_outside_edits(self, data: st.DataObject) -> None:
        """`keepOutsideEdits`: the merges are libgit2's, so the model takes the answer's lists
        and holds the restore to them: a conflict writes nothing; otherwise only the listed
        paths (in the scope) change, restored ones to the checkpoint, and an undo puts them back."""
        ts, target = data.draw(st.sampled_from(self.checkpoints))
        current = self._rescan(self.tracked, self.edited)
        scope = self.edited | self.changed
        if ts in self.restored or any((p not in current and p in self.disk) or self._blocked(p)
                                      or self._under(p) for p in target):
            return  # the marks and what stands in a write's way are the other rules' cases
        try:
            out: dict[str, Any] = self.engine.restore("t", ts, RestoreMode.FILES,
                                                      keep_outside_edits=True).to_wire()
        except RestoreConflictError as exc:
            assert exc.conflicts and all(not scope or at_or_under(p, scope) for p in exc.conflicts)
            self._set_tracked(current)  # its safety state was staged; nothing was written
            self.pending.clear()
            return
        files = out["files"]
        touched = sorted(files["restored"] + files["deleted"] + files["merged"])
        assert all(not scope or at_or_under(p, scope) for p in touched), "only the task's paths"
        actual = read_tree(self.root)
        for path in files["restored"] + files["deleted"]:
            assert actual.get(path) == (wire(target[path]) if path in target else None), path
        self._set_tracked(current)
        safety = dict(current)
        for path in touched:
            self._put(path, self._on_disk(path))
            self._track(path, self.disk.get(path))
        self.restored.add(ts)
        self.undo.append((safety, dict(self.tracked), touched))
        self.redo.clear()
        self.pending.clear()

    def _on_disk(self, path: str) -> Entry | None:
        full = self.root / path
        if full.is_symlink():
            return ("link", os.readlink(full))
        if not full.is_file():
            return None
        return ("file", full.read_bytes(), bool(full.stat().st_mode & stat.S_IXUSR))

    def _restored(self, call: Callable[[], Any], target: dict[str, Entry], in_scope: Callable[[str], bool],
                  newest: dict[str, Entry] | None) -> bool:
        """A file restore to `target`, recorded for undo and redo (a partly failed one too).
        Returns whether all of it went through."""
        current = self._rescan(self.tracked, self.edited)
        writes = [p for p in target if in_scope(p) and target[p] != current.get(p)]
        self._save_in_the_way(current, writes)
        touched = {p for p in set(target) | set(current) if in_scope(p) and target.get(p) != current.get(p)}
        # a tracked file where a folder of a written path goes is deleted, in scope or not
        touched |= {f for p in writes for f in above(p) if f in current}
        if newest is not None:
            # named paths: a deletion of what no snapshot holds is left alone, unless a write
            # needs the place
            needed = {f for p in writes for f in above(p)}
            touched = {p for p in touched if p in target or p in newest or p in needed}
        # a folder where a file is written, holding a file the restore does not delete (one no
        # snapshot holds, or not named): left whole, the write with it (SPEC §6), and the
        # restore fails for it after doing the rest
        occupied = self._occupied(target, touched)
        touched = {p for p in touched if not at_or_under(p, occupied)}
        if occupied:
            with pytest.raises(RestoreFailedError, match="left as it is, since the folder there holds"):
                call()
        safety = self._apply(None if occupied else call().to_wire(), target, current, touched)
        self.undo.append((safety, dict(self.tracked), sorted(touched)))
        self.redo.clear()
        return not occupied

    def _occupied(self, target: dict[str, Entry], touched: set[str]) -> set[str]:
        """The written paths where a folder holds a file the restore does not delete."""
        deleted = {p for p in touched if p not in target}
        return {p for p in touched if p in target and any(q not in deleted for q in self._under(p))}

    def _save_in_the_way(self, current: dict[str, Entry], writes: list[str]) -> None:
        """What a write replaces that no snapshot holds (ignored, excluded) is saved first and
        tracked from now: a file at the path or where a folder of it goes."""
        for path in writes:
            if path in current:
                continue
            for place in (*above(path), path):
                if place in current:
                    break  # tracked: the restore deletes it (a folder goes there)
                if place in self.disk:
                    current[place] = self.disk[place]
                    break
                if not self._under(place):
                    break  # nothing there

    def _apply(self, out: dict[str, Any] | None, target: dict[str, Entry], current: dict[str, Entry],
               touched: set[str]) -> dict[str, Entry]:
        """The restore's safety state `current` becomes the tracked set; `touched` is put back
        (and is what the answer `out` names, when it answered). Returns the safety state."""
        safety = dict(current)
        self._set_tracked(current)
        for path in sorted(touched):
            self._put(path, target.get(path))
            self._track(path, target.get(path))
        if out is not None:
            assert out["files"] is not None
            assert sorted(out["files"]["restored"] + out["files"]["deleted"]) == sorted(touched), (out, touched)
        self.pending.clear()
        return safety

    @rule()
    def undo_restore(self) -> None:
        if not self.undo:
            with pytest.raises(NothingToUndoError):
                self.engine.undo_restore("t")
            return
        safety, _, paths = self.undo[-1]
        if self._step(self.engine.undo_restore, safety, paths):
            self.redo.append(self.undo.pop())
            self.restored.clear()  # the files are no longer as a restore left them

    @rule()
    def redo_restore(self) -> None:
        if not self.redo:
            with pytest.raises(NothingToUndoError):
                self.engine.redo_restore("t")
            return
        _, after, paths = self.redo[-1]
        if self._step(self.engine.redo_restore, after, paths):
            self.undo.append(self.redo.pop())

    def _step(self, call: Callable[[str], Any], tree: dict[str, Entry], paths: list[str]) -> bool:
        """An undo or redo: exactly the restore's paths put back to the state before it (`tree`:
        its safety state) or after it. Something made since in the way of one (files in a
        folder where it writes a file, a file where a folder of it goes) refuses it whole,
        writing nothing. Returns whether it went through."""
        scope = set(paths)
        current = self._rescan(self.tracked, self.edited)
        writes = [p for p in paths if p in tree and tree[p] != current.get(p)]

        def blocked() -> set[str]:
            others = {p for p in set(tree) | set(current)
                      if at_or_under(p, scope) and p not in scope and tree.get(p) != current.get(p)}
            others |= {f for w in writes for f in above(w) if f in current and f not in scope}
            return {w for w in writes if any(f in others for f in above(w))
                    or any(o.startswith(f"{w}/") for o in others)}

        # a write left out is not looked at for what it replaces
        self._save_in_the_way(current, [w for w in writes if w not in blocked()])
        left = blocked()
        touched = {p for p in scope if tree.get(p) != current.get(p)}
        if left or self._occupied(tree, {p for p in touched if p not in left}):
            with pytest.raises(RestoreFailedError, match="in its way"):
                call("t")
            self._set_tracked(current)
            self.pending.clear()
            return False
        self._apply(call("t").to_wire(), tree, current, touched)
        return True

    def _put(self, path: str, entry: Entry | None) -> None:
        self.inode.pop(path, None)  # a restore writes a new file and renames it into place
        if entry is not None and entry[0] == "file":
            self._names(path)
        if entry is None:
            self.disk.pop(path, None)
        else:
            self.disk[path] = entry

    def _set_tracked(self, tracked: dict[str, Entry]) -> None:
        """A staging that looked at every tracked file (a rescan)."""
        self.tracked = tracked
        self.seen = {p: self.inode.get(p) for p in tracked}

    def _track(self, path: str, entry: Entry | None) -> None:
        self.seen.pop(path, None)
        if entry is not None:
            self.seen[path] = self.inode.get(path)
        if entry is None:
            self.tracked.pop(path, None)
        else:
            self.tracked[path] = entry

    # ---- invariants -------------------------------------------------------------------------------------

    @invariant()
    def disk_matches_the_model(self) -> None:
        actual = read_tree(self.root)
        assert actual == {p: wire(e) for p, e in self.disk.items()}
        for path, entry in self.disk.items():
            if entry[0] == "file":
                mode = os.lstat(self.root / path).st_mode
                assert bool(mode & stat.S_IXUSR) == entry[2] and not mode & (stat.S_ISUID | stat.S_ISGID)


class WatchedWorkspaceModel(WorkspaceModel):
    watcher = True


def _settings(examples: int, steps: int) -> settings:
    return settings(max_examples=examples * SOAK, stateful_step_count=steps * min(SOAK, 4), deadline=None,
                    database=None, derandomize=SOAK == 1, print_blob=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


def test_model_without_watcher() -> None:
    run_state_machine_as_test(WorkspaceModel, settings=_settings(120, 40))


@pytest.mark.parametrize("observer", ["inotify", "portable"])
def test_model_with_watcher(observer: ObserverKind) -> None:
    model = type(f"WatchedWorkspaceModel_{observer}", (WatchedWorkspaceModel,), {"observer": observer})
    run_state_machine_as_test(model, settings=_settings(30, 25))
