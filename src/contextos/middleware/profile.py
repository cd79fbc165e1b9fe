"""Profile injection: a bounded block of what long-term memory knows about the current user.

Facts are read for the run's subject only: the tenant and id of the principal bound to the run,
never labels the caller passed, and a run bound to no one fails closed. They are cached per
subject and go at the volatile tail of the context. Any failure to read them leaves the turn
generic but working (fail-open). Telemetry is counts only: how many facts, how many tokens,
cache hits, errors, never the facts themselves.

Writes are off unless `writes=True`: the model may then call `remember(fact)` during a run, and
when the run completes those facts (redacted by the PII layer) are written to the subject's
memory, each tagged with the run and event it came from so a second write adds nothing.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from contextos import events as ev
from contextos.context.compiled import ContextItem, ItemType, TrustClass, sha
from contextos.context.memory import Fact, MemoryStore, NewFact, Subject
from contextos.middleware.base import (
    BaseMiddleware,
    ModelCall,
    ModelHandler,
    ModelResult,
    RunEnd,
    Stop,
)
from contextos.runs import FailureReason, RunStatus
from contextos.tools.contract import Tool, tool

HEADER = "About the current user, from long-term memory (may be out of date):"


class Profile(BaseMiddleware):
    """Injects the subject's remembered facts; optionally lets the model add new ones."""

    name = "profile"
    platform_slot = 6
    needs_principal = True
    """Memory belongs to the run's bound principal; a run bound to no one fails closed."""

    def __init__(
        self,
        memory: MemoryStore,
        *,
        max_facts: int = 20,
        max_tokens: int = 400,
        cache_ttl_s: float = 300.0,
        writes: bool = False,
        tool_name: str = "remember",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.memory = memory
        self.max_facts = max_facts
        self.max_tokens = max_tokens
        self.cache_ttl_s = cache_ttl_s
        self.writes = writes
        self.tool_name = tool_name
        self.clock = clock
        self.stats: Counter[str] = Counter()
        """Counts over the layer's life (reads, cache hits, errors, writes)."""
        self._cache: dict[Subject, tuple[float, list[Fact]]] = {}
        self._tool = self._make_tool()

    def fingerprint(self) -> dict[str, Any]:
        return {
            "max_facts": self.max_facts,
            "max_tokens": self.max_tokens,
            "writes": self.writes,
            "tool": self.tool_name if self.writes else None,
        }

    def tools(self) -> tuple[Tool, ...]:
        return (self._tool,) if self.writes else ()

    def invalidate(self, subject: Subject) -> None:
        self._cache.pop(subject, None)

    async def facts(self, subject: Subject) -> tuple[list[Fact], bool]:
        """The subject's facts and whether they came from the cache."""
        cached = self._cache.get(subject)
        now = self.clock()
        if cached is not None and cached[0] > now:
            return cached[1], True
        facts = await self.memory.recall(subject, limit=self.max_facts)
        self._cache[subject] = (now + self.cache_ttl_s, facts)
        return facts, False

    def block(self, facts: list[Fact]) -> tuple[list[ContextItem], int]:
        """Items for the facts that fit the bounds, and how many were left out."""
        items: list[ContextItem] = []
        used = 0
        for f in facts[: self.max_facts]:
            item = ContextItem(
                id=f"memory:{f.id}",
                type=ItemType.MEMORY_FACT,
                content=f"- {f.text}",
                source=f.source,
                version=sha(f.text)[:12],
                trust=TrustClass.USER,
                why="long-term memory about the current user",
                volatile=True,
            )
            if used + item.tokens > self.max_tokens:
                break
            items.append(item)
            used += item.tokens
        if items:
            header = ContextItem(
                id="memory:header",
                type=ItemType.MEMORY_FACT,
                content=HEADER,
                source="platform:profile",
                version=sha(HEADER)[:12],
                trust=TrustClass.PLATFORM,
                why="introduces the user's facts",
                volatile=True,
            )
            items.insert(0, header)
        return items, len(facts) - (len(items) - 1 if items else 0)

    async def wrap_model_call(self, call: ModelCall, call_next: ModelHandler) -> ModelResult:
        subject = call.run.subject
        if subject is None:
            return ModelResult(
                call=call,
                stop=Stop(
                    reason=FailureReason.MISSING_PRINCIPAL,
                    message="memory belongs to a tenant's user and this run has no principal "
                    "bound: start it with principal= or context=",
                    layer=self.name,
                ),
            )
        try:
            facts, hit = await self.facts(subject)
            items, dropped = self.block(facts)
        except Exception:  # fail-open: a generic turn beats no turn
            self.stats["errors"] += 1
            result = await call_next(call)
            return result.with_telemetry(**{"profile.errors": 1})
        self.stats["cache_hits" if hit else "reads"] += 1
        result = await call_next(call.with_context(call.context.add(*items)))
        return result.with_telemetry(
            **{
                "profile.facts": max(len(items) - 1, 0),
                "profile.tokens": sum(i.tokens for i in items),
                "profile.dropped": dropped,
                "profile.cache_hit": int(hit),
            }
        )

    async def after_run(self, end: RunEnd) -> None:
        subject = end.run.subject
        if not self.writes or subject is None or end.status is not RunStatus.COMPLETED:
            return
        facts = [
            NewFact(text=end.redact(text), run_id=end.run.run_id, seq=seq)
            for text, seq in remembered(end.events, self.tool_name)
        ]
        if not facts:
            return
        try:
            self.stats["written"] += await self.memory.remember(subject, facts)
        except Exception:  # the run already completed; a lost write must not undo that
            self.stats["write_errors"] += 1
        self.invalidate(subject)

    def _make_tool(self) -> Tool:
        def remember(fact: str) -> str:
            if not fact.strip():
                raise ValueError("a fact needs some text")
            return "Noted: it will be saved to the user's long-term memory after this turn."

        return tool(
            name=self.tool_name,
            description=(
                "Remember a lasting fact or preference about the current user for future "
                "conversations (one short sentence)."
            ),
        )(remember)


def remembered(events: tuple[ev.Event, ...], tool_name: str) -> list[tuple[str, int]]:
    """(fact, seq of the tool result) for every successful call of the remember tool."""
    asked: dict[str, str] = {}
    out: list[tuple[str, int]] = []
    for e in events:
        if isinstance(e, ev.ModelResponded):
            for c in e.message.tool_calls:
                if c.name == tool_name:
                    asked[c.id] = c.arguments
        elif isinstance(e, ev.ToolCompleted) and e.call_id in asked and not e.is_error:
            # parsed only once it succeeded, so past the gateway's size and depth limits
            args = json.loads(asked.pop(e.call_id) or "{}")
            if isinstance(args, dict) and isinstance(args.get("fact"), str):
                out.append((args["fact"], e.seq))
    return out
