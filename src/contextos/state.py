"""A run's state is a fold of its events: `fold(events)` and, one event at a time, `apply`.

This is the one projection of a run's log: the loop, the tool runner, the policy gate, people
answering interrupts and every view of a run read a `RunState`. It is owned by the fold that
builds it: `apply` updates it in place so that a long run costs O(1) per new event instead of
copying its history, and nothing else mutates it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, Literal, assert_never

from contextos import events as ev
from contextos.delegation import ChildRun, DelegationContract, NodeRun, NodeStatus
from contextos.errors import EventDecodeError
from contextos.ledger import Effect, EffectState, can_move, unsettled
from contextos.messages import Message, ToolCall, Usage
from contextos.records.interrupts import Approval, Interrupt, InterruptKind
from contextos.runs import Budget, FailureReason, RunId, RunStatus, can_transition


@dataclass(kw_only=True, slots=True)
class RunState:
    """Everything the loop needs to take the next step, derived from events only."""

    run_id: RunId
    status: RunStatus = RunStatus.QUEUED
    seq: int = 0
    """Seq of the last event folded in."""
    agent_name: str = ""
    agent_version: str = ""
    agent_hash: str = ""
    agent_ref: str | None = None
    input: str = ""
    budget: Budget = field(default_factory=Budget)
    created_at: datetime | None = None
    updated_at: datetime | None = None
    deadline_at: datetime | None = None
    tool_manifest_hash: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)
    messages: list[Message] = field(default_factory=list)
    message_seqs: list[int] = field(default_factory=list)
    """For each message, the seq of the event that added it (context cursors anchor on it)."""
    context_summary: str | None = None
    """The latest compaction summary, if the history was compacted."""
    context_cursor: int = 0
    """Seq of the last event that summary covers (0: never compacted)."""
    prompt: tuple[int, str] | None = None
    """The last recorded model call's prompt: its message count and digest (see
    `contextos.context.rendered`), so that a driver taking the run over records only what is new."""
    pending_tool_calls: list[ToolCall] = field(default_factory=list)
    """Calls of the last assistant message that have no result yet, in order."""
    turns: int = 0
    """Model calls answered."""
    usage: Usage = field(default_factory=Usage)
    verification_attempts: int = 0
    consecutive_tool_errors: int = 0
    worker_id: str | None = None
    """The worker that last started driving the run."""
    output: str | None = None
    structured_output: Any = None
    failure_reason: FailureReason | None = None
    failure_message: str | None = None
    effects: dict[str, Effect] = field(default_factory=dict)
    """The run's effect ledger, by effect id, in proposal order."""
    effect_by_call: dict[str, str] = field(default_factory=dict)
    """Tool call id -> effect id."""
    policy_by_call: dict[str, ev.PolicyDecided] = field(default_factory=dict)
    """The recorded policy decision for each decided tool call."""
    interrupts: dict[str, Interrupt] = field(default_factory=dict)
    """Every question raised to people, by interrupt id, in order, with how it was resolved."""
    interrupt_of_call: dict[str, str] = field(default_factory=dict)
    """Tool call id -> the id of the latest interrupt raised about it (answered or not)."""
    approvals: dict[str, Approval] = field(default_factory=dict)
    """Every approval granted, by id (revoked ones included)."""
    call_at: dict[str, int] = field(default_factory=dict)
    """Tool call id -> index in `messages` of the assistant message that made the call."""
    succeeded: list[str] = field(default_factory=list)
    """Ids of the tool calls that completed without error, in order (for rate and budget
    limits)."""
    context: ev.ContextBound | None = None
    """The authority bound at start (principal, scopes, containment, policy snapshot)."""
    ending: ev.RunEnding | None = None
    """Set when the run will fail or be cancelled once its effects are settled."""
    pause_requested: ev.RunPauseRequested | None = None
    """Set when a person asked the running run to pause and it has not paused yet."""
    unpaused: bool = False
    """Queued again after a pause (`run_unpaused`) and not started since: its driver goes on
    as from a pause (a workflow wakes the children it paused)."""
    answered: ev.RunAnswered | None = None
    """The answer a conversation waits with for the person's next message."""
    tool_errors: int = 0
    """Tool calls that ended in an error the model had to handle, over the whole run."""
    last_tool_error: str | None = None
    """Error code of the last tool result when it was an error (`tool_crashed`, ...)."""
    delegation: DelegationContract | None = None
    """For a child run: the contract it works under."""
    children: dict[str, ChildRun] = field(default_factory=dict)
    """Child runs it started, by delegation id, in start order."""
    running_children: dict[str, None] = field(default_factory=dict)
    """Delegation ids of the child runs still running, in start order (an ordered set): what
    holds part of its budget, found without walking every child it ever started."""
    child_by_call: dict[str, str] = field(default_factory=dict)
    """Tool call id (`delegate_to_<name>`) -> the delegation it started."""
    child_usage: Usage = field(default_factory=Usage)
    """What its finished child runs spent (their own children included): part of its budget."""
    child_turns: int = 0
    """Model calls its finished child runs made (their own children's included)."""
    workflow: ev.WorkflowBound | None = None
    """For a workflow run: its graph as bound at start."""
    nodes: dict[str, NodeRun] = field(default_factory=dict)
    """For a workflow run: each node that started, in start order."""
    correlation_id: str = ""
    """The run tree the run belongs to: its root run's id (see `RunCreated.correlation_id`)."""
    forked_from: str | None = None
    """For a forked run: the run whose history it copied."""
    inherited: dict[str, tuple[str, str]] = field(default_factory=dict)
    """For a forked run: effects its source sent that no call of this run took yet, by effect
    id: (action key, contract hash)."""
    artifacts: list[str] = field(default_factory=list)
    """Ids of the artifacts the run recorded, in order."""
    causes: dict[str, int] = field(default_factory=dict)
    """The latest event about each tool call, effect and interrupt (`call:ID`, `effect:ID`,
    `interrupt:ID`) by seq: what the next event about it follows from (`contextos.causality`)."""

    @property
    def is_terminal(self) -> bool:
        return self.status.is_terminal

    @property
    def last_message(self) -> Message | None:
        return self.messages[-1] if self.messages else None

    @property
    def needs_settling(self) -> bool:
        """Must some effect be resolved or compensated (the saga) before the run may end?"""
        return any(unsettled(e) for e in self.effects.values())

    @property
    def pending_interrupts(self) -> dict[str, Interrupt]:
        """The interrupts still waiting for a person, by id, oldest first."""
        return {i: q for i, q in self.interrupts.items() if q.status == "pending"}

    def latest_interrupt(self, call_id: str) -> Interrupt | None:
        """The latest interrupt raised about a tool call, if any."""
        found = self.interrupt_of_call.get(call_id)
        return self.interrupts[found] if found is not None else None

    def tool_call(self, call_id: str) -> ToolCall | None:
        """The tool call with this id, as the model made it."""
        at = self.call_at.get(call_id)
        if at is None:
            return None
        return next((c for c in self.messages[at].tool_calls if c.id == call_id), None)


