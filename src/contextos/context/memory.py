"""Long-term memory: facts about one user, strictly isolated by tenant and user.

Every read and write names a `Subject` (tenant + user) and the store filters on both; there is
no call that reads across subjects. Writes come from finished runs (after the turn, when the
agent enables them) and carry the run and event they came from, so writing the same run twice
stores nothing new.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from contextos.context._sqlite import SqliteFile, transaction
from contextos.errors import ConfigError


@dataclass(frozen=True, kw_only=True, slots=True)
class Subject:
    """Whose memory: one user of one tenant."""

    tenant_id: str
    """The tenant (organisation, workspace) the user belongs to."""
    user_id: str
    """The user, unique within the tenant."""

    def __post_init__(self) -> None:
        if not self.tenant_id or not self.user_id:
            raise ConfigError(
                "memory needs both a tenant_id and a user_id",
                tenant_id=self.tenant_id,
                user_id=self.user_id,
            )

    @property
    def key(self) -> str:
        return f"{self.tenant_id}/{self.user_id}"


@dataclass(frozen=True, kw_only=True, slots=True)
class Fact:
    """One remembered fact about a user."""

    id: int
    """Store-assigned id, stable for the fact's life."""
    text: str
    """The fact, as written (already redacted by the PII layer when it runs)."""
    source: str
    """Where it came from: `run:<id>#<seq>` or `manual`."""
    created_at: datetime
    """When it was written (UTC)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class NewFact:
    """A fact to write, with the event that produced it."""

    text: str
    """The fact."""
    run_id: str = "manual"
    """The run that learnt it."""
    seq: int = 0
    """The event in that run that carried it; (run_id, seq, text) is written once."""


@runtime_checkable
class MemoryStore(Protocol):
    """Per-user long-term memory."""

    async def recall(self, subject: Subject, *, limit: int = 50) -> list[Fact]:
        """The subject's facts, newest first."""
        ...

    async def remember(self, subject: Subject, facts: Sequence[NewFact]) -> int:
        """Write facts for the subject; return how many were new."""
        ...

    async def forget(self, subject: Subject, fact_id: int) -> bool:
        """Delete one of the subject's facts; False when the subject has no such fact."""
        ...

    async def close(self) -> None: ...


_SCHEMA = """
CREATE TABLE IF NOT EXISTS facts (
    fact_id INTEGER PRIMARY KEY AUTOINCREMENT,
    tenant_id TEXT NOT NULL,
    user_id TEXT NOT NULL,
    text TEXT NOT NULL,
    run_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    created_at TEXT NOT NULL,
    UNIQUE (tenant_id, user_id, run_id, seq, text)
);
CREATE INDEX IF NOT EXISTS facts_by_subject ON facts (tenant_id, user_id, fact_id);
"""


class SqliteMemory:
    """MemoryStore in a SQLite file."""

    def __init__(self, path: str | Path) -> None:
        self._db = SqliteFile(path, schema=_SCHEMA)
        self.path = self._db.path

    async def recall(self, subject: Subject, *, limit: int = 50) -> list[Fact]:
        def _recall(conn: sqlite3.Connection) -> list[tuple[Any, ...]]:
            return conn.execute(
                "SELECT fact_id, text, run_id, seq, created_at FROM facts"
                " WHERE tenant_id = ? AND user_id = ? ORDER BY fact_id DESC LIMIT ?",
                (subject.tenant_id, subject.user_id, limit),
            ).fetchall()

        return [
            Fact(
                id=int(fid),
                text=str(text),
                source="manual" if run_id == "manual" else f"run:{run_id}#{seq}",
                created_at=datetime.fromisoformat(str(created)),
            )
            for fid, text, run_id, seq, created in await self._db.run(_recall)
        ]

    async def remember(self, subject: Subject, facts: Sequence[NewFact]) -> int:
        now = datetime.now(UTC).isoformat()
        rows = [
            (subject.tenant_id, subject.user_id, f.text.strip(), f.run_id, f.seq, now)
            for f in facts
            if f.text.strip()
        ]

        def _write(conn: sqlite3.Connection) -> int:
            before = conn.total_changes
            conn.executemany(
                "INSERT OR IGNORE INTO facts (tenant_id, user_id, text, run_id, seq, created_at)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                rows,
            )
            return conn.total_changes - before

        return await self._db.run(lambda conn: transaction(conn, _write))

    async def forget(self, subject: Subject, fact_id: int) -> bool:
        def _forget(conn: sqlite3.Connection) -> bool:
            cur = conn.execute(
                "DELETE FROM facts WHERE tenant_id = ? AND user_id = ? AND fact_id = ?",
                (subject.tenant_id, subject.user_id, fact_id),
            )
            return cur.rowcount > 0

        return await self._db.run(_forget)

    async def close(self) -> None:
        await self._db.close()
