"""Policy: who a run acts for, what it may touch, and the decision over each proposed call.

`contextos.policy.authority` (the run-time gate, approvals) is imported on its own: it depends
on `contextos.interrupts`, which depends on this package.
"""

from contextos.policy.containment import Containment
from contextos.policy.decision import Check, Decision, PolicyDecision, PolicyHook, ProposedCall
from contextos.policy.engine import CallHistory, ConfinedTool, Engine
from contextos.policy.files import file_tools
from contextos.policy.http import http_tools
from contextos.policy.identity import CLASSIFICATIONS, Principal, PrincipalKind, RunContext
from contextos.policy.network import NetworkPolicy
from contextos.policy.rules import Condition, Limit, Policy, Rule

__all__ = [
    "CLASSIFICATIONS",
    "CallHistory",
    "Check",
    "Condition",
    "ConfinedTool",
    "Containment",
    "Decision",
    "Engine",
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
    "file_tools",
    "http_tools",
]
