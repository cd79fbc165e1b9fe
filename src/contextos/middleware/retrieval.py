"""Retrieval from the knowledge corpus into the context, as a domain layer.

It adds the best passages for the latest user message as untrusted, volatile items; being a
domain layer it runs inside the platform stack, so the passages are redacted and spotlighted
like any tool output before the model sees them.
"""

from __future__ import annotations

from typing import Any

from contextos.context.compiled import ContextItem, ItemType, TrustClass
from contextos.context.corpus import SearchableCorpus, format_passage
from contextos.middleware.base import BaseMiddleware, ModelCall, ModelHandler, ModelResult


class Retrieval(BaseMiddleware):
    """Adds the top `k` corpus passages for the latest user message."""

    name = "retrieval"

    def __init__(self, corpus: SearchableCorpus, *, k: int = 3, max_tokens: int = 1_500) -> None:
        self.corpus = corpus
        self.k = k
        self.max_tokens = max_tokens

    def fingerprint(self) -> dict[str, Any]:
        return {"corpus": self.corpus.name, "k": self.k, "max_tokens": self.max_tokens}

    async def wrap_model_call(self, call: ModelCall, call_next: ModelHandler) -> ModelResult:
        query = next(
            (e.message.content for e in reversed(call.context.history) if e.message.role == "user"),
            "",
        )
        try:
            passages = await self.corpus.search(query, k=self.k) if query else []
        except Exception:  # no corpus, no passages: the turn goes on without them
            result = await call_next(call)
            return result.with_telemetry(**{"retrieval.errors": 1})
        items: list[ContextItem] = []
        used = 0
        for p in passages:
            item = ContextItem(
                id=f"passage:{p.id}",
                type=ItemType.RETRIEVED_PASSAGE,
                content=format_passage(p),
                source=p.source,
                version=p.version,
                trust=TrustClass.UNTRUSTED,
                why=f"BM25 match for the latest user message (score {p.score:.2f})",
                volatile=True,
            )
            if used + item.tokens > self.max_tokens:
                break
            items.append(item)
            used += item.tokens
        result = await call_next(call.with_context(call.context.add(*items)))
        return result.with_telemetry(**{"retrieval.passages": len(items)})
