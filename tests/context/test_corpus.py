"""The knowledge corpus: ingest from files, versions, BM25 search with lineage, read-only."""

from __future__ import annotations

from pathlib import Path

import pytest

from contextos import Agent, ConfigError, Runtime
from contextos import events as ev
from contextos.context import Corpus, open_corpus
from contextos.middleware import Retrieval, Sanitizer
from contextos.testing import ScriptedModel, reply


@pytest.fixture(params=["sqlite", "postgres"])
def corpus_at(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Where the corpus lives: a SQLite file, then a fresh PostgreSQL schema."""
    if request.param == "sqlite":
        return str(tmp_path / "kb.db")
    url: str = request.getfixturevalue("postgres_url")
    return url


async def test_ingest_search_and_versions(tmp_path: Path, corpus_at: str) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "refunds.md").write_text(
        "# Refunds\n\nRefunds are paid within 14 days to the original card.\n\n"
        "# Exchanges\n\nExchanges need the receipt."
    )
    (docs / "shipping.txt").write_text("Parcels ship from Rotterdam on weekdays.")
    async with open_corpus(corpus_at, writable=True) as kb:
        report = await kb.ingest([docs], root=docs)
        assert sorted(report.added) == ["refunds.md", "shipping.txt"]
        hits = await kb.search("how many days until my refund is paid?")
        assert hits[0].doc_id == "refunds.md" and hits[0].version == "v1"
        assert hits[0].heading == "Refunds" and "14 days" in hits[0].text
        # Unchanged files are not versioned again; changed ones are, and only the new one is found.
        again = await kb.ingest([docs], root=docs)
        assert sorted(again.unchanged) == ["refunds.md", "shipping.txt"]
        (docs / "refunds.md").write_text("# Refunds\n\nRefunds are paid within 30 days.")
        changed = await kb.ingest([docs], root=docs)
        assert changed.updated == ("refunds.md",)
        hits = await kb.search("refund days")
        assert [(h.doc_id, h.version) for h in hits] == [("refunds.md", "v2")]
        assert "30 days" in hits[0].text
        assert await kb.search('" OR 1=1 --') == []  # operators cannot be smuggled in


async def test_runs_open_the_corpus_read_only(tmp_path: Path, corpus_at: str) -> None:
    (tmp_path / "a.md").write_text("alpha beta")
    async with open_corpus(corpus_at, writable=True) as kb:
        await kb.ingest([tmp_path / "a.md"])
    async with open_corpus(corpus_at) as ro:
        assert [p.doc_id for p in await ro.search("alpha")] == ["a.md"]
        with pytest.raises(ConfigError):
            await ro.ingest([tmp_path / "a.md"])


async def test_retrieved_passages_carry_lineage_and_are_spotlighted(tmp_path: Path) -> None:
    (tmp_path / "policy.md").write_text("# Returns\n\nReturns are free within 30 days.")
    async with Corpus(tmp_path / "kb.db", writable=True) as kb:
        await kb.ingest([tmp_path / "policy.md"], root=tmp_path)
    corpus = Corpus(tmp_path / "kb.db")
    model = ScriptedModel([reply("Free within 30 days.")])
    agent = Agent(name="a", model=model, middleware=[Sanitizer(), Retrieval(corpus, k=2)])
    async with Runtime(str(tmp_path / "r.db")) as rt:
        result = await rt.run(agent, "are returns free?")
        events = await rt.events(result.run_id)
    await corpus.close()
    tail = model.requests[0].messages[-1].content  # volatile items go last
    assert tail.startswith('<<untrusted-data source="corpus:policy.md"')
    assert "Returns are free within 30 days." in tail
    responded = next(e for e in events if isinstance(e, ev.ModelResponded))
    row = next(r for r in responded.context["manifest"] if r["type"] == "retrieved_passage")
    assert (row["source"], row["version"], row["trust"]) == ("corpus:policy.md", "v1", "untrusted")
    assert row["why"].startswith("BM25 match")
