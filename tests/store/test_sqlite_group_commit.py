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


async def test_other_writes_join_the_group_and_their_rollback_stays_theirs(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "s.db")
    await store.list_runs()
    seen: list[str] = []
    assert store._conn is not None
    store._conn.set_trace_callback(seen.append)

    def write(name: str, keep: bool) -> Callable[[sqlite3.Connection], str]:
        def fn(conn: sqlite3.Connection) -> str:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute(
                "INSERT INTO concurrency_limits (scope, name, max_running) VALUES ('agent', ?, 1)",
                (name,),
            )
            conn.execute("COMMIT" if keep else "ROLLBACK")
            return name

        return fn

    done = await asyncio.gather(
        store._run(write("kept", True)),
        store._run(write("undone", False)),
        store.append(RunId("a"), [created("a")], expected_seq=0),
    )
    store._conn.set_trace_callback(None)
    await store.close()
    assert list(done) == ["kept", "undone", 1]
    assert seen.count("COMMIT") == 1
    conn = sqlite3.connect(tmp_path / "s.db")
    names = [r[0] for r in conn.execute("SELECT name FROM concurrency_limits")]
    conn.close()
    assert names == ["kept"]
    assert committed_events(tmp_path / "s.db") == 1
