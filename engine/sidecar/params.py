"""The params of each sidecar method as a pydantic model: the wire's JSON checked and typed
before it reaches the engine.

One model per method (`PARAMS` maps the names); `parse(model, params)` answers the model or
raises `InvalidParamsError` with the message the sidecar has always given for that field
(PROTOCOL.md's `invalid_params`), the first wrong field in the order the fields are declared.
Each field's check is a plain function run before pydantic's own (`BeforeValidator`): JSON
has no strict types of its own (`true` is not an integer, `1` is not a boolean), and a missing
field is checked as null so that it gets the same message. Used by `server.py` on the thread
that runs the request; only the sidecar imports this module (the hook paths never do).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, TypeVar

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError
from pydantic.alias_generators import to_camel
from pydantic_core import PydanticCustomError

from shadowpoint.errors import InvalidParamsError, UnknownCheckpointError
from shadowpoint.kinds import EditRestore, RestoreMode, Role, ToolKind

M = TypeVar("M", bound="Params")


def _refuse(message: str) -> PydanticCustomError:
    return PydanticCustomError("invalid_params", message)


def _check_text(key: str, value: object) -> str:
    if not isinstance(value, str) or not value:
        raise _refuse(f"`{key}` must be a non-empty string.")
    return value


def _text(key: str) -> BeforeValidator:
    """A non-empty string."""
    return BeforeValidator(lambda value: _check_text(key, value))


def _ms(key: str, *, default: int | None = None) -> BeforeValidator:
    """An integer (a ts, in milliseconds); `default` stands for a missing one (not for null)."""

    def check(value: object) -> object:
        if value is _MISSING and default is not None:
            return default
        if not isinstance(value, int) or isinstance(value, bool):
            raise _refuse(f"`{key}` must be an integer (milliseconds).")
        return value

    return BeforeValidator(check)


def _paths(key: str) -> BeforeValidator:
    def check(value: object) -> object:
        if value is None:
            return None
        if not isinstance(value, list) or not all(isinstance(p, str) for p in value):
            raise _refuse(f"`{key}` must be a list of strings.")
        return tuple(value)

    return BeforeValidator(check)


def _flag(key: str) -> BeforeValidator:
    """true or false; missing is false (null is refused, as it always was)."""

    def check(value: object) -> object:
        if value is _MISSING:
            return False
        if not isinstance(value, bool):
            raise _refuse(f"`{key}` must be true or false.")
        return value

    return BeforeValidator(check)


def _one_of(key: str, words: str, choices: Callable[[str], object]) -> BeforeValidator:
    """A non-empty string naming one of `choices` (an enum's values)."""
    def check(value: object) -> object:
        word = _check_text(key, value)
        try:
            return choices(word)
        except ValueError:
            raise _refuse(f"`{key}` must be {words}.") from None

    return BeforeValidator(check)


class _Missing:
    """A field the request left out (told apart from an explicit null where that matters)."""

    def __repr__(self) -> str:
        return "<missing>"


_MISSING: Any = _Missing()
_NULL: Any = None  # a missing field is checked as null


def _any(value: object) -> object:
    return value


def _tool_kind(value: object) -> object:
    if value is not None and value not in ("read", "edit", "command"):
        raise _refuse("`kind` must be read, edit or command.")
    return ToolKind(value) if value is not None else None


class Params(BaseModel):
    """Base of every method's params: unknown fields are ignored, values are frozen."""

    model_config = ConfigDict(frozen=True, extra="ignore", validate_default=True, alias_generator=to_camel)


TaskId = Annotated[str, _text("taskId")]


class TaskParams(Params):
    """task/retry, task/disable, round/begin, checkpoint/list, checkpoint/undoRestore,
    checkpoint/redoRestore, task/delete: the task only."""

    task_id: TaskId = Field(default=_NULL)


class TaskStartParams(Params):
    task_id: TaskId = Field(default=_NULL)
    ts: Annotated[int, _ms("ts", default=0)] = Field(default=_MISSING)


class TsParams(Params):
    """round/end, task/complete, task/compacted, checkpoint/viewChanges."""

    task_id: TaskId = Field(default=_NULL)
    ts: Annotated[int, _ms("ts")] = Field(default=_NULL)


class ToolBeginParams(Params):
    task_id: TaskId = Field(default=_NULL)
    tool: Annotated[str, _text("tool")] = Field(default=_NULL)
    kind: Annotated[ToolKind | None, BeforeValidator(_tool_kind)] = Field(default=_NULL)
    paths: Annotated[tuple[str, ...] | None, _paths("paths")] = Field(default=_NULL)


class ToolEndParams(ToolBeginParams):
    # anything but an explicit false is success (a host that never sends `ok`)
    ok: Annotated[bool, BeforeValidator(lambda v: v is not False)] = Field(default=_NULL)


def _message_text(value: object) -> object:
    if value is not None and not isinstance(value, str):
        raise _refuse("`text` must be a string.")
    return value


def _edited_text(value: object) -> object:
    if not isinstance(value, str):
        raise _refuse("`text` must be a string.")
    return value


def _role(value: object) -> object:
    _check_text("role", value)
    if value not in ("user", "assistant"):
        raise _refuse("`role` must be user or assistant.")
    return value


class MessageAddParams(Params):
    role: Annotated[Role, BeforeValidator(_role)] = Field(default=_NULL)
    text: Annotated[str | None, BeforeValidator(_message_text)] = Field(default=_NULL)
    task_id: TaskId = Field(default=_NULL)
    ts: Annotated[int, _ms("ts")] = Field(default=_NULL)


class DiffParams(Params):
    task_id: TaskId = Field(default=_NULL)
    from_ts: Annotated[int, _ms("from")] = Field(alias="from", default=_NULL)
    to_ts: Annotated[object, BeforeValidator(_any)] = Field(alias="to", default=_NULL)

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


class RestoreParams(Params):
    task_id: TaskId = Field(default=_NULL)
    ts: Annotated[int, _ms("ts")] = Field(default=_NULL)
    mode: Annotated[str, _text("mode")] = Field(default=_NULL)
    paths: Annotated[tuple[str, ...] | None, _paths("paths")] = Field(default=_NULL)
    dry_run: Annotated[bool, _flag("dryRun")] = Field(default=_MISSING)
    keep_outside_edits: Annotated[bool, _flag("keepOutsideEdits")] = Field(default=_MISSING)

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


class RestoreSafetyParams(Params):
    """checkpoint/restoreSafety (the CLI's, not in PROTOCOL.md)."""

    task_id: TaskId = Field(default=_NULL)
    n: Annotated[int, _ms("n")] = Field(default=_NULL)
    paths: Annotated[tuple[str, ...] | None, _paths("paths")] = Field(default=_NULL)
    dry_run: Annotated[bool, _flag("dryRun")] = Field(default=_MISSING)
    keep_outside_edits: Annotated[bool, _flag("keepOutsideEdits")] = Field(default=_MISSING)


class DiffSafetyParams(Params):
    """checkpoint/diffSafety (the CLI's, not in PROTOCOL.md)."""

    task_id: TaskId = Field(default=_NULL)
    n: Annotated[int, _ms("n")] = Field(default=_NULL)


class ForkParams(Params):
    task_id: TaskId = Field(default=_NULL)
    ts: Annotated[int, _ms("ts")] = Field(default=_NULL)
    new_task_id: Annotated[str, _text("newTaskId")] = Field(default=_NULL)


class MessageEditParams(Params):
    restore: Annotated[EditRestore, _one_of("restore", "chat or all", EditRestore)] = Field(default=_NULL)
    text: Annotated[str, BeforeValidator(_edited_text)] = Field(default=_NULL)
    task_id: TaskId = Field(default=_NULL)
    ts: Annotated[int, _ms("ts")] = Field(default=_NULL)


def _favorites(value: object) -> object:
    if value is _MISSING:
        return []
    if not isinstance(value, list) or not all(isinstance(k, str) for k in value):
        raise _refuse("`keepFavorites` must be a list of task ids.")
    return value


class DeleteAllParams(Params):
    keep_favorites: Annotated[list[str], BeforeValidator(_favorites)] = Field(default=_MISSING)


def _roots(value: object) -> object:
    if not isinstance(value, list) or not all(isinstance(r, str) for r in value):
        raise _refuse("`roots` must be a list of absolute paths.")
    return value


def _overrides(value: object) -> object:
    value = value or {}  # null, false, 0, "" and [] mean no overrides, as they always did
    if not isinstance(value, dict):
        raise _refuse("`settings` must be an object.")
    return value


class InitializeParams(Params):
    roots: Annotated[list[str], BeforeValidator(_roots)] = Field(default=_NULL)
    # PROTOCOL.md `Settings`: checked by `Settings` itself once mapped to its names
    settings: Annotated[dict[str, Any], BeforeValidator(_overrides)] = Field(default=_NULL)


class NoParams(Params):
    """shutdown, sidecar/status, sidecar/stop: nothing (whatever is sent is ignored)."""


def parse(model: type[M], params: dict[str, Any]) -> M:
    """`params` (the request's JSON object) as `model`.

    Raises:
        InvalidParamsError: a field is missing or wrong; the message names the first one.
    """
    try:
        return model.model_validate(params)
    except ValidationError as exc:
        first = exc.errors(include_url=False, include_context=False, include_input=False)[0]
        raise InvalidParamsError(first["msg"]) from None
