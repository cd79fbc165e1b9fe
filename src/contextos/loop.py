"""The agentic loop: one step at a time, always from the folded state.

Each step reads the state, does one thing (call the model, run a pending tool call, verify an
answer) and records what happened before acting on it. Resuming is therefore "fold the events,
take the next step": a recorded model answer is never requested again, and a recorded tool
result is never produced again.

The driver of a run builds what it drives with: the agent's middleware chain, the tool gateway
whose every dispatch goes through that chain, and the policy gate that decides from the run's
own state.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import datetime
from itertools import takewhile
from typing import Any, Protocol, TypeVar

from pydantic import BaseModel

from contextos import events as ev
from contextos.agents import Agent
from contextos.causality import stamp
from contextos.context.compiled import HistoryIndex, compile_context
from contextos.context.rendered import RenderedLog
from contextos.errors import ModelError, ToolManifestChanged
from contextos.events import utcnow
from contextos.messages import FinishReason, Message, ToolCall
from contextos.middleware.base import (
    Chain,
    Middleware,
    ModelCall,
    RunEnd,
    RunView,
    Services,
    ToolCallInput,
)
from contextos.middleware.budget import daily_spend_of
from contextos.models.base import ModelAdapter, ModelRequest, ModelResponse, check_response
from contextos.policy.authority import Authority
from contextos.policy.gate import Gate
from contextos.policy.hook import PolicyHook
from contextos.policy.identity import RunContext, classification_rank
from contextos.runs import FailureReason, RunStatus
from contextos.state import RunState, apply
from contextos.store.artifacts import record_artifact
from contextos.store.base import EventStore, append_after
from contextos.tools.ask import HumanTool
from contextos.tools.batch import independent_reads, run_together
from contextos.tools.contract import Tool, ToolContext
from contextos.tools.effects import ToolRunner
from contextos.tools.gateway import Gateway
from contextos.tools.saga import Saga
from contextos.verify import feedback, verify_each
from contextos.verify import identity as verifier_identity

T = TypeVar("T")


class DeadlinePassed(Exception):
    """Internal: the run's deadline passed while a step was in flight."""


class Delegator(Protocol):
    """Runs the calls a model makes to delegate work to its agent's subagents."""

    def handles(self, tool: str) -> bool:
        """Whether calls to `tool` are delegations."""
        ...

    async def run(self, driver: Driver, calls: list[ToolCall]) -> None:
        """Take these pending calls (consecutive delegations) to their recorded results, or
        stop the driver (`stop_requested`) while a child waits for a person."""
        ...


