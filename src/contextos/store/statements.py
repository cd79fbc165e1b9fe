"""SQL written once for SQLite and PostgreSQL: operations as generators of statements.

An operation yields `(sql, params)` and is sent back each statement's `Result`, so one piece of
logic runs synchronously on a SQLite connection (inside whatever callable owns it: no extra
thread hop) and asynchronously on a psycopg connection (one round trip per statement, as
hand-written code would make). Statements are templates a `Dialect` renders once:

- parameters are named `:name` (SQLite's own style; rewritten for psycopg);
- `{now}` is the current time, `{now + :name}` / `{now - :name}` that time moved by a parameter
  in seconds (SQLite binds `now` from this process's clock; PostgreSQL uses its own `now()`);
- `{word}` is a name the dialect supplies, such as a table that is named differently.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeAlias, TypeVar

if TYPE_CHECKING:
    import sqlite3

    import psycopg

T = TypeVar("T")

Params: TypeAlias = dict[str, Any] | list[dict[str, Any]]
"""A statement's parameters; a list of them runs the statement once for each (executemany)."""

Statement: TypeAlias = tuple[str, Params]
"""A statement (a template its dialect renders) and its parameters."""


@dataclass(slots=True)  # not frozen: made for every statement, and a frozen one is slower to make
class Result:
    """What one statement returned."""

    rows: list[Any]
    """Its rows (none for a statement without a result)."""
    rowcount: int
    """Rows it changed."""

    @property
    def row(self) -> Any:
        """The first row, or None."""
        return self.rows[0] if self.rows else None


Op: TypeAlias = Generator[Statement, Result, T]
"""An operation: yields statements, receives their results, returns its value."""

Start: TypeAlias = Callable[[], Op[T]]
"""Starts an operation afresh: a backend may start it again when the database was busy."""

_MACRO = re.compile(r"\{(\w+)(?: ([+-]) :(\w+))?\}")
_PARAM = re.compile(r"(?<![:\w]):(\w+)")


@dataclass(frozen=True, eq=False)
class Dialect:
    """How one database spells what the shared statements leave open."""

    now: str
    """The current time."""
    seconds: str
    """A parameter (`{}`: its `:name`) as a duration to add to a time."""
    pyformat: bool = False
    """Whether parameters are written `%(name)s` (psycopg) rather than `:name`."""
    words: Mapping[str, str] = field(default_factory=dict)
    """Names that differ between databases, such as tables."""
    _rendered: dict[str, str] = field(default_factory=dict, repr=False)

    def sql(self, template: str) -> str:
        """The template in this dialect (rendered once, then kept)."""
        sql = self._rendered.get(template)
        if sql is None:
            sql = self._rendered[template] = self._render(template)
        return sql

    def naming(self, **words: str) -> Dialect:
        """This dialect with more names filled in."""
        return Dialect(self.now, self.seconds, self.pyformat, {**self.words, **words})

    def _render(self, template: str) -> str:
        sql = _MACRO.sub(self._expand, template)
        if self.pyformat:
            sql = _PARAM.sub(r"%(\1)s", sql.replace("%", "%%"))
        return sql

    def _expand(self, match: re.Match[str]) -> str:
        word, sign, param = match.groups()
        if word != "now":
            return self.words[word]
        if sign is None:
            return self.now
        return f"({self.now} {sign} {self.seconds.format(':' + param)})"


SQLITE = Dialect(now=":now", seconds="{}")
"""SQLite: times are what the caller binds as `now`, durations plain seconds."""

POSTGRES = Dialect(now="now()", seconds="make_interval(secs => {})", pyformat=True)
"""PostgreSQL: the database's clock, durations as intervals, psycopg's placeholders."""


def run_sqlite(conn: sqlite3.Connection, op: Op[T], dialect: Dialect = SQLITE, **bound: Any) -> T:
    """Run an operation to its end on a SQLite connection; `bound` joins every statement's
    parameters (such as `now`)."""
    try:
        template, params = next(op)
        while True:
            sql = dialect.sql(template)
            if isinstance(params, dict):
                cur = conn.execute(sql, {**params, **bound} if bound else params)
            else:
                cur = conn.executemany(sql, params)
            rows = cur.fetchall() if cur.description is not None else []
            template, params = op.send(Result(rows, cur.rowcount))
    except StopIteration as done:
        value: T = done.value
        return value


async def run_postgres(
    conn: psycopg.AsyncConnection[Any],
    op: Op[T],
    dialect: Dialect = POSTGRES,
    *,
    atomic: bool = False,
) -> T:
    """Run an operation to its end on a psycopg connection, one statement per round trip;
    `atomic`: in one transaction (two round trips more)."""
    async with conn.transaction() if atomic else contextlib.nullcontext():
        try:
            template, params = next(op)
            while True:
                sql = dialect.sql(template)
                if isinstance(params, dict):
                    cur = await conn.execute(sql, params)
                    # Only a statement with result columns has rows to fetch (`nfields` is
                    # cheap to ask, unlike `description`).
                    has_rows = cur.pgresult is not None and cur.pgresult.nfields > 0
                    rows = await cur.fetchall() if has_rows else []
                    result = Result(rows, cur.rowcount)
                else:
                    async with conn.cursor() as many:
                        await many.executemany(sql, params)
                        result = Result([], many.rowcount)
                template, params = op.send(result)
        except StopIteration as done:
            value: T = done.value
            return value


def all_rows(template: str, params: dict[str, Any]) -> Op[list[Any]]:
    """An operation of one statement: its rows."""
    return (yield template, params).rows


def first_row(template: str, params: dict[str, Any]) -> Op[Any]:
    """An operation of one statement: its first row, or None."""
    return (yield template, params).row


def changed_rows(template: str, params: dict[str, Any]) -> Op[int]:
    """An operation of one statement: how many rows it changed."""
    return (yield template, params).rowcount
