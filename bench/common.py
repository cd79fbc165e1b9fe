"""What every system in the benchmark shares: the message, the crash signal, measuring helpers.

Only the standard library is imported here, so a worker process can time its first import of a
runtime without this module having pulled anything in already.
"""

from __future__ import annotations

import itertools
import json
import os
import resource
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

MESSAGE = ("The quick brown fox jumps over the lazy dog; " * 5)[:200]
"""The 200-character text every model sends to the echo tool and every tool returns."""

CONCURRENT_CALLS = 5
"""Model calls per run in the concurrency benchmark (4 echo calls, then the answer)."""

MODEL_SLEEP_S = 0.2
"""How long each model call sleeps in the concurrency benchmark."""

SCALE_CALLS = 5
"""Tool calls per run in the scale-out benchmark (then the answer)."""

SCALE_TOOL_S = 0.05
"""How long each of those tool calls takes (an async sleep, like a network call)."""


class Crash(BaseException):
    """Raised by a scripted model to stop a process mid-run, as a crash would.

    A BaseException, so no runtime records it as an ordinary model error: the run is left
    exactly where a killed process would leave it.
    """


def now() -> float:
    return time.perf_counter()


def cpu() -> float:
    """CPU seconds this process has used, every thread included: unlike the wall clock, it
    does not count the time a shared machine gives to other processes."""
    return time.process_time()


STAMPS: list[float] = []
"""When each model call of the measured run began: one turn lies between two stamps."""


def turn_medians(stamps: Sequence[float], k: int = 50) -> tuple[float, float]:
    """Median turn time in µs over the first `k` turns and over the last `k` turns."""
    gaps = [(b - a) * 1e6 for a, b in itertools.pairwise(stamps)]
    if not gaps:
        return float("nan"), float("nan")
    return median(gaps[:k]), median(gaps[-k:])


def peak_rss_mb() -> float:
    """Peak resident set size of this process so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def rss_mb() -> float:
    """Current resident set size of this process."""
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / (1024 * 1024)


def disk_bytes(db: Path) -> int:
    """Bytes the database takes on disk: the file plus its WAL and shared-memory files."""
    total = 0
    for suffix in ("", "-wal", "-shm", "-journal"):
        p = Path(str(db) + suffix)
        if p.exists():
            total += p.stat().st_size
    return total


def emit(result: dict[str, Any]) -> None:
    """Hand a worker's result to the driver: one JSON line on stdout."""
    sys.stdout.write("BENCH_RESULT " + json.dumps(result) + "\n")
    sys.stdout.flush()


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100)."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    k = max(0, min(len(ordered) - 1, round(q / 100 * len(ordered) + 0.5) - 1))
    return ordered[k]


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")