class Driver:
    """Drives one run from its current state until it ends or waits."""

    def __init__(
        self,
        *,
        store: EventStore,
        agent: Agent,
        model: ModelAdapter,
        state: RunState,
        worker_id: str,
        authority: Authority | None = None,
        hook: PolicyHook | None = None,
        clock: Callable[[], datetime] = utcnow,
        gateway: ChainGateway | None = None,
    ) -> None:
        self.store = store
        self.agent = agent
        self.model = model
        self.state = state
        self.gateway = gateway or ChainGateway(
            agent.tool_list,
            chain_layers=agent.stack,
            model=model,
            services=Services(model=model, spend=daily_spend_of(store)),
            metadata=state.metadata,
            bound=state.context.context if state.context is not None else None,
            shown=_shown(agent, state),
        )
        """Where tool calls go (a replay passes one that serves recorded results)."""
        self.tool_specs = tuple(t.spec() for t in self.gateway.tools.values())
        """Every tool's schema: the compiler shows those the run may call, and records the rest."""
        self.chain: Chain = self.gateway.chain
        """The agent's middleware stack bound to this run."""
        self.gateway.policy = self._gate(authority, hook)
        self.worker_id = worker_id
        self.actor = f"worker:{worker_id}"
        self.clock = clock
        self.step_started = time.monotonic()
        """When the current step began (the runtime watches long steps for cancellation)."""
        self.stop_requested = False
        """Set by a draining worker: finish the current step, then return with the run running."""
        self.run_context = RunContext.from_dict(state.context.context) if state.context else None
        """The authority bound to the run: the model is shown only the tools it allows."""
        self.rendered = RenderedLog(state.prompt)
        """The prompts this driver recorded, so each call records only what changed."""
        self.history: HistoryIndex | None = None
        """The run's conversation as context entries, extended call by call."""
        self.on_commit: Callable[[tuple[ev.Event, ...]], Awaitable[None]] | None = None
        """Told of every batch of events once committed (live trace export)."""
        self.delegations: Delegator | None = None
        """Runs the model's calls to `delegate_to_<subagent>` tools (set by the runtime)."""
        self.stop_reason: str | None = None
        """Why the driver stopped a running run, when it was not asked to (see wake_after_s)."""
        self.wake_after_s: float | None = None
        """When it stopped to wait (for a child run that waits for a person): look again after
        this long."""

    def _gate(self, authority: Authority | None, hook: PolicyHook | None) -> PolicyHook | None:
        """Governed runs (a real policy, a context bound, or tools that ask a person) pass the
        policy gate, deciding from this run's state; any other only the bare hook, if any."""
        asks = any(isinstance(t, HumanTool) for t in self.agent.tool_list)
        if authority is None or (authority.implicit and self.state.context is None and not asks):
            return hook
        return Gate(authority, self.state, self.gateway.validated)

    # -- recording ------------------------------------------------------------------------

    def event(self, cls: type[Any], offset: int = 1, **fields: Any) -> Any:
        """Build the event that will be number `state.seq + offset`."""
        fields.setdefault("actor", self.actor)
        return cls(run_id=self.state.run_id, seq=self.state.seq + offset, **fields)

    async def commit(self, *events: ev.Event, synchronous: bool = True) -> None:
        """Append events in one transaction (the fence), then fold them in.

        `synchronous=False` does not wait for the disk (see `EventStore.append`): the commit of
        the next step flushes it.
        """
        # A person may have asked the run to end or to pause meanwhile: the events follow that.
        events = await append_after(
            self.store,
            self.state,
            events,
            requests=_REQUESTS,
            synchronous=synchronous,
            prepare=lambda batch: stamp(self.state, batch),
        )
        for e in events:
            apply(self.state, e)
        if self.on_commit is not None:
            await self.on_commit(events)

    async def fail(self, reason: FailureReason, text: str, **error: Any) -> None:
        if self.state.needs_settling:
            # Effects first (the saga), then the terminal event; a crash in between resumes it.
            await self.commit(
                self.event(
                    ev.RunEnding, outcome="failed", reason=reason.value, message=text, error=error
                )
            )
            await self.end()
            return
        await self.commit(self.event(ev.RunFailed, reason=reason, message=text, error=error))

    # -- the loop -------------------------------------------------------------------------

    async def drive(self) -> RunState:
        s = self.state
        if s.ending is not None and not s.is_terminal and s.status is not RunStatus.RUNNING:
            await self.end()  # asked to end while nobody drove it (queued, waiting on a person)
            return s
        await self.begin()
        while s.status is RunStatus.RUNNING and not self.stop_requested:
            self.step_started = time.monotonic()
            if s.ending is not None:
                await self.end()
            elif s.pause_requested is not None:
                asked = s.pause_requested
                paused = self.event(
                    ev.RunPaused, reason=asked.reason, actor=asked.actor, causation_id=asked.seq
                )
                await self.commit(paused)
            elif self.deadline_passed():
                await self.fail(FailureReason.TIMEOUT, "the run's deadline passed")
            elif s.pending_tool_calls:
                await self.run_tools()
            elif s.last_message is not None and s.last_message.role == "assistant":
                await self.finish()
            else:
                await self.call_model()
        return s

    async def begin(self) -> None:
        s = self.state
        if s.status in (RunStatus.QUEUED, RunStatus.PAUSED):
            await self.commit(self.event(ev.RunStarted, worker_id=self.worker_id))
        elif s.status is RunStatus.RUNNING and s.worker_id != self.worker_id:
            # Nobody released the run: its worker died mid-step. Say so, then carry on.
            await self.commit(
                self.event(ev.RuntimeCrashDetected, previous_worker_id=s.worker_id, last_seq=s.seq),
                self.event(ev.RunStarted, offset=2, worker_id=self.worker_id, recovered=True),
            )

    def deadline_passed(self) -> bool:
        return self.state.deadline_at is not None and self.clock() >= self.state.deadline_at

    async def within_deadline(self, work: Awaitable[T]) -> T:
        deadline = self.state.deadline_at
        if deadline is None:
            return await work
        remaining = (deadline - self.clock()).total_seconds()
        try:
            async with asyncio.timeout(max(remaining, 0)) as scope:
                return await work
        except TimeoutError:
            if scope.expired():
                raise DeadlinePassed() from None
            raise

    # -- steps ----------------------------------------------------------------------------

    def budget_exceeded(self) -> str | None:
        return budget_exceeded(self.state)

    # -- context compilation ------------------------------------------------------------

    def run_view(self) -> RunView:
        s = self.state
        return RunView(
            run_id=s.run_id,
            turn=s.turns + 1,
            turns=s.turns,
            usage=s.usage,
            budget=s.budget,
            metadata=dict(s.metadata),
            deadline_at=s.deadline_at,
            bound=s.context.context if s.context is not None else None,
        )

    def build_call(self) -> ModelCall:
        """The next model call's context from the folded state, before any middleware."""
        s = self.state
        output_type = self.agent.output_type
        if self.history is None:
            self.history = HistoryIndex(self.chain.trusted_tools)
        context = compile_context(
            run_id=s.run_id,
            agent=f"{self.agent.name}@{self.agent.version}",
            instructions=self.agent.instructions,
            messages=s.messages,
            message_seqs=s.message_seqs,
            tools=self.tool_specs,
            output_schema=output_type.model_json_schema() if output_type is not None else None,
            summary=s.context_summary,
            cursor=s.context_cursor,
            index=self.history,
            may_call=self.run_context.allows_tool if self.run_context else None,
        )
        return ModelCall(run=self.run_view(), context=context)

    def build_request(self) -> ModelRequest:
        """The request the model would get with no middleware at all."""
        call = self.build_call()
        return ModelRequest(
            messages=call.context.render(),
            tools=call.context.tools,
            output_schema=call.context.output_schema,
            run_id=call.run.run_id,
            turn=call.run.turn,
        )

    async def call_model(self) -> None:
        exhausted = self.budget_exceeded()
        if exhausted:
            await self.fail(FailureReason.BUDGET_EXHAUSTED, exhausted)
            return
        chain = self.chain
        try:
            call = self.build_call()
            result = await self.within_deadline(chain.model_call(call))
            if result.response is not None:
                # Whatever adapter answered, nothing is recorded that an event cannot hold.
                check_response(result.response, model=self.model.name)
        except DeadlinePassed:
            await self.fail(FailureReason.TIMEOUT, "the run's deadline passed during a model call")
            return
        except ModelError as exc:
            await self.fail(FailureReason.MODEL_ERROR, exc.message, **exc.fields, code=exc.code)
            return
        except Exception as exc:  # an adapter (or middleware) bug still ends the run with a reason
            await self.fail(
                FailureReason.MODEL_ERROR, f"{type(exc).__name__}: {exc}", code="model_error"
            )
            return
        events: list[ev.Event] = [
            self.event(
                ev.ContextCompacted,
                offset=i,
                summary=r.summary,
                through_seq=r.through_seq,
                usage=r.usage,
                model=r.model,
                messages=r.messages,
                tokens_before=r.tokens_before,
            )
            for i, r in enumerate(result.records, start=1)
        ]
        if result.stop is not None or result.response is None:
            if events:
                await self.commit(*events)
            stop = result.stop
            await self.fail(
                stop.reason if stop else FailureReason.MODEL_ERROR,
                stop.message if stop else "the middleware returned neither an answer nor a stop",
                code=stop.reason.value if stop else "model_error",
                layer=stop.layer if stop else None,
            )
            return
        response = result.response
        message = _with_unique_call_ids(response, call.run.turn)
        events.append(
            self.event(
                ev.ModelResponded,
                offset=len(events) + 1,
                message=message,
                finish_reason=response.finish_reason,
                usage=response.usage,
                model=response.model or self.model.name,
                latency_ms=result.latency_ms,
                request_id=response.request_id,
                context_hash=result.context_hash,
                context={
                    "manifest": list(result.manifest),
                    "stack": list(chain.names),
                    "telemetry": dict(result.telemetry),
                    **({"opted_out": dict(self.agent.opt_out)} if self.agent.opt_out else {}),
                    **self.rendered_delta(result.request),
                },
            )
        )
        if response.finish_reason is FinishReason.REFUSED:
            events.append(
                self.event(
                    ev.RunFailed,
                    offset=len(events) + 1,
                    reason=FailureReason.MODEL_REFUSED,
                    message=message.content or "the model refused",
                )
            )
            await self.commit(*events)
            return
        # Nothing leaves the process on an answer before the next step commits (a write's
        # effect is recorded before dispatch, a read's result after it, a final answer's
        # completion), and that commit flushes this one: a power loss in between only means
        # the model is asked again, as after any crash during the call.
        await self.commit(*events, synchronous=False)

    def rendered_delta(self, request: ModelRequest | None) -> dict[str, Any]:
        """The prompt the model received, as a delta on the previous call's (see `RenderedLog`)."""
        if request is None:
            return {}
        tools = (t.name for t in request.tools)
        log = (self.state.messages, self.state.message_seqs)
        return {"rendered": self.rendered.record(request.messages, tools, log)}

    async def after_run(self) -> None:
        """Let the stack act on a run that stopped being driven (e.g. write memory)."""
        chain = self.chain
        if not chain.acts_after_run:
            return  # no layer would read the log, so it is not read and decoded again
        s = self.state
        events = await self.store.read(s.run_id)
        await chain.after_run(RunEnd(run=self.run_view(), status=s.status, events=tuple(events)))

    @property
    def tools(self) -> ToolRunner:
        """The journaled tool path (gateway + effect ledger) for this run."""
        runner: ToolRunner | None = getattr(self, "_tool_runner", None)
        if runner is None:
            runner = ToolRunner(self, self.gateway)
            self._tool_runner = runner
        return runner

    async def run_tools(self) -> None:
        """Take the next pending call to its recorded result, or several at once: consecutive
        calls to subagents (each a child run), or consecutive independent read calls."""
        pending = self.state.pending_tool_calls
        d = self.delegations
        if d is not None and d.handles(pending[0].name):
            calls = list(takewhile(lambda c: d.handles(c.name), pending))
            await d.run(self, calls)
            await self.record_tool(calls[-1])
            return
        together = independent_reads(self.tools, pending)
        if not together:
            await self.run_tool(pending[0])
            return
        try:
            await run_together(self.tools, together)
        except ToolManifestChanged as exc:
            await self.manifest_changed(exc)
            return
        await self.record_tool(together[-1])

    async def run_tool(self, call: ToolCall) -> None:
        """Take one pending tool call to its recorded result; the runner journals each step.

        The per-attempt time limit already includes the run's deadline, so a call cut short by
        the deadline settles like a timeout (a write's outcome is then reconciled, not guessed).
        """
        try:
            await self.tools.run(call)
        except ToolManifestChanged as exc:
            await self.manifest_changed(exc)
            return
        await self.record_tool(call)

    async def manifest_changed(self, exc: ToolManifestChanged) -> None:
        # Not through fail(): settling would call tools whose contracts changed.
        await self.commit(
            self.event(
                ev.RunFailed,
                reason=FailureReason.TOOL_FAILED,
                message=exc.message,
                error=exc.to_dict(),
            )
        )

    async def record_tool(self, call: ToolCall) -> None:
        """After a call settled: end the run when tools keep failing (`tool_crashed` when the
        last one crashed: raised SystemExit, KeyboardInterrupt or a stray cancellation)."""
        s = self.state
        limit = s.budget.max_consecutive_tool_errors
        last = s.messages[-1] if s.messages else None
        if s.status is RunStatus.RUNNING and s.consecutive_tool_errors >= limit:
            crashed = s.last_tool_error == FailureReason.TOOL_CRASHED.value
            await self.fail(
                FailureReason.TOOL_CRASHED if crashed else FailureReason.TOOL_FAILED,
                f"{limit} tool calls in a row failed; the last: {last.content if last else ''}",
                tool=call.name,
            )

    async def end(self) -> None:
        """Finish a run that is ending: settle its effects (the saga), then end it."""
        s = self.state
        if not await Saga(self.tools).settle():
            return  # a person must confirm an effect first; the run waits, still ending
        assert s.ending is not None
        if s.ending.outcome == "cancelled":
            await self.commit(
                self.event(ev.RunCancelled, reason=s.ending.reason, actor=s.ending.actor)
            )
        else:
            reason, text, error = _ending_failure(s)
            await self.commit(self.event(ev.RunFailed, reason=reason, message=text, error=error))

    async def finish(self) -> None:
        s = self.state
        answer = s.last_message.content if s.last_message else ""
        answer_seq = s.message_seqs[-1]
        verdicts = await verify_each(self.agent.verifiers, answer)
        events: list[ev.Event] = []
        for v, verdict in verdicts:  # every verdict is evidence, passes included
            kind, version = verifier_identity(v)
            events.append(
                self.event(
                    ev.EvaluationRecorded,
                    offset=len(events) + 1,
                    evaluator=v.name,
                    evaluator_kind=kind,
                    evaluator_version=version,
                    subject_seq=answer_seq,
                    passed=verdict.passed,
                    gaps=verdict.gaps,
                )
            )
        failed = next(((v, d) for v, d in verdicts if not d.passed), None)
        if failed is None:
            structured = None
            for _, verdict in verdicts:
                if verdict.structured_output is not None:
                    structured = verdict.structured_output
            # A conversation waits for the next message with its answer instead of ending.
            done: type[ev.RunAnswered | ev.RunCompleted] = ev.RunAnswered
            if not self.agent.conversation:
                done = ev.RunCompleted
                output = await self.output_artifact(answer, structured, answer_seq)
                if output is not None:
                    events.append(self.event(ev.ArtifactRecorded, offset=len(events) + 1, **output))
            # The answer is the last model answer's text: named, not stored a second time.
            events.append(
                self.event(
                    done,
                    offset=len(events) + 1,
                    answer_seq=answer_seq,
                    structured_output=structured,
                )
            )
            await self.commit(*events)
            return
        verifier, verdict = failed[0].name, failed[1]
        if s.verification_attempts >= s.budget.max_verification_attempts:
            await self.commit(*events)
            await self.fail(
                FailureReason.VERIFICATION_FAILED,
                f"{verifier} still rejected the answer after "
                f"{s.verification_attempts} rounds of feedback: " + "; ".join(verdict.gaps),
                verifier=verifier,
            )
        else:
            events.append(
                self.event(
                    ev.VerificationFailed,
                    offset=len(events) + 1,
                    verifier=verifier,
                    gaps=verdict.gaps,
                    feedback=feedback(verdict.gaps),
                )
            )
            await self.commit(*events)

    async def finish_conversation(self, actor: str) -> None:
        """Complete a conversation that answered: its last answer becomes the run's output
        (and its output artifact), as if the run had been an ordinary one ending there."""
        answered = self.state.answered
        assert answered is not None, "check_finishable first"
        structured, seq = answered.structured_output, answered.answer_seq
        events: list[ev.Event] = []
        output = await self.output_artifact(self.state.output or "", structured, seq)
        if output is not None:
            events.append(self.event(ev.ArtifactRecorded, actor=actor, **output))
        events.append(
            self.event(
                ev.RunCompleted,
                offset=len(events) + 1,
                actor=actor,
                answer_seq=seq,
                structured_output=structured,
            )
        )
        await self.commit(*events)

    async def output_artifact(
        self, answer: str, structured: Any, answer_seq: int
    ) -> dict[str, Any] | None:
        """Store the run's final output as an artifact; the event fields that name it.

        Its lineage is the answer and every tool result the model had seen; its
        classification the most sensitive of what those tools return.
        """
        s = self.state
        tools_seen = [
            (m.name or "", seq)
            for m, seq in zip(s.messages, s.message_seqs, strict=True)
            if m.role == "tool"
        ]
        levels = ["internal"]
        for name, _ in tools_seen:
            t = self.gateway.tools.get(name)
            if t is not None:
                levels.append(t.output_classification or t.data_classification)
        output_type = self.agent.output_type
        schema = "text"
        if structured is not None and output_type is not None:
            digest = hashlib.sha256(
                json.dumps(output_type.model_json_schema(), sort_keys=True).encode()
            ).hexdigest()
            schema = f"{output_type.__name__}@{digest[:12]}"
        return await record_artifact(
            self.store,
            s,
            structured if structured is not None else answer,
            type="run_output",
            source_events=[answer_seq, *(seq for _, seq in tools_seen)],
            input_artifacts=s.artifacts,
            schema_version=schema,
            classification=max(levels, key=classification_rank),
        )


