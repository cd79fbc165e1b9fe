"""A run's timeline: each event as stored, with one readable line (`contextos show`, the API)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from contextos import codec
from contextos import events as ev
from contextos.delegation import DelegationContract
from contextos.records.interrupts import canonical_json, fmt_roles

_ENVELOPE = {"run_id", "seq", "occurred_at", "actor", "causation_id", "correlation_id", "type"}


@dataclass(frozen=True, kw_only=True, slots=True)
class TimelineEntry:
    """One event of a run, as stored and in words."""

    seq: int
    """Its place in the run's log, from 1."""
    occurred_at: datetime
    """When it happened (UTC)."""
    type: str
    """The event type (`run_created`, `model_responded`, …)."""
    actor: str
    """Who caused it."""
    causation_id: int | None = None
    """The seq of the event, in the same run, that this one follows from (None: none)."""
    line: str
    """What happened, in one readable line (the event's text is data: never markup)."""
    data: dict[str, Any]
    """The whole event as JSON data, exactly as the store keeps it."""


def timeline(events: Sequence[ev.Event]) -> list[TimelineEntry]:
    """The entries of these events, in order."""
    return [
        TimelineEntry(
            seq=e.seq,
            occurred_at=e.occurred_at,
            type=e.type,
            actor=e.actor,
            causation_id=e.causation_id,
            line=describe(e),
            data=json.loads(codec.encode(e)),
        )
        for e in events
    ]


