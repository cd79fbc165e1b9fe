"""What the tool gateway asks policy about, and the hook that answers before any dispatch.

The gateway describes each validated call with everything its tool's contract says that
policy weighs (effect, scopes, the paths it confines, whether it asks a person), so the gate
decides without ever holding a tool: the gate decides, the gateway acts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

from contextos.policy.containment import Containment
from contextos.records.deadlines import Expiry
from contextos.records.decisions import PolicyDecision
from contextos.records.interrupts import InterruptKind

Confine = Literal["read", "write", "url"]
"""How an argument is confined: a path read, a path written, or a URL reached."""


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
    contract_hash: str = ""
    """Hash of the tool's contract: a changed tool is a different action."""
    redact_fields: tuple[str, ...] = ()
    """Arguments a person is shown as `[redacted]` (the action's hash still covers them)."""
    compensation: str | None = None
    """The tool that undoes a committed call, when the contract names one."""
    confine: tuple[tuple[str, Confine], ...] = ()
    """(argument, read | write | url) pairs every containment in force must permit."""
    containment: Containment | None = None
    """The tool's own walls, checked as well as the run's."""
    asks: InterruptKind | None = None
    """For a tool whose result is a person's answer: the kind of interrupt it raises."""
    expiry: Expiry | None = None
    """For such a tool: how long its question waits, and what happens then (None: the
    policy's)."""


@runtime_checkable
class PolicyHook(Protocol):
    """Decides on proposed calls. The gateway asks it before every dispatch."""

    async def evaluate(self, call: ProposedCall) -> PolicyDecision: ...
