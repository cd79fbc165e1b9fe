"""The policy decision record, and the hook the tool gateway asks before any dispatch."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol, runtime_checkable


class Decision(StrEnum):
    ALLOW = "allow"
    DENY = "deny"
    CONSTRAIN = "constrain"
    REQUIRE_APPROVAL = "require_approval"


@dataclass(frozen=True, kw_only=True, slots=True)
class PolicyDecision:
    """What policy says about one proposed tool call; recorded before anything is dispatched."""

    decision: Decision
    """allow, deny, constrain (allow within `constraints`) or require_approval."""
    rule_ids: tuple[str, ...] = ()
    """The rules that decided."""
    reasons: tuple[str, ...] = ()
    """Why, in words a person (and the model) can read."""
    constraints: dict[str, Any] = field(default_factory=dict)
    """Limits the call must respect, e.g. {"max_amount": 100}."""
    approver_role: str | None = None
    """Role an approver must hold, for require_approval."""
    snapshot_hash: str = ""
    """Hash of the policy snapshot that decided."""
    absolute: bool = False
    """An absolute deny cannot be overridden by any approval."""

    @classmethod
    def allow(cls, *, snapshot_hash: str = "", rule_ids: tuple[str, ...] = ()) -> PolicyDecision:
        return cls(decision=Decision.ALLOW, snapshot_hash=snapshot_hash, rule_ids=rule_ids)


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
