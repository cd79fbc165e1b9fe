"""The events of runs that start runs: delegation contracts, child runs, workflow nodes.

Part of the one event union that `contextos.events` gathers (and re-exports); the codec knows
these types through it.
"""

from dataclasses import dataclass, field
from typing import Any, Literal

from contextos.delegation import ChildStatus, DelegationContract
from contextos.event_base import BaseEvent
from contextos.messages import Usage
from contextos.runs import FailureReason, RunId


@dataclass(frozen=True, kw_only=True, slots=True)
class DelegationBound(BaseEvent):
    """The contract a child run works under, bound at its start (in the child's log)."""

    type: Literal["delegation_bound"] = "delegation_bound"
    contract: DelegationContract
    """What the parent handed it: objective, inputs, tools, budget, expected output."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ChildRunStarted(BaseEvent):
    """The run started a child run under a contract (in the parent's log, before the child
    exists: a parent resumed after a crash finds the same child instead of starting one)."""

    type: Literal["child_run_started"] = "child_run_started"
    contract: DelegationContract
    """The contract, budget already carved out of this run's."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ChildRunFinished(BaseEvent):
    """A child run ended and the parent took in what it gave back: a validated result and an
    evidence summary, never its transcript. What it did not spend returns to the parent."""

    type: Literal["child_run_finished"] = "child_run_finished"
    delegation_id: str
    """The delegation."""
    child_run_id: RunId
    """The child run."""
    status: ChildStatus
    """completed, failed, rejected (its result failed validation), cancelled or expired."""
    result: Any = None
    """The result, validated against the contract's expected output (JSON data)."""
    evidence: dict[str, Any] = field(default_factory=dict)
    """What the child did, derived from its log: tools called, effects, denials, spend."""
    usage: Usage = field(default_factory=Usage)
    """What it spent, its own children included."""
    turns: int = 0
    """Model calls it made, its own children's included."""
    reason: str | None = None
    """Why it did not complete: its failure reason, or `output_invalid`."""
    message: str = ""
    """Human-readable detail."""
    record_hash: str | None = None
    """The hash of the child's DecisionRecord, built from its whole log as it ended. The child
    stores no record of its own: the parent's log vouches for it (None in rows written before
    it was recorded)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class WorkflowBound(BaseEvent):
    """The run is a workflow: its graph as declared, bound at start."""

    type: Literal["workflow_bound"] = "workflow_bound"
    workflow: str
    """The workflow's name."""
    nodes: tuple[dict[str, Any], ...]
    """Each node: `name`, `kind`, `after` (the nodes it reads), `output` (its type's name)."""
    output_node: str
    """The node whose output is the workflow's."""


@dataclass(frozen=True, kw_only=True, slots=True)
class NodeStarted(BaseEvent):
    """A workflow node began; a fan-out or a gate records the items it runs over."""

    type: Literal["node_started"] = "node_started"
    node: str
    """The node."""
    kind: str
    """agent, code, map, reduce, gate or loop."""
    items: list[Any] | None = None
    """For a fan-out or a gate: its items (JSON data), fixed here for every later resume."""
    effect: str | None = None
    """For a code node that declares an effect: the intent to run it, durable before its code
    runs, so a resume that finds no outcome after it knows the code may have acted."""


@dataclass(frozen=True, kw_only=True, slots=True)
class NodeRoundCompleted(BaseEvent):
    """One round of a convergence loop finished; the next round starts from `output`."""

    type: Literal["node_round_completed"] = "node_round_completed"
    node: str
    """The loop node."""
    round: int
    """Which round, from 1."""
    output: Any = None
    """The state after the round, validated (JSON data)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class NodeItemCompleted(BaseEvent):
    """One item of a map or a gate whose worker is a function finished: a resume reads its
    output back instead of calling the function on it again."""

    type: Literal["node_item_completed"] = "node_item_completed"
    node: str
    """The map or gate."""
    index: int
    """The item's place in the node's items, from 0."""
    output: Any = None
    """What the function gave for it (JSON data; checked with the node's output)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class NodeAttemptFailed(BaseEvent):
    """A node's function raised an error its retry policy declares safe to try again after;
    the next attempt follows `delay_s` later (a resume counts the attempts made before it)."""

    type: Literal["node_attempt_failed"] = "node_attempt_failed"
    node: str
    """The node."""
    where: str = ""
    """Which call of its function: "" for a code node, `item N` for a map's or gate's item,
    `round N` for a loop's round."""
    attempt: int
    """Which attempt failed, from 1."""
    error_type: str
    """Class name of the error."""
    error: str
    """The error's message."""
    delay_s: float = 0.0
    """Back-off before the next attempt."""


@dataclass(frozen=True, kw_only=True, slots=True)
class NodeReconciled(BaseEvent):
    """A code node's `reconcile` said what became of a call stopped before its output was
    recorded: it acted (its `node_completed` follows, with `output`), or it did not (a new
    intent follows)."""

    type: Literal["node_reconciled"] = "node_reconciled"
    node: str
    """The code node."""
    idempotency_key: str
    """The key of the call looked up."""
    acted: bool
    """Whether the call took effect."""
    output: Any = None
    """What it gave, when it acted (JSON data, checked with the node's output)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class NodeCompleted(BaseEvent):
    """A workflow node finished; its output passed its declared type before anything read it."""

    type: Literal["node_completed"] = "node_completed"
    node: str
    """The node."""
    output: Any = None
    """The validated output (JSON data): what the nodes after it receive."""
    converged: bool | None = None
    """For a loop: whether its stop condition held (False: it stopped at its round limit)."""
    route: str | None = None
    """For a node with conditional edges: the node its output chose to run next."""


@dataclass(frozen=True, kw_only=True, slots=True)
class NodeFailed(BaseEvent):
    """A workflow node failed; the workflow fails with the same reason."""

    type: Literal["node_failed"] = "node_failed"
    node: str
    """The node."""
    reason: FailureReason
    """output_invalid, node_failed, child_failed, not_converged, budget_exhausted, …"""
    message: str
    """Human-readable detail."""
    errors: tuple[str, ...] = ()
    """For output_invalid: each problem with the output, by field."""


__all__ = [
    "ChildRunFinished",
    "ChildRunStarted",
    "DelegationBound",
    "NodeAttemptFailed",
    "NodeCompleted",
    "NodeFailed",
    "NodeItemCompleted",
    "NodeRoundCompleted",
    "NodeStarted",
    "WorkflowBound",
]
