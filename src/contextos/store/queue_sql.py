"""The run queue's SQL and logic, written once for every store backend.

Leases, limits, the worker registry, schedules and trigger firings are the same statements on
SQLite and PostgreSQL (`statements` says how they are written). A backend's subclass supplies
the hooks: its dialect, how a time is stored, which error means a name is taken, what keeps two
claims from taking the last free slot, and how an operation's statements run.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from datetime import datetime
from typing import Any, ClassVar, TypeVar

from contextos.errors import ConfigError
from contextos.runs import RunId
from contextos.store import wakeup
from contextos.store.queue import (
    DEFAULT_LIMIT_NAME,
    CatchUp,
    ConcurrencyLimit,
    Firing,
    Lease,
    LimitScope,
    QueueEntry,
    Schedule,
    Trigger,
    TriggerKind,
    TriggerOn,
    WorkerInfo,
    WorkerStatus,
)
from contextos.store.statements import Dialect, Op, Start, all_rows, changed_rows, first_row

T = TypeVar("T")

_UNLIMITED = 2**31 - 1
_FORGET_S = 7 * 86400.0
"""Workers silent this long are forgotten when another one registers."""

# -- the queue and leases ---------------------------------------------------------------------

# Runs holding a live lease, by tenant and agent: what the concurrency limits count. A run that
# waits for a person or ended holds no slot even if its worker died before letting go.
_LIVE = """
WITH live AS (
    SELECT q2.tenant AS tenant, q2.agent_name AS agent_name
    FROM run_queue q2 JOIN runs r2 ON r2.run_id = q2.run_id
    WHERE q2.lease_owner IS NOT NULL AND q2.lease_expires_at > {now}
      AND r2.status IN ('queued', 'running')
)
"""

_CLAIMABLE = """
SELECT q.run_id, q.lease_owner, q.attempts
FROM runs r JOIN run_queue q ON q.run_id = r.run_id
WHERE r.status IN ('queued', 'running')
  AND (q.lease_owner IS NULL OR q.lease_expires_at <= {now})
  AND (q.not_before IS NULL OR q.not_before <= {now})
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
ORDER BY q.priority DESC, q.enqueued_at, q.run_id
LIMIT 1 {{skip_locked}}
"""


@functools.cache
def _claim(agents: int | None) -> str:
    """The claim of a worker serving `agents` named agents (`:a0`, `:a1`, …; None: all)."""
    if agents is None:
        return _LIVE + _CLAIMABLE + _WITHIN_LIMITS
    names = ", ".join(f":a{i}" for i in range(agents))
    return _LIVE + _CLAIMABLE + f"  AND q.agent_name IN ({names})" + _WITHIN_LIMITS


_ANY_LIMIT = "SELECT EXISTS (SELECT 1 FROM concurrency_limits)"

_LEASE = """
UPDATE run_queue SET lease_owner = :worker, lease_token = lease_token + 1,
    lease_expires_at = {now + :lease_s}, attempts = :attempts
WHERE run_id = :run_id RETURNING lease_token, lease_expires_at
"""

_ENQUEUE = """
INSERT INTO run_queue (run_id, priority, tenant, agent_name, idempotency_key, enqueued_at,
                       not_before, lease_owner, lease_token, lease_expires_at)
VALUES (:run_id, :priority, :tenant, :agent_name, :key, {now}, :not_before, :owner, :token,
        CASE WHEN :token = 1 THEN {now + :lease_s} END)
ON CONFLICT DO NOTHING RETURNING lease_expires_at
"""

_BY_KEY = "SELECT run_id FROM run_queue WHERE idempotency_key = :key"

_ACQUIRE = """
INSERT INTO run_queue (run_id, agent_name, enqueued_at, lease_owner, lease_token,
                       lease_expires_at)
VALUES (:run_id, COALESCE((SELECT agent_name FROM runs WHERE run_id = :run_id), ''), {now},
        :worker, 1, {now + :lease_s})
ON CONFLICT (run_id) DO UPDATE SET lease_owner = excluded.lease_owner,
    lease_token = run_queue.lease_token + 1, lease_expires_at = excluded.lease_expires_at
