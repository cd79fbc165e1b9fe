"""Interrupts that expire on their own: setting a deadline, and recording the expiry.

A pending interrupt whose deadline passed is expired by whichever process notices first: a
worker's sweep (`contextos.workers.sweeper`), a resume of the run, or a person answering too
late. Each records it the same
way, as one fenced append (`InterruptExpired`, and for `fail` the `RunExpired` that ends the
run), so two workers racing, or an answer racing the sweep, produce exactly one outcome.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime
from typing import TYPE_CHECKING, Any

from contextos import events as ev
from contextos.causality import stamp
from contextos.errors import AnswerInvalid, ConcurrencyConflict, RunIsTerminal, RunNotFound
from contextos.ledger import abandoned, never_sent
from contextos.records.deadlines import Deadline, Expiry, on_expiry
from contextos.records.decisions import Check, Decision, PolicyDecision
from contextos.records.interrupts import Interrupt, InterruptKind, parse_answer
from contextos.runs import RunId, RunStatus
from contextos.state import RunState
from contextos.store.base import load_state

if TYPE_CHECKING:
    from contextos.policy.rules import Policy
    from contextos.store.base import EventStore

log = logging.getLogger("contextos.expiry")

# --- setting a deadline when an interrupt is raised ------------------------------------------


def deadline_for(
    kind: InterruptKind,
    payload: dict[str, Any],
    *,
    now: datetime,
    policy: Policy,
    rule_ids: Sequence[str] = (),
    tool_name: str = "",
    tool_expiry: Expiry | None = None,
    fallback: Expiry | None = None,
) -> Deadline | None:
    """The deadline of an interrupt about to be raised, from what declares one, most specific
    first: the asking tool's expiry, the deciding rules' `expires_in` (the earliest wins), the
    policy's `interrupt_ttl_s`, the runtime's default. None: it waits until answered."""
    expiry: Expiry | None = None
    set_by = ""
    if tool_expiry is not None:
        expiry, set_by = tool_expiry, f"tool:{tool_name}"
    else:
        rules = {r.id: r for r in policy.rules}
        timed = [rules[i] for i in rule_ids if i in rules and rules[i].expires_in is not None]
        if timed:
            first = min(timed, key=lambda r: (r.expires_in, r.on_expiry != "fail"))
            assert first.expires_in is not None
            expiry = Expiry(
                after_s=first.expires_in,
                on_expiry=on_expiry(first.on_expiry or policy.on_expiry, where=first.id),
            )
            set_by = f"rule:{first.id}"
        elif policy.interrupt_ttl_s is not None:
            expiry = Expiry(
                after_s=policy.interrupt_ttl_s,
                on_expiry=on_expiry(policy.on_expiry, where="policy"),
            )
            set_by = f"policy:{policy.name}"
        elif fallback is not None:
            expiry, set_by = fallback, "runtime"
    if expiry is None:
        return None
    if expiry.on_expiry != "default":
        return expiry.deadline(now, set_by=set_by)
    if kind.is_approval:
        # An approval has no answer to default to; refusing is the declared safe reading.
        return replace(expiry, on_expiry="deny").deadline(
            now, set_by=set_by, note="an approval has no default answer: refused instead"
        )
    try:
        answer = parse_answer(kind, expiry.default, payload)
    except AnswerInvalid as exc:
        return replace(expiry, on_expiry="deny").deadline(
            now, set_by=set_by, note=f"the declared default does not fit: {exc.message}"
        )
    return expiry.deadline(now, set_by=set_by, default=answer)


# --- what the gate decides about a call whose interrupt expired ------------------------------


def expired_decision(decision: PolicyDecision, latest: Interrupt) -> PolicyDecision:
    """The decision for a call whose latest interrupt expired: refused, with the reason the
    model reads; or, when a declared default answered it, allowed like an answered one."""
    assert latest.expiry is not None
    when = latest.expiry.expires_at.isoformat()
    if latest.answer is not None:
        return replace(
            decision,
            rule_ids=(*decision.rule_ids, f"expired:{latest.id}"),
            reasons=(*decision.reasons, f"nobody answered by {when}; the default was given"),
            checks=(
                *decision.checks,
                Check(layer="person", decision=Decision.ALLOW, rule_id=latest.id, reason="default"),
            ),
        )
    asked = "approved" if latest.kind.is_approval else "answered"
    return replace(
        decision,
        decision=Decision.DENY,
        rule_ids=(*decision.rule_ids, f"expired:{latest.id}"),
        reasons=(f"nobody {asked} this in time: {latest.id} expired unanswered at {when}",),
        exception_role=None,
        checks=(
            *decision.checks,
            Check(layer="approval", decision=Decision.DENY, rule_id=latest.id, reason="expired"),
        ),
    )


def what_happened(found: Interrupt) -> str:
    """For a refused late answer: what happened instead, in words."""
    e = found.expiry
    if e is None:
        return ""
    if e.on_expiry == "fail":
        return "the run ended expired"
    if e.on_expiry == "default":
        return f"the declared default answer {ev_json(e.value)} was given instead"
    return "it was refused as not answered in time, and the run went on without it"


def ev_json(value: Any) -> str:
    import json

    return json.dumps(value, sort_keys=True, ensure_ascii=False, default=str)


# --- recording an expiry ---------------------------------------------------------------------


def overdue(state: RunState, now: datetime) -> list[Interrupt]:
    """The pending interrupts of a waiting run whose deadline has passed."""
    if state.status is not RunStatus.INPUT_REQUIRED:
        return []
    out = []
    for i in state.pending_interrupts.values():
        deadline = i.deadline
        if deadline is not None and deadline.expires_at <= now:
            out.append(i)
    return out


def next_due(state: RunState) -> datetime | None:
    """The earliest deadline among a waiting run's pending interrupts."""
    if state.status is not RunStatus.INPUT_REQUIRED:
        return None
    pending = state.pending_interrupts.values()
    dues = [d.expires_at for i in pending if (d := i.deadline) is not None]
    return min(dues) if dues else None


