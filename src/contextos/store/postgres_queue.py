"""The run queue on PostgreSQL: the shared SQL of `queue_sql`, run on PostgresStore's pool.

Workers claim with `FOR UPDATE SKIP LOCKED`, so many claim at once without waiting on each
other; when concurrency limits exist, claims take a transaction-scoped advisory lock first so
two workers cannot both take the last free slot. Lease times come from the database's clock.
Only the operations that need it run in a transaction (each costs two more round trips).
"""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TypeVar

import psycopg
from psycopg import errors as pg_errors

from contextos.store.queue_sql import SqlQueue
from contextos.store.statements import POSTGRES, Start, run_postgres

T = TypeVar("T")


class PostgresQueue(SqlQueue):
    """RunQueue operations for PostgresStore."""

    _DIALECT = POSTGRES.naming(
        skip_locked="FOR UPDATE OF q SKIP LOCKED", same_tick="next_tick_at = :expected"
    )
    _DUPLICATE = pg_errors.UniqueViolation
    _CLAIM_LOCK = "SELECT pg_advisory_xact_lock(hashtext('contextos.claim.' || current_schema()))"

    if TYPE_CHECKING:

        def _conn(self) -> AbstractAsyncContextManager[psycopg.AsyncConnection[Any]]: ...

    async def _execute(self, start: Start[T], *, atomic: bool = False) -> T:
        async with self._conn() as conn:
            return await run_postgres(conn, start(), self._DIALECT, atomic=atomic)

    def _stored(self, at: datetime | None) -> datetime | None:
        return at

    def _instant(self, value: Any) -> datetime:
        assert isinstance(value, datetime)
        return value.astimezone(UTC)


__all__ = ["PostgresQueue"]
