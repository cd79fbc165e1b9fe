"""A person's hand on a run between its steps: cancelling it, pausing it, sending it a
follow-up, finishing a conversation.

Each is an event appended under the fence, after `control.py` said the run can take it now;
what drives the run on afterwards (a resume here, the workers) is the runtime's, lent here.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from contextos import events as ev
from contextos.agents import Agent, load_ref
from contextos.causality import stamp
from contextos.control import (
    check_finishable,
    check_pausable,
    check_sendable,
    check_unpausable,
)
from contextos.errors import (
    AgentChanged,
    ConcurrencyConflict,
    ConfigError,
    ControlRefused,
    RunInUse,
    RunIsTerminal,
    RunNotFound,
)
from contextos.ledger import abandoned, never_sent, unsettled
from contextos.loop import Driver
from contextos.ownership import Ownership
from contextos.runs import RunId, RunStatus
from contextos.state import RunState, apply
from contextos.store import EventStore, wakeup
from contextos.store.queue import Lease

ENDING_POLLS = 14
"""How often `cancel` looks whether a live driver has ended a run it asked to end: about
five seconds in all."""


class Steering:
    """Cancel, pause, send and finish, on the runs of one runtime."""

    def __init__(
        self,
        store: EventStore,
        own: Ownership,
        *,
        leased: bool,
        state: Callable[[RunId], Awaitable[RunState]],
        resume: Callable[[RunId, Agent | None, Lease | None], Awaitable[RunState]],
        driver: Callable[[RunState, Agent], Driver],
        materialise: Callable[[RunState], Awaitable[None]],
        committed: Callable[[RunId, Sequence[ev.Event]], Awaitable[None]],
        cancel_child: Callable[[RunId, str], Awaitable[None]],
        ended_children: Callable[[RunState], Awaitable[list[dict[str, Any]]]],
    ) -> None:
        self.store = store
        self._own = own
        self._leased = leased
        """Whether the store has a queue, so that a driver takes a run's lease."""
        self._state = state
        self._resume = resume
        """Drive a run on here (`lease`: held already; None: take it)."""
        self._driver = driver
        self._materialise = materialise
        self._committed = committed
        """Tell live traces of events appended."""
        self._cancel_child = cancel_child
        self._ended_children = ended_children
        """The `child_run_finished` fields of a run's children that ended unrecorded."""

    async def cancel(self, rid: RunId, *, reason: str, actor: str, agent: Agent | None) -> RunState:
        ends_children = False
        while True:
            state = await self._state(rid)
            if state.is_terminal or state.ending is not None:
                break
            ends_children = await self._driven_with_children(state)
            events: list[ev.Event]
            if (state.needs_settling and not _settled_here(state)) or ends_children:
                events = [
                    ev.RunEnding(
                        run_id=rid,
                        seq=state.seq + 1,
                        outcome="cancelled",
                        reason=reason,
                        actor=actor,
                    )
                ]
            else:
                events = _unsent_abandoned(state)
                events += await self._children_taken_in(state, after=state.seq + len(events))
                seq = state.seq + len(events) + 1
                events.append(ev.RunCancelled(run_id=rid, seq=seq, reason=reason, actor=actor))
            events = stamp(state, events)
            event = events[-1]
            try:
                await self.store.append(rid, events, expected_seq=state.seq)
                await self._committed(rid, events)
                if isinstance(event, ev.RunCancelled):
                    for done in events:
                        apply(state, done)
                    await self._materialise(state)
                if isinstance(event, ev.RunEnding) and state.status is not RunStatus.RUNNING:
                    with contextlib.suppress(ConfigError, AgentChanged, RunInUse):
                        # without its agent it stays ending; the next resume settles it
                        return await self._resume(rid, agent, None)
                break
            except ConcurrencyConflict:
                continue  # the worker appended meanwhile; try again on the new tail
            except RunIsTerminal:
                break
        state = await self._state(rid)
        for child in state.children.values():  # a cancelled parent's children stop too
            if not child.finished:
                await self._cancel_child(
                    child.contract.child_run_id, f"its parent run {rid} was cancelled"
                )
        if ends_children and not state.is_terminal:
            return await self._ended(rid, state)
        return state

    async def _children_taken_in(self, state: RunState, *, after: int) -> list[ev.Event]:
        """Nobody drives the run: its children still running are cancelled first, and each
        that has ended is recorded as finished (numbered from `after` + 1), so that what they
        spent counts in the run's."""
        if not state.running_children:
            return []
        for key in state.running_children:
            child = state.children[key].contract.child_run_id
            await self._cancel_child(child, f"its parent run {state.run_id} was cancelled")
        ended = await self._ended_children(state)
        return [
            ev.ChildRunFinished(run_id=state.run_id, seq=after + i, **fields)
            for i, fields in enumerate(ended, 1)
        ]

    async def _driven_with_children(self, state: RunState) -> bool:
        """Whether a live driver holds the run with children running (a workflow's, or an
        agent's subagents): asked to end, it records what they became once they stop, so that
        their spend counts in its own. (Nobody driving it, it is cancelled at once, after its
        children: see `_children_taken_in`.)"""
        if not state.running_children:
            return False
        if state.status is not RunStatus.RUNNING:
            return False
        return await self._own.owner(state.run_id) is not None

    async def _ended(self, rid: RunId, state: RunState) -> RunState:
        """The run once its live driver, woken by its children's cancellation, has ended it;
        or as it is after a few seconds, still ending."""
        pause = 0.02
        for _ in range(ENDING_POLLS):
            await asyncio.sleep(pause)
            state = await self._state(rid)
            if state.is_terminal:
                break
            pause = min(pause * 2, 0.5)
        return state

    async def pause(self, rid: RunId, *, reason: str, actor: str) -> RunState:
        paused = await self._pause(rid, reason=reason, actor=actor)
        if paused.workflow is not None:  # its children in flight stop at their next step too
            for key in paused.running_children:
                child = paused.children[key].contract.child_run_id
                with contextlib.suppress(ControlRefused, RunNotFound):  # ended, or a person's
                    await self.pause(child, reason=f"its workflow {rid} was paused", actor=actor)
        return paused

    async def _pause(self, rid: RunId, *, reason: str, actor: str) -> RunState:
        while True:
            state = await self._state(rid)
            if state.status is RunStatus.PAUSED:
                return state
            check_pausable(state)
            driven = state.status is RunStatus.RUNNING and await self._own.owner(rid) is not None
            if driven and state.pause_requested is not None:
                return state  # asked already; its driver will see it
            kind = ev.RunPauseRequested if driven else ev.RunPaused
            [event] = stamp(
                state, [kind(run_id=rid, seq=state.seq + 1, reason=reason, actor=actor)]
            )
            try:
                await self.store.append(rid, [event], expected_seq=state.seq)
            except (ConcurrencyConflict, RunIsTerminal):
                continue  # it moved meanwhile: decide again on where it is now
            await self._committed(rid, [event])
            return apply(state, event)

    async def unpause(self, rid: RunId, *, actor: str) -> RunState:
        while True:
            state = await self._state(rid)
            check_unpausable(state)
            [event] = stamp(state, [ev.RunUnpaused(run_id=rid, seq=state.seq + 1, actor=actor)])
            try:
                await self.store.append(rid, [event], expected_seq=state.seq)
            except (ConcurrencyConflict, RunIsTerminal):
                continue  # it moved meanwhile: decide again on where it is now
            await self._committed(rid, [event])
            wakeup.wake_local(self.store)
            return apply(state, event)

    async def send(
        self, rid: RunId, message: str, *, actor: str, agent: Agent | None, drive: bool
    ) -> RunState:
        if not message.strip():
            raise ConfigError("a follow-up message needs some text", run_id=rid)
        check_sendable(await self._state(rid))  # before taking a lease on it
        # Driving here: hold the lease before the message queues the run, or a worker may
        # take it first.
        lease = await self._own.take(rid) if drive and self._leased else None
        try:
            while True:
                state = await self._state(rid)
                check_sendable(state)
                added = ev.UserMessageAdded(
                    run_id=rid, seq=state.seq + 1, content=message, actor=actor
                )
                [event] = stamp(state, [added])
                try:
                    await self.store.append(rid, [event], expected_seq=state.seq)
                    break
                except (ConcurrencyConflict, RunIsTerminal):
                    continue
        except BaseException:
            if lease is not None:
                await self._own.release_lease(lease)
            raise
        await self._committed(rid, [event])
        if lease is None:
            wakeup.wake_local(self.store)
            if not drive:
                return apply(state, event)
        return await self._resume(rid, agent, lease)

    async def finish(self, rid: RunId, *, actor: str, agent: Agent | None) -> RunState:
        state = await self._state(rid)
        check_finishable(state)
        if agent is None:
            if not state.agent_ref:
                raise ConfigError(
                    f"run {rid} was started without an agent reference; pass the agent",
                    run_id=rid,
                )
            agent = load_ref(state.agent_ref)
        if not isinstance(agent, Agent):
            raise ConfigError(f"run {rid} is not an agent run", run_id=rid)
        driver = self._driver(state, agent)
        driver.on_commit = lambda events: self._committed(rid, events)
        await driver.finish_conversation(actor)
        await self._materialise(driver.state)
        return driver.state


def _settled_here(state: RunState) -> bool:
    """Whether cancelling the run settles its effects without its tools: nobody drives it and
    every call to settle was never sent (one waiting for an approval, say). Else its driver,
    or a resume with its agent, runs the saga."""
    if state.status is RunStatus.RUNNING:
        return False
    return all(never_sent(e) for e in state.effects.values() if unsettled(e))


def _unsent_abandoned(state: RunState) -> list[ev.Event]:
    """The calls a cancelled run never sent, settled as failed (not sent)."""
    why = "the run was cancelled before the call was sent"
    unsent = [e for e in state.effects.values() if never_sent(e)]
    return [
        ev.EffectChanged(run_id=state.run_id, seq=state.seq + i, **abandoned(e, why))
        for i, e in enumerate(unsent, 1)
    ]


__all__ = ["Steering"]
