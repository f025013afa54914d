"""Paths that exist but cannot be read (SPEC §7: "unreadable or vanishing files … skipped with a
warning recorded on the checkpoint (never silently)"): a folder without read or search
permission is no deleted folder. Its files are left out with a warning, and a restore to that
checkpoint leaves them alone once they can be read again.

Permissions bind only a process without CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH: as root (CI),
the sidecar runs under `setpriv` with those dropped from its bounding set (a real process with
real permission checks, no fake file system).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import make_tree, read_tree
from tests.faults.support import command_round, edit_round, start_sidecar
from tests.rpc import SidecarProcess

_DROP = "--bounding-set=-dac_override,-dac_read_search"


def _unprivileged(argv: list[str]) -> list[str]:
    """`argv` run so that file permissions bind it."""
    if os.geteuid() != 0:
        return argv
    setpriv = shutil.which("setpriv")
    if setpriv is None:  # util-linux ships it on every Debian; a root without it cannot test this
        pytest.fail("setpriv (util-linux) is needed to run a process whose file permissions bind as root")
    return [setpriv, _DROP, *argv]


SERVE = _unprivileged([sys.executable, "-m", "shadowpoint", "serve"])


@pytest.fixture
def locked_folders() -> Iterator[list[Path]]:
    """Folders a test makes unreadable: readable again afterwards (tmp_path cleanup)."""
    made: list[Path] = []
    yield made
    for folder in made:
        if folder.exists():
            folder.chmod(0o755)


def lock(folder: Path, made: list[Path], mode: int = 0) -> None:
    made.append(folder)
    folder.chmod(mode)


def warned(cp: dict[str, Any]) -> dict[str, str]:
    return {w["path"]: w["reason"] for w in cp["warnings"]}


def restore_dry(sc: SidecarProcess, task: str, ts: int) -> dict[str, Any]:
    files: dict[str, Any] = sc.call("checkpoint/restore", {"taskId": task, "ts": ts, "mode": "files",
                                                           "dryRun": True})["files"]
    return files


@pytest.mark.parametrize("mode", [0o000, 0o444, 0o311], ids=["no-access", "no-search", "no-listing"])
def test_a_folder_the_baseline_cannot_read_is_left_out_with_a_warning(workspace: Path, locked_folders: list[Path],
                                                                       mode: int) -> None:
    make_tree(workspace, {"a.txt": "a", "locked/in.txt": "in", "locked/deeper/more.txt": "m"})
    lock(workspace / "locked", locked_folders, mode)
    sc = start_sidecar(workspace, argv=SERVE)
    try:
        sc.call("task/start", {"taskId": "t", "ts": 1000})
        sc.wait_ready("t")
        baseline = sc.call("checkpoint/list", {"taskId": "t"})["checkpoints"][0]
        assert "locked" in warned(baseline) and "unreadable" in warned(baseline)["locked"]
        assert "cannot be read" in warned(baseline)["locked"]
        diff = sc.call("checkpoint/diff", {"taskId": "t", "from": 1000})
        assert [f["path"] for f in diff["files"]] == [], "the workspace matches the baseline where it can be read"
    finally:
        sc.close()


@pytest.mark.parametrize("how", ["edit-tool path", "rescan", "watched command"])
def test_a_tracked_file_whose_folder_became_unreadable_is_never_taken_for_deleted(
        workspace: Path, locked_folders: list[Path], how: str) -> None:
    """The audit's case: a round after `chmod 0 d` recorded d/in.txt deleted, with no warning,
    and a restore to that checkpoint deleted the file once the folder could be read again."""
    make_tree(workspace, {"a.txt": "a", "d/in.txt": "x1", "d/other.txt": "o"})
    sc = start_sidecar(workspace, "t", argv=SERVE, settings={"watcher": how == "watched command"})
    try:
        def change() -> None:
            (workspace / "d" / "in.txt").write_text("x2")
            (workspace / "a.txt").write_text("a2")
            lock(workspace / "d", locked_folders)

        if how == "edit-tool path":
            cp = edit_round(sc, "t", 2000, ["d/in.txt", "a.txt"], write=change)
        else:
            cp = command_round(sc, "t", 2000, run=change)
        reasons = warned(cp)
        assert any(p in reasons for p in ("d", "d/in.txt")), reasons
        assert all("unreadable" in r for r in reasons.values())
        workspace.joinpath("d").chmod(0o755)
        plan = restore_dry(sc, "t", 2000)
        assert plan["deleted"] == [] and "d/in.txt" not in plan["restored"], plan
        assert plan["restored"] == [] or plan["restored"] == ["a.txt"]
        sc.call("checkpoint/restore", {"taskId": "t", "ts": 2000, "mode": "files"})
        tree = read_tree(workspace)
        assert tree["d/in.txt"] == b"x2" and tree["d/other.txt"] == b"o" and tree["a.txt"] == b"a2"
        # readable again: the next round holds the folder's files, with no warning
        cp = command_round(sc, "t", 3000, run=lambda: (workspace / "a.txt").write_text("a3"))
        assert cp["warnings"] == []
        since = sc.call("checkpoint/diff", {"taskId": "t", "from": 3000})
        assert since["files"] == [], "the checkpoint holds the folder's files again"
        sc.call("checkpoint/restore", {"taskId": "t", "ts": 1000, "mode": "files"})
        assert read_tree(workspace)["d/in.txt"] == b"x1", "the file's first content is one restore away"
    finally:
        workspace.joinpath("d").chmod(0o755)
        sc.close()


_SPLIT_BASELINE = """
import json, sys
from pathlib import Path
from shadowpoint.stage.exclusions import ExclusionRules
from shadowpoint.stage.scanner import Scanner, StageOptions
from shadowpoint.stage.stager import StagePlan
from shadowpoint.stage.stat_cache import StatCache
from shadowpoint.store.shadow_repo import ShadowRepo

