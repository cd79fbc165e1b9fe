"""Runtime: the public facade. Start, drive, resume, cancel and inspect runs.

The CLI, the HTTP API and the web page use only this.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
import uuid
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from contextos import events as ev
from contextos.agents import Agent, load_agent
from contextos.errors import (
    AgentChanged,
    ConcurrencyConflict,
    ConfigError,
    RunIsTerminal,
)
from contextos.events import utcnow
from contextos.loop import Driver
from contextos.messages import Usage
from contextos.models import resolve_model
from contextos.models.base import ModelAdapter
from contextos.policy.decision import PolicyHook
from contextos.runs import FailureReason, RunId, RunStatus
from contextos.state import RunState, fold
from contextos.store import EventStore, RunSummary, open_store
from contextos.tools.effects import needs_settling
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
        policy: PolicyHook | None = None,
    ) -> None:
        self.store: EventStore = store if isinstance(store, EventStore) else open_store(store)
        self.policy = policy
        """Asked before every tool dispatch; None allows every call."""
        self.worker_id = worker_id or default_worker_id()
        self.cancel_poll_s = cancel_poll_s
        self._models: dict[str, ModelAdapter] = {}
        self._inflight: dict[RunId, tuple[Driver, asyncio.Task[RunState]]] = {}
        self._cancelled: set[RunId] = set()
        self._watcher: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Runtime:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
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
    ) -> RunId:
        """Create a queued run and return its id (nothing is executed yet)."""
        rid = RunId(run_id) if run_id else new_run_id()
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
        await self.store.append(rid, [created], expected_seq=0)
        return rid

    async def run(
        self,
        agent: Agent,
        input: str,
        *,
        run_id: str | None = None,
        agent_ref: str | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> RunResult:
        """Start a run and drive it until it ends or waits."""
        rid = await self.start(agent, input, run_id=run_id, agent_ref=agent_ref, metadata=metadata)
        return await self.resume(rid, agent)

    async def resume(
        self, run_id: str, agent: Agent | None = None, *, allow_changed_agent: bool = False
    ) -> RunResult:
        """Fold the run's events and drive it on from its current step.

        Without `agent`, the agent is imported from the reference recorded at start. An agent
        whose identity hash differs from the recorded one is refused unless
        `allow_changed_agent`: a run must not silently continue under different behaviour.
        """
        state = await self.state(run_id)
        waiting = state.status is RunStatus.INPUT_REQUIRED and state.ending is None
        if state.is_terminal or waiting:
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
        return await self._drive(state, agent)

    async def _drive(self, state: RunState, agent: Agent) -> RunResult:
        driver = Driver(
            store=self.store,
            agent=agent,
            model=self.model_for(agent),
            gateway=Gateway(agent.tool_list, policy=self.policy),
            state=state,
            worker_id=self.worker_id,
        )
        task = asyncio.create_task(driver.drive())
        self._inflight[state.run_id] = (driver, task)
        if self._watcher is None or self._watcher.done():
            self._watcher = asyncio.create_task(self._watch_for_cancel())
        try:
            await task
        except asyncio.CancelledError:
            if state.run_id not in self._cancelled:
                raise  # we were cancelled from outside: pass it on
        except (ConcurrencyConflict, RunIsTerminal):
            pass  # another writer moved the run on (a cancel, another worker); we stop here
        finally:
            self._inflight.pop(state.run_id, None)
            self._cancelled.discard(state.run_id)
        return RunResult.from_state(await self.state(state.run_id))

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
            if needs_settling(state):
                event = ev.RunEnding(
                    run_id=rid, seq=state.seq + 1, outcome="cancelled", reason=reason, actor=actor
                )
            else:
                event = ev.RunCancelled(run_id=rid, seq=state.seq + 1, reason=reason, actor=actor)
            try:
                await self.store.append(rid, [event], expected_seq=state.seq)
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

    # -- reading --------------------------------------------------------------------------

    async def events(self, run_id: str) -> list[ev.Event]:
        return await self.store.read(RunId(run_id))

    async def state(self, run_id: str) -> RunState:
        return fold(await self.events(run_id), run_id)

    async def result(self, run_id: str) -> RunResult:
        return RunResult.from_state(await self.state(run_id))

    async def runs(self, *, status: RunStatus | None = None, limit: int = 50) -> list[RunSummary]:
        return await self.store.list_runs(status=status, limit=limit)


def run(agent: Agent, input: str, *, store: EventStore | str | None = None) -> RunResult:
    """Run an agent to the end from synchronous code (a script, a notebook)."""

    async def _main() -> RunResult:
        async with Runtime(store) as runtime:
            return await runtime.run(agent, input)

    return asyncio.run(_main())
