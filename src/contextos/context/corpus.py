"""The knowledge corpus: shared, read-only at run time, versioned, searched with BM25.

Documents are ingested from files into passages; re-ingesting a changed file adds a new version
and retires the old one (kept for lineage of past runs). Search is SQLite FTS5 full-text with
its BM25 ranking and returns passages with the source and version a context manifest records.
Runs open the corpus read-only: retrieval can never change it.
"""

from __future__ import annotations

import asyncio
import re
import sqlite3
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from contextos.context._sqlite import SqliteFile, transaction
from contextos.context.compiled import sha
from contextos.errors import ConfigError
from contextos.tools.contract import Tool, tool

if TYPE_CHECKING:
    from contextos.context.corpus_postgres import PostgresCorpus

_SCHEMA = """
CREATE TABLE IF NOT EXISTS documents (
    doc_id TEXT NOT NULL,
    version TEXT NOT NULL,
    content_hash TEXT NOT NULL,
    title TEXT NOT NULL,
    ingested_at TEXT NOT NULL,
    current INTEGER NOT NULL,
    PRIMARY KEY (doc_id, version)
);
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

TEXT_SUFFIXES = frozenset({".md", ".markdown", ".txt", ".rst"})


@dataclass(frozen=True, kw_only=True, slots=True)
class Passage:
    """One retrieved passage with its lineage."""

    id: str
    """`<doc_id>#<ordinal>`: stable within one version of the document."""
    doc_id: str
    """The document (its path relative to the ingest root)."""
    version: str
    """The document's version (`v1`, `v2`, …)."""
    content_hash: str
    """Hash of the whole document version."""
    heading: str
    """The nearest heading above the passage, if any."""
    text: str
    """The passage."""
    score: float
    """BM25 relevance (higher is better)."""

    @property
    def source(self) -> str:
        return f"corpus:{self.doc_id}"


@dataclass(frozen=True, kw_only=True, slots=True)
class IngestReport:
    """What an ingest changed."""

    added: tuple[str, ...] = ()
    """Documents seen for the first time."""
    updated: tuple[str, ...] = ()
    """Documents whose content changed (a new version)."""
    unchanged: tuple[str, ...] = ()
    """Documents whose current version already had this content."""
    retired: tuple[str, ...] = ()
    """Documents no longer present (with `prune=True`)."""
    passages: int = 0
    """Passages written."""


class Corpus:
    """A knowledge corpus in a SQLite file. Read-only unless opened with `writable=True`."""

    def __init__(self, path: str | Path, *, writable: bool = False) -> None:
        self.writable = writable
        self._db = SqliteFile(path, schema=_SCHEMA if writable else "", read_only=not writable)
        self.path = self._db.path
        self.name = self.path.name

    async def close(self) -> None:
        await self._db.close()

    async def __aenter__(self) -> Corpus:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- ingest -----------------------------------------------------------------------------

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
            raise ConfigError(f"corpus {self.path} is open read-only; open it with writable=True")
        docs = await asyncio.to_thread(_read_docs, list(paths), root, max_chars)
        now = datetime.now(UTC).isoformat()

        def _ingest(conn: sqlite3.Connection) -> IngestReport:
            added: list[str] = []
            updated: list[str] = []
            unchanged: list[str] = []
            written = 0
            for doc_id, text, title, passages in docs:
                digest = sha(text)
                row = conn.execute(
                    "SELECT content_hash FROM documents WHERE doc_id = ? AND current = 1",
                    (doc_id,),
                ).fetchone()
                if row is not None and row[0] == digest:
                    unchanged.append(doc_id)
                    continue
                count = conn.execute(
                    "SELECT COUNT(*) FROM documents WHERE doc_id = ?", (doc_id,)
                ).fetchone()[0]
                version = f"v{count + 1}"
                conn.execute("UPDATE documents SET current = 0 WHERE doc_id = ?", (doc_id,))
                conn.execute(
                    "INSERT INTO documents (doc_id, version, content_hash, title, ingested_at,"
                    " current) VALUES (?, ?, ?, ?, ?, 1)",
                    (doc_id, version, digest, title, now),
                )
                conn.executemany(
                    "INSERT INTO passages (doc_id, version, ordinal, heading, text)"
                    " VALUES (?, ?, ?, ?, ?)",
                    [(doc_id, version, n, h, t) for n, (h, t) in enumerate(passages, start=1)],
                )
                written += len(passages)
                (updated if row is not None else added).append(doc_id)
            retired: list[str] = []
            if prune:
                seen = {d[0] for d in docs}
                for (doc_id,) in conn.execute(
                    "SELECT doc_id FROM documents WHERE current = 1"
                ).fetchall():
                    if doc_id not in seen:
                        retired.append(doc_id)
                conn.executemany(
                    "UPDATE documents SET current = 0 WHERE doc_id = ?", [(d,) for d in retired]
                )
            return IngestReport(
                added=tuple(added),
                updated=tuple(updated),
                unchanged=tuple(unchanged),
                retired=tuple(retired),
                passages=written,
            )

        return await self._db.run(lambda conn: transaction(conn, _ingest))

    # -- reading ----------------------------------------------------------------------------

    async def search(self, query: str, *, k: int = 5) -> list[Passage]:
        """The `k` best passages of current document versions for `query`, by BM25."""
        match = fts_query(query)
        if not match or k <= 0:
            return []

        def _search(conn: sqlite3.Connection) -> list[tuple[Any, ...]]:
            return conn.execute(
                "SELECT p.doc_id, p.version, d.content_hash, p.ordinal, p.heading, p.text,"
                " bm25(passages_fts) AS rank"
                " FROM passages_fts JOIN passages p ON p.passage_id = passages_fts.rowid"
                " JOIN documents d ON d.doc_id = p.doc_id AND d.version = p.version"
                " WHERE passages_fts MATCH ? AND d.current = 1"
                " ORDER BY rank LIMIT ?",
                (match, k),
            ).fetchall()

        return [
            Passage(
                id=f"{doc_id}#{ordinal}",
                doc_id=str(doc_id),
                version=str(version),
                content_hash=str(digest),
                heading=str(heading),
                text=str(text),
                score=-float(rank),
            )
            for doc_id, version, digest, ordinal, heading, text, rank in await self._db.run(_search)
        ]

    async def documents(self) -> list[tuple[str, str, str]]:
        """(doc_id, current version, title) of every current document."""

        def _docs(conn: sqlite3.Connection) -> list[tuple[str, str, str]]:
            return [
                (str(a), str(b), str(c))
                for a, b, c in conn.execute(
                    "SELECT doc_id, version, title FROM documents WHERE current = 1 ORDER BY doc_id"
                ).fetchall()
            ]

        return await self._db.run(_docs)

    def as_tool(self, *, name: str = "search_knowledge", k: int = 4) -> Tool:
        """A read-only tool the model can call to search the corpus."""
        return corpus_tool(self, name=name, k=k)


