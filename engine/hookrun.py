"""The lean hook command: an agent's hook payload (stdin) forwarded to the workspace's sidecar.

`python -I -S …/shadowpoint/hookrun.py AGENT` (what `install-hooks` writes), `python -m
shadowpoint.hookrun AGENT` and `shadowpoint hook AGENT` all run `main()`. The agent waits for
this process on every tool call, so it imports only the standard library (no shadowpoint
module, no click, rich, pydantic or structlog; it runs even without `site`): it reads the
payload, finds the workspace's socket, starts the sidecar when none runs, and sends the raw
payload as one HTTP request over the Unix socket (`POST /hook/AGENT`); the sidecar turns it
into protocol calls (`shadowpoint.sidecar.hook_endpoint`). It answers once the sidecar has
queued the calls, or, before a tool that may modify the workspace, once the baseline is ready.

It never fails the agent: exit status 0 and nothing on stdout whatever happens; problems go
to `hooks.log` under the state dir. When the sidecar could not be reached, the session is
marked, and the next hook that reaches one says so: that checkpoint rescans and carries a
warning that events were missed. Also the one place that says where sockets and hook state
live (`runtime_dir`, `state_dir`, `socket_path`), so every process agrees.
"""

from __future__ import annotations

# C modules alone, on the hot path: `socket` would import enum, `json` re, `hashlib` OpenSSL.
import _socket
import os
import sys
import time

try:
    from _sha2 import sha256  # type: ignore[import-not-found,unused-ignore]
except ImportError:
    try:
        from _sha256 import sha256  # type: ignore[import-not-found,no-redef,unused-ignore]
    except ImportError:
        from hashlib import sha256  # type: ignore[assignment,unused-ignore]

AGENTS = ("claude", "codex", "gemini")
# Environment variables naming the project root, per agent (tried before the payload's cwd).
PROJECT_VARS = {"claude": ("CLAUDE_PROJECT_DIR",), "codex": ("CODEX_PROJECT_DIR",), "gemini": ("GEMINI_PROJECT_DIR",)}
# The sidecar a hook starts exits after this long without a connection.
HOOK_SIDECAR_IDLE_S = 30 * 60.0
SPAWN_WAIT_S = 20.0
SPAWN_POLL_S = 0.005  # how often a hook that started the sidecar tries to connect
# Before a mutating tool the answer waits for the baseline; the agent's hook timeout bounds it first.
ANSWER_TIMEOUT_S = 600.0
HASH_DIGITS = 13  # as `shadowpoint.workspace.workspace_hash`
_MAX_SOCKET_PATH = 100  # sun_path is 108 bytes on Linux, 104 on macOS
_LOG_MAX_BYTES = 1 << 20
MISSED_HEADER = "X-Shadowpoint-Missed"
ROOT_HEADER = "X-Shadowpoint-Root-Hex"
NOTE_HEADER = "X-Shadowpoint-Note"


# ---------------------------------------------------------------------------- where things live


def runtime_dir() -> str:
    """Where sockets live: `$XDG_RUNTIME_DIR/shadowpoint`, else a private folder in the temp dir."""
    base = os.environ.get("XDG_RUNTIME_DIR")
    if not base and sys.platform.startswith("linux") and os.path.isdir(f"/run/user/{os.getuid()}"):
        base = f"/run/user/{os.getuid()}"
    if base and os.path.isdir(base) and len(base) + 32 <= _MAX_SOCKET_PATH:
        return os.path.join(base, "shadowpoint")
    # No runtime dir (containers, root without a login session) or too long for a socket path.
    tmp = os.environ.get("TMPDIR") or "/tmp"
    if len(tmp) + 40 > _MAX_SOCKET_PATH:
        tmp = "/tmp"
    return os.path.join(tmp, f"shadowpoint-{os.getuid()}")


def state_dir() -> str:
    """Hook state and logs: the user state dir (`$XDG_STATE_HOME/shadowpoint`, …)."""
    home = os.path.expanduser("~")
    if sys.platform == "darwin":
        return os.path.join(home, "Library", "Application Support", "shadowpoint")
    base = os.environ.get("XDG_STATE_HOME", "").strip() or os.path.join(home, ".local", "state")
    return os.path.join(base, "shadowpoint")


def workspace_hash(real_root: str) -> str:
    """13 decimal digits from the sha256 of the canonical path (`shadowpoint.workspace`'s rule)."""
    digest = sha256(os.fsencode(real_root)).digest()
    return str(int.from_bytes(digest[:16], "big") % 10**HASH_DIGITS).zfill(HASH_DIGITS)


def socket_path(root: str) -> str:
    """The socket of the sidecar serving the workspace `root`."""
    real = os.path.realpath(os.path.expanduser(root))
    return os.path.join(runtime_dir(), f"{workspace_hash(real)}.sock")


