"""The PostgreSQL event store, for many workers on many machines (psycopg 3, async pool).

It keeps the same promises as the SQLite store: an append names the seq it expects and fails
with ConcurrencyConflict when the log moved on (the row lock on the run serialises writers);
a batch commits whole or not at all; the database's own triggers keep events append-only and
terminal runs frozen, whatever SQL reaches them.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Coroutine, Sequence
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg import errors as pg_errors
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from contextos import events as ev
from contextos.errors import (
    ConcurrencyConflict,
    MigrationError,
    RunIsTerminal,
    RunNotFound,
    StoreError,
    StoreNotFound,
    StoreUnavailable,
)
from contextos.runs import TERMINAL, RunId, RunStatus
from contextos.state import RunState
from contextos.store import snapshots
from contextos.store.artifacts import SqlArtifacts
from contextos.store.base import (
    Row,
    RunSummary,
    check_batch,
    decode_rows,
    encode_batch,
    run_filter,
    summarize,
)
from contextos.store.migrations import POSTGRES_MIGRATIONS
from contextos.store.postgres_queue import PostgresQueue
from contextos.store.tokens import SqlTokens

_TERMINAL_VALUES = frozenset(s.value for s in TERMINAL)

_SUMMARY_COLUMNS = (
    "run_id, agent_name, agent_version, status, last_seq, created_at, updated_at,"
    " turns, input_tokens, output_tokens, cost_usd"
)

_TERMINAL_SQL = "(" + ", ".join(f"'{v}'" for v in sorted(_TERMINAL_VALUES)) + ")"

_INSERT_EVENTS = """
INSERT INTO events (run_id, seq, type, schema_version, occurred_at, payload)
SELECT %(run_id)s, e.seq, e.type, e.version, e.at, e.payload
FROM unnest(%(seqs)s::bigint[], %(types)s::text[], %(versions)s::integer[],
            %(ats)s::timestamptz[], %(payloads)s::bytea[]) AS e(seq, type, version, at, payload)
WHERE EXISTS (SELECT 1 FROM moved)
RETURNING 1
"""

_INSERT_EVENT = """
INSERT INTO events (run_id, seq, type, schema_version, occurred_at, payload)
SELECT %(run_id)s, %(e_seq)s::bigint, %(e_type)s::text, %(e_version)s::integer,
       %(e_at)s::timestamptz, %(e_payload)s::bytea
WHERE EXISTS (SELECT 1 FROM moved)
RETURNING 1
"""
"""One event, the usual append: the same insert with plain parameters, since adapting five
lists costs the client several times what the statement's other parameters do."""

_MOVE_RUN = (
    """
WITH moved AS (
    UPDATE runs SET last_seq = %(last)s, updated_at = %(updated)s,
        status = COALESCE(%(status)s, status), turns = turns + %(turns)s,
        input_tokens = input_tokens + %(tin)s, output_tokens = output_tokens + %(tout)s,
        cost_usd = cost_usd + %(cost)s
    WHERE run_id = %(run_id)s AND last_seq = %(expected)s AND status NOT IN """
    + _TERMINAL_SQL
    + """
    RETURNING 1
), inserted AS ("""
)

_CREATE_RUN = """
WITH moved AS (
    INSERT INTO runs (run_id, agent_name, agent_version, status, last_seq, created_at,
                      updated_at, turns, input_tokens, output_tokens, cost_usd)
    VALUES (%(run_id)s, %(agent)s, %(version)s, COALESCE(%(status)s, 'queued'), %(last)s,
            %(created)s, %(updated)s, %(turns)s, %(tin)s, %(tout)s, %(cost)s)
    ON CONFLICT (run_id) DO NOTHING
    RETURNING 1
), inserted AS ("""

_COUNT = """)
SELECT count(*) FROM inserted
"""

_COUNT_NO_WAIT = """)
SELECT count(*) FROM inserted WHERE set_config('synchronous_commit', 'off', true) IS NOT NULL
"""
"""The same, committed without waiting for the WAL to reach the disk: the setting holds for the
statement's own transaction only, and the next synchronous commit, flushing the WAL up to its
own record, flushes this one too."""