def format_passage(p: Passage) -> str:
    heading = f" — {p.heading}" if p.heading else ""
    return f"[{p.source}#{p.id.rpartition('#')[2]} {p.version}{heading}]\n{p.text}"


_WORD = re.compile(r"\w+", re.UNICODE)


def query_words(text: str) -> list[str]:
    """The distinct words of free text, lower-cased, in order."""
    return list(dict.fromkeys(w for w in _WORD.findall(text.lower()) if len(w) > 1))


def fts_query(text: str) -> str:
    """Free text as an FTS5 query: every word quoted (no operators can be smuggled), OR-ed."""
    return " OR ".join(f'"{w}"' for w in query_words(text))


class SearchableCorpus(Protocol):
    """What retrieval needs of a corpus, whichever database holds it."""

    name: str

    async def search(self, query: str, *, k: int = 5) -> list[Passage]: ...


def corpus_tool(corpus: SearchableCorpus, *, name: str, k: int) -> Tool:
    """A read-only tool the model can call to search a corpus."""

    async def search_knowledge(query: str) -> str:
        passages = await corpus.search(query, k=k)
        if not passages:
            return "No passage matches."
        return "\n\n".join(format_passage(p) for p in passages)

    return tool(
        name=name,
        description="Search the knowledge base; returns passages with source and version.",
    )(search_knowledge)


def open_corpus(location: str | Path, *, writable: bool = False) -> Corpus | PostgresCorpus:
    """A corpus in a SQLite file (a path) or in PostgreSQL (a `postgresql://` URL)."""
    if isinstance(location, str) and location.startswith(("postgresql://", "postgres://")):
        from contextos.context.corpus_postgres import PostgresCorpus

        return PostgresCorpus(location, writable=writable)
    return Corpus(location, writable=writable)


_HEADING = re.compile(r"^\s{0,3}#{1,6}\s+(.*?)\s*#*\s*$")


def split_passages(text: str, *, max_chars: int = 1200) -> list[tuple[str, str]]:
    """Split a document into (heading, passage) pairs along headings and paragraphs."""
    out: list[tuple[str, str]] = []
    heading = ""
    buf: list[str] = []

    def flush() -> None:
        body = "\n\n".join(buf).strip()
        if body:
            out.append((heading, body))
        buf.clear()

    for para in re.split(r"\n\s*\n", text):
        para = para.strip()
        if not para:
            continue
        first, _, rest = para.partition("\n")
        m = _HEADING.match(first)
        if m:
            flush()
            heading = m.group(1)
            para = rest.strip()
            if not para:
                continue
        while len(para) > max_chars:  # one huge paragraph still becomes bounded passages
            cut = para.rfind(" ", 0, max_chars)
            cut = cut if cut > 0 else max_chars
            flush()
            buf.append(para[:cut])
            flush()
            para = para[cut:].strip()
        if buf and sum(len(b) for b in buf) + len(para) > max_chars:
            flush()
        buf.append(para)
    flush()
    return out


def _read_docs(
    paths: list[str | Path], root: str | Path | None, max_chars: int
) -> list[tuple[str, str, str, list[tuple[str, str]]]]:
    base = Path(root).resolve() if root is not None else None
    docs = []
    for f in _collect(paths):
        text = f.read_text(encoding="utf-8")
        docs.append(
            (_doc_id(f, base), text, _title(text, f), split_passages(text, max_chars=max_chars))
        )
    return docs


def _collect(paths: Iterable[str | Path]) -> list[Path]:
    files: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            files.extend(
                sorted(f for f in p.rglob("*") if f.is_file() and f.suffix in TEXT_SUFFIXES)
            )
        elif p.is_file():
            files.append(p)
        else:
            raise ConfigError(f"no file or directory at {p}", path=str(p))
    return files


def _doc_id(f: Path, base: Path | None) -> str:
    resolved = f.resolve()
    if base is not None:
        try:
            return resolved.relative_to(base).as_posix()
        except ValueError:
            pass
    return f.name


def _title(text: str, f: Path) -> str:
    for line in text.splitlines():
        m = _HEADING.match(line)
        if m:
            return m.group(1)
    return f.stem
