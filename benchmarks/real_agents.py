"""What the hooks cost a person running the real agents: the scripted sessions of tests/agents, timed.

    python -m benchmarks.real_agents [--agent claude|codex|gemini ...] [--repeat N] [--python-client] [--json FILE]

Each agent's two-turn session (tests/agents/sessions.py; the programs installed by
`.ci/agents`) runs in a fresh project three ways, `--repeat` times each, after one warm-up
run and in a rotating order: `plain` (no hooks), `counted` (our event subscriptions, but the
hook command only counts the call: the agent's own cost of running a hook process) and
`hooked` (`shadowpoint install-hooks`); with `--python-client` also `python` (our hooks with
the Python client `python -I -S …/hookrun.py AGENT` for every event, as before the bash client).
Reported per agent (medians): the wall times, the number of hook events, the one-time
sidecar start (SessionStart's time in the hooks' trace log) and the overhead per event:
(hooked - plain - sidecar start) / events; beside it, every other command hook's own time in
that log (the command's start to its exit; Claude Code's http hooks are not traced there),
which the session's own noise does not reach.
A benchmark, not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from shadowpoint import hookrun
from tests.agents import conftest as harness
from tests.agents.sessions import SESSIONS
from tests.integration.test_adapters import stop_sidecars

_COUNTER = "#!/bin/sh\ncat >/dev/null\necho x >> \"$SHADOWPOINT_BENCH_COUNT\"\n"


def _hook_times_ms(run: harness.Run) -> list[tuple[str, float]]:
    """Each hook event's own time as hooks.log traces it (`EVENT ok in X ms`): from the hook
    command's start to its exit, the agent's cost of starting the process left out."""
    log = Path(run.env["XDG_STATE_HOME"]) / "shadowpoint" / "hooks.log"
    out: list[tuple[str, float]] = []
    for line in log.read_text().splitlines() if log.exists() else []:
        head, sep, tail = line.rpartition(" ok in ")
        if sep:
            out.append((head.rsplit(": ", 1)[-1], float(tail.split()[0])))
    return out


def _sidecar_start_ms(run: harness.Run) -> float:
    """The first SessionStart's time: the one that started the sidecar."""
    return next((ms for event, ms in _hook_times_ms(run) if event == "SessionStart"), 0.0)


def _own_times_ms(run: harness.Run) -> list[float]:
    """Every event's own time but the sidecar's start (the first SessionStart)."""
    times = _hook_times_ms(run)
    first = next((i for i, (event, _) in enumerate(times) if event == "SessionStart"), None)
    return [ms for i, (_, ms) in enumerate(times) if i != first]


def _counted(agent: str, root: Path, run_dir: Path) -> tuple[float, int]:
    """Wall time with a hook that only counts, and the number of hook events the agent fired."""
    counter = root / "count-hook"
    counter.parent.mkdir(parents=True, exist_ok=True)
    counter.write_text(_COUNTER)
    counter.chmod(0o755)
    count = root / "count"
    run = harness.run_agent(agent, root, run_dir, hooked=True, hook_command=shlex.quote(str(counter)),
                            extra_env={"SHADOWPOINT_BENCH_COUNT": str(count)})
    return run.outcome.wall_s, len(count.read_text().splitlines()) if count.exists() else 0


