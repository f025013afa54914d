"""`shadowpoint mcp` driven as an MCP client drives it: JSON-RPC over the server's stdio
(initialize, tools/list, tools/call), on a workspace with real checkpoints.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.conftest import make_tree

SP = [sys.executable, "-m", "shadowpoint"]


class McpClient:
    """Newline-delimited JSON-RPC to an MCP server process (the stdio transport)."""

    def __init__(self, cwd: Path) -> None:
        self.proc = subprocess.Popen([*SP, "mcp"], cwd=cwd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE)
        self._id = 0

    def request(self, method: str, params: dict[str, Any] | None = None) -> Any:
        self._id += 1
        self._write({"jsonrpc": "2.0", "id": self._id, "method": method, "params": params or {}})
        assert self.proc.stdout is not None
        while True:
            line = self.proc.stdout.readline()
            assert line, self.proc.stderr.read() if self.proc.stderr else b""
            msg = json.loads(line)
            if msg.get("id") == self._id:
                assert "error" not in msg, msg
                return msg["result"]

    def notify(self, method: str) -> None:
        self._write({"jsonrpc": "2.0", "method": method})

    def _write(self, msg: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(msg).encode() + b"\n")
        self.proc.stdin.flush()

    def call(self, tool: str, **arguments: Any) -> tuple[bool, Any]:
        result = self.request("tools/call", {"name": tool, "arguments": arguments})
        data = result.get("structuredContent")
        if data is None:
            text = result["content"][0]["text"]
            try:
                data = json.loads(text)
            except ValueError:
                data = text
        return bool(result.get("isError")), data

    def close(self) -> int:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        code = self.proc.wait(timeout=60)
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream:
                stream.close()
        return code


def test_mcp_tools_list_diff_restore_and_undo(workspace: Path) -> None:
    ws = make_tree(workspace, {"app.py": "print(1)\n"})
    subprocess.run([*SP, "save", str(ws)], check=True, capture_output=True, timeout=120)
    (ws / "app.py").write_text("print(2)\n")
    subprocess.run([*SP, "save", str(ws)], check=True, capture_output=True, timeout=120)
    (ws / "app.py").write_text("print(3)\n")

    client = McpClient(ws)
    try:
        init = client.request("initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                                             "clientInfo": {"name": "test", "version": "1"}})
        assert init["serverInfo"]["name"] == "shadowpoint"
        client.notify("notifications/initialized")
        tools = {t["name"]: t for t in client.request("tools/list")["tools"]}
        assert set(tools) == {"list_checkpoints", "diff_checkpoint", "restore_checkpoint", "undo_restore"}
        assert tools["restore_checkpoint"]["annotations"]["destructiveHint"] is True
        assert tools["list_checkpoints"]["annotations"]["readOnlyHint"] is True

        error, listing = client.call("list_checkpoints")
        assert not error and [c["kind"] for c in listing["checkpoints"]] == ["round", "baseline"]
        assert listing["workspace"] == str(ws)

        error, diff = client.call("diff_checkpoint", checkpoint="2")
        assert not error and "-print(1)\n+print(3)\n" in diff["diff"]
        assert diff["files"] == [{"path": "app.py", "status": "modified", "binary": False}]

        error, restored = client.call("restore_checkpoint", checkpoint=listing["checkpoints"][1]["hash"][:7],
                                      mode="files")
        assert not error and restored["files"]["restored"] == ["app.py"]
        assert (ws / "app.py").read_text() == "print(1)\n"

        error, undone = client.call("undo_restore")
        assert not error and undone["files"]["restored"] == ["app.py"]
        assert (ws / "app.py").read_text() == "print(3)\n"

        error, message = client.call("diff_checkpoint", checkpoint="@9")
        assert error and "no checkpoint #9" in str(message).lower()
    finally:
        assert client.close() == 0
