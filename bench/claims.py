"""Claim throughput of the run queue: `python -m bench.claims --store URL [--runs N]`.

Queues N runs, then one worker claims them all, one claim after another (the worker's hot path),
and prints claims per second; then renews and releases every lease the same way. Each rate is
given twice: by the wall clock, and by this process's CPU time (steadier on a busy machine; on
PostgreSQL it leaves out the server's work). Each round starts on a fresh store (a new SQLite
file, or a new schema on PostgreSQL, dropped after). Run it against a checkout of older code
with PYTHONPATH=that/src to compare; TMPDIR=/dev/shm keeps SQLite's fsyncs out of the numbers.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from urllib.parse import quote

from contextos import events as ev
from contextos.runs import RunId
from contextos.store import open_store
from contextos.store.queue import QueueEntry, queue_of

Rates = tuple[float, ...]
"""Claims, renewals and releases per second: by the wall clock, then by CPU time."""


def clocks() -> tuple[float, float]:
    return time.perf_counter(), time.process_time()


async def one_round(url: str, runs: int) -> Rates:
    """Claims, renewals and releases per second on one fresh store."""
    store = open_store(url)
    queue = queue_of(store)
    assert queue is not None
    try:
        for i in range(runs):
            run_id = RunId(f"run-{i:06d}")
            await queue.enqueue(QueueEntry(run_id=run_id, agent_name="echo"))
            created = ev.RunCreated(
                run_id=run_id, seq=1, agent_name="echo", agent_version="1", agent_hash="h", input=""
            )
            await store.append(run_id, [created], expected_seq=0)
        began = clocks()
        leases = []
        while (lease := await queue.claim("bench", lease_s=60)) is not None:
            leases.append(lease)
        claimed = clocks()
        assert len(leases) == runs, len(leases)
        for lease in leases:
            assert await queue.renew(lease, lease_s=60) is not None
        renewed = clocks()
        for lease in leases:
            assert await queue.release(lease)
        released = clocks()
    finally:
        await store.close()
    laps = [(claimed, began), (renewed, claimed), (released, renewed)]
    wall = tuple(runs / (end[0] - start[0]) for end, start in laps)
    cpu = tuple(runs / (end[1] - start[1]) for end, start in laps)
    return (*wall, *cpu)


def fresh(store: str, directory: Path) -> tuple[str, str | None]:
    """A URL for a fresh store, and the PostgreSQL schema to drop after (if any)."""
    if not store.startswith(("postgresql://", "postgres://")):
        return f"sqlite:///{directory / f'{uuid.uuid4().hex}.db'}", None
    import psycopg
    from psycopg import sql

    schema = f"bench_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(store, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    sep = "&" if "?" in store else "?"
    return f"{store}{sep}options={quote(f'-csearch_path={schema}')}", schema


def drop(store: str, schema: str | None) -> None:
    if schema is not None:
        import psycopg
        from psycopg import sql

        with psycopg.connect(store, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", default="sqlite", help="sqlite (a temporary file) or a URL")
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    results: list[Rates] = []
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.rounds):
            url, schema = fresh(args.store, Path(tmp))
            try:
                results.append(asyncio.run(one_round(url, args.runs)))
            finally:
                drop(args.store, schema)
    names = [f"{op} ({clock})" for clock in ("wall", "cpu") for op in ("claim", "renew", "release")]
    for name, values in zip(names, zip(*results, strict=True), strict=True):
        shown = ", ".join(f"{v:.0f}" for v in values)
        print(f"{name:15} median {statistics.median(values):7.0f}/s  ({shown})")


if __name__ == "__main__":
    main()
