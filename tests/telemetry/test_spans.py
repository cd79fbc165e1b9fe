"""A run's events as OpenTelemetry GenAI spans, exported live and after the fact."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from telemetry_agents import failing_agent, orders_agent

from contextos import Runtime
from contextos.middleware import PiiRedaction
from contextos.store import SqliteStore
from contextos.telemetry import export_run, trace_id_for

Memory = tuple[TracerProvider, InMemorySpanExporter]


async def run_live(tmp_path: Path, memory: Memory, **kwargs: object) -> tuple[str, list[object]]:
    provider, _ = memory
    async with Runtime(SqliteStore(tmp_path / "c.db"), tracer_provider=provider, **kwargs) as rt:  # type: ignore[arg-type]
        result = await rt.run(orders_agent(), "Where are A-1 and B-2?", run_id="run_orders")
        assert result.ok
        return result.run_id, list(await rt.events(result.run_id))


def by_name(spans: tuple[ReadableSpan, ...], prefix: str) -> list[ReadableSpan]:
    return [s for s in spans if s.name.startswith(prefix)]


async def test_a_run_with_tools_is_one_invoke_agent_span_with_chat_and_tool_children(
    tmp_path: Path, memory: Memory
) -> None:
    run_id, _ = await run_live(tmp_path, memory)
    spans = memory[1].get_finished_spans()
    [root] = by_name(spans, "invoke_agent")
    chats = by_name(spans, "chat ")
    tools = by_name(spans, "execute_tool ")
    assert root.name == "invoke_agent orders"
    assert len(chats) == 3 and len(tools) == 3 and len(spans) == 7
    assert sorted(t.name for t in tools) == [
        "execute_tool lookup",
        "execute_tool lookup",
        "execute_tool stock",
    ]
    assert root.parent is None
    assert root.context.trace_id == trace_id_for(run_id)
    for child in (*chats, *tools):
        assert child.context.trace_id == root.context.trace_id
        assert child.parent is not None and child.parent.span_id == root.context.span_id
    assert {c.kind for c in chats} == {SpanKind.CLIENT}
    assert {t.kind for t in tools} == {SpanKind.INTERNAL}

    a = root.attributes or {}
    assert a["gen_ai.operation.name"] == "invoke_agent"
    assert a["gen_ai.agent.name"] == "orders" and a["gen_ai.agent.version"] == "2"
    assert a["gen_ai.agent.id"]
    assert a["gen_ai.conversation.id"] == run_id
    assert a["contextos.run.status"] == "completed"
    assert a["gen_ai.usage.input_tokens"] == 10 + 10 + 40
    assert root.status.status_code is StatusCode.OK

    last = max(chats, key=lambda s: s.start_time or 0)
    c = last.attributes or {}
    assert c["gen_ai.operation.name"] == "chat"
    assert c["gen_ai.provider.name"] == "scripted"
    assert c["gen_ai.request.model"] == c["gen_ai.response.model"] == "scripted"
    assert tuple(c["gen_ai.response.finish_reasons"]) == ("stop",)  # type: ignore[arg-type]
    assert (c["gen_ai.usage.input_tokens"], c["gen_ai.usage.output_tokens"]) == (40, 9)
    assert str(c["contextos.context.hash"])

    t = {(s.attributes or {})["gen_ai.tool.call.id"]: s for s in tools}
    assert set(t) == {"call_1_0", "call_2_0", "call_2_1"}
    stock = t["call_2_0"].attributes or {}
    assert stock["gen_ai.operation.name"] == "execute_tool"
    assert stock["gen_ai.tool.name"] == "stock"
    assert t["call_2_0"].status.status_code is StatusCode.UNSET
    # chat spans and tool spans alternate in time as the run did
    order = sorted((*chats, *tools), key=lambda s: s.start_time or 0)
    assert [s.name.split()[0] for s in order] == [
        "chat",
        "execute_tool",
        "chat",
        "execute_tool",
        "execute_tool",
        "chat",
    ]


async def test_a_tool_error_sets_error_status(tmp_path: Path, memory: Memory) -> None:
    provider, exporter = memory
    async with Runtime(SqliteStore(tmp_path / "c.db"), tracer_provider=provider) as rt:
        await rt.run(failing_agent(), "charge me")
    [span] = by_name(exporter.get_finished_spans(), "execute_tool ")
    assert span.name == "execute_tool charge"
    assert span.status.status_code is StatusCode.ERROR
    assert "card declined" in (span.status.description or "")
    assert (span.attributes or {})["error.type"]


def content_of(spans: tuple[ReadableSpan, ...]) -> str:
    return json.dumps([dict(s.attributes or {}) for s in spans], default=str)


async def test_message_content_only_when_opted_in(
    tmp_path: Path, memory: Memory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CONTEXTOS_OTEL_CAPTURE_CONTENT", raising=False)
    _, events = await run_live(tmp_path, memory)
    plain = content_of(memory[1].get_finished_spans())
    assert "SECRET-ANSWER" not in plain and "A-1" not in plain
    assert "gen_ai.input.messages" not in plain and "gen_ai.tool.call.arguments" not in plain

    provider, exporter = memory
    exporter.clear()
    # the run went through the default PII layer: a full trace shows it through that layer
    export_run(events, provider, capture_content=True, pii=PiiRedaction())  # type: ignore[arg-type]
    spans = exporter.get_finished_spans()
    [root] = by_name(spans, "invoke_agent")
    assert "SECRET-ANSWER" in str((root.attributes or {})["gen_ai.output.messages"])
    assert "Where are A-1" in str((root.attributes or {})["gen_ai.input.messages"])
    args = {str((s.attributes or {}).get("gen_ai.tool.call.arguments")) for s in spans}
    assert '{"sku": "SKU-9"}' in args
    assert any("shipped" in str((s.attributes or {}).get("gen_ai.tool.call.result")) for s in spans)

    exporter.clear()
    monkeypatch.setenv("CONTEXTOS_OTEL_CAPTURE_CONTENT", "true")
    export_run(events, provider, pii=PiiRedaction())  # type: ignore[arg-type]
    assert "SECRET-ANSWER" in content_of(exporter.get_finished_spans())


def identity(spans: tuple[ReadableSpan, ...]) -> list[tuple[str, int, int, int | None]]:
    return sorted(
        (s.name, s.context.trace_id, s.context.span_id, s.parent.span_id if s.parent else None)
        for s in spans
    )


async def test_live_and_after_the_fact_export_give_the_same_spans(
    tmp_path: Path, memory: Memory
) -> None:
    _, events = await run_live(tmp_path, memory)
    live = identity(memory[1].get_finished_spans())
    later_exporter = InMemorySpanExporter()
    later = TracerProvider()
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    later.add_span_processor(SimpleSpanProcessor(later_exporter))
    export_run(events, later)  # type: ignore[arg-type]
    assert identity(later_exporter.get_finished_spans()) == live
    assert len(live) == 7
    assert len({span_id for _, _, span_id, _ in live}) == 7
