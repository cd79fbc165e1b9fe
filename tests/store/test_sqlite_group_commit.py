"""SQLite store: appends of many runs share one commit, refusals stay per append, and a file
locked by another process is waited for without stalling the event loop."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest

from contextos import events as ev
from contextos.errors import ConcurrencyConflict, RunIsTerminal
from contextos.runs import RunId
from contextos.store import SqliteStore
from contextos.store.sqlite_commits import Job, _write_jobs


def created(run_id: str) -> ev.RunCreated:
    return ev.RunCreated(
        run_id=RunId(run_id), seq=1, agent_name="a", agent_version="1", agent_hash="h", input="x"
    )


def started(run_id: str, seq: int) -> ev.RunStarted:
    return ev.RunStarted(run_id=RunId(run_id), seq=seq, worker_id="w")


def committed_events(db: Path) -> int:
    """Events a separate connection can see: only what was committed."""
    conn = sqlite3.connect(db)
    try:
        return int(conn.execute("SELECT COUNT(*) FROM events").fetchone()[0])
    finally:
        conn.close()


async def test_appends_made_together_land_in_one_transaction(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "s.db")
    seen: list[str] = []
    await store.list_runs()  # connect first, so the trace below sees only the appends
    assert store._conn is not None
    store._conn.set_trace_callback(seen.append)
    results = await asyncio.gather(
        *(store.append(RunId(f"r{i}"), [created(f"r{i}")], expected_seq=0) for i in range(20))
    )
    store._conn.set_trace_callback(None)
    await store.close()
    assert results == [1] * 20
    assert seen.count("COMMIT") == 1
    assert committed_events(tmp_path / "s.db") == 20


async def test_an_append_with_nobody_to_join_it_commits_without_waiting_for_the_loop(
    tmp_path: Path,
) -> None:
    store = SqliteStore(tmp_path / "s.db")
    await store.list_runs()  # connect first: opening the file goes through the store's thread
    append = store.append(RunId("a"), [created("a")], expected_seq=0)
    with pytest.raises(StopIteration) as done:  # one step of the coroutine: it never suspends
        append.send(None)
    assert done.value.value == 1
    assert committed_events(tmp_path / "s.db") == 1
    # With another callback waiting to run, the append waits for the group instead.
    asyncio.get_running_loop().call_soon(lambda: None)
    grouped = store.append(RunId("b"), [created("b")], expected_seq=0)
    grouped.send(None)
    assert committed_events(tmp_path / "s.db") == 1
    grouped.close()  # its job stays queued: the group commits it
    await store.close()
    assert committed_events(tmp_path / "s.db") == 2


async def test_a_refused_append_does_not_undo_the_others_in_its_group(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "s.db")
    await store.append(RunId("a"), [created("a")], expected_seq=0)
    await store.append(RunId("b"), [created("b")], expected_seq=0)
    await store.append(RunId("b"), [ev.RunCancelled(run_id=RunId("b"), seq=2)], expected_seq=1)
    outcomes = await asyncio.gather(
        store.append(RunId("a"), [started("a", 2)], expected_seq=1),
        store.append(RunId("a"), [started("a", 2)], expected_seq=1),  # the same seq again
        store.append(RunId("b"), [started("b", 3)], expected_seq=2),  # b is cancelled
        store.append(RunId("c"), [created("c")], expected_seq=0),
        return_exceptions=True,
    )
    assert outcomes[0] == 2
    assert isinstance(outcomes[1], ConcurrencyConflict)
    assert isinstance(outcomes[2], RunIsTerminal)
    assert outcomes[3] == 1
    assert [e.seq for e in await store.read(RunId("a"))] == [1, 2]
    assert [e.seq for e in await store.read(RunId("c"))] == [1]
    await store.close()


async def test_a_file_locked_by_another_writer_is_waited_for_off_the_loop(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    store = SqliteStore(db, busy_timeout_s=30)
    await store.append(RunId("a"), [created("a")], expected_seq=0)
    other = sqlite3.connect(db, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # another process's writer holds the lock
    pending = asyncio.ensure_future(store.append(RunId("a"), [started("a", 2)], expected_seq=1))
    for _ in range(20):
        await asyncio.sleep(0.01)  # the loop keeps running while the append waits
    assert not pending.done()
    other.execute("COMMIT")
    other.close()
    assert await pending == 2
    await store.close()


async def test_a_caller_giving_up_on_a_locked_file_leaves_the_rest_of_its_group_answered(
    tmp_path: Path,
) -> None:
    db = tmp_path / "s.db"
    store = SqliteStore(db, busy_timeout_s=30)
    for run_id in ("a", "b"):
        await store.append(RunId(run_id), [created(run_id)], expected_seq=0)
    other = sqlite3.connect(db, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # another process's writer holds the lock
    first = asyncio.ensure_future(store.append(RunId("a"), [started("a", 2)], expected_seq=1))
    second = asyncio.ensure_future(store.append(RunId("b"), [started("b", 2)], expected_seq=1))
    while store._lent is None:  # both wait in one group, on the store's thread
        await asyncio.sleep(0.01)
    first.cancel()  # its caller gives up
    other.execute("COMMIT")
    other.close()
    assert await second == 2
    assert first.cancelled()
    await store.close()


async def test_close_commits_appends_still_waiting(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "s.db")
    task = asyncio.ensure_future(store.append(RunId("a"), [created("a")], expected_seq=0))
    await asyncio.sleep(0)
    await store.close()
    assert await task == 1
    assert committed_events(tmp_path / "s.db") == 1


@pytest.mark.parametrize("runs", [1, 3])
async def test_appends_after_the_file_was_opened_elsewhere_still_fence(
    tmp_path: Path, runs: int
) -> None:
    db = tmp_path / "s.db"
    one, two = SqliteStore(db), SqliteStore(db)
    for i in range(runs):
        await one.append(RunId(f"r{i}"), [created(f"r{i}")], expected_seq=0)
    results = await asyncio.gather(
        *(one.append(RunId(f"r{i}"), [started(f"r{i}", 2)], expected_seq=1) for i in range(runs)),
        *(two.append(RunId(f"r{i}"), [started(f"r{i}", 2)], expected_seq=1) for i in range(runs)),
        return_exceptions=True,
    )
    assert sum(1 for r in results if r == 2) == runs
    assert all(isinstance(r, ConcurrencyConflict) for r in results if r != 2)
    await one.close()
    await two.close()


def write(name: str, keep: bool) -> Callable[[sqlite3.Connection], str]:
    """A write of the store's own (`_run`) in a transaction of its own, kept or rolled back."""

    def fn(conn: sqlite3.Connection) -> str:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute(
            "INSERT INTO concurrency_limits (scope, name, max_running) VALUES ('agent', ?, 1)",
            (name,),
        )
        conn.execute("COMMIT" if keep else "ROLLBACK")
        return name

    return fn


