"""The run queue on PostgreSQL: mixed into PostgresStore, sharing its pool.

Workers claim with `FOR UPDATE SKIP LOCKED`, so many claim at once without waiting on each
other; when concurrency limits exist, claims take a transaction-scoped advisory lock first so
two workers cannot both take the last free slot. Lease times come from the database's clock.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import errors as pg_errors

from contextos.errors import ConfigError
from contextos.runs import RunId
from contextos.store.queue import (
    DEFAULT_LIMIT_NAME,
    CatchUp,
    Firing,
    Lease,
    Limit,
    LimitScope,
    QueueEntry,
    Schedule,
    Trigger,
    TriggerKind,
    TriggerOn,
    WorkerInfo,
    WorkerStatus,
)

_UNLIMITED = 2**31 - 1

_LIVE = """
WITH live AS (
    SELECT q2.tenant AS tenant, q2.agent_name AS agent_name
    FROM run_queue q2 JOIN runs r2 ON r2.run_id = q2.run_id
    WHERE q2.lease_owner IS NOT NULL AND q2.lease_expires_at > now()
      AND r2.status IN ('queued', 'running')
)
"""

_WITHIN_LIMITS = f"""
  AND (SELECT count(*) FROM live) < COALESCE(
        (SELECT max_running FROM concurrency_limits WHERE scope = 'global'), {_UNLIMITED})
  AND (SELECT count(*) FROM live WHERE live.tenant = q.tenant) < COALESCE(
        (SELECT max_running FROM concurrency_limits WHERE scope = 'tenant' AND name = q.tenant),
        (SELECT max_running FROM concurrency_limits
          WHERE scope = 'tenant' AND name = '{DEFAULT_LIMIT_NAME}'),
        {_UNLIMITED})
  AND (SELECT count(*) FROM live WHERE live.agent_name = q.agent_name) < COALESCE(
        (SELECT max_running FROM concurrency_limits
          WHERE scope = 'agent' AND name = q.agent_name),
        (SELECT max_running FROM concurrency_limits
          WHERE scope = 'agent' AND name = '{DEFAULT_LIMIT_NAME}'),
        {_UNLIMITED})
"""

_CLAIM = (
    _LIVE
    + """
SELECT q.run_id, q.lease_owner, q.attempts
FROM runs r JOIN run_queue q ON q.run_id = r.run_id
WHERE r.status IN ('queued', 'running')
  AND (q.lease_owner IS NULL OR q.lease_expires_at <= now())
  AND (q.not_before IS NULL OR q.not_before <= now())
  AND (%(agents)s::text[] IS NULL OR q.agent_name = ANY(%(agents)s::text[]))
"""
    + _WITHIN_LIMITS
    + """
