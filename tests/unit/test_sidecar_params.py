"""Unit tests for `shadowpoint.sidecar.params`: each method's params parse into typed values,
and a missing or wrong field gets the message the sidecar gave before the models (the hand
checks it replaced), the first wrong field in the order they were checked."""

from __future__ import annotations

from typing import Any

import pytest

from shadowpoint.errors import InvalidParamsError, UnknownCheckpointError
from shadowpoint.kinds import EditRestore, RestoreMode, ToolKind
from shadowpoint.sidecar.params import (
    DeleteAllParams,
    DiffParams,
    ForkParams,
    InitializeParams,
    MessageAddParams,
    MessageEditParams,
    Params,
    RestoreParams,
    TaskParams,
    TaskStartParams,
    ToolEndParams,
    TsParams,
    parse,
)

T = "t1"
NON_EMPTY = "`{}` must be a non-empty string."
MS = "`{}` must be an integer (milliseconds)."
FLAG = "`{}` must be true or false."


@pytest.mark.parametrize(("model", "params", "message"), [
    (TaskParams, {}, NON_EMPTY.format("taskId")),
    (TaskParams, {"taskId": ""}, NON_EMPTY.format("taskId")),
    (TaskParams, {"taskId": 5}, NON_EMPTY.format("taskId")),
    (TaskStartParams, {"taskId": T, "ts": None}, MS.format("ts")),
    (TaskStartParams, {"taskId": T, "ts": True}, MS.format("ts")),
    (TaskStartParams, {"taskId": T, "ts": 1.5}, MS.format("ts")),
    (TsParams, {"taskId": T}, MS.format("ts")),
    (TsParams, {"taskId": T, "ts": "10"}, MS.format("ts")),
    (ToolEndParams, {"taskId": T}, NON_EMPTY.format("tool")),
    (ToolEndParams, {"taskId": T, "tool": "x", "kind": "write"}, "`kind` must be read, edit or command."),
    (ToolEndParams, {"taskId": T, "tool": "x", "paths": "a.txt"}, "`paths` must be a list of strings."),
    (ToolEndParams, {"taskId": T, "tool": "x", "paths": ["a", 1]}, "`paths` must be a list of strings."),
    (MessageAddParams, {"taskId": T, "ts": 1}, NON_EMPTY.format("role")),
    (MessageAddParams, {"taskId": T, "ts": 1, "role": "system"}, "`role` must be user or assistant."),
    (MessageAddParams, {"taskId": T, "ts": 1, "role": "user", "text": 3}, "`text` must be a string."),
    (MessageAddParams, {"taskId": T, "role": "user", "text": 3}, "`text` must be a string."),  # text before ts
    (DiffParams, {"taskId": T, "from": None}, MS.format("from")),
    (RestoreParams, {"taskId": T, "ts": 1}, NON_EMPTY.format("mode")),
    (RestoreParams, {"taskId": T, "ts": 1, "mode": "files", "dryRun": None}, FLAG.format("dryRun")),
    (RestoreParams, {"taskId": T, "ts": 1, "mode": "files", "keepOutsideEdits": 1}, FLAG.format("keepOutsideEdits")),
    (RestoreParams, {"taskId": T, "ts": "1", "mode": 7}, MS.format("ts")),
    (ForkParams, {"taskId": T, "ts": 1, "newTaskId": ""}, NON_EMPTY.format("newTaskId")),
    (MessageEditParams, {"taskId": T, "ts": 1, "text": "x"}, NON_EMPTY.format("restore")),
    (MessageEditParams, {"taskId": T, "ts": 1, "text": "x", "restore": "files"}, "`restore` must be chat or all."),
    (MessageEditParams, {"taskId": T, "ts": 1, "restore": "chat"}, "`text` must be a string."),
    (DeleteAllParams, {"keepFavorites": None}, "`keepFavorites` must be a list of task ids."),
    (DeleteAllParams, {"keepFavorites": [1]}, "`keepFavorites` must be a list of task ids."),
    (InitializeParams, {}, "`roots` must be a list of absolute paths."),
    (InitializeParams, {"roots": ["/a"], "settings": [1]}, "`settings` must be an object."),
])
def test_a_wrong_field_gets_its_message(model: type[Params], params: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidParamsError) as err:
        parse(model, params)
    assert str(err.value) == message
    assert err.value.kind == "invalid_params"


def test_fields_parse_into_typed_values() -> None:
    assert parse(TaskStartParams, {"taskId": T}).ts == 0, "task/start's ts defaults to 0"
    end = parse(ToolEndParams, {"taskId": T, "tool": "bash", "kind": "command", "paths": ["a"], "extra": 1})
    assert (end.kind, end.paths, end.ok) == (ToolKind.COMMAND, ("a",), True)
    assert parse(ToolEndParams, {"taskId": T, "tool": "x", "ok": False}).ok is False
    assert parse(ToolEndParams, {"taskId": T, "tool": "x", "ok": "no"}).ok is True, "only false is a failure"
    restore = parse(RestoreParams, {"taskId": T, "ts": 5, "mode": "both", "dryRun": True})
    assert (restore.restore_mode, restore.dry_run, restore.keep_outside_edits, restore.paths) == (
        RestoreMode.BOTH, True, False, None)
    with pytest.raises(InvalidParamsError, match=r"^mode must be files, task or both, not 'all'\.$"):
        _ = parse(RestoreParams, {"taskId": T, "ts": 5, "mode": "all"}).restore_mode
    assert parse(MessageEditParams, {"taskId": T, "ts": 1, "text": "", "restore": "all"}).restore is EditRestore.ALL
    assert parse(MessageAddParams, {"taskId": T, "ts": 1, "role": "user"}).text is None
    assert parse(DeleteAllParams, {}).keep_favorites == []
    falsy: object
    for falsy in (None, False, 0, "", []):
        assert parse(InitializeParams, {"roots": [], "settings": falsy}).settings == {}
    diff = parse(DiffParams, {"taskId": T, "from": 1})
    assert diff.to is None and parse(DiffParams, {"taskId": T, "from": 1, "to": 2}).to == 2
    with pytest.raises(UnknownCheckpointError, match=r"^No checkpoint at ts='2'\.$"):
        _ = parse(DiffParams, {"taskId": T, "from": 1, "to": "2"}).to
