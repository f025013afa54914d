"""The command line's git habits and people's words (issue 13): the upward workspace search,
-C DIR everywhere, one default task, `diff REF -- PATH`, the pager, `status [--ignored]`,
lock files and `!pattern`, errors as JSON, `--stat` bars. Real `shadowpoint` processes."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from shadowpoint.config import DEFAULT_READ_ONLY_TOOLS
from shadowpoint.engine import Engine, EngineOptions
from shadowpoint.kinds import ToolKind
from shadowpoint.sidecar.backend import now_ms
from shadowpoint.sidecar.doctor import check_watch_limits
from tests.conftest import make_tree
from tests.integration.test_cli import SP, run_pty, save, sp, sp_json


def test_commands_in_a_sub_folder_find_the_workspace_upwards(ws: Path, env: dict[str, str]) -> None:
    first = save(ws, env)
    sub = ws / "lib"
    listed = sp_json("list", cwd=sub, env=env)
    assert listed["workspace"] == str(ws) and listed["taskId"] == first["taskId"]
    (ws / "lib" / "util.py").write_text("def f():\n    return 2\n")
    again = sp_json("save", cwd=sub, env=env)
    assert again["workspace"] == str(ws) and again["taskId"] == first["taskId"], "no second, overlapping repo"
    docs = Path(env["SHADOWPOINT_DOCS_DIR"])
    assert len(list((docs / "checkpoints").iterdir())) == 1


def test_a_new_project_is_found_by_its_git_folder(tmp_path: Path, env: dict[str, str]) -> None:
    project = make_tree(tmp_path / "project", {"src/app/main.py": "x = 1\n", ".git/HEAD": "ref: refs/heads/main\n"})
    saved = sp_json("save", cwd=project / "src" / "app", env=env)
    assert saved["workspace"] == str(project)


def test_dash_c_on_every_command(ws: Path, env: dict[str, str], tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    saved = sp_json("save", "-C", str(ws), cwd=elsewhere, env=env)
    assert saved["workspace"] == str(ws)
    assert sp_json("-C", str(ws), "list", cwd=elsewhere, env=env)["workspace"] == str(ws)
    for args in (["list"], ["diff"], ["status"], ["doctor"], ["log"], ["storage"],
                 ["restore", "1", "--files", "--dry-run"], ["fork", "1", "tried"], ["list", "--tasks"]):
        proc = sp(*args, "-C", str(ws), "--json", cwd=elsewhere, env=env)
        assert proc.returncode == 0, (args, proc.stderr)
    assert sp("undo", "-C", str(ws), cwd=elsewhere, env=env).returncode == 22, "reached the workspace's task"
    (ws / "app.py").write_text("print(2)\n")
    changed = sp_json("diff", "-C", str(ws / "lib"), "../app.py", cwd=elsewhere, env=env)
    assert [f["path"] for f in changed["files"]] == ["app.py"], "paths are read from -C DIR, as git does"
    deleted = sp("delete-task", "-C", str(ws), "tried", "--yes", cwd=elsewhere, env=env)
    assert deleted.returncode == 0, deleted.stderr
    from shadowpoint.cli.app import cli

    for name, command in cli.commands.items():  # a command added later must take it too
        assert any("-C" in p.opts for p in command.params), f"`shadowpoint {name}` does not take -C DIR"


def test_no_command_has_two_parameters_of_one_name() -> None:
    """click warns (on stderr, at every run) when two parameters share a name: `-C` was once
    named like `mcp`'s DIRECTORY argument, and the one-line error of `mcp` got a warning above it."""
    import warnings

    import click

    from shadowpoint.cli.app import cli

    for name, command in cli.commands.items():
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            command.make_parser(click.Context(command, info_name=name))


def test_one_default_task_for_every_command_save_included(ws: Path, env: dict[str, str], tmp_path: Path) -> None:
    save(ws, env)
    # an agent's session in the same workspace becomes the most recently active task
    opts = EngineOptions(docs_dir=Path(env["SHADOWPOINT_DOCS_DIR"]),
                         read_only_tools=frozenset(DEFAULT_READ_ONLY_TOOLS), watcher=False)
    engine = Engine([ws], opts)
    try:
        start = now_ms()
        engine.start_task("agent-session", start)
        engine.begin_round("agent-session")
        engine.tool_began("agent-session", "write_to_file", ToolKind.EDIT, ["app.py"])
        (ws / "app.py").write_text("print('agent')\n")
        engine.tool_ended("agent-session", "write_to_file", ["app.py"], ToolKind.EDIT)
        engine.end_round("agent-session", start + 1)
    finally:
        engine.close()
    (ws / "README.md").write_text("mine\n")
    saved = save(ws, env, "after the agent")
    listed = sp_json("list", cwd=ws, env=env)
    assert saved["taskId"] == listed["taskId"] == "agent-session", "save and list name the same task"
    assert listed["checkpoints"][0]["hash"] == saved["checkpoint"]["hash"]
    again = sp_json("list", cwd=ws, env=env)
    assert [c["hash"] for c in again["checkpoints"]] == [c["hash"] for c in listed["checkpoints"]], \
        "positions name the same checkpoints until a new one is saved"
    human = sp("list", cwd=ws, env=env)
    assert "Task agent-session" in human.stdout and str(ws) in human.stdout