class ChainGateway(Gateway):
    """The tool gateway of one run: every dispatch attempt goes through the chain's tool hooks."""

    def __init__(
        self,
        tools: Sequence[Tool],
        *,
        chain_layers: Sequence[Middleware] = (),
        model: ModelAdapter,
        services: Services | None = None,
        metadata: Mapping[str, Any] | None = None,
        bound: Mapping[str, Any] | None = None,
        **gateway_options: Any,
    ) -> None:
        super().__init__(tools, **gateway_options)
        self.metadata = dict(metadata or {})
        self.bound = bound
        self.chain = Chain(chain_layers, model=model, dispatch=self._dispatch, services=services)

    async def dispatch(
        self, tool: Tool, args: BaseModel, ctx: ToolContext, *, timeout_s: float | None = None
    ) -> Any:
        view = RunView(run_id=ctx.run_id, turn=0, metadata=self.metadata, bound=self.bound)
        call = ToolCallInput(run=view, tool=tool, arguments=args, ctx=ctx, timeout_s=timeout_s)
        return await self.chain.tool_call(call)

    async def _dispatch(self, call: ToolCallInput) -> Any:
        return await Gateway.dispatch(
            self, call.tool, call.arguments, call.ctx, timeout_s=call.timeout_s
        )


_REQUESTS = (ev.RunEnding, ev.RunPauseRequested)
"""What a person may append to a run while a driver has it: the driver takes them in."""


