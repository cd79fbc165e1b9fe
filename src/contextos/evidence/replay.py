"""Replay: a recorded run, re-run against a changed agent, with the recorded tool results.

The replay is a real run of the new agent (its instructions, model, tools, middleware and the
policy given) on a throwaway store, driven by the same loop as any run. Only the tools are not
real: the replay's gateway serves each call the result the recorded run got for the same tool
and arguments, and its tools are sealed, so nothing a replay does can reach a live tool (a
sealed tool raises `LiveDispatchRefused` if anything calls it). People's recorded answers are
given again to the questions the replay asks about the same calls, through the same checks.

The report compares the two runs' decisions (`decisions.Trail`): `replay_equal` when the tool
calls chosen, their arguments, policy's decisions, people's answers, the verdicts and the final
output are the same; `replay_mismatch` with a readable diff otherwise.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import tempfile
import uuid
from collections import defaultdict, deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel

from contextos import events as ev
from contextos.agents import Agent
from contextos.causality import stamp
from contextos.errors import ApprovalRefused, LiveDispatchRefused
from contextos.events import utcnow
from contextos.evidence.decisions import Difference, Trail, arguments, compare, trail
from contextos.loop import ChainGateway, Driver
from contextos.middleware.base import Services, ToolCallInput
from contextos.middleware.budget import daily_spend_of
from contextos.models.base import ModelAdapter
from contextos.policy.authority import Authority
from contextos.policy.identity import RunContext
from contextos.runs import RunId, RunStatus
from contextos.state import RunState
from contextos.store.base import load_state
from contextos.store.sqlite import SqliteStore
from contextos.tools.contract import Tool
from contextos.tools.gateway import Gateway, Rendered

_REFUSALS = frozenset({"policy_denied", "approval_required", "unknown_tool", "invalid_arguments"})
"""Outcomes decided before any dispatch: a replay decides those itself."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Recorded:
    """What one call of the recorded run got back from its tool."""

    seq: int
    """Seq of the recorded `tool_completed`."""
    output: str
    """The text the model was shown."""
    is_error: bool
    """True when the call failed."""
    error_type: str | None = None
    """For a failure the tool raised: its class name, as recorded."""
    error: str | None = None
    """For a failure the tool raised: its message, as recorded."""
    receipts: dict[str, str] = field(default_factory=dict)
    """The effect's receipts."""


class NotRecorded(Exception):
    """The replay made a call the recorded run never made: it has no result to serve."""


class _RecordedFailure(Exception):
    """A failure the recorded call ended with, raised again under its recorded class name."""


def _failure(recorded: Recorded) -> Exception:
    kind: type[Exception] = type(recorded.error_type or "ToolError", (_RecordedFailure,), {})
    return kind(recorded.error or recorded.output)


@dataclass(frozen=True, kw_only=True, slots=True)
class _Served:
    """A recorded result, handed back instead of a tool's return value."""

    recorded: Recorded
    source: str