def hook_log(agent: str, message: str) -> None:
    """Append one line to the hooks' log (rotated at 1 MiB); never raises."""
    try:
        folder = state_dir()
        os.makedirs(folder, mode=0o700, exist_ok=True)
        path = os.path.join(folder, "hooks.log")
        try:
            if os.stat(path).st_size > _LOG_MAX_BYTES:
                os.replace(path, path + ".1")
        except OSError:
            pass
        now = time.time()  # `datetime` would cost an import on every traced hook
        stamp = f"{time.strftime('%Y-%m-%dT%H:%M:%S', time.gmtime(now))}.{int(now * 1000) % 1000:03d}+00:00"
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(f"{stamp} pid={os.getpid()} {agent}: {message}\n")
    except Exception:
        pass


def parse_json(text: str) -> object:
    """`json.loads` through the C scanner alone (the `json` package imports `re`)."""
    try:
        import _json
    except ImportError:
        import json

        return json.loads(text)

    class _Context:  # what `_json.make_scanner` reads of a JSONDecoder
        strict = True
        object_hook = None
        object_pairs_hook = None
        parse_float = float
        parse_int = int
        parse_constant = staticmethod(_constant)

    text = text.strip(" \t\n\r")
    try:
        value, end = _json.make_scanner(_Context())(text, 0)  # type: ignore[arg-type]  # duck-typed decoder
    except Exception as exc:  # StopIteration at the start, the scanner's own errors
        raise ValueError(f"not JSON ({type(exc).__name__} at {getattr(exc, 'value', '?')})") from None
    if end != len(text):
        raise ValueError(f"not JSON (extra data at {end})")
    return value


def _constant(name: str) -> float:
    return {"NaN": float("nan"), "Infinity": float("inf"), "-Infinity": float("-inf")}[name]


def dump_json(value: object) -> str:
    """`json.dumps` for the small session state (the C encoder alone would need more set-up)."""
    import json

    return json.dumps(value)


# ---------------------------------------------------------------------------- session state


def _session_file(agent: str, session_id: str) -> str:
    digest = sha256(session_id.encode("utf-8", "surrogateescape")).hexdigest()[:24]
    return os.path.join(state_dir(), "sessions", f"{agent}-{digest}.json")


def fast_session_file(agent: str, session_id: str) -> str | None:
    """The bash client's note of a session's workspace (`HASH ROOT`), for a plain session id.

    `hookrun.sh` writes it after an event went through, and takes the workspace from it instead
    of hashing names; this client removes it whenever it records missed events, so that the
    bash client hands the session to it until the note went out.
    """
    if not (0 < len(session_id) <= 100) or session_id[0] == "." or not all(
            c.isascii() and (c.isalnum() or c in "._-") for c in session_id):
        return None
    return os.path.join(state_dir(), "sessions", f"{agent}-{session_id}.fast")


def _drop_fast(agent: str, session_id: str) -> None:
    fast = fast_session_file(agent, session_id)
    if fast is not None:
        try:
            os.unlink(fast)
        except FileNotFoundError:
            pass


def _seen_by_bash(agent: str, session_id: str) -> bool:
    """True if the bash client delivered an event of this session (its note exists): the
    session's events went through before, though this client wrote no state for it."""
    fast = fast_session_file(agent, session_id)
    return fast is not None and os.path.exists(fast)


def _read_session(path: str) -> dict[str, object]:
    try:
        with open(path, encoding="utf-8") as fh:
            data = parse_json(fh.read())
    except (OSError, ValueError, StopIteration):
        return {}
    return data if isinstance(data, dict) else {}


def _write_session(path: str, data: dict[str, object]) -> None:
    # shadowpoint.store.atomic's temp-and-rename, written out: this module imports no shadowpoint module
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(dump_json(data))
    os.replace(tmp, path)


def _root_of(agent: str, payload: dict[str, object], env: os._Environ[str] | dict[str, str]) -> str | None:
    for var in PROJECT_VARS.get(agent, ()):
        value = env.get(var)
        if value and os.path.isdir(value):
            return value
    cwd = payload.get("cwd")
    return cwd if isinstance(cwd, str) and os.path.isabs(cwd) else None


# ---------------------------------------------------------------------------- the sidecar


def _connect(path: str) -> _socket.socket | None:
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    sock.settimeout(5.0)
    try:
        sock.connect(path)
    except OSError:
        sock.close()
        return None
    return sock


