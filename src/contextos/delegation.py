"""Records of runs that start runs: delegation contracts, child runs and workflow nodes.

A parent hands a child run a contract (what it is for, what it is given, what it may use and
spend, what it must give back), recorded in both logs. The fold keeps, for a parent, one
`ChildRun` per delegation and, for a workflow, one `NodeRun` per node: both are owned and
updated by the fold, like the effect ledger's entries.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any

from contextos.messages import Usage
from contextos.runs import Budget, RunId

MAX_DEPTH = 8
"""Delegations nested deeper than this are refused: an agent that keeps delegating to itself
cannot grow an unbounded tree."""


class MergePolicy(StrEnum):
    """How a parent takes in what a child gives back."""

    PARENT_VALIDATES = "parent_validates"
    """The parent checks the result against the expected schema before anything uses it; a
    result that does not match is a recorded failure of the delegation, not an input."""
    PERSON_REVIEWS = "person_reviews"
    """The parent validates it as above, then a person reviews it (`review_required`): an
    accepted result is taken in, a rejected one is a failure of the delegation."""


@dataclass(frozen=True, kw_only=True, slots=True)
class DelegationContract:
    """What a parent run hands one child run, recorded in both logs."""

    delegation_id: str
    """Stable id: the parent run, and where in it the delegation happens."""
    parent_run_id: RunId
    """The run that delegates."""
    child_run_id: RunId
    """The run that does the work (its id is derived from the delegation: a restarted parent
    finds it again instead of starting another)."""
    agent_name: str
    """The agent the child runs."""
    objective: str
    """What the child is for, as it is told."""
    input_refs: tuple[str, ...] = ()
    """Where what the child is given comes from (`RUN#SEQ` of the events that hold it)."""
    allowed_tools: tuple[str, ...] = ()
    """The tools the child may call and its model is shown: the intersection of the declared
    ones, its agent's and its parent's."""
    forbidden_effects: tuple[str, ...] = ()
    """Effect classes none of its tools may have (`write` forbids every tool that is not read
    only; `reversible_write`, `irreversible` the tools declaring those effects)."""
    budget: Budget = field(default_factory=Budget)
    """What the child may spend: the declared budget, cut to what the parent had left."""
    deadline_at: datetime | None = None
    """When the child ends with `timeout` (never later than its parent's deadline)."""
    expected_output: str | None = None
    """Name of the type the result must have."""
    expected_output_schema: dict[str, Any] | None = None
    """JSON schema of that type; None when the child answers in text."""
    merge_policy: MergePolicy = MergePolicy.PARENT_VALIDATES
    """How the parent takes the result in."""
    node: str | None = None
    """The workflow node the child serves."""
    call_id: str | None = None
    """The parent's tool call (`delegate_to_<name>`) the child answers."""
    index: int = 0
    """Which item of a fan-out, or which round of a loop, the child is."""
    depth: int = 1
    """How many delegations down from the root the child is."""
    root_run_id: RunId | None = None
    """The top of the tree of delegations, when it is not the parent (its trace holds every
    descendant's spans)."""

    @property
    def root(self) -> RunId:
        """The run at the top of the tree of delegations."""
        return self.root_run_id or self.parent_run_id


class ChildStatus(StrEnum):
    """Where a child run stands, as its parent records it."""

    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    REJECTED = "rejected"
    """It completed, but its result did not pass the parent's validation."""
    CANCELLED = "cancelled"
    EXPIRED = "expired"


@dataclass(kw_only=True, slots=True)
class ChildRun:
    """One delegation as the parent's fold sees it (owned and updated by the fold)."""

    contract: DelegationContract
    """The contract it runs under."""
    started_seq: int
    """Seq of the parent's child_run_started event."""
    started_at: datetime
    """When the parent started it."""
    status: ChildStatus = ChildStatus.RUNNING
    result: Any = None
    """The validated result (JSON data), once it completed."""
    evidence: dict[str, Any] = field(default_factory=dict)
    """What the child did, derived from its log (never its transcript)."""
    usage: Usage = field(default_factory=Usage)
    """Tokens and cost the child spent (its own descendants' included)."""
    turns: int = 0
    """Model calls the child made (its own descendants' included)."""
    finished_at: datetime | None = None
    reason: str | None = None
    """Why it did not complete (a failure reason, or `output_invalid`)."""
    message: str | None = None

    @property
    def finished(self) -> bool:
        return self.status is not ChildStatus.RUNNING


class NodeStatus(StrEnum):
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"


@dataclass(kw_only=True, slots=True)
class NodeRun:
    """One workflow node as the fold sees it (owned and updated by the fold)."""

    node: str
    kind: str
    status: NodeStatus = NodeStatus.RUNNING
    started_seq: int = 0
    """Seq of its node_started event."""
    completed_seq: int = 0
    """Seq of its node_completed event (what the nodes after it read), once completed."""
    started_at: datetime | None = None
    finished_at: datetime | None = None
    items: list[Any] | None = None
    """For a fan-out or a gate: the items it runs over, as recorded when it started."""
    output: Any = None
    """The validated output (JSON data), once completed."""
    rounds: list[Any] = field(default_factory=list)
    """For a loop: the validated state after each finished round."""
    converged: bool | None = None
    """For a loop: whether its stop condition held."""
    route: str | None = None
    """For a node with conditional edges: the node its output chose to run next."""
    reason: str | None = None
    message: str | None = None
    children: list[str] = field(default_factory=list)
    """Delegation ids of its child runs, in start order."""
    item_outputs: dict[int, Any] = field(default_factory=dict)
    """For a map or gate run by a function: each finished item's output (JSON data), by its
    index, while the node runs."""
    failed_attempts: dict[str, int] = field(default_factory=dict)
    """Attempts of its function that failed and were tried again, by which call (see
    `node_attempt_failed`): a resume goes on counting from there."""
    reconciled: bool = False
    """For a code node that acts: its output is what its `reconcile` found a stopped call
    gave (see `node_reconciled`)."""


__all__ = [
    "MAX_DEPTH",
    "ChildRun",
    "ChildStatus",
    "DelegationContract",
    "MergePolicy",
    "NodeRun",
    "NodeStatus",
]
