"""Every persisted event type: a run is its events.

The log is append-only, keyed by `(run_id, seq)`. Each event is a frozen record with a `type`
discriminator and its type's schema version; `contextos.codec` turns events into stored rows
and back, and stops loudly on a version this code does not know.

The graph's events (delegations, child runs, workflow nodes) live in `contextos.graph_events`
and evidence's (forks, evaluations, artifacts) in `contextos.evidence_events`; this module
gathers every type into the one `Event` union and re-exports them all, so an event is imported
from here whichever module defines it.

The event modules leave their annotations as objects (no `from __future__ import annotations`):
a fresh process builds a type's reader when it first meets one, and strings would first have
to be evaluated back into types.
"""

from dataclasses import dataclass, field
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import Field

from contextos.event_base import BaseEvent as _Event
from contextos.event_base import utcnow
from contextos.evidence_events import ArtifactRecorded, EvaluationRecorded, RunForked
from contextos.graph_events import (
    ChildRunFinished,
    ChildRunStarted,
    DelegationBound,
    NodeAttemptFailed,
    NodeCompleted,
    NodeFailed,
    NodeItemCompleted,
    NodeReconciled,
    NodeRoundCompleted,
    NodeStarted,
    WorkflowBound,
)
from contextos.ledger import EffectState
from contextos.messages import FinishReason, Message, Usage
from contextos.runs import Budget, FailureReason, RunStatus

# --- lifecycle ------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class RunCreated(_Event):
    """A run was instantiated; the first event of every run."""

    SETS_STATUS = RunStatus.QUEUED
    type: Literal["run_created"] = "run_created"
    agent_name: str
    """Agent name."""
    agent_version: str
    """Agent version string."""
    agent_hash: str
    """Identity hash of everything that changes the agent's behaviour."""
    agent_ref: str | None = None
    """Where to import the agent from (`path.py:attr` or `module:attr`), for resume by id."""
    input: str
    """The user's input that starts the run."""
    budget: Budget = field(default_factory=Budget)
    """The run's limits."""
    deadline_at: datetime | None = None
    """Absolute deadline derived from the budget."""
    tool_manifest_hash: str = ""
    """Hash of the tools visible to the run."""
    metadata: dict[str, Any] = field(default_factory=dict)
    """Free-form labels given at start."""
    caused_by: str | None = None
    """`RUN_ID#SEQ` of the event in another run that started this one: the source run's end
    for a triggered run, the parent's step for a child run."""


@dataclass(frozen=True, kw_only=True, slots=True)
class RunStarted(_Event):
    """A worker began (or resumed) driving the run."""

    SETS_STATUS = RunStatus.RUNNING
    type: Literal["run_started"] = "run_started"
    worker_id: str
    """The worker that drives it now."""
    recovered: bool = False
    """True when the previous worker died while the run was running."""


@dataclass(frozen=True, kw_only=True, slots=True)
class RuntimeCrashDetected(_Event):
    """On recovery: the run was left running by a worker that is gone."""

    type: Literal["runtime_crash_detected"] = "runtime_crash_detected"
    previous_worker_id: str | None
    """The worker that had the run, if known."""
    last_seq: int
    """The last event that worker managed to record."""


@dataclass(frozen=True, kw_only=True, slots=True)
class RunReleased(_Event):
    """A worker gave the run back to the queue without finishing it (shutdown, drain)."""

    SETS_STATUS = RunStatus.QUEUED
    type: Literal["run_released"] = "run_released"
    worker_id: str
    """The worker that let go."""
    reason: str = ""
    """Why."""


@dataclass(frozen=True, kw_only=True, slots=True)
class RunPauseRequested(_Event):
    """A person asked a running run to pause; its driver pauses it at its next step boundary
    (the driver sees this event when its next append meets it)."""

    type: Literal["run_pause_requested"] = "run_pause_requested"
    reason: str = ""
    """Why, as given by who asked."""


@dataclass(frozen=True, kw_only=True, slots=True)
class RunPaused(_Event):
    """The run stopped between two steps because a person asked; it holds no driver and goes
    on when resumed or sent a message."""

    SETS_STATUS = RunStatus.PAUSED
    type: Literal["run_paused"] = "run_paused"
    reason: str = ""
    """Why, as given by who asked."""