def fold(events: list[ev.Event] | tuple[ev.Event, ...], run_id: str | None = None) -> RunState:
    """Build a run's state from its whole log."""
    if not events:
        if run_id is None:
            raise ValueError("fold() of no events needs a run_id")
        return RunState(run_id=RunId(run_id))
    state = RunState(run_id=events[0].run_id)
    for event in events:
        apply(state, event)
    return state


def apply(state: RunState, event: ev.Event) -> RunState:
    """Fold one more event into `state` (in place) and return it."""
    if event.seq != state.seq + 1:
        raise EventDecodeError(
            state.run_id, event.seq, f"log has a gap or repeat: expected seq {state.seq + 1}"
        )
    new_status = type(event).SETS_STATUS  # ev.status_after, inlined: this runs per event
    if new_status is not None and state.seq > 0 and not can_transition(state.status, new_status):
        raise EventDecodeError(
            state.run_id,
            event.seq,
            f"{event.type} moves a {state.status} run to {new_status}, which is not allowed",
        )
    for key in threads(state, event):
        state.causes[key] = event.seq
    match event:
        case ev.RunCreated():
            state.correlation_id = event.correlation_id or event.run_id
            state.agent_name = event.agent_name
            state.agent_version = event.agent_version
            state.agent_hash = event.agent_hash
            state.agent_ref = event.agent_ref
            state.input = event.input
            state.budget = event.budget
            state.created_at = event.occurred_at
            state.deadline_at = event.deadline_at
            state.tool_manifest_hash = event.tool_manifest_hash
            state.metadata = dict(event.metadata)
            state.messages.append(Message(role="user", content=event.input))
        case ev.RunStarted():
            state.worker_id = event.worker_id
            state.unpaused = False
        case ev.ModelResponded():
            for c in event.message.tool_calls:
                state.call_at[c.id] = len(state.messages)
            state.messages.append(event.message)
            state.pending_tool_calls = list(event.message.tool_calls)
            state.turns += 1
            state.usage = state.usage + event.usage
            rendered = event.context.get("rendered")
            if rendered is not None:  # a call whose request was not recorded leaves it as it was
                state.prompt = _prompt(rendered)
        case ev.ToolCompleted():
            state.messages.append(
                Message(
                    role="tool", content=event.output, tool_call_id=event.call_id, name=event.name
                )
            )
            state.pending_tool_calls = [
                c for c in state.pending_tool_calls if c.id != event.call_id
            ]
            state.consecutive_tool_errors = (
                state.consecutive_tool_errors + 1 if event.is_error else 0
            )
            state.tool_errors += 1 if event.is_error else 0
            state.last_tool_error = event.error_code if event.is_error else None
            if not event.is_error:
                state.succeeded.append(event.call_id)
        case ev.PolicyDecided():
            state.policy_by_call[event.call_id] = event
        case ev.EffectProposed():
            if event.effect_id in state.effects:
                raise EventDecodeError(
                    state.run_id, event.seq, f"effect {event.effect_id} proposed twice"
                )
            state.effects[event.effect_id] = Effect(
                effect_id=event.effect_id,
                call_id=event.call_id,
                tool=event.tool,
                kind=event.kind,
                idempotency_key=event.idempotency_key,
                contract_hash=event.contract_hash,
                arguments=dict(event.arguments),
                compensation=event.compensation,
                compensates=event.compensates,
                history=[(event.seq, EffectState.PROPOSED)],
            )
            state.effect_by_call[event.call_id] = event.effect_id
            state.inherited.pop(event.effect_id, None)
        case ev.EffectChanged():
            _move_effect(state, event)
        case ev.ToolAttemptFailed():
            pass
        case ev.InterruptRaised():
            _raised(state, event)
        case ev.RunEnding():
            state.ending = event
        case ev.ContextBound():
            state.context = event
        case ev.ApprovalGranted():
            _granted(state, event)
        case ev.ApprovalDenied():
            found = _resolved(state, event.interrupt_id, "denied", event)
            if found is not None:
                found.denied_by, found.deny_reason = event.approver, event.reason
        case ev.ApprovalRevoked():
            _revoked(state, event)
        case ev.InterruptAnswered():
            found = _resolved(state, event.interrupt_id, "answered", event)
            if found is not None:
                found.answer, found.answered_by = dict(event.value), event.answered_by
        case ev.InterruptExpired():
            found = _resolved(state, event.interrupt_id, "expired", event)
            if found is not None:
                found.expiry = event
                if event.on_expiry == "default":
                    found.answer, found.answered_by = dict(event.value), "default"
        case ev.VerificationFailed():
            state.verification_attempts += 1
            state.messages.append(Message(role="user", content=event.feedback))
        case ev.UserMessageAdded():
            state.messages.append(Message(role="user", content=event.content))
            state.output = state.structured_output = None  # the answer to come is a new one
            state.answered = None
        case ev.RunPauseRequested():
            state.pause_requested = event
        case ev.RunPaused():
            state.pause_requested = None
        case ev.RunUnpaused():
            state.unpaused = True
        case ev.RunAnswered():
            state.answered = event
            state.output = _answer(state, event)
            state.structured_output = event.structured_output
        case ev.RunCompleted():
            state.output = event.output if event.answer_seq is None else _answer(state, event)
            state.structured_output = event.structured_output
        case ev.RunFailed():
            state.failure_reason = event.reason
            state.failure_message = event.message
        case ev.RunCancelled():
            state.failure_reason = FailureReason.CANCELLED
            state.failure_message = event.reason or "cancelled"
        case ev.RunExpired():
            state.failure_message = event.reason or "expired"
        case ev.ContextCompacted():
            state.context_summary = event.summary
            state.context_cursor = event.through_seq
            state.usage = state.usage + event.usage
        case ev.ArtifactRecorded():
            state.artifacts.append(event.artifact_id)
        case ev.RunForked():
            state.agent_name = event.agent_name
            state.agent_version = event.agent_version
            state.agent_hash = event.agent_hash
            state.agent_ref = event.agent_ref
            state.tool_manifest_hash = event.tool_manifest_hash
            state.worker_id = None
            state.forked_from = event.source_run_id
            state.inherited = {
                eid: (key, contract) for eid, key, contract in event.inherited_actions
            }
        case ev.RuntimeCrashDetected() | ev.RunReleased() | ev.EvaluationRecorded():
            pass
        case ev.DelegationBound():
            state.delegation = event.contract
        case ev.WorkflowBound():
            state.workflow = event
        case (
            ev.ChildRunStarted()
            | ev.ChildRunFinished()
            | ev.NodeStarted()
            | ev.NodeRoundCompleted()
            | ev.NodeItemCompleted()
            | ev.NodeAttemptFailed()
            | ev.NodeReconciled()
            | ev.NodeCompleted()
            | ev.NodeFailed()
        ):
            _apply_graph(state, event)
        case _:
            assert_never(event)
    # Each new message remembers its event, whichever case above added it.
    added = len(state.messages) - len(state.message_seqs)
    if added:
        state.message_seqs.extend([event.seq] * added)
    if new_status is not None:
        state.status = new_status
    state.seq = event.seq
    state.updated_at = event.occurred_at
    return state