class Transcript:
    """The recorded run's tool results and people's answers, matched by what was asked:
    the tool and its arguments (each recorded result is served once, in order)."""

    def __init__(self, events: Sequence[ev.Event], tools: Sequence[Tool]) -> None:
        self.run_id = events[0].run_id
        models = {t.name: t.args_model for t in tools}
        self._results: dict[tuple[str, str], deque[Recorded]] = defaultdict(deque)
        self._answers: dict[tuple[str, str], deque[ev.Event]] = defaultdict(deque)
        self.served = 0
        self.answers_served = 0
        self.not_recorded: list[str] = []
        calls: dict[str, tuple[str, str]] = {}
        failures: dict[str, ev.ToolAttemptFailed] = {}
        dispatched: set[str] = set()
        effect_calls: dict[str, str] = {}
        receipts: dict[str, dict[str, str]] = defaultdict(dict)
        asked: dict[str, str] = {}
        for e in events:
            match e:
                case ev.ModelResponded():
                    for c in e.message.tool_calls:
                        calls[c.id] = (c.name, _key(models.get(c.name), c.arguments))
                case ev.EffectProposed():
                    effect_calls[e.effect_id] = e.call_id
                case ev.EffectChanged():
                    call_id = effect_calls.get(e.effect_id, "")
                    receipts[call_id].update(e.receipts)
                    if e.state == "dispatched":
                        dispatched.add(call_id)
                case ev.ToolAttemptFailed():
                    failures[e.call_id] = e
                    dispatched.add(e.call_id)
                case ev.InterruptRaised() if e.call_id in calls:
                    asked[e.interrupt_id] = e.call_id or ""
                case ev.ApprovalGranted() | ev.ApprovalDenied() | ev.InterruptAnswered():
                    if e.interrupt_id in asked:
                        self._answers[calls[asked[e.interrupt_id]]].append(e)
                case ev.ToolCompleted() if e.call_id in calls:
                    # Only what a tool really answered is served: a call refused before any
                    # dispatch (by policy, a person, a bad argument) is the replay's to decide.
                    refused = e.is_error and e.error_code in _REFUSALS
                    read = e.effect_id is None and not refused
                    if e.call_id not in dispatched and not read:
                        continue
                    failure = failures.get(e.call_id)
                    self._results[calls[e.call_id]].append(
                        Recorded(
                            seq=e.seq,
                            output=e.output,
                            is_error=e.is_error,
                            error_type=failure.error_type if failure else None,
                            error=failure.error if failure else None,
                            receipts=dict(receipts.get(e.call_id, {})),
                        )
                    )
                case _:
                    pass

    def take(self, tool: str, args: BaseModel) -> Recorded | None:
        """The next recorded result of this tool with these arguments, or None."""
        key = (tool, _dumped(args))
        queue = self._results.get(key)
        if not queue:
            self.not_recorded.append(f"{tool} {key[1]}")
            return None
        self.served += 1
        return queue.popleft()

    def answer(self, tool: str, args: BaseModel) -> ev.Event | None:
        """The next recorded answer a person gave about this tool and these arguments."""
        queue = self._answers.get((tool, _dumped(args)))
        return queue.popleft() if queue else None


def _key(model: type[BaseModel] | None, raw: str) -> str:
    """Recorded arguments as the replay's gateway will see them: validated by the tool's
    argument model (defaults filled in), as canonical JSON."""
    if model is not None:
        with contextlib.suppress(ValueError):
            return _dumped(model.model_validate(json.loads(raw)))
    return arguments(raw)


def _dumped(args: BaseModel) -> str:
    return json.dumps(args.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))


def seal(tool: Tool) -> Tool:
    """The tool with its implementation (and reconcile) replaced by ones that refuse to run;
    its contract, and so its hash, unchanged."""

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise LiveDispatchRefused(
            f"a replay reached for the live tool {tool.name}; nothing was sent", tool=tool.name
        )

    return dataclasses.replace(
        tool, fn=refuse, reconcile=refuse if tool.reconcile is not None else None
    )


class TranscriptGateway(ChainGateway):
    """The gateway of a replay: every dispatch is served from the transcript (through the
    middleware's tool hooks, as a live call would be); no tool is ever called."""

    def __init__(self, tools: Sequence[Tool], transcript: Transcript, **options: Any) -> None:
        super().__init__([seal(t) for t in tools], **options)
        self.transcript = transcript
        self._by_key: dict[str, Recorded] = {}

    async def _dispatch(self, call: ToolCallInput) -> Any:
        recorded = self.transcript.take(call.tool.name, call.arguments)
        if recorded is None:
            raise NotRecorded(
                "the recorded run has no result for this call; a replay only serves what the "
                "recorded run got, and sent nothing"
            )
        if call.ctx.idempotency_key:
            self._by_key[call.ctx.idempotency_key] = recorded
        if recorded.is_error:
            raise _failure(recorded)
        return _Served(recorded=recorded, source=f"{self.transcript.run_id}#{recorded.seq}")

    def render(self, result: Any, tool: Tool) -> Rendered:
        if isinstance(result, _Served):
            receipts = {**result.recorded.receipts, "replayed_from": result.source}
            return Rendered(text=result.recorded.output, truncated=False, receipts=receipts)
        return super().render(result, tool)

    async def reconcile(self, tool: Tool, idempotency_key: str) -> Any:
        recorded = self._by_key.get(idempotency_key)
        if recorded is None or recorded.is_error:
            return None
        return _Served(recorded=recorded, source=f"{self.transcript.run_id}#{recorded.seq}")


