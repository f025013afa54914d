"""Smoke test of the benchmark suite: the runner on a tiny generated tree, one repeat.

Checks that every scenario produced numbers for ours and for the rival (or a stated reason
to skip), and that our snapshot and `git ls-files` of the seed emulation hold the same files.
No timing asserts: speed is the benchmarks' business, not the tests'.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
# scenarios that need a part of the engine which may not exist yet; they may skip, with a reason
MAY_SKIP = {"watcher_round", "watcher_startup"}


def test_benchmarks_run_on_a_tiny_tree(tmp_path: Path) -> None:
    out = tmp_path / "results.json"
    work = tmp_path / "work"
    work.mkdir()
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--size", "300", "--repeat", "1", "--seed", "7",
         "--json", str(out), "--out", str(tmp_path / "out"), "--workdir", str(work)],
        cwd=REPO, capture_output=True, text=True, timeout=120, check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    data = json.loads(out.read_text())
    (tree,) = data["trees"]
    assert tree["files"] == 300

    from benchmarks.scenarios import SCENARIOS

    by_name: dict[str, dict[str, Any]] = {s["name"]: s for s in tree["scenarios"]}
    assert set(by_name) == {s.name for s in SCENARIOS}
    for spec in SCENARIOS:
        s = by_name[spec.name]
        assert s["error"] is None, (spec.name, s["error"])
        if s["skipped"] is not None:
            assert spec.name in MAY_SKIP and s["skipped"], (spec.name, s["skipped"])
            continue
        assert s["ours"]["median"] > 0 and s["ours"]["min"] > 0, spec.name
        if spec.rival_name is not None:
            assert s["rival"]["median"] > 0 and s["rival"]["min"] > 0, spec.name
            assert s["ratio"] > 0, spec.name
        assert s["status"] in ("PASS", "MISS", "—"), spec.name

    # a git repository's baseline says what CPU each side spent, where it went (user space or kernel)
    spent = [note for note in by_name["baseline_git_index"]["notes"] if note.startswith("CPU of ")]
    assert [note.split(" (")[0] for note in spent] == ["CPU of ours", "CPU of OpenCode's way"], spent
    for note in spent:
        user, kernel = (int(part.split(" ms")[0]) for part in note.split(": ", 1)[1].split(", "))
        assert user + kernel > 0, note

    # both sides did the same work: our snapshot is what git ls-files sees, nested repos aside
    for when in ("baseline", "final"):
        check = tree["consistency"][when]
        assert check["ours_files"] > 200, check
        assert check["ours_files"] == check["git_files"], check
        assert check["only_ours"] == check["only_git"] == check["differing"] == 0, check
    assert "300" in proc.stdout  # the table was printed
    assert not list(work.iterdir()), "temporary trees are removed without --keep"


def test_the_session_replay_runs_every_hook_on_a_tiny_tree(tmp_path: Path) -> None:
    """`benchmarks.session_replay` end to end (real hooks, a real sidecar, the seed's git CLI),
    with a model time per response: every mode waits for each response, and ours makes a
    baseline, one checkpoint per batch that changed files and one per turn."""
    from benchmarks.session_data import SESSION

    model_s = 0.02
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.session_replay", "--files", "300", "--out", str(tmp_path),
         "--model-s", str(model_s)],
        cwd=REPO, capture_output=True, text=True, timeout=300, check=False, env={**os.environ, "TMPDIR": str(scratch)},
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    # the trees, the sidecar's state (it wrote there until it exited) and its flush folder are gone
    assert not list(scratch.iterdir())
    (result,) = tmp_path.glob("session-replay-300-model0.02s-*.json")
    data = json.loads(result.read_text())
    assert data["model_s"] == model_s
    assert data["checkpoints"] == {"shadowpoint": {"baseline": 1, "round": 22, "completion": 6}, "seed_commits": 27}

    def batches(calls_batches: Any) -> int:
        return sum(1 + sum(batches(c.subagent) for c in b.calls) for b in calls_batches)

    responses = sum(batches(turn.batches) + 1 for turn in SESSION)  # each batch, and each turn's answer
    for mode in ("none", "shadowpoint", "seed"):
        assert data["wall_s"][mode] >= responses * model_s, (mode, data["wall_s"])


def test_the_baseline_profile_times_a_baseline_without_touching_the_tree(tmp_path: Path) -> None:
    """`benchmarks.baseline_profile` on a small git repository: each run's phases and their
    medians are printed, the tree is left as it was and its scratch folder removed."""
    tree = tmp_path / "tree"
    for i in range(40):
        (tree / f"pkg{i % 4}").mkdir(parents=True, exist_ok=True)
        (tree / f"pkg{i % 4}" / f"mod{i}.py").write_text(f"value = {i}\n")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgSign=false"]
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "tree"]):
        subprocess.run([*git, *args], cwd=tree, check=True, capture_output=True)
    before = sorted((str(p.relative_to(tree)), p.stat().st_mtime_ns) for p in tree.rglob("*") if p.is_file())
    work = tmp_path / "work"
    work.mkdir()
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.baseline_profile", str(tree), "--runs", "2", "--workdir", str(work)],
        cwd=REPO, capture_output=True, text=True, timeout=300, check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stdout.count("baseline ready after") == 2
    medians = proc.stdout.split("medians over 2 runs", 1)[1]
    assert "parent _first_scan" in medians and "parent commit" in medians
    assert sorted((str(p.relative_to(tree)), p.stat().st_mtime_ns) for p in tree.rglob("*") if p.is_file()) == before
    assert not list(work.iterdir())


def test_the_sidecar_rounds_run_over_stdio_and_in_process(tmp_path: Path) -> None:
    """`benchmarks.sidecar_rounds` end to end on a tiny tree: every round is a checkpoint of a
    real sidecar (the baseline and one a round), the edited file got a line a round on each
    side, and each figure is printed."""
    from benchmarks.sidecar_rounds import deepest_file
    from benchmarks.treegen import generate

    tree = tmp_path / "tree"
    generate(tree, 200, seed=3)
    edited = tree / deepest_file(tree)
    before = edited.read_bytes()
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.sidecar_rounds", str(tree), "--rounds", "3", "--workdir", str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=300, check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    after = edited.read_bytes()
    assert after.startswith(before) and after[len(before):].count(b"\n# ") == 6
    out = proc.stdout
    assert "; 4 checkpoints" in out, out
    for label in ("over stdio: a round ", "round/begin ", "round/end ", "in process: a round "):
        assert label in out, out
    assert not list(tmp_path.glob("sp-sidecar-rounds-*")), "the docs dirs are removed"


def test_the_cold_probe_measures_a_round_warm_and_after_a_pause(tmp_path: Path) -> None:
    """`benchmarks.cold_probe` on a tiny tree with short pauses: every figure is there, the
    round's distinct functions were counted, the floor ran beside it, and its scratch folder
    is removed."""
    work = tmp_path / "work"
    work.mkdir()
    out = tmp_path / "cold.json"
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.cold_probe", "--size", "300", "--rounds", "2", "--pause", "0.01",
         "--short-pause", "0.005", "--workdir", str(work), "--json", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=300, check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    data = json.loads(out.read_text())
    assert sorted(int(n) for n in data["chains"]) == [50, 200, 800]
    assert all(c["warm_us"] > 0 and c["cold_us"] > 0 for c in data["chains"].values())
    assert sorted(int(n) for n in data["file_calls"]["blocks"]) == [20, 80]
    rounds = data["rounds"]
    assert rounds["files"] == 300
    assert min(rounds["back_to_back_ms"], rounds["after_short_pause_ms"], rounds["after_pause_ms"]) > 0
    # a round goes through the engine, the stager and the shadow repository: dozens of functions
    assert rounds["distinct_functions"] > 30 and rounds["distinct_builtins"] > 5
    assert rounds["calls"] >= rounds["distinct_functions"] + rounds["distinct_builtins"]
    # the floor ran beside the round (each of its commits read back: a wrong tree fails the run)
    floor = rounds["floor"]
    assert set(floor) == {"round_back_to_back_ms", "round_after_pause_ms", "floor_back_to_back_ms",
                          "floor_after_pause_ms"}
    assert min(floor.values()) > 0
    assert "cold penalty" in proc.stdout and "the floor" in proc.stdout
    assert not list(work.iterdir())


def test_the_cold_probe_interpolates_between_its_chains() -> None:
    from benchmarks.cold_probe import _interpolated

    points = {50: 100.0, 200: 400.0, 800: 1000.0}
    assert _interpolated(points, 50) == 100.0
    assert _interpolated(points, 125) == 250.0
    assert _interpolated(points, 500) == 700.0
    assert _interpolated(points, 20) == 40.0  # past the ends: the nearest line, extended
    assert _interpolated(points, 1100) == 1300.0