def budget_exceeded(state: RunState) -> str | None:
    """Why the run may not call its model again, if it may not; what its child runs spent
    counts too (their budgets were carved out of this one)."""
    s, b = state, state.budget
    turns, usage = s.turns + s.child_turns, s.usage + s.child_usage
    if turns >= b.max_turns:
        if not b.max_turns:  # a child whose parent had nothing left to give
            return "the run's budget allows no model turn"
        return f"the run used all {b.max_turns} model turns"
    if b.max_tokens is not None and usage.total_tokens >= b.max_tokens:
        return f"the run used {usage.total_tokens} of {b.max_tokens} tokens"
    if b.max_cost_usd is not None and usage.cost_usd >= b.max_cost_usd:
        return f"the run spent ${usage.cost_usd:.4f} of ${b.max_cost_usd:.4f}"
    return None


def _shown(agent: Agent, state: RunState) -> set[str] | None:
    """The tools the model is told about: only those the run's bound context lets it call
    (None: all of them). The others stay in the manifest, where policy refuses a call."""
    bound = RunContext.from_dict(state.context.context) if state.context else None
    if bound is None or bound.tools is None:
        return None
    return {t.name for t in agent.tool_list if bound.allows_tool(t.name)}


def _ending_failure(state: RunState) -> tuple[FailureReason, str, dict[str, Any]]:
    """The failure a RunEnding(outcome=failed) announced."""
    ending = state.ending
    assert ending is not None
    try:
        reason = FailureReason(ending.reason)
    except ValueError:
        reason = FailureReason.TOOL_FAILED
    return reason, ending.message, dict(ending.error)


def _with_unique_call_ids(response: ModelResponse, turn: int) -> Message:
    """Number tool calls by turn and position: unique in the run and stable on resume.

    Providers' own ids repeat across turns (small local models always say `call_0`), and the
    idempotency key of an effect is derived from the call id, so the runtime names calls itself.
    """
    message = response.message
    calls = tuple(
        ToolCall(id=f"call_{turn}_{i}", name=c.name, arguments=c.arguments)
        for i, c in enumerate(message.tool_calls)
    )
    return Message(role="assistant", content=message.content, tool_calls=calls)
