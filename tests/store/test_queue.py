"""The run queue, on both backends: priorities, idempotency keys, leases, timers, limits,
wake-ups, the worker registry, schedule and trigger rows, and the firings runs' endings owe."""

from __future__ import annotations

import asyncio
import re
import sqlite3
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import closing
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from contextos import Agent, Runtime
from contextos import events as ev
from contextos.errors import ConfigError
from contextos.runs import RunId, RunStatus
from contextos.store import EventStore, open_store, wakeup
from contextos.store.queue import (
    CatchUp,
    ConcurrencyLimit,
    Firing,
    Lease,
    LimitScope,
    QueueEntry,
    RunQueue,
    Schedule,
    Trigger,
    TriggerKind,
    TriggerOn,
    WorkerInfo,
    WorkerStatus,
    queue_of,
)
from contextos.testing import ScriptedModel, reply
from support.processes import wait_until


def created(run_id: str, agent: str) -> ev.RunCreated:
    return ev.RunCreated(
        run_id=RunId(run_id), seq=1, agent_name=agent, agent_version="1", agent_hash="h", input="x"
    )


@pytest.fixture
async def store(backend_url: str) -> AsyncIterator[EventStore]:
    s = open_store(backend_url)
    try:
        yield s
    finally:
        await s.close()


def q(store: EventStore) -> RunQueue:
    queue = queue_of(store)
    assert queue is not None
    return queue


async def new_run(
    store: EventStore,
    run_id: str,
    *,
    priority: int = 0,
    tenant: str = "",
    agent: str = "clerk",
    key: str | None = None,
    not_before: datetime | None = None,
) -> RunId:
    owner, _ = await q(store).enqueue(
        QueueEntry(
            run_id=RunId(run_id),
            priority=priority,
            tenant=tenant,
            agent_name=agent,
            idempotency_key=key,
            not_before=not_before,
        )
    )
    if owner == run_id:
        await store.append(owner, [created(run_id, agent)], expected_seq=0)
    return owner


async def claim_all(queue: RunQueue, worker: str = "w1", **kw: object) -> list[Lease]:
    out = []
    while (lease := await queue.claim(worker, lease_s=30, **kw)) is not None:  # type: ignore[arg-type]
        out.append(lease)
    return out


async def claim_eventually(queue: RunQueue, worker: str, lease_s: float = 30) -> Lease:
    while (lease := await queue.claim(worker, lease_s=lease_s)) is None:
        await asyncio.sleep(0.05)
    return lease


async def to_status(store: EventStore, run_id: str, event_cls: type, **fields: object) -> None:
    summary = await store.get_run(RunId(run_id))
    event = event_cls(run_id=RunId(run_id), seq=summary.last_seq + 1, **fields)
    await store.append(RunId(run_id), [event], expected_seq=summary.last_seq)


# -- order ------------------------------------------------------------------------------------


async def test_claims_go_by_priority_then_start_order(store: EventStore) -> None:
    for rid, prio in [("a", 0), ("b", 5), ("c", 1), ("d", 0), ("e", 5)]:
        await new_run(store, rid, priority=prio)
    leases = await claim_all(q(store))
    assert [lease.run_id for lease in leases] == ["b", "e", "c", "a", "d"]
    assert all(lease.worker_id == "w1" and not lease.recovered for lease in leases)


async def test_only_created_queued_or_running_runs_are_claimed(store: EventStore) -> None:
    await new_run(store, "queued")
    await new_run(store, "done")
    await to_status(store, "done", ev.RunCompleted, output="ok")
    await new_run(store, "waiting")
    await to_status(store, "waiting", ev.RunStarted, worker_id="w0")
    await to_status(store, "waiting", ev.InterruptRaised, interrupt_id="i1", kind="approval")
    # Queued, but its RunCreated was never recorded (its start died): nothing to drive yet.
    await q(store).enqueue(QueueEntry(run_id=RunId("half"), agent_name="clerk"))
    # Created without the queue (a plain append): driven by whoever created it.
    await store.append(RunId("unqueued"), [created("unqueued", "clerk")], expected_seq=0)

    assert [lease.run_id for lease in await claim_all(q(store))] == ["queued"]


# -- idempotency ------------------------------------------------------------------------------


