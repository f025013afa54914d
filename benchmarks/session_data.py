"""A realistic Claude Code session written down as data: 6 turns, 60 tool calls, one subagent.

Each turn is a prompt and its batches (one model response's parallel tool calls, closed by
`PostToolBatch`); each tool call names its tool, its input and the file changes it makes
(`Effect`s), which the replayer applies between the call's PreToolUse and PostToolUse. Most
shell commands change nothing (tests, grep, status), as in real sessions. Paths `@N` stand
for the N-th existing source file of the generated tree (`resolve`), others are new files.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Effect:
    """One change a tool makes: `write` (create or replace), `append`, `delete` or `move`."""

    op: str
    path: str
    data: str = ""  # content for write/append, destination for move


@dataclass(frozen=True, slots=True)
class ToolCall:
    tool: str
    input: dict[str, str]
    effects: tuple[Effect, ...] = ()
    subagent: tuple[Batch, ...] = ()  # an Agent call's own batches (their events carry agent_id)


@dataclass(frozen=True, slots=True)
class Batch:
    calls: tuple[ToolCall, ...]


@dataclass(frozen=True, slots=True)
class Turn:
    prompt: str
    batches: tuple[Batch, ...] = field(default_factory=tuple)


def read(path: str) -> ToolCall:
    return ToolCall("Read", {"file_path": path})


def grep(pattern: str) -> ToolCall:
    return ToolCall("Grep", {"pattern": pattern})


def glob(pattern: str) -> ToolCall:
    return ToolCall("Glob", {"pattern": pattern})


def bash(command: str, *effects: Effect) -> ToolCall:
    return ToolCall("Bash", {"command": command, "description": command[:40]}, effects)


def edit(path: str, line: str) -> ToolCall:
    return ToolCall("Edit", {"file_path": path, "old_string": "", "new_string": line}, (Effect("append", path, line),))


def write(path: str, text: str) -> ToolCall:
    return ToolCall("Write", {"file_path": path, "content": text}, (Effect("write", path, text),))


def batch(*calls: ToolCall) -> Batch:
    return Batch(calls)


SUBAGENT = ToolCall("Agent", {"description": "add helpers", "prompt": "write the helpers module",
                              "subagent_type": "general-purpose"}, subagent=(
    batch(read("@2"), read("@3"), grep("def helper")),
    batch(read("@4"), edit("@2", "# helper hook added by the subagent\n")),
    batch(write("feature/helpers.py", "def helper(x):\n    return x * 2\n"), bash("python -m pytest -q feature")),
))

SESSION: tuple[Turn, ...] = (
    Turn("Find where requests are parsed", (
        batch(read("@0"), read("@1"), read("@7"), grep("parse_request")),
        batch(glob("**/*.py"), read("@5"), read("@6")),
        batch(bash("git status --short")),
        batch(grep("class Request"), bash("ls -la src")),
    )),
    Turn("Add a feature module and wire it in", (
        batch(read("@0"), grep("import")),
        batch(write("feature/__init__.py", ""), write("feature/module.py", "def feature():\n    return 42\n")),
        batch(edit("@0", "from feature.module import feature\n"), edit("@1", "FEATURE = True\n")),
        batch(bash("python -m pytest -q")),
        batch(edit("@0", "feature()\n")),
        batch(bash("python -m pytest -q"), bash("git diff --stat")),
    )),
    Turn("Let a subagent write the helpers", (
        batch(SUBAGENT),
        batch(read("feature/helpers.py"), bash("git diff")),
    )),
    Turn("Refactor the three handlers", (
        batch(read("@3"), read("@4")),
        batch(edit("@3", "# handler one refactored\n"), edit("@4", "# handler two refactored\n"),
              edit("@5", "# handler three refactored\n")),
        batch(bash("ruff check ."), bash("sed -i 's/old/new/' @6", Effect("append", "@6", "# sed ran\n"))),
        batch(read("@6"), bash("git status --short")),
    )),
    Turn("Build it and clean up", (
        batch(bash("make build", Effect("write", "build/out.bin", "\x7fELF" + "x" * 4000),
                   Effect("write", "build/tmp.o", "tmp"))),
        batch(bash("rm build/tmp.o", Effect("delete", "build/tmp.o")), read("@7"), bash("ls build")),
        batch(read("@8"), grep("TODO"), bash("python -m pytest -q")),
        batch(edit("@7", "# built\n"), ToolCall("TodoWrite", {"todos": "[]"})),
        batch(bash("git status --short")),
    )),
    Turn("Rename the helpers and write notes", (
        batch(read("feature/helpers.py"), edit("@8", "# uses feature.util\n")),
        batch(write("docs/NOTES.md", "# Notes\n\nThe feature module.\n"), bash("git status")),
        batch(bash("python -m pytest -q"),
              bash("git mv feature/helpers.py feature/util.py",
                   Effect("move", "feature/helpers.py", "feature/util.py"))),
        batch(edit("@9", "# final touch\n"), bash("python -m pytest -q")),
        batch(read("@9"), glob("docs/*.md"), bash("git diff --stat")),
    )),
)


def all_calls(turns: tuple[Turn, ...] = SESSION) -> list[ToolCall]:
    """Every tool call, a subagent's included."""
    out: list[ToolCall] = []

    def walk(batches: tuple[Batch, ...]) -> None:
        for b in batches:
            for c in b.calls:
                out.append(c)
                walk(c.subagent)

    for t in turns:
        walk(t.batches)
    return out