def describe(event: ev.Event) -> str:
    """A short human line for an event; unknown shapes fall back to their fields."""
    match event:
        case ev.ContextBound():
            c = event.context
            p = c.get("principal") or {}
            scopes = c.get("scopes")
            parts = [
                f"acts for {p.get('kind')}:{p.get('id')}@{p.get('tenant')}",
                "scopes " + ", ".join(scopes if scopes is not None else p.get("scopes") or ["-"]),
                f"clearance {c.get('clearance')}",
            ]
            if c.get("tools") is not None:
                parts.append("tools " + ", ".join(c["tools"]))
            box = c.get("containment")
            if box:
                parts.append("roots " + (", ".join(box.get("roots") or []) or "-"))
                allow = (box.get("network") or {}).get("allow") or []
                parts.append("network " + (", ".join(allow) or "none"))
            parts.append(
                f"policy {event.policy_name} v{event.policy_version} "
                f"(snapshot {event.snapshot_hash[:12]})"
            )
            return " · ".join(parts)
        case ev.PolicyDecided():
            text = f"{event.tool} [{event.call_id}] {event.decision}"
            if event.rule_ids:
                text += " by " + ", ".join(event.rule_ids)
            roles = event.approver_roles or ((event.approver_role,) if event.approver_role else ())
            if roles and event.decision == "require_approval":
                text += f" (role {fmt_roles(roles)})"
            if event.absolute:
                text += " [absolute]"
            if event.reasons:
                text += ": " + "; ".join(event.reasons)
            if event.action_hash:
                text += f" · action {event.action_hash[:12]}"
            if event.snapshot_hash:
                text += f" · policy {event.snapshot_hash[:12]}"
            return text
        case ev.InterruptRaised():
            action = event.payload.get("action")
            what = (
                str(action.get("preview"))
                if isinstance(action, Mapping)
                else str(event.payload.get("question") or "")
            )
            text = f"{event.kind} {event.interrupt_id}: {what}"
            if isinstance(action, Mapping) and action.get("blast_radius"):
                text += f" · {action['blast_radius']}"
            wanted = event.payload.get("approver_roles")
            if wanted:
                text += f" · needs {fmt_roles(wanted)}"
            return text
        case ev.ApprovalGranted():
            return (
                f"{event.approval_id} approves {event.interrupt_id} by {event.approver} "
                f"({fmt_roles(event.approver_roles)}) until {event.expires_at.isoformat()} · "
                f"action {event.action_hash[:12]}"
                + (f" · conditions {canonical_json(event.conditions)}" if event.conditions else "")
            )
        case ev.ApprovalDenied():
            why = f": {event.reason}" if event.reason else ""
            return f"{event.interrupt_id} denied by {event.approver}{why}"
        case ev.ApprovalRevoked():
            why = f": {event.reason}" if event.reason else ""
            return f"{event.approval_id} revoked by {event.revoked_by}{why}"
        case ev.InterruptAnswered():
            return (
                f"{event.interrupt_id} ({event.kind}) answered by {event.answered_by}: "
                f"{canonical_json(event.value)}"
            )
        case ev.InterruptExpired():
            return (
                f"{event.interrupt_id} ({event.kind}) expired unanswered at "
                f"{event.expires_at.isoformat()} · on_expiry {event.on_expiry}"
                + (f" · answer {canonical_json(event.value)}" if event.value else "")
                + (f": {event.reason}" if event.reason else "")
            )
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
        case ev.RunPauseRequested():
            why = f": {event.reason}" if event.reason else ""
            return f"{event.actor} asked the run to pause after its current step{why}"
        case ev.RunPaused():
            return f"paused for {event.actor}" + (f": {event.reason}" if event.reason else "")
        case ev.RunUnpaused():
            return f"{event.actor} let it go on: queued for a worker"
        case ev.RunAnswered():
            return f"answered with #{event.answer_seq}; waiting for the next message"
        case ev.UserMessageAdded():
            return f"{event.actor} sent: {_clip(event.content)}"
        case ev.RunFailed():
            return f"failed ({event.reason}): {event.message}"
        case ev.RunExpired():
            return "expired" + (f": {event.reason}" if event.reason else "")
        case ev.RunCancelled():
            return f"cancelled by {event.actor}" + (f": {event.reason}" if event.reason else "")
        case ev.RunEnding():
            why = event.message or event.reason
            what = (
                f"{event.actor} asked to cancel it"
                if event.outcome == "cancelled"
                else f"ending {event.outcome} once its effects settle"
            )
            return what + (f": {why}" if why else "")
        case ev.DelegationBound():
            deal = event.contract
            return f"delegated by {deal.parent_run_id}{_where(deal)}: {_contract(deal)}"
        case ev.ChildRunStarted():
            deal = event.contract
            return f"child {deal.child_run_id} ({deal.agent_name}){_where(deal)}: {_contract(deal)}"
        case ev.ChildRunFinished():
            why = f" ({event.reason}: {_clip(event.message, 80)})" if event.reason else ""
            return (
                f"child {event.child_run_id} {event.status}{why}: {_counted(event.turns, 'turn')}, "
                f"{event.usage.total_tokens} tokens, ${event.usage.cost_usd:.4f}"
            )
        case ev.WorkflowBound():
            names = " → ".join(str(n.get("name")) for n in event.nodes)
            return f"workflow {event.workflow}: {names}"
        case ev.NodeStarted():
            items = f" over {_counted(len(event.items), 'item')}" if event.items is not None else ""
            return f"{event.node} ({event.kind}) started{items}"
        case ev.NodeRoundCompleted():
            return f"{event.node} round {event.round}: {_clip(json.dumps(event.output), 100)}"
        case ev.NodeItemCompleted():
            return f"{event.node} item {event.index}: {_clip(json.dumps(event.output), 100)}"
        case ev.NodeAttemptFailed():
            which = f" {event.where}" if event.where else ""
            return (
                f"{event.node}{which} attempt {event.attempt} failed ({event.error_type}: "
                f"{_clip(event.error, 80)}); trying again in {event.delay_s:g}s"
            )
        case ev.NodeReconciled():
            acted = "it had acted" if event.acted else "it had not acted; it runs again"
            return f"{event.node} reconciled ({event.idempotency_key}): {acted}"
        case ev.NodeCompleted():
            done = "" if event.converged is None else (" (converged)" if event.converged else "")
            routed = f" → {event.route}" if event.route is not None else ""
            return f"{event.node} completed{done}{routed}: {_clip(json.dumps(event.output), 100)}"
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
    spend = [_counted(b.max_turns, "turn")]
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


def _counted(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")
