"""Runtime: the public facade. Start, drive, resume, cancel and inspect runs.

The CLI, the HTTP API and the web page use only this.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import socket
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from contextos import events as ev
from contextos.agents import Agent, load_agent
from contextos.context.rendered import RenderedCall, rendered_calls
from contextos.errors import (
    AgentChanged,
    ConcurrencyConflict,
    ConfigError,
    RunIsTerminal,
    RunNotFound,
)
from contextos.events import utcnow
from contextos.loop import Driver
from contextos.messages import Usage
from contextos.middleware.base import needs_principal
from contextos.models import resolve_model
from contextos.models.base import ModelAdapter
from contextos.policy.authority import Authority
from contextos.policy.expiry import expire_overdue
from contextos.policy.hook import PolicyHook
from contextos.policy.identity import Principal, RunContext
from contextos.policy.rules import Policy
from contextos.records.interrupts import Approval, Interrupt
from contextos.runs import FailureReason, RunId, RunStatus, check_priority
from contextos.state import RunState, apply
from contextos.store import EventStore, RunSummary, open_store, wakeup
from contextos.store.base import load_state
from contextos.store.queue import Lease, QueueEntry, queue_of
from contextos.telemetry import TimelineEntry, Trace, live_traces, timeline, trace_of
from contextos.tools.gateway import Gateway


@dataclass(frozen=True, kw_only=True, slots=True)
class RunResult:
    """Where a run stands after the runtime stopped driving it."""

    run_id: RunId
    """The run."""
    status: RunStatus
    """Its status."""
    output: str | None = None
    """Final answer, when completed."""
    structured_output: Any = None
    """Final answer parsed into the agent's output type."""
    failure_reason: FailureReason | None = None
    """Why it failed or was cancelled."""
    failure_message: str | None = None
    """Human-readable detail."""
    turns: int = 0
    """Model calls answered."""
    usage: Usage = field(default_factory=Usage)
    """Tokens and cost."""

    @property
    def ok(self) -> bool:
        return self.status is RunStatus.COMPLETED

    @classmethod
    def from_state(cls, s: RunState) -> RunResult:
        return cls(
            run_id=s.run_id,
            status=s.status,
            output=s.output,
            structured_output=s.structured_output,
            failure_reason=s.failure_reason,
            failure_message=s.failure_message,
            turns=s.turns,
            usage=s.usage,
        )