async def test_an_idempotency_key_belongs_to_the_first_run(store: EventStore) -> None:
    first = await new_run(store, "r1", key="order-17")
    second = await new_run(store, "r2", key="order-17")
    assert first == second == "r1"
    assert [r.run_id for r in await store.list_runs()] == ["r1"]
    entry = await q(store).queue_entry(RunId("r1"))
    assert entry is not None and entry.idempotency_key == "order-17"
    assert await q(store).queue_entry(RunId("r2")) is None


async def test_a_duplicate_start_returns_the_existing_run(backend_url: str) -> None:
    agent = Agent(name="clerk", model=ScriptedModel([reply("ok")]))
    async with Runtime(backend_url) as rt:
        first = await rt.start(agent, "x", idempotency_key="invoice-9", priority=3, tenant="acme")
        again = await rt.start(agent, "something else", idempotency_key="invoice-9")
        other = await rt.start(agent, "x", idempotency_key="invoice-10")
        assert again == first != other
        assert len(await rt.runs()) == 2
        assert (await rt.state(first)).input == "x"
        entry = await q(rt.store).queue_entry(first)
        assert entry is not None
        assert (entry.priority, entry.tenant, entry.agent_name) == (3, "acme", "clerk")


async def test_a_priority_that_is_no_integer_or_out_of_range_is_refused_at_once(
    tmp_path: Path,
) -> None:
    """Refused with the reason and nothing recorded (a float once made the range check walk
    all 2**32 priorities)."""
    agent = Agent(name="clerk", model=ScriptedModel([reply("ok")]))
    async with Runtime(str(tmp_path / "runs.db")) as rt:
        for bad, why in (
            (1.5, "is not an integer"),
            ("5", "is not an integer"),
            (True, "is not an integer"),
            (2**31, "is out of range"),
        ):
            with pytest.raises(ConfigError, match=re.escape(f"priority {bad!r} {why}: use an")):
                await rt.start(agent, "x", priority=bad)  # type: ignore[arg-type]
        assert await rt.runs() == []
        lowest = await rt.start(agent, "x", priority=-(2**31))
        entry = await q(rt.store).queue_entry(lowest)
        assert entry is not None and entry.priority == -(2**31)


async def test_a_start_that_died_before_recording_its_run_is_finished_by_the_next(
    backend_url: str,
) -> None:
    agent = Agent(name="clerk", model=ScriptedModel([reply("ok")]))
    async with Runtime(backend_url) as rt:
        # The first start queued the run under its key, then its process died.
        await q(rt.store).enqueue(
            QueueEntry(run_id=RunId("run_reserved"), agent_name="clerk", idempotency_key="k1")
        )
        rid = await rt.start(agent, "x", idempotency_key="k1")
        assert rid == "run_reserved"
        assert (await rt.state(rid)).status is RunStatus.QUEUED


async def test_a_run_queued_for_its_starter_is_leased_to_it_from_the_first_instant(
    store: EventStore,
) -> None:
    queue = q(store)
    owner, lease = await queue.enqueue(
        QueueEntry(run_id=RunId("r1"), agent_name="clerk"), lease_owner="w1"
    )
    await store.append(owner, [created("r1", "clerk")], expected_seq=0)
    assert owner == "r1" and lease is not None
    assert (lease.run_id, lease.worker_id, lease.attempts, lease.recovered) == (
        "r1",
        "w1",
        0,
        False,
    )
    entry = await queue.queue_entry(RunId("r1"))
    assert entry is not None and entry.lease_owner == "w1"
    assert entry.lease_expires_at == lease.expires_at and entry.enqueued_at is not None
    # The lease runs 30 s by default from the instant the run was queued (one statement).
    lease_s = (lease.expires_at - entry.enqueued_at).total_seconds()
    assert abs(lease_s - 30) < 0.001
    assert await queue.claim("w2", lease_s=30) is None  # held by its starter
    renewed = await queue.renew(lease, lease_s=30)
    assert renewed is not None and renewed.token == lease.token
    assert await queue.release(lease) is True
    claimed = await queue.claim("w2", lease_s=30)
    assert claimed is not None and claimed.token > lease.token and not claimed.recovered


async def test_a_run_queued_for_any_worker_is_held_by_nobody(store: EventStore) -> None:
    await new_run(store, "r1", priority=2, tenant="acme", agent="auditor", key="k1")
    entry = await q(store).queue_entry(RunId("r1"))
    assert entry is not None and entry.run_id == "r1"
    assert (entry.priority, entry.tenant, entry.agent_name, entry.idempotency_key) == (
        2,
        "acme",
        "auditor",
        "k1",
    )
    assert (entry.lease_owner, entry.lease_expires_at, entry.not_before) == (None, None, None)
    assert entry.enqueued_at is not None and entry.attempts == 0
    assert await q(store).queue_entry(RunId("r2")) is None
    assert await q(store).enqueue(QueueEntry(run_id=RunId("r2"))) == ("r2", None)  # no lease


