"""The `shadowpoint` command line as a person and a script use it: real processes, real
pseudo-terminals (colour, progress bars) and pipes (none of either), `--json` output,
confirmations, exit codes, and `watch` stopped with Ctrl-C.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import pty
import re
import select
import shutil
import signal
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path
from typing import Any

import pytest

from shadowpoint.errors import AmbiguousCheckpointError, UnknownCheckpointError
from shadowpoint.sidecar.backend import resolve_checkpoint
from tests.conftest import make_tree, wait_for

SP = [sys.executable, "-m", "shadowpoint"]
ANSI = b"\x1b["
BAR = "━".encode()


def sp(*args: str, cwd: Path, env: dict[str, str], stdin: Any = subprocess.DEVNULL,
       timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*SP, *args], cwd=cwd, env=env, stdin=stdin, capture_output=True, text=True,
                          timeout=timeout, check=False)


def sp_json(*args: str, cwd: Path, env: dict[str, str]) -> Any:
    proc = sp(*args, "--json", cwd=cwd, env=env)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def run_pty(args: list[str], cwd: Path, env: dict[str, str], timeout: float = 120,
            typed: bytes = b"") -> tuple[int, bytes]:
    """Run `args` with stdin, stdout and stderr on a real pseudo-terminal (120x40); all output.
    `typed` is typed in advance (the terminal holds it until the program reads a line)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    proc = subprocess.Popen(args, cwd=cwd, env=env, stdin=slave, stdout=slave, stderr=slave,
                            start_new_session=True)
    os.close(slave)
    if typed:
        os.write(master, typed)
    out = bytearray()
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.2)
            if ready:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # EIO: the child closed the terminal
                    break
                if not chunk:
                    break
                out += chunk
            elif proc.poll() is not None:
                break
        return proc.wait(timeout=max(1.0, deadline - time.monotonic())), bytes(out)
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def save(ws: Path, env: dict[str, str], message: str | None = None) -> dict[str, Any]:
    args = ["save", str(ws)] + (["-m", message] if message else [])
    result: dict[str, Any] = sp_json(*args, cwd=ws, env=env)
    return result


# ---------------------------------------------------------------------------- scripts (--json, codes)


def test_save_list_diff_restore_undo_as_a_script(ws: Path, env: dict[str, str]) -> None:
    first = save(ws, env, "start")
    assert first["checkpoint"]["kind"] == "baseline" and first["taskId"].startswith("cli-")
    (ws / "app.py").write_text("print(2)\n")
    (ws / "new.txt").write_text("new\n")
    second = save(ws, env, "edited")
    assert second["checkpoint"]["kind"] == "round" and not second["checkpoint"]["reused"]

    listing = sp_json("list", str(ws), cwd=ws, env=env)
    assert [c["position"] for c in listing["checkpoints"]] == [1, 2]
    assert listing["checkpoints"][0]["hash"] == second["checkpoint"]["hash"]

    diff = sp_json("diff", "2", "1", cwd=ws, env=env)
    files = {f["path"]: f for f in diff["files"]}
    assert set(files) == {"app.py", "new.txt"}
    assert files["app.py"]["before"] == "print(1)\n" and files["app.py"]["after"] == "print(2)\n"

    by_hash = sp_json("diff", second["checkpoint"]["hash"][:8], cwd=ws, env=env)
    assert by_hash["files"] == [], "nothing changed since the newest checkpoint"

    restored = sp_json("restore", "@2", "--files", "--yes", cwd=ws, env=env)
    assert restored["files"]["restored"] == ["app.py"] and restored["files"]["deleted"] == ["new.txt"]
    assert (ws / "app.py").read_text() == "print(1)\n" and not (ws / "new.txt").exists()

    undone = sp_json("undo", cwd=ws, env=env)
    assert sorted(undone["files"]["restored"]) == ["app.py", "new.txt"]
    assert (ws / "app.py").read_text() == "print(2)\n" and (ws / "new.txt").read_text() == "new\n"


