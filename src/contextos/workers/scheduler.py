"""Cron schedules and retry timers: when runs start and when a failed attempt may try again.

A schedule fires a tick by starting a run whose idempotency key is derived from the schedule's
name and the tick's time, then moving the schedule on with a compare-and-set. Every worker may
try to fire the same tick: the key makes all but the first start return the same run, and a
worker that dies between the two steps leaves the tick due, so the next worker (or the same one
after a restart) fires it again into the same run. Each tick therefore starts exactly one run.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from contextos.agents import Agent
from contextos.errors import ConfigError, ContextOSError
from contextos.events import utcnow
from contextos.graph import Workflow, load_runnable
from contextos.policy.identity import Principal, PrincipalKind, RunContext
from contextos.runs import RunId, check_priority
from contextos.store.base import DEFAULT_TENANT, EventStore
from contextos.store.queue import CatchUp, Schedule, queue_of, require_queue, tick_key

if TYPE_CHECKING:
    from contextos.runtime import Runtime

log = logging.getLogger("contextos.scheduler")


def _croniter() -> Any:
    try:
        from croniter import croniter
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise ConfigError("cron schedules need croniter: pip install 'contextos[cron]'") from exc
    return croniter


def _zone(name: str) -> ZoneInfo:
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise ConfigError(f"unknown time zone {name!r}", timezone=name) from exc


def check_cron(expr: str) -> None:
    """Raise ConfigError unless `expr` is a cron expression croniter understands."""
    if not _croniter().is_valid(expr):
        raise ConfigError(
            f"bad cron expression {expr!r}: use 5 fields (minute hour day month weekday), "
            "or 6 with seconds last",
            cron=expr,
        )


def next_tick(expr: str, after: datetime, *, timezone: str = "UTC") -> datetime:
    """The first tick strictly after `after` (UTC)."""
    local = after.astimezone(_zone(timezone))
    tick: datetime = _croniter()(expr, local).get_next(datetime)
    return tick.astimezone(UTC)


def latest_tick(expr: str, at: datetime, *, timezone: str = "UTC") -> datetime:
    """The last tick at or before `at` (UTC)."""
    local = at.astimezone(_zone(timezone)) + timedelta(microseconds=1)
    tick: datetime = _croniter()(expr, local).get_prev(datetime)
    return tick.astimezone(UTC)


_MAX_TICKS_PER_PASS = 1000
"""More on-time ticks than this in one pass (a cron every second with an hour of grace) are
fired over several passes."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Plan:
    """What to do about a due schedule."""

    fire: tuple[datetime, ...]
    """Ticks to start a run for, oldest first."""
    missed: int
    """Ticks more than the grace late that will never fire (one of them may stand for all)."""
    last_tick: datetime
    """The latest tick handled."""
    next_tick_at: datetime
    """Where the schedule moves on to."""


def plan(schedule: Schedule, now: datetime) -> Plan | None:
    """Decide about a schedule at `now`; None when its next tick is still ahead.

    A due tick at most `misfire_grace_s` late is on time and fires. Older ticks were missed
    (no worker was there): with catch-up `skip` they start nothing; with `run_once` the latest
    of them starts one run that stands for all of them.
    """
    if schedule.next_tick_at > now:
        return None
    cron, tz = schedule.cron, schedule.timezone
    grace_start = now - timedelta(seconds=schedule.misfire_grace_s)
    fire: list[datetime] = []
    missed = 0
    tick = schedule.next_tick_at
    if tick < grace_start:
        latest_missed = max(tick, latest_tick(cron, grace_start - _EPSILON, timezone=tz))
        missed = _count_ticks(cron, tz, tick, latest_missed) + 1
        if schedule.catch_up is CatchUp.RUN_ONCE:
            fire.append(latest_missed)
        tick = next_tick(cron, latest_missed, timezone=tz)
    while tick <= now and len(fire) < _MAX_TICKS_PER_PASS:
        fire.append(tick)
        tick = next_tick(cron, tick, timezone=tz)
    last = fire[-1] if fire else latest_tick(cron, min(now, tick - _EPSILON), timezone=tz)
    return Plan(fire=tuple(fire), missed=missed, last_tick=last, next_tick_at=tick)


_EPSILON = timedelta(microseconds=1)


def _count_ticks(cron: str, tz: str, first: datetime, last: datetime, cap: int = 10_000) -> int:
    """Ticks after `first` up to `last` (for the log; stops counting at `cap`)."""
    count, t = 0, first
    while count < cap:
        t = next_tick(cron, t, timezone=tz)
        if t > last:
            break
        count += 1
    return count


async def add_schedule(
    store: EventStore,
    name: str,
    agent_ref: str,
    cron: str,
    *,
    input: str = "",
    timezone: str = "UTC",
    catch_up: CatchUp | str = CatchUp.SKIP,
    misfire_grace_s: float = 60.0,
    priority: int = 0,
    tenant: str = "",
    now: datetime | None = None,
) -> Schedule:
    """Store a new schedule whose first tick is the first one after `now`."""
    queue = require_queue(store)
    if not name:
        raise ConfigError("a schedule needs a name")
    check_cron(cron)
    _zone(timezone)
    check_priority(priority)
    load_runnable(agent_ref)  # a bad reference fails now, not at every tick
    start = now or utcnow()
    schedule = Schedule(
        name=name,
        agent_ref=agent_ref,
        cron=cron,
        input=input,
        timezone=timezone,
        catch_up=CatchUp(catch_up),
        misfire_grace_s=misfire_grace_s,
        priority=priority,
        tenant=tenant,
        next_tick_at=next_tick(cron, start, timezone=timezone),
        created_at=start,
    )
    await queue.add_schedule(schedule)
    return schedule