async def test_queueing_a_taken_run_id_again_changes_nothing(store: EventStore) -> None:
    queue = q(store)
    await new_run(store, "r1", priority=1, key="k1")
    # The same id again, without a key or under another one: the first entry stays as it was.
    for key in (None, "k2"):
        again = QueueEntry(run_id=RunId("r1"), priority=9, agent_name="clerk", idempotency_key=key)
        assert await queue.enqueue(again, lease_owner="w1") == ("r1", None)
    entry = await queue.queue_entry(RunId("r1"))
    assert entry is not None
    assert (entry.priority, entry.idempotency_key, entry.lease_owner) == (1, "k1", None)


async def test_concurrent_duplicate_starts_create_one_run(backend_url: str) -> None:
    agent = Agent(name="clerk", model=ScriptedModel([reply("ok")]))
    runtimes = [Runtime(backend_url) for _ in range(3)]
    try:
        ids = await asyncio.gather(
            *(rt.start(agent, "x", idempotency_key="same") for rt in runtimes for _ in range(3))
        )
        assert len(set(ids)) == 1
        assert len(await runtimes[0].runs()) == 1
    finally:
        for rt in runtimes:
            await rt.close()


# -- leases -----------------------------------------------------------------------------------


async def test_a_leased_run_is_claimed_again_only_after_its_lease_expires(
    store: EventStore,
) -> None:
    queue = q(store)
    await new_run(store, "r1")
    first = await queue.claim("w1", lease_s=1.0)
    assert first is not None and first.run_id == "r1"
    assert await queue.claim("w2", lease_s=30) is None  # held

    second = await claim_eventually(queue, "w2")  # w1 stopped renewing
    assert second.run_id == "r1" and second.recovered and second.attempts == 1
    assert second.token > first.token
    renewed = await queue.renew(second, lease_s=30)  # a renewed lease is still the one it was
    assert renewed is not None and renewed.recovered and renewed.attempts == 1
    assert (renewed.run_id, renewed.worker_id, renewed.token) == ("r1", "w2", second.token)
    # The old holder can neither renew nor give back what is no longer its own.
    assert await queue.renew(first, lease_s=30) is None
    assert await queue.release(first) is False
    entry = await queue.queue_entry(RunId("r1"))
    assert entry is not None and entry.lease_owner == "w2"


async def test_renewing_keeps_the_run_and_releasing_gives_it_back(store: EventStore) -> None:
    queue = q(store)
    await new_run(store, "r1")
    lease = await queue.claim("w1", lease_s=2.0)
    assert lease is not None
    current = lease
    for _ in range(4):  # 2.8 s in all: longer than the lease, which only renewing explains
        await asyncio.sleep(0.7)
        renewed = await queue.renew(current, lease_s=2.0)
        assert renewed is not None and renewed.token == lease.token
        assert renewed.expires_at > current.expires_at
        current = renewed
        assert await queue.claim("w2", lease_s=30) is None
    assert await queue.release(lease) is True
    again = await queue.claim("w2", lease_s=30)
    assert again is not None and not again.recovered and again.attempts == 0


async def test_acquire_takes_the_lease_from_its_holder(store: EventStore) -> None:
    queue = q(store)
    await new_run(store, "r1")
    held = await queue.claim("w1", lease_s=30)
    assert held is not None
    taken = await queue.acquire(RunId("r1"), "cli", lease_s=30)
    assert taken.worker_id == "cli" and taken.token > held.token
    assert await queue.renew(held, lease_s=30) is None
    assert await queue.release(held) is False
    assert await queue.claim("w2", lease_s=30) is None
    entry = await queue.queue_entry(RunId("r1"))
    assert entry is not None and (entry.lease_owner, entry.lease_expires_at) == (
        "cli",
        taken.expires_at,
    )
    # A run that was never queued (started without a queue) gets its queue row and lease.
    await store.append(RunId("r2"), [created("r2", "auditor")], expected_seq=0)
    fresh = await queue.acquire(RunId("r2"), "cli", lease_s=30)
    assert (fresh.run_id, fresh.worker_id, fresh.attempts) == ("r2", "cli", 0)
    entry = await queue.queue_entry(RunId("r2"))
    assert entry is not None and (entry.agent_name, entry.lease_owner) == ("auditor", "cli")
    assert await queue.renew(fresh, lease_s=30) is not None