@dataclass(frozen=True, kw_only=True, slots=True)
class RunUnpaused(_Event):
    """A person let a paused run go on without driving it: it is queued for a worker, which
    drives it on (a workflow's paused children with it)."""

    SETS_STATUS = RunStatus.QUEUED
    type: Literal["run_unpaused"] = "run_unpaused"


@dataclass(frozen=True, kw_only=True, slots=True)
class RunAnswered(_Event):
    """A conversation's answer passed its verifier: the run waits for the person's next
    message (a conversation is not completed, so it can go on as the same run)."""

    SETS_STATUS = RunStatus.INPUT_REQUIRED
    type: Literal["run_answered"] = "run_answered"
    answer_seq: int
    """Seq of the model_responded event whose text is the answer."""
    structured_output: Any = None
    """The answer parsed into the agent's output type, as JSON data."""


@dataclass(frozen=True, kw_only=True, slots=True)
class RunCompleted(_Event):
    """The verifier passed; the run is done."""

    SCHEMA_VERSION = 2
    SETS_STATUS = RunStatus.COMPLETED
    type: Literal["run_completed"] = "run_completed"
    output: str = ""
    """The final answer text, when `answer_seq` does not name the event that holds it."""
    answer_seq: int | None = None
    """Seq of the model_responded event whose text is the final answer: a long answer is
    stored once, there (the fold reads it back into the run's output)."""
    structured_output: Any = None
    """The final answer parsed into the agent's output type, as JSON data."""


@dataclass(frozen=True, kw_only=True, slots=True)
class RunFailed(_Event):
    """The run ended without a verified result."""

    SETS_STATUS = RunStatus.FAILED
    type: Literal["run_failed"] = "run_failed"
    reason: FailureReason
    """Machine-readable reason."""
    message: str
    """Human-readable detail."""
    error: dict[str, Any] = field(default_factory=dict)
    """Structured error fields (code, tool, …)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class RunCancelled(_Event):
    """Somebody cancelled the run."""

    SETS_STATUS = RunStatus.CANCELLED
    type: Literal["run_cancelled"] = "run_cancelled"
    reason: str = ""
    """Why, as given by the canceller."""


@dataclass(frozen=True, kw_only=True, slots=True)
class RunExpired(_Event):
    """The run waited past its expiry (for example on a human who never answered)."""

    SETS_STATUS = RunStatus.EXPIRED
    type: Literal["run_expired"] = "run_expired"
    reason: str = ""
    """What expired."""


# --- the loop -------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelResponded(_Event):
    """A model call returned; recorded before anything acts on it."""

    type: Literal["model_responded"] = "model_responded"
    message: Message
    """The assistant message (text and/or tool calls)."""
    finish_reason: FinishReason
    """Why the model stopped."""
    usage: Usage
    """Tokens and cost of this call."""
    model: str
    """Which model answered (`provider:name`)."""
    latency_ms: float = 0.0
    """Wall time of the call."""
    request_id: str | None = None
    """Provider's request id, when given."""
    context_hash: str | None = None
    """Hash of the compiled context manifest the model saw."""
    context: dict[str, Any] = field(default_factory=dict)
    """Lineage of that context: `manifest` (one row per item), `stack`, and layer `telemetry`."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ToolCompleted(_Event):
    """A tool call finished (or was refused); its result goes back to the model."""

    type: Literal["tool_completed"] = "tool_completed"
    call_id: str
    """The model's tool call id."""
    name: str
    """Tool name."""
    output: str
    """What the model will see (already truncated if huge)."""
    is_error: bool = False
    """True when `output` explains an error the model can correct."""
    error_code: str | None = None
    """Stable error code when `is_error`."""
    duration_ms: float = 0.0
    """Wall time of the call."""
    truncated: bool = False
    """True when the output was cut to the size limit."""
    untrusted: bool = True
    """Tool output is data from outside, never instructions: the context layer spotlights it."""
    effect_id: str | None = None
    """The effect this call settled, for tools whose effect is not `read`."""


@dataclass(frozen=True, kw_only=True, slots=True)
class VerificationFailed(_Event):
    """The verifier rejected the answer; its gaps become the next user message."""

    type: Literal["verification_failed"] = "verification_failed"
    verifier: str
    """Which verifier."""
    gaps: tuple[str, ...]
    """What is missing or wrong."""
    feedback: str
    """The message the model receives next."""