def test_diff_refs_then_paths_as_git_reads_them(ws: Path, env: dict[str, str]) -> None:
    save(ws, env)
    (ws / "app.py").write_text("print(2)\n")
    (ws / "lib" / "util.py").write_text("def f():\n    return 2\n")
    (ws / "1").write_text("a file named like a position\n")
    save(ws, env)
    (ws / "README.md").write_text("changed later\n")

    def paths(*args: str, cwd: Path = ws) -> list[str]:
        proc = sp("diff", "--json", *args, cwd=cwd, env=env)  # options before `--`, as in git
        assert proc.returncode == 0, proc.stderr
        return sorted(f["path"] for f in json.loads(proc.stdout)["files"])

    assert paths() == ["README.md"]
    assert paths("2") == ["1", "README.md", "app.py", "lib/util.py"]
    assert paths("2", "1", "--", "lib") == ["lib/util.py"]
    assert paths("2", "--", "app.py", "README.md") == ["README.md", "app.py"]
    assert paths("2", "lib/util.py") == ["lib/util.py"], "an existing path without --"
    assert paths("2", "1") == ["1"], "without --, an existing file wins over a position"
    assert paths("2", "--", "1") == ["1"], "after --, a position-like word is a path"
    assert paths("2", "util.py", cwd=ws / "lib") == ["lib/util.py"], "paths are relative to the current folder"
    outside = sp("diff", "--", "/etc/passwd", cwd=ws, env=env)
    assert outside.returncode == 5, outside.stderr


def test_the_pager_on_a_terminal_and_never_when_piped(ws: Path, env: dict[str, str], tmp_path: Path) -> None:
    save(ws, env)
    (ws / "app.py").write_text("print(2)\n")
    paged = tmp_path / "paged.txt"
    pager = f"{sys.executable} -c \"import sys; open({str(paged)!r}, 'w').write(sys.stdin.read())\""
    code, out = run_pty([*SP, "diff"], ws, {**env, "SHADOWPOINT_PAGER": pager, "PAGER": "false"})
    assert code == 0, out
    assert "+print(2)" in paged.read_text() and "Task cli-" in paged.read_text()
    paged.unlink()
    code, out = run_pty([*SP, "diff", "--no-pager"], ws, {**env, "SHADOWPOINT_PAGER": pager})
    assert code == 0 and b"+print(2)" in out and not paged.exists()
    piped = sp("diff", cwd=ws, env={**env, "SHADOWPOINT_PAGER": pager})
    assert "+print(2)" in piped.stdout and not paged.exists()
    assert piped.stdout.startswith("diff --shadowpoint"), "piped, stdout is a clean diff (the header on stderr)"
    code, out = run_pty([*SP, "diff"], ws, {k: v for k, v in {**env, "PAGER": pager}.items()
                                            if k != "SHADOWPOINT_PAGER"})
    assert code == 0 and "+print(2)" in paged.read_text(), "$PAGER when $SHADOWPOINT_PAGER is unset"


