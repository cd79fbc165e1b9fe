"""The store conformance suite: every EventStore backend keeps the same promises.

Each test runs on a fresh SQLite file and on a fresh PostgreSQL schema (`backend_url`). Some
tests go around the store with plain SQL (`Raw`) to attack or corrupt the database the way a
bug, an operator or a half-finished write could.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from contextos import codec
from contextos import events as ev
from contextos.delegation import ChildStatus, DelegationContract
from contextos.errors import (
    ConcurrencyConflict,
    EventDecodeError,
    EventEncodeError,
    MigrationError,
    RunIsTerminal,
    RunNotFound,
    StoreError,
    StoreUnavailable,
)
from contextos.messages import FinishReason, Message, ToolCall, Usage
from contextos.runs import TERMINAL, FailureReason, RunId, RunStatus
from contextos.store import EventStore, SqliteStore, open_store, snapshots
from contextos.store.base import OFF_LOOP_ROWS
from contextos.store.migrations import POSTGRES_MIGRATIONS, SQLITE_MIGRATIONS
from contextos.store.queue import QueueEntry

T0 = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)
HOUR = timedelta(hours=1)


# -- events ---------------------------------------------------------------------------------


def created(run_id: str, *, at: datetime = T0, agent: str = "clerk") -> ev.RunCreated:
    return ev.RunCreated(
        run_id=RunId(run_id),
        seq=1,
        occurred_at=at,
        agent_name=agent,
        agent_version="3",
        agent_hash="h",
        input="file the report",
    )


def note(run_id: str, seq: int, text: str = "more", *, at: datetime = T0) -> ev.UserMessageAdded:
    return ev.UserMessageAdded(run_id=RunId(run_id), seq=seq, content=text, occurred_at=at)


def started(run_id: str, seq: int, *, worker: str = "w1", at: datetime = T0) -> ev.RunStarted:
    return ev.RunStarted(run_id=RunId(run_id), seq=seq, worker_id=worker, occurred_at=at)


def responded(run_id: str, seq: int, *, tokens: tuple[int, int] = (7, 3)) -> ev.ModelResponded:
    return ev.ModelResponded(
        run_id=RunId(run_id),
        seq=seq,
        occurred_at=T0,
        message=Message(role="assistant", content="done"),
        finish_reason=FinishReason.STOP,
        usage=Usage(input_tokens=tokens[0], output_tokens=tokens[1], cost_usd=0.25, requests=1),
        model="scripted",
    )


def completed(run_id: str, seq: int, *, at: datetime = T0) -> ev.RunCompleted:
    return ev.RunCompleted(run_id=RunId(run_id), seq=seq, output="done", occurred_at=at)


def ended(run_id: str, seq: int, status: RunStatus) -> ev.Event:
    """The event that ends a run with `status`."""
    rid = RunId(run_id)
    match status:
        case RunStatus.COMPLETED:
            return completed(run_id, seq)
        case RunStatus.FAILED:
            return ev.RunFailed(
                run_id=rid, seq=seq, occurred_at=T0, reason=FailureReason.TOOL_FAILED, message="x"
            )
        case RunStatus.CANCELLED:
            return ev.RunCancelled(run_id=rid, seq=seq, occurred_at=T0, reason="stop")
        case RunStatus.EXPIRED:
            return ev.RunExpired(run_id=rid, seq=seq, occurred_at=T0, reason="too late")
    raise AssertionError(f"{status} does not end a run")


# -- plain SQL around the store -------------------------------------------------------------


class Raw:
    """A connection of its own to the store's database; `?` placeholders on both backends."""

    def __init__(self, url: str) -> None:
        self.postgres = url.startswith("postgresql://")
        if self.postgres:
            import psycopg

            self.conn: Any = psycopg.connect(url, autocommit=True)
            self.errors: tuple[type[BaseException], ...] = (psycopg.Error,)
        else:
            self.conn = sqlite3.connect(url.removeprefix("sqlite:///"), isolation_level=None)
            self.errors = (sqlite3.DatabaseError,)

    def execute(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        if self.postgres:
            sql = sql.replace("?", "%s")
        cur = self.conn.execute(sql, params)
        return list(cur.fetchall()) if cur.description else []

    def ts(self, at: datetime) -> Any:
        return at if self.postgres else at.isoformat()

    def insert_event(
        self, run_id: str, seq: int, payload: bytes, *, type: str, version: int = 1
    ) -> None:
        self.execute(
            "INSERT INTO events (run_id, seq, type, schema_version, occurred_at, payload)"
            " VALUES (?, ?, ?, ?, ?, ?)",
            (run_id, seq, type, version, self.ts(T0), payload),
        )

    def seqs(self, run_id: str) -> list[int]:
        """The seqs of a run's stored event rows, whatever their number."""
        rows = self.execute("SELECT seq FROM events WHERE run_id = ? ORDER BY seq", (run_id,))
        return [int(r[0]) for r in rows]

    def let_through(self, attacks: list[tuple[str, tuple[Any, ...]]]) -> list[str]:
        """The statements among `attacks` the database did not refuse."""
        passed = []
        for sql, params in attacks:
            try:
                self.execute(sql, params)
            except self.errors:
                continue
            passed.append(sql)
        return passed

    def tables(self) -> list[str]:
        if self.postgres:
            rows = self.execute(
                "SELECT table_name FROM information_schema.tables"
                " WHERE table_schema = current_schema() ORDER BY table_name"
            )
        else:
            rows = self.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")
        return [str(r[0]) for r in rows]

    def snapshot(self) -> dict[str, Any]:
        """Schema objects and every row of every table, to compare before and after."""
        if self.postgres:
            schema: list[tuple[Any, ...]] = self.execute(
                "SELECT table_name, column_name, data_type FROM information_schema.columns"
                " WHERE table_schema = current_schema() ORDER BY 1, 2"
            )
            schema += self.execute(
                "SELECT tgname, tgenabled FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid"
                " JOIN pg_namespace n ON n.oid = c.relnamespace"
                " WHERE n.nspname = current_schema() ORDER BY 1"
            )
        else:
            schema = self.execute("SELECT type, name, sql FROM sqlite_master ORDER BY 1, 2")
        rows = {t: sorted(map(repr, self.execute(f"SELECT * FROM {t}"))) for t in self.tables()}
        return {"schema": schema, "rows": rows}

    def close(self) -> None:
        self.conn.close()


def migrations_for(url: str) -> list[str]:
    return POSTGRES_MIGRATIONS if url.startswith("postgresql://") else SQLITE_MIGRATIONS


@pytest.fixture
async def store(backend_url: str) -> AsyncIterator[EventStore]:
    s = open_store(backend_url)
    try:
        yield s
    finally:
        await s.close()


@pytest.fixture
def raw(backend_url: str) -> Iterator[Raw]:
    r = Raw(backend_url)
    try:
        yield r
    finally:
        r.close()


# -- create, append, read ---------------------------------------------------------------------


async def test_create_append_and_read_back(store: EventStore) -> None:
    first = [created("r1"), started("r1", 2)]
    assert await store.append(RunId("r1"), first, expected_seq=0) == 2
    more = [responded("r1", 3), note("r1", 4, "and again"), responded("r1", 5, tokens=(11, 2))]
    assert await store.append(RunId("r1"), more, expected_seq=2) == 5

    events = await store.read(RunId("r1"))
    assert events == [*first, *more]
    assert await store.read(RunId("r1"), after_seq=3) == more[1:]
    assert await store.read(RunId("r1"), after_seq=5) == []

    summary = await store.get_run(RunId("r1"))
    assert (summary.run_id, summary.agent_name, summary.agent_version) == ("r1", "clerk", "3")
    assert summary.status is RunStatus.QUEUED  # a person's message queues it for a driver
    assert summary.last_seq == 5
    assert (summary.turns, summary.input_tokens, summary.output_tokens) == (2, 18, 5)
    assert summary.cost_usd == pytest.approx(0.5)
    assert summary.created_at == T0


async def test_a_row_keeps_its_run_seq_and_time_in_its_columns_only(
    store: EventStore, raw: Raw
) -> None:
    """The payload leaves out what the row's columns hold; a read takes them from there, and a
    row written whole (by an earlier version) reads as ever."""
    later = T0 + timedelta(hours=3, microseconds=7)
    await store.append(RunId("r1"), [created("r1"), started("r1", 2, at=later)], expected_seq=0)
    payload = bytes(raw.execute("SELECT payload FROM events WHERE seq = 2")[0][0])
    assert json.loads(payload) == {"worker_id": "w1"}
    whole = note("r1", 3, "written whole", at=later)
    raw.insert_event("r1", 3, codec.encode(whole), type=whole.type)
    read = await store.read(RunId("r1"))
    assert read[1:] == [started("r1", 2, at=later), whole]
    assert read[1].occurred_at.utcoffset() == timedelta(0)


async def test_creating_a_run_that_exists_conflicts(store: EventStore) -> None:
    await store.append(RunId("r1"), [created("r1")], expected_seq=0)
    with pytest.raises(ConcurrencyConflict) as caught:
        await store.append(RunId("r1"), [created("r1")], expected_seq=0)
    assert (caught.value.run_id, caught.value.expected_seq, caught.value.actual_seq) == ("r1", 0, 1)
    # An ended run too: the fence answers first.
    await store.append(RunId("r1"), [completed("r1", 2)], expected_seq=1)
    with pytest.raises(ConcurrencyConflict) as caught:
        await store.append(RunId("r1"), [created("r1")], expected_seq=0)
    assert (caught.value.run_id, caught.value.expected_seq, caught.value.actual_seq) == ("r1", 0, 2)


BAD_BATCHES: dict[str, tuple[int, list[ev.Event], str]] = {
    "empty": (2, [], "append() needs at least one event"),
    "of-another-run": (2, [note("r2", 3)], "event for run r2 appended to run r1"),
    "with-a-gap": (
        2,
        [note("r1", 3), note("r1", 5)],
        "event seq 5 does not follow expected seq 2 (should be 4)",
    ),
    "not-created-first": (0, [note("r1", 1)], "a run's first event must be RunCreated"),
}


@pytest.mark.parametrize("bad", sorted(BAD_BATCHES))
async def test_a_batch_that_breaks_the_numbering_is_refused_before_any_write(
    store: EventStore, raw: Raw, bad: str
) -> None:
    await store.append(RunId("r1"), [created("r1"), started("r1", 2)], expected_seq=0)
    expected_seq, batch, why = BAD_BATCHES[bad]
    with pytest.raises(ValueError) as caught:
        await store.append(RunId("r1"), batch, expected_seq=expected_seq)
    assert str(caught.value) == why
    assert raw.seqs("r1") == [1, 2]


async def test_a_stale_expected_seq_conflicts_and_changes_nothing(store: EventStore) -> None:
    await store.append(RunId("r1"), [created("r1"), started("r1", 2)], expected_seq=0)
    await store.append(RunId("r1"), [note("r1", 3, "first")], expected_seq=2)
    with pytest.raises(ConcurrencyConflict) as caught:
        await store.append(RunId("r1"), [note("r1", 3, "stale")], expected_seq=2)
    assert caught.value.run_id == "r1"
    assert (caught.value.expected_seq, caught.value.actual_seq) == (2, 3)
    events = await store.read(RunId("r1"))
    assert [e.seq for e in events] == [1, 2, 3]
    assert isinstance(events[-1], ev.UserMessageAdded) and events[-1].content == "first"


async def test_an_expected_seq_ahead_of_the_log_conflicts_and_writes_nothing(
    store: EventStore, raw: Raw
) -> None:
    await store.append(RunId("r1"), [created("r1"), started("r1", 2)], expected_seq=0)
    with pytest.raises(ConcurrencyConflict) as caught:
        await store.append(RunId("r1"), [note("r1", 5), note("r1", 6)], expected_seq=4)
    assert (caught.value.run_id, caught.value.expected_seq, caught.value.actual_seq) == ("r1", 4, 2)
    assert raw.seqs("r1") == [1, 2]
    assert (await store.get_run(RunId("r1"))).last_seq == 2
    # No gap was left: the writer in step appends right after the log's end.
    assert await store.append(RunId("r1"), [note("r1", 3)], expected_seq=2) == 3
    assert [e.seq for e in await store.read(RunId("r1"))] == [1, 2, 3]


async def test_of_concurrent_writers_at_one_seq_exactly_one_wins(backend_url: str) -> None:
    writers = [open_store(backend_url) for _ in range(4)]
    try:
        await writers[0].append(RunId("r1"), [created("r1")], expected_seq=0)
        for seq in range(2, 12):

            async def write(i: int, seq: int = seq) -> str:
                store = writers[i]
                try:
                    await store.append(
                        RunId("r1"), [note("r1", seq, f"w{i}")], expected_seq=seq - 1
                    )
                except ConcurrencyConflict:
                    return "lost"
                return f"w{i}"

            outcomes = await asyncio.gather(*(write(i) for i in range(len(writers))))
            winners = [o for o in outcomes if o != "lost"]
            assert len(winners) == 1, outcomes
            last = (await writers[1].read(RunId("r1"), after_seq=seq - 1))[0]
            assert isinstance(last, ev.UserMessageAdded) and last.content == winners[0]
        assert [e.seq for e in await writers[2].read(RunId("r1"))] == list(range(1, 12))
    finally:
        for w in writers:
            await w.close()


async def test_a_closed_store_takes_no_more_events(backend_url: str) -> None:
    s = open_store(backend_url)
    await s.append(RunId("r1"), [created("r1")], expected_seq=0)
    await s.close()
    with pytest.raises(RuntimeError, match=r"^store is closed$"):
        await s.append(RunId("r1"), [note("r1", 2)], expected_seq=1)
    reopened = open_store(backend_url)
    try:
        assert [e.seq for e in await reopened.read(RunId("r1"))] == [1]
    finally:
        await reopened.close()


async def test_a_run_summary_tells_its_times_in_utc_whatever_the_local_zone(
    store: EventStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    try:
        await store.append(
            RunId("r1"), [created("r1"), started("r1", 2, at=T0 + HOUR)], expected_seq=0
        )
        summary = await store.get_run(RunId("r1"))
    finally:
        monkeypatch.undo()
        time.tzset()
    assert (summary.created_at, summary.updated_at) == (T0, T0 + HOUR)
    assert summary.created_at.utcoffset() == summary.updated_at.utcoffset() == timedelta(0)


async def test_a_run_that_grows_long_gets_a_snapshot_of_its_own(backend_url: str, raw: Raw) -> None:
    s = open_store(backend_url)
    await s.append(RunId("r1"), [created("r1"), started("r1", 2)], expected_seq=0)
    more = [note("r1", seq) for seq in range(3, 3 + snapshots.EVERY)]
    await s.append(RunId("r1"), more, expected_seq=2)
    await s.close()
    rows = raw.execute("SELECT run_id, seq FROM snapshots")
    assert [(r[0], int(r[1])) for r in rows] == [("r1", 2 + snapshots.EVERY)]


async def test_a_sqlite_append_skips_the_wait_for_the_disk_only_when_told(tmp_path: Path) -> None:
    """`synchronous=False` commits without the fsync (NORMAL); every other commit has it."""
    store = SqliteStore(tmp_path / "s.db")
    await store.list_runs()
    assert store._conn is not None
    seen: list[str] = []
    store._conn.set_trace_callback(seen.append)
    await store.append(RunId("r1"), [created("r1")], expected_seq=0)
    await store.enqueue(QueueEntry(run_id=RunId("r2")))  # the queue's writes too
    assert [s for s in seen if "synchronous" in s] == []
    assert seen.count("COMMIT") == 2
    await store.append(RunId("r1"), [note("r1", 2)], expected_seq=1, synchronous=False)
    assert [s for s in seen if "synchronous" in s] == [
        "PRAGMA synchronous=NORMAL",
        "PRAGMA synchronous=FULL",
    ]
    store._conn.set_trace_callback(None)
    await store.close()


async def test_a_postgres_append_skips_the_wait_for_the_wal_only_when_told(
    postgres_url: str,
) -> None:
    """`synchronous=False` commits with `synchronous_commit` off for that one transaction (the
    next synchronous commit flushes the WAL up to its own record, so this one's too); every
    other append waits for the flush, and the setting does not outlive the append."""
    import psycopg

    from contextos.store.postgres import PostgresStore

    # The test server does not wait for the disk by default; the store's sessions here do.
    assert "options=" in postgres_url
    url = postgres_url + quote(" -csynchronous_commit=on")
    store = PostgresStore(url, min_size=1, max_size=1)
    await store.list_runs()
    async with store._conn() as conn:
        pid = conn.info.backend_pid

    def last_statement() -> str:
        with psycopg.connect(postgres_url) as watcher:
            row = watcher.execute(
                "SELECT query FROM pg_stat_activity WHERE pid = %s", (pid,)
            ).fetchone()
        assert row is not None
        return str(row[0])

    await store.append(RunId("r1"), [created("r1")], expected_seq=0)
    assert "FROM inserted" in last_statement() and "synchronous_commit" not in last_statement()
    await store.append(RunId("r1"), [note("r1", 2)], expected_seq=1, synchronous=False)
    assert "set_config('synchronous_commit', 'off', true)" in last_statement()
    async with store._conn() as conn:
        setting = await (await conn.execute("SHOW synchronous_commit")).fetchone()
        assert setting is not None and setting[0] == "on"
    await store.append(RunId("r1"), [note("r1", 3), note("r1", 4)], expected_seq=2)
    assert "synchronous_commit" not in last_statement()
    assert [e.seq for e in await store.read(RunId("r1"))] == [1, 2, 3, 4]
    await store.close()


async def test_a_sqlite_store_that_may_not_write_says_so(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "s.db")
    await store.append(RunId("r1"), [created("r1")], expected_seq=0)
    assert store._conn is not None
    store._conn.execute("PRAGMA query_only=1")  # as a file this user may only read
    with pytest.raises(StoreUnavailable, match=r"is read-only: .*; nothing recorded was changed"):
        await store.append(RunId("r1"), [note("r1", 2)], expected_seq=1)
    store._conn.execute("PRAGMA query_only=0")
    assert [e.seq for e in await store.read(RunId("r1"))] == [1]
    await store.close()


async def test_a_sqlite_store_named_by_a_folder_says_so_to_its_first_append(
    tmp_path: Path,
) -> None:
    store = SqliteStore(tmp_path)
    with pytest.raises(StoreUnavailable, match="is a directory: name a database file in it"):
        await store.append(RunId("r1"), [created("r1")], expected_seq=0)
    await store.close()


async def test_a_sqlite_file_locked_past_the_busy_timeout_fails_the_append(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    store = SqliteStore(db, busy_timeout_s=0.1)
    await store.append(RunId("r1"), [created("r1")], expected_seq=0)
    other = sqlite3.connect(db, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # another process's writer holds the lock, and keeps it
    try:
        with pytest.raises(StoreUnavailable, match="is locked by another process"):
            await store.append(RunId("r1"), [note("r1", 2)], expected_seq=1)
    finally:
        other.execute("ROLLBACK")
        other.close()
    assert await store.append(RunId("r1"), [note("r1", 2)], expected_seq=1) == 2
    await store.close()


async def test_a_postgres_refusal_other_than_the_stores_own_is_a_store_error(
    postgres_url: str,
) -> None:
    """A trigger the store does not know (an operator's audit, say) refuses an append: the
    caller gets its words as a StoreError naming the run, not a conflict, and nothing is
    written."""
    s = open_store(postgres_url)
    raw = Raw(postgres_url)
    try:
        await s.append(RunId("r1"), [created("r1")], expected_seq=0)
        raw.execute(
            "CREATE FUNCTION audit() RETURNS trigger LANGUAGE plpgsql AS"
            " $$ BEGIN RAISE EXCEPTION 'audit: no writes today'; END $$"
        )
        raw.execute(
            "CREATE TRIGGER audit BEFORE INSERT ON events FOR EACH ROW EXECUTE FUNCTION audit()"
        )
        with pytest.raises(StoreError) as refused:
            await s.append(RunId("r1"), [note("r1", 2)], expected_seq=1)
        error = refused.value.to_dict()
        assert (type(refused.value), error["code"], error["run_id"]) == (
            StoreError,
            "store_error",
            "r1",
        )
        assert error["message"].splitlines()[0] == "audit: no writes today"  # then where it rose
        assert raw.seqs("r1") == [1]
    finally:
        raw.close()
        await s.close()


async def test_a_finished_child_run_adds_its_spend_to_its_parents_summary(
    store: EventStore,
) -> None:
    await store.append(RunId("r1"), [created("r1"), started("r1", 2)], expected_seq=0)
    finished = ev.ChildRunFinished(
        run_id=RunId("r1"),
        seq=4,
        occurred_at=T0,
        delegation_id="d1",
        child_run_id=RunId("r1.d1"),
        status=ChildStatus.COMPLETED,
        usage=Usage(input_tokens=100, output_tokens=40, cost_usd=2.0, requests=3),
        turns=3,
    )
    await store.append(RunId("r1"), [responded("r1", 3), finished], expected_seq=2)
    summary = await store.get_run(RunId("r1"))
    assert (summary.turns, summary.input_tokens, summary.output_tokens) == (4, 107, 43)
    assert summary.cost_usd == pytest.approx(2.25)


# -- terminal runs ----------------------------------------------------------------------------


async def test_a_terminal_run_takes_no_more_events(store: EventStore) -> None:
    await store.append(RunId("r1"), [created("r1"), started("r1", 2)], expected_seq=0)
    await store.append(RunId("r1"), [responded("r1", 3), completed("r1", 4)], expected_seq=2)
    with pytest.raises(RunIsTerminal) as caught:
        await store.append(RunId("r1"), [note("r1", 5)], expected_seq=4)
    assert (caught.value.run_id, caught.value.status) == ("r1", "completed")
    assert (await store.get_run(RunId("r1"))).status is RunStatus.COMPLETED


RUN_ROW = (
    "INSERT INTO runs (run_id, agent_name, agent_version, status, last_seq, created_at,"
    " updated_at) VALUES (?, 'clerk', '3', 'running', ?, ?, ?)"
)
EVENT_ROW = (
    "INSERT INTO events (run_id, seq, type, schema_version, occurred_at, payload)"
    " VALUES (?, ?, 'user_message_added', 1, ?, ?)"
)
Attack = tuple[str, tuple[Any, ...]]


def rewrites(raw: Raw, run_id: str, seq: int) -> list[Attack]:
    """Plain SQL that would rewrite or remove what is recorded of a run whose last event is
    `seq`, or create the run again; refused for every run. A run named `live` must exist."""
    at, forged = raw.ts(T0), codec.encode(note(run_id, seq, "forged"))
    attacks: list[Attack] = [
        ("UPDATE runs SET run_id = 'elsewhere' WHERE run_id = ?", (run_id,)),
        ("DELETE FROM runs WHERE run_id = ?", (run_id,)),
        (RUN_ROW, (run_id, 0, at, at)),
        ("UPDATE events SET payload = ? WHERE run_id = ? AND seq = ?", (forged, run_id, seq)),
        ("DELETE FROM events WHERE run_id = ? AND seq = ?", (run_id, seq)),
        ("DELETE FROM events WHERE run_id = ?", (run_id,)),
        (
            EVENT_ROW + " ON CONFLICT (run_id, seq) DO UPDATE SET payload = excluded.payload",
            (run_id, seq, at, forged),
        ),
    ]
    if raw.postgres:
        return [*attacks, ("TRUNCATE runs", ()), ("TRUNCATE events", ())]
    # SQLite's REPLACE deletes the row it collides with, and fires no DELETE trigger doing so.
    return [
        *attacks,
        ("INSERT OR REPLACE" + RUN_ROW.removeprefix("INSERT"), (run_id, seq, at, at)),
        ("REPLACE" + RUN_ROW.removeprefix("INSERT"), (run_id, 0, at, at)),
        ("UPDATE OR REPLACE runs SET run_id = ? WHERE run_id = 'live'", (run_id,)),
        ("INSERT OR REPLACE" + EVENT_ROW.removeprefix("INSERT"), (run_id, seq, at, forged)),
    ]


def reopenings(raw: Raw, run_id: str, seq: int) -> list[Attack]:
    """Plain SQL that would move a run whose last event is `seq` on: refused once it ended."""
    at, more = raw.ts(T0), codec.encode(note(run_id, seq + 1, "more"))
    return [
        ("UPDATE runs SET status = 'running' WHERE run_id = ?", (run_id,)),
        ("UPDATE runs SET last_seq = 99 WHERE run_id = ?", (run_id,)),
        (RUN_ROW + " ON CONFLICT (run_id) DO UPDATE SET status = 'running'", (run_id, 0, at, at)),
        (EVENT_ROW, (run_id, seq + 1, at, more)),
        (EVENT_ROW, (run_id, 0, at, more)),
    ]


@pytest.mark.parametrize("status", sorted(TERMINAL), ids=str)
async def test_every_terminal_run_is_frozen_by_the_database_against_any_sql(
    store: EventStore, raw: Raw, status: RunStatus
) -> None:
    await store.append(RunId("r1"), [created("r1"), started("r1", 2)], expected_seq=0)
    await store.append(RunId("r1"), [note("r1", 3), ended("r1", 4, status)], expected_seq=2)
    await store.append(RunId("live"), [created("live")], expected_seq=0)
    before = await store.read(RunId("r1"))
    row = raw.execute("SELECT * FROM runs WHERE run_id = ?", ("r1",))

    assert raw.let_through(rewrites(raw, "r1", 4) + reopenings(raw, "r1", 4)) == []

    assert raw.execute("SELECT * FROM runs WHERE run_id = ?", ("r1",)) == row
    assert raw.seqs("r1") == [1, 2, 3, 4]
    assert await store.read(RunId("r1")) == before
    assert (await store.get_run(RunId("r1"))).status is status
    with pytest.raises(RunIsTerminal):
        await store.append(RunId("r1"), [note("r1", 5)], expected_seq=4)


async def test_a_live_run_can_be_neither_rewritten_nor_recreated(
    store: EventStore, raw: Raw
) -> None:
    await store.append(RunId("r1"), [created("r1"), note("r1", 2, "as said")], expected_seq=0)
    await store.append(RunId("live"), [created("live")], expected_seq=0)
    before = await store.read(RunId("r1"))
    row = raw.execute("SELECT * FROM runs WHERE run_id = ?", ("r1",))

    assert raw.let_through(rewrites(raw, "r1", 2)) == []

    assert raw.execute("SELECT * FROM runs WHERE run_id = ?", ("r1",)) == row
    assert await store.read(RunId("r1")) == before
    assert await store.append(RunId("r1"), [note("r1", 3)], expected_seq=2) == 3


async def test_events_of_a_live_run_are_append_only_too(store: EventStore, raw: Raw) -> None:
    await store.append(RunId("r1"), [created("r1"), note("r1", 2)], expected_seq=0)
    with pytest.raises(raw.errors, match="append-only"):
        raw.execute("UPDATE events SET type = 'x' WHERE run_id = ?", ("r1",))
    with pytest.raises(raw.errors, match="append-only"):
        raw.execute("DELETE FROM events WHERE run_id = ?", ("r1",))
    assert len(await store.read(RunId("r1"))) == 2


# -- atomic batches ---------------------------------------------------------------------------


@pytest.mark.parametrize("ends", [True, False], ids=["ending-the-run", "leaving-it-open"])
async def test_a_batch_that_fails_half_way_leaves_nothing_behind(
    store: EventStore, raw: Raw, ends: bool
) -> None:
    await store.append(RunId("r1"), [created("r1"), started("r1", 2)], expected_seq=0)
    # A row appears at seq 4 behind the store's back; the batch 3, 4(, 5) hits it on its second
    # insert, after its first one went in.
    raw.insert_event("r1", 4, codec.encode(note("r1", 4, "intruder")), type="user_message_added")
    batch = [responded("r1", 3), note("r1", 4, "mine"), *([completed("r1", 5)] if ends else [])]
    with pytest.raises(ConcurrencyConflict) as caught:
        await store.append(RunId("r1"), batch, expected_seq=2)
    assert (caught.value.run_id, caught.value.expected_seq, caught.value.actual_seq) == ("r1", 2, 2)

    assert [
        r[0] for r in raw.execute("SELECT seq FROM events WHERE run_id = ? ORDER BY seq", ("r1",))
    ] == [1, 2, 4]
    summary = await store.get_run(RunId("r1"))
    assert (summary.status, summary.last_seq, summary.turns) == (RunStatus.RUNNING, 2, 0)


async def test_a_batch_commits_whole(store: EventStore) -> None:
    await store.append(RunId("r1"), [created("r1"), started("r1", 2)], expected_seq=0)
    await store.append(
        RunId("r1"), [responded("r1", 3), note("r1", 4), completed("r1", 5)], expected_seq=2
    )
    assert [e.seq for e in await store.read(RunId("r1"))] == [1, 2, 3, 4, 5]
    summary = await store.get_run(RunId("r1"))
    assert (summary.status, summary.last_seq, summary.turns) == (RunStatus.COMPLETED, 5, 1)


def answer(run_id: str, seq: int, **fields: Any) -> ev.ModelResponded:
    """A model answer with `fields` replacing its message or usage."""
    return ev.ModelResponded(
        run_id=RunId(run_id),
        seq=seq,
        occurred_at=T0,
        message=fields.get("message", Message(role="assistant", content="ok")),
        finish_reason=FinishReason.TOOL_CALLS,
        usage=fields.get("usage", Usage(input_tokens=1, output_tokens=1, requests=1)),
        model="scripted",
    )


UNREADABLE = {
    # Arguments sent as a JSON object where the field holds text: it serialises, with no more
    # than a Pydantic warning, but would never decode.
    "arguments-as-object": lambda seq: answer(
        "r1",
        seq,
        message=Message(
            role="assistant",
            tool_calls=(ToolCall(id="c1", name="refund", arguments={"amount": 5}),),  # type: ignore[arg-type]
        ),
    ),
    "cost-not-a-number": lambda seq: answer(
        "r1", seq, usage=Usage(input_tokens=1, output_tokens=1, cost_usd=float("nan"))
    ),
    # A Literal field holding a value it does not list serialises without even a warning.
    "role-not-a-role": lambda seq: answer(
        "r1",
        seq,
        message=Message(role="developer", content="ok"),  # type: ignore[arg-type]
    ),
    "output-not-json": lambda seq: ev.RunCompleted(
        run_id=RunId("r1"), seq=seq, output="done", structured_output=object(), occurred_at=T0
    ),
    "two-arguments-as-objects": lambda seq: answer(
        "r1",
        seq,
        message=Message(
            role="assistant",
            tool_calls=tuple(
                ToolCall(id=f"c{i}", name="refund", arguments={"amount": i})  # type: ignore[arg-type]
                for i in range(2)
            ),
        ),
    ),
}
WHY = {
    "arguments-as-object": "message.tool_calls.0.arguments: Input should be a valid string",
    "cost-not-a-number": "usage.cost_usd: Input should be a valid number",
    "output-not-json": "Unable to serialize unknown type: <class 'object'>",
    "role-not-a-role": "message.role: Input should be 'system', 'user', 'assistant' or 'tool'",
    "two-arguments-as-objects": (
        "message.tool_calls.0.arguments: Input should be a valid string;"
        " message.tool_calls.1.arguments: Input should be a valid string"
    ),
}
"""What the error says of each: each field that would not read back, by path, and why."""


@pytest.mark.filterwarnings("ignore:Pydantic serializer warnings")
@pytest.mark.parametrize("unreadable", sorted(UNREADABLE))
async def test_an_event_that_would_not_read_back_is_refused_and_nothing_is_written(
    store: EventStore, raw: Raw, unreadable: str
) -> None:
    await store.append(RunId("r1"), [created("r1"), started("r1", 2)], expected_seq=0)
    batch = [note("r1", 3), UNREADABLE[unreadable](4), completed("r1", 5)]
    with pytest.raises(EventEncodeError) as caught:
        await store.append(RunId("r1"), batch, expected_seq=2)
    assert (caught.value.run_id, caught.value.seq) == ("r1", 4)
    assert str(caught.value) == (
        f"run r1 event #4 cannot be stored: {WHY[unreadable]}; nothing was appended"
    )

    assert raw.seqs("r1") == [1, 2]
    summary = await store.get_run(RunId("r1"))
    assert (summary.status, summary.last_seq, summary.turns) == (RunStatus.RUNNING, 2, 0)
    assert await store.append(RunId("r1"), [note("r1", 3)], expected_seq=2) == 3
    assert [e.seq for e in await store.read(RunId("r1"))] == [1, 2, 3]


# -- unknown runs, bad rows -------------------------------------------------------------------


async def test_an_unknown_run_is_reported_as_such(store: EventStore) -> None:
    await store.append(RunId("r1"), [created("r1")], expected_seq=0)
    with pytest.raises(RunNotFound) as caught:
        await store.read(RunId("nope"))
    assert caught.value.run_id == "nope"
    with pytest.raises(RunNotFound) as caught:
        await store.get_run(RunId("nope"))
    assert caught.value.run_id == "nope"
    with pytest.raises(RunNotFound) as caught:
        await store.append(RunId("nope"), [note("nope", 2)], expected_seq=1)
    assert caught.value.run_id == "nope"


async def test_a_corrupt_payload_fails_loudly_with_run_and_seq(store: EventStore, raw: Raw) -> None:
    await store.append(RunId("r1"), [created("r1"), note("r1", 2)], expected_seq=0)
    raw.insert_event(
        "r1", 3, b'{"type": "user_message_added", "run_id": ', type="user_message_added"
    )
    with pytest.raises(EventDecodeError, match=r"run r1 event #3: corrupt") as caught:
        await store.read(RunId("r1"))
    assert (caught.value.run_id, caught.value.seq) == ("r1", 3)


async def test_a_long_log_reads_back_whole_and_a_corrupt_row_in_it_fails_loudly(
    store: EventStore, raw: Raw
) -> None:
    """A read of OFF_LOOP_ROWS events or more decodes them in a thread: the same events, in
    order, and the same loud failure with its run and seq."""
    n = OFF_LOOP_ROWS + 8
    written = [created("r1"), *(note("r1", seq, f"note {seq}") for seq in range(2, n + 1))]
    await store.append(RunId("r1"), written, expected_seq=0)
    assert await store.read(RunId("r1")) == written
    assert await store.read(RunId("r1"), after_seq=n - 2) == written[-2:]
    raw.insert_event("r1", n + 1, b'{"content": ', type="user_message_added")
    with pytest.raises(EventDecodeError, match=rf"run r1 event #{n + 1}: corrupt") as caught:
        await store.read(RunId("r1"))
    assert (caught.value.run_id, caught.value.seq) == ("r1", n + 1)


async def test_a_payload_of_another_shape_fails_loudly(store: EventStore, raw: Raw) -> None:
    await store.append(RunId("r1"), [created("r1")], expected_seq=0)
    raw.insert_event("r1", 2, codec.encode(note("other", 2)), type="user_message_added")
    with pytest.raises(EventDecodeError, match=r"run r1 event #2") as caught:
        await store.read(RunId("r1"))
    assert caught.value.seq == 2


async def test_an_unknown_schema_version_fails_loudly(store: EventStore, raw: Raw) -> None:
    await store.append(RunId("r1"), [created("r1")], expected_seq=0)
    raw.insert_event("r1", 2, codec.encode(note("r1", 2)), type="user_message_added", version=99)
    with pytest.raises(EventDecodeError, match=r"run r1 event #2: .*schema version 99") as caught:
        await store.read(RunId("r1"))
    assert (caught.value.run_id, caught.value.seq) == ("r1", 2)


async def test_an_unknown_event_type_fails_loudly(store: EventStore, raw: Raw) -> None:
    await store.append(RunId("r1"), [created("r1")], expected_seq=0)
    raw.insert_event("r1", 2, b"{}", type="meteor_strike")
    with pytest.raises(EventDecodeError, match=r"event #2: unknown event type 'meteor_strike'"):
        await store.read(RunId("r1"))


# -- migrations -------------------------------------------------------------------------------


async def test_verify_checks_the_schema_and_changes_nothing(
    backend_url: str, store: EventStore, raw: Raw
) -> None:
    await store.append(RunId("r1"), [created("r1"), started("r1", 2)], expected_seq=0)
    await store.append(RunId("r2"), [created("r2"), completed("r2", 2)], expected_seq=0)
    before = raw.snapshot()
    assert await store.verify() == len(migrations_for(backend_url))  # type: ignore[attr-defined]
    assert raw.snapshot() == before


async def test_verify_on_an_empty_database_fails_and_creates_nothing(
    backend_url: str, raw: Raw
) -> None:
    assert raw.tables() == []
    fresh = open_store(backend_url)
    try:
        with pytest.raises(MigrationError, match="version 0"):
            await fresh.verify()  # type: ignore[attr-defined]
    finally:
        await fresh.close()
    assert raw.tables() == []


async def test_migrations_apply_once_in_order(backend_url: str, raw: Raw) -> None:
    for _ in range(2):
        s = open_store(backend_url)
        await s.list_runs()
        await s.close()
    versions = [r[0] for r in raw.execute("SELECT version FROM contextos_migrations ORDER BY 1")]
    assert versions == list(range(1, len(migrations_for(backend_url)) + 1))


async def test_a_schema_newer_than_the_code_is_refused(backend_url: str, raw: Raw) -> None:
    s = open_store(backend_url)
    await s.append(RunId("r1"), [created("r1")], expected_seq=0)
    await s.close()
    ahead = len(migrations_for(backend_url)) + 1
    raw.execute("INSERT INTO contextos_migrations (version) VALUES (?)", (ahead,))
    s = open_store(backend_url)
    try:
        with pytest.raises(MigrationError, match="upgrade ContextOS"):
            await s.read(RunId("r1"))
    finally:
        await s.close()
    s = open_store(backend_url)
    try:
        with pytest.raises(MigrationError, match=f"version {ahead}"):
            await s.verify()  # type: ignore[attr-defined]
    finally:
        await s.close()


# -- listing ----------------------------------------------------------------------------------


async def test_list_runs_filters_by_status_and_orders_by_last_update(store: EventStore) -> None:
    at = [T0 + timedelta(seconds=i) for i in range(6)]
    await store.append(RunId("r1"), [created("r1", at=at[0])], expected_seq=0)
    await store.append(RunId("r2"), [created("r2", at=at[1], agent="other")], expected_seq=0)
    await store.append(RunId("r3"), [created("r3", at=at[2])], expected_seq=0)
    await store.append(RunId("r1"), [started("r1", 2, at=at[3])], expected_seq=1)
    await store.append(RunId("r2"), [started("r2", 2, at=at[4])], expected_seq=1)
    await store.append(RunId("r2"), [completed("r2", 3, at=at[5])], expected_seq=2)

    everything = await store.list_runs()
    assert [r.run_id for r in everything] == ["r2", "r1", "r3"]
    assert [r.updated_at for r in everything] == [at[5], at[3], at[2]]
    assert [r.run_id for r in await store.list_runs(status=RunStatus.QUEUED)] == ["r3"]
    assert [r.run_id for r in await store.list_runs(status=RunStatus.RUNNING)] == ["r1"]
    done = await store.list_runs(status=RunStatus.COMPLETED)
    assert [(r.run_id, r.agent_name, r.status) for r in done] == [
        ("r2", "other", RunStatus.COMPLETED)
    ]
    assert await store.list_runs(status=RunStatus.FAILED) == []
    assert [r.run_id for r in await store.list_runs(limit=2)] == ["r2", "r1"]


async def test_list_runs_by_prefix_matches_ids_exactly(store: EventStore) -> None:
    """Byte by byte, whatever the database's collation: `_` and `%` are no patterns, case
    counts, and ids that sort next to the prefix's range (punctuation, accents) stay out."""
    ids = [
        "run_a_1", "run_a_2", "run_A_3", "run_ab", "run_a", "run%a_1", "runxa_1", "run_b_1",
        "run_a`", "run_á_1", "run_a_é", "run\U0010ffff",
    ]  # fmt: skip
    for i, rid in enumerate(ids):
        await store.append(RunId(rid), [created(rid, at=T0 + timedelta(seconds=i))], expected_seq=0)

    async def found(prefix: str, **kw: object) -> set[str]:
        return {r.run_id for r in await store.list_runs(prefix=prefix, limit=100, **kw)}  # type: ignore[arg-type]

    assert await found("run_a_") == {"run_a_1", "run_a_2", "run_a_é"}
    assert await found("run_a") == {"run_a_1", "run_a_2", "run_ab", "run_a", "run_a`", "run_a_é"}
    assert await found("run_á") == {"run_á_1"}
    assert await found("run%") == {"run%a_1"}
    assert await found("r") == set(ids)  # one character
    assert await found("run\U0010ffff") == {"run\U0010ffff"}  # no code point follows its last
    assert await found("run_a_", status=RunStatus.QUEUED) == {"run_a_1", "run_a_2", "run_a_é"}
    assert await found("run_a_", status=RunStatus.COMPLETED) == set()
    assert await found("") == set(ids)


def child(run_id: str, parent: str) -> ev.DelegationBound:
    """The event that makes `run_id` a run another run started."""
    contract = DelegationContract(
        delegation_id="d1",
        parent_run_id=RunId(parent),
        child_run_id=RunId(run_id),
        agent_name="helper",
        objective="look it up",
    )
    return ev.DelegationBound(run_id=RunId(run_id), seq=2, occurred_at=T0, contract=contract)


async def test_list_runs_shows_fifty_runs_by_default_child_runs_among_them(
    store: EventStore,
) -> None:
    for i in range(50):
        await store.append(RunId(f"r{i:02}"), [created(f"r{i:02}")], expected_seq=0)
    later = T0 + timedelta(seconds=1)
    await store.append(
        RunId("kid"), [created("kid", at=later), child("kid", "r00")], expected_seq=0
    )

    listed = [r.run_id for r in await store.list_runs()]
    assert len(listed) == 50
    assert listed[0] == "kid"
    top = [r.run_id for r in await store.list_runs(top_level=True, limit=100)]
    assert sorted(top) == [f"r{i:02}" for i in range(50)]


async def test_list_runs_of_a_tenant_shows_only_its_runs(store: EventStore) -> None:
    for rid, tenant in [("a1", "acme"), ("b1", "bolt"), ("a2", "acme"), ("d1", "")]:
        await store.enqueue(QueueEntry(run_id=RunId(rid), tenant=tenant))  # type: ignore[attr-defined]
        await store.append(RunId(rid), [created(rid)], expected_seq=0)
    assert {r.run_id for r in await store.list_runs(tenant="acme")} == {"a1", "a2"}
    assert {r.run_id for r in await store.list_runs(tenant="default")} == {"d1"}
    assert {r.run_id for r in await store.list_runs()} == {"a1", "b1", "a2", "d1"}


# -- projections the store keeps --------------------------------------------------------------


async def test_daily_usage_per_principal_follows_the_event_log(store: EventStore, raw: Raw) -> None:
    first = ev.RunCreated(
        run_id=RunId("r1"),
        seq=1,
        agent_name="clerk",
        agent_version="1",
        agent_hash="h",
        input="x",
        metadata={"tenant_id": "acme", "user_id": "ann"},
        occurred_at=T0,
    )
    await store.append(RunId("r1"), [first, started("r1", 2)], expected_seq=0)
    odd = ev.ModelResponded(
        run_id=RunId("r1"),
        seq=4,
        message=Message(role="assistant", content="a NUL \x00 inside"),
        finish_reason=FinishReason.STOP,
        usage=Usage(input_tokens=1, output_tokens=1, cost_usd=0.5, requests=1),
        model="scripted",
        occurred_at=T0,
    )
    await store.append(RunId("r1"), [responded("r1", 3), odd], expected_seq=2)
    rows = raw.execute(
        "SELECT principal, day, input_tokens, output_tokens, cost_usd, calls FROM principal_usage"
    )
    assert [tuple(r) for r in rows] == [("acme/ann", "2026-03-01", 8, 4, 0.75, 2)]
    assert (await store.read(RunId("r1")))[-1] == odd
