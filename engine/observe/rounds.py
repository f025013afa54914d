"""`RoundRecorder`: what the tools of one round were and which paths edit tools reported.

Fed by the engine from round events (tool began/ended); at the round's end it yields a
`RoundRecord`, a plain value the stager turns into a plan. Runs on the engine thread of
its task; no locking of its own.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from shadowpoint.kinds import ToolKind

COMMAND_HINTS = ("command", "exec", "shell", "bash")
_TOOL_KINDS = {kind.value: kind for kind in ToolKind}  # a ToolKind is the str of its value


def tool_kind(tool: str, kind: ToolKind | None, read_only: frozenset[str]) -> ToolKind:
    """The kind of a tool: given, else from its name (PROTOCOL.md): read, command or edit."""
    given = _TOOL_KINDS.get(kind) if kind is not None else None
    if given is not None:  # a library caller may pass any string: others go by the name
        return given
    if tool in read_only:
        return ToolKind.READ
    lowered = tool.lower()
    if any(h in lowered for h in COMMAND_HINTS):
        return ToolKind.COMMAND
    return ToolKind.EDIT


@dataclass(frozen=True, slots=True)
class RoundRecord:
    """One finished round: did it mutate, what edit tools reported, did a command run."""

    number: int
    mutating: bool
    has_command: bool
    has_unreported_edit: bool
    edited: frozenset[tuple[str, str]]  # (root name, RepoPath)


@dataclass(slots=True)
class RoundRecorder:
    """Accumulates the tools of the current round."""

    number: int
    mutating: bool = False
    has_command: bool = False
    has_unreported_edit: bool = False
    # whether the watchers' rounds were opened with it (`Engine._open_watch_rounds`): a round
    # opened while the baseline builds opens them at its first tool that may change files
    watching: bool = False
    edited: set[tuple[str, str]] = field(default_factory=set)
    # what the request paths of this round's tool/begin events resolved to (`known_paths`)
    resolved: dict[str, tuple[str, str]] = field(default_factory=dict)
    _open_edits: dict[str, bool] = field(default_factory=dict)

    def tool_began(self, tool: str, kind: ToolKind, paths: Iterable[tuple[str, str]],
                   raw: Iterable[str] = ()) -> None:
        """`raw`: the request paths that `paths` resolved from, in the same order."""
        reported = self._note(kind, paths)
        if reported is not None:
            self._open_edits[tool] = bool(reported)
            self.resolved.update(zip(raw, reported, strict=False))

    def known_paths(self, raw: Iterable[str] | None) -> list[tuple[str, str]] | None:
        """The resolved paths of `raw` when a tool/begin of this round resolved every one of
        them (an edit tool's end names the paths its begin did), else None."""
        out = []
        for path in raw or ():
            found = self.resolved.get(path)
            if found is None:
                return None
            out.append(found)
        return out

    def tool_ended(self, tool: str, kind: ToolKind, paths: Iterable[tuple[str, str]]) -> None:
        reported = self._note(kind, paths)
        if reported is not None:
            if not reported and not self._open_edits.get(tool, False):
                self.has_unreported_edit = True
            self._open_edits.pop(tool, None)

    def _note(self, kind: ToolKind, paths: Iterable[tuple[str, str]]) -> list[tuple[str, str]] | None:
        """Record what a tool event says; the edit tool's reported paths, or None for others."""
        if kind is ToolKind.READ:
            return None
        self.mutating = True
        if kind is ToolKind.COMMAND:
            self.has_command = True
            return None
        reported = list(paths)
        self.edited.update(reported)
        return reported

    def finish(self) -> RoundRecord:
        # an edit tool that began without paths and never ended changed something unknown
        unreported = self.has_unreported_edit or any(not has_paths for has_paths in self._open_edits.values())
        return RoundRecord(self.number, self.mutating, self.has_command, unreported, frozenset(self.edited))