async def test_take_refuses_a_live_lease_of_another_holder(store: EventStore) -> None:
    queue = q(store)
    await new_run(store, "r1")
    held = await queue.claim("w1", lease_s=30)
    assert held is not None
    assert await queue.take(RunId("r1"), "cli", lease_s=30) is None
    assert await queue.renew(held, lease_s=30) is not None  # the holder still holds it
    # A parent hosting its child does not take the lease its own worker loop claimed.
    assert await queue.take(RunId("r1"), "w1", lease_s=30, reenter=False) is None
    assert await queue.renew(held, lease_s=30) is not None
    again = await queue.take(RunId("r1"), "w1", lease_s=30)  # its own lease: taken anew
    assert again is not None and again.token > held.token
    assert await queue.release(again)
    assert await queue.release(await queue.acquire(RunId("r1"), "w1", lease_s=30), failed=True)
    taken = await queue.take(RunId("r1"), "cli", lease_s=30)  # nobody holds it
    assert taken is not None and (taken.run_id, taken.worker_id, taken.attempts) == ("r1", "cli", 1)
    entry = await queue.queue_entry(RunId("r1"))
    assert entry is not None and entry.lease_expires_at == taken.expires_at
    assert await queue.renew(taken, lease_s=30) is not None


async def test_take_takes_an_expired_lease(store: EventStore) -> None:
    queue = q(store)
    await new_run(store, "r1")
    held = await queue.claim("w1", lease_s=0.2)
    assert held is not None

    async def taken() -> bool:
        return await queue.take(RunId("r1"), "cli", lease_s=30) is not None

    await wait_until(taken, what="the lapsed lease to be taken")
    assert await queue.renew(held, lease_s=30) is None


async def test_a_release_with_a_timer_is_a_durable_not_before(
    backend_url: str, store: EventStore
) -> None:
    queue = q(store)
    await new_run(store, "r1")
    lease = await queue.claim("w1", lease_s=30)
    assert lease is not None
    later = datetime.now(UTC) + timedelta(hours=1)
    assert await queue.release(lease, not_before=later, failed=True)
    entry = await queue.queue_entry(RunId("r1"))
    assert entry is not None and entry.attempts == 1 and entry.lease_owner is None
    assert entry.not_before is not None and abs((entry.not_before - later).total_seconds()) < 0.01
    # Another process (a restarted worker) sees the same timer.
    other = open_store(backend_url)
    try:
        assert await q(other).claim("w2", lease_s=30) is None
    finally:
        await other.close()

    lease2 = await queue.acquire(RunId("r1"), "w1", lease_s=30)
    assert (lease2.run_id, lease2.worker_id, lease2.attempts) == ("r1", "w1", 1)
    await queue.release(lease2, not_before=datetime.now(UTC) - timedelta(seconds=1))
    again = await queue.claim("w2", lease_s=30)
    assert again is not None and again.attempts == 1


async def test_a_delayed_start_waits_for_its_time(store: EventStore) -> None:
    await new_run(store, "later", not_before=datetime.now(UTC) + timedelta(hours=1))
    await new_run(store, "now", not_before=datetime.now(UTC) - timedelta(seconds=1))
    assert [lease.run_id for lease in await claim_all(q(store))] == ["now"]


async def test_concurrent_claimers_never_get_the_same_run(backend_url: str) -> None:
    stores = [open_store(backend_url) for _ in range(4)]
    try:
        for i in range(40):
            await new_run(stores[0], f"r{i:02d}")

        async def claimer(n: int) -> list[str]:
            return [lease.run_id for lease in await claim_all(q(stores[n]), f"w{n}")]

        got = await asyncio.gather(*(claimer(n) for n in range(4)))
        everything = [rid for part in got for rid in part]
        assert sorted(everything) == [f"r{i:02d}" for i in range(40)]
        assert len(set(everything)) == 40
    finally:
        for s in stores:
            await s.close()


async def test_a_worker_may_serve_some_agents_only(store: EventStore) -> None:
    await new_run(store, "r1", agent="clerk")
    await new_run(store, "r2", agent="auditor")
    assert await claim_all(q(store), agents=[]) == []
    assert [lease.run_id for lease in await claim_all(q(store), agents=["auditor"])] == ["r2"]
    assert [lease.run_id for lease in await claim_all(q(store), agents=["x", "clerk"])] == ["r1"]


