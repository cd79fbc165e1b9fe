"""The knowledge corpus: shared, read-only at run time, versioned, searched full-text.

Documents are ingested from files into passages; re-ingesting a changed file adds a new version
and retires the old one (kept for lineage of past runs). Search ranks passages of current
versions and returns them with the source and version a context manifest records. Runs open
the corpus read-only: retrieval can never change it. This module holds the logic and the shared
SQL; `corpus_sqlite` and `corpus_postgres` hold each database's full-text search and plumbing.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, ClassVar, Protocol, Self, TypeVar

from contextos.context.compiled import sha
from contextos.errors import ConfigError
from contextos.store.statements import Dialect, Op, Start, all_rows
from contextos.tools.contract import Tool, tool

T = TypeVar("T")

DOCUMENTS_TABLE = """
CREATE TABLE IF NOT EXISTS {documents} (
    doc_id TEXT NOT NULL,
    version TEXT NOT NULL,
    content_hash TEXT NOT NULL,
    title TEXT NOT NULL,
    ingested_at {time} NOT NULL,
    current {flag} NOT NULL,
    PRIMARY KEY (doc_id, version)
);
"""
"""Every backend's table of document versions, given its name and its time and flag types."""

# The statements every backend shares; `{documents}` and `{passages}` are its tables.
_CURRENT_HASH = "SELECT content_hash FROM {documents} WHERE doc_id = :doc_id AND current"
_VERSIONS = "SELECT count(*) FROM {documents} WHERE doc_id = :doc_id"
_RETIRE = "UPDATE {documents} SET current = FALSE WHERE doc_id = :doc_id"
_ADD_DOCUMENT = """
INSERT INTO {documents} (doc_id, version, content_hash, title, ingested_at, current)
VALUES (:doc_id, :version, :content_hash, :title, :ingested_at, TRUE)
"""
_ADD_PASSAGE = """
INSERT INTO {passages} (doc_id, version, ordinal, heading, text)
VALUES (:doc_id, :version, :ordinal, :heading, :text)
"""
_CURRENT_DOCUMENTS = "SELECT doc_id FROM {documents} WHERE current"
_DOCUMENTS = "SELECT doc_id, version, title FROM {documents} WHERE current ORDER BY doc_id"

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
    """Full-text relevance (higher is better): BM25 on SQLite, `ts_rank_cd` on PostgreSQL."""

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


class SqlCorpus:
    """A knowledge corpus in a database; its backend's subclass supplies the hooks below.

    Read-only unless opened with `writable=True`.
    """

    _DIALECT: ClassVar[Dialect]
    """How the backend writes the statements; it names the `documents` and `passages` tables."""

    _INGEST_LOCK: ClassVar[str | None] = None
    """Taken first by an ingest so that two do not count the same versions (None: the
    backend's write transactions run one at a time anyway)."""

    name: str
    """What retrieval calls this corpus."""

    def __init__(self, *, writable: bool, where: str) -> None:
        self.writable = writable
        self._where = where

    async def _execute(self, start: Start[T], *, atomic: bool = False) -> T:
        """Run an operation (`start` begins it afresh); `atomic`: in one write transaction."""
        raise NotImplementedError

    def _search(self, words: list[str], k: int) -> tuple[str, dict[str, Any]]:
        """The full-text search for passages matching any of `words` (none can act as an
        operator), best first: doc_id, version, content_hash, ordinal, heading, text, score."""
        raise NotImplementedError

    def _stored(self, at: datetime) -> Any:
        """A time as the backend stores it."""
        raise NotImplementedError

    async def close(self) -> None:
        """Close the corpus's connection."""
        raise NotImplementedError

    async def __aenter__(self) -> Self:
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
            raise ConfigError(f"{self._where} is open read-only; open it with writable=True")
        docs = await asyncio.to_thread(_read_docs, list(paths), root, max_chars)
        now = self._stored(datetime.now(UTC))

        def op() -> Op[IngestReport]:
            if self._INGEST_LOCK is not None:
                yield self._INGEST_LOCK, {}
            added: list[str] = []
            updated: list[str] = []
            unchanged: list[str] = []
            written = 0
            for doc_id, text, title, passages in docs:
                digest = sha(text)
                current = yield _CURRENT_HASH, {"doc_id": doc_id}
                if current.row is not None and current.row[0] == digest:
                    unchanged.append(doc_id)
                    continue
                versions = yield _VERSIONS, {"doc_id": doc_id}
                version = f"v{versions.row[0] + 1}"
                yield _RETIRE, {"doc_id": doc_id}
                yield (
                    _ADD_DOCUMENT,
                    {
                        "doc_id": doc_id,
                        "version": version,
                        "content_hash": digest,
                        "title": title,
                        "ingested_at": now,
                    },
                )
                if passages:
                    yield (
                        _ADD_PASSAGE,
                        [
                            {
                                "doc_id": doc_id,
                                "version": version,
                                "ordinal": n,
                                "heading": h,
                                "text": t,
                            }
                            for n, (h, t) in enumerate(passages, start=1)
                        ],
                    )
                written += len(passages)
                (updated if current.row is not None else added).append(doc_id)
            retired: list[str] = []
            if prune:
                seen = {d[0] for d in docs}
                current = yield _CURRENT_DOCUMENTS, {}
                retired = [str(doc_id) for (doc_id,) in current.rows if doc_id not in seen]
                if retired:
                    yield _RETIRE, [{"doc_id": doc_id} for doc_id in retired]
            return IngestReport(
                added=tuple(added),
                updated=tuple(updated),
                unchanged=tuple(unchanged),
                retired=tuple(retired),
                passages=written,
            )

        return await self._execute(op, atomic=True)

    # -- reading ----------------------------------------------------------------------------

    async def search(self, query: str, *, k: int = 5) -> list[Passage]:
        """The `k` best passages of current document versions for `query`."""
        words = query_words(query)
        if not words or k <= 0:
            return []
        statement, params = self._search(words, k)
        return [
            Passage(
                id=f"{doc_id}#{ordinal}",
                doc_id=str(doc_id),
                version=str(version),
                content_hash=str(digest),
                heading=str(heading),
                text=str(text),
                score=float(score),
            )
            for doc_id, version, digest, ordinal, heading, text, score in await self._execute(
                lambda: all_rows(statement, params)
            )
        ]

    async def documents(self) -> list[tuple[str, str, str]]:
        """(doc_id, current version, title) of every current document."""
        rows = await self._execute(lambda: all_rows(_DOCUMENTS, {}))
        return [(str(a), str(b), str(c)) for a, b, c in rows]

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