def expiry_events(
    state: RunState, due: Sequence[Interrupt], *, now: datetime, actor: str
) -> list[ev.Event]:
    """The events that expire `due` (one InterruptExpired each); when any says `fail`, the run
    ends: calls that were never sent are abandoned and RunExpired follows."""
    run_id = state.run_id
    out: list[ev.Event] = []

    def seq() -> int:
        return state.seq + len(out) + 1

    failing: list[Interrupt] = []
    for i in due:
        d = i.deadline
        assert d is not None
        text = (
            f"{i.id} ({i.kind.value}: {i.prompt}) was not answered by "
            f"{d.expires_at.isoformat()}; {d.outcome()}"
        )
        out.append(
            ev.InterruptExpired(
                run_id=run_id,
                seq=seq(),
                occurred_at=now,
                actor=actor,
                interrupt_id=i.id,
                kind=i.kind.value,
                expires_at=d.expires_at,
                on_expiry=d.on_expiry,
                value=dict(d.default or {}) if d.on_expiry == "default" else {},
                reason=text + (f" ({d.note})" if d.note else ""),
            )
        )
        if d.on_expiry == "fail":
            failing.append(i)
    if not failing:
        return out
    why = "the run expired waiting for a person; the call was not sent"
    for effect in state.effects.values():
        if never_sent(effect):
            fields = abandoned(effect, why)
            out.append(
                ev.EffectChanged(run_id=run_id, seq=seq(), occurred_at=now, actor=actor, **fields)
            )
    first = failing[0]
    d = first.deadline
    assert d is not None
    out.append(
        ev.RunExpired(
            run_id=run_id,
            seq=seq(),
            occurred_at=now,
            actor=actor,
            reason=(
                f"interrupt {first.id} ({first.kind.value}: {first.prompt}) expired unanswered "
                f"at {d.expires_at.isoformat()}"
            ),
        )
    )
    return out


async def expire_overdue(
    store: EventStore, run_id: str, *, now: datetime, actor: str = "runtime"
) -> list[ev.InterruptExpired]:
    """Record the expiry of a waiting run's overdue interrupts, once across every process.

    The append names the seq the run was read at: a concurrent expiry or answer that committed
    first makes it fail, and the re-read then finds nothing overdue (or a run no longer
    waiting). Returns the expiries this call recorded (empty: none, or another got there).
    """
    while True:
        try:
            state = await load_state(store, RunId(run_id))
        except RunNotFound:
            return []
        due = overdue(state, now)
        if not due:
            return []
        batch = expiry_events(state, due, now=now, actor=actor)
        try:
            await store.append(state.run_id, stamp(state, batch), expected_seq=state.seq)
        except ConcurrencyConflict:
            continue
        except RunIsTerminal:
            return []
        for e in batch:
            if isinstance(e, ev.InterruptExpired):
                log.info("run %s: %s", run_id, e.reason)
        return [e for e in batch if isinstance(e, ev.InterruptExpired)]


__all__ = [
    "deadline_for",
    "expire_overdue",
    "expired_decision",
    "expiry_events",
    "next_due",
    "overdue",
    "what_happened",
]