# -- concurrency limits -----------------------------------------------------------------------


async def test_a_global_limit_caps_leased_runs_across_workers(store: EventStore) -> None:
    queue = q(store)
    await queue.set_limit(LimitScope.GLOBAL, "everything", 2)  # a global limit has no name
    assert await queue.limits() == [
        ConcurrencyLimit(scope=LimitScope.GLOBAL, name="", max_running=2)
    ]
    for i in range(4):
        await new_run(store, f"r{i}")
    a = await queue.claim("w1", lease_s=30)
    b = await queue.claim("w2", lease_s=30)
    assert a is not None and b is not None
    assert await queue.claim("w3", lease_s=30) is None
    await queue.release(a)
    c = await queue.claim("w3", lease_s=30)
    assert c is not None  # the released slot is free again
    assert await queue.claim("w1", lease_s=30) is None
    await queue.set_limit(LimitScope.GLOBAL, "", None)
    assert await queue.claim("w1", lease_s=30) is not None
    assert await queue.limits() == []


async def test_tenant_and_agent_limits(store: EventStore) -> None:
    queue = q(store)
    await queue.set_limit(LimitScope.TENANT, "acme", 1)
    await queue.set_limit(LimitScope.TENANT, "*", 2)
    await queue.set_limit(LimitScope.AGENT, "auditor", 1)
    runs = [
        ("a1", "acme", "clerk"),
        ("a2", "acme", "clerk"),
        ("b1", "blue", "clerk"),
        ("b2", "blue", "clerk"),
        ("b3", "blue", "clerk"),
        ("c1", "cyan", "auditor"),
        ("c2", "cyan", "auditor"),
    ]
    for rid, tenant, agent in runs:
        await new_run(store, rid, tenant=tenant, agent=agent)
    leases = await claim_all(queue)
    tenant_of = {rid: tenant for rid, tenant, _ in runs}
    assert Counter(tenant_of[lease.run_id] for lease in leases) == {
        "acme": 1,
        "blue": 2,
        "cyan": 1,
    }
    assert {(lim.scope, lim.name, lim.max_running) for lim in await queue.limits()} == {
        (LimitScope.TENANT, "acme", 1),
        (LimitScope.TENANT, "*", 2),
        (LimitScope.AGENT, "auditor", 1),
    }
    # A finished run frees its slot even before its worker lets go of the lease.
    acme = next(lease for lease in leases if tenant_of[lease.run_id] == "acme")
    await to_status(store, acme.run_id, ev.RunStarted, worker_id="w1")
    await to_status(store, acme.run_id, ev.RunCompleted, output="ok")
    assert [lease.run_id for lease in await claim_all(queue)] == ["a2"]


async def test_runs_waiting_on_a_person_or_a_timer_hold_no_slot(store: EventStore) -> None:
    queue = q(store)
    await queue.set_limit(LimitScope.GLOBAL, "", 1)
    for rid in ("r1", "r2", "r3"):
        await new_run(store, rid)
    first = await queue.claim("w1", lease_s=30)
    assert first is not None and first.run_id == "r1"
    assert await queue.claim("w2", lease_s=30) is None
    # r1 now waits for a person: its slot is free, even with the lease not yet given back.
    await to_status(store, "r1", ev.RunStarted, worker_id="w1")
    await to_status(store, "r1", ev.InterruptRaised, interrupt_id="i1", kind="approval")
    second = await queue.claim("w2", lease_s=30)
    assert second is not None and second.run_id == "r2"
    # r2 goes back with a retry timer: no slot held while it waits.
    await queue.release(second, not_before=datetime.now(UTC) + timedelta(hours=1), failed=True)
    third = await queue.claim("w3", lease_s=30)
    assert third is not None and third.run_id == "r3"
    assert await queue.claim("w3", lease_s=30) is None


# -- workers and schedules --------------------------------------------------------------------


