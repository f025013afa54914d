"""The params of each sidecar method as a frozen dataclass: the wire's JSON checked and typed
before it reaches the engine.

One class per method; `parse(model, params)` answers the class's value or raises
`InvalidParamsError` with the message the sidecar has always given for that field
(PROTOCOL.md's `invalid_params`), the first wrong field in the order the fields are declared.
Each field carries its check in its metadata (`checked`): a plain function of the field's
wire name and its JSON value that answers the typed value or refuses. JSON has no strict
types of its own (`true` is not an integer, `1` is not a boolean); a missing field is checked
as null unless the field says what a missing one stands for. Unknown fields are ignored. Wire
names are the fields' names in camelCase unless a field names its own.

No pydantic here (it was, issue 11): the sidecar answers its first request without importing
it, ~80 ms of every sidecar's start. Used by `server.py` on the thread that runs the request.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from shadowpoint.errors import InvalidParamsError, UnknownCheckpointError
from shadowpoint.kinds import EditRestore, RestoreMode, Role, ToolKind

M = TypeVar("M", bound="Params")

Check = Callable[[str, Any], Any]


def checked(check: Check, *, wire: str | None = None, missing: Any = None) -> dict[str, Any]:
    """A field's metadata: checked by `check(wire_name, value)`; `missing` is what an absent
    field is checked as (null unless said otherwise); `wire` its JSON name when not the
    camelCase one."""
    return {"check": check, "wire": wire, "missing": missing}


def _refuse(message: str) -> InvalidParamsError:
    return InvalidParamsError(message)


def _text(key: str, value: object) -> str:
    """A non-empty string."""
    if not isinstance(value, str) or not value:
        raise _refuse(f"`{key}` must be a non-empty string.")
    return value


def _ms(key: str, value: object) -> int:
    """An integer (a ts, in milliseconds)."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise _refuse(f"`{key}` must be an integer (milliseconds).")
    return value


def _paths(key: str, value: object) -> tuple[str, ...] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(p, str) for p in value):
        raise _refuse(f"`{key}` must be a list of strings.")
    return tuple(value)


def _flag(key: str, value: object) -> bool:
    """true or false (missing is false: the fields say so; null is refused, as it always was)."""
    if not isinstance(value, bool):
        raise _refuse(f"`{key}` must be true or false.")
    return value


def _any(key: str, value: object) -> object:
    return value


def _tool_kind(key: str, value: object) -> ToolKind | None:
    if value is None:
        return None
    if value not in ("read", "edit", "command"):
        raise _refuse("`kind` must be read, edit or command.")
    return ToolKind(value)


def _ok(key: str, value: object) -> bool:
    return value is not False  # anything but an explicit false is success (a host that never sends `ok`)


def _message_text(key: str, value: object) -> str | None:
    if value is not None and not isinstance(value, str):
        raise _refuse("`text` must be a string.")
    return value


def _edited_text(key: str, value: object) -> str:
    if not isinstance(value, str):
        raise _refuse("`text` must be a string.")
    return value


def _role(key: str, value: object) -> Role:
    _text(key, value)
    if value == "user":
        return "user"
    if value == "assistant":
        return "assistant"
    raise _refuse("`role` must be user or assistant.")


def _edit_restore(key: str, value: object) -> EditRestore:
    word = _text(key, value)
    try:
        return EditRestore(word)
    except ValueError:
        raise _refuse(f"`{key}` must be chat or all.") from None


def _favorites(key: str, value: object) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(k, str) for k in value):
        raise _refuse("`keepFavorites` must be a list of task ids.")
    return list(value)


def _roots(key: str, value: object) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(r, str) for r in value):
        raise _refuse("`roots` must be a list of absolute paths.")
    return list(value)


def _overrides(key: str, value: object) -> dict[str, Any]:
    value = value or {}  # null, false, 0, "" and [] mean no overrides, as they always did
    if not isinstance(value, dict):
        raise _refuse("`settings` must be an object.")
    return value


@dataclass(frozen=True, slots=True)
class Params:
    """Base of every method's params."""



@dataclass(frozen=True, slots=True)
class TaskParams(Params):
    """task/retry, task/disable, round/begin, checkpoint/list, checkpoint/undoRestore,
    checkpoint/redoRestore, task/delete: the task only."""

    task_id: str = field(metadata=checked(_text))


@dataclass(frozen=True, slots=True)
class TaskStartParams(Params):
    task_id: str = field(metadata=checked(_text))
    ts: int = field(metadata=checked(_ms, missing=0))


@dataclass(frozen=True, slots=True)
class TsParams(Params):
    """round/end, task/complete, task/compacted, checkpoint/viewChanges."""

    task_id: str = field(metadata=checked(_text))
    ts: int = field(metadata=checked(_ms))


@dataclass(frozen=True, slots=True)
class ToolBeginParams(Params):
    task_id: str = field(metadata=checked(_text))
    tool: str = field(metadata=checked(_text))
    kind: ToolKind | None = field(metadata=checked(_tool_kind))
    paths: tuple[str, ...] | None = field(metadata=checked(_paths))