@dataclass(frozen=True, kw_only=True, slots=True)
class UserMessageAdded(_Event):
    """A person's follow-up to a paused run or a conversation that answered: the run goes back
    to the queue to answer it."""

    SETS_STATUS = RunStatus.QUEUED
    type: Literal["user_message_added"] = "user_message_added"
    content: str
    """The message text."""


# --- the tool gateway and the effect ledger -------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class PolicyDecided(_Event):
    """Policy's decision on one validated tool call, recorded before anything is dispatched."""

    type: Literal["policy_decided"] = "policy_decided"
    call_id: str
    """The tool call decided on."""
    tool: str
    """Tool name."""
    decision: str
    """allow, deny, constrain or require_approval."""
    rule_ids: tuple[str, ...] = ()
    """The rules that decided."""
    reasons: tuple[str, ...] = ()
    """Why, in words."""
    constraints: dict[str, Any] = field(default_factory=dict)
    """Limits the call must respect."""
    approver_role: str | None = None
    """Role an approver must hold, for require_approval."""
    snapshot_hash: str = ""
    """Hash of the policy snapshot that decided."""
    absolute: bool = False
    """An absolute deny cannot be overridden by an approval."""
    effect_id: str | None = None
    """The effect the call would have, for tools whose effect is not `read`."""
    approver_roles: tuple[str, ...] = ()
    """Every role an approver must hold (require_approval, or a deny open to an exception)."""
    exception_role: str | None = None
    """For a deny that is not absolute: the role that may grant a policy exception."""
    action_hash: str = ""
    """Hash of the frozen action decided on (tool, arguments, contract, call)."""
    approval_id: str | None = None
    """The approval that allowed the call, when one did."""
    interrupt_kind: str | None = None
    """For require_approval: the kind of interrupt to raise."""
    interrupt_payload: dict[str, Any] = field(default_factory=dict)
    """For require_approval: what the interrupt carries (the frozen action, roles, reasons)."""
    checks: tuple[dict[str, str], ...] = ()
    """What each layer of authority said: {layer, decision, rule_id, reason}."""


@dataclass(frozen=True, kw_only=True, slots=True)
class EffectProposed(_Event):
    """A call to a tool whose effect is not `read` entered the ledger."""

    type: Literal["effect_proposed"] = "effect_proposed"
    effect_id: str
    """Stable id of the effect."""
    call_id: str
    """The tool call proposing it."""
    tool: str
    """Tool name."""
    kind: str
    """The tool's declared effect: write, reversible_write or irreversible."""
    idempotency_key: str
    """Sent with every attempt; the same across retries and resumes."""
    contract_hash: str
    """Hash of the tool's contract at proposal time."""
    arguments: dict[str, Any] = field(default_factory=dict)
    """Validated arguments, with the contract's redacted fields replaced."""
    compensation: str | None = None
    """Tool that undoes it, when declared."""
    compensates: str | None = None
    """For a compensation call: the effect it undoes."""


@dataclass(frozen=True, kw_only=True, slots=True)
class EffectChanged(_Event):
    """An effect moved to a new state (see `contextos.ledger.EFFECT_TRANSITIONS`)."""

    type: Literal["effect_changed"] = "effect_changed"
    effect_id: str
    """The effect."""
    state: EffectState
    """Its new state."""
    attempt: int = 0
    """For `dispatched`: which attempt this is, from 1."""
    receipts: dict[str, str] = field(default_factory=dict)
    """Provider request id, confirmation id, … learned at this step."""
    output: str | None = None
    """For a settled effect: what the model is shown."""
    error_code: str | None = None
    """Stable code, for failed, denied or unknown outcomes."""
    note: str = ""
    """Why it moved, in words."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ToolAttemptFailed(_Event):
    """One attempt of a tool call failed; says whether another attempt follows."""

    type: Literal["tool_attempt_failed"] = "tool_attempt_failed"
    call_id: str
    """The tool call."""
    tool: str
    """Tool name."""
    attempt: int
    """Which attempt failed, from 1."""
    error_type: str
    """Class name of the error."""
    error: str
    """The error's message."""
    will_retry: bool
    """True when the contract declares a retry after this error safe."""
    delay_s: float = 0.0
    """Back-off before the next attempt."""
    effect_id: str | None = None
    """The effect, for tools whose effect is not `read`."""


