"""The public surface is deliberate: sorted, importable, and pinned."""

from __future__ import annotations

import contextos


def test_all_is_sorted_and_importable() -> None:
    assert contextos.__all__ == sorted(contextos.__all__)
    for name in contextos.__all__:
        assert not name.startswith("_")
        assert getattr(contextos, name) is not None


def test_the_public_surface_is_pinned() -> None:
    """Adding or removing a public name is a decision: update this list with it."""
    assert contextos.__all__ == [
        "Agent",
        "AgentChanged",
        "Approval",
        "Artifact",
        "BaseTool",
        "Budget",
        "ConcurrencyConflict",
        "ConfigError",
        "Containment",
        "ContextOSError",
        "DecisionRecord",
        "Effect",
        "EffectState",
        "EventDecodeError",
        "EventStore",
        "FailureReason",
        "FinishReason",
        "FrozenAction",
        "Interrupt",
        "InterruptKind",
        "Message",
        "ModelAdapter",
        "ModelError",
        "ModelRequest",
        "ModelResponse",
        "NetworkPolicy",
        "Policy",
        "PolicyDecision",
        "Principal",
        "ReplayPacket",
        "ReplayReport",
        "RetryPolicy",
        "Risk",
        "Rule",
        "RunContext",
        "RunId",
        "RunIsTerminal",
        "RunNotFound",
        "RunResult",
        "RunState",
        "RunStatus",
        "RunSummary",
        "Runtime",
        "Tool",
        "ToolCall",
        "ToolContext",
        "ToolResult",
        "Usage",
        "Verdict",
        "Verifier",
        "fold",
        "load_agent",
        "open_store",
        "resolve_model",
        "run",
        "tool",
    ]
