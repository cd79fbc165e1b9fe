"""The embedded SQLite event store: one file, WAL, IMMEDIATE transactions.

Statements run on the event loop's thread: a turn's commit costs one fsync and no thread hop.
Every write made in the same loop iteration (appends and queue operations of many runs at once)
shares one transaction and so one fsync (group commit); each caller hears back only after that
COMMIT. Several processes may share the file: when another one holds the write lock, the work
moves to the store's own thread, which waits out the busy timeout there without stalling the
loop, and the expected-seq check fences writers either way.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import sqlite3
import time
from collections.abc import Callable, Coroutine, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, NoReturn, TypeVar

from contextos import events as ev
from contextos.errors import (
    ConcurrencyConflict,
    MigrationError,
    RunIsTerminal,
    RunNotFound,
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
    SummaryDelta,
    check_batch,
    decode_rows,
    encode_batch,
    run_filter,
    summarize,
)
from contextos.store.migrations import SQLITE_MIGRATIONS, is_terminal
from contextos.store.sqlite_commits import Job, alone, deliver, is_busy, write_batch
from contextos.store.sqlite_queue import SqliteQueue
from contextos.store.tokens import SqlTokens

T = TypeVar("T")

log = logging.getLogger("contextos.store")

# Every append: the run's row moves from the seq its caller saw, if the run is still open.
_MOVE_SUMMARY = (
    "UPDATE runs SET last_seq = ?, updated_at = ?, status = COALESCE(?, status),"
    " turns = turns + ?, input_tokens = input_tokens + ?,"
    " output_tokens = output_tokens + ?, cost_usd = cost_usd + ?"
    f" WHERE run_id = ? AND last_seq = ? AND NOT {is_terminal('status')}"
)


@dataclass(slots=True)
class _Append:
    """One append's rows and checks."""

    run_id: RunId
    expected_seq: int
    rows: list[tuple[Any, ...]]
    delta: SummaryDelta
    first: ev.Event
    last: ev.Event

    def __call__(self, conn: sqlite3.Connection) -> int:
        return _write(conn, self)


