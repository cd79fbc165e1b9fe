"""Tools: contracts, the gateway every call goes through, the effect ledger, MCP tools."""

from contextos.ledger import EffectState
from contextos.tools.contract import (
    BaseTool,
    Effect,
    RetryPolicy,
    Risk,
    Tool,
    ToolContext,
    ToolResult,
    as_tool,
    manifest_hash,
    tool,
)
from contextos.tools.effects import ToolRunner
from contextos.tools.gateway import Gateway, ToolOutcome

__all__ = [
    "BaseTool",
    "Effect",
    "EffectState",
    "Gateway",
    "RetryPolicy",
    "Risk",
    "Tool",
    "ToolContext",
    "ToolOutcome",
    "ToolResult",
    "ToolRunner",
    "as_tool",
    "manifest_hash",
    "tool",
]