async def test_the_worker_registry_lists_workers_and_their_leases(store: EventStore) -> None:
    queue = q(store)
    for wid in ("w1", "w2"):
        await queue.register_worker(WorkerInfo(worker_id=wid, host="h", pid=1, concurrency=4))
    await new_run(store, "r1")
    await new_run(store, "r2")
    await new_run(store, "r3")
    first = await queue.claim("w1", lease_s=30)
    second = await queue.claim("w1", lease_s=30)
    assert first is not None and second is not None
    # A run whose earlier attempt failed shows it on its lease.
    third = await queue.acquire(RunId("r3"), "w0", lease_s=30)
    assert await queue.release(third, failed=True)
    third = await queue.acquire(RunId("r3"), "w1", lease_s=30)
    await queue.worker_heartbeat("w2", WorkerStatus.DRAINING)

    workers = {w.worker_id: w for w in await queue.list_workers()}
    assert set(workers) == {"w1", "w2"}
    assert workers["w1"].leases == (first, second, third)
    assert workers["w1"].leases[2].attempts == 1
    assert workers["w2"].leases == () and workers["w2"].status is WorkerStatus.DRAINING
    for w in workers.values():
        assert (w.host, w.pid, w.concurrency) == ("h", 1, 4)
        assert w.started_at is not None and w.heartbeat_at is not None
        assert w.started_at <= w.heartbeat_at

    await queue.worker_heartbeat("w2", WorkerStatus.STOPPED)
    await asyncio.sleep(1.2)
    await queue.worker_heartbeat("w1", WorkerStatus.RUNNING)
    assert [w.worker_id for w in await queue.list_workers(live_within_s=1.0)] == ["w1"]
    # Every worker on record, stopped or silent ones too.
    everyone = await queue.list_workers(live_within_s=None)
    assert [(w.worker_id, w.status) for w in everyone] == [
        ("w1", WorkerStatus.RUNNING),
        ("w2", WorkerStatus.STOPPED),
    ]


async def test_schedule_rows_move_on_by_compare_and_set(store: EventStore) -> None:
    queue = q(store)
    tick = datetime(2026, 3, 1, 6, 0, tzinfo=UTC)
    s = Schedule(
        name="daily",
        agent_ref="tests/workers/agents.py:ticker",
        cron="0 6 * * *",
        input="report",
        timezone="Europe/Paris",
        catch_up=CatchUp.RUN_ONCE,
        misfire_grace_s=120.0,
        priority=2,
        tenant="acme",
        next_tick_at=tick,
        last_tick_at=tick - timedelta(days=1),
        last_run_id=RunId("r0"),
        created_at=datetime(2026, 2, 1, tzinfo=UTC),
    )
    await queue.add_schedule(s)
    with pytest.raises(ConfigError, match="a schedule named 'daily' exists already") as taken:
        await queue.add_schedule(s)
    assert taken.value.fields == {"schedule": "daily"}
    assert [x.name for x in await queue.list_schedules(due_at=tick - timedelta(seconds=1))] == []
    (due,) = await queue.list_schedules(due_at=tick)
    assert due == s  # every field as it was added
    # One that has not ticked yet: no last tick, no last run.
    fresh = Schedule(
        name="hourly",
        agent_ref="tests/workers/agents.py:ticker",
        cron="0 * * * *",
        next_tick_at=tick + timedelta(hours=1),
        created_at=datetime(2026, 2, 1, tzinfo=UTC),
    )
    await queue.add_schedule(fresh)
    assert await queue.list_schedules() == [s, fresh]
    assert await queue.remove_schedule("hourly") is True
    nxt = tick + timedelta(days=1)
    args = {"next_tick_at": nxt, "last_tick_at": tick, "last_run_id": RunId("r1")}
    assert await queue.advance_schedule("daily", expected_next=nxt, **args) is False  # type: ignore[arg-type]
    assert await queue.advance_schedule("daily", expected_next=tick, **args) is True  # type: ignore[arg-type]
    assert await queue.advance_schedule("daily", expected_next=tick, **args) is False  # type: ignore[arg-type]
    (moved,) = await queue.list_schedules()
    assert (moved.next_tick_at, moved.last_tick_at, moved.last_run_id) == (nxt, tick, "r1")
    assert await queue.remove_schedule("daily") is True
    assert await queue.remove_schedule("daily") is False
    assert await queue.list_schedules() == []


# -- triggers ---------------------------------------------------------------------------------