_APPENDS = {
    (create, one, synchronous): (_CREATE_RUN if create else _MOVE_RUN)
    + (_INSERT_EVENT if one else _INSERT_EVENTS)
    + (_COUNT if synchronous else _COUNT_NO_WAIT)
    for create in (True, False)
    for one in (True, False)
    for synchronous in (True, False)
}
"""The append statement: (creates the run, holds one event, waits for the disk) -> its SQL."""

# Serialises migrations of one schema across processes that start together.
_MIGRATION_LOCK = "SELECT pg_advisory_xact_lock(hashtext('contextos.migrate.' || current_schema()))"


def redact(url: str) -> str:
    """The URL without its password, for messages."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


class PostgresStore(PostgresQueue, SqlTokens, snapshots.Snapshotting, SqlArtifacts):
    """EventStore (and RunQueue) on a PostgreSQL database.

    The pool opens, and the schema is migrated, on first use. `search_path` in the URL
    (`?options=-csearch_path%3Dmyschema`) puts ContextOS's tables in a schema of their own.
    """

    def __init__(
        self,
        url: str,
        *,
        min_size: int = 1,
        max_size: int = 10,
        connect_timeout_s: float = 10.0,
        create: bool = True,
    ) -> None:
        self.url = url
        self._create = create
        """Whether first use may create the schema (False: a store that was never set up here
        raises StoreNotFound, for commands that only read)."""
        self._min_size = min_size
        self._max_size = max_size
        self._connect_timeout_s = connect_timeout_s
        self._pool: AsyncConnectionPool | None = None
        self._opening: asyncio.Lock | None = None
        self._closed = False
        self._folds = snapshots.Folds()
        self._tasks: set[asyncio.Task[None]] = set()

    # -- plumbing -------------------------------------------------------------------------

    async def _ensure_pool(self) -> AsyncConnectionPool:
        if self._closed:
            raise RuntimeError("store is closed")
        if self._pool is not None:
            return self._pool
        if self._opening is None:
            self._opening = asyncio.Lock()
        async with self._opening:
            if self._pool is None:
                await self._check_reachable()
                pool = AsyncConnectionPool(
                    self.url,
                    min_size=self._min_size,
                    max_size=self._max_size,
                    open=False,
                    kwargs={"autocommit": True},
                    timeout=max(self._connect_timeout_s, 30.0),
                    name="contextos",
                )
                try:
                    await pool.open(wait=True, timeout=self._connect_timeout_s)
                    async with pool.connection() as conn:
                        await migrate(conn)
                except PoolTimeout as exc:
                    await pool.close()
                    raise StoreError(
                        f"cannot connect to PostgreSQL at {redact(self.url)} within "
                        f"{self._connect_timeout_s:g}s",
                        url=redact(self.url),
                    ) from exc
                except BaseException:
                    await pool.close()
                    raise
                self._pool = pool
        return self._pool

    async def _connect_once(self) -> psycopg.AsyncConnection[Any]:
        """One connection of its own; StoreUnavailable at once when the server cannot be
        reached (the pool would retry, and log every retry, until its timeout)."""
        try:
            return await psycopg.AsyncConnection.connect(
                self.url, connect_timeout=max(1, int(self._connect_timeout_s))
            )
        except psycopg.OperationalError as exc:
            reason = " ".join(line.strip() for line in str(exc).splitlines()) or "no answer"
            raise StoreUnavailable(
                f"cannot connect to PostgreSQL at {redact(self.url)}: {reason}; check that the "
                "server runs and the URL (--store or CONTEXTOS_STORE)",
                url=redact(self.url),
            ) from exc

    async def _check_reachable(self) -> None:
        """Fail fast on a server that is not there, or (not creating) a schema never set up."""
        conn = await self._connect_once()
        try:
            if not self._create and await schema_version(conn) == 0:
                raise StoreNotFound(redact(self.url))
        finally:
            await conn.close()

    @asynccontextmanager
    async def _conn(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        pool = await self._ensure_pool()
        async with pool.connection() as conn:
            yield conn

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        if not self._closed and self._pool is not None:
            self._unsaved()
        while self._tasks:  # snapshots being written
            await asyncio.gather(*self._tasks, return_exceptions=True)
        self._closed = True
        if self._pool is not None:
            pool, self._pool = self._pool, None
            await pool.close()

    # -- EventStore -----------------------------------------------------------------------

    async def append(
        self,
        run_id: RunId,
        events: Sequence[ev.Event],
        *,
        expected_seq: int,
        synchronous: bool = True,
        folded: RunState | None = None,
    ) -> int:
        check_batch(run_id, events, expected_seq)
        delta = summarize(events)
        first, last = events[0], events[-1]
        params: dict[str, Any] = {
            "run_id": run_id,
            "expected": expected_seq,
            "last": last.seq,
            "updated": last.occurred_at,
            "status": delta.status.value if delta.status else None,
            "turns": delta.turns,
            "tin": delta.input_tokens,
            "tout": delta.output_tokens,
            "cost": delta.cost_usd,
        }
        payloads = encode_batch(run_id, events)
        one = len(events) == 1
        if one:
            params.update(
                e_seq=first.seq,
                e_type=first.type,
                e_version=type(first).SCHEMA_VERSION,
                e_at=first.occurred_at,
                e_payload=payloads[0],
            )
        else:
            params.update(
                seqs=[e.seq for e in events],
                types=[e.type for e in events],
                versions=[type(e).SCHEMA_VERSION for e in events],
                ats=[e.occurred_at for e in events],
                payloads=payloads,
            )
        if expected_seq == 0:
            assert isinstance(first, ev.RunCreated)
            params.update(
                agent=first.agent_name, version=first.agent_version, created=first.occurred_at
            )
        sql = _APPENDS[expected_seq == 0, one, synchronous]
        async with self._conn() as conn:
            try:
                # One statement, so one round trip and one implicit transaction: the run's row
                # moves on only from the expected seq (the fence, under its row lock), and the
                # events go in only if it did.
                cur = await conn.execute(sql, params)
                row = await cur.fetchone()
            except pg_errors.UniqueViolation as exc:
                # Rows at these seqs exist already (written around the store): nothing of the
                # batch went in.
                raise ConcurrencyConflict(
                    run_id, expected_seq, await _last_seq(conn, run_id)
                ) from exc
            except pg_errors.RaiseException as exc:
                if "terminal" not in str(exc):
                    raise StoreError(str(exc), run_id=run_id) from exc
                status = await _status(conn, run_id)
                if status in _TERMINAL_VALUES:
                    raise RunIsTerminal(run_id, status) from exc
                # The batch's own ending met rows past the log's end (written around the
                # store): nothing of it went in.
                raise ConcurrencyConflict(
                    run_id, expected_seq, await _last_seq(conn, run_id)
                ) from exc
            if row is not None and row[0] == len(events):
                self._folded(run_id, expected_seq, events, folded)
                return last.seq
            cur = await conn.execute(
                "SELECT last_seq, status FROM runs WHERE run_id = %s", (run_id,)
            )
            found = await cur.fetchone()
        if found is None:
            raise RunNotFound(run_id)
        last_seq, status = int(found[0]), str(found[1])
        if expected_seq != 0 and status in _TERMINAL_VALUES:
            raise RunIsTerminal(run_id, status)
        raise ConcurrencyConflict(run_id, expected_seq, last_seq)

    async def read(self, run_id: RunId, *, after_seq: int = 0) -> list[ev.Event]:
        rows = await self._read_rows(run_id, after_seq)
        return await decode_rows(run_id, rows)

    async def _read_rows(self, run_id: RunId, after_seq: int) -> list[Row]:
        async with self._conn() as conn:
            return await _events(conn, run_id, after_seq)

    async def _read_snapshot(self, run_id: RunId) -> tuple[snapshots.Snapshot | None, list[Row]]:
        async with self._conn() as conn:
            cur = await conn.execute(
                "SELECT seq, format, state FROM snapshots WHERE run_id = %s AND format = %s"
                " AND seq <= (SELECT last_seq FROM runs WHERE run_id = %s)",  # never ahead
                (run_id, snapshots.FORMAT, run_id),
                binary=True,  # bytes as they are, not as hex text to decode
            )
            row = await cur.fetchone()
            snap = None if row is None else (int(row[0]), str(row[1]), bytes(row[2]))
            return snap, await _events(conn, run_id, snap[0] if snap is not None else 0)

    async def _write_snapshot(self, run_id: RunId, seq: int, blob: bytes) -> None:
        async with self._conn() as conn:
            await conn.execute(
                "INSERT INTO snapshots (run_id, seq, format, state) VALUES (%s, %s, %s, %s)"
                " ON CONFLICT (run_id) DO UPDATE SET seq = EXCLUDED.seq,"
                " format = EXCLUDED.format, state = EXCLUDED.state, written_at = now()"
                " WHERE EXCLUDED.seq > snapshots.seq OR EXCLUDED.format <> snapshots.format",
                (run_id, seq, snapshots.FORMAT, blob),
            )

    async def get_run(self, run_id: RunId) -> RunSummary:
        async with self._conn() as conn:
            cur = await conn.execute(
                f"SELECT {_SUMMARY_COLUMNS} FROM runs WHERE run_id = %s", (run_id,)
            )
            row = await cur.fetchone()
        if row is None:
            raise RunNotFound(run_id)
        return _summary(row)

    async def list_runs(
        self,
        *,
        status: RunStatus | None = None,
        limit: int = 50,
        tenant: str | None = None,
        top_level: bool = False,
        prefix: str | None = None,
    ) -> list[RunSummary]:
        where, params = run_filter(
            status, tenant, "%s", top_level=top_level, prefix=prefix, bytewise=("~>=~", "~<~")
        )
        async with self._conn() as conn:
            cur = await conn.execute(
                f"SELECT {_SUMMARY_COLUMNS} FROM runs{where} ORDER BY updated_at DESC LIMIT %s",
                (*params, limit),
            )
            rows = await cur.fetchall()
        return [_summary(r) for r in rows]

    async def daily_usage(self, principal: str, day: str) -> tuple[int, int, float]:
        """A principal's model usage on a UTC day (`YYYY-MM-DD`): tokens, calls, money.

        Kept by a trigger on the event log (migration 3), as the SQLite store keeps it.
        """
        async with self._conn() as conn:
            cur = await conn.execute(
                "SELECT input_tokens + output_tokens, calls, cost_usd FROM principal_usage"
                " WHERE principal = %s AND day = %s",
                (principal, day),
            )
            row = await cur.fetchone()
        if row is None:
            return 0, 0, 0.0
        return int(row[0]), int(row[1]), float(row[2])

    async def migrate(self) -> int:
        """Bring the schema to this code's version (first use does it too); return the version.

        Run by the role that owns the tables when the processes run as one that may not change
        them (docs/deploying.md).
        """
        await self._ensure_pool()
        return len(POSTGRES_MIGRATIONS)

    async def verify(self) -> int:
        """Check the schema is fully migrated without changing anything; return its version.

        It uses a connection of its own in a read-only transaction, so it neither opens the
        pool (which would migrate) nor can write.
        """
        conn = await self._connect_once()
        try:
            await conn.execute("SET TRANSACTION READ ONLY")
            current = await schema_version(conn)
        finally:
            await conn.rollback()
            await conn.close()
        if current != len(POSTGRES_MIGRATIONS):
            raise MigrationError(
                f"database schema is at version {current}, this ContextOS expects "
                f"{len(POSTGRES_MIGRATIONS)}",
                current=current,
                expected=len(POSTGRES_MIGRATIONS),
            )
        return current


async def _events(conn: psycopg.AsyncConnection[Any], run_id: RunId, after_seq: int) -> list[Row]:
    cur = await conn.execute(
        "SELECT seq, type, schema_version, payload, occurred_at FROM events"
        " WHERE run_id = %s AND seq > %s ORDER BY seq",
        (run_id, after_seq),
        binary=True,  # payloads as they are, not as hex text to decode
    )
    rows = await cur.fetchall()
    if not rows and after_seq == 0:
        cur = await conn.execute("SELECT 1 FROM runs WHERE run_id = %s", (run_id,))
        if await cur.fetchone() is None:
            raise RunNotFound(run_id)
    return [(int(seq), str(t), int(v), bytes(payload), at) for seq, t, v, payload, at in rows]


async def _last_seq(conn: psycopg.AsyncConnection[Any], run_id: str) -> int:
    cur = await conn.execute("SELECT last_seq FROM runs WHERE run_id = %s", (run_id,))
    row = await cur.fetchone()
    return int(row[0]) if row is not None else 0


async def _status(conn: psycopg.AsyncConnection[Any], run_id: str) -> str:
    cur = await conn.execute("SELECT status FROM runs WHERE run_id = %s", (run_id,))
    row = await cur.fetchone()
    return str(row[0]) if row is not None else "unknown"


def _utc(value: Any) -> datetime:
    assert isinstance(value, datetime)
    return value.astimezone(UTC)


def _summary(row: Sequence[Any]) -> RunSummary:
    (run_id, name, version, status, last_seq, created, updated, turns, tin, tout, cost) = row
    return RunSummary(
        run_id=RunId(str(run_id)),
        agent_name=str(name),
        agent_version=str(version),
        status=RunStatus(str(status)),
        last_seq=int(last_seq),
        created_at=_utc(created),
        updated_at=_utc(updated),
        turns=int(turns),
        input_tokens=int(tin),
        output_tokens=int(tout),
        cost_usd=float(cost),
    )


async def schema_version(conn: psycopg.AsyncConnection[Any]) -> int:
    cur = await conn.execute("SELECT to_regclass('contextos_migrations') IS NOT NULL")
    row = await cur.fetchone()
    if row is None or not row[0]:
        return 0
    cur = await conn.execute("SELECT max(version) FROM contextos_migrations")
    row = await cur.fetchone()
    return int(row[0] or 0) if row is not None else 0


async def migrate(conn: psycopg.AsyncConnection[Any]) -> int:
    """Apply the migrations this schema lacks, in one transaction, one process at a time.

    A schema already at this code's version is only read, so a role that may not change it
    (see docs/deploying.md) opens the store as well as its owner.
    """
    async with conn.transaction():
        await conn.execute(_MIGRATION_LOCK)
        current = await schema_version(conn)
        if current > len(POSTGRES_MIGRATIONS):
            raise MigrationError(
                f"database schema is at version {current} but this ContextOS knows "
                f"{len(POSTGRES_MIGRATIONS)}; upgrade ContextOS",
                current=current,
                expected=len(POSTGRES_MIGRATIONS),
            )
        if current == len(POSTGRES_MIGRATIONS):
            return current
        try:
            await conn.execute(
                "CREATE TABLE IF NOT EXISTS contextos_migrations ("
                " version integer PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())"
            )
            for version, script in enumerate(POSTGRES_MIGRATIONS, start=1):
                if version <= current:
                    continue
                await conn.execute(script.encode())
                await conn.execute(
                    "INSERT INTO contextos_migrations (version) VALUES (%s)", (version,)
                )
        except pg_errors.InsufficientPrivilege as exc:
            raise MigrationError(
                f"database schema is at version {current}, this ContextOS needs "
                f"{len(POSTGRES_MIGRATIONS)}, and this role may not migrate it ({exc}); "
                "run `contextos migrate` as the role that owns the tables",
                current=current,
                expected=len(POSTGRES_MIGRATIONS),
            ) from exc
    return len(POSTGRES_MIGRATIONS)
