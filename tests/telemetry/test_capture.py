"""Trace capture modes (metadata, redacted, hashes, full) and the GenAI client metrics.

The agent's PII layer keeps the customer's e-mail from the model; no trace carries it either,
wherever it appears (the user's input, a tool's result): a full trace shows the content as the
model saw it."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from contextos import Agent, Runtime
from contextos import events as ev
from contextos.errors import ConfigError
from contextos.middleware import PiiRedaction
from contextos.telemetry import record_metrics, span_json, spans_for
from contextos.testing import ScriptedModel, call_tool, reply

ROOT = Path(__file__).resolve().parents[2]
EMAIL = "jo@example.com"
ASK = f"Where is the order of {EMAIL}?"
Memory = tuple[TracerProvider, InMemorySpanExporter]


def customer(email: str) -> dict[str, str]:
    """Look a customer up by e-mail."""
    return {"email": email, "order": "A-1", "status": "shipped"}


def guarded(pii: bool = True) -> tuple[Agent, ScriptedModel]:
    model = ScriptedModel(
        [call_tool("customer", {"email": EMAIL}), reply("Order A-1 has shipped.")]
    )
    # PII redaction is a default guard: a run without it is one whose agent opts out of it
    opt_out = {} if pii else {"pii": "shows what a trace holds when no PII layer guarded it"}
    agent = Agent(name="support", model=model, tools=[customer], opt_out=opt_out)
    return agent, model


async def guarded_run(tmp_path: Path, pii: bool = True, **runtime: Any) -> list[ev.Event]:
    agent, model = guarded(pii)
    async with Runtime(str(tmp_path / ("c.db" if pii else "plain.db")), **runtime) as rt:
        done = await rt.run(agent, ASK)
        assert done.ok
        events = await rt.events(done.run_id)
    seen = json.dumps([[m.content for m in r.messages] for r in model.requests])
    assert (EMAIL in seen) is not pii  # the PII layer kept the e-mail from the model
    return events


def exported(events: list[ev.Event], mode: str) -> str:
    spans = spans_for(events, capture_content=mode, pii=PiiRedaction())
    return json.dumps([span_json(s) for s in spans])


async def test_no_trace_exports_what_the_pii_layer_removed(tmp_path: Path) -> None:
    events = await guarded_run(tmp_path)
    assert EMAIL in events[0].input  # the user's input is recorded as given
    full, redacted, hashes, metadata = (
        exported(events, mode) for mode in ("full", "redacted", "hashes", "metadata")
    )
    for mode, text in (
        ("full", full),
        ("redacted", redacted),
        ("hashes", hashes),
        ("metadata", metadata),
    ):
        assert EMAIL not in text, mode
    assert "[REDACTED:EMAIL]" in redacted and "gen_ai.tool.call.arguments" in redacted
    # full is the content as the model saw it: the input as the PII layer rewrote it
    assert "[REDACTED:EMAIL]" in full and '"contextos.capture.through_pii": true' in full
    assert "gen_ai.input.messages" not in metadata

    [root] = [s for s in spans_for(events, capture_content="hashes") if s.parent_id is None]
    [asked] = json.loads(str(root.attributes["gen_ai.input.messages"]))
    part = asked["parts"][0]
    assert part == {
        "type": "text",
        "content": "sha256:" + hashlib.sha256(ASK.encode()).hexdigest(),
        "seq": 1,
    }


async def test_full_exports_as_recorded_a_run_no_pii_layer_guarded(tmp_path: Path) -> None:
    events = await guarded_run(tmp_path, pii=False)
    assert EMAIL in exported(events, "full")  # what the model saw: for trusted collectors only
    assert EMAIL not in exported(events, "redacted")
    guarded_events = await guarded_run(tmp_path)
    with pytest.raises(ConfigError, match="pass pii=PiiRedaction"):
        spans_for(guarded_events, capture_content="full")  # no PII layer to show it through


@pytest.mark.parametrize("mode", ["redacted", "full"])
async def test_the_runtime_exports_live_in_the_mode_it_is_given(
    tmp_path: Path, memory: Memory, mode: str
) -> None:
    provider, exporter = memory
    await guarded_run(tmp_path, tracer_provider=provider, capture_content=mode)
    text = json.dumps([dict(s.attributes or {}) for s in exporter.get_finished_spans()])
    assert "[REDACTED:EMAIL]" in text and EMAIL not in text


async def test_an_unknown_mode_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    events = await guarded_run(tmp_path)
    with pytest.raises(ConfigError, match="unknown trace capture mode 'everything'"):
        spans_for(events, capture_content="everything")
    monkeypatch.setenv("CONTEXTOS_OTEL_CAPTURE_CONTENT", "redacted")
    assert EMAIL not in json.dumps([span_json(s) for s in spans_for(events, pii=PiiRedaction())])
    db = tmp_path / "c.db"
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "contextos",
            "trace",
            events[0].run_id,
            "--store",
            str(db),
            "--capture",
            "everything",
        ],
        cwd=ROOT,
        env={**os.environ, "NO_COLOR": "1", "COLUMNS": "200"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 1 and "use one of metadata, redacted, hashes, full" in out.stderr


def points(reader: InMemoryMetricReader) -> dict[str, list[Any]]:
    data = reader.get_metrics_data()
    assert data is not None
    return {
        m.name: list(m.data.data_points)
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
    }


async def test_model_calls_are_genai_metrics_live_and_after_the_fact(tmp_path: Path) -> None:
    live = InMemoryMetricReader()
    events = await guarded_run(tmp_path, meter_provider=MeterProvider(metric_readers=[live]))
    later = InMemoryMetricReader()
    assert record_metrics(events, MeterProvider(metric_readers=[later])) == 2
    for reader in (live, later):
        found = points(reader)
        tokens = {
            p.attributes["gen_ai.token.type"]: p.sum for p in found["gen_ai.client.token.usage"]
        }
        assert tokens == {"input": 20, "output": 10}  # two calls of 10 + 5
        [duration] = found["gen_ai.client.operation.duration"]
        assert duration.count == 2 and duration.attributes["gen_ai.operation.name"] == "chat"
        [cost] = found["contextos.client.cost"]
        assert cost.count == 2 and cost.attributes["gen_ai.request.model"] == "scripted"