async def test_trigger_rows_and_the_firings_a_run_ending_records(store: EventStore) -> None:
    queue = q(store)
    review = Trigger(
        name="review",
        kind=TriggerKind.RUN,
        agent_ref="tests/triggers/trigger_agents.py:reviewer",
        agent_name="reviewer",
        source_agent="writer",
        on=TriggerOn.ANY,
        input="Review: {output}",
        allow_cycle=True,
        max_depth=3,
        priority=2,
        tenant="acme",
        created_at=datetime(2026, 2, 1, tzinfo=UTC),
    )
    hook = Trigger(
        name="inbound",
        kind=TriggerKind.WEBHOOK,
        agent_ref="tests/triggers/trigger_agents.py:writer",
        agent_name="writer",
        secret_env="HOOK_KEY",
    )
    await queue.add_trigger(review)
    await queue.add_trigger(hook)
    with pytest.raises(ConfigError, match="a trigger named 'review' exists already") as taken:
        await queue.add_trigger(replace(hook, name="review"))
    assert taken.value.fields == {"trigger": "review"}
    listed = await queue.list_triggers()
    assert listed[0].created_at is not None  # when it was added, when not given
    assert listed == [replace(hook, created_at=listed[0].created_at), review]  # by name

    # Each writer run that ends records the firing it owes, oldest first.
    for rid in ("r1", "r2", "r3"):
        await new_run(store, rid, agent="writer")
        await to_status(store, rid, ev.RunStarted, worker_id="w1")
        await to_status(store, rid, ev.RunCompleted, output="ok")

    def firing(run_id: str, attempts: int = 0) -> Firing:
        return Firing(trigger="review", run_id=RunId(run_id), status="completed", attempts=attempts)

    assert await queue.due_firings() == [firing("r1"), firing("r2"), firing("r3")]
    assert await queue.due_firings(limit=2) == [firing("r1"), firing("r2")]
    assert await queue.due_firings(run_id=RunId("r2")) == [firing("r2")]
    assert await queue.due_firings(run_id=RunId("r2"), limit=0) == []

    # A deferred firing counts its attempt and waits; a run's own firings show it anyway.
    later = datetime.now(UTC) + timedelta(hours=1)
    await queue.defer_firing("review", RunId("r1"), not_before=later)
    assert await queue.due_firings() == [firing("r2"), firing("r3")]
    assert await queue.due_firings(run_id=RunId("r1")) == [firing("r1", attempts=1)]
    await queue.defer_firing("review", RunId("r1"), not_before=datetime.now(UTC) - timedelta(1))
    assert await queue.due_firings(limit=1) == [firing("r1", attempts=2)]

    await queue.firing_done("review", RunId("r2"))
    assert await queue.due_firings() == [firing("r1", attempts=2), firing("r3")]
    # Removing the trigger drops the firings it still owed.
    assert await queue.remove_trigger("review") is True
    assert await queue.remove_trigger("review") is False
    assert await queue.due_firings() == []
    assert [t.name for t in await queue.list_triggers()] == ["inbound"]


async def test_an_idle_worker_learns_how_long_until_a_waiting_run_may_be_claimed(
    store: EventStore,
) -> None:
    queue = q(store)
    assert await queue.next_due() is None  # nothing at all
    await new_run(store, "now")
    assert await queue.next_due() is None  # claimable now: no timer to wait for
    await new_run(store, "later", not_before=datetime.now(UTC) + timedelta(hours=1))
    due = await queue.next_due()
    assert due is not None and 3000 < due <= 3600
    # A live lease may lapse first: its expiry is when the run may be claimed again.
    lease = await queue.claim("w1", lease_s=600)
    assert lease is not None and lease.run_id == "now"
    due = await queue.next_due()
    assert due is not None and 0 < due <= 600
    await to_status(store, "now", ev.RunStarted, worker_id="w1")
    await to_status(store, "now", ev.RunCompleted, output="ok")
    due = await queue.next_due()  # an ended run waits for nothing
    assert due is not None and due > 600
    # A timer about to pass: less than a second to wait (nothing at all once it has passed).
    await new_run(store, "soon", not_before=datetime.now(UTC) + timedelta(seconds=0.5))
    due = await queue.next_due()
    assert due is None or due <= 0.5


