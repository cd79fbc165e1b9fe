"""The daily usage counters a store keeps only ever grow, whatever usage an event carries (an
event written by code that did not check a provider's numbers cannot credit a principal)."""

from __future__ import annotations

from datetime import UTC, datetime

from contextos import events as ev
from contextos.messages import FinishReason, Message, Usage
from contextos.runs import RunId
from contextos.store import open_store

T0 = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)


def answer(seq: int, usage: Usage) -> ev.ModelResponded:
    return ev.ModelResponded(
        run_id=RunId("r1"),
        seq=seq,
        message=Message(role="assistant", content="ok"),
        finish_reason=FinishReason.STOP,
        usage=usage,
        model="m",
        occurred_at=T0,
    )


async def test_negative_usage_in_an_event_does_not_lower_the_daily_row(backend_url: str) -> None:
    store = open_store(backend_url)
    try:
        created = ev.RunCreated(
            run_id=RunId("r1"),
            seq=1,
            agent_name="clerk",
            agent_version="1",
            agent_hash="h",
            input="x",
            metadata={"principal": "acme/ann"},
            occurred_at=T0,
        )
        good = answer(2, Usage(input_tokens=600, output_tokens=40, cost_usd=0.5, requests=1))
        await store.append(RunId("r1"), [created, good], expected_seq=0)
        before = await store.daily_usage("acme/ann", "2026-03-01")  # type: ignore[attr-defined]
        credit = Usage(input_tokens=-30_000_000, output_tokens=-5, cost_usd=-60_000.0, requests=1)
        await store.append(RunId("r1"), [answer(3, credit)], expected_seq=2)
        after = await store.daily_usage("acme/ann", "2026-03-01")  # type: ignore[attr-defined]
    finally:
        await store.close()
    assert before == (640, 1, 0.5)
    assert after == (640, 2, 0.5)  # the call is counted; its "credit" is not
