"""Cron schedules: which ticks fire (catch-up policy), exactly once per tick across workers
and restarts, on both backends."""

from __future__ import annotations

import asyncio
import logging
import random
import signal
from collections import Counter
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from worker_helpers import AGENTS

from contextos import Agent, Policy, Principal, RunContext, Runtime, Workflow, load_agent
from contextos import events as ev
from contextos.errors import ConfigError
from contextos.runs import RunId
from contextos.store.queue import CatchUp, RunQueue, Schedule, queue_of, tick_key
from contextos.workers.scheduler import (
    add_schedule,
    check_cron,
    fire_schedules,
    latest_tick,
    list_schedules,
    next_tick,
    plan,
    remove_schedule,
    retry_at,
    retry_delay,
)
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
        with pytest.raises(ConfigError, match=r"^a schedule needs a name$"):
            await add_schedule(q, "", TICKER, "0 6 * * *")
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


def test_a_tick_fires_at_its_very_instant_and_on_the_last_instant_of_its_grace() -> None:
    at_once = plan(daily(), T)
    at_grace_end = plan(daily(), T + timedelta(seconds=60))
    assert at_once is not None and at_grace_end is not None
    assert (at_once.fire, at_grace_end.fire, at_grace_end.missed) == ((T,), (T,), 0)
    every_10s = Schedule(name="s", agent_ref=TICKER, cron="* * * * * */10", next_tick_at=T)
    p = plan(every_10s, T + timedelta(seconds=20))  # now is itself a tick
    assert p is not None and p.fire[-1] == T + timedelta(seconds=20)


def test_only_ticks_before_the_grace_are_missed() -> None:
    every_10s = Schedule(name="s", agent_ref=TICKER, cron="* * * * * */10", next_tick_at=T)
    p = plan(every_10s, T + timedelta(seconds=70))  # the grace of 60 s starts at T + 10 s
    assert p is not None
    assert (p.missed, p.fire[0], len(p.fire)) == (1, T + timedelta(seconds=10), 7)


def test_a_pass_fires_at_most_a_thousand_ticks_and_leaves_the_rest_due() -> None:
    every_second = Schedule(
        name="s", agent_ref=TICKER, cron="* * * * * *", misfire_grace_s=3600, next_tick_at=T
    )
    p = plan(every_second, T + timedelta(seconds=1500))
    assert p is not None
    assert (len(p.fire), p.next_tick_at) == (1000, T + timedelta(seconds=1000))


def test_missed_ticks_are_reckoned_in_the_schedule_time_zone() -> None:
    paris_6am = datetime(2026, 1, 11, 5, 0, tzinfo=UTC)
    schedule = Schedule(
        name="s",
        agent_ref=TICKER,
        cron="0 6 * * *",
        timezone="Europe/Paris",
        catch_up=CatchUp.RUN_ONCE,
        next_tick_at=paris_6am,
    )
    on_time = plan(schedule, paris_6am + 2 * DAY + timedelta(seconds=30))
    assert on_time is not None
    assert on_time.fire == (paris_6am + DAY, paris_6am + 2 * DAY)
    assert (on_time.missed, on_time.next_tick_at) == (2, paris_6am + 3 * DAY)
    skipped = replace(schedule, catch_up=CatchUp.SKIP)
    late = plan(skipped, paris_6am + 2 * DAY + timedelta(hours=4))
    assert late is not None
    assert (late.fire, late.missed, late.last_tick) == ((), 3, paris_6am + 2 * DAY)


def test_the_latest_tick_is_at_or_before_the_instant() -> None:
    assert latest_tick("0 6 * * *", T) == T
    assert latest_tick("0 6 * * *", T - timedelta(microseconds=1)) == T - DAY
    assert latest_tick("0 6 * * *", T, timezone="Europe/Paris") == T - timedelta(hours=1)


def test_a_bad_cron_expression_says_how_to_write_one() -> None:
    with pytest.raises(ConfigError) as refused:
        check_cron("every morning")
    assert refused.value.to_dict() == {
        "code": "config_error",
        "message": "bad cron expression 'every morning': use 5 fields (minute hour day month "
        "weekday), or 6 with seconds last",
        "cron": "every morning",
    }


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


