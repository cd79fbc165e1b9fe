"""Group commit on one SQLite connection: the writes of many callers in one transaction.

Each caller's write is a job; a batch of jobs runs in one IMMEDIATE transaction, each job in a
savepoint of its own, so a job that fails leaves no rows and the others still commit. A lone
job needs no savepoint. Each caller then hears how its own job ended.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast


@dataclass(slots=True)
class Job:
    """One caller's write, waiting for the next group commit."""

    work: Callable[[sqlite3.Connection], Any]
    """Runs inside the group's transaction, in a savepoint of its own."""
    joined: bool
    """True when `work` manages its own transaction (BEGIN/COMMIT), which then maps onto its
    savepoint; the store's own appends do not and get the bare connection."""
    future: asyncio.Future[Any]
    synchronous: bool = True
    """False when the commit need not wait for the disk (see `EventStore.append`)."""


def is_busy(exc: sqlite3.OperationalError) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return bool(code & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED))
    return "locked" in str(exc)


def write_batch(conn: sqlite3.Connection, batch: list[Job]) -> list[Any]:
    """Run every job in one IMMEDIATE transaction, each in its own savepoint.

    A job that fails leaves no rows and gets its error back; the others commit.
    """
    if any(job.synchronous for job in batch):
        return _write_jobs(conn, batch)
    # In WAL mode NORMAL skips the fsync of this commit; the next FULL one flushes the log
    # up to and including it, since frames are written in order.
    conn.execute("PRAGMA synchronous=NORMAL")
    try:
        return _write_jobs(conn, batch)
    finally:
        conn.execute("PRAGMA synchronous=FULL")


def _write_jobs(conn: sqlite3.Connection, batch: list[Job]) -> list[Any]:
    if len(batch) == 1 and not batch[0].joined:
        return [_write_alone(conn, batch[0])]
    conn.execute("BEGIN IMMEDIATE")
    try:
        out: list[Any] = []
        for job in batch:
            conn.execute("SAVEPOINT job")
            try:
                out.append(job.work(_joined(conn) if job.joined else conn))
            except Exception as exc:
                conn.execute("ROLLBACK TO job")
                out.append(_Failed(exc))
            conn.execute("RELEASE job")
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    return out


def _write_alone(conn: sqlite3.Connection, job: Job) -> Any:
    """A lone append needs no savepoint: on failure its whole transaction rolls back."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        result = job.work(conn)
    except Exception as exc:
        conn.execute("ROLLBACK")
        return _Failed(exc)
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    try:
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    return result


@dataclass(frozen=True, slots=True)
class _Failed:
    """A job's exception, told apart from a job that returned an exception object."""

    error: Exception


class _Joined:
    """The connection as a job inside the group's transaction sees it.

    Its own `BEGIN …` and `COMMIT` are no-ops (the group begins and commits), and its
    `ROLLBACK` undoes only its savepoint.
    """

    __slots__ = ("_conn",)

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    def execute(self, sql: str, parameters: Any = ()) -> sqlite3.Cursor:
        verb = sql.strip().rstrip(";").upper()
        if verb.startswith("BEGIN") or verb in ("COMMIT", "END", "COMMIT TRANSACTION"):
            return self._conn.cursor()
        if verb in ("ROLLBACK", "ROLLBACK TRANSACTION"):
            return self._conn.execute("ROLLBACK TO job")
        return self._conn.execute(sql, parameters)

    def commit(self) -> None:
        pass

    def rollback(self) -> None:
        self._conn.execute("ROLLBACK TO job")

    @property
    def in_transaction(self) -> bool:
        return True

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)


def _joined(conn: sqlite3.Connection) -> sqlite3.Connection:
    return cast(sqlite3.Connection, _Joined(conn))


def alone(loop: asyncio.AbstractEventLoop) -> bool:
    """True when no other callback waits to run on the loop and no timer is due, so no other
    caller could join a group commit made now: a commit then happens at once, which spares
    the caller two trips round the loop (the flush, then its wake-up). The loop's queues are
    private to asyncio's own loops: on any other loop this is False and every commit is
    grouped."""
    ready = getattr(loop, "_ready", None)
    timers = getattr(loop, "_scheduled", None)
    if ready is None or timers is None or ready:
        return False
    return not timers or timers[0].when() > loop.time()


def deliver(batch: list[Job], results: list[Any] | BaseException) -> None:
    """Tell each caller how its job ended (callers that gave up are skipped)."""
    for i, job in enumerate(batch):
        if job.future.done():
            continue
        if isinstance(results, BaseException):
            job.future.set_exception(results)
        elif isinstance(results[i], _Failed):
            job.future.set_exception(results[i].error)
        else:
            job.future.set_result(results[i])
