"""Span records into an OpenTelemetry tracer provider: after the fact, or live as events commit.

The SDK draws span ids at random; a run's spans must carry the ids derived from its events
(so a resumed run, a live export and a later export agree), so the tracer is handed the ids
one span at a time through its id generator.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from opentelemetry.sdk.trace.id_generator import IdGenerator
from opentelemetry.trace import SpanContext, SpanKind, StatusCode, TraceFlags

from contextos import events as ev
from contextos.runs import RunId
from contextos.store.base import EventStore
from contextos.telemetry._capture import Capture
from contextos.telemetry._metrics import Metrics
from contextos.telemetry._spans import METADATA, SpanRecord, build

log = logging.getLogger(__name__)

SCOPE = "contextos"
_KINDS = {"internal": SpanKind.INTERNAL, "client": SpanKind.CLIENT}
_LET_GO = (
    ev.RunCompleted,
    ev.RunFailed,
    ev.RunCancelled,
    ev.RunExpired,
    ev.InterruptRaised,
    ev.RunReleased,
)
_STATUS = {"unset": StatusCode.UNSET, "ok": StatusCode.OK, "error": StatusCode.ERROR}


class _GivenIds(IdGenerator):
    """Hands out the ids of the span about to start."""

    def __init__(self) -> None:
        self.trace_id = 0
        self.span_id = 0

    def generate_span_id(self) -> int:
        return self.span_id

    def generate_trace_id(self) -> int:
        return self.trace_id


def _ns(record_time: Any) -> int:
    return int(record_time.timestamp() * 1_000_000_000)


def emit(provider: trace.TracerProvider, spans: Sequence[SpanRecord]) -> None:
    """Start and end each span with its recorded times and ids on `provider`'s tracer."""
    tracer = provider.get_tracer(SCOPE)
    ids = _GivenIds()
    if hasattr(tracer, "id_generator"):  # the SDK's tracer; other providers draw their own ids
        tracer.id_generator = ids
    for record in spans:
        ids.trace_id, ids.span_id = record.trace_id, record.span_id
        parent = None
        if record.parent_id is not None:
            parent = trace.set_span_in_context(
                trace.NonRecordingSpan(
                    SpanContext(
                        record.trace_id,
                        record.parent_id,
                        is_remote=False,
                        trace_flags=TraceFlags(TraceFlags.SAMPLED),
                    )
                )
            )
        span = tracer.start_span(
            record.name,
            context=parent,
            kind=_KINDS[record.kind],
            attributes=dict(record.attributes),
            start_time=_ns(record.start),
        )
        for event in record.events:
            span.add_event(event.name, dict(event.attributes), timestamp=_ns(event.at))
        if record.status != "unset":
            span.set_status(_STATUS[record.status], record.status_description or None)
        span.end(end_time=_ns(record.end))


def export_events(
    provider: trace.TracerProvider, events: list[ev.Event], *, capture: Capture = METADATA
) -> list[SpanRecord]:
    """Export a recorded run's whole trace; returns the spans sent."""
    spans = build(events, capture=capture)
    emit(provider, spans)
    return spans


def otlp_provider(endpoint: str | None = None, *, batch: bool = False) -> TracerProvider:
    """A provider exporting over OTLP/HTTP: to `endpoint` (a base URL such as
    http://127.0.0.1:4318, or a full .../v1/traces URL), or where the OTEL_* env vars say."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    if endpoint is not None and not endpoint.rstrip("/").endswith("/v1/traces"):
        endpoint = endpoint.rstrip("/") + "/v1/traces"
    exporter = OTLPSpanExporter(endpoint=endpoint)
    provider = TracerProvider(resource=Resource.create({"service.name": "contextos"}))
    processor = BatchSpanProcessor(exporter) if batch else SimpleSpanProcessor(exporter)
    provider.add_span_processor(processor)
    return provider


class LiveTraces:
    """Emits each span of a run when the event that completes it is committed.

    A chat span completes with its `model_responded`, a tool span with its `tool_completed`,
    the run's span with the run's end: every span is emitted once, by whichever process
    committed that event, under the ids derived from the run.
    """

    def __init__(
        self,
        provider: trace.TracerProvider | None,
        *,
        capture: Capture,
        owned: bool,
        metrics: Metrics | None = None,
    ) -> None:
        self.provider = provider
        """None when only metrics are wanted."""
        self.capture = capture
        self.metrics = metrics
        self.owned = owned
        """True when this runtime made the provider (from the env) and so shuts it down."""
        self._logs: dict[RunId, list[ev.Event]] = {}

    async def committed(self, store: EventStore, run_id: RunId, events: Sequence[ev.Event]) -> None:
        """Call after `events` were appended to the run; never raises."""
        try:
            await self._committed(store, run_id, events)
        except Exception:  # a broken exporter must not break the run
            log.warning("could not export spans of run %s", run_id, exc_info=True)

    async def _committed(
        self, store: EventStore, run_id: RunId, events: Sequence[ev.Event]
    ) -> None:
        if not events:
            return
        if self.metrics is not None:
            self.metrics.record(events)
        if self.provider is None:
            return
        known = self._logs.get(run_id)
        if known is None or known[-1].seq + 1 != events[0].seq:
            known = await store.read(run_id)  # first sight of the run here, or a gap
        else:
            known.extend(events)
        seqs = {e.seq for e in events}
        spans = build(known, capture=self.capture)
        emit(self.provider, [s for s in spans if s.closed_by in seqs])
        if any(isinstance(e, _LET_GO) for e in events):
            self._logs.pop(run_id, None)  # not driven here any more: read again if it comes back
        else:
            self._logs[run_id] = known

    def close(self) -> None:
        if self.provider is None:
            return
        flush = getattr(self.provider, "force_flush", None)
        if self.owned:
            shutdown = getattr(self.provider, "shutdown", None)
            if shutdown is not None:
                shutdown()
        elif flush is not None:
            flush()
