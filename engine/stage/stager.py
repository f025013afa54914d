"""The stager's rules (SPEC §4) as pure functions: what a root stages at a round's end, for a
safety checkpoint, and once the root's state is known. No I/O and no pygit2 or watchdog: the
root gathers the facts (`WatchView`, `RootFacts`), these functions decide, the scanner carries
the plan out. Every fallback to a whole-workspace rescan is decided here, with its reason.

| the round recorded | the watcher says | staged |
|---|---|---|
| edit tools' paths only | anything | those paths (forced past ignore rules) and what it recorded |
| a command, or an edit without paths | healthy, running since the latest scan | what it recorded (maybe nothing) |
| a command, or an edit without paths | no watcher | a rescan |
| anything | flush barrier missed, overflow, a folder it could not watch | a rescan |
| anything | started after the latest scan (a resumed task) | a rescan |
| anything | an ignore or attributes file changed | a rescan (it may re-include what was skipped) |
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from shadowpoint.workspace import RepoPath, is_git_component

RULES_FILES = frozenset({".gitignore", ".gitattributes", ".gitmodules"})


@dataclass(frozen=True, slots=True)
class StagePlan:
    """Work for one root at a round's end: nothing is read until `Scanner.stage` runs."""

    forced: frozenset[RepoPath] = frozenset()
    watched: frozenset[RepoPath] = frozenset()
    rescan: bool = False
    # forced paths a healthy watcher recorded no change of (a safety checkpoint's): their stat,
    # if still the snapshot's, proves them unchanged even when too recent to prove it alone
    vouched: frozenset[RepoPath] = frozenset()

    @property
    def is_empty(self) -> bool:
        return not (self.forced or self.watched or self.rescan)

    def merge(self, other: StagePlan) -> StagePlan:
        """Both plans' work (a failed commit's paths carried into the next round)."""
        return StagePlan(forced=self.forced | other.forced, watched=self.watched | other.watched,
                         rescan=self.rescan or other.rescan)


@dataclass(frozen=True, slots=True)
class WatchView:
    """What a root's watcher says at a round boundary."""

    flushed: bool  # its flush barrier passed: every event of a change made before is in
    healthy: bool  # no overflow, no folder it failed to watch, its threads alive
    paths: frozenset[RepoPath] = frozenset()  # what it recorded since the last round
    reasons: tuple[str, ...] = ()  # why it is not healthy


@dataclass(frozen=True, slots=True)
class RootFacts:
    """What the root knows about its tracked set."""

    scanned: bool = True  # this process has scanned the whole root at least once
    watched_since_scan: bool = True  # the watcher already ran when the latest whole scan began


@dataclass(frozen=True, slots=True)
class Decision:
    plan: StagePlan
    rescan_because: str | None = None  # why the plan rescans, for the log; None when it does not


def is_rules_file(path: RepoPath) -> bool:
    """A file whose change can re-include (or exclude) paths the watcher skipped."""
    name = path.rsplit("/", 1)[-1]
    return name in RULES_FILES or is_git_component(name)


def round_plan(forced: frozenset[RepoPath], unknown_changes: bool, watch: WatchView | None,
               facts: RootFacts) -> Decision:
    """A round's plan for one root. `forced`: the paths its edit tools reported; `unknown_changes`:
    it ran a command or an edit tool that reported no path (or it is a completion); `watch`:
    None when the root has no watcher."""
    if watch is None:
        return Decision(StagePlan(forced=forced, rescan=unknown_changes),
                        "no watcher, and changes nobody reported" if unknown_changes else None)
    if not (watch.flushed and watch.healthy):
        return Decision(StagePlan(forced=forced, rescan=True), "; ".join(watch.reasons) or "flush barrier timed out")
    if not facts.watched_since_scan:
        # what happened between the latest scan and the watcher's start is unknown to it
        return Decision(StagePlan(forced=forced, rescan=True), "the watcher started after the latest scan")
    # A healthy watcher is authoritative: what it recorded is all that changed, so a command
    # round that recorded nothing reuses the snapshot, O(1).
    if any(is_rules_file(p) for p in watch.paths):
        return Decision(StagePlan(forced=forced, watched=watch.paths, rescan=True),
                        "an ignore or attributes file changed")
    return Decision(StagePlan(forced=forced, watched=watch.paths))


def safety_plan(forced: frozenset[RepoPath], watch: WatchView | None, facts: RootFacts,
                reported: Callable[[RepoPath], bool] | None = None) -> StagePlan:
    """What a safety checkpoint (or a compare with the workspace) stages: with a healthy watcher
    only what it recorded since the last round, O(changes); else a rescan. `forced` (the task's
    edited paths, the paths to restore) is always looked at. Those that `reported` says the
    watcher reports every change of (tracked, not excluded) and that it recorded none of are
    vouched for: their unchanged stat is proof enough, even when too recent to prove it alone (an
    agent's file, edited a moment ago, was hashed again each time), as git trusts fsmonitor over
    a racy stat (SPEC §4). The stat is still compared: a change no event reported (a network
    file system) is never taken for the snapshot's content."""
    if watch is not None and facts.scanned and facts.watched_since_scan and watch.flushed and watch.healthy \
            and not any(is_rules_file(p) for p in watch.paths):
        vouched = frozenset(p for p in forced if p not in watch.paths and reported(p)) if reported else frozenset()
        return StagePlan(forced=forced, watched=watch.paths, vouched=vouched)
    return StagePlan(forced=forced, rescan=True)


def staging_plan(plan: StagePlan, facts: RootFacts, has_watcher: bool,
                 excluded_tracked: frozenset[RepoPath]) -> StagePlan:
    """The plan a root stages once its own state is known: a root this process never scanned
    rescans; a watched root looks at the tracked files its exclusions hide from the watcher
    (force-added ones, e.g. in node_modules/) as well. Without that, a command changing a
    force-added node_modules/ file was missed (tests/property/test_model.py)."""
    if not facts.scanned and not plan.rescan:
        return StagePlan(forced=plan.forced, watched=plan.watched, rescan=True)
    if has_watcher and not plan.rescan and excluded_tracked:
        return replace(plan, watched=plan.watched | excluded_tracked)
    return plan