def new_run_id() -> RunId:
    return RunId(f"run_{uuid.uuid4().hex[:20]}")


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
        capture_content: bool | None = None,
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
        self._inflight: dict[RunId, tuple[Driver, asyncio.Task[RunState]]] = {}
        self._cancelled: set[RunId] = set()
        self._watcher: asyncio.Task[None] | None = None
        self.lease_s = lease_s
        """How long a lease on a run lasts without a heartbeat (renewed every third of it)."""
        self._leases: dict[RunId, Lease] = {}
        self._renewed_at: dict[RunId, float] = {}
        self._keeper: asyncio.Task[None] | None = None
        self._draining = False
        self._traces = live_traces(tracer_provider, capture_content)
        """Spans of runs as their events commit (`tracer_provider`, or OTEL_EXPORTER_OTLP_*);
        message content only with `capture_content` or CONTEXTOS_OTEL_CAPTURE_CONTENT."""

    async def __aenter__(self) -> Runtime:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
        if self._keeper is not None:
            self._keeper.cancel()
        if self._traces is not None:
            self._traces.close()
        await self.store.close()

    # -- starting and driving -------------------------------------------------------------

    async def start(
        self,
        agent: Agent,
        input: str,
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
    ) -> RunId:
        """Create a queued run and return its id (nothing is executed yet).

        A worker claims it by `priority` (higher first), within the concurrency limits of its
        `tenant` and agent, not before `not_before`. A second start with the same
        `idempotency_key` creates nothing and returns the first start's run.

        `principal` (or a whole `context`: scopes, tool allowlist, clearance, containment) is
        the authority the run acts under, bound and recorded now; a child run's context must
        be within its parent's.
        """
        check_priority(priority)
        bound = await self._context_for(principal, context)
        rid, _ = await self._create(
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
        )
        return rid

    async def _create(
        self,
        agent: Agent,
        input: str,
        *,
        run_id: str | None,
        agent_ref: str | None,
        metadata: dict[str, Any] | None,
        entry: QueueEntry,
        hold: bool = False,
        context: RunContext | None = None,
    ) -> tuple[RunId, Lease | None]:
        """Queue the run, then record RunCreated; with `hold`, leased to this runtime.

        The queue row comes first so that no worker can see a created run before it is
        queued, and a start that dies in between is finished by the next start with its key.
        """
        metadata = _keyed(metadata, agent, context)
        rid = RunId(run_id) if run_id else new_run_id()
        lease: Lease | None = None
        queue = queue_of(self.store)
        if queue is not None:
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
                    return owner, None
                except RunNotFound:
                    rid = owner  # that start died before recording its run: record it now
        now = utcnow()
        deadline_s = agent.budget.deadline_s
        created = ev.RunCreated(
            run_id=rid,
            seq=1,
            occurred_at=now,
            actor="runtime",
            agent_name=agent.name,
            agent_version=agent.version,
            agent_hash=agent.identity_hash(),
            agent_ref=agent_ref,
            input=input,
            budget=agent.budget,
            deadline_at=now + timedelta(seconds=deadline_s) if deadline_s is not None else None,
            tool_manifest_hash=Gateway(agent.tool_list).manifest_hash,
            metadata=metadata or {},
        )
        try:
            await self.store.append(rid, [created, *self._bind(rid, context)], expected_seq=0)
        except ConcurrencyConflict:
            if entry.idempotency_key is None:
                raise
            return rid, None  # a concurrent start with the same key recorded it first
        if lease is None:  # a worker in this process need not wait for its next poll
            wakeup.wake_local(self.store)
        return rid, lease

    async def run(
        self,
        agent: Agent,
        input: str,
        *,
        run_id: str | None = None,
        agent_ref: str | None = None,
        metadata: dict[str, Any] | None = None,
        principal: Principal | None = None,
        context: RunContext | None = None,
    ) -> RunResult:
        """Start a run and drive it until it ends or waits (leased to this runtime throughout)."""
        bound = await self._context_for(principal, context)
        rid, lease = await self._create(
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
        )
        return await self.resume(rid, agent, lease=lease)

    async def resume(
        self,
        run_id: str,
        agent: Agent | None = None,
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
        """
        state = await self.state(run_id)
        if state.status is RunStatus.INPUT_REQUIRED and await expire_overdue(
            self.store, state.run_id, now=self.governance.clock(), actor=f"worker:{self.worker_id}"
        ):
            state = await self.state(run_id)  # an interrupt expired: the run goes on, or ended
        waiting = state.status is RunStatus.INPUT_REQUIRED and state.ending is None
        if state.is_terminal or waiting:
            if lease is not None:
                await self._release(lease)
            return RunResult.from_state(state)
        if agent is None:
            if not state.agent_ref:
                raise ConfigError(
                    f"run {run_id} was started without an agent reference; pass the agent",
                    run_id=run_id,
                )
            agent = load_agent(state.agent_ref)
        if agent.identity_hash() != state.agent_hash and not allow_changed_agent:
            raise AgentChanged(
                f"run {run_id} was started by {state.agent_name} v{state.agent_version} "
                f"with identity {state.agent_hash[:12]}, but this agent is "
                f"{agent.identity_hash()[:12]}; resume with the same definition, or allow the "
                "change explicitly",
                run_id=run_id,
            )
        queue = queue_of(self.store)
        if lease is None and queue is not None:
            lease = await queue.acquire(state.run_id, self.worker_id, lease_s=self.lease_s)
            for event in await self.store.read(state.run_id, after_seq=state.seq):
                apply(state, event)
        return await self._drive(state, agent, lease)

    async def _drive(self, state: RunState, agent: Agent, lease: Lease | None = None) -> RunResult:
        driver = Driver(
            store=self.store,
            agent=agent,
            model=self.model_for(agent),
            state=state,
            worker_id=self.worker_id,
            authority=self.governance,
            hook=self.policy,
        )
        driver.stop_requested = self._draining
        if self._traces is not None:
            driver.on_commit = functools.partial(self._traces.committed, self.store, state.run_id)
        task = asyncio.create_task(driver.drive())
        self._inflight[state.run_id] = (driver, task)
        if lease is not None:
            self._leases[state.run_id] = lease
            self._renewed_at[state.run_id] = time.monotonic()
            if self._keeper is None or self._keeper.done():
                self._keeper = asyncio.create_task(self._keep_leases())
        if self._watcher is None or self._watcher.done():
            self._watcher = asyncio.create_task(self._watch_for_cancel())
        try:
            await task
            await driver.after_run()
        except asyncio.CancelledError:
            if state.run_id not in self._cancelled:
                raise  # we were cancelled from outside: pass it on
        except (ConcurrencyConflict, RunIsTerminal):
            pass  # another writer moved the run on (a cancel, another worker); we stop here
        finally:
            self._inflight.pop(state.run_id, None)
            self._cancelled.discard(state.run_id)
            held = self._leases.pop(state.run_id, None)
            self._renewed_at.pop(state.run_id, None)
        if held is not None:  # still ours (a lost lease is not ours to give back)
            if driver.stop_requested and driver.state.status is RunStatus.RUNNING:
                await self._hand_back(driver.state, "the worker is shutting down")
            await self._release(held)
        # The driver's state is the log up to its seq; fold in whatever others added since.
        for event in await self.store.read(state.run_id, after_seq=driver.state.seq):
            apply(driver.state, event)
        return RunResult.from_state(driver.state)

    # -- leases ---------------------------------------------------------------------------

    async def _keep_leases(self) -> None:
        """Renew the leases of runs in flight; stop driving a run whose lease was lost.

        A lease is lost when another worker took it (ours had expired: we were too slow or cut
        off) or when it could not be renewed for a whole lease period. Either way someone else
        may be driving the run now, so this runtime stops appending to it.
        """
        queue = queue_of(self.store)
        assert queue is not None
        while self._leases:
            await asyncio.sleep(self.lease_s / 3)
            for run_id, lease in list(self._leases.items()):
                try:
                    renewed = await queue.renew(lease, lease_s=self.lease_s)
                except Exception:  # the store is unreachable: keep trying while the lease lasts
                    since = self._renewed_at.get(run_id, time.monotonic())
                    if time.monotonic() - since < self.lease_s:
                        continue
                    renewed = None
                if run_id not in self._leases:
                    continue  # it finished meanwhile
                if renewed is not None:
                    self._leases[run_id] = renewed
                    self._renewed_at[run_id] = time.monotonic()
                    continue
                self._leases.pop(run_id, None)
                inflight = self._inflight.get(run_id)
                if inflight is not None and not inflight[1].done():
                    self._cancelled.add(run_id)
                    inflight[1].cancel()

    async def _release(self, lease: Lease, **kwargs: Any) -> None:
        queue = queue_of(self.store)
        if queue is not None:
            await queue.release(lease, **kwargs)

    async def _hand_back(self, state: RunState, reason: str) -> None:
        """Record that this worker let go of a running run (the next one does not cry crash)."""
        event = ev.RunReleased(
            run_id=state.run_id,
            seq=state.seq + 1,
            worker_id=self.worker_id,
            reason=reason,
            actor=f"worker:{self.worker_id}",
        )
        with contextlib.suppress(ConcurrencyConflict, RunIsTerminal):
            await self.store.append(state.run_id, [event], expected_seq=state.seq)

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
        if state.status is RunStatus.RUNNING:
            await self._hand_back(state, reason)
        await self._release(lease, not_before=not_before, failed=failed)

    def drain(self) -> None:
        """Let every run in flight finish its current step, then hand it back to the queue."""
        self._draining = True
        for driver, _ in self._inflight.values():
            driver.stop_requested = True

    @property
    def in_flight(self) -> int:
        """Runs this runtime is driving now."""
        return len(self._inflight)

    async def _watch_for_cancel(self) -> None:
        """Cancel in-flight steps of runs that someone else ended.

        Short steps need no watching: their next append hits the fence. Only a step in flight
        for longer than the poll interval (a slow tool, a slow model) costs a status read, so a
        thousand concurrent runs do not mean a thousand reads per interval.
        """
        while self._inflight:
            await asyncio.sleep(self.cancel_poll_s)
            now = time.monotonic()
            for run_id, (driver, task) in list(self._inflight.items()):
                if task.done() or now - driver.step_started < self.cancel_poll_s:
                    continue
                summary = await self.store.get_run(run_id)
                if summary.status.is_terminal and not task.done():
                    self._cancelled.add(run_id)
                    task.cancel()

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
        runs the compensations and then records the cancellation. A run nobody drives is
        settled here and now (with `agent`, or the agent its reference names).
        """
        rid = RunId(run_id)
        while True:
            state = await self.state(rid)
            if state.is_terminal or state.ending is not None:
                break
            event: ev.Event
            if state.needs_settling:
                event = ev.RunEnding(
                    run_id=rid, seq=state.seq + 1, outcome="cancelled", reason=reason, actor=actor
                )
            else:
                event = ev.RunCancelled(run_id=rid, seq=state.seq + 1, reason=reason, actor=actor)
            try:
                await self.store.append(rid, [event], expected_seq=state.seq)
                if self._traces is not None:
                    await self._traces.committed(self.store, rid, [event])
                if isinstance(event, ev.RunEnding) and state.status is not RunStatus.RUNNING:
                    with contextlib.suppress(ConfigError, AgentChanged):
                        # without its agent it stays ending; the next resume settles it
                        return await self.resume(rid, agent)
                break
            except ConcurrencyConflict:
                continue  # the worker appended meanwhile; try again on the new tail
            except RunIsTerminal:
                break
        return RunResult.from_state(await self.state(rid))

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
        self, principal: Principal | None, context: RunContext | None
    ) -> RunContext | None:
        """The context to bind at start: given, derived from a principal, or (when a policy is
        configured) the local operator's. None leaves an ungoverned run unbound."""
        if principal is None and context is None and self.authority is None:
            return None
        bound = self.governance.context_for(principal, context)
        await self.governance.check_child(self.store, bound)
        return bound

    def _bind(self, run_id: RunId, context: RunContext | None) -> list[ev.Event]:
        return [] if context is None else [self.governance.bound(run_id, 2, context)]

    async def inbox(self, *, limit: int = 200) -> list[Interrupt]:
        """Interrupts waiting for a person, across runs, oldest first (with previews)."""
        return await self.governance.inbox(self.store, limit=limit)

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
        """Answer an interrupt with a value matching its kind's schema."""
        answer = await self.governance.answer(
            self.store, interrupt_id, value, answered_by=answered_by
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
        return rendered_calls(e.data for e in await self.timeline(run_id))

    async def trace(
        self,
        run_id: str,
        *,
        capture_content: bool | None = None,
        otlp_endpoint: str | None = None,
    ) -> Trace:
        """The run's trace as OpenTelemetry GenAI spans, sent over OTLP/HTTP to
        `otlp_endpoint` when given; message content only with `capture_content` (default:
        CONTEXTOS_OTEL_CAPTURE_CONTENT). Needs the `otel` extra."""
        events = await self.store.read(RunId(run_id))
        return trace_of(events, capture_content=capture_content, otlp_endpoint=otlp_endpoint)

    async def state(self, run_id: str) -> RunState:
        return await load_state(self.store, RunId(run_id))

    async def result(self, run_id: str) -> RunResult:
        return RunResult.from_state(await self.state(run_id))

    async def runs(
        self, *, status: RunStatus | None = None, limit: int = 50, tenant: str | None = None
    ) -> list[RunSummary]:
        """Most recently updated runs first; only one status's, only one tenant's when named."""
        return await self.store.list_runs(status=status, limit=limit, tenant=tenant)


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


def run(agent: Agent, input: str, *, store: EventStore | str | None = None) -> RunResult:
    """Run an agent to the end from synchronous code (a script, a notebook)."""

    async def _main() -> RunResult:
        async with Runtime(store) as runtime:
            return await runtime.run(agent, input)

    return asyncio.run(_main())


def _keyed(
    metadata: dict[str, Any] | None, agent: Agent, context: RunContext | None
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
        layer = needs_principal(agent.stack)
        if layer is not None:
            raise ConfigError(
                f"the {layer!r} layer keys on the run's principal and tenant, and this run has "
                "none bound: start it with principal= or context=",
                layer=layer,
            )
        return out
    out["principal"] = context.principal.ref
    return out