RETURNING lease_token, lease_expires_at, attempts
"""

# An explicit resume: the lease, unless another holder's is still live (its holder may be
# driving the run right now; only its expiry says it is gone).
_TAKE = """
INSERT INTO run_queue (run_id, agent_name, enqueued_at, lease_owner, lease_token,
                       lease_expires_at)
VALUES (:run_id, COALESCE((SELECT agent_name FROM runs WHERE run_id = :run_id), ''), {now},
        :worker, 1, {now + :lease_s})
ON CONFLICT (run_id) DO UPDATE SET lease_owner = excluded.lease_owner,
    lease_token = run_queue.lease_token + 1, lease_expires_at = excluded.lease_expires_at
WHERE run_queue.lease_owner IS NULL OR run_queue.lease_expires_at <= {now}
    OR (run_queue.lease_owner = excluded.lease_owner AND :reenter = 1)
RETURNING lease_token, lease_expires_at, attempts
"""

_HELD = " WHERE run_id = :run_id AND lease_owner = :worker AND lease_token = :token"

_RENEW = (
    "UPDATE run_queue SET lease_expires_at = {now + :lease_s}"
    + _HELD
    + " RETURNING lease_expires_at"
)

_RELEASE = (
    "UPDATE run_queue SET lease_owner = NULL, lease_expires_at = NULL, not_before = :not_before,"
    " attempts = attempts + :failed" + _HELD
)

# When the next run that waits on a timer may be claimed: a live lease's expiry (its worker
# may die) or a not-before time, whichever is later; and the time it is now, to count from.
_NEXT_DUE = """
SELECT min(t), {now} FROM (
    SELECT CASE WHEN q.lease_owner IS NOT NULL AND q.lease_expires_at > {now}
                     AND (q.not_before IS NULL OR q.not_before < q.lease_expires_at)
                THEN q.lease_expires_at ELSE q.not_before END AS t
    FROM run_queue q JOIN runs r ON r.run_id = q.run_id
    WHERE r.status IN ('queued', 'running')
) AS due WHERE t > {now}
"""

_ENTRY = """
SELECT run_id, priority, tenant, agent_name, idempotency_key, not_before, enqueued_at,
       attempts, lease_owner, lease_expires_at
FROM run_queue WHERE run_id = :run_id
"""

# -- limits and workers -----------------------------------------------------------------------

_UNSET_LIMIT = "DELETE FROM concurrency_limits WHERE scope = :scope AND name = :name"

_SET_LIMIT = """
INSERT INTO concurrency_limits (scope, name, max_running) VALUES (:scope, :name, :max_running)
ON CONFLICT (scope, name) DO UPDATE SET max_running = excluded.max_running
"""

_LIMITS = "SELECT scope, name, max_running FROM concurrency_limits ORDER BY scope, name"

_FORGET_WORKERS = "DELETE FROM workers WHERE heartbeat_at < {now - :forget_s}"

_REGISTER = """
INSERT INTO workers (worker_id, host, pid, concurrency, status, started_at, heartbeat_at)
VALUES (:worker_id, :host, :pid, :concurrency, :status, {now}, {now})
ON CONFLICT (worker_id) DO UPDATE SET status = excluded.status,
    heartbeat_at = excluded.heartbeat_at
"""

_HEARTBEAT = "UPDATE workers SET heartbeat_at = {now}, status = :status WHERE worker_id = :id"

_WORKERS = "SELECT worker_id, host, pid, concurrency, status, started_at, heartbeat_at FROM workers"
_ALL_WORKERS = _WORKERS + " ORDER BY started_at, worker_id"
_LIVE_WORKERS = (
    _WORKERS + " WHERE heartbeat_at >= {now - :within} AND status <> 'stopped'"
    " ORDER BY started_at, worker_id"
)

_LIVE_LEASES = """
SELECT run_id, lease_owner, lease_token, lease_expires_at, attempts FROM run_queue
WHERE lease_owner IS NOT NULL AND lease_expires_at > {now} ORDER BY run_id
"""

# -- schedules and triggers -------------------------------------------------------------------

_SCHEDULE_COLUMNS = (
    "name, agent_ref, cron, input, timezone, catch_up, misfire_grace_s, priority, tenant,"
    " next_tick_at, last_tick_at, last_run_id, created_at"
)

_ADD_SCHEDULE = f"""
INSERT INTO schedules ({_SCHEDULE_COLUMNS})
VALUES (:name, :agent_ref, :cron, :input, :timezone, :catch_up, :misfire_grace_s, :priority,
        :tenant, :next_tick_at, :last_tick_at, :last_run_id, COALESCE(:created_at, {{now}}))
