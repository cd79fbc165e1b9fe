"""What the tool gateway asks policy about, and the hook that answers before any dispatch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from contextos.records.decisions import PolicyDecision


@dataclass(frozen=True, kw_only=True, slots=True)
class ProposedCall:
    """A validated tool call waiting for a decision."""

    run_id: str
    """The run proposing it."""
    call_id: str
    """The tool call id."""
    tool: str
    """Tool name."""
    arguments: dict[str, Any]
    """Validated arguments."""
    effect: str
    """The tool's declared effect (read, write, reversible_write, irreversible)."""
    risk: str
    """The tool's declared risk."""
    scopes: tuple[str, ...] = ()
    """Scopes the tool requires."""
    data_classification: str = "internal"
    """The tool's data classification."""


@runtime_checkable
class PolicyHook(Protocol):
    """Decides on proposed calls. The gateway asks it before every dispatch."""

    async def evaluate(self, call: ProposedCall) -> PolicyDecision: ...
