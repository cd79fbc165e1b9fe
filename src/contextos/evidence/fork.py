"""Fork: a new run whose history is the first SEQ events of another, going on from there.

The fork copies the source's events 1..SEQ (under its own run id), then records `run_forked`
and goes back to the queue, with the source's agent or another one. A fork never repeats an
effect: every call in the copied history whose effect the source dispatched (before or after
SEQ) comes with that effect's ledger as the source recorded it, so the fork sees the outcome and
its receipts instead of sending the call again. Calls the model makes after SEQ are the fork's
own decisions; one that asks exactly what the source already sent (the same tool and contract,
the same arguments) takes the source's effect rather than being sent again (`inherited_actions`,
settled by the tool runner). An effect that failed in the source may be tried again.

A fork point must be a step boundary the loop can go on from: not past the end, not at the
run's end, not before the run's authority was bound, not while a question waits on a person,
and not inside the batch that proposes an effect.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from contextos import events as ev
from contextos.agents import Agent
from contextos.errors import ForkRefused
from contextos.ledger import EffectState, action_key
from contextos.runs import RunId
from contextos.state import fold
from contextos.tools.gateway import Gateway


def fork_events(
    events: Sequence[ev.Event],
    *,
    fork_id: RunId,
    at: int,
    agent: Agent | None = None,
    agent_ref: str | None = None,
) -> list[ev.Event]:
    """The log a fork of `events` at `at` starts with (ForkRefused when `at` cannot be one)."""
    created = events[0]
    assert isinstance(created, ev.RunCreated)
    source = created.run_id
    prefix = list(events[:at])
    _check(source, events, prefix, at)
    state = fold(prefix)
    copied = [dataclasses.replace(e, run_id=fork_id, correlation_id=fork_id) for e in prefix]
    calls = {c.id for m in state.messages for c in m.tool_calls}
    dispatched = {
        e.effect_id
        for e in events
        if isinstance(e, ev.EffectChanged) and e.state is EffectState.DISPATCHED
    }
    proposals = {e.effect_id: e.call_id for e in events if isinstance(e, ev.EffectProposed)}
    inherited = [eid for eid, call in proposals.items() if call in calls and eid in dispatched]
    later = [
        e
        for e in events[at:]
        if isinstance(e, ev.EffectProposed | ev.EffectChanged) and e.effect_id in inherited
    ]
    tools = Gateway(agent.tool_list).manifest_hash if agent is not None else None
    sent = fold(list(events)).effects  # where each of the source's effects ended
    raw = {c.id: (c.name, c.arguments) for m in fold(list(events)).messages for c in m.tool_calls}
    actions = tuple(
        (eid, action_key(*raw[call]), sent[eid].contract_hash)
        for eid, call in proposals.items()
        if call not in calls
        and call in raw
        and eid in dispatched
        and sent[eid].state not in (EffectState.FAILED, EffectState.DENIED)
    )
    forked = ev.RunForked(
        run_id=fork_id,
        seq=at + 1,
        actor="runtime",
        causation_id=at,
        correlation_id=fork_id,
        source_run_id=source,
        at_seq=at,
        agent_name=agent.name if agent is not None else state.agent_name,
        agent_version=agent.version if agent is not None else state.agent_version,
        agent_hash=agent.identity_hash() if agent is not None else state.agent_hash,
        agent_ref=agent_ref if agent_ref is not None else state.agent_ref,
        tool_manifest_hash=tools if tools is not None else state.tool_manifest_hash,
        inherited_effects=tuple(e for e in inherited if any(x.effect_id == e for x in later)),
        inherited_actions=actions,
    )
    settled = [
        dataclasses.replace(
            e, run_id=fork_id, seq=at + 1 + i, causation_id=at + 1, correlation_id=fork_id
        )
        for i, e in enumerate(later, start=1)
    ]
    return [*copied, forked, *settled]


def _check(source: str, events: Sequence[ev.Event], prefix: list[ev.Event], at: int) -> None:
    last = events[-1].seq
    if not 1 <= at <= last:
        raise ForkRefused(
            f"run {source} has events 1 to {last}: fork at a seq in that range", run_id=source
        )
    bound = next((e.seq for e in events if isinstance(e, ev.ContextBound)), None)
    if bound is not None and at < bound:
        raise ForkRefused(
            f"run {source} was bound to its authority at #{bound}; a fork keeps it: fork at "
            f"#{bound} or later",
            run_id=source,
        )
    state = fold(prefix)
    if state.is_terminal:
        raise ForkRefused(
            f"run {source} has ended at #{at}; fork at a seq before its end (#{at - 1} or earlier)",
            run_id=source,
        )
    if state.pending_interrupts:
        asked = min(q.raised_seq for q in state.pending_interrupts.values())
        raise ForkRefused(
            f"at #{at} run {source} waits on a person (the question of #{asked}); fork before "
            f"it was asked (#{asked - 1}) or after it was answered",
            run_id=source,
        )
    proposed = [e for e in state.effects.values() if e.state is EffectState.PROPOSED]
    if proposed:
        decided = next(
            (
                e.seq
                for e in events[at:]
                if isinstance(e, ev.PolicyDecided) and e.effect_id == proposed[0].effect_id
            ),
            None,
        )
        where = f"#{decided}" if decided is not None else "a later seq"
        raise ForkRefused(
            f"#{at} is inside the step that proposes effect {proposed[0].effect_id}: fork at "
            f"#{proposed[0].history[0][0] - 1} or at {where}",
            run_id=source,
        )


__all__ = ["fork_events"]