async def test_missed_ticks_are_logged_once_with_the_catch_up_applied(
    backend_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Missed ticks start nothing (or one run), so the log is where an operator learns that a
    worker was away: one warning per schedule, from the worker that moved it on (two firing at
    once both see it due)."""
    async with Runtime(backend_url) as rt:
        await add_schedule(queue(rt), "report", TICKER, "0 6 * * *", now=T - timedelta(hours=1))
        back = T + 2 * DAY + timedelta(hours=4)
        with caplog.at_level(logging.WARNING, logger="contextos.scheduler"):
            fired = await asyncio.gather(*(fire_schedules(rt, now=back) for _ in range(2)))
    assert sorted(f.advanced for (f,) in fired) == [False, True]  # both saw it due
    assert [r.getMessage() for r in caplog.records] == [
        "schedule report: 3 tick(s) missed by more than 60s (catch-up skip)"
    ]


async def test_a_schedule_whose_agent_no_longer_loads_waits_and_the_rest_still_fire(
    backend_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """An agent removed after its schedule was added: that schedule keeps its tick (it fires
    once the agent loads again) and the log says why, while the schedules due after it in the
    same pass fire as usual."""
    async with Runtime(backend_url) as rt:
        q = queue(rt)
        gone = f"{AGENTS}:nobody"
        await q.add_schedule(replace(daily(), name="gone", agent_ref=gone, next_tick_at=T - DAY))
        await q.add_schedule(daily())
        with caplog.at_level(logging.ERROR, logger="contextos.scheduler"):
            fired = await fire_schedules(rt, now=T)
        assert [f.schedule for f in fired] == ["report"]
        assert len(fired[0].runs) == 1
        waiting = {s.name: s for s in await q.list_schedules()}["gone"]
        assert waiting.next_tick_at == T - DAY and waiting.last_run_id is None
    (line,) = [r.getMessage() for r in caplog.records]
    assert line.startswith("schedule gone: cannot start a run: ") and "nobody" in line


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


# -- retry timers -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("attempt", "ceiling"), [(1, 1.0), (2, 2.0), (4, 8.0), (9, 256.0), (10, 300.0), (40, 300.0)]
)
def test_a_retry_waits_over_the_upper_half_of_a_doubling_capped_delay(
    monkeypatch: pytest.MonkeyPatch, attempt: int, ceiling: float
) -> None:
    # The jitter's two extremes: the shortest and the longest wait this attempt may get.
    monkeypatch.setattr(random, "random", lambda: 0.0)
    shortest = retry_delay(attempt)
    monkeypatch.setattr(random, "random", lambda: 1.0)
    longest = retry_delay(attempt)
    assert (shortest, longest) == (ceiling / 2, ceiling)


@pytest.mark.parametrize(
    ("base_s", "cap_s", "wait_s"),
    [(0.25, 300.0, 1.0), (0.5, 1.5, 1.5)],  # the base doubled twice, or the cap below it
)
def test_a_retry_timer_is_set_that_far_ahead(
    monkeypatch: pytest.MonkeyPatch, base_s: float, cap_s: float, wait_s: float
) -> None:
    monkeypatch.setattr(random, "random", lambda: 1.0)
    before = datetime.now(UTC)
    at = retry_at(3, base_s=base_s, cap_s=cap_s)
    after = datetime.now(UTC)
    assert before + timedelta(seconds=wait_s) <= at <= after + timedelta(seconds=wait_s)


async def test_a_schedule_keeps_its_settings_and_its_runs_carry_them(backend_url: str) -> None:
    async with Runtime(backend_url) as rt:
        plain = await add_schedule(rt.store, "plain", TICKER, "0 6 * * *", now=T - DAY)
        assert (plain.input, plain.catch_up, plain.misfire_grace_s) == ("", CatchUp.SKIP, 60.0)
        assert (plain.priority, plain.tenant) == (0, "")
        await add_schedule(
            rt.store, "billing", TICKER, "0 6 * * *", priority=5, tenant="acme", now=T - DAY
        )
        assert [s.name for s in await list_schedules(rt.store)] == ["billing", "plain"]
        other = load_agent(f"{AGENTS}:quick")
        cache: dict[str, Agent | Workflow] = {}
        fired = await fire_schedules(rt, now=T, agents=cache)
        assert [f.schedule for f in fired] == ["billing", "plain"]
        assert list(cache) == [TICKER]  # loaded once, kept for the next pass
        billed = fired[0].runs[0][1]
        entry = await queue(rt).queue_entry(billed)
        assert entry is not None and (entry.priority, entry.tenant) == (5, "acme")
        assert await remove_schedule(rt.store, "plain") is True
        assert await remove_schedule(rt.store, "plain") is False
        assert [s.name for s in await list_schedules(rt.store)] == ["billing"]
        # A cached agent is used as it is, not loaded again.
        (again,) = await fire_schedules(rt, now=T + DAY, agents={TICKER: other})
        created = (await rt.events(again.runs[0][1]))[0]
        assert isinstance(created, ev.RunCreated) and created.agent_name == other.name