async def list_schedules(store: EventStore) -> list[Schedule]:
    """The store's schedules, with their next tick and last run."""
    return await require_queue(store).list_schedules()


async def remove_schedule(store: EventStore, name: str) -> bool:
    """Remove a schedule (the runs it started stay); False when there is none by that name."""
    return await require_queue(store).remove_schedule(name)


@dataclass(frozen=True, kw_only=True, slots=True)
class ScheduleFired:
    """What one worker did about one due schedule."""

    schedule: str
    """The schedule's name."""
    runs: tuple[tuple[datetime, RunId], ...]
    """Each tick fired and the run it started (an existing run when another worker fired the
    tick first)."""
    missed: int = 0
    """Ticks that will never fire."""
    advanced: bool = True
    """False when another worker moved the schedule on first."""


def acting_for(schedule: Schedule) -> RunContext:
    """Who a schedule's runs act for where no policy binds them to the local operator: the
    schedule itself (`automation:NAME@TENANT`), with every scope as an unbound run has, so that
    what keys on the bound principal (memory, daily caps) keys on the schedule."""
    principal = Principal(
        kind=PrincipalKind.AUTOMATION,
        id=schedule.name,
        tenant=schedule.tenant or DEFAULT_TENANT,
        scopes=("*",),
    )
    return RunContext(principal=principal, clearance="restricted")


async def fire_schedules(
    runtime: Runtime,
    *,
    now: datetime | None = None,
    agents: dict[str, Agent | Workflow] | None = None,
) -> list[ScheduleFired]:
    """Fire every schedule that is due at `now`; safe to call from every worker at once.

    `agents` caches loaded agents by reference between calls.
    """
    queue = queue_of(runtime.store)
    if queue is None:
        return []
    at = now or utcnow()
    cache = agents if agents is not None else {}
    out: list[ScheduleFired] = []
    for schedule in await queue.list_schedules(due_at=at):
        decision = plan(schedule, at)
        if decision is None:
            continue
        runs: list[tuple[datetime, RunId]] = []
        try:
            for tick in decision.fire:
                agent = cache.get(schedule.agent_ref)
                if agent is None:
                    agent = cache[schedule.agent_ref] = load_runnable(schedule.agent_ref)
                run_id = await runtime.start(
                    agent,
                    schedule.input,
                    agent_ref=schedule.agent_ref,
                    idempotency_key=tick_key(schedule.name, tick),
                    priority=schedule.priority,
                    tenant=schedule.tenant or None,
                    metadata={"schedule": schedule.name, "tick": tick.isoformat()},
                    context=None if runtime.authority is not None else acting_for(schedule),
                )
                runs.append((tick, run_id))
        except ContextOSError as exc:
            # The schedule stays where it is: its ticks fire once the agent loads again (or
            # count as missed by then). Ticks already started keep their runs: their keys
            # make firing them again a no-op.
            log.error("schedule %s: cannot start a run: %s", schedule.name, exc)
            continue
        advanced = await queue.advance_schedule(
            schedule.name,
            expected_next=schedule.next_tick_at,
            next_tick_at=decision.next_tick_at,
            last_tick_at=decision.last_tick,
            last_run_id=runs[-1][1] if runs else None,
        )
        if decision.missed and advanced:
            log.warning(
                "schedule %s: %d tick(s) missed by more than %gs (catch-up %s)",
                schedule.name,
                decision.missed,
                schedule.misfire_grace_s,
                schedule.catch_up.value,
            )
        out.append(
            ScheduleFired(
                schedule=schedule.name,
                runs=tuple(runs),
                missed=decision.missed,
                advanced=advanced,
            )
        )
    return out


def retry_delay(attempt: int, *, base_s: float = 1.0, cap_s: float = 300.0) -> float:
    """Back-off before retry number `attempt` (from 1): doubling, capped, with full jitter
    over its upper half so that runs failing together do not retry together."""
    ceiling = min(cap_s, base_s * 2 ** max(attempt - 1, 0))
    return float(ceiling / 2 + random.random() * ceiling / 2)


def retry_at(attempt: int, *, base_s: float = 1.0, cap_s: float = 300.0) -> datetime:
    """When retry number `attempt` may start: a durable timer for the run's queue row."""
    return utcnow() + timedelta(seconds=retry_delay(attempt, base_s=base_s, cap_s=cap_s))


__all__ = [
    "ScheduleFired",
    "Plan",
    "add_schedule",
    "check_cron",
    "fire_schedules",
    "latest_tick",
    "list_schedules",
    "next_tick",
    "plan",
    "remove_schedule",
    "retry_at",
    "retry_delay",
]
