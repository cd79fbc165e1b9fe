"""Interrupts that expire on their own: setting a deadline, recording the expiry, the sweep.

A pending interrupt whose deadline passed is expired by whichever process notices first: a
worker's sweep, a resume of the run, or a person answering too late. Each records it the same
way, as one fenced append (`InterruptExpired`, and for `fail` the `RunExpired` that ends the
run), so two workers racing, or an answer racing the sweep, produce exactly one outcome.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any

from contextos import events as ev
from contextos.causality import stamp
from contextos.deadlines import Deadline, Expiry, on_expiry
from contextos.errors import AnswerInvalid, ConcurrencyConflict, RunIsTerminal, RunNotFound
from contextos.events import utcnow
from contextos.interrupts import Book, Interrupt, InterruptKind, parse_answer
from contextos.ledger import EffectState
from contextos.policy.decision import Check, Decision, PolicyDecision
from contextos.runs import RunId, RunStatus
from contextos.state import fold

if TYPE_CHECKING:
    from contextos.policy.rules import Policy
    from contextos.store.base import EventStore

log = logging.getLogger("contextos.expiry")

SWEEP_LIMIT = 10_000
"""Waiting runs one sweep looks at (the most recently updated first)."""


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


def overdue(book: Book, now: datetime) -> list[Interrupt]:
    """The pending interrupts of a waiting run whose deadline has passed."""
    if book.status != RunStatus.INPUT_REQUIRED.value:
        return []
    out = []
    for i in book.pending:
        deadline = i.deadline
        if deadline is not None and deadline.expires_at <= now:
            out.append(i)
    return out


def next_due(book: Book) -> datetime | None:
    """The earliest deadline among a waiting run's pending interrupts."""
    if book.status != RunStatus.INPUT_REQUIRED.value:
        return None
    dues = [d.expires_at for i in book.pending if (d := i.deadline) is not None]
    return min(dues) if dues else None


def expiry_events(
    book: Book, events: Sequence[ev.Event], due: Sequence[Interrupt], *, now: datetime, actor: str
) -> list[ev.Event]:
    """The events that expire `due` (one InterruptExpired each); when any says `fail`, the run
    ends: calls that were never sent are abandoned and RunExpired follows."""
    run_id = RunId(book.run_id)
    out: list[ev.Event] = []

    def seq() -> int:
        return book.seq + len(out) + 1

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
    state = fold(list(events), book.run_id)
    unsent = (EffectState.PROPOSED, EffectState.VALIDATED, EffectState.AUTHORISED)
    for effect in state.effects.values():
        if effect.state in unsent and effect.compensates is None:
            why = "the run expired waiting for a person; the call was not sent"
            out.append(
                ev.EffectChanged(
                    run_id=run_id,
                    seq=seq(),
                    occurred_at=now,
                    actor=actor,
                    effect_id=effect.effect_id,
                    state=EffectState.FAILED,
                    error_code="not_sent",
                    output=why,
                    note=why,
                )
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
            events = await store.read(RunId(run_id))
        except RunNotFound:
            return []
        book = Book.of(run_id, events)
        due = overdue(book, now)
        if not due:
            return []
        batch = expiry_events(book, events, due, now=now, actor=actor)
        try:
            await store.append(RunId(run_id), stamp(fold(events), batch), expected_seq=book.seq)
        except ConcurrencyConflict:
            continue
        except RunIsTerminal:
            return []
        for e in batch:
            if isinstance(e, ev.InterruptExpired):
                log.info("run %s: %s", run_id, e.reason)
        return [e for e in batch if isinstance(e, ev.InterruptExpired)]


# --- the sweep -------------------------------------------------------------------------------


@dataclass(slots=True)
class _Seen:
    seq: int
    due: datetime | None


class Sweeper:
    """Finds waiting runs whose interrupts are overdue and expires them.

    One pass is one indexed query for the runs in `input_required`; a run's log is read only
    when it changed since the last pass (its last seq moved), so the cost of a pass does not
    grow with the length of the logs of runs that are simply waiting.
    """

    def __init__(
        self,
        store: EventStore,
        *,
        clock: Callable[[], datetime] = utcnow,
        actor: str = "runtime",
        limit: int = SWEEP_LIMIT,
    ) -> None:
        self.store = store
        self.clock = clock
        self.actor = actor
        self.limit = limit
        self._seen: dict[str, _Seen] = {}

    async def sweep(self) -> list[ev.InterruptExpired]:
        """One pass: expire everything overdue now; returns the expiries it recorded."""
        now = self.clock()
        waiting = await self.store.list_runs(status=RunStatus.INPUT_REQUIRED, limit=self.limit)
        seen: dict[str, _Seen] = {}
        expired: list[ev.InterruptExpired] = []
        for summary in waiting:
            rid = str(summary.run_id)
            known = self._seen.get(rid)
            if known is None or known.seq != summary.last_seq:
                try:
                    book = Book.of(rid, await self.store.read(summary.run_id))
                except RunNotFound:
                    continue
                known = _Seen(seq=book.seq, due=next_due(book))
            seen[rid] = known
            if known.due is not None and known.due <= now:
                expired.extend(await expire_overdue(self.store, rid, now=now, actor=self.actor))
                seen.pop(rid, None)  # read again next time, whatever happened
        self._seen = seen
        return expired

    async def run(
        self,
        every_s: float,
        stop: asyncio.Event,
        *,
        on_expired: Callable[[list[ev.InterruptExpired]], None] | None = None,
    ) -> None:
        """Sweep every `every_s` seconds until `stop` is set."""
        while not stop.is_set():
            try:
                expired = await self.sweep()
                if expired and on_expired is not None:
                    on_expired(expired)
            except Exception:
                log.exception("sweeping for expired interrupts failed; trying again")
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(every_s):
                    await stop.wait()


__all__ = [
    "Sweeper",
    "deadline_for",
    "expire_overdue",
    "expired_decision",
    "expiry_events",
    "next_due",
    "overdue",
    "what_happened",
]
