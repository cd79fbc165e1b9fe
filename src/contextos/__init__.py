"""ContextOS: a governed, durable agent runtime."""

from contextos.agents import Agent, load_agent
from contextos.context.rendered import RenderedCall
from contextos.errors import (
    AgentChanged,
    ConcurrencyConflict,
    ConfigError,
    ContextOSError,
    EventDecodeError,
    ModelError,
    RunIsTerminal,
    RunNotFound,
    Unauthenticated,
)
from contextos.messages import FinishReason, Message, ToolCall, Usage
from contextos.models import ModelAdapter, ModelRequest, ModelResponse, resolve_model
from contextos.policy import (
    Containment,
    NetworkPolicy,
    Policy,
    PolicyDecision,
    Principal,
    Rule,
    RunContext,
)
from contextos.policy.tokens import (
    ApiToken,
    authenticate,
    issue_token,
    list_tokens,
    revoke_token,
)
from contextos.records.interrupts import Approval, FrozenAction, Interrupt, InterruptKind
from contextos.runs import PRIORITIES, Budget, FailureReason, RunId, RunStatus
from contextos.runtime import RunResult, Runtime, run
from contextos.state import RunState, fold
from contextos.store import EventStore, RunSummary, open_store
from contextos.telemetry import TimelineEntry, Trace
from contextos.tools import (
    BaseTool,
    EffectKind,
    EffectState,
    RetryPolicy,
    Risk,
    Tool,
    ToolContext,
    ToolResult,
    tool,
)
from contextos.verify import Verdict, Verifier

__version__ = "0.1.0"

__all__ = [
    "Agent",
    "AgentChanged",
    "ApiToken",
    "Approval",
    "BaseTool",
    "Budget",
    "ConcurrencyConflict",
    "ConfigError",
    "Containment",
    "ContextOSError",
    "EffectKind",
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
    "PRIORITIES",
    "Policy",
    "PolicyDecision",
    "Principal",
    "RenderedCall",
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
    "TimelineEntry",
    "Tool",
    "ToolCall",
    "ToolContext",
    "ToolResult",
    "Trace",
    "Unauthenticated",
    "Usage",
    "Verdict",
    "Verifier",
    "authenticate",
    "fold",
    "issue_token",
    "list_tokens",
    "load_agent",
    "open_store",
    "resolve_model",
    "revoke_token",
    "run",
    "tool",
]
