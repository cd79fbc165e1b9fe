"""Crash tests: processes killed on purpose, and reading what they left behind.

The killed side (scripts and targets imported by reference in the processes a test kills):
`KillingStore` SIGKILLs its process right after its Nth append; `log` appends a line to a
JSON-lines file in CRASH_LOG_DIR, on disk before the call goes on, so a test can count calls
across processes; `kill_once` SIGKILLs the first process at its Nth call of a step.

The test's side: `crash_env` is the environment those processes need, `kill_after` runs one
until its Nth append (`support/kill_after.py`), `resume` resumes a run through the CLI, and
`states` and `lines` read the store and the logs.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from contextos.events import Event
from contextos.runs import RunId
from contextos.state import RunState, fold
from contextos.store import SqliteStore
from support.processes import ROOT

TESTS = ROOT / "tests"


# -- the killed side ---------------------------------------------------------------------------


class KillingStore(SqliteStore):
    """A SQLite store that SIGKILLs its process right after its Nth append commits (never with
    N = 0). Appends count over every run, or over run `only`'s log when it is given. An append
    of items a function finished (`node_item_completed`) does not count: how concurrent items
    share appends depends on timing, and the Nth append must be the same one in every run."""

    def __init__(self, path: str | Path, kill_after: int, *, only: str | None = None) -> None:
        super().__init__(path)
        self.kill_after = kill_after
        self.only = only
        self.appends = 0

    async def append(
        self,
        run_id: RunId,
        events: Sequence[Event],
        *,
        expected_seq: int,
        synchronous: bool = True,
        **options: Any,
    ) -> int:
        seq = await super().append(
            run_id, events, expected_seq=expected_seq, synchronous=synchronous, **options
        )
        if self.only is not None and run_id != self.only:
            return seq
        if all(e.type == "node_item_completed" for e in events):
            return seq
        self.appends += 1
        if self.appends == self.kill_after:
            os.kill(os.getpid(), signal.SIGKILL)
        return seq


def log_dir() -> Path:
    """Where this process's calls are logged (CRASH_LOG_DIR)."""
    return Path(os.environ.get("CRASH_LOG_DIR", "."))


def log(name: str, **fields: object) -> None:
    """Append one call to `name` in the log folder, with this process's pid, and make it
    durable before going on (a SIGKILL right after must not lose it). CRASH_DELAY_S slows
    each call down, to widen the windows a kill from outside can fall in."""
    time.sleep(float(os.environ.get("CRASH_DELAY_S", "0")))
    with (log_dir() / name).open("a") as f:
        f.write(json.dumps({**fields, "pid": os.getpid()}) + "\n")
        f.flush()
        os.fsync(f.fileno())


_calls: Counter[str] = Counter()


def kill_once(step: str) -> None:
    """With CRASH_KILL_AT=`step`:N, SIGKILL this process at its Nth call of `step`, in the first
    process only (a marker file `killed` in the log folder remembers the kill, and its pid)."""
    at, _, n = os.environ.get("CRASH_KILL_AT", "").partition(":")
    _calls[step] += 1
    marker = log_dir() / "killed"
    if at == step and _calls[step] == int(n) and not marker.exists():
        marker.write_text(str(os.getpid()))
        os.kill(os.getpid(), signal.SIGKILL)


# -- the test's side ---------------------------------------------------------------------------


def crash_env(log_dir: Path, **extra: str) -> dict[str, str]:
    """The environment of a process a test kills: where its calls are logged, no colours, and
    the tests folder importable (its targets log through this module)."""
    path = os.pathsep.join(filter(None, [os.environ.get("PYTHONPATH"), str(TESTS)]))
    return {
        **os.environ,
        "CRASH_LOG_DIR": str(log_dir),
        "NO_COLOR": "1",
        "PYTHONPATH": path,
        **extra,
    }


def kill_after_command(
    db: Path,
    run_id: str,
    n: int,
    ref: str,
    text: str,
    count: Literal["all", "own"] = "all",
    service: str = "",
) -> list[str]:
    """The command that runs `ref` on `text` as run `run_id` (bound to the service principal
    `service`, if given) and SIGKILLs itself right after its Nth append (see
    `support/kill_after.py`)."""
    return [
        *(sys.executable, "-m", "support.kill_after", str(db), run_id, str(n), ref, text),
        *(count, service),
    ]


def kill_after(
    db: Path,
    run_id: str,
    n: int,
    ref: str,
    text: str,
    log_dir: Path,
    *,
    count: Literal["all", "own"] = "all",
    timeout_s: float = 120,
    **extra: str,
) -> subprocess.CompletedProcess[str]:
    """Run `ref` in a process killed right after its Nth append (N = 0: a clean run, which
    prints how many appends it made); `extra` is more of its environment (CRASH_KILL_AT)."""
    command = kill_after_command(db, run_id, n, ref, text, count)
    return run(command, log_dir, timeout_s=timeout_s, **extra)


def resume(db: Path, run_id: str, log_dir: Path, **extra: str) -> subprocess.CompletedProcess[str]:
    """`contextos resume RUN_ID --json` in a fresh process."""
    command = [sys.executable, "-m", "contextos", "resume", run_id, "--store", str(db), "--json"]
    return run(command, log_dir, **extra)


def run(
    command: Sequence[str], log_dir: Path, *, timeout_s: float = 120, **extra: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        command,
        cwd=ROOT,
        env=crash_env(log_dir, **extra),
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


def states(db: Path) -> dict[str, RunState]:
    """Every run in the store, folded."""

    async def read() -> dict[str, RunState]:
        store = SqliteStore(db)
        try:
            runs = await store.list_runs(limit=1000)
            return {r.run_id: fold(await store.read(r.run_id)) for r in runs}
        finally:
            await store.close()

    return asyncio.run(read()) if db.exists() else {}


def lines(path: Path) -> list[dict[str, object]]:
    """The records of a JSON-lines log (none when nothing wrote it)."""
    return [json.loads(x) for x in path.read_text().splitlines() if x] if path.exists() else []