@dataclass(frozen=True, kw_only=True, slots=True)
class ReplayReport:
    """What a replay found."""

    status: Literal["replay_equal", "replay_mismatch"]
    """Whether the new agent decided what the recorded run decided."""
    source_run_id: str
    """The recorded run."""
    replay_run_id: str
    """The replay's own run (in the replay's store)."""
    replay_status: RunStatus
    """Where the replay stopped."""
    differences: tuple[Difference, ...]
    """Each kind of decision that differs (empty when equal)."""
    recorded: Trail
    """The recorded run's decisions."""
    replayed: Trail
    """The replay's decisions."""
    served: int
    """Tool results served from the recorded run."""
    answers_served: int
    """People's recorded answers given again."""
    not_recorded: tuple[str, ...]
    """Calls the replay made that the recorded run has no result for."""
    recorded_agent_hash: str
    """The identity hash of the agent the run was recorded with."""
    agent_hash: str
    """The identity hash of the agent replayed."""
    store_url: str | None = None
    """Where the replay's log was kept (None: it was thrown away)."""

    @property
    def equal(self) -> bool:
        return self.status == "replay_equal"

    def text(self) -> str:
        """The report for people: the verdict, then each difference as a diff."""
        same_agent = self.agent_hash == self.recorded_agent_hash
        head = [
            f"{self.status}: run {self.source_run_id} replayed as {self.replay_run_id} "
            f"({self.replay_status}), agent {self.agent_hash[:12]}"
            + (" (unchanged)" if same_agent else f" (recorded {self.recorded_agent_hash[:12]})"),
            f"{self.served} tool results and {self.answers_served} answers served from the log; "
            "0 tools called",
        ]
        if self.not_recorded:
            head.append("calls with no recorded result: " + "; ".join(self.not_recorded))
        return "\n".join([*head, *(d.render() for d in self.differences)])


async def replay(
    events: Sequence[ev.Event],
    agent: Agent,
    *,
    model: ModelAdapter,
    authority: Authority | None,
    keep: str | Path | None = None,
) -> ReplayReport:
    """Replay a recorded run (its events) against `agent`, whose model is `model`.

    `authority` decides the replay's tool calls (None: ungoverned, as the run was when it had
    no bound context). The replay's log goes to a throwaway SQLite file, or to `keep`.
    """
    created = events[0]
    assert isinstance(created, ev.RunCreated)
    transcript = Transcript(events, agent.tool_list)
    with _store_path(keep) as path:
        store = SqliteStore(path)
        try:
            rid = RunId(f"replay_{uuid.uuid4().hex[:20]}")
            state = await _create(store, rid, created, events, agent, authority)
            gateway = TranscriptGateway(
                agent.tool_list,
                transcript,
                chain_layers=agent.middleware,
                model=model,
                services=Services(model=model, spend=daily_spend_of(store)),
                metadata=state.metadata,
            )
            while True:
                driver = Driver(
                    store=store,
                    agent=agent,
                    model=model,
                    state=state,
                    worker_id="replay",
                    authority=authority,
                    gateway=gateway,
                )
                state = await driver.drive()
                if state.status is not RunStatus.INPUT_REQUIRED or authority is None:
                    break
                if not await _answer_again(store, state, transcript, gateway, authority):
                    break  # a question the recorded run never had answered: stop here
                state = await load_state(store, rid)
            replayed = await store.read(rid)
        finally:
            await store.close()
    recorded_trail, replayed_trail = trail(events), trail(replayed)
    differences = compare(recorded_trail, replayed_trail)
    return ReplayReport(
        status="replay_mismatch" if differences else "replay_equal",
        source_run_id=created.run_id,
        replay_run_id=rid,
        replay_status=state.status,
        differences=tuple(differences),
        recorded=recorded_trail,
        replayed=replayed_trail,
        served=transcript.served,
        answers_served=transcript.answers_served,
        not_recorded=tuple(transcript.not_recorded),
        recorded_agent_hash=created.agent_hash,
        agent_hash=agent.identity_hash(),
        store_url=f"sqlite:///{path}" if keep is not None else None,
    )


