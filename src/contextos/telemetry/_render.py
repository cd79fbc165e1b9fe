"""Span records for people (a Rich tree) and for scripts (JSON with hex ids, as OTLP shows)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.text import Text
from rich.tree import Tree

if TYPE_CHECKING:
    from contextos.telemetry._spans import SpanRecord

_SHOWN = (
    "gen_ai.request.model",
    "gen_ai.response.finish_reasons",
    "gen_ai.usage.input_tokens",
    "gen_ai.usage.output_tokens",
    "gen_ai.tool.call.id",
    "contextos.effect.id",
    "contextos.effect.state",
    "contextos.policy.decision",
    "contextos.run.status",
    "error.type",
)


def span_json(span: SpanRecord) -> dict[str, Any]:
    return {
        "name": span.name,
        "kind": span.kind,
        "trace_id": f"{span.trace_id:032x}",
        "span_id": f"{span.span_id:016x}",
        "parent_span_id": f"{span.parent_id:016x}" if span.parent_id is not None else None,
        "start": span.start.isoformat(),
        "end": span.end.isoformat(),
        "status": span.status,
        "status_description": span.status_description,
        "attributes": {
            k: list(v) if isinstance(v, tuple) else v for k, v in span.attributes.items()
        },
        "events": [
            {"name": e.name, "time": e.at.isoformat(), "attributes": dict(e.attributes)}
            for e in span.events
        ],
    }


def span_tree(spans: list[SpanRecord]) -> Tree:
    """The root span with the spans below it in start order, each with its key attributes
    (a child run's spans hang under the node or tool call of its parent that started it)."""
    ids = {s.span_id for s in spans}
    roots = sorted((s for s in spans if s.parent_id not in ids), key=lambda s: s.start)
    below: dict[int, list[SpanRecord]] = {}
    for span in spans:
        if span.parent_id in ids:
            below.setdefault(span.parent_id, []).append(span)
    root = roots[0]

    def add(tree: Tree, span: SpanRecord) -> None:
        for event in span.events:
            tree.add(Text(f"· {event.name}", style="dim"))
        for child in sorted(below.get(span.span_id, []), key=lambda s: s.start):
            add(tree.add(_line(child, root)), child)

    tree = Tree(_line(root, root))
    add(tree, root)
    for other in roots[1:]:  # spans whose parent is not among these (a run exported alone)
        add(tree.add(_line(other, root)), other)
    return tree


def _line(span: SpanRecord, root: SpanRecord) -> Text:
    offset = (span.start - root.start).total_seconds() * 1000
    took = (span.end - span.start).total_seconds() * 1000
    style = {"error": "red", "ok": "green"}.get(span.status, "")
    text = Text(span.name, style=f"bold {style}".strip())
    text.append(f"  +{offset:.0f} ms, {took:.0f} ms  ", style="dim")
    attrs = " ".join(
        f"{key.rsplit('.', 1)[-1] if key != 'error.type' else key}={_value(span.attributes[key])}"
        for key in _SHOWN
        if key in span.attributes
    )
    text.append(attrs)
    if span.status_description:
        text.append(f"  {span.status_description}", style="red")
    return text


def _value(value: object) -> str:
    return ",".join(value) if isinstance(value, tuple) else str(value)
