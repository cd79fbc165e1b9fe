"""Child runs hosted by a runtime: what it lends the parents it drives to start, drive and
cancel their children (`contextos.graph.children.ChildHost`).

A child is created queued with its contract bound. Where no other process would hear of it soon
(SQLite: workers poll), or where no worker could load it (no agent reference), it is leased to
this runtime at creation and driven here; on PostgreSQL it is left a moment to idle workers,
so that a fan-out spreads across them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any

from contextos import events as ev
from contextos.agents import Agent
from contextos.errors import ConcurrencyConflict, ControlRefused, RunNotFound
from contextos.graph.children import ChildHost, ChildStart
from contextos.runs import RunId
from contextos.starting import Created
from contextos.state import RunState
from contextos.store import EventStore
from contextos.store.queue import Lease, QueueEntry, RunQueue

HANDOFF_S = 0.05
"""On a store whose queue wakes other processes (PostgreSQL), how long a parent leaves a new
child run to idle workers before driving it itself: fan-outs spread across workers."""


KEPT_LOGS = 1024
"""At most this many logs of ended children wait for their parents here."""


class ChildRuns:
    """The child runs of the parents one runtime drives."""

    def __init__(
        self,
        store: EventStore,
        queue: RunQueue | None,
        *,
        worker_id: str,
        lease_s: float,
        create: Callable[..., Awaitable[Created]],
        resume: Callable[..., Awaitable[RunState]],
        cancel: Callable[..., Awaitable[Any]],
        pause: Callable[..., Awaitable[Any]],
    ) -> None:
        self.store = store
        self._queue = queue
        self.worker_id = worker_id
        self.lease_s = lease_s
        self._create = create
        """The runtime's run creation (queue row, then the first events)."""
        self._resume = resume
        """The runtime's resume under a lease."""
        self._cancel = cancel
        """The runtime's cancel."""
        self._pause = pause
        """The runtime's pause."""
        self._held: dict[RunId, tuple[Lease, RunState, list[ev.Event]]] = {}
        """Child runs this runtime created and holds, until it drives them: their leases,
        their states and their logs as created."""
        self._ended: dict[RunId, list[ev.Event]] = {}
        """The whole logs of children driven here from their creation to their end, until
        their parents take them (see `log`)."""

    def host(self, *, take_over: bool, clock: Callable[[], datetime]) -> ChildHost:
        """What a parent driven here uses to start and drive its children. `take_over`: the
        parent was resumed by hand, which takes over its children too (as `resume` takes a
        run's lease from whoever holds it); a worker's claim waits for other holders."""
        return ChildHost(
            store=self.store,
            create=self._create_child,
            held=self._held.__contains__,
            drive=self._drive_child,
            log=self._log,
            cancel=self.cancel_child,
            pause=self.pause_child,
            clock=clock,
            take_over=take_over,
            handoff_s=HANDOFF_S if self._queue_wakes_others else 0.0,
        )

    async def _create_child(self, start: ChildStart) -> bool:
        contract = start.contract
        if not start.fresh:
            with contextlib.suppress(RunNotFound):
                await self.store.get_run(contract.child_run_id)
                return False  # created before (the parent crashed after creating it)
        # Held by this process from the start: a child no worker could load (no reference),
        # and any child when no other process would hear of it soon (SQLite: workers poll),
        # since this process drives it at once.
        try:
            created = await self._create(
                start.agent,
                start.input,
                run_id=contract.child_run_id,
                agent_ref=start.agent_ref,
                metadata=start.metadata,
                entry=QueueEntry(
                    run_id=RunId(""),
                    agent_name=start.agent.name,
                    tenant=start.context.tenant if start.context else "",
                ),
                hold=start.agent_ref is None or not self._queue_wakes_others,
                context=start.context,
                contract=contract,
                started=True,
            )
        except ConcurrencyConflict:
            return False  # another process created it meanwhile
        if created.lease is not None and created.state is not None:
            log = list(created.events)
            self._held[contract.child_run_id] = (created.lease, created.state, log)
        return True

    @property
    def _queue_wakes_others(self) -> bool:
        """Whether work queued here wakes idle workers of other processes (PostgreSQL)."""
        return self.store.url.startswith(("postgresql://", "postgres://"))

    async def _drive_child(self, run_id: RunId, agent: Agent, take_over: bool) -> RunState | None:
        """Drive a child run here unless another process holds it (None then); where it
        stands once this process stopped driving it."""
        queue = self._queue
        lease, state, log = self._held.pop(run_id, (None, None, None))
        if lease is None and queue is not None:
            if take_over:
                lease = await queue.acquire(run_id, self.worker_id, lease_s=self.lease_s)
            else:
                # Not reentrant: this worker's own live lease means its worker loop claimed
                # the child and drives it already.
                lease = await queue.take(
                    run_id, self.worker_id, lease_s=self.lease_s, reenter=False
                )
            if lease is None:
                return None
        ended = await self._resume(
            run_id, agent, lease=lease, take_over=take_over, state=state, log=log
        )
        # Whole when every event of it was committed by this driver (a person's request
        # folded in on the way, say, is not in it): seqs run from 1 without a gap.
        if log is not None and ended.is_terminal and len(log) == ended.seq:
            self._ended[run_id] = log
            while len(self._ended) > KEPT_LOGS:  # their parents stopped before taking them
                del self._ended[next(iter(self._ended))]
        return ended

    def _log(self, run_id: RunId) -> list[ev.Event] | None:
        return self._ended.pop(run_id, None)

    async def pause_child(self, run_id: RunId, reason: str) -> None:
        """Let go of a child created here, not driven yet, and pause it: nobody drives it
        then, so it pauses at once."""
        lease, _, _ = self._held.pop(run_id, (None, None, None))
        if lease is not None and self._queue is not None:
            await self._queue.release(lease)
        with contextlib.suppress(ControlRefused, RunNotFound):  # it ended meanwhile
            await self._pause(run_id, reason=reason, actor="runtime")

    async def cancel_child(self, run_id: RunId, reason: str, agent: Agent | None = None) -> None:
        self._held.pop(run_id, None)  # its state as created is no longer where it stands
        with contextlib.suppress(RunNotFound):
            await self._cancel(run_id, reason=reason, actor="runtime", agent=agent)
