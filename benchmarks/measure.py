"""Measurement values for the benchmarks: `Series` of samples, `Target`s, `ScenarioResult`s,
the structlog `EventTap` that keeps the engine's own timings, and progress lines on stderr.

Used by the scenarios and the report on the runner's main thread; the tap is also called
from the engine's baseline thread, so it appends under a lock.
"""

from __future__ import annotations

import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator, MutableMapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import structlog

_STARTED = time.perf_counter()


def progress(message: str) -> None:
    """One progress line on stderr (stdout carries the table)."""
    print(f"[{time.perf_counter() - _STARTED:7.1f}s] {message}", file=sys.stderr, flush=True)


def fmt_value(value: float | None, unit: str) -> str:
    """Human form of a measurement: `3.1 ms`, `1.92 s`, `151 MB`."""
    if value is None:
        return "—"
    if unit == "s":
        if value < 1e-3:
            return f"{value * 1e6:.0f} µs"
        if value < 1:
            return f"{value * 1e3:.3g} ms"
        return f"{value:.3g} s"
    return f"{value:.4g} {unit}"


@dataclass(slots=True)
class Series:
    """Repeated samples of one measure (seconds, or MB for memory and disk)."""

    samples: list[float] = field(default_factory=list)

    @property
    def median(self) -> float:
        return float(statistics.median(self.samples))

    @property
    def min(self) -> float:
        return float(min(self.samples))

    def add(self, value: float) -> None:
        self.samples.append(value)

    def to_json(self) -> dict[str, Any]:
        return {"median": self.median, "min": self.min, "samples": list(self.samples)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Series:
        return cls([float(x) for x in data["samples"]])


@dataclass(frozen=True, slots=True)
class Target:
    """A quality bar (issue 6): ours/rival at most `max_ratio`, or ours at most `max_value`,
    or ours at most `max_growth` times our own earlier figure (issue 14: a task's late rounds
    against its first ones)."""

    text: str
    max_ratio: float | None = None
    max_value: float | None = None
    max_growth: float | None = None

    def check(self, ours: float | None, ratio: float | None, growth: float | None = None) -> str:
        if ours is None:
            return "—"
        if self.max_growth is not None:
            if growth is None:
                return "—"
            return "PASS" if growth <= self.max_growth else "MISS"
        if self.max_ratio is not None:
            if ratio is None:
                return "—"
            return "PASS" if ratio <= self.max_ratio else "MISS"
        if self.max_value is not None:
            return "PASS" if ours <= self.max_value else "MISS"
        return "—"

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"text": self.text, "max_ratio": self.max_ratio, "max_value": self.max_value}
        if self.max_growth is not None:
            out["max_growth"] = self.max_growth
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> Target | None:
        if not data:
            return None
        return cls(data["text"], data.get("max_ratio"), data.get("max_value"), data.get("max_growth"))


@dataclass(slots=True)
class ScenarioResult:
    """One row of the table: our median beside the rival's, or why the row was skipped."""

    name: str
    title: str
    unit: str
    ours: Series | None = None
    rival_name: str | None = None
    rival: Series | None = None
    target: Target | None = None
    skipped: str | None = None
    error: str | None = None
    notes: list[str] = field(default_factory=list)
    early: Series | None = None  # our own earlier figure (`Target.max_growth`): a long task's first rounds

    @property
    def growth(self) -> float | None:
        """Ours against our own earlier figure (`early`)."""
        if self.ours is None or not self.ours.samples or self.early is None or not self.early.samples \
                or self.early.median <= 0:
            return None
        return self.ours.median / self.early.median

    @property
    def ratio(self) -> float | None:
        if self.ours is None or self.rival is None or not self.rival.samples or self.rival.median <= 0:
            return None
        return self.ours.median / self.rival.median

    @property
    def status(self) -> str:
        if self.error is not None:
            return "ERROR"
        if self.skipped is not None:
            return "skipped"
        if self.target is None:
            return "—"
        return self.target.check(self.ours.median if self.ours and self.ours.samples else None, self.ratio,
                                 self.growth)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "title": self.title,
            "unit": self.unit,
            "ours": self.ours.to_json() if self.ours and self.ours.samples else None,
            "rival_name": self.rival_name,
            "rival": self.rival.to_json() if self.rival and self.rival.samples else None,
            "ratio": self.ratio,
            "target": self.target.to_json() if self.target else None,
            "status": self.status,
            "skipped": self.skipped,
            "error": self.error,
            "notes": list(self.notes),
            **({"early": self.early.to_json(), "growth": self.growth} if self.early and self.early.samples else {}),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ScenarioResult:
        return cls(
            name=data["name"],
            title=data["title"],
            unit=data["unit"],
            ours=Series.from_json(data["ours"]) if data.get("ours") else None,
            rival_name=data.get("rival_name"),
            rival=Series.from_json(data["rival"]) if data.get("rival") else None,
            target=Target.from_json(data.get("target")),
            skipped=data.get("skipped"),
            error=data.get("error"),
            notes=list(data.get("notes", [])),
            early=Series.from_json(data["early"]) if data.get("early") else None,
        )


@contextmanager
def stopwatch() -> Iterator[Callable[[], float]]:
    """`with stopwatch() as elapsed: ...; elapsed()` gives the seconds spent inside the block."""
    start = time.perf_counter()
    end: list[float] = []
    try:
        yield lambda: (end[0] if end else time.perf_counter()) - start
    finally:
        end.append(time.perf_counter())


class EventTap:
    """A structlog processor that keeps chosen engine events and drops the rest.

    Warnings and errors still reach stderr; info and debug lines are kept only when their
    event name is in `wanted` (e.g. `round.checkpointed` with its `rescan` flag).
    """

    WANTED = frozenset({"round.checkpointed", "task.baseline_built", "watcher.started", "watcher.degraded"})
    LOUD = frozenset({"warning", "error", "critical", "exception"})

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._events: list[dict[str, Any]] = []

    def __call__(self, logger: Any, method_name: str, event_dict: MutableMapping[str, Any]) -> Any:
        if event_dict.get("event") in self.WANTED:
            with self._lock:
                self._events.append(dict(event_dict))
        if method_name in self.LOUD:
            return event_dict
        raise structlog.DropEvent

    def mark(self) -> int:
        with self._lock:
            return len(self._events)

    def since(self, mark: int, event: str) -> list[dict[str, Any]]:
        with self._lock:
            return [e for e in self._events[mark:] if e.get("event") == event]


@contextmanager
def tapped_logging(tap: EventTap) -> Iterator[None]:
    """Route structlog through `tap` (warnings to stderr) and restore the old set-up after."""
    old = structlog.get_config()
    structlog.configure(
        processors=[tap, structlog.processors.add_log_level, structlog.dev.ConsoleRenderer(colors=False)],
        wrapper_class=structlog.make_filtering_bound_logger(0),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )
    try:
        yield
    finally:
        structlog.configure(**old)