def _spawn(path: str, root: str) -> _socket.socket | None:
    """Start the workspace's sidecar (detached; one even when hooks race) and connect to it."""
    import fcntl
    import subprocess

    folder = os.path.dirname(path)
    os.makedirs(folder, mode=0o700, exist_ok=True)
    st = os.stat(folder)
    if st.st_uid != os.getuid():
        raise PermissionError(f"{folder} belongs to another user; refusing to use it for sockets")
    if st.st_mode & 0o077:
        os.chmod(folder, 0o700)
    fd = os.open(path[:-len(".sock")] + ".spawn.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        # the kernel frees it if this process dies (not locking.flocked: no shadowpoint import here)
        fcntl.flock(fd, fcntl.LOCK_EX)
        sock = _connect(path)
        if sock is not None:
            return sock
        log_path = os.path.join(state_dir(), "sidecar.log")
        os.makedirs(os.path.dirname(log_path), mode=0o700, exist_ok=True)
        cmd = [sys.executable, "-m", "shadowpoint", "serve", "--socket", path,
               "--idle-timeout", str(HOOK_SIDECAR_IDLE_S), "--workspace", root]
        with open(log_path, "ab") as err:
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
                                    start_new_session=True, close_fds=True, cwd="/")
        deadline = time.monotonic() + SPAWN_WAIT_S
        while time.monotonic() < deadline:
            sock = _connect(path)
            if sock is not None or proc.poll() is not None:
                return sock or _connect(path)
            # every few ms, not backing off: the sidecar listens ~0.3 s after its start, and a
            # doubling wait noticed it ~65 ms late (a refused connect costs ~30 us)
            time.sleep(SPAWN_POLL_S)
        return None
    finally:
        os.close(fd)


def _post(sock: _socket.socket, agent: str, root: str, raw: bytes, missed: str | None) -> tuple[int, str | None]:
    """Send the payload as `POST /hook/AGENT`; the HTTP status of the answer and its note."""
    head = [f"POST /hook/{agent} HTTP/1.1", "Host: localhost", "Content-Type: application/json",
            f"Content-Length: {len(raw)}", f"{ROOT_HEADER}: {os.fsencode(root).hex()}", "Connection: close"]
    if missed:
        head.append(f"{MISSED_HEADER}: {missed}")
    sock.settimeout(ANSWER_TIMEOUT_S)
    sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode("ascii") + raw)
    answer = b""
    while b"\r\n\r\n" not in answer:
        chunk = sock.recv(4096)
        if not chunk:
            break
        answer += chunk
    lines = answer.split(b"\r\n\r\n", 1)[0].decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    status = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0
    note = next((line.split(":", 1)[1].strip() for line in lines[1:]
                 if line.lower().startswith(NOTE_HEADER.lower() + ":")), None)
    return status, note


def forward(agent: str, raw: bytes, env: os._Environ[str] | dict[str, str] | None = None) -> None:
    """Forward one payload to the workspace's sidecar, starting it when needed; never raises."""
    env = os.environ if env is None else env
    started = time.monotonic()
    try:
        payload = parse_json(raw.decode("utf-8", "surrogateescape") or "{}")
        if not isinstance(payload, dict):
            raise ValueError("the hook payload is not a JSON object")
        session_id = payload.get("session_id")
        if not isinstance(session_id, str) or not session_id:
            raise ValueError(f"{payload.get('hook_event_name')!r}: the payload has no session_id")
        state_file = _session_file(agent, session_id)
        session = _read_session(state_file)
        root = session.get("root")
        if not isinstance(root, str):
            root = _root_of(agent, payload, env)
            if root is None:
                raise ValueError("no workspace: the payload has no absolute cwd")
        noted = session.get("missed")
        missed = noted if isinstance(noted, str) else None
        path = socket_path(root)
        sock = _connect(path)
        if sock is None:
            sock = _spawn(path, root)
            if sock is not None and agent == "claude" and not missed and (session or _seen_by_bash(agent, session_id)):
                # Claude Code's http hooks went nowhere while no sidecar ran.
                missed = "the sidecar was not running; hook events may have been missed"
        if sock is None:
            _drop_fast(agent, session_id)
            session.update(root=root, missed="the sidecar could not be reached; hook events were missed")
            _write_session(state_file, session)
            hook_log(agent, f"{payload.get('hook_event_name')}: no sidecar for {root} (the event is lost)")
            return
        try:
            status, note = _post(sock, agent, root, raw, missed)
        finally:
            sock.close()
        if note:
            hook_log(agent, note)
        if status == 200:
            if session != {"root": root}:
                _write_session(state_file, {"root": root})  # what was missed is now said
        else:
            _drop_fast(agent, session_id)
            _write_session(state_file, {"root": root, "missed": missed or f"the sidecar refused an event ({status})"})
            hook_log(agent, f"{payload.get('hook_event_name')}: the sidecar answered {status}")
        if env.get("SHADOWPOINT_HOOK_TRACE"):
            hook_log(agent, f"{payload.get('hook_event_name')} ok in {(time.monotonic() - started) * 1e3:.1f} ms")
    except Exception as exc:
        hook_log(agent, f"failed: {exc!r}")


def main(argv: list[str] | None = None) -> int:
    """`hookrun.py AGENT`: forward stdin's payload; always 0, nothing on stdout."""
    args = sys.argv[1:] if argv is None else argv
    # Some agents feed a hook's stdout to the model: nothing may ever reach it by accident.
    sys.stdout = sys.stderr
    raw = sys.stdin.buffer.read()
    agent = args[0] if args else ""
    if agent not in AGENTS:
        hook_log(agent or "?", f"unknown agent {agent!r}; expected one of {', '.join(AGENTS)}")
        return 0
    forward(agent, raw)
    return 0


if __name__ == "__main__":
    sys.exit(main())
