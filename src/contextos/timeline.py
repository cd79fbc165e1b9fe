"""One readable line per event, for `contextos show` and the web page."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from contextos import events as ev
from contextos import interrupts

_ENVELOPE = {"run_id", "seq", "occurred_at", "actor", "causation_id", "type"}


def describe(event: ev.Event) -> str:
    """A short human line for an event; unknown shapes fall back to their fields."""
    authority = interrupts.describe(event)
    if authority is not None:
        return authority
    match event:
        case ev.RunCreated():
            return f"{event.agent_name} v{event.agent_version} started on: {_clip(event.input)}"
        case ev.RunStarted():
            return f"worker {event.worker_id}" + (
                " (recovered after a crash)" if event.recovered else ""
            )
        case ev.RuntimeCrashDetected():
            return f"worker {event.previous_worker_id} died after event #{event.last_seq}"
        case ev.ModelResponded():
            usage = event.usage
            cost = f", ${usage.cost_usd:.4f}" if usage.cost_usd else ""
            head = (
                f"{event.model} → {event.finish_reason} "
                f"({usage.input_tokens}+{usage.output_tokens} tokens{cost}, "
                f"{event.latency_ms:.0f} ms)"
            )
            calls = ", ".join(
                f"{c.name}({_clip(c.arguments, 60)})" for c in event.message.tool_calls
            )
            text = _clip(event.message.content) if event.message.content else ""
            items = event.context.get("manifest", ())
            ctx = (
                f"[context {event.context_hash[:12]}: {len(items)} items, "
                f"{sum(int(i.get('tokens', 0)) for i in items)} tokens]"
                if event.context_hash
                else ""
            )
            return " ".join(part for part in (head, calls, text, ctx) if part)
        case ev.ToolCompleted():
            mark = f"ERROR {event.error_code}: " if event.is_error else ""
            return f"{event.name} [{event.call_id}] {mark}{_clip(event.output)}"
        case ev.VerificationFailed():
            return f"{event.verifier} rejected the answer: {'; '.join(event.gaps)}"
        case ev.RunCompleted() if event.answer_seq is not None:
            return f"completed with the answer of #{event.answer_seq}"
        case ev.RunCompleted():
            return f"completed: {_clip(event.output)}"
        case ev.RunFailed():
            return f"failed ({event.reason}): {event.message}"
        case ev.RunExpired():
            return "expired" + (f": {event.reason}" if event.reason else "")
        case ev.RunCancelled():
            return f"cancelled by {event.actor}" + (f": {event.reason}" if event.reason else "")
        case _:
            return _fields(event)


def _fields(event: Any) -> str:
    if not dataclasses.is_dataclass(event):
        return str(event)
    parts = []
    for f in dataclasses.fields(event):
        if f.name in _ENVELOPE:
            continue
        value = getattr(event, f.name)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            value = dataclasses.asdict(value)
        text = value if isinstance(value, str) else json.dumps(value, default=str)
        parts.append(f"{f.name}={_clip(text, 80)}")
    return " ".join(parts)


def _clip(text: str, limit: int = 120) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"