root, shadow = Path(sys.argv[1]), Path(sys.argv[2])
repo = ShadowRepo.open_or_init(shadow, root)
split = int(sys.argv[3]) or None
scanner = Scanner(root, repo, ExclusionRules(root), StageOptions(split_min_files=split))
result = scanner.stage(StagePlan(rescan=True), StatCache(), borrow=True)
print(json.dumps({"skipped": [[s.path, s.reason.value, s.detail] for s in result.stats.skipped],
                  "files": sorted(repo.list_tree(result.tree))}))
repo.close()
"""


@pytest.mark.parametrize("split_min_files", [10, None], ids=["split in two processes", "one process"])
def test_a_git_repositorys_baseline_warns_of_an_unreadable_folder_on_either_side(
        tmp_path: Path, locked_folders: list[Path], split_min_files: int | None) -> None:
    """A git repository's baseline split between this process and a forked child: a folder
    either side cannot read is named in the warnings (the child's come back in its answer)."""
    root = tmp_path / "repo"
    files = {f"{top}/f{i}.txt": f"{top} {i}" for top in ("aa", "bb", "cc", "xx", "yy", "zz") for i in range(4)}
    make_tree(root, files)
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(GIT_CONFIG_NOSYSTEM="1", GIT_CONFIG_GLOBAL=os.devnull)
    for args in (["init", "-q"], ["add", "-A"], ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "i"]):
        subprocess.run(["git", *args], cwd=root, env=env, check=True)
    for top in ("aa", "zz"):  # one in each half of the split (the index's order)
        lock(root / top, locked_folders)
    out = subprocess.run(_unprivileged([sys.executable, "-c", _SPLIT_BASELINE, str(root), str(tmp_path / "shadow.git"),
                                        str(split_min_files or 0)]),
                         capture_output=True, text=True, check=False, timeout=120)
    assert out.returncode == 0, out.stderr
    answer = json.loads(out.stdout.splitlines()[-1])
    assert {path for path, reason, _ in answer["skipped"] if reason == "unreadable"} == {"aa", "zz"}
    assert answer["files"] == sorted(p for p in files if not p.startswith(("aa/", "zz/")))