def _apply_graph(
    state: RunState,
    event: ev.ChildRunStarted
    | ev.ChildRunFinished
    | ev.NodeStarted
    | ev.NodeRoundCompleted
    | ev.NodeItemCompleted
    | ev.NodeAttemptFailed
    | ev.NodeReconciled
    | ev.NodeCompleted
    | ev.NodeFailed,
) -> None:
    """Child runs and workflow nodes: what a parent started, and what came back."""
    match event:
        case ev.ChildRunStarted():
            contract = event.contract
            if contract.delegation_id in state.children:
                raise EventDecodeError(
                    state.run_id, event.seq, f"delegation {contract.delegation_id} started twice"
                )
            state.children[contract.delegation_id] = ChildRun(
                contract=contract, started_seq=event.seq, started_at=event.occurred_at
            )
            state.running_children[contract.delegation_id] = None
            if contract.call_id is not None:
                state.child_by_call[contract.call_id] = contract.delegation_id
            if contract.node is not None and contract.node in state.nodes:
                state.nodes[contract.node].children.append(contract.delegation_id)
        case ev.ChildRunFinished():
            child = state.children.get(event.delegation_id)
            if child is None or child.finished:
                raise EventDecodeError(
                    state.run_id,
                    event.seq,
                    f"delegation {event.delegation_id} finished without running",
                )
            child.status = event.status
            del state.running_children[event.delegation_id]
            child.result = event.result
            child.evidence = dict(event.evidence)
            child.usage = event.usage
            child.turns = event.turns
            child.finished_at = event.occurred_at
            child.reason = event.reason
            child.message = event.message
            state.child_usage = state.child_usage + event.usage
            state.child_turns += event.turns
        case ev.NodeStarted():
            state.nodes[event.node] = NodeRun(
                node=event.node,
                kind=event.kind,
                started_seq=event.seq,
                started_at=event.occurred_at,
                items=list(event.items) if event.items is not None else None,
            )
        case ev.NodeRoundCompleted():
            _node(state, event).rounds.append(event.output)
        case ev.NodeItemCompleted():
            _node(state, event).item_outputs[event.index] = event.output
        case ev.NodeAttemptFailed():
            _node(state, event).failed_attempts[event.where] = event.attempt
        case ev.NodeReconciled():
            _node(state, event).reconciled = event.acted
        case ev.NodeCompleted():
            node = _node(state, event)
            node.status = NodeStatus.COMPLETED
            node.completed_seq = event.seq
            node.output = event.output
            node.converged = event.converged
            node.route = event.route
            node.finished_at = event.occurred_at
            node.item_outputs = {}  # its output holds them now: not kept twice
        case ev.NodeFailed():
            node = _node(state, event)
            node.status = NodeStatus.FAILED
            node.reason = event.reason.value
            node.message = event.message
            node.finished_at = event.occurred_at
            node.item_outputs = {}