class SqliteStore(SqliteQueue, SqlTokens, snapshots.Snapshotting, SqlArtifacts):
    """EventStore on a SQLite file."""

    def __init__(
        self, path: str | Path, *, busy_timeout_s: float = 30.0, create: bool = True
    ) -> None:
        self.path = Path(path)
        self.url = sqlite_url(self.path)
        self._create = create
        """Whether first use may create the file (False: StoreNotFound, for reading)."""
        self._busy_timeout_s = busy_timeout_s
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="contextos-sqlite")
        self._conn: sqlite3.Connection | None = None
        self._closed = False
        self._pending: list[Job] = []
        self._flush_scheduled = False
        self._lent: asyncio.Future[None] | None = None
        """Set while the connection is in use on the store's thread (another process held the
        lock); everything else waits for it, so the connection is never used by two threads."""
        self._tasks: set[asyncio.Task[None]] = set()
        self._folds = snapshots.Folds()

    # -- plumbing -------------------------------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        if self._conn is None:
            if not self._create and not self.path.exists():
                raise StoreNotFound(self.url)
            if self.path.is_dir():
                raise StoreUnavailable(
                    f"the store {self.url} is a directory: name a database file in it "
                    "(--store or CONTEXTOS_STORE)",
                    url=self.url,
                )
            if self._create:
                self.path.parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(
                self.path,
                timeout=self._busy_timeout_s,
                isolation_level=None,  # we issue BEGIN IMMEDIATE ourselves
                check_same_thread=False,
            )
            try:
                _enable_wal(conn, self._busy_timeout_s)
                conn.execute("PRAGMA synchronous=FULL")
                conn.execute(f"PRAGMA busy_timeout={int(self._busy_timeout_s * 1000)}")
                migrate(conn)
            except sqlite3.Error as exc:
                conn.close()
                fault = self._fault(exc)
                if fault is not exc:
                    raise fault from exc
                raise StoreUnavailable(
                    f"the store {self.url} cannot be used ({exc}); nothing in it was changed: "
                    "is it a ContextOS database? Name another with --store",
                    url=self.url,
                ) from exc
            except BaseException:
                conn.close()
                raise
            # On the loop's thread a locked database must fail at once, never block the loop;
            # `_patiently` restores the timeout on the store's thread.
            conn.execute("PRAGMA busy_timeout=0")
            self._conn = conn
        return self._conn

    async def _ready(self) -> sqlite3.Connection:
        """The connection, free for use on the loop's thread (connecting on first use)."""
        while True:
            if self._closed:
                raise RuntimeError("store is closed")
            if self._lent is not None:
                await asyncio.shield(self._lent)
            elif self._conn is None:
                await asyncio.get_running_loop().run_in_executor(self._executor, self._connect)
            else:
                return self._conn

    async def _run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run `fn` inside the next group commit and return its result once that is durable.

        `fn` may open and end its own transaction (`BEGIN IMMEDIATE` … `COMMIT`/`ROLLBACK`):
        those statements apply to its savepoint in the group's transaction, so its writes
        commit together with everyone else's, or roll back alone.
        """
        return await self._submit(fn, joined=True)  # type: ignore[no-any-return]

    async def _submit(
        self, work: Callable[[sqlite3.Connection], Any], *, joined: bool, synchronous: bool = True
    ) -> Any:
        if self._closed:
            raise RuntimeError("store is closed")
        loop = asyncio.get_running_loop()
        job = Job(work=work, joined=joined, future=loop.create_future(), synchronous=synchronous)
        self._pending.append(job)
        if alone(loop) and not self._flush_scheduled:
            self._flush()
        else:
            self._schedule_flush()
        try:
            return job.future.result() if job.future.done() else await job.future
        except sqlite3.OperationalError as exc:
            raise self._fault(exc) from exc

    async def _query(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run `fn` now on the loop's thread; if the file is locked, on the store's thread.

        `fn` must leave no trace when it fails (a transaction it opened is rolled back), since
        a `database is locked` failure runs it a second time.
        """
        conn = await self._ready()
        try:
            return fn(conn)
        except sqlite3.OperationalError as exc:
            if not is_busy(exc):
                raise self._fault(exc) from exc
        try:
            return await self._lend(fn)
        except sqlite3.OperationalError as exc:
            raise self._fault(exc) from exc

    def _fault(self, exc: sqlite3.Error) -> Exception:
        """A fault of the file as one line naming the store and what to do (StoreUnavailable),
        or `exc` itself for anything else. The failed transaction was rolled back: nothing
        recorded changed."""
        text = str(exc)
        unchanged = "nothing recorded was changed"
        if isinstance(exc, sqlite3.OperationalError) and is_busy(exc):
            why = (
                f"is locked by another process (waited {self._busy_timeout_s:g} s): let it "
                "finish and run the command again, or set CONTEXTOS_BUSY_TIMEOUT to wait longer"
            )
        elif "readonly" in text or "read-only" in text:
            why = (
                "is read-only: give this user write access to the file and its folder, or "
                "name another store with --store"
            )
        elif "full" in text or ("disk I/O error" in text and _no_space(self.path)):
            why = "is full (no space left for it): free some space and run the command again"
        else:
            return exc
        return StoreUnavailable(f"the store {self.url} {why}; {unchanged}", url=self.url)

    async def _lend(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        loop = asyncio.get_running_loop()
        conn = await self._ready()
        returned: asyncio.Future[None] = loop.create_future()
        self._lent = returned
        try:
            return await loop.run_in_executor(self._executor, self._patiently, conn, fn)
        finally:
            self._lent = None
            returned.set_result(None)

    def _patiently(self, conn: sqlite3.Connection, fn: Callable[[sqlite3.Connection], T]) -> T:
        conn.execute(f"PRAGMA busy_timeout={int(self._busy_timeout_s * 1000)}")
        try:
            return fn(conn)
        finally:
            conn.execute("PRAGMA busy_timeout=0")

    async def close(self) -> None:
        if self._closed:
            return
        self._unsaved()
        # In-flight appends commit first, and their callers hear so.
        while self._pending or self._tasks or self._lent is not None:
            if self._tasks:
                await asyncio.gather(*self._tasks, return_exceptions=True)
            elif self._lent is not None:
                await asyncio.shield(self._lent)
            else:
                self._flush()
        self._closed = True
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        self._executor.shutdown(wait=True)

    # -- group commit ---------------------------------------------------------------------

    def _schedule_flush(self) -> None:
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _take(self) -> list[Job]:
        self._flush_scheduled = False
        batch, self._pending = self._pending, []
        # A caller cancelled before its turn came never reaches the database.
        return [job for job in batch if not job.future.done()]

    def _flush(self) -> None:
        """Commit every append waiting, in one transaction (runs as a loop callback)."""
        if self._closed or self._conn is None or self._lent is not None:
            self._spawn(self._flush_later())
            return
        batch = self._take()
        if not batch:
            return
        try:
            results = write_batch(self._conn, batch)
        except sqlite3.OperationalError as exc:
            if not is_busy(exc):
                deliver(batch, exc)
                return
            self._pending[:0] = batch  # another process writes: wait for it off the loop
            self._flush_scheduled = True
            self._spawn(self._flush_later())
            return
        except Exception as exc:
            deliver(batch, exc)
            return
        deliver(batch, results)

    async def _flush_later(self) -> None:
        try:
            await self._ready()
        except BaseException as exc:
            deliver(self._take(), exc)
            if not isinstance(exc, Exception):
                raise
            return
        batch = self._take()
        if not batch:
            return
        try:
            results = await self._query(lambda conn: write_batch(conn, batch))
        except BaseException as exc:
            deliver(batch, exc)
            if not isinstance(exc, Exception):
                raise
            return
        deliver(batch, results)

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

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
        rows = [
            (run_id, e.seq, e.type, type(e).SCHEMA_VERSION, e.occurred_at.isoformat(), payload)
            for e, payload in zip(events, encode_batch(run_id, events), strict=True)
        ]
        work = _Append(
            run_id=run_id,
            expected_seq=expected_seq,
            rows=rows,
            delta=summarize(events),
            first=events[0],
            last=events[-1],
        )
        try:
            seq: int = await self._submit(work, joined=False, synchronous=synchronous)
            self._folded(run_id, expected_seq, events, folded)
            return seq
        except sqlite3.IntegrityError as exc:
            # The database's own guards (terminal triggers, primary key) caught a writer that
            # raced past the checks.
            if "terminal" in str(exc):
                summary = await self.get_run(run_id)
                raise RunIsTerminal(run_id, summary.status) from exc
            summary = await self.get_run(run_id)
            raise ConcurrencyConflict(run_id, expected_seq, summary.last_seq) from exc

    async def read(self, run_id: RunId, *, after_seq: int = 0) -> list[ev.Event]:
        rows = await self._read_rows(run_id, after_seq)
        return await decode_rows(run_id, rows)

    async def _read_snapshot(self, run_id: RunId) -> tuple[snapshots.Snapshot | None, list[Row]]:
        def _read(conn: sqlite3.Connection) -> tuple[Any, list[Row]]:
            snap = conn.execute(
                "SELECT seq, format, state FROM snapshots WHERE run_id = ? AND format = ?"
                " AND seq <= (SELECT last_seq FROM runs WHERE run_id = ?)",  # never ahead
                (run_id, snapshots.FORMAT, run_id),
            ).fetchone()
            return snap, _events(conn, run_id, snap[0] if snap is not None else 0)

        return await self._query(_read)

    async def _read_rows(self, run_id: RunId, after_seq: int) -> list[Row]:
        return await self._query(lambda conn: _events(conn, run_id, after_seq))

    async def _write_snapshot(self, run_id: RunId, seq: int, blob: bytes) -> None:
        # A cache, so its commit need not wait for the disk.
        await self._submit(
            lambda conn: _save_snapshot(conn, run_id, seq, blob), joined=False, synchronous=False
        )

    async def get_run(self, run_id: RunId) -> RunSummary:
        def _get(conn: sqlite3.Connection) -> tuple[object, ...] | None:
            row: tuple[object, ...] | None = conn.execute(
                f"SELECT {_SUMMARY_COLUMNS} FROM runs WHERE run_id = ?", (run_id,)
            ).fetchone()
            return row

        row = await self._query(_get)
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
        where, params = run_filter(status, tenant, "?", top_level=top_level, prefix=prefix)

        def _list(conn: sqlite3.Connection) -> list[tuple[object, ...]]:
            return conn.execute(
                f"SELECT {_SUMMARY_COLUMNS} FROM runs{where} ORDER BY updated_at DESC LIMIT ?",
                (*params, limit),
            ).fetchall()

        return [_summary(r) for r in await self._query(_list)]

    async def daily_usage(self, principal: str, day: str) -> tuple[int, int, float]:
        """A principal's model usage on a UTC day (`YYYY-MM-DD`): tokens, calls, money.

        Kept by a trigger on the event log (migration 3).
        """

        def _usage(conn: sqlite3.Connection) -> tuple[int, int, float]:
            row = conn.execute(
                "SELECT input_tokens + output_tokens, calls, cost_usd FROM principal_usage"
                " WHERE principal = ? AND day = ?",
                (principal, day),
            ).fetchone()
            return (0, 0, 0.0) if row is None else (int(row[0]), int(row[1]), float(row[2]))

        return await self._query(_usage)

    async def migrate(self) -> int:
        """Bring the schema to this code's version (first use does it too); return the version."""
        await self._ready()
        return len(SQLITE_MIGRATIONS)

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


def _events(conn: sqlite3.Connection, run_id: RunId, after_seq: int) -> list[Row]:
    rows: list[Row] = conn.execute(
        "SELECT seq, type, schema_version, payload, occurred_at FROM events"
        " WHERE run_id = ? AND seq > ? ORDER BY seq",
        (run_id, after_seq),
    ).fetchall()
    if not rows and after_seq == 0:
        exists = conn.execute("SELECT 1 FROM runs WHERE run_id = ?", (run_id,)).fetchone()
        if exists is None:
            raise RunNotFound(run_id)
    return rows


def _save_snapshot(conn: sqlite3.Connection, run_id: RunId, seq: int, blob: bytes) -> None:
    """Keep the newest snapshot of a run (or the first of this code's format)."""
    row = conn.execute("SELECT seq, format FROM snapshots WHERE run_id = ?", (run_id,)).fetchone()
    if row is not None:
        if row[0] >= seq and row[1] == snapshots.FORMAT:
            return
        # Delete, then insert: an UPDATE writes the new blob before it frees the old one's
        # pages, and the file would keep room for two.
        conn.execute("DELETE FROM snapshots WHERE run_id = ?", (run_id,))
    conn.execute(
        "INSERT INTO snapshots (run_id, seq, format, state) VALUES (?, ?, ?, ?)",
        (run_id, seq, snapshots.FORMAT, blob),
    )


def _no_space(path: Path) -> bool:
    """Whether the file system holding `path` is full (SQLite names some ENOSPC I/O errors)."""
    try:
        return shutil.disk_usage(path.parent).free < 64 * 1024
    except OSError:
        return False


def _write(conn: sqlite3.Connection, job: _Append) -> int:
    """One append inside an open transaction: the fence checks, the rows, the summary."""
    run_id, expected_seq, first, last, delta = (
        job.run_id,
        job.expected_seq,
        job.first,
        job.last,
        job.delta,
    )
    if expected_seq == 0:
        row = conn.execute("SELECT last_seq FROM runs WHERE run_id = ?", (run_id,)).fetchone()
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
    # The events go first (the database refuses them for an ended run or on a recorded seq);
    # then the summary moves only from the seq the caller saw, on a run still open: the fence
    # and the update in one statement. When it moves nothing, a read says which check failed
    # and the caller's transaction rolls the rows back.
    conn.executemany(
        "INSERT INTO events (run_id, seq, type, schema_version, occurred_at, payload)"
        " VALUES (?, ?, ?, ?, ?, ?)",
        job.rows,
    )
    moved = conn.execute(
        _MOVE_SUMMARY,
        (
            last.seq,
            last.occurred_at.isoformat(),
            delta.status.value if delta.status else None,
            delta.turns,
            delta.input_tokens,
            delta.output_tokens,
            delta.cost_usd,
            run_id,
            expected_seq,
        ),
    ).rowcount
    if not moved:
        _refuse(conn, run_id, expected_seq)
    return last.seq


def _refuse(conn: sqlite3.Connection, run_id: RunId, expected_seq: int) -> NoReturn:
    """Why an append's fence held: no such run, an ended run, or a log that moved on."""
    row = conn.execute("SELECT last_seq, status FROM runs WHERE run_id = ?", (run_id,)).fetchone()
    if row is None:
        raise RunNotFound(run_id)
    last_seq, status = row
    if status in _TERMINAL_VALUES:
        raise RunIsTerminal(run_id, status)
    raise ConcurrencyConflict(run_id, expected_seq, last_seq)


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


def sqlite_url(path: Path) -> str:
    """The URL naming a SQLite file: `sqlite:///abs/path.db`, or `sqlite:relative/path.db`."""
    return f"sqlite://{path}" if path.is_absolute() else f"sqlite:{path}"


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
    if schema_version(conn) == len(SQLITE_MIGRATIONS):
        # Up to date: no write lock taken, so reading works beside a writer, or read-only.
        return len(SQLITE_MIGRATIONS)
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


def _enable_wal(conn: sqlite3.Connection, timeout_s: float) -> None:
    """Switch to WAL, waiting out other processes that are creating the same new file.

    On a file still in rollback mode SQLite answers "locked" at once, without its busy handler,
    when another connection holds a lock it would otherwise deadlock with; so wait and retry.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() >= deadline:
                raise
            time.sleep(0.02)
