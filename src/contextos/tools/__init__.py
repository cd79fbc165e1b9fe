"""Tools: contracts, the gateway every call goes through."""

from contextos.tools.contract import (
    Effect,
    RetryPolicy,
    Risk,
    Tool,
    ToolContext,
    as_tool,
    manifest_hash,
    tool,
)
from contextos.tools.gateway import Gateway, ToolOutcome

__all__ = [
    "Effect",
    "Gateway",
    "RetryPolicy",
    "Risk",
    "Tool",
    "ToolContext",
    "ToolOutcome",
    "as_tool",
    "manifest_hash",
    "tool",
]
