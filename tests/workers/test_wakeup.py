"""Idle workers wake when work is ready instead of waiting for their next poll.

Every worker here polls once a minute, so a run picked up within the (generous) timeouts
below was picked up because something woke the worker: a NOTIFY from another process on
PostgreSQL, an in-process signal on SQLite, or the worker's own timer for the next due run.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from worker_helpers import AGENTS

from contextos import Runtime, load_agent
from contextos.events import utcnow
from contextos.runs import RunId
from contextos.store.queue import RunQueue, queue_of
from contextos.store.wakeup import CHANNEL, PostgresWakeup
from contextos.workers import Worker, WorkerConfig, add_schedule
from support.processes import spawn_worker, stop_all, wait_until

QUICK = f"{AGENTS}:quick"
TICKER = f"{AGENTS}:ticker"

LONG_POLL_S = 60.0
"""Every worker's poll interval: far longer than any wait in these tests."""
PROMPTLY_S = 20.0
"""How long a woken worker may take (a hang guard, well under the poll interval)."""


def idle(**kw: Any) -> WorkerConfig:
    base: dict[str, Any] = {
        "poll_s": LONG_POLL_S,
        "schedule_poll_s": LONG_POLL_S,
        "lease_s": 5.0,
        "heartbeat_s": 0.5,
    }
    return WorkerConfig(**{**base, **kw})


def queue(rt: Runtime) -> RunQueue:
    q = queue_of(rt.store)
    assert q is not None
    return q


async def is_terminal(rt: Runtime, rid: RunId) -> bool:
    return (await rt.store.get_run(rid)).status.is_terminal


async def start_quick(rt: Runtime, **kw: Any) -> RunId:
    return await rt.start(load_agent(QUICK), "job", agent_ref=QUICK, **kw)


@contextlib.asynccontextmanager
async def running(worker: Worker) -> AsyncIterator[Worker]:
    task = asyncio.create_task(worker.run())
    try:
        yield worker
    finally:
        worker.stop()
        await asyncio.gather(task)


@pytest.fixture
async def runtime(backend_url: str) -> AsyncIterator[Runtime]:
    rt = Runtime(backend_url, worker_id="starter")
    try:
        await queue(rt).limits()  # opens (and migrates) the store before any worker starts
        yield rt
    finally:
        await rt.close()


# -- both backends: within one process, and timers -------------------------------------------


async def test_a_run_started_in_this_process_wakes_an_idle_worker(
    backend_url: str, runtime: Runtime
) -> None:
    # The starting runtime and the worker open the store separately, as `contextos serve` does.
    worker = Worker(backend_url, config=idle(), worker_id=f"w-{uuid.uuid4().hex[:8]}")
    async with running(worker):
        await asyncio.sleep(0.3)  # the worker has looked at the empty queue and gone idle
        rid = await start_quick(runtime)
        await wait_until(lambda: is_terminal(runtime, rid), timeout_s=PROMPTLY_S, what="the run")
    assert worker.driven == 1


async def test_an_idle_worker_wakes_when_a_delayed_run_falls_due(
    backend_url: str, runtime: Runtime
) -> None:
    # Started before the worker, so no wake-up can be what brings it: only the worker's timer.
    rid = await start_quick(runtime, not_before=utcnow() + timedelta(seconds=1.5))
    worker = Worker(backend_url, config=idle(), worker_id=f"w-{uuid.uuid4().hex[:8]}")
    async with running(worker):
        await wait_until(lambda: is_terminal(runtime, rid), timeout_s=PROMPTLY_S, what="the run")


async def test_a_new_schedule_wakes_an_idle_worker_for_its_first_tick(
    backend_url: str, runtime: Runtime
) -> None:
    q = queue(runtime)
    worker = Worker(backend_url, config=idle(), worker_id=f"w-{uuid.uuid4().hex[:8]}")
    async with running(worker):
        await asyncio.sleep(0.3)  # the worker has read the (empty) schedules and gone idle
        await add_schedule(q, "every-second", TICKER, "* * * * * *")

        async def ticked() -> bool:
            last = (await q.list_schedules())[0].last_run_id
            return last is not None and await is_terminal(runtime, last)

        await wait_until(ticked, timeout_s=PROMPTLY_S, what="the first tick's run")


# -- PostgreSQL: LISTEN/NOTIFY across processes ----------------------------------------------


def listener_pids(server: str, worker_id: str) -> list[int]:
    import psycopg

    with psycopg.connect(server, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name = %s",
            (f"contextos-wakeup {worker_id}",),
        ).fetchall()
    return [int(r[0]) for r in rows]


async def wait_for_listener(server: str, worker_id: str, *, not_pid: int | None = None) -> int:
    async def up() -> bool:
        pids = await asyncio.to_thread(listener_pids, server, worker_id)
        return any(p != not_pid for p in pids)

    await wait_until(up, timeout_s=30, what="the worker's LISTEN connection")
    pids = await asyncio.to_thread(listener_pids, server, worker_id)
    return next(p for p in pids if p != not_pid)