def test_plain_diff_when_piped_and_stat(ws: Path, env: dict[str, str]) -> None:
    save(ws, env)
    (ws / "app.py").write_text("print(1)\nprint(3)\n")
    proc = sp("diff", cwd=ws, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "\x1b[" not in proc.stdout
    assert "--- a/app.py\n+++ b/app.py\n" in proc.stdout and "\n+print(3)\n" in proc.stdout
    stat = sp("diff", "--stat", cwd=ws, env=env)
    assert " app.py |" in stat.stdout and "1 file changed, 1 insertion(+), 0 deletions(-)" in stat.stdout

    page = ws.parent / "diff.html"
    sp("diff", "--html", str(page), cwd=ws, env=env)
    html = page.read_text()
    text = re.sub(r"<[^>]+>", "", html)  # the code is split into syntax-coloured spans
    assert "<table" in html and "print(3)" in text and "app.py" in text


ODD_BREAKS = "form\x0cfeed\nline\u2028sep\nfile\x1cgroup\x1drecord\x1eunit\nlone\rreturn\ncrlf\r\nend\n"


def test_diff_splits_lines_at_newline_only_and_git_applies_it(ws: Path, env: dict[str, str], tmp_path: Path) -> None:
    (ws / "odd.txt").write_bytes(ODD_BREAKS.encode())
    save(ws, env)
    after = ODD_BREAKS.replace("line\u2028sep", "line\u2028SEP").replace("lone\rreturn", "lone\rRETURN")
    (ws / "odd.txt").write_bytes(after.encode())
    proc = subprocess.run([*SP, "diff", "--", "odd.txt"], cwd=ws, env=env, capture_output=True, timeout=120,
                          stdin=subprocess.DEVNULL, check=False)
    assert proc.returncode == 0, proc.stderr
    patch = tmp_path / "odd.diff"
    patch.write_bytes(proc.stdout)
    assert b"\n@@ -1,6 +1,6 @@\n" in proc.stdout, proc.stdout  # six lines, as git counts them
    check = tmp_path / "check"
    check.mkdir()

    def git_apply(*flags: str) -> subprocess.CompletedProcess[str]:  # the git CLI is the oracle
        return subprocess.run(["git", "apply", "--check", *flags, str(patch)], cwd=check, capture_output=True,
                              text=True, timeout=60, check=False)

    (check / "odd.txt").write_bytes(ODD_BREAKS.encode())
    assert git_apply().returncode == 0, git_apply().stderr
    (check / "odd.txt").write_bytes(after.encode())
    assert git_apply("-R").returncode == 0, git_apply("-R").stderr
    stat = sp("diff", "--stat", cwd=ws, env=env)
    assert "1 file changed, 2 insertions(+), 2 deletions(-)" in stat.stdout, stat.stdout


def test_an_html_page_that_cannot_be_written_is_one_error_line(ws: Path, env: dict[str, str], tmp_path: Path) -> None:
    save(ws, env)
    (ws / "app.py").write_text("print(2)\n")
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    for page, reason in ((tmp_path / "missing" / "page.html", "No such file or directory"),
                         (a_file / "page.html", "Not a directory")):
        for command in ("diff", "log"):
            proc = sp(command, "--html", str(page), cwd=ws, env=env)
            assert proc.returncode == 2, (command, proc.stderr)  # bad input, as click says of a read-only file
            assert proc.stderr.startswith("shadowpoint: error:") and proc.stderr.count("\n") == 1, proc.stderr
            assert str(page) in proc.stderr and reason in proc.stderr, proc.stderr


def test_a_reader_that_quits_early_stops_the_command_quietly(ws: Path, env: dict[str, str]) -> None:
    (ws / "big.txt").write_text("".join(f"line {i}\n" for i in range(50_000)))
    save(ws, env)
    (ws / "big.txt").write_text("".join(f"LINE {i}\n" for i in range(50_000)))  # a diff of ~1.2 MB
    # `shadowpoint diff | head -1`: far more than a pipe holds, so the writer is still writing when the reader quits
    proc = subprocess.Popen([*SP, "diff"], cwd=ws, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    first = proc.stdout.readline()
    proc.stdout.close()
    err = proc.stderr.read().decode()
    proc.stderr.close()
    assert proc.wait(timeout=120) == 141, err  # 128 + SIGPIPE, as git's users see; not 1 (internal)
    assert first.startswith(b"diff --shadowpoint") and "Traceback" not in err and "error" not in err, err
    # a reader gone before the command writes anything: every command that prints
    for args in (["status"], ["list"], ["log"], ["diff", "--stat"], ["list", "--json"]):
        read_end, write_end = os.pipe()
        os.close(read_end)
        try:
            done = subprocess.run([*SP, *args], cwd=ws, env=env, stdin=subprocess.DEVNULL, stdout=write_end,
                                  stderr=subprocess.PIPE, text=True, timeout=120, check=False)
        finally:
            os.close(write_end)
        assert done.returncode == 141, (args, done.returncode, done.stderr)
        assert "Traceback" not in done.stderr and "error" not in done.stderr, (args, done.stderr)


def test_a_word_naming_no_checkpoint_and_no_path_is_an_error(ws: Path, env: dict[str, str]) -> None:
    (ws / "gone.txt").write_text("soon gone\n")
    save(ws, env)
    (ws / "gone.txt").unlink()
    save(ws, env)
    for args in (["diff", "nosuch"], ["diff", "HEAD"], ["diff", "abcd"], ["diff", "2", "nosuch"],
                 ["status", "nosuch"]):
        proc = sp(*args, cwd=ws, env=env)  # git: "ambiguous argument: unknown revision or path"
        assert proc.returncode == 11, (args, proc.returncode, proc.stderr)
        assert proc.stderr.startswith("shadowpoint: error:") and args[-1] in proc.stderr and proc.stdout == "", args
    assert sp("diff", "--", "nosuch", cwd=ws, env=env).returncode == 0, "after --, a word is a path (as git)"
    deleted = sp_json("diff", "2", "gone.txt", cwd=ws, env=env)  # only in the older snapshot
    assert [(f["path"], f["status"]) for f in deleted["files"]] == [("gone.txt", "deleted")]
    (ws / "README.md").unlink()  # in both snapshots, unchanged between them, gone from the disk
    assert sp_json("diff", "2", "1", "README.md", cwd=ws, env=env)["files"] == []
    assert [c["path"] for c in sp_json("status", "README.md", cwd=ws, env=env)["changed"]] == ["README.md"]
    assert sp("diff", "lib", cwd=ws, env=env).returncode == 0, "an existing folder"


def test_no_changes_print_nothing_on_a_piped_stdout(ws: Path, env: dict[str, str]) -> None:
    save(ws, env)
    for args in (["diff"], ["diff", "--stat"], ["diff", "1", "app.py"]):
        proc = sp(*args, cwd=ws, env=env)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout == "" and "No changes." in proc.stderr, (args, proc.stdout, proc.stderr)


def test_read_only_commands_in_a_folder_without_checkpoints_write_nothing(ws: Path, env: dict[str, str],
                                                                          tmp_path: Path) -> None:
    task = save(ws, env)["taskId"]
    docs = Path(env["SHADOWPOINT_DOCS_DIR"])
    before = sorted(p.relative_to(docs).as_posix() for p in docs.rglob("*"))
    empty = tmp_path / "empty"
    empty.mkdir()
    for args in (["status"], ["diff"], ["list"], ["log"], ["diff", "--stat"], ["list", "--task-id", task],
                 ["status", "--task-id", task]):
        proc = sp(*args, cwd=empty, env=env)
        assert proc.returncode == 10 and "No checkpoints for" in proc.stderr, (args, proc.stderr)
        assert sorted(p.relative_to(docs).as_posix() for p in docs.rglob("*")) == before, args


def test_restore_without_terminal_and_without_yes_refuses(ws: Path, env: dict[str, str]) -> None:
    save(ws, env)
    (ws / "app.py").write_text("mine\n")
    proc = sp("restore", "1", "--files", cwd=ws, env=env, stdin=subprocess.DEVNULL)
    assert proc.returncode == 50
    assert proc.stderr.count("\n") == 1 and "--yes" in proc.stderr
    assert (ws / "app.py").read_text() == "mine\n", "nothing was touched"


def test_errors_exit_with_the_code_of_their_kind(ws: Path, env: dict[str, str], tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    no_task = sp("list", str(empty), cwd=empty, env=env)
    assert no_task.returncode == 10 and "shadowpoint save" in no_task.stderr
    save(ws, env)
    missing = sp("diff", "@7", cwd=ws, env=env)
    assert missing.returncode == 11 and missing.stderr.startswith("shadowpoint: error:")
    no_undo = sp("undo", cwd=ws, env=env)
    assert no_undo.returncode == 22
    home = sp("save", env["HOME"], cwd=ws, env=env)
    assert home.returncode == 4 and "home" in home.stderr
    usage = sp("restore", "1", cwd=ws, env=env)
    assert usage.returncode == 2


def test_storage_doctor_and_delete_task(ws: Path, env: dict[str, str]) -> None:
    task = save(ws, env)["taskId"]
    (ws / "app.py").write_text("print(5)\n")
    save(ws, env)
    report = sp_json("storage", cwd=ws, env=env)
    [entry] = report["workspaces"]
    assert entry["worktree"] == str(ws) and entry["bytes"] > 0
    assert [t["taskId"] for t in entry["tasks"]] == [task]
    collected = sp_json("storage", "--gc", cwd=ws, env=env)
    assert set(collected["collected"]) == {entry["workspaceHash"]}

    doctor = sp_json("doctor", str(ws), cwd=ws, env=env)
    names = {c["name"]: c for c in doctor["checks"]}
    assert {"watch limits", "storage", "sidecars", "locks"} <= set(names)
    repo_checks = [c for n, c in names.items() if n.startswith("shadow repo")]
    assert len(repo_checks) == 1 and repo_checks[0]["status"] == "ok"

    refused = sp("delete-task", task, cwd=ws, env=env)
    assert refused.returncode == 50
    deleted = sp("delete-task", task, "--yes", cwd=ws, env=env)
    assert deleted.returncode == 0, deleted.stderr
    assert sp("list", cwd=ws, env=env).returncode == 10


def test_checkpoint_names() -> None:
    cps = [{"ts": 1, "kind": "baseline", "hash": "abcdef11", "hashes": {"w": "abcdef11"}},
           {"ts": 2, "kind": "round", "hash": "abcdef22", "hashes": {"w": "abcdef22"}},
           {"ts": 3, "kind": "round", "hash": "abcdef22", "hashes": {"w": "abcdef22"}},
           {"ts": 4, "kind": "compaction", "hash": None, "hashes": {}}]
    assert resolve_checkpoint(cps, "1")["ts"] == 4
    assert resolve_checkpoint(cps, "@4")["ts"] == 1
    assert resolve_checkpoint(cps, "abcdef1")["ts"] == 1
    assert resolve_checkpoint(cps, "ABCDEF2")["ts"] == 3, "a shared hash names the newest"
    with pytest.raises(AmbiguousCheckpointError):
        resolve_checkpoint(cps, "abcdef")
    for bad in ("@5", "abcd", "0", "zzzzz"):
        with pytest.raises(UnknownCheckpointError):
            resolve_checkpoint(cps, bad)


# ---------------------------------------------------------------------------- people (terminals)


def test_terminal_diff_is_coloured_and_no_color_turns_it_off(ws: Path, env: dict[str, str]) -> None:
    save(ws, env)
    (ws / "app.py").write_text("print(2)\n")
    code, out = run_pty([*SP, "diff"], ws, env)
    assert code == 0, out
    assert b"\x1b[31m-print(1)" in out and b"\x1b[32m+print(2)" in out
    code, plain = run_pty([*SP, "diff"], ws, {**env, "NO_COLOR": "1"})
    assert code == 0 and ANSI not in plain and b"-print(1)" in plain and b"+print(2)" in plain


def test_progress_bar_on_a_terminal_baseline_and_none_when_piped(tmp_path: Path, env: dict[str, str]) -> None:
    big = tmp_path / "big"
    make_tree(big, {f"pkg{i // 100}/mod{i}.py": f"x = {i}\n" * 20 for i in range(3000)})
    code, out = run_pty([*SP, "save", str(big)], big, env)
    assert code == 0, out[-2000:]
    assert b"Baseline snapshot of" in out and BAR in out
    assert b"checkpoint" in out and b"(baseline)" in out

    other = tmp_path / "big2"
    shutil.copytree(big, other)
    proc = sp("save", str(other), cwd=other, env=env)
    assert proc.returncode == 0
    assert "Baseline snapshot" not in proc.stderr + proc.stdout and "\x1b[" not in proc.stderr + proc.stdout


# ---------------------------------------------------------------------------- watch


def test_watch_checkpoints_after_a_quiet_period_and_exits_0_on_ctrl_c(ws: Path, env: dict[str, str],
                                                                      tmp_path: Path) -> None:
    out_file = tmp_path / "watch.out"
    with open(out_file, "wb") as out:
        proc = subprocess.Popen([*SP, "watch", str(ws), "--debounce", "0.3"], cwd=ws, env=env,
                                stdout=out, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    try:
        wait_for(lambda: b"Ctrl-C to stop" in out_file.read_bytes() or proc.poll() is not None)
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else b""
        (ws / "app.py").write_text("print('watched')\n")
        wait_for(lambda: b" checkpoint " in out_file.read_bytes())
        listing = sp_json("list", str(ws), cwd=ws, env=env)  # served by the watch process itself
        kinds = [c["kind"] for c in listing["checkpoints"]]
        assert kinds == ["round", "baseline"]
        (ws / "late.txt").write_text("late\n")
        wait_for(lambda: out_file.read_bytes().count(b" checkpoint ") == 2)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stderr:
            proc.stderr.close()
    listing = sp_json("list", str(ws), cwd=ws, env=env)
    assert [c["kind"] for c in listing["checkpoints"]] == ["round", "round", "baseline"]
    assert [f["path"] for f in sp_json("diff", "@3", "@2", cwd=ws, env=env)["files"]] == ["app.py"]
    assert [f["path"] for f in sp_json("diff", "@2", "@1", cwd=ws, env=env)["files"]] == ["late.txt"]
    assert not list(Path(env["XDG_RUNTIME_DIR"]).glob("shadowpoint/*.sock")), "the socket is removed on exit"


def test_watch_on_a_terminal_shows_a_status_line(ws: Path, env: dict[str, str]) -> None:
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    proc = subprocess.Popen([*SP, "watch", str(ws), "--debounce", "0.3"], cwd=ws, env=env,
                            stdin=slave, stdout=slave, stderr=slave, start_new_session=True)
    os.close(slave)
    out = bytearray()

    def pump() -> bytes:
        while select.select([master], [], [], 0.05)[0]:
            try:
                chunk = os.read(master, 65536)
            except OSError:
                break
            if not chunk:
                break
            out.extend(chunk)
        return bytes(out)

    try:
        wait_for(lambda: b"watching" in pump() and b"checkpoint" in bytes(out))
        (ws / "README.md").write_text("changed\n")
        wait_for(lambda: b"last: " in pump() and b"(1 path, quiet period)" in bytes(out))
        proc.send_signal(signal.SIGINT)
        wait_for(lambda: pump() is not None and proc.poll() is not None)
        pump()
        assert proc.returncode == 0
        assert b"\x1b[" in out and b"stopped (2 checkpoints this session)" in out, "the baseline counts"
    finally:
        with contextlib.suppress(OSError):
            os.close(master)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
