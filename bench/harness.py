# ruff: noqa: RUF001, RUF002
"""What the benchmark driver and its sections share: the plan, worker processes, statistics and
formatting, and the report the sections add to.

Only the standard library and `bench.common` are imported here, so any section can import it at
the top of its module.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.common import median

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True, kw_only=True)
class Plan:
    """How much to measure: the default run, or `--quick` for a smoke test."""

    turn_rounds: int
    storage_turns: tuple[int, ...]
    recovery_rounds: int
    concurrency: tuple[tuple[int, int, bool], ...]
    """(runs at once, rounds, whether the peers run too)."""
    startup_rounds: int


DEFAULT = Plan(
    turn_rounds=7,
    storage_turns=(50, 200, 1000),
    recovery_rounds=7,  # a load takes milliseconds: cheap to repeat, and noisy on a shared VM
    # LangGraph needs about a minute and a half for 1,000 runs here: only with --full.
    concurrency=((200, 2, True), (1000, 1, False)),
    startup_rounds=3,
)
FULL = Plan(
    turn_rounds=9,
    storage_turns=(50, 200, 1000),
    recovery_rounds=9,
    concurrency=((200, 3, True), (1000, 1, True)),
    startup_rounds=5,
)
QUICK = Plan(
    turn_rounds=2,
    storage_turns=(20, 50, 100),
    recovery_rounds=1,
    concurrency=((200, 1, True),),
    startup_rounds=1,
)


# -- workers ----------------------------------------------------------------------------------


class WorkerFailed(RuntimeError):
    pass


def worker(system: str, action: str, timeout_s: float = 900, **kwargs: Any) -> dict[str, Any]:
    """Run one measurement in a fresh process and return its result."""
    cmd = [sys.executable, "-m", "bench.worker", system, action, json.dumps(kwargs)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s)
    for line in proc.stdout.splitlines():
        if line.startswith("BENCH_RESULT "):
            result: dict[str, Any] = json.loads(line.removeprefix("BENCH_RESULT "))
            return result
    raise WorkerFailed(
        f"{system} {action} {kwargs} exited {proc.returncode}:\n{proc.stderr[-3000:]}"
    )


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def rounds(n: int, systems: Sequence[str]) -> list[list[str]]:
    """The order of systems in each round: flipped every other round."""
    return [list(systems) if r % 2 == 0 else list(reversed(systems)) for r in range(n)]


# -- statistics and formatting ----------------------------------------------------------------


def spread(values: Sequence[float], fmt: Callable[[float], str]) -> str:
    """`median (min–max)`, or just the value for one sample."""
    if not values:
        return "—"
    if len(values) == 1:
        return fmt(values[0])
    return f"{fmt(median(values))} ({fmt(min(values))}–{fmt(max(values))})"


def us(v: float) -> str:
    return f"{v:,.0f} µs"


def ms(v: float) -> str:
    return f"{v:,.1f} ms" if v < 100 else f"{v:,.0f} ms"


def sec(v: float) -> str:
    return f"{v:.2f} s"


def times(v: float) -> str:
    if v < 0.1:
        return f"{v:.2f}×"
    return f"{v:.1f}×" if v < 100 else f"{v:,.0f}×"


def mb(v: float) -> str:
    return f"{v:,.1f} MB"


def size(n: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:,.1f} {unit}"
    return f"{n:,.0f} B"


def ratios(a: Sequence[float], b: Sequence[float]) -> list[float]:
    """a[i] / b[i] for each round."""
    return [x / y for x, y in zip(a, b, strict=False) if y]


def growth_exponent(points: Sequence[tuple[int, float]]) -> float:
    """Least-squares slope of log(bytes) over log(turns)."""
    xs = [math.log(n) for n, _ in points]
    ys = [math.log(b) for _, b in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    num = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True))
    den = sum((x - mx) ** 2 for x in xs)
    return num / den if den else float("nan")


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


@dataclass
class Report:
    """What the run found: markdown sections and the target checks."""

    sections: list[str] = field(default_factory=list)
    targets: list[tuple[str, str, bool | None]] = field(default_factory=list)
    """(target, measured, met); None when not measured in this run."""
    facts: dict[str, Any] = field(default_factory=dict)
    """Figures a section notes for the closing prose (`bench.explain.misses`)."""

    def add(self, text: str) -> None:
        self.sections.append(text)
        print("\n" + text + "\n", flush=True)

    def target(self, what: str, measured: str, met: bool | None) -> None:
        self.targets.append((what, measured, met))
