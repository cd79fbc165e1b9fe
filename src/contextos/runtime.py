"""Runtime: the public facade. Start, drive, resume, cancel and inspect runs.

The CLI, the HTTP API and the web page use only this.
"""

from __future__ import annotations

import asyncio
import functools
import os
import socket
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

from pydantic import BaseModel

from contextos import events as ev
from contextos.agents import Agent, load_agent, load_ref
from contextos.context.rendered import RenderedCall, rendered_calls
from contextos.errors import (
    AgentChanged,
    ConfigError,
)
from contextos.evidence.canonical import DecisionRecord, ReplayPacket
from contextos.evidence.fork import fork_events
from contextos.evidence.keeping import Records
from contextos.evidence.packet import make_packet, packet_events
from contextos.evidence.record import Receipt, build_record
from contextos.evidence.record import receipts as stored_receipts
from contextos.evidence.replay import ReplayReport
from contextos.evidence.replay import replay as replay_run
from contextos.graph.children import ended_children
from contextos.graph.effects import check_confirmed_output
from contextos.graph.engine import WorkflowDriver
from contextos.graph.subagents import SubagentCalls
from contextos.graph.tree import RunTree, run_tree
from contextos.graph.workflow import Workflow
from contextos.hosting import ChildRuns
from contextos.loop import Driver
from contextos.middleware import PiiRedaction
from contextos.models import resolve_model
from contextos.models.base import ModelAdapter
from contextos.ownership import Ownership
from contextos.policy.authority import Authority
from contextos.policy.expiry import expire_overdue
from contextos.policy.hook import PolicyHook
from contextos.policy.identity import Principal, RunContext
from contextos.policy.rules import Policy
from contextos.records.interrupts import Approval, Interrupt
from contextos.releases import bound
from contextos.results import RunResult
from contextos.runs import RunId, RunStatus, check_priority
from contextos.starting import RunStarter
from contextos.state import RunState, apply, fold
from contextos.steering import Steering
from contextos.store import EventStore, RunSummary, open_store, wakeup
from contextos.store.artifacts import Artifact, artifacts_of
from contextos.store.base import DEFAULT_TENANT, load_state
from contextos.store.queue import (
    Lease,
    QueueEntry,
    RunOwner,
    RunQueue,
    queue_of,
)
from contextos.telemetry import Content, TimelineEntry, Trace, live_traces, timeline, trace_of
from contextos.tools.ask import HumanTool


def new_run_id_for_fork() -> RunId:
    return RunId(f"fork_{uuid.uuid4().hex[:20]}")


def default_worker_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:4]}"


