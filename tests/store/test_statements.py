"""Statements written once: one operation runs alike on a real SQLite file and a real
PostgreSQL schema, with each database's placeholders, clock and names."""

from __future__ import annotations

import sqlite3
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from contextos.store.statements import POSTGRES, SQLITE, Dialect, Op, run_postgres, run_sqlite

_CREATE = "CREATE TABLE {items} (name TEXT PRIMARY KEY, n INTEGER NOT NULL)"
_ADD = "INSERT INTO {items} (name, n) VALUES (:name, :n)"
# `%` is psycopg's placeholder character: a literal one must reach the database unchanged.
_BUMP = "UPDATE {items} SET n = n + :by WHERE name LIKE 'a%' AND n >= :by RETURNING name"
_READ = "SELECT name, n, {now}, {now + :ahead} FROM {items} WHERE n > :least ORDER BY name"


def work() -> Op[tuple[int, list[str], list[Any]]]:
    yield _CREATE, {}
    added = yield _ADD, [{"name": name, "n": n} for name, n in (("ab", 1), ("ac", 2), ("b", 3))]
    bumped = yield _BUMP, {"by": 2}
    read = yield _READ, {"least": 2, "ahead": 60}
    return added.rowcount, [row[0] for row in bumped.rows], read.rows


async def test_one_operation_runs_alike_on_both_databases(
    request: pytest.FixtureRequest, tmp_path: Path, backend: str
) -> None:
    dialect: Dialect
    if backend == "sqlite":
        dialect = SQLITE.naming(items="items")
        conn = sqlite3.connect(tmp_path / "s.db", isolation_level=None)
        try:
            added, bumped, rows = run_sqlite(conn, work(), dialect, now=1000.0)
        finally:
            conn.close()
    else:
        import psycopg

        dialect = POSTGRES.naming(items="items")
        url: str = request.getfixturevalue("postgres_url")
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as pg:
            added, bumped, rows = await run_postgres(pg, work(), dialect)
    assert added == 3
    assert bumped == ["ac"]  # the only `a…` row with n >= 2
    assert [(name, n) for name, n, _, _ in rows] == [("ac", 4), ("b", 3)]
    now, later = rows[0][2], rows[0][3]
    if backend == "sqlite":  # this process's clock, bound by the caller, in seconds
        assert (now, later) == (1000.0, 1060.0)
    else:  # the database's clock
        assert isinstance(now, datetime) and (later - now).total_seconds() == 60


def test_each_dialect_writes_its_own_placeholders_and_clock() -> None:
    template = "SELECT {now}, {now - :ago}, x::text FROM {t} WHERE a = :a AND b LIKE 'z%'"
    assert SQLITE.naming(t="t1").sql(template) == (
        "SELECT :now, (:now - :ago), x::text FROM t1 WHERE a = :a AND b LIKE 'z%'"
    )
    assert POSTGRES.naming(t="t2").sql(template) == (
        "SELECT now(), (now() - make_interval(secs => %(ago)s)), x::text FROM t2"
        " WHERE a = %(a)s AND b LIKE 'z%%'"
    )


@pytest.fixture(params=["sqlite", "postgres"])
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)
