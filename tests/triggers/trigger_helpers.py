"""Helpers for the trigger tests: worker processes, waiting, and what started each run."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

from contextos import Runtime
from contextos import events as ev
from contextos.runs import RunId
from contextos.store.queue import RunQueue, queue_of

ROOT = Path(__file__).resolve().parents[2]
AGENTS = "tests/triggers/trigger_agents.py"
WRITER = f"{AGENTS}:writer"
FAILING_WRITER = f"{AGENTS}:failing_writer"
REVIEWER = f"{AGENTS}:reviewer"
PUBLISHER = f"{AGENTS}:publisher"
LOOPER = f"{AGENTS}:looper"
GATED = f"{AGENTS}:gated"


def queue(rt: Runtime) -> RunQueue:
    q = queue_of(rt.store)
    assert q is not None
    return q


def spawn_worker(
    store_url: str, log: Path, *args: str, env: dict[str, str] | None = None
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
                "--lease",
                "2",
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


async def created(rt: Runtime, run_id: str) -> ev.RunCreated:
    first = (await rt.events(run_id))[0]
    assert isinstance(first, ev.RunCreated)
    return first


async def runs_of(rt: Runtime, agent: str) -> list[RunId]:
    """Every run of an agent, by name."""
    return [r.run_id for r in await rt.runs(limit=1000) if r.agent_name == agent]


async def started_after(rt: Runtime, agent: str) -> dict[str, list[RunId]]:
    """Runs of `agent` by the source run whose ending started them."""
    out: dict[str, list[RunId]] = {}
    for run_id in await runs_of(rt, agent):
        source = (await created(rt, run_id)).metadata.get("source_run")
        out.setdefault(str(source), []).append(run_id)
    return out
