"""The knowledge corpus on PostgreSQL: the same versions and lineage, PostgreSQL full-text search.

Passages carry a generated `tsvector`; search ORs the query's words (none can act as an
operator) and ranks with `ts_rank_cd`. A corpus opened for runs uses read-only transactions, so
PostgreSQL itself refuses any write retrieval might attempt.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from contextos.context.compiled import sha
from contextos.context.corpus import IngestReport, Passage, _read_docs, corpus_tool, query_words
from contextos.errors import ConfigError
from contextos.tools.contract import Tool

_SCHEMA = """
CREATE TABLE IF NOT EXISTS corpus_documents (
    doc_id TEXT NOT NULL,
    version TEXT NOT NULL,
    content_hash TEXT NOT NULL,
    title TEXT NOT NULL,
    ingested_at TIMESTAMPTZ NOT NULL,
    current BOOLEAN NOT NULL,
    PRIMARY KEY (doc_id, version)
);
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


class PostgresCorpus:
    """A knowledge corpus in PostgreSQL. Read-only unless opened with `writable=True`."""

    def __init__(self, url: str, *, writable: bool = False) -> None:
        self.url = url
        self.writable = writable
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

    async def __aenter__(self) -> PostgresCorpus:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def ingest(
        self,
        paths: Iterable[str | Path],
        *,
        root: str | Path | None = None,
        prune: bool = False,
        max_chars: int = 1200,
    ) -> IngestReport:
        """Ingest text files (and the text files under directories) as document versions."""
        if not self.writable:
            raise ConfigError("this corpus is open read-only; open it with writable=True")
        docs = await asyncio.to_thread(_read_docs, list(paths), root, max_chars)
        now = datetime.now(UTC)
        added: list[str] = []
        updated: list[str] = []
        unchanged: list[str] = []
        retired: list[str] = []
        written = 0
        async with self._lock:
            conn = await self._connection()
            async with conn.transaction():
                # One ingest at a time: versions are counted, then written.
                await conn.execute("LOCK TABLE corpus_documents IN EXCLUSIVE MODE")
                for doc_id, text, title, passages in docs:
                    digest = sha(text)
                    cur = await conn.execute(
                        "SELECT content_hash FROM corpus_documents WHERE doc_id = %s AND current",
                        (doc_id,),
                    )
                    row = await cur.fetchone()
                    if row is not None and row[0] == digest:
                        unchanged.append(doc_id)
                        continue
                    cur = await conn.execute(
                        "SELECT count(*) FROM corpus_documents WHERE doc_id = %s", (doc_id,)
                    )
                    count = (await cur.fetchone())[0]
                    version = f"v{count + 1}"
                    await conn.execute(
                        "UPDATE corpus_documents SET current = false WHERE doc_id = %s", (doc_id,)
                    )
                    await conn.execute(
                        "INSERT INTO corpus_documents (doc_id, version, content_hash, title,"
                        " ingested_at, current) VALUES (%s, %s, %s, %s, %s, true)",
                        (doc_id, version, digest, title, now),
                    )
                    async with conn.cursor() as c:
                        await c.executemany(
                            "INSERT INTO corpus_passages (doc_id, version, ordinal, heading, text)"
                            " VALUES (%s, %s, %s, %s, %s)",
                            [
                                (doc_id, version, n, h, t)
                                for n, (h, t) in enumerate(passages, start=1)
                            ],
                        )
                    written += len(passages)
                    (updated if row is not None else added).append(doc_id)
                if prune:
                    seen = {d[0] for d in docs}
                    cur = await conn.execute("SELECT doc_id FROM corpus_documents WHERE current")
                    retired = [r[0] for r in await cur.fetchall() if r[0] not in seen]
                    for doc_id in retired:
                        await conn.execute(
                            "UPDATE corpus_documents SET current = false WHERE doc_id = %s",
                            (doc_id,),
                        )
        return IngestReport(
            added=tuple(added),
            updated=tuple(updated),
            unchanged=tuple(unchanged),
            retired=tuple(retired),
            passages=written,
        )

    async def search(self, query: str, *, k: int = 5) -> list[Passage]:
        """The `k` best passages of current document versions for `query`."""
        words = query_words(query)
        if not words or k <= 0:
            return []
        # Each word becomes a plain lexeme (no operator can be smuggled in), OR-ed together.
        tsquery = " || ".join(["plainto_tsquery('english', %s)"] * len(words))
        async with self._lock:
            conn = await self._connection()
            cur = await conn.execute(
                f"WITH query AS (SELECT {tsquery} AS q)"
                " SELECT p.doc_id, p.version, d.content_hash, p.ordinal, p.heading, p.text,"
                " ts_rank_cd(p.tsv, query.q) AS rank"
                " FROM corpus_passages p"
                " JOIN corpus_documents d ON d.doc_id = p.doc_id AND d.version = p.version,"
                " query WHERE d.current AND p.tsv @@ query.q"
                " ORDER BY rank DESC, p.passage_id LIMIT %s",
                (*words, k),
            )
            rows = await cur.fetchall()
        return [
            Passage(
                id=f"{doc_id}#{ordinal}",
                doc_id=str(doc_id),
                version=str(version),
                content_hash=str(digest),
                heading=str(heading),
                text=str(text),
                score=float(rank),
            )
            for doc_id, version, digest, ordinal, heading, text, rank in rows
        ]

    async def documents(self) -> list[tuple[str, str, str]]:
        """(doc_id, current version, title) of every current document."""
        async with self._lock:
            conn = await self._connection()
            cur = await conn.execute(
                "SELECT doc_id, version, title FROM corpus_documents WHERE current ORDER BY doc_id"
            )
            return [(str(a), str(b), str(c)) for a, b, c in await cur.fetchall()]

    def as_tool(self, *, name: str = "search_knowledge", k: int = 4) -> Tool:
        """A read-only tool the model can call to search the corpus."""
        return corpus_tool(self, name=name, k=k)
