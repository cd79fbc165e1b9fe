"""One SQLite file served by one thread, so the event loop never blocks on the database."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


class SqliteFile:
    """A lazily opened connection used only from its own worker thread."""

    def __init__(self, path: str | Path, *, schema: str = "", read_only: bool = False) -> None:
        self.path = Path(path)
        self.read_only = read_only
        self._schema = schema
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="contextos-ctx")
        self._conn: sqlite3.Connection | None = None
        self._closed = False

    def _connect(self) -> sqlite3.Connection:
        if self._conn is None:
            if self.read_only:
                if not self.path.is_file():
                    raise FileNotFoundError(f"no database at {self.path}")
                conn = sqlite3.connect(
                    f"file:{self.path}?mode=ro", uri=True, check_same_thread=False
                )
            else:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
                conn.execute("PRAGMA journal_mode=WAL")
                conn.execute("PRAGMA busy_timeout=30000")
                if self._schema:
                    conn.executescript(self._schema)
            self._conn = conn
        return self._conn

    async def run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        if self._closed:
            raise RuntimeError(f"{self.path} is closed")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, lambda: fn(self._connect()))

    async def close(self) -> None:
        if self._closed:
            return

        def _close() -> None:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

        await asyncio.get_running_loop().run_in_executor(self._executor, _close)
        self._closed = True
        self._executor.shutdown(wait=True)


def transaction(conn: sqlite3.Connection, fn: Callable[[sqlite3.Connection], T]) -> T:
    conn.execute("BEGIN IMMEDIATE")
    try:
        out = fn(conn)
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    return out
