"""Traces of runs as OpenTelemetry spans with the GenAI semantic conventions.

Built from the recorded events, so a run exported live and the same run exported later (even
after it crashed and resumed in another process) give one trace with the same ids. Needs the
`otel` extra; importing this package does not.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from contextos.errors import ConfigError
from contextos.telemetry._capture import CAPTURE_ENV, Capture, CaptureMode, Redactor, capture_mode
from contextos.telemetry._ids import trace_id_for
from contextos.telemetry._render import span_json, span_tree
from contextos.telemetry.timeline import TimelineEntry, timeline

if TYPE_CHECKING:
    from rich.tree import Tree

    from contextos import events as ev
    from contextos.telemetry._export import LiveTraces
    from contextos.telemetry._spans import SpanRecord

INSTALL_HINT = "traces need OpenTelemetry: pip install 'contextos[otel]'"


def _require() -> None:
    try:
        import opentelemetry.sdk.trace
        import opentelemetry.semconv._incubating.attributes.gen_ai_attributes  # noqa: F401
    except ImportError as exc:
        raise ConfigError(INSTALL_HINT) from exc


Content = CaptureMode | str | bool | None
"""A capture mode (`metadata`, `redacted`, `hashes`, `full`), True for full, False for
metadata, or None for CONTEXTOS_OTEL_CAPTURE_CONTENT (metadata when unset)."""


@dataclass(frozen=True, slots=True)
class Trace:
    """A run's trace: its spans, children first and the run's `invoke_agent` span last."""

    spans: tuple[SpanRecord, ...]
    """The spans, as OpenTelemetry records them."""

    def tree(self) -> Tree:
        """The run's span with its children in start order, for a terminal."""
        return span_tree(list(self.spans))

    def to_json(self) -> list[dict[str, Any]]:
        """The spans as JSON data, ids in hex as OTLP shows them."""
        return [span_json(s) for s in self.spans]


def trace_of(
    events: Sequence[ev.Event],
    *,
    capture_content: Content = None,
    pii: Redactor | None = None,
    otlp_endpoint: str | None = None,
) -> Trace:
    """A recorded run's trace; sent over OTLP/HTTP too when `otlp_endpoint` is given."""
    if otlp_endpoint is not None:
        spans = export_run(
            list(events), otlp_endpoint=otlp_endpoint, capture_content=capture_content, pii=pii
        )
    else:
        spans = spans_for(list(events), capture_content=capture_content, pii=pii)
    return Trace(tuple(spans))


def spans_for(
    events: list[ev.Event], *, capture_content: Content = None, pii: Redactor | None = None
) -> list[SpanRecord]:
    """The run's spans (children first, the run's `invoke_agent` span last), with content as
    `capture_content` says; `redacted` goes through `pii` (the PII layer, e.g. `PiiRedaction`)."""
    _require()
    from contextos.telemetry._spans import build

    return build(events, capture=Capture.of(capture_content, pii))


def export_run(
    events: list[ev.Event],
    tracer_provider: Any = None,
    *,
    otlp_endpoint: str | None = None,
    capture_content: Content = None,
    pii: Redactor | None = None,
    meter_provider: Any = None,
) -> list[SpanRecord]:
    """Export a recorded run's trace to `tracer_provider`, or over OTLP/HTTP to `otlp_endpoint`
    (or where OTEL_EXPORTER_OTLP_ENDPOINT says); returns the spans sent. With
    `meter_provider`, its model calls' GenAI metrics are recorded there too."""
    _require()
    from contextos.telemetry._export import export_events, otlp_provider

    capture = Capture.of(capture_content, pii)
    if meter_provider is not None:
        record_metrics(events, meter_provider)
    if tracer_provider is not None:
        return export_events(tracer_provider, events, capture=capture)
    provider = otlp_provider(otlp_endpoint)
    try:
        return export_events(provider, events, capture=capture)
    finally:
        provider.shutdown()


def record_metrics(events: list[ev.Event], meter_provider: Any) -> int:
    """Record the GenAI client metrics of a recorded run's model calls (token usage,
    operation duration, cost) on `meter_provider`; returns how many calls there were."""
    _require()
    from contextos.telemetry._metrics import Metrics

    return Metrics(meter_provider).record(events)


def live_traces(
    tracer_provider: Any = None,
    capture_content: Content = None,
    meter_provider: Any = None,
    pii: Redactor | None = None,
) -> LiveTraces | None:
    """The runtime's live exporter: spans for `tracer_provider`, or an OTLP one when the env
    sets OTEL_EXPORTER_OTLP_ENDPOINT (or ..._TRACES_ENDPOINT), and GenAI metrics for
    `meter_provider`; None when none is given."""
    env = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or os.environ.get(
        "OTEL_EXPORTER_OTLP_ENDPOINT"
    )
    if tracer_provider is None and meter_provider is None and not env:
        return None
    _require()
    from contextos.telemetry._export import LiveTraces, otlp_provider
    from contextos.telemetry._metrics import Metrics

    capture = Capture.of(capture_content, pii)
    metrics = Metrics(meter_provider) if meter_provider is not None else None
    if tracer_provider is not None or not env:
        return LiveTraces(tracer_provider, capture=capture, owned=False, metrics=metrics)
    return LiveTraces(otlp_provider(batch=True), capture=capture, owned=True, metrics=metrics)


__all__ = [
    "CAPTURE_ENV",
    "INSTALL_HINT",
    "Capture",
    "CaptureMode",
    "Content",
    "Redactor",
    "TimelineEntry",
    "Trace",
    "capture_mode",
    "export_run",
    "live_traces",
    "record_metrics",
    "span_json",
    "span_tree",
    "spans_for",
    "timeline",
    "trace_id_for",
    "trace_of",
]