def _node(
    state: RunState,
    event: ev.NodeRoundCompleted
    | ev.NodeItemCompleted
    | ev.NodeAttemptFailed
    | ev.NodeReconciled
    | ev.NodeCompleted
    | ev.NodeFailed,
) -> NodeRun:
    node = state.nodes.get(event.node)
    if node is None or node.status is not NodeStatus.RUNNING:
        raise EventDecodeError(state.run_id, event.seq, f"node {event.node} is not running")
    return node


_IDS = {
    cls: tuple(f for f in ("call_id", "effect_id", "interrupt_id") if f in cls.__dataclass_fields__)
    for cls in ev.EVENT_TYPES.values()
}
"""For each event type, the fields that name a tool call, an effect or an interrupt."""


def threads(state: RunState, event: ev.Event) -> list[str]:
    """The tool calls, effects and interrupts an event is about, as `causes` keys.

    An answer to an interrupt is also about the call and effect the interrupt asked about, so
    the decision taken after an approval follows from the approval.
    """
    if isinstance(event, ev.ModelResponded):
        return [f"call:{c.id}" for c in event.message.tool_calls]
    fields = _IDS[type(event)]
    if not fields:
        return []
    call_id = getattr(event, "call_id", None)
    effect_id = getattr(event, "effect_id", None)
    interrupt_id = getattr(event, "interrupt_id", None)
    keys: list[str] = []
    if interrupt_id is not None:
        keys.append(f"interrupt:{interrupt_id}")
        asked = state.pending_interrupts.get(interrupt_id)
        if asked is not None and not isinstance(event, ev.InterruptRaised):
            call_id, effect_id = call_id or asked.call_id, effect_id or asked.effect_id
    if call_id is not None:
        keys.append(f"call:{call_id}")
    if effect_id is not None:
        keys.append(f"effect:{effect_id}")
    return keys


