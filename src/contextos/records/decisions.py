"""The policy decision record: what policy said about one proposed tool call, and why."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from contextos import events as ev


class Decision(StrEnum):
    ALLOW = "allow"
    DENY = "deny"
    CONSTRAIN = "constrain"
    REQUIRE_APPROVAL = "require_approval"


@dataclass(frozen=True, kw_only=True, slots=True)
class Check:
    """What one layer of authority said about a proposed call."""

    layer: str
    """manifest, containment, allowlist, scopes, classification, policy, limits or approval."""
    decision: Decision
    """That layer's outcome on its own."""
    rule_id: str
    """The rule or built-in check that spoke."""
    reason: str = ""
    """Why, in words."""


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
    approver_roles: tuple[str, ...] = ()
    """Every role an approver must hold, when several rules ask for approval."""
    exception_role: str | None = None
    """For a deny that is not absolute: a holder of this role may grant a policy exception."""
    action_hash: str = ""
    """Hash of the frozen action (tool, arguments, contract, call) this decision is about."""
    approval_id: str | None = None
    """The approval that turned require_approval (or an excepted deny) into allow."""
    checks: tuple[Check, ...] = ()
    """What each layer of authority said, in the order they were asked."""
    interrupt_kind: str | None = None
    """For require_approval: the kind of interrupt to raise (approval_required, or
    policy_exception_requested for a deny a role holder may lift)."""
    interrupt_payload: dict[str, Any] = field(default_factory=dict)
    """For require_approval: what the interrupt carries (the frozen action, its hash, the roles
    that may approve, the reasons)."""

    @property
    def allowed(self) -> bool:
        return self.decision in (Decision.ALLOW, Decision.CONSTRAIN)

    @property
    def summary(self) -> str:
        """One line for timelines: `require_approval by refund-over-100 (role finance)`."""
        text = self.decision.value
        if self.rule_ids:
            text += " by " + ", ".join(self.rule_ids)
        roles = self.approver_roles or ((self.approver_role,) if self.approver_role else ())
        if roles and self.decision is Decision.REQUIRE_APPROVAL:
            text += f" (role {' + '.join(roles)})"
        if self.absolute:
            text += " [absolute]"
        if self.reasons:
            text += ": " + "; ".join(self.reasons)
        return text

    @classmethod
    def allow(cls, *, snapshot_hash: str = "", rule_ids: tuple[str, ...] = ()) -> PolicyDecision:
        return cls(decision=Decision.ALLOW, snapshot_hash=snapshot_hash, rule_ids=rule_ids)

    def recorded(self, call_id: str, tool: str, effect_id: str | None) -> dict[str, Any]:
        """The fields of the `PolicyDecided` event that records this decision on a call."""
        return {
            "call_id": call_id,
            "tool": tool,
            "decision": self.decision.value,
            "rule_ids": tuple(self.rule_ids),
            "reasons": tuple(self.reasons),
            "constraints": dict(self.constraints),
            "approver_role": self.approver_role,
            "snapshot_hash": self.snapshot_hash,
            "absolute": self.absolute,
            "effect_id": effect_id,
            "approver_roles": tuple(self.approver_roles),
            "exception_role": self.exception_role,
            "action_hash": self.action_hash,
            "approval_id": self.approval_id,
            "interrupt_kind": self.interrupt_kind,
            "interrupt_payload": dict(self.interrupt_payload),
            "checks": tuple(
                {
                    "layer": c.layer,
                    "decision": c.decision.value,
                    "rule_id": c.rule_id,
                    "reason": c.reason,
                }
                for c in self.checks
            ),
        }

    @classmethod
    def of(cls, decided: ev.PolicyDecided) -> PolicyDecision:
        """The decision a `PolicyDecided` event recorded (what refusing the call needs)."""
        return cls(
            decision=Decision(decided.decision),
            rule_ids=decided.rule_ids,
            reasons=decided.reasons,
            constraints=dict(decided.constraints),
            approver_role=decided.approver_role,
            snapshot_hash=decided.snapshot_hash,
            absolute=decided.absolute,
        )
