"""Helpers for the worker tests: worker processes, waiting, and reading event logs."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from contextos import events as ev

ROOT = Path(__file__).resolve().parents[2]
AGENTS = "tests/workers/agents.py"


def spawn_worker(
    store_url: str,
    log: Path,
    *args: str,
    env: dict[str, str] | None = None,
    lease_s: float = 2.0,
    concurrency: int = 4,
) -> subprocess.Popen[bytes]:
    """Start `python -m contextos.workers` on the store, logging to `log`."""
    with log.open("ab") as out:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "contextos.workers",
                "--store",
                store_url,
                "--concurrency",
                str(concurrency),
                "--lease",
                str(lease_s),
                "--poll",
                "0.1",
                "--heartbeat",
                "0.5",
                *args,
            ],
            cwd=ROOT,
            env={**os.environ, **(env or {})},
            stdout=subprocess.DEVNULL,
            stderr=out,
        )


def create_effect_tables(conn: Any) -> None:
    """`effect_attempts`: every execution of the chaos tool; `effects`: what the provider did.

    `effects` has no unique key on purpose: a call executed twice would leave two rows.
    """
    conn.execute(
        "CREATE TABLE effect_attempts (key TEXT NOT NULL, run_id TEXT NOT NULL,"
        " call_id TEXT NOT NULL, pid INTEGER NOT NULL)"
    )
    conn.execute(
        "CREATE TABLE effects (key TEXT NOT NULL, run_id TEXT NOT NULL, call_id TEXT NOT NULL,"
        " step INTEGER NOT NULL, pid INTEGER NOT NULL)"
    )


def stop_all(procs: Sequence[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        if p.poll() is None:
            p.kill()
    for p in procs:
        p.wait(timeout=30)


async def wait_until(
    check: Callable[[], Awaitable[bool]], *, timeout_s: float = 60.0, what: str = "condition"
) -> None:
    """Poll `check` until it holds; fail after `timeout_s` (a hang, not a timing claim)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not await check():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


def overlapping_writers(events: Sequence[ev.Event]) -> list[str]:
    """Events a worker wrote after another worker had started the run: two at once.

    After `RunStarted(worker=W)`, every event written by a worker must be W's until the next
    RunStarted; anything else means two workers drove the run at the same time.
    """
    problems: list[str] = []
    owner: str | None = None
    for e in events:
        if isinstance(e, ev.RunStarted):
            owner = e.worker_id
        if e.actor.startswith("worker:") and isinstance(e, ev.RuntimeCrashDetected):
            continue  # written by the new worker just before its RunStarted
        if e.actor.startswith("worker:") and e.actor != f"worker:{owner}":
            problems.append(f"{e.run_id} #{e.seq} {e.type} by {e.actor}, but {owner} had it")
    return problems
