"""Starting a run: its queue row first, then the first events of its log.

The queue row comes first so that no worker can see a created run before it is queued; the
first commit holds everything the run is bound to from its start: the agent or workflow (and
its graph), the authority it acts under, the delegation contract of a child run, and, when the
runtime that creates it drives it at once, that it started.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any, NamedTuple

from pydantic import BaseModel

from contextos import events as ev
from contextos.agents import Agent
from contextos.causality import stamp
from contextos.delegation import DelegationContract
from contextos.errors import ConcurrencyConflict, ConfigError, RunNotFound
from contextos.events import utcnow
from contextos.graph.children import carve
from contextos.graph.workflow import Workflow
from contextos.middleware.base import needs_principal
from contextos.policy.identity import RunContext
from contextos.releases import BOUND, route
from contextos.runs import RunId
from contextos.state import RunState, apply
from contextos.store import EventStore, wakeup
from contextos.store.base import load_state
from contextos.store.queue import Lease, QueueEntry, RunQueue
from contextos.tools.gateway import Gateway


def new_run_id() -> RunId:
    return RunId(f"run_{uuid.uuid4().hex[:20]}")


class Created(NamedTuple):
    """A run a start created, or found created by an earlier start with its key."""

    run_id: RunId
    lease: Lease | None
    """Held by this runtime (a start with `hold`)."""
    state: RunState | None
    """Its folded state, when this start recorded it: whoever drives it next need not read
    back what was just written."""
    events: tuple[ev.Event, ...] = ()
    """What this start recorded (its log so far)."""


class RunStarter:
    """Creates the runs of one runtime."""

    def __init__(
        self,
        store: EventStore,
        queue: RunQueue | None,
        *,
        worker_id: str,
        lease_s: float,
        announce: Callable[[], Awaitable[None]],
        bind: Callable[[RunId, RunContext | None], list[ev.Event]],
        admit: Callable[[Agent | Workflow], None],
    ) -> None:
        self.store = store
        self._queue = queue
        self.worker_id = worker_id
        self.lease_s = lease_s
        self._announce = announce
        """Enters the runtime in the worker registry before it holds a lease."""
        self._bind = bind
        """The event binding a run's context (none for an unbound run)."""
        self._admit = admit
        """Refuses an agent the runtime's policy does not let run as it is declared."""

    async def state(self, run_id: str) -> RunState:
        return await load_state(self.store, RunId(run_id))

    async def create(
        self,
        agent: Agent | Workflow,
        input: str | BaseModel | dict[str, Any],
        *,
        run_id: str | None,
        agent_ref: str | None,
        metadata: dict[str, Any] | None,
        entry: QueueEntry,
        hold: bool = False,
        context: RunContext | None = None,
        announce: bool = False,
        contract: DelegationContract | None = None,
        started: bool = False,
        caused_by: str | None = None,
    ) -> Created:
        """Queue the run, then record RunCreated; with `hold`, leased to this runtime.

        The queue row comes first so that no worker can see a created run before it is
        queued, and a start that dies in between is finished by the next start with its key.
        A child run records its delegation contract, and its budget is the contract's; a run
        started with a parent's context and no contract gets at most what the parent has left.
        A workflow run records its graph. `started` (with `hold`): this runtime drives it
        next, and records so in the same commit.
        """
        self._admit(agent)
        metadata = _keyed(metadata, agent, context)
        text = _input_text(agent, input)
        rid = RunId(run_id) if run_id else new_run_id()
        if isinstance(agent, Agent):  # its current release decides what the run runs
            agent, binding = await route(self.store, agent, rid)
            if binding is not None:
                metadata = {**(metadata or {}), BOUND: binding.model_dump(mode="json")}
        lease: Lease | None = None
        queue = self._queue
        if queue is not None:
            if announce:  # before the lease exists: its holder is always known
                await self._announce()
            entry = QueueEntry(
                run_id=rid,
                priority=entry.priority,
                tenant=entry.tenant,
                agent_name=entry.agent_name,
                idempotency_key=entry.idempotency_key,
                not_before=entry.not_before,
            )
            owner, lease = await queue.enqueue(
                entry, lease_owner=self.worker_id if hold else None, lease_s=self.lease_s
            )
            if owner != rid:  # the key belongs to an earlier start
                try:
                    await self.store.get_run(owner)
                    return Created(owner, None, None)
                except RunNotFound:
                    rid = owner  # that start died before recording its run: record it now
        now = utcnow()
        budget = agent.budget
        deadline_s = budget.deadline_s
        deadline_at = now + timedelta(seconds=deadline_s) if deadline_s is not None else None
        if contract is not None:
            budget, deadline_at = contract.budget, contract.deadline_at
        elif context is not None and context.parent_run_id is not None:
            budget, deadline_at = carve(await self.state(context.parent_run_id), budget, now)
        caused_by, correlation = await self._lineage(caused_by, context)
        created = ev.RunCreated(
            run_id=rid,
            seq=1,
            occurred_at=now,
            actor="runtime",
            agent_name=agent.name,
            agent_version=agent.version,
            agent_hash=agent.identity_hash(),
            agent_ref=agent_ref,
            input=text,
            budget=budget,
            deadline_at=deadline_at,
            tool_manifest_hash=(
                Gateway(agent.tool_list).manifest_hash if isinstance(agent, Agent) else ""
            ),
            metadata=metadata or {},
            correlation_id=correlation or rid,
            caused_by=caused_by,
        )
        first: list[ev.Event] = [created, *self._bind(rid, context)]
        if contract is not None:
            first.append(ev.DelegationBound(run_id=rid, seq=len(first) + 1, contract=contract))
        if isinstance(agent, Workflow):
            first.append(
                ev.WorkflowBound(
                    run_id=rid,
                    seq=len(first) + 1,
                    workflow=agent.name,
                    nodes=agent.structure(),
                    output_node=agent.output_node.name,
                )
            )
        if started and lease is not None:
            first.append(
                ev.RunStarted(
                    run_id=rid,
                    seq=len(first) + 1,
                    worker_id=self.worker_id,
                    actor=f"worker:{self.worker_id}",
                )
            )
        state = RunState(run_id=rid)
        first = stamp(state, first)
        try:
            await self.store.append(rid, first, expected_seq=0)
        except ConcurrencyConflict:
            if entry.idempotency_key is None:
                raise ConfigError(
                    f"a run with id {rid} exists already: choose another run id, or continue "
                    f"that run with `contextos resume {rid}`",
                    run_id=rid,
                ) from None
            return Created(rid, None, None)  # a concurrent start with the key recorded it first
        if lease is None:  # a worker in this process need not wait for its next poll
            wakeup.wake_local(self.store)
        for event in first:
            apply(state, event)
        return Created(rid, lease, state, tuple(first))

    async def _lineage(
        self, caused_by: str | None, context: RunContext | None
    ) -> tuple[str | None, str | None]:
        """The event of another run that starts a new one (`RUN_ID#SEQ`), and the run tree
        it joins: given, or the parent's when the context names one; (None, None) for a root."""
        parent = caused_by.partition("#")[0] if caused_by else None
        if parent is None and context is not None:
            parent = context.parent_run_id
        if not parent:
            return None, None
        source = await self.state(parent)
        return caused_by or f"{parent}#{source.seq}", source.correlation_id or parent


def _input_text(agent: Agent | Workflow, input: str | BaseModel | dict[str, Any]) -> str:
    if isinstance(agent, Workflow):
        return agent.input_text(input)
    if not isinstance(input, str):
        raise ConfigError(
            f"agent {agent.name} takes its input as text, not a {type(input).__name__}"
        )
    return input


def _keyed(
    metadata: dict[str, Any] | None, agent: object, context: RunContext | None
) -> dict[str, Any]:
    """The run's metadata with `principal` set from the bound context, the one key its usage is
    counted under; a caller cannot name it, and a layer keyed on it needs a bound principal."""
    out = dict(metadata or {})
    if "principal" in out:
        raise ConfigError(
            "metadata 'principal' is set by the runtime from the run's bound principal: "
            "pass principal= or context= instead",
            principal=str(out["principal"]),
        )
    if context is None:
        layer = needs_principal(getattr(agent, "stack", ()))  # a workflow has no stack
        if layer is not None:
            raise ConfigError(
                f"the {layer!r} layer keys on the run's principal and tenant, and this run has "
                "none bound: start it with principal= or context=",
                layer=layer,
            )
        return out
    out["principal"] = context.principal.ref
    return out