class Runtime:
    """Runs agents durably on an event store.

    `store` is an EventStore, a store URL, or None for `CONTEXTOS_STORE` / ./.contextos/.
    """

    def __init__(
        self,
        store: EventStore | str | None = None,
        *,
        worker_id: str | None = None,
        cancel_poll_s: float = 0.5,
        policy: PolicyHook | Authority | Policy | str | os.PathLike[str] | None = None,
        lease_s: float = 30.0,
        tracer_provider: Any = None,
        capture_content: bool | str | None = None,
        meter_provider: Any = None,
        register: bool = True,
    ) -> None:
        self.store: EventStore = store if isinstance(store, EventStore) else open_store(store)
        self.authority: Authority | None = _authority_from(policy)
        """Policy, approver roles and clock: decides every tool call of governed runs and
        checks approvals (a policy file, a Policy, an Authority, or `CONTEXTOS_POLICY`)."""
        self.policy: PolicyHook | None = policy if isinstance(policy, PolicyHook) else None
        """A bare hook asked before every tool dispatch, when no authority is configured."""
        self._allow_all: Authority | None = None
        self.worker_id = worker_id or default_worker_id()
        self.cancel_poll_s = cancel_poll_s
        self._models: dict[str, ModelAdapter] = {}
        self.lease_s = lease_s
        """How long a lease on a run lasts without a heartbeat (renewed every third of it)."""
        self._queue: RunQueue | None = queue_of(self.store)
        self._own = Ownership(
            self.store,
            self._queue,
            worker_id=self.worker_id,
            lease_s=lease_s,
            cancel_poll_s=cancel_poll_s,
            register=register,
        )
        """The runs this runtime drives: their leases, how they stop (`register`: whether it
        enters itself in the worker registry while it drives runs, as a Worker does)."""
        self._starter = RunStarter(
            self.store,
            self._queue,
            worker_id=self.worker_id,
            lease_s=lease_s,
            announce=self._own.announce,
            bind=self._bind,
            admit=self._admit,
        )
        self._children = ChildRuns(
            self.store,
            self._queue,
            worker_id=self.worker_id,
            lease_s=lease_s,
            create=self._starter.create,
            resume=self._resume,
            cancel=self.cancel,
            pause=self.pause,
        )
        self._records = Records(self.store)
        """The DecisionRecords of the runs it drives, stored as they stop."""
        self._steering = Steering(
            self.store,
            self._own,
            leased=self._queue is not None,
            state=self.state,
            resume=lambda rid, agent, lease: self._resume(
                rid, agent, lease=lease, take_over=lease is None
            ),
            driver=self._driver,
            materialise=self._records.stopped,
            committed=self._committed,
            cancel_child=self._children.cancel_child,
            ended_children=functools.partial(ended_children, self.store),
        )
        """A person's hand on runs: cancel, pause, send, finish."""
        self._traces = live_traces(
            tracer_provider, capture_content, meter_provider, pii=PiiRedaction()
        )
        """Spans of runs as their events commit (`tracer_provider`, or OTEL_EXPORTER_OTLP_*),
        content as `capture_content` (or CONTEXTOS_OTEL_CAPTURE_CONTENT) says: `metadata` by
        default, `redacted` (through the PII layer), `hashes` or `full`; GenAI metrics on
        `meter_provider`."""

    async def __aenter__(self) -> Runtime:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._own.close()
        await self._records.stored()
        if self._traces is not None:
            self._traces.close()
        await self.store.close()

    # -- starting and driving -------------------------------------------------------------

    async def start(
        self,
        agent: Agent | Workflow,
        input: str | BaseModel | dict[str, Any],
        *,
        run_id: str | None = None,
        agent_ref: str | None = None,
        metadata: dict[str, Any] | None = None,
        idempotency_key: str | None = None,
        priority: int = 0,
        tenant: str | None = None,
        not_before: datetime | None = None,
        principal: Principal | None = None,
        context: RunContext | None = None,
        caused_by: str | None = None,
    ) -> RunId:
        """Create a queued run and return its id (nothing is executed yet).

        A worker claims it by `priority` (higher first), within the concurrency limits of its
        `tenant` and agent, not before `not_before`. A second start with the same
        `idempotency_key` creates nothing and returns the first start's run.

        `principal` (or a whole `context`: scopes, tool allowlist, clearance, containment) is
        the authority the run acts under, bound and recorded now; a child run's context must
        be within its parent's.

        A workflow runs like an agent; its `input` is validated against its input type.

        `caused_by` (`RUN_ID#SEQ`) names the event of another run that starts this one; the
        new run joins that run's tree (its correlation id). A child run's context names its
        parent, which does the same.
        """
        check_priority(priority)
        bound = await self._context_for(principal, context, tenant=tenant)
        created = await self._starter.create(
            agent,
            input,
            run_id=run_id,
            agent_ref=agent_ref,
            metadata=metadata,
            entry=QueueEntry(
                run_id=RunId(""),
                priority=priority,
                tenant=tenant or (bound.tenant if bound else ""),
                agent_name=agent.name,
                idempotency_key=idempotency_key,
                not_before=not_before,
            ),
            context=bound,
            caused_by=caused_by,
        )
        return created.run_id

    async def run(
        self,
        agent: Agent | Workflow,
        input: str | BaseModel | dict[str, Any],
        *,
        run_id: str | None = None,
        agent_ref: str | None = None,
        metadata: dict[str, Any] | None = None,
        principal: Principal | None = None,
        context: RunContext | None = None,
    ) -> RunResult:
        """Start a run and drive it until it ends or waits (leased to this runtime throughout)."""
        bound = await self._context_for(principal, context)
        created = await self._starter.create(
            agent,
            input,
            run_id=run_id,
            agent_ref=agent_ref,
            metadata=metadata,
            entry=QueueEntry(
                run_id=RunId(""), agent_name=agent.name, tenant=bound.tenant if bound else ""
            ),
            hold=True,
            context=bound,
            announce=True,
        )
        state = await self._resume(
            created.run_id,
            agent,
            lease=created.lease,
            take_over=created.lease is None,
            state=created.state,
        )
        return RunResult.from_state(state)

    async def resume(
        self,
        run_id: str,
        agent: Agent | Workflow | None = None,
        *,
        allow_changed_agent: bool = False,
        lease: Lease | None = None,
    ) -> RunResult:
        """Fold the run's events and drive it on from its current step.

        Without `agent`, the agent is imported from the reference recorded at start. An agent
        whose identity hash differs from the recorded one is refused unless
        `allow_changed_agent`: a run must not silently continue under different behaviour.

        The runtime drives under a lease on the run: `lease` is a worker's claim; without one
        it takes the lease from whoever holds it (a worker still driving the run notices at
        its next heartbeat and stops; the expected-seq fence covers the moments in between).
        Resuming without a lease takes over the run's child runs the same way.
        """
        state = await self._resume(
            run_id,
            agent,
            allow_changed_agent=allow_changed_agent,
            lease=lease,
            take_over=lease is None,
        )
        return RunResult.from_state(state)

    async def _resume(
        self,
        run_id: str,
        agent: Agent | Workflow | None,
        *,
        allow_changed_agent: bool = False,
        lease: Lease | None,
        take_over: bool,
        state: RunState | None = None,
        log: list[ev.Event] | None = None,
    ) -> RunState:
        """Drive a run on from its folded `state`, read from the store unless given (a run
        this runtime just created and holds); `log`, its log so far, is extended with every
        event the driver commits."""
        if state is None:
            state = await self.state(run_id)
        if state.status is RunStatus.INPUT_REQUIRED and await expire_overdue(
            self.store, state.run_id, now=self.governance.clock(), actor=f"worker:{self.worker_id}"
        ):
            state = await self.state(run_id)  # an interrupt expired: the run goes on, or ended
        waiting = state.status is RunStatus.INPUT_REQUIRED and state.ending is None
        if state.is_terminal or waiting:
            if lease is not None:
                await self._own.release_lease(lease)
            return state
        if agent is None:
            if not state.agent_ref:
                raise ConfigError(
                    f"run {run_id} was started without an agent reference; pass the agent",
                    run_id=run_id,
                )
            agent = load_ref(state.agent_ref)
        wanted = Workflow if state.workflow is not None else Agent
        if not isinstance(agent, wanted):
            raise ConfigError(
                f"run {run_id} is {'a workflow' if wanted is Workflow else 'an agent'} run; "
                f"resume it with {'the workflow' if wanted is Workflow else 'its agent'}, not a "
                f"{type(agent).__name__}",
                run_id=run_id,
            )
        if isinstance(agent, Agent):  # the candidate its release bound the run to, if any
            agent = bound(agent, state)
        if agent.identity_hash() != state.agent_hash and not allow_changed_agent:
            raise AgentChanged(
                f"run {run_id} was started by {state.agent_name} v{state.agent_version} "
                f"with identity {state.agent_hash[:12]}, but this agent is "
                f"{agent.identity_hash()[:12]}; resume with the same definition, or allow the "
                "change explicitly",
                run_id=run_id,
            )
        if lease is None and self._queue is not None:
            lease = await self._own.take(state.run_id)
            for event in await self.store.read(state.run_id, after_seq=state.seq):
                apply(state, event)
        return await self._drive(state, agent, lease, take_over=take_over, log=log)

    async def _drive(
        self,
        state: RunState,
        agent: Agent | Workflow,
        lease: Lease | None = None,
        *,
        take_over: bool = False,
        log: list[ev.Event] | None = None,
    ) -> RunState:
        if isinstance(agent, Workflow):
            flow = WorkflowDriver(
                store=self.store,
                workflow=agent,
                state=state,
                worker_id=self.worker_id,
                host=self._children.host(take_over=take_over, clock=self.governance.clock),
                clock=self.governance.clock,
            )
            return await self._supervise(flow, state, lease, log)
        driver = self._driver(state, agent)
        if agent.subagents:
            driver.delegations = SubagentCalls(
                agent,
                self._children.host(take_over=take_over, clock=self.governance.clock),
                parent_ref=state.agent_ref,
            )
        return await self._supervise(driver, state, lease, log)

    def _driver(self, state: RunState, agent: Agent) -> Driver:
        return Driver(
            store=self.store,
            agent=agent,
            model=self.model_for(agent),
            state=state,
            worker_id=self.worker_id,
            authority=self.governance,
            hook=self.policy,
        )

    async def _supervise(
        self,
        driver: Driver | WorkflowDriver,
        state: RunState,
        lease: Lease | None,
        log: list[ev.Event] | None = None,
    ) -> RunState:
        """Drive under the lease: renew it, watch for cancellation, hand back on a stop."""
        traced = None
        if self._traces is not None:
            traced = functools.partial(self._traces.committed, self.store, state.run_id)
        driver.on_commit = traced if log is None else _kept_in(log, traced)
        return await self._own.supervise(driver, state, lease, materialise=self._records.stopped)

    # -- ownership: leases, handing back, draining --------------------------------------

    async def owner(self, run_id: str) -> RunOwner | None:
        """Who drives the run now (the holder of its live lease), or None: nobody does."""
        return await self._own.owner(run_id)

    async def release(
        self,
        lease: Lease,
        *,
        reason: str,
        not_before: datetime | None = None,
        failed: bool = False,
    ) -> None:
        """Give a leased run back to the queue: RunReleased if it was running, then the lease.

        `not_before` is a durable timer (no worker claims the run before it); `failed` counts
        an attempt, for runs that keep failing.
        """
        state = await self.state(lease.run_id)
        await self._own.release(state, lease, reason=reason, not_before=not_before, failed=failed)

    def drain(self, *, reason: str = "the worker is shutting down", at_once: bool = False) -> None:
        """Let every run in flight finish its current step, then hand it back to the queue
        (recorded as released with `reason`, resumable).

        `at_once` cuts the step in flight instead: what it recorded stays, a tool call it had
        dispatched is settled when the run resumes, as after a crash.
        """
        self._own.drain(reason=reason, at_once=at_once)

    @property
    def in_flight(self) -> int:
        """Runs this runtime is driving now."""
        return self._own.in_flight

    def model_for(self, agent: Agent) -> ModelAdapter:
        if not isinstance(agent.model, str):
            return agent.model
        if agent.model not in self._models:
            self._models[agent.model] = resolve_model(agent.model)
        return self._models[agent.model]

    # -- control --------------------------------------------------------------------------

    async def cancel(
        self, run_id: str, *, reason: str = "", actor: str = "user", agent: Agent | None = None
    ) -> RunResult:
        """End a run as cancelled; a worker driving it notices and stops.

        A run with effects to settle (calls in flight, committed reversible writes to undo) is
        asked to end instead (`RunEnding`): its worker cancels the call in flight, resolves it,
        runs the compensations and then records the cancellation. So is a run a live driver
        holds with child runs in flight (a workflow's, an agent's subagents): they are
        cancelled, its driver records what they became (their spend counts in its own), then
        the cancellation, which this waits a few seconds for. A run nobody drives is settled
        here and now (with `agent`, or the agent its reference names; calls it never sent, such
        as one waiting for an approval, need neither).
        """
        state = await self._steering.cancel(RunId(run_id), reason=reason, actor=actor, agent=agent)
        return RunResult.from_state(state)

    async def pause(self, run_id: str, *, reason: str = "", actor: str = "user") -> RunResult:
        """Stop the run at its next step boundary: status `paused`, resumable with `resume`
        or `send`; no worker picks it up meanwhile.

        A run nobody drives pauses now. A run a live driver holds (a worker, `contextos run`,
        a script, in this process or another) gets a recorded request instead: the driver
        takes it in when its step in flight ends and pauses there, so the result may still
        say running. A workflow pauses its children in flight with it and starts nothing new;
        resumed, it drives them on. ControlRefused when the run ended or waits for a person.
        """
        state = await self._steering.pause(RunId(run_id), reason=reason, actor=actor)
        return RunResult.from_state(state)

    async def unpause(self, run_id: str, *, actor: str = "user") -> RunResult:
        """Let a paused run go on without driving it here: it is queued, and a worker drives
        it on from where it paused (a workflow, its paused children with it); `resume` drives
        it here instead. ControlRefused, with nothing recorded, unless the run is paused."""
        state = await self._steering.unpause(RunId(run_id), actor=actor)
        return RunResult.from_state(state)

    async def send(
        self,
        run_id: str,
        message: str,
        *,
        actor: str = "user",
        agent: Agent | None = None,
        drive: bool = True,
    ) -> RunResult:
        """Add a person's next message to a paused run or to a conversation that answered,
        and continue it as the same run: the model sees the whole conversation so far, then
        the message, under what is left of the run's budget.

        With `drive` (the default) the run is driven here until it answers, ends or waits
        again, as `resume` does; without, it is queued for a worker. ControlRefused, with
        nothing recorded, when the run cannot take a message now (it ended, it is running, it
        waits on a question, its budget is spent).
        """
        state = await self._steering.send(
            RunId(run_id), message, actor=actor, agent=agent, drive=drive
        )
        return RunResult.from_state(state)

    async def finish(
        self, run_id: str, *, actor: str = "user", agent: Agent | None = None
    ) -> RunResult:
        """Close a conversation that answered as completed: its last answer is the run's
        output and output artifact. ControlRefused, with nothing recorded, for any other run
        (one that ended, runs, waits on a question or is not a conversation)."""
        state = await self._steering.finish(RunId(run_id), actor=actor, agent=agent)
        return RunResult.from_state(state)

    async def _committed(self, run_id: RunId, events: Sequence[ev.Event]) -> None:
        """Tell live traces of events appended outside a driver (cancel, pause, ...)."""
        if self._traces is not None:
            await self._traces.committed(self.store, run_id, events)

    # -- authority: contexts, the policy gate, people answering interrupts ---------------

    @property
    def governance(self) -> Authority:
        """The configured authority, or an allow-all one for runs that only bound a context."""
        if self.authority is not None:
            return self.authority
        if self._allow_all is None:
            self._allow_all = Authority(Policy(), implicit=True)
        return self._allow_all

    async def _context_for(
        self, principal: Principal | None, context: RunContext | None, *, tenant: str | None = None
    ) -> RunContext | None:
        """The context to bind at start: given, derived from a principal, or (when a policy is
        configured, or the run is another tenant's) the local operator's, in `tenant`. None
        leaves an ungoverned run of the default tenant unbound."""
        if principal is None and context is None:
            if tenant and tenant != DEFAULT_TENANT:  # the run is listed and read as that tenant's
                principal = replace(Principal.local(), tenant=tenant)
            elif self.authority is None:
                return None
        bound = self.governance.context_for(principal, context)
        if tenant and bound.tenant != tenant:
            raise ConfigError(
                f"the run is started in tenant {tenant!r} as {bound.principal.ref}, of tenant "
                f"{bound.tenant!r}: start it as a principal of {tenant!r}"
            )
        await self.governance.check_child(self.store, bound)
        return bound

    def _admit(self, agent: Agent | Workflow) -> None:
        """A default guard an agent leaves out must be one the configured policy lets it."""
        if isinstance(agent, Agent):
            self.governance.check_opt_out(agent.name, agent.opt_out)

    def _bind(self, run_id: RunId, context: RunContext | None) -> list[ev.Event]:
        return [] if context is None else [self.governance.bound(run_id, 2, context)]

    async def inbox(self, *, limit: int = 200, tenant: str | None = None) -> list[Interrupt]:
        """Interrupts waiting for a person, across runs (only one tenant's when named), oldest
        first (with previews)."""
        return await self.governance.inbox(self.store, limit=limit, tenant=tenant)

    async def interrupt(self, interrupt_id: str) -> Interrupt:
        """One interrupt, pending or resolved."""
        return (await self.governance.find(self.store, interrupt_id))[1]

    async def approve(
        self,
        interrupt_id: str,
        *,
        approver: str | Principal,
        expires_in: timedelta | float | None = None,
        conditions: dict[str, Any] | None = None,
        action_hash: str | None = None,
    ) -> Approval:
        """Approve an interrupt's frozen action (idempotent); the run can then be resumed.

        Refused (ApprovalRefused) when `action_hash` is not the frozen action's, the approver
        lacks the role, started the run, or the conditions are already broken. An
        authenticated `Principal` approves with the roles the policy gives it in the run's
        tenant that it also carries.
        """
        approval = await self.governance.approve(
            self.store,
            interrupt_id,
            approver=approver,
            expires_in=expires_in,
            conditions=conditions,
            action_hash=action_hash,
        )
        wakeup.wake_local(self.store)  # the run is queued again
        return approval

    async def deny(self, interrupt_id: str, *, approver: str | Principal, reason: str = "") -> None:
        """Refuse an interrupt's action: the model is told, the run goes on without it."""
        await self.governance.deny(self.store, interrupt_id, approver=approver, reason=reason)
        wakeup.wake_local(self.store)

    async def answer(self, interrupt_id: str, value: Any, *, answered_by: str) -> dict[str, Any]:
        """Answer an interrupt with a value matching its kind's schema (and a workflow node's
        output with one of the node's type)."""
        answer = await self.governance.answer(
            self.store, interrupt_id, value, answered_by=answered_by, check=check_confirmed_output
        )
        wakeup.wake_local(self.store)
        return answer

    async def revoke(self, approval_id: str, *, revoked_by: str, reason: str = "") -> Approval:
        """Withdraw an approval; an action that has not run yet will not run on it."""
        return await self.governance.revoke(
            self.store, approval_id, revoked_by=revoked_by, reason=reason
        )

    # -- reading --------------------------------------------------------------------------

    async def events(self, run_id: str) -> list[ev.Event]:
        return await self.store.read(RunId(run_id))

    async def timeline(self, run_id: str, *, after_seq: int = 0) -> list[TimelineEntry]:
        """The run's events after `after_seq`, each as stored and in one readable line."""
        return timeline(await self.store.read(RunId(run_id), after_seq=after_seq))

    async def prompts(self, run_id: str) -> list[RenderedCall]:
        """Every model call of the run as the model received it, with the lineage beside it."""
        events = await self.store.read(RunId(run_id))
        state = fold(events, run_id)
        return rendered_calls(
            (e.data for e in timeline(events)), (state.messages, state.message_seqs)
        )

    async def trace(
        self,
        run_id: str,
        *,
        capture_content: Content = None,
        otlp_endpoint: str | None = None,
    ) -> Trace:
        """The run's trace, its child runs' spans included, as OpenTelemetry GenAI spans, sent
        over OTLP/HTTP to `otlp_endpoint` when given; content as `capture_content` says
        (`metadata`, `redacted` through the PII layer, `hashes` or `full`; default:
        CONTEXTOS_OTEL_CAPTURE_CONTENT). Needs the `otel` extra."""
        runs = [run_id, *(await self.tree(run_id)).child_run_ids()]  # one trace for all
        spans: list[Any] = []
        pii = PiiRedaction()
        for rid in runs:
            events = await self.store.read(RunId(rid))
            traced = trace_of(
                events, capture_content=capture_content, pii=pii, otlp_endpoint=otlp_endpoint
            )
            spans += traced.spans
        return Trace(tuple(spans))

    async def state(self, run_id: str) -> RunState:
        return await load_state(self.store, RunId(run_id))

    async def result(self, run_id: str) -> RunResult:
        return RunResult.from_state(await self.state(run_id))

    async def tree(self, run_id: str) -> RunTree:
        """The run with what it started: a workflow's nodes and every child run below them."""
        return await run_tree(self.store, RunId(run_id))

    async def runs(
        self,
        *,
        status: RunStatus | None = None,
        limit: int = 50,
        tenant: str | None = None,
        top_level: bool = False,
        prefix: str | None = None,
    ) -> list[RunSummary]:
        """Most recently updated runs first; only one status's, only one tenant's when named;
        `top_level`: only runs no other run started; `prefix`: only ids that start with it."""
        if top_level or prefix is not None:
            return await self.store.list_runs(
                status=status, limit=limit, tenant=tenant, top_level=top_level, prefix=prefix
            )
        return await self.store.list_runs(status=status, limit=limit, tenant=tenant)

    async def replay(
        self,
        source: str | ReplayPacket,
        agent: Agent | None = None,
        *,
        policy: Policy | Authority | str | os.PathLike[str] | None = None,
        keep: str | os.PathLike[str] | None = None,
    ) -> ReplayReport:
        """Re-run a recorded run (its id, or a ReplayPacket) against `agent` and compare their
        decisions; the recorded tool results and people's answers are served from the log, and
        no tool is ever called.

        Without `agent`, the agent is imported from the recorded reference. `policy` decides
        the replay's tool calls (default: this runtime's). The replay's own log is thrown away
        unless `keep` names a SQLite file to write it to.
        """
        if isinstance(source, ReplayPacket):
            events, ref = packet_events(source), source.agent_ref
        else:
            events = await self.events(source)
            ref = events[0].agent_ref if isinstance(events[0], ev.RunCreated) else None
        if any(isinstance(e, ev.WorkflowBound) for e in events):
            raise ConfigError(
                f"run {events[0].run_id} is a workflow: replay compares an agent's decisions; "
                "replay its child runs instead (`contextos show` lists them)"
            )
        if agent is None:
            if not ref:
                raise ConfigError(
                    "the run was recorded without an agent reference; pass the agent to replay"
                )
            agent = load_agent(ref)
            if isinstance(events[0], ev.RunCreated):  # the candidate its release ran, if any
                agent = bound(agent, events[0])
        authority = _authority_from(policy) if policy is not None else self.authority
        governed = any(isinstance(e, ev.ContextBound) for e in events) or any(
            isinstance(t, HumanTool) for t in agent.tool_list
        )
        if authority is None and governed:
            authority = self.governance
        return await replay_run(
            events,
            agent,
            model=self.model_for(agent),
            authority=authority,
            keep=os.fspath(keep) if keep is not None else None,
        )

    async def fork(
        self,
        run_id: str,
        *,
        at: int,
        agent: Agent | None = None,
        agent_ref: str | None = None,
        new_run_id: str | None = None,
    ) -> RunId:
        """Start a run whose history is the first `at` events of `run_id` and that goes on from
        there (queued, like `start`), with the recorded agent or `agent` (`agent_ref`: where
        workers import it from). No effect is sent twice: the fork sees the outcome and receipts
        of the calls the source run sent (`contextos.evidence.fork`). ForkRefused when `at` is
        not a point a run can go on from (the message says which seqs are)."""
        events = await self.events(run_id)
        rid = RunId(new_run_id) if new_run_id else new_run_id_for_fork()
        forked = fork_events(events, fork_id=rid, at=at, agent=agent, agent_ref=agent_ref)
        queue = queue_of(self.store)
        if queue is not None:
            source = await queue.queue_entry(RunId(run_id))
            entry = QueueEntry(
                run_id=rid,
                agent_name=fold(forked).agent_name,
                tenant=source.tenant if source is not None else "",
            )
            await queue.enqueue(entry, lease_owner=None, lease_s=self.lease_s)
        await self.store.append(rid, forked, expected_seq=0)
        wakeup.wake_local(self.store)
        return rid

    async def packet(self, run_id: str, *, agent_ref: str | None = None) -> ReplayPacket:
        """The ReplayPacket of a recorded run: its log and what it decided, pinned, to replay
        anywhere (`agent_ref`: the agent to replay by default, if not the recorded one)."""
        return make_packet(await self.events(run_id), agent_ref=agent_ref)

    async def record(self, run_id: str) -> DecisionRecord:
        """The run's DecisionRecord, projected from its log now."""
        return build_record(await self.events(run_id))

    async def receipts(self, run_id: str) -> list[Receipt]:
        """The DecisionRecords stored when the run stopped, each checked against its log (for
        a child run, the hash of its record its parent took in)."""
        await self._records.stored()
        return await stored_receipts(self.store, await self.events(run_id))

    async def artifacts(self, run_id: str) -> list[Artifact]:
        """The artifacts a run recorded, in the order it recorded them."""
        return [
            Artifact.from_event(e)
            for e in await self.events(run_id)
            if isinstance(e, ev.ArtifactRecorded)
        ]

    async def artifact(self, artifact_id: str) -> tuple[Artifact, bytes]:
        """An artifact and its content (checked against its hash)."""
        store = artifacts_of(self.store)
        if store is None:
            raise ConfigError(f"the store {self.store.url} keeps no artifacts")
        return await store.get_artifact(artifact_id), await store.artifact_content(artifact_id)


def _kept_in(
    log: list[ev.Event], then: Callable[[tuple[ev.Event, ...]], Awaitable[None]] | None
) -> Callable[[tuple[ev.Event, ...]], Awaitable[None]]:
    """A driver's commit hook that adds each committed batch to `log`, then calls `then`."""

    async def committed(events: tuple[ev.Event, ...]) -> None:
        log.extend(events)
        if then is not None:
            await then(events)

    return committed


def _authority_from(
    policy: PolicyHook | Authority | Policy | str | os.PathLike[str] | None,
) -> Authority | None:
    if isinstance(policy, Authority):
        return policy
    if isinstance(policy, Policy | str | os.PathLike):
        return Authority(policy)
    if policy is None and os.environ.get("CONTEXTOS_POLICY"):
        return Authority()
    return None


def run(
    agent: Agent | Workflow,
    input: str | BaseModel | dict[str, Any],
    *,
    store: EventStore | str | None = None,
) -> RunResult:
    """Run an agent or a workflow to the end from synchronous code (a script, a notebook)."""

    async def _main() -> RunResult:
        async with Runtime(store) as runtime:
            return await runtime.run(agent, input)

    return asyncio.run(_main())
