"""`python -m tests.faults.paused_sidecar`: `shadowpoint serve` that stops at a chosen moment.

Kill tests aim by construction, never by a sleep sized to a measured duration: the sidecar
wraps one function (`PausePoint.target`, "module:Qualified.name"); once armed, the call after
`after` calls writes the marker file and blocks that thread for good, so the test waits for
the marker and kill -9s a process that is exactly there (e.g. a restore with N files
renamed into place, a baseline with N files hashed, a collection with its pack written).

Armed from the start, or only once the `arm` file exists (the test creates it right before
the request it aims at, so the set-up before does not count).
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import threading
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ENV = "SP_TEST_PAUSE"  # not SHADOWPOINT_*: no setting of the product
REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class PausePoint:
    target: str  # "shadowpoint.module:Class.method" or "module:function"
    after: int  # calls let through once armed
    marker: str  # written (whole, by a rename) when the pause begins
    arm: str | None = None  # the pause counts calls only while this file exists

    def env(self) -> dict[str, str]:
        """Environment for `SidecarProcess(env=..., argv=ARGV)`."""
        return {ENV: json.dumps(asdict(self)), "PYTHONPATH": str(REPO)}

    def wait(self, proc: Any, timeout_s: float = 300) -> None:
        """Wait (never asserting a duration) until the sidecar is paused there."""
        from tests.conftest import wait_for

        def paused() -> bool:
            if os.path.exists(self.marker):
                return True
            if proc.poll() is not None:
                raise AssertionError(f"the sidecar exited ({proc.returncode}) before pausing at {self.target}")
            return False

        wait_for(paused, f"the sidecar never reached {self.target} (call {self.after + 1})", timeout_s)


ARGV = [sys.executable, "-m", "tests.faults.paused_sidecar"]


def _install(point: PausePoint) -> None:
    module_name, _, qualname = point.target.partition(":")
    owner: Any = importlib.import_module(module_name)
    *parents, name = qualname.split(".")
    for part in parents:
        owner = getattr(owner, part)
    original = getattr(owner, name)
    lock = threading.Lock()
    calls = 0

    def paused(*args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        if point.arm is None or os.path.exists(point.arm):
            with lock:
                calls += 1
                now = calls
            if now == point.after + 1:
                tmp = point.marker + ".tmp"
                Path(tmp).write_text(f"{os.getpid()} {threading.current_thread().name}\n")
                os.replace(tmp, point.marker)
                threading.Event().wait()  # until the test kills the process
        return original(*args, **kwargs)

    setattr(owner, name, paused)


def main() -> int:
    _install(PausePoint(**json.loads(os.environ[ENV])))
    from shadowpoint.cli import main as cli_main

    return cli_main(["serve"])


if __name__ == "__main__":
    sys.exit(main())