def measure(agent: str, repeat: int, work: Path, python_client: bool = False) -> dict[str, Any]:
    plain: list[float] = []
    counted: list[float] = []
    hooked: list[float] = []
    events: list[int] = []
    starts: list[float] = []
    py_hooked: list[float] = []
    py_starts: list[float] = []
    own: list[float] = []

    def one(kind: str, i: int, run_dir: Path) -> None:
        root = work / f"{i}-{kind}"
        if kind == "plain":
            plain.append(harness.run_agent(agent, root, run_dir, hooked=False).outcome.wall_s)
        elif kind == "counted":
            wall, n = _counted(agent, root, run_dir)
            counted.append(wall)
            events.append(n)
        elif kind == "python":
            command = f"{shlex.quote(sys.executable)} -I -S {shlex.quote(hookrun.__file__)} {agent}"
            run = harness.run_agent(agent, root, run_dir, hooked=True, hook_command=command)
            py_hooked.append(run.outcome.wall_s)
            py_starts.append(_sidecar_start_ms(run) / 1e3)
        else:
            run = harness.run_agent(agent, root, run_dir, hooked=True)
            hooked.append(run.outcome.wall_s)
            starts.append(_sidecar_start_ms(run) / 1e3)
            own.extend(_own_times_ms(run))

    run_dir = Path(tempfile.mkdtemp(prefix="sp-bench-"))
    try:
        harness.run_agent(agent, work / "warm-up", run_dir, hooked=False)  # caches, compiled code
        kinds = ["plain", "counted", "hooked", *(["python"] if python_client else [])]
        for i in range(repeat):
            for kind in kinds[i % len(kinds):] + kinds[:i % len(kinds)]:  # no kind always goes first
                one(kind, i, run_dir)
    finally:
        stop_sidecars(run_dir)
    med = statistics.median
    n_events = max(1, round(med(events)))
    extra: dict[str, Any] = {}
    if python_client:
        extra = {"python_client_s": med(py_hooked), "python_client_sidecar_start_s": med(py_starts),
                 "python_client_per_event_ms": (med(py_hooked) - med(plain) - med(py_starts)) / n_events * 1e3,
                 "python_client_per_event_ms_runs": _per_event_runs(py_hooked, py_starts, med(plain), n_events),
                 "python_client_per_event_ms_paired": paired(py_hooked, py_starts, plain, n_events)}
    return {
        "agent": agent, "repeat": repeat, "events": n_events,
        "plain_s": med(plain), "counted_s": med(counted), "hooked_s": med(hooked), "sidecar_start_s": med(starts),
        "per_event_ms": (med(hooked) - med(plain) - med(starts)) / n_events * 1e3,
        "per_event_ms_vs_counted": (med(hooked) - med(counted) - med(starts)) / n_events * 1e3,
        "hook_process_ms": (med(counted) - med(plain)) / n_events * 1e3,
        # the command hooks' own times (hooks.log, every hooked run's but the sidecar's start):
        # not the agent's cost of starting a process, nor the noise of its session
        "hook_own_ms_median": med(own) if own else None,
        "hook_own_ms_p95": statistics.quantiles(own, n=20)[-1] if len(own) >= 2 else None,
        # per run: (that run - the median plain - that run's sidecar start) / events: the spread
        "per_event_ms_runs": _per_event_runs(hooked, starts, med(plain), n_events),
        "per_event_ms_paired": paired(hooked, starts, plain, n_events),
        **extra,
        "raw": {"plain_s": plain, "counted_s": counted, "hooked_s": hooked, "events": events,
                "sidecar_start_s": starts, "hook_own_ms": own,
                "python_client_s": py_hooked, "python_client_sidecar_start_s": py_starts},
    }


def _per_event_runs(walls: list[float], starts: list[float], plain: float, n_events: int) -> list[float]:
    return sorted(round((w - plain - s) / n_events * 1e3, 1) for w, s in zip(walls, starts, strict=True))


def paired(walls: list[float], starts: list[float], plains: list[float], n_events: int) -> list[float]:
    """Per repetition, against the plain run of the same repetition (run next to it): less drift."""
    return sorted(round((w - p - s) / n_events * 1e3, 1) for w, s, p in zip(walls, starts, plains, strict=True))


def _ms(value: float | None) -> str:
    return "—" if value is None else f"{value:.1f} ms"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agent", action="append", choices=sorted(SESSIONS), default=None)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--python-client", action="store_true",
                        help="also run our hooks with the Python client for every event (the bash client's baseline)")
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    args = parser.parse_args(argv)
    results = []
    with tempfile.TemporaryDirectory(prefix="sp-real-agents-") as tmp:
        for agent in args.agent or sorted(SESSIONS):
            results.append(measure(agent, args.repeat, Path(tmp) / agent, args.python_client))
            r = results[-1]
            print(f"{agent:7} plain {r['plain_s']:6.2f} s  counting hook {r['counted_s']:6.2f} s  "
                  f"shadowpoint {r['hooked_s']:6.2f} s  events {r['events']:3d}  sidecar start "
                  f"{r['sidecar_start_s']:5.2f} s  per event {r['per_event_ms']:7.1f} ms "
                  f"(of which a bare hook process {r['hook_process_ms']:6.1f} ms); per run {r['per_event_ms_runs']}; "
                  f"the hooks' own times (hooks.log) median {_ms(r['hook_own_ms_median'])}, "
                  f"p95 {_ms(r['hook_own_ms_p95'])}",
                  flush=True)
            if args.python_client:
                print(f"{agent:7} Python client for every event {r['python_client_s']:6.2f} s  sidecar start "
                      f"{r['python_client_sidecar_start_s']:5.2f} s  per event "
                      f"{r['python_client_per_event_ms']:7.1f} ms; per run {r['python_client_per_event_ms_runs']}",
                      flush=True)
    if args.json:
        args.json.write_text(json.dumps({"results": results}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
