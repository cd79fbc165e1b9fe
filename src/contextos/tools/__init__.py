"""Tools: contracts, the gateway every call goes through, the effect ledger, built-in tools
(files, HTTP, asking a person), MCP tools."""

from contextos.ledger import EffectState
from contextos.tools.ask import HumanTool, ask_tools
from contextos.tools.contract import (
    BaseTool,
    EffectKind,
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
from contextos.tools.files import ConfinedTool, file_tools
from contextos.tools.gateway import Gateway, ToolOutcome
from contextos.tools.http import http_tools

__all__ = [
    "BaseTool",
    "ConfinedTool",
    "EffectKind",
    "EffectState",
    "Gateway",
    "HumanTool",
    "RetryPolicy",
    "Risk",
    "Tool",
    "ToolContext",
    "ToolOutcome",
    "ToolResult",
    "ToolRunner",
    "as_tool",
    "ask_tools",
    "file_tools",
    "http_tools",
    "manifest_hash",
    "tool",
]
