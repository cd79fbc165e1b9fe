"""What every persisted event carries: the envelope its type adds its own fields to.

Kept apart from `contextos.events` so the modules holding groups of event types (the graph's,
evidence's) can derive from it while `contextos.events` gathers every type into one union.
"""

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import ClassVar

from contextos.runs import RunId, RunStatus


def utcnow() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True, kw_only=True, slots=True)
class BaseEvent:
    """Fields every event has."""

    SCHEMA_VERSION: ClassVar[int] = 1
    SETS_STATUS: ClassVar[RunStatus | None] = None
    """The status a run has after this event, for events that change it."""

    run_id: RunId
    """The run this event belongs to."""
    seq: int
    """Position in the run's log, from 1, without gaps."""
    occurred_at: datetime = field(default_factory=utcnow)
    """When it happened (UTC)."""
    actor: str = "runtime"
    """Who caused it: `runtime`, `worker:<id>`, `user:<id>`, `model`, `tool:<name>`."""
    causation_id: int | None = None
    """Seq of the event that caused this one, when there is one (set by the runtime before
    every append, see `contextos.causality`)."""
    correlation_id: str | None = None
    """The run tree it belongs to: the id of the tree's root run (the run itself, unless a
    trigger or a parent run started it)."""


__all__ = ["BaseEvent", "utcnow"]
