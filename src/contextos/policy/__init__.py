"""Policy: who a run acts for, what it may touch, and the decision over each proposed call."""

from contextos.policy.containment import Containment
from contextos.policy.engine import CallHistory, Engine
from contextos.policy.hook import PolicyHook, ProposedCall
from contextos.policy.identity import CLASSIFICATIONS, Principal, PrincipalKind, RunContext
from contextos.policy.network import NetworkPolicy
from contextos.policy.rules import Condition, Limit, Policy, Rule
from contextos.records.deadlines import Expiry
from contextos.records.decisions import Check, Decision, PolicyDecision

__all__ = [
    "CLASSIFICATIONS",
    "CallHistory",
    "Check",
    "Condition",
    "Containment",
    "Decision",
    "Engine",
    "Expiry",
    "Limit",
    "NetworkPolicy",
    "Policy",
    "PolicyDecision",
    "PolicyHook",
    "Principal",
    "PrincipalKind",
    "ProposedCall",
    "Rule",
    "RunContext",
]
