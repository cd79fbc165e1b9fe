"""Where a run stands after a runtime stopped driving it, as the public API answers."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from contextos.messages import Usage
from contextos.runs import FailureReason, RunId, RunStatus
from contextos.state import RunState


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
    """Model calls answered (its child runs' included)."""
    usage: Usage = field(default_factory=Usage)
    """Tokens and cost (its child runs' included)."""

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
            turns=s.turns + s.child_turns,
            usage=s.usage + s.child_usage if s.children else s.usage,
        )


__all__ = ["RunResult"]
