"""Run statuses, the transitions between them, failure reasons and budgets.

The fold that turns events into a run's state lives in `state.py`; this module holds the records
both events and the fold depend on, so neither imports the other in a circle.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import NewType

from contextos.errors import ConfigError

RunId = NewType("RunId", str)

PRIORITIES = range(-(2**31), 2**31)
"""The priorities a run may have: what every store keeps (a 32-bit integer column)."""


def check_priority(priority: int) -> None:
    """Raise ConfigError unless `priority` is in PRIORITIES."""
    # Checked as an int first: `in` a range of anything else walks all 2**32 values.
    valid = isinstance(priority, int) and not isinstance(priority, bool)
    if not valid or priority not in PRIORITIES:
        what = "is out of range" if valid else "is not an integer"
        raise ConfigError(
            f"priority {priority!r} {what}: use an integer from {PRIORITIES.start} "
            f"to {PRIORITIES.stop - 1}",
            priority=priority,
        )


class RunStatus(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    INPUT_REQUIRED = "input_required"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    EXPIRED = "expired"
    PAUSED = "paused"
    """Stopped at a step boundary by a person; goes on when resumed or sent a message."""

    @property
    def is_terminal(self) -> bool:
        return self in TERMINAL

    @property
    def is_idle(self) -> bool:
        """Neither ended nor anybody's work: waiting for a person, or paused."""
        return self in (RunStatus.INPUT_REQUIRED, RunStatus.PAUSED)


TERMINAL = frozenset(
    {RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED, RunStatus.EXPIRED}
)

_ENDS = {RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED, RunStatus.EXPIRED}

TRANSITIONS: dict[RunStatus, frozenset[RunStatus]] = {
    # A queued run stays queued when it is forked (its copied history ends queued).
    RunStatus.QUEUED: frozenset({RunStatus.QUEUED, RunStatus.RUNNING, RunStatus.PAUSED, *_ENDS}),
    # A running run can go back to the queue when its worker releases it (shutdown, lease loss).
    RunStatus.RUNNING: frozenset(
        {RunStatus.RUNNING, RunStatus.QUEUED, RunStatus.INPUT_REQUIRED, RunStatus.PAUSED, *_ENDS}
    ),
    RunStatus.INPUT_REQUIRED: frozenset({RunStatus.RUNNING, RunStatus.QUEUED, *_ENDS}),
    # A paused run goes on when resumed (running) or sent a message (queued for a driver).
    RunStatus.PAUSED: frozenset({RunStatus.RUNNING, RunStatus.QUEUED, *_ENDS}),
    RunStatus.COMPLETED: frozenset(),
    RunStatus.FAILED: frozenset(),
    RunStatus.CANCELLED: frozenset(),
    RunStatus.EXPIRED: frozenset(),
}
"""Allowed status changes. Terminal statuses have none: they can never be left."""


def can_transition(current: RunStatus, new: RunStatus) -> bool:
    return new in TRANSITIONS[current]


class FailureReason(StrEnum):
    """Why a run failed, machine-readable; each has its own recovery."""

    MODEL_REFUSED = "model_refused"
    MODEL_ERROR = "model_error"
    TOOL_FAILED = "tool_failed"
    VERIFICATION_FAILED = "verification_failed"
    BUDGET_EXHAUSTED = "budget_exhausted"
    TIMEOUT = "timeout"
    CANCELLED = "cancelled"
    RUNTIME_CRASHED = "runtime_crashed"
    CONTENT_BLOCKED = "content_blocked"
    """The PII policy blocks what the run was given (e.g. a card number in the input)."""
    MISSING_PRINCIPAL = "missing_principal"
    """A layer keys on the run's bound principal (memory, a daily budget) and it has none."""
    TOOL_CRASHED = "tool_crashed"
    """A tool kept crashing: it raised SystemExit, KeyboardInterrupt or a stray cancellation
    on every call, or the process driving the run kept dying while it ran."""
    OUTPUT_INVALID = "output_invalid"
    """A workflow node's output, or a child run's result, did not match its declared type."""
    NODE_FAILED = "node_failed"
    """A workflow's code node (or the function that lists a fan-out's items) raised."""
    CHILD_FAILED = "child_failed"
    """A child run the workflow needed ended without a result (failed, cancelled, expired)."""
    NOT_CONVERGED = "not_converged"
    """A convergence loop reached its round limit without its stop condition holding."""
    OUTCOME_UNKNOWN = "outcome_unknown"
    """A workflow's code node that declares an effect was stopped while it ran: whether its
    effect happened is unknown, so it is not run again."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Budget:
    """Limits that end a run with `budget_exhausted` (or `timeout` for the deadline)."""

    max_turns: int = 20
    """Model calls the run may make."""
    max_tokens: int | None = None
    """Input plus output tokens over the whole run."""
    max_cost_usd: float | None = None
    """Money over the whole run, from the pricing table."""
    deadline_s: float | None = None
    """Seconds from the run's creation until it ends with `timeout`."""
    max_verification_attempts: int = 3
    """Times the verifier may send the run back before it fails with `verification_failed`."""
    max_consecutive_tool_errors: int = 5
    """Tool errors in a row before the run fails with `tool_failed`."""
