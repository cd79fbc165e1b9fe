"""The run queue on SQLite: the shared SQL of `queue_sql`, run inside SqliteStore's group commit.

Every operation is one transaction (its savepoint in the group's IMMEDIATE transaction), on the
event loop's thread: SQLite lets one writer in at a time, so several worker processes on one
file claim runs one after another and never the same run twice. Times are UNIX seconds from
this machine's clock (all processes on one file share it).
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TypeVar

from contextos.store import wakeup
from contextos.store.queue_sql import SqlQueue
from contextos.store.statements import SQLITE, Start, run_sqlite

T = TypeVar("T")


class SqliteQueue(SqlQueue):
    """RunQueue operations for SqliteStore."""

    _DIALECT = SQLITE.naming(
        skip_locked="",  # the IMMEDIATE transaction holds the file's only write lock
        # A tick stored as float seconds and read back through a datetime may differ in its
        # last bits.
        same_tick="abs(next_tick_at - :expected) < 0.0005",
    )
    _DUPLICATE = sqlite3.IntegrityError

    if TYPE_CHECKING:

        async def _run(self, fn: Callable[[sqlite3.Connection], T]) -> T: ...

    async def _execute(self, start: Start[T], *, atomic: bool = False) -> T:
        return await self._run(
            lambda conn: run_sqlite(conn, start(), self._DIALECT, now=time.time())
        )

    def _stored(self, at: datetime | None) -> float | None:
        return at.timestamp() if at is not None else None

    def _instant(self, value: Any) -> datetime:
        return datetime.fromtimestamp(float(value), UTC)

    def _announce(self, ready: wakeup.Ready) -> None:
        wakeup.wake_local(self, ready)  # other processes on the file find it by polling


__all__ = ["SqliteQueue"]
