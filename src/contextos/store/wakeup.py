"""Wake-ups: how an idle worker learns that work may be ready without asking the database.

A wake-up is only a hint to look at the queue now: claims stay the only source of truth, so
a lost or spurious wake-up costs a delay or one empty claim, never a wrong one. Workers still
poll on a long interval in case a hint is lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import threading
from collections.abc import Callable
from enum import StrEnum
from typing import Protocol

log = logging.getLogger("contextos.wakeup")

CHANNEL = "contextos_work"
"""The PostgreSQL channel the database's triggers notify (payload: `KIND SCHEMA`)."""


class Ready(StrEnum):
    """What a wake-up says became ready."""

    RUNS = "runs"
    """A run may be claimable: created, answered, or its lease given back."""
    SCHEDULES = "schedules"
    """A schedule was added: its first tick may be sooner than any known one."""


_KINDS = frozenset(r.value for r in Ready)

OnWake = Callable[[Ready], None]
"""Called (on the waiting loop's thread) for each wake-up."""


class Wakeup(Protocol):
    """Tells one process's idle worker that work may be ready."""

    @property
    def reaches_other_processes(self) -> bool:
        """Whether work made ready by other processes wakes it (else only this process's)."""
        ...

    async def start(self, on_wake: OnWake) -> None:
        """Begin delivering wake-ups to `on_wake` until `close`."""
        ...

    async def close(self) -> None:
        """Stop delivering wake-ups."""
        ...


# -- within one process --------------------------------------------------------------------

_lock = threading.Lock()
_waiters: dict[str, set[tuple[asyncio.AbstractEventLoop, OnWake]]] = {}


def store_key(store: object) -> str:
    """Which store two objects in one process share: a SQLite file's real path, else its URL."""
    path = getattr(store, "path", None)
    if path is not None:
        return _file_key(os.fspath(path))
    return "url:" + str(getattr(store, "url", id(store)))


@functools.lru_cache(maxsize=256)
def _file_key(path: str) -> str:
    # Resolved once per path: every run given back to the queue wakes by this key.
    return "file:" + os.path.realpath(path)


def wake_local(store: object, ready: Ready = Ready.RUNS) -> None:
    """Wake this process's workers on `store` (any thread; no-op when none waits)."""
    with _lock:
        waiters = list(_waiters.get(store_key(store), ()))
    for loop, on_wake in waiters:
        with contextlib.suppress(RuntimeError):  # that loop has closed
            loop.call_soon_threadsafe(on_wake, ready)


class LocalWakeup:
    """Wake-ups from this process only, for stores with no cross-process signal (SQLite).

    Whatever in this process makes work ready calls `wake_local(store)`; another process's starts
    are found by polling.
    """

    def __init__(self, store: object) -> None:
        self._key = store_key(store)
        self._entry: tuple[asyncio.AbstractEventLoop, OnWake] | None = None

    @property
    def reaches_other_processes(self) -> bool:
        return False

    async def start(self, on_wake: OnWake) -> None:
        self._entry = (asyncio.get_running_loop(), on_wake)
        with _lock:
            _waiters.setdefault(self._key, set()).add(self._entry)

    async def close(self) -> None:
        if self._entry is None:
            return
        with _lock:
            waiters = _waiters.get(self._key)
            if waiters is not None:
                waiters.discard(self._entry)
                if not waiters:
                    del _waiters[self._key]
        self._entry = None


# -- PostgreSQL: LISTEN/NOTIFY -------------------------------------------------------------


class PostgresWakeup:
    """LISTENs on a dedicated connection; the database's triggers NOTIFY when work is ready.

    The NOTIFY is sent by a trigger in the transaction that makes the work ready, so a rolled
    back start wakes nobody and a committed one is claimable by the time the wake-up arrives.
    When the connection drops, notifications sent meanwhile are lost: it reconnects and
    wakes the worker to look at the queue once, so nothing waits for the poll interval.
    """

    def __init__(
        self,
        url: str,
        *,
        name: str = "",
        check_s: float = 30.0,
        retry_s: float = 0.2,
        retry_cap_s: float = 5.0,
    ) -> None:
        self.url = url
        self.name = name
        """Goes into the connection's application_name (`contextos-wakeup NAME`)."""
        self.check_s = check_s
        """A connection silent this long is checked with a query (a dead one fails it)."""
        self.retry_s = retry_s
        self.retry_cap_s = retry_cap_s
        self.listening = asyncio.Event()
        """Set while a LISTEN connection is up."""
        self.connections = 0
        """LISTEN connections made so far (more than one: it reconnected)."""
        self._task: asyncio.Task[None] | None = None

    @property
    def reaches_other_processes(self) -> bool:
        return True

    async def start(self, on_wake: OnWake) -> None:
        self._task = asyncio.create_task(self._listen(on_wake), name="contextos-wakeup")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _listen(self, on_wake: OnWake) -> None:
        import psycopg

        delay = self.retry_s
        while True:
            try:
                conn = await psycopg.AsyncConnection.connect(
                    self.url,
                    autocommit=True,
                    application_name=f"contextos-wakeup {self.name}".strip()[:63],
                    connect_timeout=10,
                )
            except Exception as exc:
                log.warning("wake-ups: cannot connect (%s); polling meanwhile", exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.retry_cap_s)
                continue
            try:
                cur = await conn.execute("SELECT current_schema()")
                row = await cur.fetchone()
                schema = str(row[0]) if row is not None else ""
                await conn.execute(f"LISTEN {CHANNEL}")
                self.connections += 1
                self.listening.set()
                delay = self.retry_s
                # Whatever was notified while no connection listened is lost: look now.
                on_wake(Ready.RUNS)
                on_wake(Ready.SCHEDULES)
                while True:
                    async for note in conn.notifies(timeout=self.check_s):
                        kind, _, in_schema = note.payload.partition(" ")
                        if in_schema == schema and kind in _KINDS:
                            on_wake(Ready(kind))
                    # Silent for a while: a connection the network dropped fails this query.
                    await conn.execute("SELECT 1")
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("wake-ups: the LISTEN connection failed (%s); reconnecting", exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.retry_cap_s)
            finally:
                self.listening.clear()
                with contextlib.suppress(Exception):
                    await conn.close()


def wakeup_for(store: object, *, name: str = "") -> Wakeup:
    """The wake-up that fits a store: LISTEN/NOTIFY on PostgreSQL, in-process otherwise."""
    url = str(getattr(store, "url", ""))
    if url.startswith(("postgresql://", "postgres://")):
        return PostgresWakeup(url, name=name)
    return LocalWakeup(store)


__all__ = [
    "CHANNEL",
    "LocalWakeup",
    "OnWake",
    "PostgresWakeup",
    "Ready",
    "Wakeup",
    "store_key",
    "wake_local",
    "wakeup_for",
]
