"""Cron schedules: which ticks fire (catch-up policy), exactly once per tick across workers
and restarts, on both backends."""

from __future__ import annotations

import asyncio
import signal
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from worker_helpers import AGENTS

from contextos import Policy, Principal, RunContext, Runtime, load_agent
from contextos import events as ev
from contextos.errors import ConfigError
from contextos.runs import RunId
from contextos.store.queue import CatchUp, RunQueue, Schedule, queue_of, tick_key
from contextos.workers.scheduler import add_schedule, fire_schedules, next_tick, plan
from support.processes import spawn_worker, stop_all, wait_until

TICKER = f"{AGENTS}:ticker"
DAY = timedelta(days=1)
T = datetime(2026, 3, 2, 6, 0, tzinfo=UTC)  # a Monday, 06:00 UTC


def daily(catch_up: CatchUp = CatchUp.SKIP, **kw: object) -> Schedule:
    return Schedule(
        name="report",
        agent_ref=TICKER,
        cron="0 6 * * *",
        catch_up=catch_up,
        next_tick_at=T,
        **kw,  # type: ignore[arg-type]
    )


def queue(rt: Runtime) -> RunQueue:
    q = queue_of(rt.store)
    assert q is not None
    return q


# -- which ticks fire -------------------------------------------------------------------------


def test_a_schedule_before_its_tick_does_nothing() -> None:
    assert plan(daily(), T - timedelta(seconds=1)) is None


def test_an_on_time_tick_fires() -> None:
    p = plan(daily(), T + timedelta(seconds=5))
    assert p is not None
    assert (p.fire, p.missed, p.next_tick_at) == ((T,), 0, T + DAY)


def test_every_tick_within_the_grace_fires() -> None:
    every_10s = Schedule(name="s", agent_ref=TICKER, cron="* * * * * */10", next_tick_at=T)
    p = plan(every_10s, T + timedelta(seconds=25))
    assert p is not None
    assert p.fire == (T, T + timedelta(seconds=10), T + timedelta(seconds=20))
    assert p.next_tick_at == T + timedelta(seconds=30)


def test_missed_ticks_are_skipped_or_run_once() -> None:
    back = T + 3 * DAY + timedelta(seconds=30)  # workers were down three days
    skip = plan(daily(CatchUp.SKIP), back)
    once = plan(daily(CatchUp.RUN_ONCE), back)
    assert skip is not None and once is not None
    assert (skip.fire, skip.missed) == ((T + 3 * DAY,), 3)
    assert (once.fire, once.missed) == ((T + 2 * DAY, T + 3 * DAY), 3)
    assert skip.next_tick_at == once.next_tick_at == T + 4 * DAY

    later = T + 3 * DAY + timedelta(hours=4)  # not even today's tick is on time
    skip = plan(daily(CatchUp.SKIP), later)
    once = plan(daily(CatchUp.RUN_ONCE), later)
    assert skip is not None and once is not None
    assert (skip.fire, skip.missed, skip.last_tick) == ((), 4, T + 3 * DAY)
    assert (once.fire, once.missed) == ((T + 3 * DAY,), 4)


def test_cron_reads_in_the_schedule_time_zone() -> None:
    after = datetime(2026, 1, 10, 12, 0, tzinfo=UTC)
    assert next_tick("0 6 * * *", after, timezone="Europe/Paris") == datetime(
        2026, 1, 11, 5, 0, tzinfo=UTC
    )
    assert next_tick("0 6 * * *", after.replace(month=7), timezone="Europe/Paris") == datetime(
        2026, 7, 11, 4, 0, tzinfo=UTC
    )


async def test_bad_schedules_are_refused_when_added(backend_url: str) -> None:
    async with Runtime(backend_url) as rt:
        q = queue(rt)
        with pytest.raises(ConfigError, match="cron"):
            await add_schedule(q, "s", TICKER, "every morning")
        with pytest.raises(ConfigError, match="time zone"):
            await add_schedule(q, "s", TICKER, "0 6 * * *", timezone="Mars/Olympus")
        with pytest.raises(ConfigError, match="agent reference"):
            await add_schedule(q, "s", f"{AGENTS}:nobody", "0 6 * * *")
        await add_schedule(q, "s", TICKER, "0 6 * * *")
        with pytest.raises(ConfigError, match="exists"):
            await add_schedule(q, "s", TICKER, "0 7 * * *")
        assert [s.name for s in await q.list_schedules()] == ["s"]


# -- exactly once per tick --------------------------------------------------------------------


async def test_workers_firing_together_start_one_run_per_tick(backend_url: str) -> None:
    runtimes = [Runtime(backend_url) for _ in range(3)]
    try:
        await add_schedule(queue(runtimes[0]), "minutely", TICKER, "* * * * *", input="go", now=T)
        tick = T + timedelta(minutes=1)
        at = tick + timedelta(seconds=2)
        fired = await asyncio.gather(*(fire_schedules(rt, now=at) for rt in runtimes))
        run_ids = {run for per_worker in fired for f in per_worker for _, run in f.runs}
        assert len(run_ids) == 1
        assert sum(f.advanced for per_worker in fired for f in per_worker) <= 1
        (rid,) = run_ids
        assert [r.run_id for r in await runtimes[0].runs()] == [rid]
        created = (await runtimes[0].events(rid))[0]
        assert isinstance(created, ev.RunCreated)
        assert created.metadata == {
            "schedule": "minutely",
            "tick": tick.isoformat(),
            "principal": "automation:minutely@default",  # the schedule it acts for
        }
        assert created.input == "go" and created.agent_ref == TICKER
        entry = await queue(runtimes[0]).queue_entry(rid)
        assert entry is not None and entry.idempotency_key == tick_key("minutely", tick)

        # Again, and after a restart (a fresh runtime on the same store): nothing new.
        assert await fire_schedules(runtimes[1], now=at) == []
        async with Runtime(backend_url) as restarted:
            assert await fire_schedules(restarted, now=at) == []
            (schedule,) = await queue(restarted).list_schedules()
            assert (schedule.next_tick_at, schedule.last_run_id) == (
                tick + timedelta(minutes=1),
                rid,
            )
            nxt = await fire_schedules(restarted, now=at + timedelta(minutes=1))
            assert len(nxt) == 1 and len(nxt[0].runs) == 1 and nxt[0].runs[0][1] != rid
        assert len(await runtimes[0].runs()) == 2
    finally:
        for rt in runtimes:
            await rt.close()


