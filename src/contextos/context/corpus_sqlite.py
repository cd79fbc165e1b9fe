"""The knowledge corpus in a SQLite file: FTS5 full-text search ranked by BM25.

The file is served by one thread of its own; runs open it `mode=ro`, so retrieval cannot write.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

from contextos.context._sqlite import SqliteFile, transaction
from contextos.context.corpus import DOCUMENTS_TABLE, SqlCorpus
from contextos.store.statements import SQLITE, Start, run_sqlite

T = TypeVar("T")

_SCHEMA = (
    DOCUMENTS_TABLE.format(documents="documents", time="TEXT", flag="INTEGER")
    + """
CREATE TABLE IF NOT EXISTS passages (
    passage_id INTEGER PRIMARY KEY AUTOINCREMENT,
    doc_id TEXT NOT NULL,
    version TEXT NOT NULL,
    ordinal INTEGER NOT NULL,
    heading TEXT NOT NULL,
    text TEXT NOT NULL
);
CREATE VIRTUAL TABLE IF NOT EXISTS passages_fts USING fts5(
    text, heading, content='passages', content_rowid='passage_id', tokenize='porter unicode61'
);
CREATE TRIGGER IF NOT EXISTS passages_ai AFTER INSERT ON passages BEGIN
    INSERT INTO passages_fts (rowid, text, heading) VALUES (new.passage_id, new.text, new.heading);
END;
"""
)

# BM25 is lower for better matches: its negation is the score.
_SEARCH = """
SELECT p.doc_id, p.version, d.content_hash, p.ordinal, p.heading, p.text,
       -bm25(passages_fts) AS score
FROM passages_fts JOIN passages p ON p.passage_id = passages_fts.rowid
JOIN documents d ON d.doc_id = p.doc_id AND d.version = p.version
WHERE passages_fts MATCH :match AND d.current
ORDER BY score DESC LIMIT :k
"""


class Corpus(SqlCorpus):
    """A knowledge corpus in a SQLite file. Read-only unless opened with `writable=True`."""

    _DIALECT = SQLITE.naming(documents="documents", passages="passages")

    def __init__(self, path: str | Path, *, writable: bool = False) -> None:
        self._db = SqliteFile(path, schema=_SCHEMA if writable else "", read_only=not writable)
        self.path = self._db.path
        self.name = self.path.name
        super().__init__(writable=writable, where=f"corpus {self.path}")

    async def close(self) -> None:
        await self._db.close()

    async def _execute(self, start: Start[T], *, atomic: bool = False) -> T:
        if atomic:
            return await self._db.run(
                lambda conn: transaction(conn, lambda c: run_sqlite(c, start(), self._DIALECT))
            )
        return await self._db.run(lambda conn: run_sqlite(conn, start(), self._DIALECT))

    def _search(self, words: list[str], k: int) -> tuple[str, dict[str, Any]]:
        # Every word quoted, OR-ed: an FTS5 query in which nothing acts as an operator.
        return _SEARCH, {"match": " OR ".join(f'"{w}"' for w in words), "k": k}

    def _stored(self, at: datetime) -> str:
        return at.isoformat()


__all__ = ["Corpus"]
