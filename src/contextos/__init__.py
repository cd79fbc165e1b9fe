"""ContextOS: a governed, durable agent runtime."""

from contextos.agents import Agent, Subagent, load_agent
from contextos.context.rendered import RenderedCall
from contextos.delegation import DelegationContract
from contextos.errors import (
    AgentChanged,
    ConcurrencyConflict,
    ConfigError,
    ContextOSError,
    ControlRefused,
    EventDecodeError,
    ModelError,
    RunInUse,
    RunIsTerminal,
    RunNotFound,
    Unauthenticated,
)
from contextos.evidence import DecisionRecord, ReplayPacket, ReplayReport
from contextos.graph import RunTree, Workflow, load_runnable
from contextos.messages import FinishReason, Message, ToolCall, Usage
from contextos.models import ModelAdapter, ModelRequest, ModelResponse, resolve_model
from contextos.policy import (
    Containment,
    NetworkPolicy,
    Policy,
    PolicyDecision,
    Principal,
    PrincipalKind,
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
from contextos.results import RunResult
from contextos.runs import PRIORITIES, Budget, FailureReason, RunId, RunStatus
from contextos.runtime import Runtime, run
from contextos.state import RunState, fold
from contextos.store import EventStore, RunSummary, open_store
from contextos.store.artifacts import Artifact
from contextos.store.queue import RunOwner
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
    "Artifact",
    "BaseTool",
    "Budget",
    "ConcurrencyConflict",
    "ConfigError",
    "Containment",
    "ContextOSError",
    "ControlRefused",
    "DecisionRecord",
    "DelegationContract",
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
    "PrincipalKind",
    "RenderedCall",
    "ReplayPacket",
    "ReplayReport",
    "RetryPolicy",
    "Risk",
    "Rule",
    "RunContext",
    "RunId",
    "RunInUse",
    "RunIsTerminal",
    "RunNotFound",
    "RunOwner",
    "RunResult",
    "RunState",
    "RunStatus",
    "RunSummary",
    "RunTree",
    "Runtime",
    "Subagent",
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
    "Workflow",
    "authenticate",
    "fold",
    "issue_token",
    "list_tokens",
    "load_agent",
    "load_runnable",
    "open_store",
    "resolve_model",
    "revoke_token",
    "run",
    "tool",
]