async def test_a_worker_process_polling_once_a_minute_picks_up_a_run_started_elsewhere(
    postgres_server: str, postgres_url: str, tmp_path: Path
) -> None:
    rt = Runtime(postgres_url, worker_id="starter")
    await queue(rt).limits()
    wid = f"w-{uuid.uuid4().hex[:8]}"
    proc = spawn_worker(
        postgres_url, tmp_path / "w.log", "--poll", str(LONG_POLL_S), "--worker-id", wid
    )
    try:
        await wait_for_listener(postgres_server, wid)
        await asyncio.sleep(0.3)  # its first look at the (empty) queue is over
        ids = [await start_quick(rt) for _ in range(3)]
        for rid in ids:

            async def done(rid: RunId = rid) -> bool:
                return await is_terminal(rt, rid)

            await wait_until(done, timeout_s=PROMPTLY_S, what="the runs")
        for rid in ids:
            entry = await queue(rt).queue_entry(rid)
            assert entry is not None and entry.lease_owner in (wid, None)
    finally:
        stop_all([proc])
        await rt.close()


async def test_a_worker_whose_listen_connection_is_killed_still_picks_up_work(
    postgres_server: str, postgres_url: str, tmp_path: Path
) -> None:
    import psycopg

    rt = Runtime(postgres_url, worker_id="starter")
    await queue(rt).limits()
    wid = f"w-{uuid.uuid4().hex[:8]}"
    proc = spawn_worker(
        postgres_url, tmp_path / "w.log", "--poll", str(LONG_POLL_S), "--worker-id", wid
    )
    try:
        first = await wait_for_listener(postgres_server, wid)
        await asyncio.sleep(0.3)
        with psycopg.connect(postgres_server, autocommit=True) as conn:
            conn.execute("SELECT pg_terminate_backend(%s)", (first,))
        # Started while nobody listens (most likely): its NOTIFY is lost; the worker must
        # reconnect and look at the queue on its own.
        lost = await start_quick(rt)
        await wait_until(lambda: is_terminal(rt, lost), timeout_s=PROMPTLY_S, what="the run")
        await wait_for_listener(postgres_server, wid, not_pid=first)
        later = await start_quick(rt)
        await wait_until(lambda: is_terminal(rt, later), timeout_s=PROMPTLY_S, what="the run")
    finally:
        stop_all([proc])
        await rt.close()
    assert "reconnecting" in (tmp_path / "w.log").read_text()


async def test_a_rolled_back_start_sends_no_wake_up_and_claims_stay_correct(
    postgres_url: str,
) -> None:
    import psycopg

    rt = Runtime(postgres_url, worker_id="starter")
    q = queue(rt)
    await q.limits()
    worker = Worker(postgres_url, config=idle(), worker_id=f"w-{uuid.uuid4().hex[:8]}")
    listen = await psycopg.AsyncConnection.connect(postgres_url, autocommit=True)
    try:
        cur = await listen.execute("SELECT current_schema()")
        row = await cur.fetchone()
        assert row is not None
        schema = str(row[0])
        await listen.execute(f"LISTEN {CHANNEL}")
        async with running(worker):
            assert isinstance(worker.wakeup, PostgresWakeup)
            await asyncio.wait_for(worker.wakeup.listening.wait(), timeout=30)
            # A start whose transaction rolls back: queue row and run row, as a start writes.
            phantom = RunId(f"phantom-{uuid.uuid4().hex[:8]}")
            async with await psycopg.AsyncConnection.connect(postgres_url) as conn:
                await conn.execute(
                    "INSERT INTO run_queue (run_id, agent_name) VALUES (%s, 'quick')", (phantom,)
                )
                await conn.execute(
                    "INSERT INTO runs (run_id, agent_name, agent_version, status, last_seq,"
                    " created_at, updated_at) VALUES (%s, 'quick', '1', 'queued', 1, now(), now())",
                    (phantom,),
                )
                await conn.rollback()
            rid = await start_quick(rt)

            async def given_back() -> bool:  # ended, and its lease released (the second wake-up)
                entry = await q.queue_entry(rid)
                return await is_terminal(rt, rid) and entry is not None and not entry.lease_owner

            await wait_until(given_back, timeout_s=PROMPTLY_S, what="the run")
            # Notifications arrive in commit order: everything sent before this marker is here.
            await listen.execute("SELECT pg_notify(%s, %s)", (CHANNEL, f"marker {schema}"))
            kinds: list[str] = []
            async for note in listen.notifies(timeout=30):
                kind, _, in_schema = note.payload.partition(" ")
                if in_schema != schema:
                    continue
                if kind == "marker":
                    break
                kinds.append(kind)
        # The real start woke the workers once; its lease given back at the end, once more.
        # The rolled-back start sent nothing.
        assert kinds == ["runs", "runs"]
        assert worker.driven == 1
        assert await q.queue_entry(phantom) is None
        assert await q.claim("someone", lease_s=5.0) is None
    finally:
        await listen.close()
        await rt.close()
