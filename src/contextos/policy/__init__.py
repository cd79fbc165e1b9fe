"""Policy: decisions over proposed tool calls."""

from contextos.policy.decision import Decision, PolicyDecision, PolicyHook, ProposedCall

__all__ = ["Decision", "PolicyDecision", "PolicyHook", "ProposedCall"]