"""

_SCHEDULES = f"SELECT {_SCHEDULE_COLUMNS} FROM schedules ORDER BY name"
_DUE_SCHEDULES = (
    f"SELECT {_SCHEDULE_COLUMNS} FROM schedules WHERE next_tick_at <= :due_at"
    " ORDER BY next_tick_at, name"
)

_REMOVE_SCHEDULE = "DELETE FROM schedules WHERE name = :name"

# `{same_tick}`: the row's next tick is still `:expected` (compare and set).
_ADVANCE_SCHEDULE = """
UPDATE schedules SET next_tick_at = :next_tick_at, last_tick_at = :last_tick_at,
    last_run_id = COALESCE(:last_run_id, last_run_id)
WHERE name = :name AND {same_tick}
"""

_TRIGGER_COLUMNS = (
    "name, kind, agent_ref, agent_name, source_agent, on_status, input_template, secret_env,"
    " allow_cycle, max_depth, priority, tenant, created_at"
)

_ADD_TRIGGER = f"""
INSERT INTO triggers ({_TRIGGER_COLUMNS})
VALUES (:name, :kind, :agent_ref, :agent_name, :source_agent, :on_status, :input_template,
        :secret_env, :allow_cycle, :max_depth, :priority, :tenant, COALESCE(:created_at, {{now}}))
