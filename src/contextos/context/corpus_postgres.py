"""The knowledge corpus on PostgreSQL: the same versions and lineage, PostgreSQL full-text search.

Passages carry a generated `tsvector`; search ORs the query's words (none can act as an
operator) and ranks with `ts_rank_cd`. A corpus opened for runs uses read-only transactions, so
PostgreSQL itself refuses any write retrieval might attempt.
"""

from __future__ import annotations

import asyncio
import functools
from datetime import datetime
from typing import Any, TypeVar

from contextos.context.corpus import DOCUMENTS_TABLE, SqlCorpus
from contextos.store.statements import POSTGRES, Start, run_postgres

T = TypeVar("T")

_SCHEMA = (
    DOCUMENTS_TABLE.format(documents="corpus_documents", time="TIMESTAMPTZ", flag="BOOLEAN")
    + """
CREATE TABLE IF NOT EXISTS corpus_passages (
    passage_id BIGSERIAL PRIMARY KEY,
    doc_id TEXT NOT NULL,
    version TEXT NOT NULL,
    ordinal INTEGER NOT NULL,
    heading TEXT NOT NULL,
    text TEXT NOT NULL,
    tsv TSVECTOR GENERATED ALWAYS AS (
        setweight(to_tsvector('english', heading), 'B') || to_tsvector('english', text)
    ) STORED
);
CREATE INDEX IF NOT EXISTS corpus_passages_tsv ON corpus_passages USING GIN (tsv);
"""
)


_RANKED = """
SELECT p.doc_id, p.version, d.content_hash, p.ordinal, p.heading, p.text,
       ts_rank_cd(p.tsv, query.q) AS score
FROM corpus_passages p
JOIN corpus_documents d ON d.doc_id = p.doc_id AND d.version = p.version, query
WHERE d.current AND p.tsv @@ query.q
ORDER BY score DESC, p.passage_id LIMIT :k
"""


@functools.cache
def _search(words: int) -> str:
    """The search for that many words (`:w0`, `:w1`, …), each a plain lexeme (no operator can
    be smuggled in), OR-ed together."""
    lexemes = " || ".join(f"plainto_tsquery('english', :w{i})" for i in range(words))
    return f"WITH query AS (SELECT {lexemes} AS q)" + _RANKED


class PostgresCorpus(SqlCorpus):
    """A knowledge corpus in PostgreSQL. Read-only unless opened with `writable=True`."""

    _DIALECT = POSTGRES.naming(documents="corpus_documents", passages="corpus_passages")
    # One ingest at a time: versions are counted, then written.
    _INGEST_LOCK = "LOCK TABLE corpus_documents IN EXCLUSIVE MODE"

    def __init__(self, url: str, *, writable: bool = False) -> None:
        super().__init__(writable=writable, where="this corpus")
        self.url = url
        self.name = "postgresql-corpus"
        self._conn: Any = None
        self._lock = asyncio.Lock()

    async def _connection(self) -> Any:
        if self._conn is None:
            import psycopg

            conn = await psycopg.AsyncConnection.connect(self.url, autocommit=True)
            if self.writable:
                await conn.execute(_SCHEMA)
            else:
                await conn.execute("SET default_transaction_read_only = on")
            self._conn = conn
        return self._conn

    async def close(self) -> None:
        if self._conn is not None:
            await self._conn.close()
            self._conn = None

    async def _execute(self, start: Start[T], *, atomic: bool = False) -> T:
        async with self._lock:
            conn = await self._connection()
            return await run_postgres(conn, start(), self._DIALECT, atomic=atomic)

    def _search(self, words: list[str], k: int) -> tuple[str, dict[str, Any]]:
        params: dict[str, Any] = {f"w{i}": word for i, word in enumerate(words)}
        return _search(len(words)), {**params, "k": k}

    def _stored(self, at: datetime) -> datetime:
        return at


__all__ = ["PostgresCorpus"]
