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
    capture_content: bool | None = None,
    otlp_endpoint: str | None = None,
) -> Trace:
    """A recorded run's trace; sent over OTLP/HTTP too when `otlp_endpoint` is given."""
    if otlp_endpoint is not None:
        spans = export_run(
            list(events), otlp_endpoint=otlp_endpoint, capture_content=capture_content
        )
    else:
        spans = spans_for(list(events), capture_content=capture_content)
    return Trace(tuple(spans))


def spans_for(events: list[ev.Event], *, capture_content: bool | None = None) -> list[SpanRecord]:
    """The run's spans (children first, the run's `invoke_agent` span last); message content
    only with `capture_content` (default: CONTEXTOS_OTEL_CAPTURE_CONTENT)."""
    _require()
    from contextos.telemetry._export import capture_from_env
    from contextos.telemetry._spans import build

    capture = capture_from_env() if capture_content is None else capture_content
    return build(events, capture_content=capture)


def export_run(
    events: list[ev.Event],
    tracer_provider: Any = None,
    *,
    otlp_endpoint: str | None = None,
    capture_content: bool | None = None,
) -> list[SpanRecord]:
    """Export a recorded run's trace to `tracer_provider`, or over OTLP/HTTP to `otlp_endpoint`
    (or where OTEL_EXPORTER_OTLP_ENDPOINT says); returns the spans sent."""
    _require()
    from contextos.telemetry._export import capture_from_env, export_events, otlp_provider

    capture = capture_from_env() if capture_content is None else capture_content
    if tracer_provider is not None:
        return export_events(tracer_provider, events, capture_content=capture)
    provider = otlp_provider(otlp_endpoint)
    try:
        return export_events(provider, events, capture_content=capture)
    finally:
        provider.shutdown()


def live_traces(
    tracer_provider: Any = None, capture_content: bool | None = None
) -> LiveTraces | None:
    """The runtime's live exporter: for `tracer_provider`, or an OTLP one when the env sets
    OTEL_EXPORTER_OTLP_ENDPOINT (or ..._TRACES_ENDPOINT); None when neither is given."""
    env = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or os.environ.get(
        "OTEL_EXPORTER_OTLP_ENDPOINT"
    )
    if tracer_provider is None and not env:
        return None
    _require()
    from contextos.telemetry._export import LiveTraces, capture_from_env, otlp_provider

    capture = capture_from_env() if capture_content is None else capture_content
    if tracer_provider is not None:
        return LiveTraces(tracer_provider, capture_content=capture, owned=False)
    return LiveTraces(otlp_provider(batch=True), capture_content=capture, owned=True)


__all__ = [
    "INSTALL_HINT",
    "TimelineEntry",
    "Trace",
    "export_run",
    "live_traces",
    "span_json",
    "span_tree",
    "spans_for",
    "timeline",
    "trace_id_for",
    "trace_of",
]
