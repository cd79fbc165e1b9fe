"""One readable line per event, for `contextos show` and the web page."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from contextos import events as ev
from contextos import interrupts
from contextos.delegation import DelegationContract

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
        case ev.DelegationBound():
            c = event.contract
            return f"delegated by {c.parent_run_id}{_where(c)}: {_contract(c)}"
        case ev.ChildRunStarted():
            c = event.contract
            return f"child {c.child_run_id} ({c.agent_name}){_where(c)}: {_contract(c)}"
        case ev.ChildRunFinished():
            why = f" ({event.reason}: {_clip(event.message, 80)})" if event.reason else ""
            return (
                f"child {event.child_run_id} {event.status}{why}: {event.turns} turns, "
                f"{event.usage.total_tokens} tokens, ${event.usage.cost_usd:.4f}"
            )
        case ev.WorkflowBound():
            names = " → ".join(str(n.get("name")) for n in event.nodes)
            return f"workflow {event.workflow}: {names}"
        case ev.NodeStarted():
            items = f" over {len(event.items)} items" if event.items is not None else ""
            return f"{event.node} ({event.kind}) started{items}"
        case ev.NodeRoundCompleted():
            return f"{event.node} round {event.round}: {_clip(json.dumps(event.output), 100)}"
        case ev.NodeCompleted():
            done = "" if event.converged is None else (" (converged)" if event.converged else "")
            return f"{event.node} completed{done}: {_clip(json.dumps(event.output), 100)}"
        case ev.NodeFailed():
            return f"{event.node} failed ({event.reason}): {event.message}"
        case _:
            return _fields(event)


def _where(c: DelegationContract) -> str:
    if c.node is not None:
        return f" for node {c.node}#{c.index}"
    return f" for call {c.call_id}" if c.call_id else ""


def _contract(c: DelegationContract) -> str:
    """The contract in one line: objective, tools, forbidden effects, budget, what comes back."""
    b = c.budget
    spend = [f"{b.max_turns} turns"]
    if b.max_tokens is not None:
        spend.append(f"{b.max_tokens} tokens")
    if b.max_cost_usd is not None:
        spend.append(f"${b.max_cost_usd:.4f}")
    if c.deadline_at is not None:
        spend.append(f"until {c.deadline_at.strftime('%H:%M:%S')}")
    parts = [
        _clip(c.objective, 80),
        f"tools [{', '.join(c.allowed_tools)}]",
        f"forbidden [{', '.join(c.forbidden_effects)}]" if c.forbidden_effects else "",
        "budget " + ", ".join(spend),
        f"returns {c.expected_output}" if c.expected_output else "",
    ]
    return " · ".join(p for p in parts if p)


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
