"""The stager's rules (SPEC §4), without a repository or a watcher: each fallback to a rescan,
and each case where a healthy watcher is trusted."""

from __future__ import annotations

import subprocess
import sys

import pytest

from shadowpoint.stage.stager import (
    Decision,
    RootFacts,
    StagePlan,
    WatchView,
    is_rules_file,
    round_plan,
    safety_plan,
    staging_plan,
)
from shadowpoint.workspace import RepoPath

A, B, G = RepoPath("a.txt"), RepoPath("src/b.py"), RepoPath("sub/.gitignore")
EDITED = frozenset({A})
HEALTHY = WatchView(flushed=True, healthy=True, paths=frozenset({B}))
FRESH = RootFacts(scanned=True, watched_since_scan=True)


def test_without_a_watcher_only_unreported_changes_rescan() -> None:
    assert round_plan(EDITED, False, None, FRESH) == Decision(StagePlan(forced=EDITED))
    decision = round_plan(EDITED, True, None, FRESH)
    assert decision.plan == StagePlan(forced=EDITED, rescan=True) and decision.rescan_because


def test_a_healthy_watcher_is_authoritative() -> None:
    assert round_plan(EDITED, True, HEALTHY, FRESH) == Decision(StagePlan(forced=EDITED, watched=frozenset({B})))
    nothing = WatchView(flushed=True, healthy=True)
    assert round_plan(frozenset(), True, nothing, FRESH) == Decision(StagePlan()), \
        "a command that changed nothing reuses the snapshot"


@pytest.mark.parametrize("watch, why", [
    (WatchView(flushed=False, healthy=True, paths=frozenset({B})), "flush barrier timed out"),
    (WatchView(flushed=True, healthy=False, reasons=("queue overflow",)), "queue overflow"),
    (WatchView(flushed=False, healthy=False, reasons=("observer died", "no watch on d/")),
     "observer died; no watch on d/"),
])
def test_a_watcher_that_cannot_prove_it_saw_everything_rescans(watch: WatchView, why: str) -> None:
    for unknown in (True, False):
        decision = round_plan(EDITED, unknown, watch, FRESH)
        assert decision == Decision(StagePlan(forced=EDITED, rescan=True), why)


def test_a_watcher_started_after_the_latest_scan_rescans() -> None:
    decision = round_plan(EDITED, False, HEALTHY, RootFacts(scanned=True, watched_since_scan=False))
    assert decision == Decision(StagePlan(forced=EDITED, rescan=True), "the watcher started after the latest scan")


def test_a_changed_rules_file_rescans_and_keeps_what_was_recorded() -> None:
    watch = WatchView(flushed=True, healthy=True, paths=frozenset({B, G}))
    decision = round_plan(EDITED, True, watch, FRESH)
    assert decision.plan == StagePlan(forced=EDITED, watched=frozenset({B, G}), rescan=True)
    assert decision.rescan_because == "an ignore or attributes file changed"


@pytest.mark.parametrize("name, rules", [
    (".gitignore", True), ("a/b/.gitattributes", True), (".gitmodules", True), (".git", True),
    ("a/.git", True), ("gitignore", False), ("a/.gitignore.bak", False), ("README.md", False),
])
def test_rules_files(name: str, rules: bool) -> None:
    assert is_rules_file(RepoPath(name)) is rules


def test_safety_plan() -> None:
    assert safety_plan(EDITED, HEALTHY, FRESH) == StagePlan(forced=EDITED, watched=frozenset({B}))
    rescan = StagePlan(forced=EDITED, rescan=True)
    assert safety_plan(EDITED, None, FRESH) == rescan
    assert safety_plan(EDITED, HEALTHY, RootFacts(scanned=False)) == rescan
    assert safety_plan(EDITED, WatchView(flushed=False, healthy=True), FRESH) == rescan
    assert safety_plan(EDITED, WatchView(flushed=True, healthy=False), FRESH) == rescan
    assert safety_plan(EDITED, WatchView(flushed=True, healthy=True, paths=frozenset({G})), FRESH) == rescan
    # a change between the latest scan and the watcher's start is unknown to it
    assert safety_plan(EDITED, HEALTHY, RootFacts(watched_since_scan=False)) == rescan


def test_safety_plan_vouches_for_what_the_watcher_reports_and_did_not_record() -> None:
    """Every forced path is staged; the watcher vouches for those it would have reported and did
    not, not for one it recorded nor one it may not see (untracked, excluded)."""
    quiet, recorded, hidden = RepoPath("quiet.py"), B, RepoPath(".env")
    forced = frozenset({quiet, recorded, hidden})
    sees = {quiet, recorded}.__contains__
    assert safety_plan(forced, HEALTHY, FRESH, sees) == StagePlan(forced=forced, watched=frozenset({B}),
                                                                  vouched=frozenset({quiet}))
    # an unhealthy watcher proves nothing: everything forced, and a rescan
    sick = WatchView(flushed=True, healthy=False, paths=frozenset({B}))
    assert safety_plan(forced, sick, FRESH, sees) == StagePlan(forced=forced, rescan=True)
    assert safety_plan(forced, WatchView(flushed=False, healthy=True), FRESH, sees) == \
        StagePlan(forced=forced, rescan=True)


def test_staging_plan() -> None:
    plan = StagePlan(forced=EDITED, watched=frozenset({B}))
    hidden = frozenset({RepoPath("node_modules/x/index.js")})
    assert staging_plan(plan, RootFacts(scanned=False), True, hidden) == StagePlan(
        forced=EDITED, watched=frozenset({B}), rescan=True), "a root this process never scanned rescans"
    assert staging_plan(plan, FRESH, True, hidden) == StagePlan(forced=EDITED, watched=frozenset({B}) | hidden)
    assert staging_plan(plan, FRESH, False, hidden) == plan, "without a watcher the round names its paths"
    rescan = StagePlan(forced=EDITED, rescan=True)
    assert staging_plan(rescan, FRESH, True, hidden) == rescan, "a rescan looks at everything anyway"
    assert staging_plan(plan, FRESH, True, frozenset()) == plan


def test_merge() -> None:
    a = StagePlan(forced=frozenset({A}), watched=frozenset({B}))
    b = StagePlan(watched=frozenset({G}), rescan=True)
    assert a.merge(b) == StagePlan(forced=frozenset({A}), watched=frozenset({B, G}), rescan=True)
    assert StagePlan().is_empty and not a.is_empty


def test_the_stager_needs_neither_pygit2_nor_watchdog() -> None:
    code = "import sys, shadowpoint.stage.stager; print(sorted(m for m in ('pygit2', 'watchdog') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