ORDER BY q.priority DESC, q.enqueued_at, q.run_id
LIMIT 1
FOR UPDATE OF q SKIP LOCKED
"""
)

# When the next run that waits on a timer may be claimed: a live lease's expiry (its worker
# may die) or a not-before time, whichever is later. Seconds from the database's clock.
_NEXT_DUE = """
SELECT EXTRACT(EPOCH FROM min(t) - now()) FROM (
    SELECT CASE WHEN q.lease_owner IS NOT NULL AND q.lease_expires_at > now()
                THEN GREATEST(q.lease_expires_at, q.not_before) ELSE q.not_before END AS t
    FROM run_queue q JOIN runs r ON r.run_id = q.run_id
    WHERE r.status IN ('queued', 'running')
) AS due WHERE t > now()
"""

_CLAIM_LOCK = "SELECT pg_advisory_xact_lock(hashtext('contextos.claim.' || current_schema()))"

_SCHEDULE_COLUMNS = (
    "name, agent_ref, cron, input, timezone, catch_up, misfire_grace_s, priority, tenant,"
    " next_tick_at, last_tick_at, last_run_id, created_at"
)


_TRIGGER_COLUMNS = (
    "name, kind, agent_ref, agent_name, source_agent, on_status, input_template, secret_env,"
    " allow_cycle, max_depth, priority, tenant, created_at"
)


def _utc(value: Any) -> datetime:
    assert isinstance(value, datetime)
    return value.astimezone(UTC)


def _opt_utc(value: Any) -> datetime | None:
    return _utc(value) if value is not None else None


class PostgresQueue:
    """RunQueue operations for PostgresStore."""

    if TYPE_CHECKING:

        def _conn(self) -> AbstractAsyncContextManager[psycopg.AsyncConnection[Any]]: ...

    # -- the queue and leases -------------------------------------------------------------

    async def enqueue(
        self, entry: QueueEntry, *, lease_owner: str | None = None, lease_s: float = 30.0
    ) -> tuple[RunId, Lease | None]:
        async with self._conn() as conn:
            cur = await conn.execute(
                "INSERT INTO run_queue (run_id, priority, tenant, agent_name, idempotency_key,"
                " not_before, lease_owner, lease_token, lease_expires_at)"
                " VALUES (%(run_id)s, %(priority)s, %(tenant)s, %(agent)s, %(key)s,"
                " %(not_before)s, %(owner)s, CASE WHEN %(owner)s::text IS NULL THEN 0 ELSE 1 END,"
                " CASE WHEN %(owner)s::text IS NULL THEN NULL"
                " ELSE now() + make_interval(secs => %(lease_s)s) END)"
                " ON CONFLICT DO NOTHING RETURNING lease_expires_at",
                {
                    "run_id": entry.run_id,
                    "priority": entry.priority,
                    "tenant": entry.tenant,
                    "agent": entry.agent_name,
                    "key": entry.idempotency_key,
                    "not_before": entry.not_before,
                    "owner": lease_owner,
                    "lease_s": lease_s,
                },
            )
            row = await cur.fetchone()
            if row is not None:
                if lease_owner is None:
                    return entry.run_id, None
                return entry.run_id, Lease(
                    run_id=entry.run_id, worker_id=lease_owner, token=1, expires_at=_utc(row[0])
                )
            if entry.idempotency_key is not None:
                cur = await conn.execute(
                    "SELECT run_id FROM run_queue WHERE idempotency_key = %s",
                    (entry.idempotency_key,),
                )
                found = await cur.fetchone()
                if found is not None:
                    return RunId(str(found[0])), None
            return entry.run_id, None

    async def claim(
        self, worker_id: str, *, lease_s: float, agents: Sequence[str] | None = None
    ) -> Lease | None:
        names = list(agents) if agents is not None else None
        async with self._conn() as conn, conn.transaction():
            cur = await conn.execute("SELECT EXISTS (SELECT 1 FROM concurrency_limits)")
            limited = await cur.fetchone()
            if limited is not None and limited[0]:
                await conn.execute(_CLAIM_LOCK)
            cur = await conn.execute(_CLAIM, {"agents": names})
            row = await cur.fetchone()
            if row is None:
                return None
            run_id, previous_owner, attempts = row
            recovered = previous_owner is not None
            attempts = int(attempts) + (1 if recovered else 0)
            cur = await conn.execute(
                "UPDATE run_queue SET lease_owner = %s, lease_token = lease_token + 1,"
                " lease_expires_at = now() + make_interval(secs => %s), attempts = %s"
                " WHERE run_id = %s RETURNING lease_token, lease_expires_at",
                (worker_id, lease_s, attempts, run_id),
            )
            updated = await cur.fetchone()
            assert updated is not None
        return Lease(
            run_id=RunId(str(run_id)),
            worker_id=worker_id,
            token=int(updated[0]),
            expires_at=_utc(updated[1]),
            attempts=attempts,
            recovered=recovered,
        )

    async def acquire(self, run_id: RunId, worker_id: str, *, lease_s: float) -> Lease:
        async with self._conn() as conn:
            cur = await conn.execute(
                "INSERT INTO run_queue (run_id, agent_name, lease_owner, lease_token,"
                " lease_expires_at) VALUES (%(run_id)s,"
                " COALESCE((SELECT agent_name FROM runs WHERE run_id = %(run_id)s), ''),"
                " %(owner)s, 1, now() + make_interval(secs => %(lease_s)s))"
                " ON CONFLICT (run_id) DO UPDATE SET lease_owner = EXCLUDED.lease_owner,"
                " lease_token = run_queue.lease_token + 1,"
                " lease_expires_at = EXCLUDED.lease_expires_at"
                " RETURNING lease_token, lease_expires_at, attempts",
                {"run_id": run_id, "owner": worker_id, "lease_s": lease_s},
            )
            row = await cur.fetchone()
        assert row is not None
        return Lease(
            run_id=run_id,
            worker_id=worker_id,
            token=int(row[0]),
            expires_at=_utc(row[1]),
            attempts=int(row[2]),
        )

    async def renew(self, lease: Lease, *, lease_s: float) -> Lease | None:
        async with self._conn() as conn:
            cur = await conn.execute(
                "UPDATE run_queue SET lease_expires_at = now() + make_interval(secs => %s)"
                " WHERE run_id = %s AND lease_owner = %s AND lease_token = %s"
                " RETURNING lease_expires_at",
                (lease_s, lease.run_id, lease.worker_id, lease.token),
            )
            row = await cur.fetchone()
        if row is None:
            return None
        return Lease(
            run_id=lease.run_id,
            worker_id=lease.worker_id,
            token=lease.token,
            expires_at=_utc(row[0]),
            attempts=lease.attempts,
            recovered=lease.recovered,
        )

    async def release(
        self, lease: Lease, *, not_before: datetime | None = None, failed: bool = False
    ) -> bool:
        async with self._conn() as conn:
            cur = await conn.execute(
                "UPDATE run_queue SET lease_owner = NULL, lease_expires_at = NULL,"
                " not_before = %s, attempts = attempts + %s"
                " WHERE run_id = %s AND lease_owner = %s AND lease_token = %s",
                (not_before, 1 if failed else 0, lease.run_id, lease.worker_id, lease.token),
            )
            return cur.rowcount == 1

    async def next_due(self) -> float | None:
        async with self._conn() as conn:
            cur = await conn.execute(_NEXT_DUE)
            row = await cur.fetchone()
        return None if row is None or row[0] is None else max(0.0, float(row[0]))

    async def queue_entry(self, run_id: RunId) -> QueueEntry | None:
        async with self._conn() as conn:
            cur = await conn.execute(
                "SELECT run_id, priority, tenant, agent_name, idempotency_key, not_before,"
                " enqueued_at, attempts, lease_owner, lease_expires_at"
                " FROM run_queue WHERE run_id = %s",
                (run_id,),
            )
            row = await cur.fetchone()
        if row is None:
            return None
        rid, priority, tenant, agent, key, not_before, enqueued, attempts, owner, expires = row
        return QueueEntry(
            run_id=RunId(str(rid)),
            priority=int(priority),
            tenant=str(tenant),
            agent_name=str(agent),
            idempotency_key=key,
            not_before=_opt_utc(not_before),
            enqueued_at=_utc(enqueued),
            attempts=int(attempts),
            lease_owner=owner,
            lease_expires_at=_opt_utc(expires),
        )

    # -- limits ---------------------------------------------------------------------------

    async def set_limit(self, scope: LimitScope, name: str, max_running: int | None) -> None:
        scope = LimitScope(scope)
        key = "" if scope is LimitScope.GLOBAL else name
        async with self._conn() as conn:
            if max_running is None:
                await conn.execute(
                    "DELETE FROM concurrency_limits WHERE scope = %s AND name = %s",
                    (scope.value, key),
                )
            else:
                await conn.execute(
                    "INSERT INTO concurrency_limits (scope, name, max_running)"
                    " VALUES (%s, %s, %s) ON CONFLICT (scope, name)"
                    " DO UPDATE SET max_running = EXCLUDED.max_running",
                    (scope.value, key, max_running),
                )

    async def limits(self) -> list[Limit]:
        async with self._conn() as conn:
            cur = await conn.execute(
                "SELECT scope, name, max_running FROM concurrency_limits ORDER BY scope, name"
            )
            rows = await cur.fetchall()
        return [Limit(scope=LimitScope(s), name=str(n), max_running=int(m)) for s, n, m in rows]

    # -- workers --------------------------------------------------------------------------

    async def register_worker(self, info: WorkerInfo) -> None:
        async with self._conn() as conn:
            # Every process registers anew: forget those silent for a week.
            await conn.execute("DELETE FROM workers WHERE heartbeat_at < now() - interval '7 days'")
            await conn.execute(
                "INSERT INTO workers (worker_id, host, pid, concurrency, status)"
                " VALUES (%s, %s, %s, %s, %s) ON CONFLICT (worker_id)"
                " DO UPDATE SET status = EXCLUDED.status, heartbeat_at = now()",
                (
                    info.worker_id,
                    info.host,
                    info.pid,
                    info.concurrency,
                    WorkerStatus(info.status).value,
                ),
            )

    async def worker_heartbeat(self, worker_id: str, status: WorkerStatus) -> None:
        async with self._conn() as conn:
            await conn.execute(
                "UPDATE workers SET heartbeat_at = now(), status = %s WHERE worker_id = %s",
                (WorkerStatus(status).value, worker_id),
            )

    async def list_workers(self, *, live_within_s: float | None = 60.0) -> list[WorkerInfo]:
        async with self._conn() as conn:
            cur = await conn.execute(
                "SELECT worker_id, host, pid, concurrency, status, started_at, heartbeat_at"
                " FROM workers WHERE %(within)s::float8 IS NULL"
                " OR (heartbeat_at >= now() - make_interval(secs => %(within)s::float8)"
                " AND status <> 'stopped')"
                " ORDER BY started_at, worker_id",
                {"within": live_within_s},
            )
            workers = await cur.fetchall()
            cur = await conn.execute(
                "SELECT run_id, lease_owner, lease_token, lease_expires_at, attempts"
                " FROM run_queue WHERE lease_owner IS NOT NULL AND lease_expires_at > now()"
                " ORDER BY run_id"
            )
            lease_rows = await cur.fetchall()
        leases: dict[str, list[Lease]] = {}
        for run_id, owner, token, expires, attempts in lease_rows:
            leases.setdefault(str(owner), []).append(
                Lease(
                    run_id=RunId(str(run_id)),
                    worker_id=str(owner),
                    token=int(token),
                    expires_at=_utc(expires),
                    attempts=int(attempts),
                )
            )
        return [
            WorkerInfo(
                worker_id=str(wid),
                host=str(host),
                pid=int(pid),
                concurrency=int(conc),
                status=WorkerStatus(str(status)),
                started_at=_utc(started),
                heartbeat_at=_utc(beat),
                leases=tuple(leases.get(str(wid), ())),
            )
            for wid, host, pid, conc, status, started, beat in workers
        ]

    # -- schedules ------------------------------------------------------------------------

    async def add_schedule(self, schedule: Schedule) -> None:
        s = schedule
        async with self._conn() as conn:
            try:
                await conn.execute(
                    f"INSERT INTO schedules ({_SCHEDULE_COLUMNS}) VALUES"
                    " (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, COALESCE(%s, now()))",
                    (
                        s.name,
                        s.agent_ref,
                        s.cron,
                        s.input,
                        s.timezone,
                        CatchUp(s.catch_up).value,
                        s.misfire_grace_s,
                        s.priority,
                        s.tenant,
                        s.next_tick_at,
                        s.last_tick_at,
                        s.last_run_id,
                        s.created_at,
                    ),
                )
            except pg_errors.UniqueViolation as exc:
                raise ConfigError(
                    f"a schedule named {s.name!r} exists already", schedule=s.name
                ) from exc

    async def list_schedules(self, *, due_at: datetime | None = None) -> list[Schedule]:
        async with self._conn() as conn:
            if due_at is None:
                cur = await conn.execute(f"SELECT {_SCHEDULE_COLUMNS} FROM schedules ORDER BY name")
            else:
                cur = await conn.execute(
                    f"SELECT {_SCHEDULE_COLUMNS} FROM schedules WHERE next_tick_at <= %s"
                    " ORDER BY next_tick_at, name",
                    (due_at,),
                )
            rows = await cur.fetchall()
        return [_schedule(row) for row in rows]

    async def remove_schedule(self, name: str) -> bool:
        async with self._conn() as conn:
            cur = await conn.execute("DELETE FROM schedules WHERE name = %s", (name,))
            return cur.rowcount == 1

    async def advance_schedule(
        self,
        name: str,
        *,
        expected_next: datetime,
        next_tick_at: datetime,
        last_tick_at: datetime,
        last_run_id: RunId | None,
    ) -> bool:
        async with self._conn() as conn:
            cur = await conn.execute(
                "UPDATE schedules SET next_tick_at = %s, last_tick_at = %s,"
                " last_run_id = COALESCE(%s, last_run_id)"
                " WHERE name = %s AND next_tick_at = %s",
                (next_tick_at, last_tick_at, last_run_id, name, expected_next),
            )
            return cur.rowcount == 1

    # -- triggers -------------------------------------------------------------------------

    async def add_trigger(self, trigger: Trigger) -> None:
        t = trigger
        async with self._conn() as conn:
            try:
                await conn.execute(
                    f"INSERT INTO triggers ({_TRIGGER_COLUMNS}) VALUES"
                    " (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, COALESCE(%s, now()))",
                    (
                        t.name,
                        TriggerKind(t.kind).value,
                        t.agent_ref,
                        t.agent_name,
                        t.source_agent or None,
                        TriggerOn(t.on).value,
                        t.input,
                        t.secret_env,
                        t.allow_cycle,
                        t.max_depth,
                        t.priority,
                        t.tenant,
                        t.created_at,
                    ),
                )
            except pg_errors.UniqueViolation as exc:
                raise ConfigError(
                    f"a trigger named {t.name!r} exists already", trigger=t.name
                ) from exc

    async def list_triggers(self) -> list[Trigger]:
        async with self._conn() as conn:
            cur = await conn.execute(f"SELECT {_TRIGGER_COLUMNS} FROM triggers ORDER BY name")
            rows = await cur.fetchall()
        return [_trigger(row) for row in rows]

    async def remove_trigger(self, name: str) -> bool:
        async with self._conn() as conn, conn.transaction():
            await conn.execute("DELETE FROM trigger_firings WHERE trigger_name = %s", (name,))
            cur = await conn.execute("DELETE FROM triggers WHERE name = %s", (name,))
            return cur.rowcount == 1

    async def due_firings(self, *, run_id: RunId | None = None, limit: int = 100) -> list[Firing]:
        async with self._conn() as conn:
            if run_id is not None:
                cur = await conn.execute(
                    "SELECT trigger_name, run_id, status, attempts FROM trigger_firings"
                    " WHERE run_id = %s ORDER BY id LIMIT %s",
                    (run_id, limit),
                )
            else:
                cur = await conn.execute(
                    "SELECT trigger_name, run_id, status, attempts FROM trigger_firings"
                    " WHERE not_before IS NULL OR not_before <= now() ORDER BY id LIMIT %s",
                    (limit,),
                )
            rows = await cur.fetchall()
        return [
            Firing(trigger=str(t), run_id=RunId(str(r)), status=str(s), attempts=int(a))
            for t, r, s, a in rows
        ]

    async def firing_done(self, trigger: str, run_id: RunId) -> None:
        async with self._conn() as conn:
            await conn.execute(
                "DELETE FROM trigger_firings WHERE trigger_name = %s AND run_id = %s",
                (trigger, run_id),
            )

    async def defer_firing(self, trigger: str, run_id: RunId, *, not_before: datetime) -> None:
        async with self._conn() as conn:
            await conn.execute(
                "UPDATE trigger_firings SET attempts = attempts + 1, not_before = %s"
                " WHERE trigger_name = %s AND run_id = %s",
                (not_before, trigger, run_id),
            )


def _trigger(row: Sequence[Any]) -> Trigger:
    (name, kind, ref, agent, source, on, template, secret, cycle, depth, prio, tenant, at) = row
    return Trigger(
        name=str(name),
        kind=TriggerKind(str(kind)),
        agent_ref=str(ref),
        agent_name=str(agent),
        source_agent=str(source or ""),
        on=TriggerOn(str(on)),
        input=None if template is None else str(template),
        secret_env=None if secret is None else str(secret),
        allow_cycle=bool(cycle),
        max_depth=int(depth),
        priority=int(prio),
        tenant=str(tenant),
        created_at=_utc(at),
    )


def _schedule(row: Sequence[Any]) -> Schedule:
    (name, ref, cron, input_, tz, catch_up, grace, prio, tenant, nxt, last, last_run, created) = row
    return Schedule(
        name=str(name),
        agent_ref=str(ref),
        cron=str(cron),
        input=str(input_),
        timezone=str(tz),
        catch_up=CatchUp(str(catch_up)),
        misfire_grace_s=float(grace),
        priority=int(prio),
        tenant=str(tenant),
        next_tick_at=_utc(nxt),
        last_tick_at=_opt_utc(last),
        last_run_id=RunId(str(last_run)) if last_run is not None else None,
        created_at=_utc(created),
    )


__all__ = ["PostgresQueue"]