@dataclass(frozen=True, kw_only=True, slots=True)
class InterruptRaised(_Event):
    """The run waits for a person: a typed question (kind + payload) the run cannot answer."""

    SETS_STATUS = RunStatus.INPUT_REQUIRED
    type: Literal["interrupt_raised"] = "interrupt_raised"
    interrupt_id: str
    """Stable id of the question."""
    kind: str
    """approval_required, external_confirmation_required, missing_information, …"""
    payload: dict[str, Any] = field(default_factory=dict)
    """What the person needs to answer it (the frozen action, the question)."""
    call_id: str | None = None
    """The tool call it is about, if any."""
    effect_id: str | None = None
    """The effect it is about, if any."""


# --- authority: the run's context, and people answering interrupts ---------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class ContextBound(_Event):
    """The authority a run acts under (principal, scopes, containment), bound at its start."""

    type: Literal["context_bound"] = "context_bound"
    context: dict[str, Any]
    """The RunContext as JSON data."""
    context_hash: str
    """Hash of that data."""
    policy_name: str = ""
    """Name of the policy bound to the run."""
    policy_version: str = ""
    """Its version label."""
    snapshot_hash: str = ""
    """Hash of the policy snapshot bound to the run."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ApprovalGranted(_Event):
    """A person approved the frozen action of an interrupt; the run can be resumed."""

    SETS_STATUS = RunStatus.QUEUED
    type: Literal["approval_granted"] = "approval_granted"
    approval_id: str
    """Approval id."""
    interrupt_id: str
    """The interrupt it answers."""
    action_hash: str
    """Hash of the frozen action approved."""
    approver: str
    """Who approved."""
    approver_roles: tuple[str, ...] = ()
    """Roles the approver held at that moment."""
    expires_at: datetime
    """After this the approval no longer counts."""
    conditions: dict[str, Any] = field(default_factory=dict)
    """Conditions the action must still meet when it runs."""
    snapshot_hash: str = ""
    """The policy snapshot it was granted under."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ApprovalDenied(_Event):
    """A person refused the frozen action of an interrupt; that action ends, the run goes on."""

    SETS_STATUS = RunStatus.QUEUED
    type: Literal["approval_denied"] = "approval_denied"
    interrupt_id: str
    """The interrupt it answers."""
    action_hash: str = ""
    """Hash of the frozen action refused."""
    approver: str
    """Who refused."""
    reason: str = ""
    """Why; the model is told."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ApprovalRevoked(_Event):
    """An approval was withdrawn; if its action has not run yet, it will not run on it."""

    type: Literal["approval_revoked"] = "approval_revoked"
    approval_id: str
    """The approval."""
    revoked_by: str
    """Who withdrew it."""
    reason: str = ""
    """Why."""


@dataclass(frozen=True, kw_only=True, slots=True)
class InterruptAnswered(_Event):
    """A person answered an interrupt that asks for a value (information, a choice, a review,
    an external confirmation); the answer matched the kind's schema."""

    SETS_STATUS = RunStatus.QUEUED
    type: Literal["interrupt_answered"] = "interrupt_answered"
    interrupt_id: str
    """The interrupt answered."""
    kind: str
    """Its kind."""
    value: dict[str, Any] = field(default_factory=dict)
    """The validated answer."""
    answered_by: str
    """Who answered."""


@dataclass(frozen=True, kw_only=True, slots=True)
class InterruptExpired(_Event):
    """Nobody answered an interrupt by its deadline; what was declared for that case happens.

    `deny` and `default` put the run back in the queue; `fail` is followed, in the same append,
    by the `RunExpired` that ends the run.
    """

    SETS_STATUS = RunStatus.QUEUED
    type: Literal["interrupt_expired"] = "interrupt_expired"
    interrupt_id: str
    """The interrupt that expired."""
    kind: str
    """Its kind."""
    expires_at: datetime
    """The deadline it carried."""
    on_expiry: Literal["deny", "fail", "default"]
    """What was declared to happen, and so happened."""
    value: dict[str, Any] = field(default_factory=dict)
    """For `default`: the answer given in place of a person's."""
    reason: str = ""
    """In words, for people and the model."""