def _prompt(rendered: Any) -> tuple[int, str] | None:
    """(message count, digest) of a recorded prompt delta; None for one without a digest."""
    try:
        digest = rendered["digest"]
        count = rendered["keep"] + len(rendered["add"])
    except (KeyError, TypeError):
        return None
    return (count, digest) if isinstance(digest, str) and isinstance(count, int) else None


def _answer(state: RunState, event: ev.RunCompleted | ev.RunAnswered) -> str:
    """The text of the model answer a run_completed or run_answered event names."""
    for message, seq in zip(reversed(state.messages), reversed(state.message_seqs), strict=True):
        if seq == event.answer_seq and message.role == "assistant":
            return message.content
    raise EventDecodeError(
        state.run_id, event.seq, f"the answer it names (#{event.answer_seq}) is not in the log"
    )


def _move_effect(state: RunState, event: ev.EffectChanged) -> None:
    effect = state.effects.get(event.effect_id)
    if effect is None:
        raise EventDecodeError(state.run_id, event.seq, f"unknown effect {event.effect_id}")
    if not can_move(effect.state, event.state):
        raise EventDecodeError(
            state.run_id,
            event.seq,
            f"effect {event.effect_id} cannot move from {effect.state} to {event.state}",
        )
    effect.state = event.state
    if event.state is EffectState.DISPATCHED:
        effect.attempts = max(effect.attempts + 1, event.attempt)
    effect.receipts.update(event.receipts)
    if event.output is not None:
        effect.output = event.output
    if event.error_code is not None:
        effect.error_code = event.error_code
    effect.history.append((event.seq, event.state))
    if event.state.is_final:
        # a question about what became of this effect no longer stands once the effect settles
        for asked in state.interrupts.values():
            if asked.effect_id == effect.effect_id and asked.status == "pending":
                asked.status = "superseded"


# --- people: interrupts and approvals ----------------------------------------------------


def _raised(state: RunState, event: ev.InterruptRaised) -> None:
    if event.call_id is not None:
        earlier = state.interrupt_of_call.get(event.call_id)
        if earlier is not None and state.interrupts[earlier].status == "pending":
            state.interrupts[earlier].status = "superseded"  # asked again: answer the new one
        state.interrupt_of_call[event.call_id] = event.interrupt_id
    state.interrupts[event.interrupt_id] = Interrupt(
        id=event.interrupt_id,
        run_id=state.run_id,
        kind=InterruptKind.of(event.kind),
        payload=dict(event.payload),
        raised_seq=event.seq,
        raised_at=event.occurred_at,
        call_id=event.call_id,
        effect_id=event.effect_id,
    )


def _resolved(
    state: RunState,
    interrupt_id: str,
    status: Literal["approved", "denied", "answered", "expired"],
    event: ev.Event,
) -> Interrupt | None:
    found = state.interrupts.get(interrupt_id)
    if found is not None:
        found.status, found.resolved_at = status, event.occurred_at
    return found


def _granted(state: RunState, event: ev.ApprovalGranted) -> None:
    approval = Approval(
        id=event.approval_id,
        interrupt_id=event.interrupt_id,
        run_id=state.run_id,
        action_hash=event.action_hash,
        approver=event.approver,
        approver_roles=tuple(event.approver_roles),
        granted_at=event.occurred_at,
        expires_at=event.expires_at,
        conditions=dict(event.conditions),
        snapshot_hash=event.snapshot_hash,
    )
    state.approvals[approval.id] = approval
    found = _resolved(state, event.interrupt_id, "approved", event)
    if found is not None:
        found.approval = approval


def _revoked(state: RunState, event: ev.ApprovalRevoked) -> None:
    approval = state.approvals.get(event.approval_id)
    if approval is None:
        return
    revoked = replace(
        approval,
        revoked_at=event.occurred_at,
        revoked_by=event.revoked_by,
        revoke_reason=event.reason,
    )
    state.approvals[approval.id] = revoked
    found = state.interrupts.get(approval.interrupt_id)
    if found is not None:
        found.approval = revoked