def limits(db: Path) -> list[str]:
    conn = sqlite3.connect(db)
    try:
        return [r[0] for r in conn.execute("SELECT name FROM concurrency_limits ORDER BY name")]
    finally:
        conn.close()


async def test_other_writes_join_the_group_and_their_rollback_stays_theirs(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "s.db")
    await store.list_runs()
    seen: list[str] = []
    assert store._conn is not None
    store._conn.set_trace_callback(seen.append)
    done = await asyncio.gather(
        store._run(write("kept", True)),
        store._run(write("undone", False)),
        store.append(RunId("a"), [created("a")], expected_seq=0),
    )
    store._conn.set_trace_callback(None)
    await store.close()
    assert list(done) == ["kept", "undone", 1]
    assert seen.count("COMMIT") == 1
    assert limits(tmp_path / "s.db") == ["kept"]
    assert committed_events(tmp_path / "s.db") == 1


async def test_a_write_alone_in_its_group_still_has_its_transaction_mapped(tmp_path: Path) -> None:
    """Alone in its group, a write of the store's own still gets the joined connection: its
    BEGIN and COMMIT are the group's, its ROLLBACK undoes only its own rows."""
    store = SqliteStore(tmp_path / "s.db")
    assert await store._run(write("kept", True)) == "kept"
    assert await store._run(write("undone", False)) == "undone"
    assert await store.append(RunId("a"), [created("a")], expected_seq=0) == 1
    await store.close()
    assert limits(tmp_path / "s.db") == ["kept"]


