"""Conversation records shared by events, the loop and every model adapter.

They live in the core (not in `models/`) because events persist them and the core never imports
upward.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Literal

Role = Literal["system", "user", "assistant", "tool"]


class FinishReason(StrEnum):
    STOP = "stop"
    TOOL_CALLS = "tool_calls"
    LENGTH = "length"
    REFUSED = "refused"


@dataclass(frozen=True, kw_only=True, slots=True)
class ToolCall:
    """One tool call proposed by the model."""

    id: str
    """Call id, unique within the run (the provider's, or one the runtime assigned)."""
    name: str
    """Tool name as the model wrote it (it may not exist)."""
    arguments: str
    """Arguments as raw JSON text, kept verbatim so malformed JSON can be shown back."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Message:
    """One message of the conversation."""

    role: Role
    """Who speaks: system, user, assistant or tool."""
    content: str = ""
    """Text content."""
    tool_calls: tuple[ToolCall, ...] = ()
    """Tool calls proposed by an assistant message."""
    tool_call_id: str | None = None
    """For a tool message: the call it answers."""
    name: str | None = None
    """For a tool message: the tool's name."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Usage:
    """Tokens and money spent by one or more model calls."""

    input_tokens: int = 0
    """Prompt tokens."""
    output_tokens: int = 0
    """Completion tokens."""
    cost_usd: float = 0.0
    """Cost in US dollars from the pricing table (0 when unknown)."""
    requests: int = 0
    """Number of model calls."""
    estimated: bool = False
    """Some of the tokens are an estimate: the provider did not report them."""

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
            cost_usd=self.cost_usd + other.cost_usd,
            requests=self.requests + other.requests,
            estimated=self.estimated or other.estimated,
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class ToolSpec:
    """What a model is told about one tool."""

    name: str
    """Tool name."""
    description: str
    """What the tool does, for the model."""
    parameters: dict[str, object] = field(default_factory=dict)
    """JSON schema of the arguments object."""
    untrusted: bool = False
    """True when the description and schema came from outside the agent's code (an MCP
    server): sanitised and marked, they describe a tool and never instruct the model."""