async def test_a_worker_dying_between_start_and_advance_does_not_fire_twice(
    backend_url: str,
) -> None:
    async with Runtime(backend_url) as rt:
        await add_schedule(queue(rt), "minutely", TICKER, "* * * * *", now=T)
        tick = T + timedelta(minutes=1)
        # The dead worker started the tick's run but never moved the schedule on.
        first = await rt.start(
            load_agent(TICKER), "", agent_ref=TICKER, idempotency_key=tick_key("minutely", tick)
        )
        (fired,) = await fire_schedules(rt, now=tick + timedelta(seconds=1))
        assert fired.runs == ((tick, first),) and fired.advanced
        assert [r.run_id for r in await rt.runs()] == [first]


@pytest.mark.parametrize("catch_up", [CatchUp.SKIP, CatchUp.RUN_ONCE])
async def test_catch_up_after_downtime(backend_url: str, catch_up: CatchUp) -> None:
    async with Runtime(backend_url) as rt:
        await add_schedule(
            queue(rt), "report", TICKER, "0 6 * * *", catch_up=catch_up, now=T - timedelta(hours=1)
        )
        back = T + 3 * DAY + timedelta(hours=4)
        (fired,) = await fire_schedules(rt, now=back)
        assert fired.missed == 4
        runs = await rt.runs()
        if catch_up is CatchUp.SKIP:
            assert runs == [] and fired.runs == ()
        else:
            assert [r.run_id for r in runs] == [fired.runs[0][1]]
            assert fired.runs[0][0] == T + 3 * DAY
        (schedule,) = await queue(rt).list_schedules()
        assert schedule.next_tick_at == T + 4 * DAY
        assert await fire_schedules(rt, now=back) == []


async def test_a_scheduled_run_acts_for_its_schedule_unless_a_policy_binds_it(
    tmp_path: Path,
) -> None:
    """Where runs would be bound to no one, a schedule's run is bound to the schedule itself,
    so that what keys on a principal (memory, daily caps) can run on a schedule."""
    tick = T + timedelta(minutes=1)
    bound: list[str] = []
    for name, policy in (("ungoverned", None), ("governed", Policy(name="p"))):
        async with Runtime(str(tmp_path / f"{name}.db"), policy=policy) as rt:
            await add_schedule(queue(rt), "nightly", TICKER, "* * * * *", tenant="acme", now=T)
            ((_, run_id),) = (await fire_schedules(rt, now=tick + timedelta(seconds=1)))[0].runs
            context = (await rt.state(run_id)).context
            assert context is not None
            bound.append(RunContext.from_dict(context.context).principal.ref)
    assert bound[0] == "automation:nightly@acme"
    operator = Principal.local().id  # a policy binds it to the local operator, in its tenant
    assert bound[1] == f"user:{operator}@acme"


# -- across worker processes and a restart ----------------------------------------------------


async def test_three_workers_and_a_restart_fire_each_tick_exactly_once(
    backend_url: str, tmp_path: Path
) -> None:
    async with Runtime(backend_url) as rt:
        await add_schedule(queue(rt), "every-second", TICKER, "* * * * * *")

        async def ticks_fired(n: int) -> bool:
            return len(await rt.runs(limit=1000)) >= n

        procs = [spawn_worker(backend_url, tmp_path / f"a{i}.log") for i in range(3)]
        try:
            await wait_until(lambda: ticks_fired(4), what="four ticks")
            procs[0].kill()  # one dies at a random point of its firing loop
            for p in procs[1:]:
                p.send_signal(signal.SIGTERM)
            for p in procs:
                p.wait(timeout=30)
            before = len(await rt.runs(limit=1000))
            procs = [spawn_worker(backend_url, tmp_path / f"b{i}.log") for i in range(3)]
            await wait_until(lambda: ticks_fired(before + 4), what="four more ticks")
            for p in procs:
                p.send_signal(signal.SIGTERM)
            for p in procs:
                p.wait(timeout=30)
        finally:
            stop_all(procs)

        ticks: Counter[str] = Counter()
        for summary in await rt.runs(limit=1000):
            created = (await rt.events(summary.run_id))[0]
            assert isinstance(created, ev.RunCreated)
            assert created.metadata["schedule"] == "every-second"
            ticks[created.metadata["tick"]] += 1
        assert max(ticks.values()) == 1, ticks  # no tick started two runs
        fired = sorted(datetime.fromisoformat(t) for t in ticks)
        # Every second from the first tick to the last fired, the restart's gap included
        # (it was within the misfire grace): none lost, none repeated.
        expected = [fired[0] + timedelta(seconds=i) for i in range(len(fired))]
        assert fired == expected
        (schedule,) = await queue(rt).list_schedules()
        assert schedule.last_tick_at in fired
        assert schedule.last_run_id is not None
        assert RunId(schedule.last_run_id) in {r.run_id for r in await rt.runs(limit=1000)}