@dataclass(frozen=True, kw_only=True, slots=True)
class RunEnding(_Event):
    """The run will fail or be cancelled once its effects are settled (the saga).

    In-flight effects are resolved and committed reversible writes compensated first; then the
    terminal event follows. A worker that resumes a run with this event finishes the job.
    """

    type: Literal["run_ending"] = "run_ending"
    outcome: Literal["failed", "cancelled"]
    """The terminal status that follows."""
    reason: str = ""
    """For failed: the FailureReason value; for cancelled: the canceller's reason."""
    message: str = ""
    """Human-readable detail."""
    error: dict[str, Any] = field(default_factory=dict)
    """Structured error fields of a failure."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ContextCompacted(_Event):
    """Older turns were summarized; later calls start their history after `through_seq`."""

    type: Literal["context_compacted"] = "context_compacted"
    summary: str
    """The summary (written from redacted text, and redacted again)."""
    through_seq: int
    """Seq of the last event the summary covers: the cursor."""
    usage: Usage = field(default_factory=Usage)
    """What the summarizing call cost."""
    model: str = ""
    """Which model summarized."""
    messages: int = 0
    """Messages folded into the summary."""
    tokens_before: int = 0
    """Estimated tokens of what was summarized."""


Event = Annotated[
    RunCreated
    | RunStarted
    | RuntimeCrashDetected
    | RunReleased
    | RunPauseRequested
    | RunPaused
    | RunUnpaused
    | RunAnswered
    | RunCompleted
    | RunFailed
    | RunCancelled
    | RunExpired
    | ModelResponded
    | ToolCompleted
    | VerificationFailed
    | UserMessageAdded
    | PolicyDecided
    | EffectProposed
    | EffectChanged
    | ToolAttemptFailed
    | InterruptRaised
    | RunEnding
    | ContextBound
    | ApprovalGranted
    | ApprovalDenied
    | ApprovalRevoked
    | InterruptAnswered
    | InterruptExpired
    | ContextCompacted
    | DelegationBound
    | ChildRunStarted
    | ChildRunFinished
    | WorkflowBound
    | NodeStarted
    | NodeRoundCompleted
    | NodeItemCompleted
    | NodeAttemptFailed
    | NodeReconciled
    | NodeCompleted
    | NodeFailed
    | EvaluationRecorded
    | ArtifactRecorded
    | RunForked,
    Field(discriminator="type"),
]

EVENT_TYPES: dict[str, type[_Event]] = {
    cls.__dataclass_fields__["type"].default: cls  # type: ignore[misc]
    for cls in _Event.__subclasses__()
}


def schema_version(event_type: str) -> int:
    return EVENT_TYPES[event_type].SCHEMA_VERSION


def status_after(event: _Event) -> RunStatus | None:
    return type(event).SETS_STATUS


__all__ = [
    "EVENT_TYPES",
    "ApprovalDenied",
    "ApprovalGranted",
    "ApprovalRevoked",
    "ChildRunFinished",
    "ChildRunStarted",
    "ArtifactRecorded",
    "ContextBound",
    "ContextCompacted",
    "DelegationBound",
    "InterruptAnswered",
    "InterruptExpired",
    "Event",
    "EffectChanged",
    "EffectProposed",
    "EvaluationRecorded",
    "InterruptRaised",
    "ModelResponded",
    "NodeAttemptFailed",
    "NodeCompleted",
    "NodeFailed",
    "NodeItemCompleted",
    "NodeReconciled",
    "NodeRoundCompleted",
    "NodeStarted",
    "PolicyDecided",
    "RunAnswered",
    "RunCancelled",
    "RunCompleted",
    "RunCreated",
    "RunEnding",
    "RunExpired",
    "RunFailed",
    "RunForked",
    "RunPauseRequested",
    "RunPaused",
    "RunUnpaused",
    "RunReleased",
    "RunStarted",
    "RuntimeCrashDetected",
    "ToolAttemptFailed",
    "ToolCompleted",
    "UserMessageAdded",
    "VerificationFailed",
    "WorkflowBound",
    "status_after",
    "utcnow",
]
