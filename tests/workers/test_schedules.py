"""Cron schedules: which ticks fire (catch-up policy), exactly once per tick across workers
and restarts, on both backends. Worker processes firing a schedule together and through a
restart: `test_schedule_processes.py`."""

from __future__ import annotations

import asyncio
import logging
import random
import sys
import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from worker_helpers import AGENTS

from contextos import Agent, Policy, Principal, RunContext, Runtime, Workflow, load_agent
from contextos import events as ev
from contextos.errors import ConfigError
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


def test_missed_ticks_count_both_ticks_of_the_night_the_clocks_go_back() -> None:
    """02:30 happens twice in Paris on 25 October 2026 (summer time, then winter time): a
    schedule at 02:30 ticks on both, and missing them misses two ticks, not one."""
    two_thirty = Schedule(
        name="s",
        agent_ref=TICKER,
        cron="30 2 * * *",
        timezone="Europe/Paris",
        next_tick_at=datetime(2026, 10, 24, 0, 30, tzinfo=UTC),
    )
    p = plan(two_thirty, datetime(2026, 10, 27, 12, 0, tzinfo=UTC))
    assert p is not None
    assert (p.fire, p.missed) == ((), 5)  # the 24th, the 25th twice, the 26th and the 27th
    assert p.last_tick == datetime(2026, 10, 27, 1, 30, tzinfo=UTC)


def test_missed_ticks_are_counted_up_to_ten_thousand() -> None:
    """Counting the ticks a long outage missed stops at 10,000 (plus the latest one): a cron
    every second down for three hours does not count its 10,800 ticks one by one."""
    every_second = Schedule(name="s", agent_ref=TICKER, cron="* * * * * *", next_tick_at=T)
    p = plan(every_second, T + timedelta(hours=3))
    assert p is not None
    assert p.missed == 10_001


def test_ticks_are_told_in_utc_whatever_the_local_zone(monkeypatch: pytest.MonkeyPatch) -> None:
    """A tick's time goes into its run's metadata and idempotency key as text: it reads the
    same on every worker, whatever the machine's own zone."""
    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    try:
        ticks = [
            next_tick("0 6 * * *", T - DAY, timezone="Europe/Paris"),
            latest_tick("0 6 * * *", T, timezone="Europe/Paris"),
        ]
    finally:
        monkeypatch.undo()
        time.tzset()
    assert [t.isoformat() for t in ticks] == ["2026-03-02T05:00:00+00:00"] * 2


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


def test_an_unknown_time_zone_is_named_in_its_error() -> None:
    with pytest.raises(ConfigError) as refused:
        next_tick("0 6 * * *", T, timezone="Mars/Olympus")
    assert refused.value.to_dict() == {
        "code": "config_error",
        "message": "unknown time zone 'Mars/Olympus'",
        "timezone": "Mars/Olympus",
    }


def test_without_croniter_a_cron_schedule_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "croniter", None)  # as if it were not installed
    with pytest.raises(ConfigError) as refused:
        check_cron("0 6 * * *")
    assert refused.value.to_dict() == {
        "code": "config_error",
        "message": "cron schedules need croniter: pip install 'contextos[cron]'",
    }


def test_a_tick_is_reckoned_in_utc_unless_a_zone_is_named() -> None:
    assert next_tick("0 6 * * *", T) == T + DAY
    assert latest_tick("0 6 * * *", T + DAY - timedelta(seconds=1)) == T


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
            assert (schedule.next_tick_at, schedule.last_tick_at, schedule.last_run_id) == (
                tick + timedelta(minutes=1),
                tick,
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
    bound: list[RunContext] = []
    for name, policy in (("ungoverned", None), ("governed", Policy(name="p"))):
        async with Runtime(str(tmp_path / f"{name}.db"), policy=policy) as rt:
            await add_schedule(queue(rt), "nightly", TICKER, "* * * * *", tenant="acme", now=T)
            ((_, run_id),) = (await fire_schedules(rt, now=tick + timedelta(seconds=1)))[0].runs
            context = (await rt.state(run_id)).context
            assert context is not None
            bound.append(RunContext.from_dict(context.context))
    ungoverned, governed = bound
    assert ungoverned.principal.ref == "automation:nightly@acme"
    # every scope and the clearance of a run bound to no one (`RunContext.local()`)
    assert (ungoverned.principal.scopes, ungoverned.clearance) == (("*",), "restricted")
    operator = Principal.local().id  # a policy binds it to the local operator, in its tenant
    assert governed.principal.ref == f"user:{operator}@acme"


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
    ("attempt", "back_off", "wait_s"),
    [
        (3, {"base_s": 0.25, "cap_s": 300.0}, 1.0),  # the base doubled twice
        (3, {"base_s": 0.5, "cap_s": 1.5}, 1.5),  # the cap below it
        (3, {}, 4.0),  # by default a second doubled twice
        (40, {}, 300.0),  # and at most five minutes
    ],
)
def test_a_retry_timer_is_set_that_far_ahead(
    monkeypatch: pytest.MonkeyPatch, attempt: int, back_off: dict[str, float], wait_s: float
) -> None:
    monkeypatch.setattr(random, "random", lambda: 1.0)
    before = datetime.now(UTC)
    at = retry_at(attempt, **back_off)
    after = datetime.now(UTC)
    assert before + timedelta(seconds=wait_s) <= at <= after + timedelta(seconds=wait_s)


async def test_a_schedule_keeps_the_settings_it_was_given(backend_url: str) -> None:
    async with Runtime(backend_url) as rt:
        given = await add_schedule(
            rt.store,
            "paris",
            TICKER,
            "0 6 * * *",
            input="go",
            timezone="Europe/Paris",
            catch_up="run_once",
            misfire_grace_s=300.0,
            now=T,
        )
        (stored,) = await list_schedules(rt.store)
    paris_6am = T + DAY - timedelta(hours=1)  # 06:00 in Paris is 05:00 UTC in March
    for schedule in (given, stored):
        assert (schedule.timezone, schedule.next_tick_at) == ("Europe/Paris", paris_6am)
        assert (schedule.input, schedule.catch_up, schedule.misfire_grace_s) == (
            "go",
            CatchUp.RUN_ONCE,
            300.0,
        )
        assert schedule.created_at == T


async def test_the_schedule_due_longest_fires_first(backend_url: str) -> None:
    async with Runtime(backend_url) as rt:
        await add_schedule(rt.store, "a-daily", TICKER, "0 6 * * *", now=T - DAY)
        await add_schedule(rt.store, "b-hourly", TICKER, "0 * * * *", now=T - 2 * DAY)
        await add_schedule(rt.store, "c-later", TICKER, "0 7 * * *", now=T)  # not due yet
        fired = await fire_schedules(rt, now=T)
        assert [f.schedule for f in fired] == ["b-hourly", "a-daily"]


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