@contextlib.contextmanager
def _store_path(keep: str | Path | None) -> Iterator[Path]:
    if keep is not None:
        yield Path(keep)
        return
    with tempfile.TemporaryDirectory(prefix="contextos-replay-") as tmp:
        yield Path(tmp) / "replay.db"


async def _create(
    store: SqliteStore,
    rid: RunId,
    created: ev.RunCreated,
    events: Sequence[ev.Event],
    agent: Agent,
    authority: Authority | None,
) -> RunState:
    """The replay's run: the recorded ask, under the recorded principal, for the new agent."""
    now = utcnow()
    deadline = agent.budget.deadline_s
    first: list[ev.Event] = [
        ev.RunCreated(
            run_id=rid,
            seq=1,
            occurred_at=now,
            agent_name=agent.name,
            agent_version=agent.version,
            agent_hash=agent.identity_hash(),
            input=created.input,
            budget=agent.budget,
            deadline_at=now + timedelta(seconds=deadline) if deadline is not None else None,
            tool_manifest_hash=Gateway(agent.tool_list).manifest_hash,
            metadata={**created.metadata, "replay_of": created.run_id},
        )
    ]
    bound = next((e for e in events if isinstance(e, ev.ContextBound)), None)
    if bound is not None and authority is not None:
        first.append(authority.bound(rid, 2, RunContext.from_dict(bound.context)))
    await store.append(rid, stamp(RunState(run_id=rid), first), expected_seq=0)
    return await load_state(store, rid)


async def _answer_again(
    store: SqliteStore,
    state: RunState,
    transcript: Transcript,
    gateway: Gateway,
    authority: Authority,
) -> bool:
    """Give the replay's pending questions the answers people gave the recorded run about the
    same calls; False when one has none (or the answer no longer passes the checks)."""
    calls = {c.id: c for m in state.messages for c in m.tool_calls}
    for interrupt in list(state.pending_interrupts.values()):
        call = calls.get(interrupt.call_id or "")
        parsed = gateway.parse(call) if call is not None else None
        if call is None or parsed is None or not isinstance(parsed, tuple):
            return False
        recorded = transcript.answer(call.name, parsed[1])
        try:
            match recorded:
                case ev.ApprovalGranted():
                    await authority.approve(store, interrupt.id, approver=recorded.approver)
                case ev.ApprovalDenied():
                    await authority.deny(
                        store,
                        interrupt.id,
                        approver=recorded.approver,
                        reason=recorded.reason,
                    )
                case ev.InterruptAnswered():
                    await authority.answer(
                        store,
                        interrupt.id,
                        recorded.value,
                        answered_by=recorded.answered_by,
                    )
                case _:
                    return False
        except ApprovalRefused:
            return False  # e.g. the approver no longer holds the role the new policy asks for
        transcript.answers_served += 1
    return True


__all__ = ["NotRecorded", "ReplayReport", "Transcript", "TranscriptGateway", "replay", "seal"]