def test_lock_files_are_snapshotted_and_status_names_what_is_left_out(tmp_path: Path, env: dict[str, str]) -> None:
    locks = ["uv.lock", "poetry.lock", "Cargo.lock", "yarn.lock", "Gemfile.lock", "composer.lock", "Pipfile.lock",
             "flake.lock", "mix.lock", "pubspec.lock", "Podfile.lock", "package-lock.json", "pnpm-lock.yaml"]
    project = make_tree(tmp_path / "project", {
        **{name: "v1\n" for name in locks}, "other.lock": "v1\n", "app.py": "x = 1\n",
        ".gitignore": "# generated\n*.gen\n", ".gitattributes": "*.weights filter=lfs diff=lfs merge=lfs -text\n",
        "nested/.git/HEAD": "ref: refs/heads/main\n", "nested/code.py": "y = 1\n",
    })
    save(project, env)
    for name in [*locks, "other.lock"]:
        (project / name).write_text("v2\n")
    for rel in ("logo.png", "data.csv", "out.gen", "model.weights", "nested/code.py", "big.txt"):
        (project / rel).write_text("new\n" * (300 if rel == "big.txt" else 1))
    small_cap = {**env, "SHADOWPOINT_MAX_FILE_BYTES": "1000"}
    changed = {f["path"] for f in sp_json("diff", cwd=project, env=small_cap)["files"]}
    assert set(locks) <= changed and "other.lock" not in changed
    status = sp_json("status", "--ignored", cwd=project, env=small_cap)
    assert set(locks) <= {c["path"] for c in status["changed"]}
    why = {e["path"]: e["why"] for e in status["ignored"]}
    assert why["logo.png"] == "built-in category media, pattern *.png"
    assert why["data.csv"] == "built-in category geodata, pattern *.csv"
    assert why["other.lock"] == "built-in category cache_and_logs, pattern *.lock"
    assert why["out.gen"] == ".gitignore line 2: *.gen"
    assert why["model.weights"].startswith("Git LFS")
    assert why["nested/"].startswith("a nested repository")
    assert why["big.txt"].startswith("larger than the size cap")
    assert "app.py" not in why and ".git/" not in why
    text = sp("status", "--ignored", cwd=project, env=small_cap).stdout
    assert "data.csv  (built-in category geodata, pattern *.csv)" in text and "!pattern" in text


def test_a_bang_pattern_re_includes_a_built_in_category(tmp_path: Path, env: dict[str, str]) -> None:
    project = make_tree(tmp_path / "project", {"app.py": "x = 1\n", "data.csv": "a,b\n",
                                               "logo.png": b"\x89PNG\r\n\x1a\n\x00"})
    wanted = {**env, "SHADOWPOINT_EXTRA_EXCLUSIONS": json.dumps(["!*.csv", "!logo.png"])}
    save(project, wanted)
    (project / "data.csv").write_text("a,b\n1,2\n")
    (project / "logo.png").write_bytes(b"\x89PNG\r\n\x1a\n\x00 new")
    assert {f["path"] for f in sp_json("diff", cwd=project, env=wanted)["files"]} == {"data.csv", "logo.png"}


def test_errors_are_json_under_json_and_speak_peoples_words(ws: Path, env: dict[str, str]) -> None:
    none_yet = sp("list", "--json", cwd=ws, env=env)
    assert none_yet.returncode == 10
    error = json.loads(none_yet.stdout)["error"]
    assert error["kind"] == "unknown_task" and error["exitCode"] == 10 and "shadowpoint save" in error["message"]
    save(ws, env)
    missing = sp("diff", "@99", "--json", cwd=ws, env=env)
    assert missing.returncode == 11 and json.loads(missing.stdout)["error"]["kind"] == "unknown_checkpoint"
    unknown = sp("list", "--task-id", "nope", cwd=ws, env=env)
    assert unknown.returncode == 10 and "task/start" not in unknown.stderr and "ts=" not in unknown.stderr


def test_diff_stat_shows_a_mark_for_a_one_line_change_beside_a_big_one(ws: Path, env: dict[str, str]) -> None:
    (ws / "big.py").write_text("")
    save(ws, env)
    (ws / "big.py").write_text("".join(f"line {i}\n" for i in range(240)))
    (ws / "app.py").write_text("print(2)\n")
    lines = {line.split("|")[0].strip(): line for line in sp("diff", "--stat", cwd=ws, env=env).stdout.splitlines()}
    assert lines["app.py"].rstrip().endswith("2 +-"), lines["app.py"]
    assert lines["big.py"].count("+") >= 20


def test_doctor_judges_watches_against_the_projects_folders(ws: Path) -> None:
    check = check_watch_limits(ws)
    if check["status"] == "info":
        return  # no inotify here
    watches = int(check["details"][0].rpartition("=")[2])
    if watches >= 100:
        assert check["status"] == "ok", check
        assert "folder" in check["summary"]


def test_mcp_without_its_extra_says_how_to_install_it(ws: Path, env: dict[str, str], tmp_path: Path) -> None:
    import subprocess

    blocker = tmp_path / "block"
    blocker.mkdir()
    (blocker / "sitecustomize.py").write_text("import sys\nsys.modules['mcp'] = None\n")
    proc = subprocess.run([*SP, "mcp"], cwd=ws, env={**env, "PYTHONPATH": str(blocker)}, capture_output=True,
                          text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "shadowpoint: error: `shadowpoint mcp` needs the MCP SDK: pip install 'shadowpoint[mcp]'"]