@dataclass(frozen=True, slots=True)
class ToolEndParams(ToolBeginParams):
    ok: bool = field(metadata=checked(_ok))


@dataclass(frozen=True, slots=True)
class MessageAddParams(Params):
    role: Role = field(metadata=checked(_role))
    text: str | None = field(metadata=checked(_message_text))
    task_id: str = field(metadata=checked(_text))
    ts: int = field(metadata=checked(_ms))


@dataclass(frozen=True, slots=True)
class DiffParams(Params):
    task_id: str = field(metadata=checked(_text))
    from_ts: int = field(metadata=checked(_ms, wire="from"))
    to_ts: object = field(metadata=checked(_any, wire="to"))

    @property
    def to(self) -> int | None:
        """`to` as a ts (None: the workspace now).

        Raises:
            UnknownCheckpointError: not an integer (no checkpoint has such a ts), as the engine
                answers any `to` that names no checkpoint.
        """
        to = self.to_ts
        if to is None or (isinstance(to, int) and not isinstance(to, bool)):
            return to
        raise UnknownCheckpointError(f"No checkpoint at ts={to!r}.")


@dataclass(frozen=True, slots=True)
class RestoreParams(Params):
    task_id: str = field(metadata=checked(_text))
    ts: int = field(metadata=checked(_ms))
    mode: str = field(metadata=checked(_text))
    paths: tuple[str, ...] | None = field(metadata=checked(_paths))
    dry_run: bool = field(metadata=checked(_flag, missing=False))
    keep_outside_edits: bool = field(metadata=checked(_flag, missing=False))

    @property
    def restore_mode(self) -> RestoreMode:
        """`mode` as the engine takes it (checked after the other fields, as it always was).

        Raises:
            InvalidParamsError: not files, task or both.
        """
        if self.mode not in _RESTORE_MODES:
            raise InvalidParamsError(f"mode must be files, task or both, not {self.mode!r}.")
        return RestoreMode(self.mode)


_RESTORE_MODES = frozenset(RestoreMode)


@dataclass(frozen=True, slots=True)
class RestoreSafetyParams(Params):
    """checkpoint/restoreSafety (the CLI's, not in PROTOCOL.md)."""

    task_id: str = field(metadata=checked(_text))
    n: int = field(metadata=checked(_ms))
    paths: tuple[str, ...] | None = field(metadata=checked(_paths))
    dry_run: bool = field(metadata=checked(_flag, missing=False))
    keep_outside_edits: bool = field(metadata=checked(_flag, missing=False))


@dataclass(frozen=True, slots=True)
class DiffSafetyParams(Params):
    """checkpoint/diffSafety (the CLI's, not in PROTOCOL.md)."""

    task_id: str = field(metadata=checked(_text))
    n: int = field(metadata=checked(_ms))


@dataclass(frozen=True, slots=True)
class ForkParams(Params):
    task_id: str = field(metadata=checked(_text))
    ts: int = field(metadata=checked(_ms))
    new_task_id: str = field(metadata=checked(_text))


@dataclass(frozen=True, slots=True)
class MessageEditParams(Params):
    restore: EditRestore = field(metadata=checked(_edit_restore))
    text: str = field(metadata=checked(_edited_text))
    task_id: str = field(metadata=checked(_text))
    ts: int = field(metadata=checked(_ms))


@dataclass(frozen=True, slots=True)
class DeleteAllParams(Params):
    keep_favorites: list[str] = field(metadata=checked(_favorites, missing=[]))


@dataclass(frozen=True, slots=True)
class InitializeParams(Params):
    roots: list[str] = field(metadata=checked(_roots))
    # PROTOCOL.md `Settings`: checked by `Settings` itself once mapped to its names
    settings: dict[str, Any] = field(metadata=checked(_overrides))


@dataclass(frozen=True, slots=True)
class NoParams(Params):
    """shutdown, sidecar/status, sidecar/stop: nothing (whatever is sent is ignored)."""


def _camel(name: str) -> str:
    first, *rest = name.split("_")
    return first + "".join(word.capitalize() for word in rest)


_Fields = tuple[tuple[str, str, Check, Any], ...]
_FIELDS: dict[type[Params], _Fields] = {}


def _fields(model: type[Params]) -> _Fields:
    """Each field of `model` in declaration order: (name, wire name, check, missing)."""
    found = _FIELDS.get(model)
    if found is None:
        found = _FIELDS[model] = tuple(
            (f.name, f.metadata["wire"] or _camel(f.name), f.metadata["check"], f.metadata["missing"])
            for f in dataclasses.fields(model))
    return found


def parse(model: type[M], params: dict[str, Any]) -> M:
    """`params` (the request's JSON object) as `model`.

    Raises:
        InvalidParamsError: a field is missing or wrong; the message names the first one.
    """
    values = {name: check(wire, params[wire] if wire in params else missing)
              for name, wire, check, missing in _fields(model)}
    return model(**values)