async def test_giving_a_run_back_wakes_this_processs_idle_workers(tmp_path: Path) -> None:
    # SQLite wakes the workers of its own process; PostgreSQL's database notifies every process.
    store = open_store(f"sqlite:///{tmp_path / 'runs.db'}")
    woken: list[wakeup.Ready] = []
    waiting = wakeup.LocalWakeup(store)
    await waiting.start(woken.append)

    async def since_last_look() -> list[wakeup.Ready]:
        """The wake-ups sent since the last look: a marker sent now arrives after all of them."""
        wakeup.wake_local(store, wakeup.Ready.SCHEDULES)

        async def marked() -> bool:
            return woken[-1:] == [wakeup.Ready.SCHEDULES]

        await wait_until(marked, what="the marker wake-up")
        seen = woken[:-1]
        woken.clear()
        return seen

    try:
        queue = q(store)
        await new_run(store, "r1")
        lease = await queue.claim("w1", lease_s=30)
        assert lease is not None
        await since_last_look()
        assert await queue.release(lease) is True
        assert await since_last_look() == [wakeup.Ready.RUNS]
        assert await queue.release(lease) is False  # not held any more: nothing became ready
        assert await since_last_look() == []
        await queue.add_schedule(
            Schedule(
                name="daily",
                agent_ref="tests/workers/agents.py:ticker",
                cron="0 6 * * *",
                next_tick_at=datetime(2026, 3, 1, 6, 0, tzinfo=UTC),
            )
        )
        assert await since_last_look() == [wakeup.Ready.SCHEDULES]
    finally:
        await waiting.close()
        await store.close()


async def test_a_pass_reads_at_most_a_hundred_firings_by_default(store: EventStore) -> None:
    await q(store).add_trigger(
        Trigger(
            name="review",
            kind=TriggerKind.RUN,
            agent_ref="tests/triggers/trigger_agents.py:reviewer",
            agent_name="reviewer",
            source_agent="writer",
        )
    )
    for i in range(101):
        rid = RunId(f"r{i:03d}")
        ended = [
            created(rid, "writer"),
            ev.RunStarted(run_id=rid, seq=2, worker_id="w1"),
            ev.RunCompleted(run_id=rid, seq=3, output="ok"),
        ]
        await store.append(rid, ended, expected_seq=0)
    firings = await q(store).due_firings()
    assert [f.run_id for f in firings] == [f"r{i:03d}" for i in range(100)]


async def test_a_worker_silent_for_a_minute_is_not_listed_by_default(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    store = open_store(f"sqlite:///{path}")
    try:
        queue = q(store)
        for wid in ("w1", "w2"):
            await queue.register_worker(WorkerInfo(worker_id=wid, host="h", pid=1, concurrency=4))
        # w2's last heartbeat is now a little over a minute old.
        with closing(sqlite3.connect(path)) as db, db:
            db.execute(
                "UPDATE workers SET heartbeat_at = heartbeat_at - 60.5 WHERE worker_id = ?", ["w2"]
            )
        assert [w.worker_id for w in await queue.list_workers()] == ["w1"]
    finally:
        await store.close()


async def test_removing_a_trigger_and_its_firings_is_one_transaction(postgres_url: str) -> None:
    import psycopg

    store = open_store(postgres_url)
    try:
        queue = q(store)
        await queue.add_trigger(
            Trigger(
                name="review",
                kind=TriggerKind.RUN,
                agent_ref="tests/triggers/trigger_agents.py:reviewer",
                agent_name="reviewer",
                source_agent="writer",
            )
        )
        ended = [
            created("r1", "writer"),
            ev.RunStarted(run_id=RunId("r1"), seq=2, worker_id="w1"),
            ev.RunCompleted(run_id=RunId("r1"), seq=3, output="ok"),
        ]
        await store.append(RunId("r1"), ended, expected_seq=0)
        with (
            psycopg.connect(postgres_url) as holder,
            psycopg.connect(postgres_url, autocommit=True) as onlooker,
        ):
            # Another transaction holds the trigger's row: the removal waits for it half way.
            holder.execute("SELECT 1 FROM triggers WHERE name = 'review' FOR UPDATE")
            removal = asyncio.create_task(queue.remove_trigger("review"))

            async def waiting() -> bool:
                row = onlooker.execute(
                    "SELECT count(*) FROM pg_stat_activity"
                    " WHERE wait_event_type = 'Lock' AND query LIKE 'DELETE FROM triggers%'"
                ).fetchone()
                return row is not None and row[0] == 1

            await wait_until(waiting, what="the removal to wait for the row")
            # Half way, nothing of it shows: the firing it already deleted is still there.
            owed = onlooker.execute("SELECT count(*) FROM trigger_firings").fetchone()
            assert owed == (1,)
            holder.rollback()
            assert await removal is True
            assert onlooker.execute("SELECT count(*) FROM trigger_firings").fetchone() == (0,)
    finally:
        await store.close()
