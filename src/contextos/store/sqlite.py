"""The embedded SQLite event store: one file, WAL, IMMEDIATE transactions.

All database work runs on one dedicated thread per store so the event loop never blocks on a
commit; several processes may share the file (IMMEDIATE transactions and a busy timeout
serialise their writers, and the expected-seq check fences them).
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path
from typing import TypeVar

from contextos import events as ev
from contextos.errors import (
    ConcurrencyConflict,
    MigrationError,
    RunIsTerminal,
    RunNotFound,
)
from contextos.runs import TERMINAL, RunId, RunStatus
from contextos.store.base import RunSummary, check_batch, summarize
from contextos.store.migrations import SQLITE_MIGRATIONS

T = TypeVar("T")

_TERMINAL_SQL = ", ".join(f"'{s.value}'" for s in sorted(TERMINAL))


class SqliteStore:
    """EventStore on a SQLite file."""

    def __init__(self, path: str | Path, *, busy_timeout_s: float = 30.0) -> None:
        self.path = Path(path)
        self.url = f"sqlite:///{self.path}"
        self._busy_timeout_s = busy_timeout_s
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="contextos-sqlite")
        self._conn: sqlite3.Connection | None = None
        self._closed = False

    # -- plumbing -------------------------------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        if self._conn is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(
                self.path,
                timeout=self._busy_timeout_s,
                isolation_level=None,  # we issue BEGIN IMMEDIATE ourselves
                check_same_thread=False,
            )
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=FULL")
            conn.execute(f"PRAGMA busy_timeout={int(self._busy_timeout_s * 1000)}")
            migrate(conn)
            self._conn = conn
        return self._conn

    async def _run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        if self._closed:
            raise RuntimeError("store is closed")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, lambda: fn(self._connect()))

    async def close(self) -> None:
        if self._closed:
            return

        def _close(_: object = None) -> None:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

        await asyncio.get_running_loop().run_in_executor(self._executor, _close)
        self._closed = True
        self._executor.shutdown(wait=True)

    # -- EventStore -----------------------------------------------------------------------

    async def append(self, run_id: RunId, events: Sequence[ev.Event], *, expected_seq: int) -> int:
        check_batch(run_id, events, expected_seq)
        rows = [
            (
                run_id,
                e.seq,
                e.type,
                type(e).SCHEMA_VERSION,
                e.occurred_at.isoformat(),
                ev.encode(e),
            )
            for e in events
        ]
        delta = summarize(events)
        first, last = events[0], events[-1]

        def _append(conn: sqlite3.Connection) -> int:
            conn.execute("BEGIN IMMEDIATE")
            try:
                row = conn.execute(
                    "SELECT last_seq, status FROM runs WHERE run_id = ?", (run_id,)
                ).fetchone()
                if expected_seq == 0:
                    if row is not None:
                        raise ConcurrencyConflict(run_id, 0, row[0])
                    assert isinstance(first, ev.RunCreated)
                    conn.execute(
                        "INSERT INTO runs (run_id, agent_name, agent_version, status, last_seq,"
                        " created_at, updated_at) VALUES (?, ?, ?, ?, 0, ?, ?)",
                        (
                            run_id,
                            first.agent_name,
                            first.agent_version,
                            RunStatus.QUEUED.value,
                            first.occurred_at.isoformat(),
                            first.occurred_at.isoformat(),
                        ),
                    )
                elif row is None:
                    raise RunNotFound(run_id)
                else:
                    last_seq, status = row
                    if status in _TERMINAL_VALUES:
                        raise RunIsTerminal(run_id, status)
                    if last_seq != expected_seq:
                        raise ConcurrencyConflict(run_id, expected_seq, last_seq)
                conn.executemany(
                    "INSERT INTO events (run_id, seq, type, schema_version, occurred_at, payload)"
                    " VALUES (?, ?, ?, ?, ?, ?)",
                    rows,
                )
                conn.execute(
                    "UPDATE runs SET last_seq = ?, updated_at = ?, status = COALESCE(?, status),"
                    " turns = turns + ?, input_tokens = input_tokens + ?,"
                    " output_tokens = output_tokens + ?, cost_usd = cost_usd + ?"
                    " WHERE run_id = ?",
                    (
                        last.seq,
                        last.occurred_at.isoformat(),
                        delta.status.value if delta.status else None,
                        delta.turns,
                        delta.input_tokens,
                        delta.output_tokens,
                        delta.cost_usd,
                        run_id,
                    ),
                )
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            return last.seq

        try:
            return await self._run(_append)
        except sqlite3.IntegrityError as exc:
            # The database's own guards (terminal triggers, primary key) caught a writer that
            # raced past the checks above.
            if "terminal" in str(exc):
                summary = await self.get_run(run_id)
                raise RunIsTerminal(run_id, summary.status) from exc
            summary = await self.get_run(run_id)
            raise ConcurrencyConflict(run_id, expected_seq, summary.last_seq) from exc

    async def read(self, run_id: RunId, *, after_seq: int = 0) -> list[ev.Event]:
        def _read(conn: sqlite3.Connection) -> list[tuple[int, str, int, bytes]]:
            rows = conn.execute(
                "SELECT seq, type, schema_version, payload FROM events"
                " WHERE run_id = ? AND seq > ? ORDER BY seq",
                (run_id, after_seq),
            ).fetchall()
            if not rows and after_seq == 0:
                exists = conn.execute("SELECT 1 FROM runs WHERE run_id = ?", (run_id,)).fetchone()
                if exists is None:
                    raise RunNotFound(run_id)
            return rows

        rows = await self._run(_read)
        return [ev.decode(run_id, seq, t, v, payload) for seq, t, v, payload in rows]

    async def get_run(self, run_id: RunId) -> RunSummary:
        def _get(conn: sqlite3.Connection) -> tuple[object, ...] | None:
            row: tuple[object, ...] | None = conn.execute(
                f"SELECT {_SUMMARY_COLUMNS} FROM runs WHERE run_id = ?", (run_id,)
            ).fetchone()
            return row

        row = await self._run(_get)
        if row is None:
            raise RunNotFound(run_id)
        return _summary(row)

    async def list_runs(
        self, *, status: RunStatus | None = None, limit: int = 50
    ) -> list[RunSummary]:
        def _list(conn: sqlite3.Connection) -> list[tuple[object, ...]]:
            if status is None:
                return conn.execute(
                    f"SELECT {_SUMMARY_COLUMNS} FROM runs ORDER BY updated_at DESC LIMIT ?",
                    (limit,),
                ).fetchall()
            return conn.execute(
                f"SELECT {_SUMMARY_COLUMNS} FROM runs WHERE status = ?"
                " ORDER BY updated_at DESC LIMIT ?",
                (status.value, limit),
            ).fetchall()

        return [_summary(r) for r in await self._run(_list)]

    async def verify(self) -> int:
        """Check the schema is fully migrated without changing anything; return its version."""

        def _verify(_: sqlite3.Connection) -> int:
            conn = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True)
            try:
                return verify_schema(conn)
            finally:
                conn.close()

        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, lambda: _verify(None))  # type: ignore[arg-type]


_TERMINAL_VALUES = frozenset(s.value for s in TERMINAL)

_SUMMARY_COLUMNS = (
    "run_id, agent_name, agent_version, status, last_seq, created_at, updated_at,"
    " turns, input_tokens, output_tokens, cost_usd"
)


def _summary(row: tuple[object, ...]) -> RunSummary:
    (run_id, name, version, status, last_seq, created, updated, turns, tin, tout, cost) = row
    return RunSummary(
        run_id=RunId(str(run_id)),
        agent_name=str(name),
        agent_version=str(version),
        status=RunStatus(str(status)),
        last_seq=int(last_seq),  # type: ignore[call-overload]
        created_at=datetime.fromisoformat(str(created)),
        updated_at=datetime.fromisoformat(str(updated)),
        turns=int(turns),  # type: ignore[call-overload]
        input_tokens=int(tin),  # type: ignore[call-overload]
        output_tokens=int(tout),  # type: ignore[call-overload]
        cost_usd=float(cost),  # type: ignore[arg-type]
    )


def schema_version(conn: sqlite3.Connection) -> int:
    exists = conn.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'contextos_migrations'"
    ).fetchone()
    if exists is None:
        return 0
    row = conn.execute("SELECT MAX(version) FROM contextos_migrations").fetchone()
    return int(row[0] or 0)


def migrate(conn: sqlite3.Connection) -> int:
    """Apply the migrations this database lacks, each in its own IMMEDIATE transaction."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        conn.execute(
            "CREATE TABLE IF NOT EXISTS contextos_migrations ("
            " version INTEGER PRIMARY KEY, applied_at TEXT NOT NULL DEFAULT (datetime('now')))"
        )
        current = schema_version(conn)
        if current > len(SQLITE_MIGRATIONS):
            raise MigrationError(
                f"database schema is at version {current} but this ContextOS knows "
                f"{len(SQLITE_MIGRATIONS)}; upgrade ContextOS"
            )
        for version, script in enumerate(SQLITE_MIGRATIONS, start=1):
            if version <= current:
                continue
            for statement in _statements(script):
                conn.execute(statement)
            conn.execute("INSERT INTO contextos_migrations (version) VALUES (?)", (version,))
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    return len(SQLITE_MIGRATIONS)


def verify_schema(conn: sqlite3.Connection) -> int:
    """Raise MigrationError unless the schema is exactly at this code's version."""
    current = schema_version(conn)
    if current != len(SQLITE_MIGRATIONS):
        raise MigrationError(
            f"database schema is at version {current}, this ContextOS expects "
            f"{len(SQLITE_MIGRATIONS)}",
            current=current,
            expected=len(SQLITE_MIGRATIONS),
        )
    return current


def _statements(script: str) -> list[str]:
    """Split a migration script on `;` lines that end a statement, keeping trigger bodies."""
    out: list[str] = []
    buf: list[str] = []
    for line in script.strip().splitlines():
        buf.append(line)
        joined = "\n".join(buf).strip()
        if joined.endswith(";") and sqlite3.complete_statement(joined):
            out.append(joined)
            buf = []
    if "\n".join(buf).strip():
        out.append("\n".join(buf).strip())
    return out
