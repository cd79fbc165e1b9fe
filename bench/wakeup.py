"""Start-to-pickup latency with idle workers: `python -m bench.wakeup --store URL`.

Starts idle worker processes on the store, then (from this process, as a CLI or the HTTP API
would) starts runs one at a time at random moments and measures, for each, the time from just
before `start` to the `run_started` event a worker records. On PostgreSQL it also counts the
transactions the idle workers commit per second. Run it against a checkout of older code with
PYTHONPATH=that/src to compare.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

from contextos import Agent, Runtime
from contextos import events as ev
from contextos.testing import ScriptedModel, reply

ROOT = Path(__file__).resolve().parent.parent

echo = Agent(name="echo", model=ScriptedModel([reply("done")], by_turn=True))
"""The agent every measured run starts (a single scripted answer)."""
REF = "bench.wakeup:echo"


def spawn(store: str, workers: int, poll: float | None, log: Path) -> list[subprocess.Popen[bytes]]:
    args = [sys.executable, "-m", "contextos.workers", "--store", store, "--concurrency", "2"]
    if poll is not None:
        args += ["--poll", str(poll)]
    procs = []
    with log.open("ab") as out:
        for i in range(workers):
            procs.append(
                subprocess.Popen(
                    [*args, "--worker-id", f"bench-{os.getpid()}-{i}", "--log-level", "WARNING"],
                    cwd=ROOT,
                    stdout=subprocess.DEVNULL,
                    stderr=out,
                )
            )
    return procs


async def started_at(rt: Runtime, run_id: str, timeout_s: float) -> datetime:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for event in await rt.store.read(run_id):  # type: ignore[arg-type]
            if isinstance(event, ev.RunStarted):
                return event.occurred_at
        await asyncio.sleep(0.002)
    raise TimeoutError(f"no worker started {run_id} within {timeout_s:g}s")


def transactions(url: str) -> int:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
        ).fetchone()
    assert row is not None
    return int(row[0])


async def measure(
    store: str, *, runs: int, workers: int, poll: float | None, idle_s: float, in_process: bool
) -> None:
    from contextos.workers import Worker, WorkerConfig

    rt = Runtime(store, worker_id="bench-starter")
    await rt.store.list_runs(limit=1)  # open and migrate before the workers race to
    with tempfile.TemporaryDirectory() as tmp:
        procs: list[subprocess.Popen[bytes]] = []
        tasks: list[asyncio.Task[None]] = []
        inner: list[Worker] = []
        if in_process:  # as `contextos serve` runs one: its own store object on the same URL
            config = WorkerConfig(concurrency=2) if poll is None else WorkerConfig(poll_s=poll)
            inner = [Worker(store, config=config) for _ in range(workers)]
            tasks = [asyncio.create_task(w.run()) for w in inner]
        else:
            procs = spawn(store, workers, poll, Path(tmp) / "workers.log")
        try:
            # Let the workers register and settle (first run warms each import path).
            await rt.start(echo, "warm-up", agent_ref=REF)
            await asyncio.sleep(3.0)
            postgres = store.startswith(("postgresql://", "postgres://"))
            if postgres:
                before = transactions(store)
                await asyncio.sleep(idle_s)
                per_s = (transactions(store) - before) / idle_s
            latencies: list[float] = []
            for i in range(runs):
                await asyncio.sleep(random.uniform(0.2, 1.2))  # a random phase against polls
                t0 = datetime.now(UTC)
                rid = await rt.start(echo, f"run {i}", agent_ref=REF)
                latencies.append((await started_at(rt, rid, 120.0) - t0).total_seconds() * 1e3)
        finally:
            for w in inner:
                w.stop()
            await asyncio.gather(*tasks)
            for p in procs:
                p.terminate()
            for p in procs:
                p.wait(timeout=60)
            await rt.close()
    latencies.sort()
    p95 = latencies[min(len(latencies) - 1, round(0.95 * (len(latencies) - 1)))]
    backend = "PostgreSQL" if postgres else "SQLite"
    print(
        f"{backend}: {workers} idle workers {'in this process' if in_process else 'processes'},"
        f" poll {poll if poll is not None else 'default'}:"
        f" start -> run_started median {statistics.median(latencies):.1f} ms,"
        f" p95 {p95:.1f} ms, max {latencies[-1]:.1f} ms over {runs} runs"
    )
    if postgres:
        print(f"  idle: {per_s:.1f} committed transactions/s in the database")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.wakeup", description=__doc__)
    parser.add_argument("--store", required=True, help="sqlite:///path or postgresql://…")
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument(
        "--poll", type=float, default=None, help="workers' --poll (default: theirs)"
    )
    parser.add_argument("--idle", type=float, default=10.0, help="seconds to count idle load")
    parser.add_argument(
        "--in-process", action="store_true", help="workers in this process (as `contextos serve`)"
    )
    args = parser.parse_args(argv)
    asyncio.run(
        measure(
            args.store,
            runs=args.runs,
            workers=args.workers,
            poll=args.poll,
            idle_s=args.idle,
            in_process=args.in_process,
        )
    )


if __name__ == "__main__":
    main()