"""

_TRIGGERS = f"SELECT {_TRIGGER_COLUMNS} FROM triggers ORDER BY name"

_FORGET_FIRINGS = "DELETE FROM trigger_firings WHERE trigger_name = :name"
_REMOVE_TRIGGER = "DELETE FROM triggers WHERE name = :name"

_FIRINGS = "SELECT trigger_name, run_id, status, attempts FROM trigger_firings"
_FIRINGS_OF_RUN = _FIRINGS + " WHERE run_id = :run_id ORDER BY id LIMIT :limit"
_DUE_FIRINGS = (
    _FIRINGS + " WHERE not_before IS NULL OR not_before <= {now} ORDER BY id LIMIT :limit"
)

_FIRING = " WHERE trigger_name = :trigger AND run_id = :run_id"
_FIRING_DONE = "DELETE FROM trigger_firings" + _FIRING
_DEFER_FIRING = (
    "UPDATE trigger_firings SET attempts = attempts + 1, not_before = :not_before" + _FIRING
)


class SqlQueue:
    """RunQueue operations for a store; its backend's subclass supplies the hooks below."""

    _DIALECT: ClassVar[Dialect]
    """How the backend writes the statements; it names `skip_locked` (what a claim's SELECT
    ends with) and `same_tick` (see `_ADVANCE_SCHEDULE`)."""

    _DUPLICATE: ClassVar[type[Exception]]
    """What the backend's driver raises when an INSERT meets a taken unique name."""

    _CLAIM_LOCK: ClassVar[str | None] = None
    """Taken before a claim while concurrency limits exist, so two claims cannot both take the
    last free slot; None when the backend's transactions run one at a time anyway."""

    async def _execute(self, start: Start[T], *, atomic: bool = False) -> T:
        """Run an operation (`start` begins it afresh); `atomic`: in one transaction."""
        raise NotImplementedError

    def _stored(self, at: datetime | None) -> Any:
        """A time (or None) as the backend stores it."""
        raise NotImplementedError

    def _instant(self, value: Any) -> datetime:
        """A stored time as a UTC datetime."""
        raise NotImplementedError

    def _announce(self, ready: wakeup.Ready) -> None:
        """Work became ready here: wake this process's idle workers, unless the database
        tells every process itself."""

    # -- the queue and leases -------------------------------------------------------------

    async def enqueue(
        self, entry: QueueEntry, *, lease_owner: str | None = None, lease_s: float = 30.0
    ) -> tuple[RunId, Lease | None]:
        params = {
            "run_id": entry.run_id,
            "priority": entry.priority,
            "tenant": entry.tenant,
            "agent_name": entry.agent_name,
            "key": entry.idempotency_key,
            "not_before": self._stored(entry.not_before),
            "owner": lease_owner,
            "token": 0 if lease_owner is None else 1,
            "lease_s": lease_s,
        }

        def op() -> Op[tuple[RunId, Lease | None]]:
            inserted = yield _ENQUEUE, params
            if inserted.row is not None:
                if lease_owner is None:
                    return entry.run_id, None
                expires = self._instant(inserted.row[0])
                lease = Lease(
                    run_id=entry.run_id, worker_id=lease_owner, token=1, expires_at=expires
                )
                return entry.run_id, lease
            if entry.idempotency_key is not None:  # that key's run, or none when the id was taken
                found = yield _BY_KEY, {"key": entry.idempotency_key}
                if found.row is not None:
                    return RunId(str(found.row[0])), None
            return entry.run_id, None

        return await self._execute(op)

    async def claim(
        self, worker_id: str, *, lease_s: float, agents: Sequence[str] | None = None
    ) -> Lease | None:
        names = list(agents) if agents is not None else None
        if names == []:
            return None
        claim = _claim(None if names is None else len(names))
        params = {f"a{i}": name for i, name in enumerate(names or ())}

        def op() -> Op[Lease | None]:
            if self._CLAIM_LOCK is not None:
                limited = yield _ANY_LIMIT, {}
                if limited.row[0]:
                    yield self._CLAIM_LOCK, {}
            found = yield claim, params
            if found.row is None:
                return None
            run_id, previous_owner, attempts = found.row
            recovered = previous_owner is not None
            attempts = int(attempts) + (1 if recovered else 0)
            leased = yield (
                _LEASE,
                {
                    "worker": worker_id,
                    "lease_s": lease_s,
                    "attempts": attempts,
                    "run_id": run_id,
                },
            )
            token, expires = leased.row
            return Lease(
                run_id=RunId(str(run_id)),
                worker_id=worker_id,
                token=int(token),
                expires_at=self._instant(expires),
                attempts=attempts,
                recovered=recovered,
            )

        return await self._execute(op, atomic=True)

    async def acquire(self, run_id: RunId, worker_id: str, *, lease_s: float) -> Lease:
        def op() -> Op[Lease]:
            acquired = yield _ACQUIRE, {"run_id": run_id, "worker": worker_id, "lease_s": lease_s}
            token, expires, attempts = acquired.row
            return Lease(
                run_id=run_id,
                worker_id=worker_id,
                token=int(token),
                expires_at=self._instant(expires),
                attempts=int(attempts),
            )

        return await self._execute(op)

    async def take(
        self, run_id: RunId, worker_id: str, *, lease_s: float, reenter: bool = True
    ) -> Lease | None:
        params = {"run_id": run_id, "worker": worker_id, "lease_s": lease_s}
        params["reenter"] = int(reenter)

        def op() -> Op[Lease | None]:
            taken = yield _TAKE, params
            if taken.row is None:
                return None
            token, expires, attempts = taken.row
            return Lease(
                run_id=run_id,
                worker_id=worker_id,
                token=int(token),
                expires_at=self._instant(expires),
                attempts=int(attempts),
            )

        return await self._execute(op)

    async def renew(self, lease: Lease, *, lease_s: float) -> Lease | None:
        def op() -> Op[Lease | None]:
            renewed = yield _RENEW, {**_held(lease), "lease_s": lease_s}
            if renewed.row is None:
                return None
            return Lease(
                run_id=lease.run_id,
                worker_id=lease.worker_id,
                token=lease.token,
                expires_at=self._instant(renewed.row[0]),
                attempts=lease.attempts,
                recovered=lease.recovered,
            )

        return await self._execute(op)

    async def release(
        self, lease: Lease, *, not_before: datetime | None = None, failed: bool = False
    ) -> bool:
        params = {**_held(lease), "not_before": self._stored(not_before), "failed": int(failed)}

        def op() -> Op[bool]:
            released = yield _RELEASE, params
            return released.rowcount == 1

        released = await self._execute(op)
        if released:
            self._announce(wakeup.Ready.RUNS)
        return released

    async def next_due(self) -> float | None:
        def op() -> Op[float | None]:
            due = yield _NEXT_DUE, {}
            at, now = due.row
            if at is None:
                return None
            return max(0.0, (self._instant(at) - self._instant(now)).total_seconds())

        return await self._execute(op)

    async def queue_entry(self, run_id: RunId) -> QueueEntry | None:
        row = await self._execute(lambda: first_row(_ENTRY, {"run_id": run_id}))
        if row is None:
            return None
        rid, priority, tenant, agent, key, not_before, enqueued, attempts, owner, expires = row
        return QueueEntry(
            run_id=RunId(str(rid)),
            priority=int(priority),
            tenant=str(tenant),
            agent_name=str(agent),
            idempotency_key=key,
            not_before=self._maybe_instant(not_before),
            enqueued_at=self._instant(enqueued),
            attempts=int(attempts),
            lease_owner=owner,
            lease_expires_at=self._maybe_instant(expires),
        )

    # -- limits ---------------------------------------------------------------------------

    async def set_limit(self, scope: LimitScope, name: str, max_running: int | None) -> None:
        scope = LimitScope(scope)
        params = {
            "scope": scope.value,
            "name": "" if scope is LimitScope.GLOBAL else name,
            "max_running": max_running,
        }
        statement = _UNSET_LIMIT if max_running is None else _SET_LIMIT
        await self._execute(lambda: changed_rows(statement, params))

    async def limits(self) -> list[ConcurrencyLimit]:
        rows = await self._execute(lambda: all_rows(_LIMITS, {}))
        return [
            ConcurrencyLimit(scope=LimitScope(s), name=str(n), max_running=int(m))
            for s, n, m in rows
        ]

    # -- workers --------------------------------------------------------------------------

    async def register_worker(self, info: WorkerInfo) -> None:
        params = {
            "worker_id": info.worker_id,
            "host": info.host,
            "pid": info.pid,
            "concurrency": info.concurrency,
            "status": WorkerStatus(info.status).value,
        }

        def op() -> Op[None]:
            # Every process registers anew: forget those silent for a week.
            yield _FORGET_WORKERS, {"forget_s": _FORGET_S}
            yield _REGISTER, params

        await self._execute(op)

    async def worker_heartbeat(self, worker_id: str, status: WorkerStatus) -> None:
        params = {"id": worker_id, "status": WorkerStatus(status).value}
        await self._execute(lambda: changed_rows(_HEARTBEAT, params))

    async def list_workers(self, *, live_within_s: float | None = 60.0) -> list[WorkerInfo]:
        def op() -> Op[tuple[list[Any], list[Any]]]:
            if live_within_s is None:
                workers = yield _ALL_WORKERS, {}
            else:
                workers = yield _LIVE_WORKERS, {"within": live_within_s}
            leases = yield _LIVE_LEASES, {}
            return workers.rows, leases.rows

        workers, lease_rows = await self._execute(op)
        leases: dict[str, list[Lease]] = {}
        for run_id, owner, token, expires, attempts in lease_rows:
            leases.setdefault(str(owner), []).append(
                Lease(
                    run_id=RunId(str(run_id)),
                    worker_id=str(owner),
                    token=int(token),
                    expires_at=self._instant(expires),
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
                started_at=self._instant(started),
                heartbeat_at=self._instant(beat),
                leases=tuple(leases.get(str(wid), ())),
            )
            for wid, host, pid, conc, status, started, beat in workers
        ]

    # -- schedules ------------------------------------------------------------------------

    async def add_schedule(self, schedule: Schedule) -> None:
        s = schedule
        params = {
            "name": s.name,
            "agent_ref": s.agent_ref,
            "cron": s.cron,
            "input": s.input,
            "timezone": s.timezone,
            "catch_up": CatchUp(s.catch_up).value,
            "misfire_grace_s": s.misfire_grace_s,
            "priority": s.priority,
            "tenant": s.tenant,
            "next_tick_at": self._stored(s.next_tick_at),
            "last_tick_at": self._stored(s.last_tick_at),
            "last_run_id": s.last_run_id,
            "created_at": self._stored(s.created_at),
        }
        try:
            await self._execute(lambda: changed_rows(_ADD_SCHEDULE, params))
        except self._DUPLICATE as exc:
            raise ConfigError(
                f"a schedule named {s.name!r} exists already", schedule=s.name
            ) from exc
        self._announce(wakeup.Ready.SCHEDULES)

    async def list_schedules(self, *, due_at: datetime | None = None) -> list[Schedule]:
        if due_at is None:
            rows = await self._execute(lambda: all_rows(_SCHEDULES, {}))
        else:
            params = {"due_at": self._stored(due_at)}
            rows = await self._execute(lambda: all_rows(_DUE_SCHEDULES, params))
        return [self._schedule(row) for row in rows]

    async def remove_schedule(self, name: str) -> bool:
        return await self._execute(lambda: changed_rows(_REMOVE_SCHEDULE, {"name": name})) == 1

    async def advance_schedule(
        self,
        name: str,
        *,
        expected_next: datetime,
        next_tick_at: datetime,
        last_tick_at: datetime,
        last_run_id: RunId | None,
    ) -> bool:
        params = {
            "name": name,
            "expected": self._stored(expected_next),
            "next_tick_at": self._stored(next_tick_at),
            "last_tick_at": self._stored(last_tick_at),
            "last_run_id": last_run_id,
        }
        return await self._execute(lambda: changed_rows(_ADVANCE_SCHEDULE, params)) == 1

    # -- triggers -------------------------------------------------------------------------

    async def add_trigger(self, trigger: Trigger) -> None:
        t = trigger
        params = {
            "name": t.name,
            "kind": TriggerKind(t.kind).value,
            "agent_ref": t.agent_ref,
            "agent_name": t.agent_name,
            "source_agent": t.source_agent or None,
            "on_status": TriggerOn(t.on).value,
            "input_template": t.input,
            "secret_env": t.secret_env,
            "allow_cycle": t.allow_cycle,
            "max_depth": t.max_depth,
            "priority": t.priority,
            "tenant": t.tenant,
            "created_at": self._stored(t.created_at),
        }
        try:
            await self._execute(lambda: changed_rows(_ADD_TRIGGER, params))
        except self._DUPLICATE as exc:
            raise ConfigError(f"a trigger named {t.name!r} exists already", trigger=t.name) from exc

    async def list_triggers(self) -> list[Trigger]:
        return [self._trigger(row) for row in await self._execute(lambda: all_rows(_TRIGGERS, {}))]

    async def remove_trigger(self, name: str) -> bool:
        def op() -> Op[bool]:
            yield _FORGET_FIRINGS, {"name": name}
            removed = yield _REMOVE_TRIGGER, {"name": name}
            return removed.rowcount == 1

        return await self._execute(op, atomic=True)

    async def due_firings(self, *, run_id: RunId | None = None, limit: int = 100) -> list[Firing]:
        if run_id is not None:
            params: dict[str, Any] = {"run_id": run_id, "limit": limit}
            rows = await self._execute(lambda: all_rows(_FIRINGS_OF_RUN, params))
        else:
            rows = await self._execute(lambda: all_rows(_DUE_FIRINGS, {"limit": limit}))
        return [
            Firing(trigger=str(t), run_id=RunId(str(r)), status=str(s), attempts=int(a))
            for t, r, s, a in rows
        ]

    async def firing_done(self, trigger: str, run_id: RunId) -> None:
        params = {"trigger": trigger, "run_id": run_id}
        await self._execute(lambda: changed_rows(_FIRING_DONE, params))

    async def defer_firing(self, trigger: str, run_id: RunId, *, not_before: datetime) -> None:
        params = {"trigger": trigger, "run_id": run_id, "not_before": self._stored(not_before)}
        await self._execute(lambda: changed_rows(_DEFER_FIRING, params))

    # -- rows to records ------------------------------------------------------------------

    def _maybe_instant(self, value: Any) -> datetime | None:
        return None if value is None else self._instant(value)

    def _schedule(self, row: Sequence[Any]) -> Schedule:
        (name, ref, cron, input_, tz, catch_up, grace, prio, tenant, nxt, last, last_run, at) = row
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
            next_tick_at=self._instant(nxt),
            last_tick_at=self._maybe_instant(last),
            last_run_id=RunId(str(last_run)) if last_run is not None else None,
            created_at=self._instant(at),
        )

    def _trigger(self, row: Sequence[Any]) -> Trigger:
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
            created_at=self._instant(at),
        )


def _held(lease: Lease) -> dict[str, Any]:
    """The parameters of `_HELD`: the lease is still this holder's."""
    return {"run_id": lease.run_id, "worker": lease.worker_id, "token": lease.token}


__all__ = ["SqlQueue"]
