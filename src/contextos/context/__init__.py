"""Context: the compiled context with lineage, long-term memory, and the knowledge corpus."""

from pathlib import Path

from contextos.context.compiled import (
    CompiledContext,
    ContextItem,
    Entry,
    ItemType,
    TrustClass,
    compile_context,
    estimate_tokens,
    manifest_table,
)
from contextos.context.corpus import IngestReport, Passage
from contextos.context.corpus_postgres import PostgresCorpus
from contextos.context.corpus_sqlite import Corpus
from contextos.context.memory import Fact, MemoryStore, NewFact, SqliteMemory, Subject


def open_corpus(location: str | Path, *, writable: bool = False) -> Corpus | PostgresCorpus:
    """A corpus in a SQLite file (a path) or in PostgreSQL (a `postgresql://` URL)."""
    if isinstance(location, str) and location.startswith(("postgresql://", "postgres://")):
        return PostgresCorpus(location, writable=writable)
    return Corpus(location, writable=writable)


__all__ = [
    "CompiledContext",
    "ContextItem",
    "Corpus",
    "Entry",
    "Fact",
    "IngestReport",
    "ItemType",
    "MemoryStore",
    "NewFact",
    "Passage",
    "SqliteMemory",
    "Subject",
    "TrustClass",
    "compile_context",
    "estimate_tokens",
    "manifest_table",
    "open_corpus",
]
