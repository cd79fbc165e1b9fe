"""Context: the compiled context with lineage, long-term memory, and the knowledge corpus."""

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
from contextos.context.corpus import Corpus, IngestReport, Passage, open_corpus
from contextos.context.memory import Fact, MemoryStore, NewFact, SqliteMemory, Subject, subject_from

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
    "subject_from",
]