def failing_commits(conn: sqlite3.Connection) -> None:
    """Make every COMMIT on `conn` fail, its transaction still open, as a disk error may."""
    committing = False

    def trace(sql: str) -> None:
        nonlocal committing
        committing = sql == "COMMIT"

    conn.set_trace_callback(trace)
    conn.set_progress_handler(lambda: int(committing), 1)


def healed(conn: sqlite3.Connection) -> None:
    conn.set_progress_handler(None, 1)
    conn.set_trace_callback(None)


@pytest.mark.parametrize("runs", [1, 2])
async def test_appends_whose_commit_fails_leave_nothing_and_the_store_goes_on(
    tmp_path: Path, runs: int
) -> None:
    """A lone append (no savepoint) and a group alike: the failed COMMIT's transaction is
    rolled back, its callers hear why, and the same appends succeed once the disk does."""
    store = SqliteStore(tmp_path / "s.db")
    ids = [RunId(f"r{i}") for i in range(runs)]
    for run_id in ids:
        await store.append(run_id, [created(run_id)], expected_seq=0)
    assert store._conn is not None
    failing_commits(store._conn)
    failed = await asyncio.gather(
        *(store.append(run_id, [started(run_id, 2)], expected_seq=1) for run_id in ids),
        return_exceptions=True,
    )
    healed(store._conn)
    assert [str(f) for f in failed] == ["interrupted"] * runs
    assert all(isinstance(f, sqlite3.OperationalError) for f in failed)
    assert not store._conn.in_transaction
    again = await asyncio.gather(
        *(store.append(run_id, [started(run_id, 2)], expected_seq=1) for run_id in ids)
    )
    assert again == [2] * runs
    await store.close()
    assert committed_events(tmp_path / "s.db") == 2 * runs


@pytest.mark.parametrize("jobs", [1, 2])
async def test_a_write_interrupted_half_way_leaves_nothing_of_its_group(
    tmp_path: Path, jobs: int
) -> None:
    """Ctrl-C inside a write (an exception that is no error, so no savepoint takes it): the
    whole transaction rolls back, the others' rows with it, and the interrupt goes on up."""
    conn = sqlite3.connect(tmp_path / "s.db", isolation_level=None)
    conn.execute("CREATE TABLE t (n INTEGER)")

    def insert(n: int) -> Callable[[sqlite3.Connection], int]:
        def work(c: sqlite3.Connection) -> int:
            c.execute("INSERT INTO t VALUES (?)", (n,))
            return n

        return work

    def interrupted(c: sqlite3.Connection) -> None:
        c.execute("INSERT INTO t VALUES (0)")
        raise KeyboardInterrupt

    loop = asyncio.get_running_loop()
    works = [*(insert(n) for n in range(1, jobs)), interrupted]
    batch = [Job(work=w, joined=False, future=loop.create_future()) for w in works]
    with pytest.raises(KeyboardInterrupt):
        _write_jobs(conn, batch)
    assert not conn.in_transaction
    assert conn.execute("SELECT COUNT(*) FROM t").fetchone()[0] == 0
    conn.close()


@pytest.mark.parametrize("runs", [1, 2])
async def test_a_database_error_of_another_kind_reaches_every_append_of_the_group(
    tmp_path: Path, runs: int
) -> None:
    """Not a lock or an operational fault of the file (here a transaction the database
    refuses): each caller hears the error instead of waiting for ever, and nothing is written."""
    store = SqliteStore(tmp_path / "s.db")
    ids = [RunId(f"r{i}") for i in range(runs)]
    for run_id in ids:
        await store.append(run_id, [created(run_id)], expected_seq=0)
    assert store._conn is not None

    def no_transactions(action: int, *_: object) -> int:
        return sqlite3.SQLITE_DENY if action == sqlite3.SQLITE_TRANSACTION else sqlite3.SQLITE_OK

    store._conn.set_authorizer(no_transactions)
    failed = await asyncio.gather(
        *(store.append(run_id, [started(run_id, 2)], expected_seq=1) for run_id in ids),
        return_exceptions=True,
    )
    store._conn.set_authorizer(None)
    assert [(type(f), str(f)) for f in failed] == [(sqlite3.DatabaseError, "not authorized")] * runs
    assert [e.seq for run_id in ids for e in await store.read(run_id)] == [1] * runs
    await store.close()
