"""The run queue on SQLite: mixed into SqliteStore, sharing its connection and thread.

Every operation is one IMMEDIATE transaction: SQLite lets one writer in at a time, so several
worker processes on one file claim runs one after another and never the same run twice. Times
are UNIX seconds from this machine's clock (all processes on one file share it).
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TypeVar

from contextos.errors import ConfigError
from contextos.runs import RunId
from contextos.store import wakeup
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

T = TypeVar("T")

_UNLIMITED = 2**62
_FORGET_S = 7 * 86400.0

# Runs holding a live lease, by tenant and agent: what the concurrency limits count. A run that
# waits for a person or ended holds no slot even if its worker died before letting go.
_LIVE = """
WITH live AS (
    SELECT q2.tenant AS tenant, q2.agent_name AS agent_name
    FROM run_queue q2 JOIN runs r2 ON r2.run_id = q2.run_id
    WHERE q2.lease_owner IS NOT NULL AND q2.lease_expires_at > :now
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

# When the next run that waits on a timer may be claimed: a live lease's expiry (its worker
# may die) or a not-before time, whichever is later.
_NEXT_DUE = """
SELECT min(t) FROM (
    SELECT CASE WHEN q.lease_owner IS NOT NULL AND q.lease_expires_at > :now
                THEN max(q.lease_expires_at, coalesce(q.not_before, 0)) ELSE q.not_before END AS t
    FROM run_queue q JOIN runs r ON r.run_id = q.run_id
    WHERE r.status IN ('queued', 'running')
) WHERE t > :now
"""

_SCHEDULE_COLUMNS = (
    "name, agent_ref, cron, input, timezone, catch_up, misfire_grace_s, priority, tenant,"
    " next_tick_at, last_tick_at, last_run_id, created_at"
)


_TRIGGER_COLUMNS = (
    "name, kind, agent_ref, agent_name, source_agent, on_status, input_template, secret_env,"
    " allow_cycle, max_depth, priority, tenant, created_at"
)


def _ts(dt: datetime | None) -> float | None:
    return dt.timestamp() if dt is not None else None


def _dt(value: Any) -> datetime:
    return datetime.fromtimestamp(float(value), UTC)


def _opt_dt(value: Any) -> datetime | None:
    return _dt(value) if value is not None else None


@contextmanager
def _immediate(conn: sqlite3.Connection) -> Iterator[None]:
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


class SqliteQueue:
    """RunQueue operations for SqliteStore."""

    if TYPE_CHECKING:

        async def _run(self, fn: Callable[[sqlite3.Connection], T]) -> T: ...

    # -- the queue and leases -------------------------------------------------------------

    async def enqueue(
        self, entry: QueueEntry, *, lease_owner: str | None = None, lease_s: float = 30.0
    ) -> tuple[RunId, Lease | None]:
        def _enqueue(conn: sqlite3.Connection) -> tuple[RunId, Lease | None]:
            now = time.time()
            with _immediate(conn):
                if entry.idempotency_key is not None:
                    row = conn.execute(
                        "SELECT run_id FROM run_queue WHERE idempotency_key = ?",
                        (entry.idempotency_key,),
                    ).fetchone()
                    if row is not None:
                        return RunId(str(row[0])), None
                expires = now + lease_s if lease_owner else None
                cur = conn.execute(
                    "INSERT INTO run_queue (run_id, priority, tenant, agent_name, idempotency_key,"
                    " enqueued_at, not_before, lease_owner, lease_token, lease_expires_at)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (run_id) DO NOTHING",
                    (
                        entry.run_id,
                        entry.priority,
                        entry.tenant,
                        entry.agent_name,
                        entry.idempotency_key,
                        now,
                        _ts(entry.not_before),
                        lease_owner,
                        1 if lease_owner else 0,
                        expires,
                    ),
                )
                if cur.rowcount != 1 or lease_owner is None or expires is None:
                    return entry.run_id, None
                return entry.run_id, Lease(
                    run_id=entry.run_id, worker_id=lease_owner, token=1, expires_at=_dt(expires)
                )

        return await self._run(_enqueue)

    async def claim(
        self, worker_id: str, *, lease_s: float, agents: Sequence[str] | None = None
    ) -> Lease | None:
        agent_names = list(agents) if agents is not None else None

        def _claim(conn: sqlite3.Connection) -> Lease | None:
            now = time.time()
            params: dict[str, Any] = {"now": now}
            agent_filter = ""
            if agent_names is not None:
                if not agent_names:
                    return None
                marks = ", ".join(f":a{i}" for i in range(len(agent_names)))
                agent_filter = f" AND q.agent_name IN ({marks})"
                params.update({f"a{i}": name for i, name in enumerate(agent_names)})
            with _immediate(conn):
                row = conn.execute(
                    _LIVE + "SELECT q.run_id, q.lease_owner, q.attempts"
                    " FROM runs r JOIN run_queue q ON q.run_id = r.run_id"
                    " WHERE r.status IN ('queued', 'running')"
                    " AND (q.lease_owner IS NULL OR q.lease_expires_at <= :now)"
                    " AND (q.not_before IS NULL OR q.not_before <= :now)"
                    + agent_filter
                    + _WITHIN_LIMITS
                    + " ORDER BY q.priority DESC, q.enqueued_at, q.run_id LIMIT 1",
                    params,
                ).fetchone()
                if row is None:
                    return None
                run_id, previous_owner, attempts = row
                recovered = previous_owner is not None
                attempts = int(attempts) + (1 if recovered else 0)
                expires = now + lease_s
                token = conn.execute(
                    "UPDATE run_queue SET lease_owner = ?, lease_token = lease_token + 1,"
                    " lease_expires_at = ?, attempts = ? WHERE run_id = ? RETURNING lease_token",
                    (worker_id, expires, attempts, run_id),
                ).fetchone()[0]
            return Lease(
                run_id=RunId(str(run_id)),
                worker_id=worker_id,
                token=int(token),
                expires_at=_dt(expires),
                attempts=attempts,
                recovered=recovered,
            )

        return await self._run(_claim)

    async def acquire(self, run_id: RunId, worker_id: str, *, lease_s: float) -> Lease:
        def _acquire(conn: sqlite3.Connection) -> Lease:
            now = time.time()
            expires = now + lease_s
            with _immediate(conn):
                token, attempts = conn.execute(
                    "INSERT INTO run_queue (run_id, agent_name, enqueued_at, lease_owner,"
                    " lease_token, lease_expires_at)"
                    " VALUES (?, COALESCE((SELECT agent_name FROM runs WHERE run_id = ?), ''),"
                    " ?, ?, 1, ?)"
                    " ON CONFLICT (run_id) DO UPDATE SET lease_owner = excluded.lease_owner,"
                    " lease_token = run_queue.lease_token + 1,"
                    " lease_expires_at = excluded.lease_expires_at"
                    " RETURNING lease_token, attempts",
                    (run_id, run_id, now, worker_id, expires),
                ).fetchone()
            return Lease(
                run_id=run_id,
                worker_id=worker_id,
                token=int(token),
                expires_at=_dt(expires),
                attempts=int(attempts),
            )

        return await self._run(_acquire)

    async def renew(self, lease: Lease, *, lease_s: float) -> Lease | None:
        def _renew(conn: sqlite3.Connection) -> Lease | None:
            expires = time.time() + lease_s
            with _immediate(conn):
                cur = conn.execute(
                    "UPDATE run_queue SET lease_expires_at = ?"
                    " WHERE run_id = ? AND lease_owner = ? AND lease_token = ?",
                    (expires, lease.run_id, lease.worker_id, lease.token),
                )
                held = cur.rowcount == 1
            if not held:
                return None
            return Lease(
                run_id=lease.run_id,
                worker_id=lease.worker_id,
                token=lease.token,
                expires_at=_dt(expires),
                attempts=lease.attempts,
                recovered=lease.recovered,
            )

        return await self._run(_renew)

    async def release(
        self, lease: Lease, *, not_before: datetime | None = None, failed: bool = False
    ) -> bool:
        def _release(conn: sqlite3.Connection) -> bool:
            with _immediate(conn):
                cur = conn.execute(
                    "UPDATE run_queue SET lease_owner = NULL, lease_expires_at = NULL,"
                    " not_before = ?, attempts = attempts + ?"
                    " WHERE run_id = ? AND lease_owner = ? AND lease_token = ?",
                    (
                        _ts(not_before),
                        1 if failed else 0,
                        lease.run_id,
                        lease.worker_id,
                        lease.token,
                    ),
                )
                return cur.rowcount == 1

        released = await self._run(_release)
        if released:  # other processes find it by polling
            wakeup.wake_local(self)
        return released

    async def next_due(self) -> float | None:
        def _next(conn: sqlite3.Connection) -> float | None:
            now = time.time()
            row = conn.execute(_NEXT_DUE, {"now": now}).fetchone()
            return None if row is None or row[0] is None else max(0.0, float(row[0]) - now)

        return await self._run(_next)

    async def queue_entry(self, run_id: RunId) -> QueueEntry | None:
        def _get(conn: sqlite3.Connection) -> tuple[Any, ...] | None:
            row: tuple[Any, ...] | None = conn.execute(
                "SELECT run_id, priority, tenant, agent_name, idempotency_key, not_before,"
                " enqueued_at, attempts, lease_owner, lease_expires_at"
                " FROM run_queue WHERE run_id = ?",
                (run_id,),
            ).fetchone()
            return row

        row = await self._run(_get)
        if row is None:
            return None
        rid, priority, tenant, agent, key, not_before, enqueued, attempts, owner, expires = row
        return QueueEntry(
            run_id=RunId(str(rid)),
            priority=int(priority),
            tenant=str(tenant),
            agent_name=str(agent),
            idempotency_key=key,
            not_before=_opt_dt(not_before),
            enqueued_at=_dt(enqueued),
            attempts=int(attempts),
            lease_owner=owner,
            lease_expires_at=_opt_dt(expires),
        )

    # -- limits ---------------------------------------------------------------------------

    async def set_limit(self, scope: LimitScope, name: str, max_running: int | None) -> None:
        scope = LimitScope(scope)
        key = "" if scope is LimitScope.GLOBAL else name

        def _set(conn: sqlite3.Connection) -> None:
            with _immediate(conn):
                if max_running is None:
                    conn.execute(
                        "DELETE FROM concurrency_limits WHERE scope = ? AND name = ?",
                        (scope.value, key),
                    )
                else:
                    conn.execute(
                        "INSERT INTO concurrency_limits (scope, name, max_running)"
                        " VALUES (?, ?, ?) ON CONFLICT (scope, name)"
                        " DO UPDATE SET max_running = excluded.max_running",
                        (scope.value, key, max_running),
                    )

        await self._run(_set)

    async def limits(self) -> list[Limit]:
        def _list(conn: sqlite3.Connection) -> list[tuple[Any, ...]]:
            return conn.execute(
                "SELECT scope, name, max_running FROM concurrency_limits ORDER BY scope, name"
            ).fetchall()

        return [
            Limit(scope=LimitScope(s), name=str(n), max_running=int(m))
            for s, n, m in await self._run(_list)
        ]

    # -- workers --------------------------------------------------------------------------

    async def register_worker(self, info: WorkerInfo) -> None:
        def _register(conn: sqlite3.Connection) -> None:
            now = time.time()
            with _immediate(conn):
                # Every process registers anew: forget those silent for a week.
                conn.execute("DELETE FROM workers WHERE heartbeat_at < ?", (now - _FORGET_S,))
                conn.execute(
                    "INSERT INTO workers (worker_id, host, pid, concurrency, status, started_at,"
                    " heartbeat_at) VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (worker_id)"
                    " DO UPDATE SET status = excluded.status, heartbeat_at = excluded.heartbeat_at",
                    (
                        info.worker_id,
                        info.host,
                        info.pid,
                        info.concurrency,
                        WorkerStatus(info.status).value,
                        now,
                        now,
                    ),
                )

        await self._run(_register)

    async def worker_heartbeat(self, worker_id: str, status: WorkerStatus) -> None:
        def _beat(conn: sqlite3.Connection) -> None:
            with _immediate(conn):
                conn.execute(
                    "UPDATE workers SET heartbeat_at = ?, status = ? WHERE worker_id = ?",
                    (time.time(), WorkerStatus(status).value, worker_id),
                )

        await self._run(_beat)

    async def list_workers(self, *, live_within_s: float | None = 60.0) -> list[WorkerInfo]:
        def _list(conn: sqlite3.Connection) -> list[WorkerInfo]:
            now = time.time()
            live = live_within_s is not None
            since = now - live_within_s if live_within_s is not None else float("-inf")
            workers = conn.execute(
                "SELECT worker_id, host, pid, concurrency, status, started_at, heartbeat_at"
                " FROM workers WHERE heartbeat_at >= ? AND (? = 0 OR status <> 'stopped')"
                " ORDER BY started_at, worker_id",
                (since, int(live)),
            ).fetchall()
            leases: dict[str, list[Lease]] = {}
            for run_id, owner, token, expires, attempts in conn.execute(
                "SELECT run_id, lease_owner, lease_token, lease_expires_at, attempts"
                " FROM run_queue WHERE lease_owner IS NOT NULL AND lease_expires_at > ?"
                " ORDER BY run_id",
                (now,),
            ):
                leases.setdefault(str(owner), []).append(
                    Lease(
                        run_id=RunId(str(run_id)),
                        worker_id=str(owner),
                        token=int(token),
                        expires_at=_dt(expires),
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
                    started_at=_dt(started),
                    heartbeat_at=_dt(beat),
                    leases=tuple(leases.get(str(wid), ())),
                )
                for wid, host, pid, conc, status, started, beat in workers
            ]

        return await self._run(_list)

    # -- schedules ------------------------------------------------------------------------

    async def add_schedule(self, schedule: Schedule) -> None:
        s = schedule

        def _add(conn: sqlite3.Connection) -> None:
            with _immediate(conn):
                try:
                    conn.execute(
                        f"INSERT INTO schedules ({_SCHEDULE_COLUMNS})"
                        " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
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
                            _ts(s.next_tick_at),
                            _ts(s.last_tick_at),
                            s.last_run_id,
                            _ts(s.created_at) or time.time(),
                        ),
                    )
                except sqlite3.IntegrityError as exc:
                    raise ConfigError(
                        f"a schedule named {s.name!r} exists already", schedule=s.name
                    ) from exc

        await self._run(_add)
        wakeup.wake_local(self, wakeup.Ready.SCHEDULES)

    async def list_schedules(self, *, due_at: datetime | None = None) -> list[Schedule]:
        def _list(conn: sqlite3.Connection) -> list[tuple[Any, ...]]:
            if due_at is None:
                return conn.execute(
                    f"SELECT {_SCHEDULE_COLUMNS} FROM schedules ORDER BY name"
                ).fetchall()
            return conn.execute(
                f"SELECT {_SCHEDULE_COLUMNS} FROM schedules WHERE next_tick_at <= ?"
                " ORDER BY next_tick_at, name",
                (due_at.timestamp(),),
            ).fetchall()

        return [_schedule(row) for row in await self._run(_list)]

    async def remove_schedule(self, name: str) -> bool:
        def _remove(conn: sqlite3.Connection) -> bool:
            with _immediate(conn):
                return conn.execute("DELETE FROM schedules WHERE name = ?", (name,)).rowcount == 1

        return await self._run(_remove)

    async def advance_schedule(
        self,
        name: str,
        *,
        expected_next: datetime,
        next_tick_at: datetime,
        last_tick_at: datetime,
        last_run_id: RunId | None,
    ) -> bool:
        def _advance(conn: sqlite3.Connection) -> bool:
            with _immediate(conn):
                cur = conn.execute(
                    "UPDATE schedules SET next_tick_at = ?, last_tick_at = ?,"
                    " last_run_id = COALESCE(?, last_run_id)"
                    " WHERE name = ? AND abs(next_tick_at - ?) < 0.0005",
                    (
                        next_tick_at.timestamp(),
                        last_tick_at.timestamp(),
                        last_run_id,
                        name,
                        expected_next.timestamp(),
                    ),
                )
                return cur.rowcount == 1

        return await self._run(_advance)

    # -- triggers -------------------------------------------------------------------------

    async def add_trigger(self, trigger: Trigger) -> None:
        t = trigger

        def _add(conn: sqlite3.Connection) -> None:
            with _immediate(conn):
                try:
                    conn.execute(
                        f"INSERT INTO triggers ({_TRIGGER_COLUMNS})"
                        " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                        (
                            t.name,
                            TriggerKind(t.kind).value,
                            t.agent_ref,
                            t.agent_name,
                            t.source_agent or None,
                            TriggerOn(t.on).value,
                            t.input,
                            t.secret_env,
                            int(t.allow_cycle),
                            t.max_depth,
                            t.priority,
                            t.tenant,
                            _ts(t.created_at) or time.time(),
                        ),
                    )
                except sqlite3.IntegrityError as exc:
                    raise ConfigError(
                        f"a trigger named {t.name!r} exists already", trigger=t.name
                    ) from exc

        await self._run(_add)

    async def list_triggers(self) -> list[Trigger]:
        def _list(conn: sqlite3.Connection) -> list[tuple[Any, ...]]:
            return conn.execute(f"SELECT {_TRIGGER_COLUMNS} FROM triggers ORDER BY name").fetchall()

        return [_trigger(row) for row in await self._run(_list)]

    async def remove_trigger(self, name: str) -> bool:
        def _remove(conn: sqlite3.Connection) -> bool:
            with _immediate(conn):
                conn.execute("DELETE FROM trigger_firings WHERE trigger_name = ?", (name,))
                return conn.execute("DELETE FROM triggers WHERE name = ?", (name,)).rowcount == 1

        return await self._run(_remove)

    async def due_firings(self, *, run_id: RunId | None = None, limit: int = 100) -> list[Firing]:
        def _due(conn: sqlite3.Connection) -> list[tuple[Any, ...]]:
            if run_id is not None:
                return conn.execute(
                    "SELECT trigger_name, run_id, status, attempts FROM trigger_firings"
                    " WHERE run_id = ? ORDER BY id LIMIT ?",
                    (run_id, limit),
                ).fetchall()
            return conn.execute(
                "SELECT trigger_name, run_id, status, attempts FROM trigger_firings"
                " WHERE not_before IS NULL OR not_before <= ? ORDER BY id LIMIT ?",
                (time.time(), limit),
            ).fetchall()

        return [
            Firing(trigger=str(t), run_id=RunId(str(r)), status=str(s), attempts=int(a))
            for t, r, s, a in await self._run(_due)
        ]

    async def firing_done(self, trigger: str, run_id: RunId) -> None:
        def _done(conn: sqlite3.Connection) -> None:
            with _immediate(conn):
                conn.execute(
                    "DELETE FROM trigger_firings WHERE trigger_name = ? AND run_id = ?",
                    (trigger, run_id),
                )

        await self._run(_done)

    async def defer_firing(self, trigger: str, run_id: RunId, *, not_before: datetime) -> None:
        def _defer(conn: sqlite3.Connection) -> None:
            with _immediate(conn):
                conn.execute(
                    "UPDATE trigger_firings SET attempts = attempts + 1, not_before = ?"
                    " WHERE trigger_name = ? AND run_id = ?",
                    (not_before.timestamp(), trigger, run_id),
                )

        await self._run(_defer)


def _trigger(row: tuple[Any, ...]) -> Trigger:
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
        created_at=_dt(at),
    )


def _schedule(row: tuple[Any, ...]) -> Schedule:
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
        next_tick_at=_dt(nxt),
        last_tick_at=_opt_dt(last),
        last_run_id=RunId(str(last_run)) if last_run is not None else None,
        created_at=_dt(created),
    )
