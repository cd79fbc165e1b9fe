"""The model protocol: one request in, one response out. A model proposes; it never acts."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from contextos.messages import FinishReason, Message, ToolSpec, Usage


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelRequest:
    """Everything a model call sends."""

    messages: tuple[Message, ...]
    """The compiled conversation, system message first when there is one."""
    tools: tuple[ToolSpec, ...] = ()
    """Tools the model may call."""
    output_schema: dict[str, Any] | None = None
    """JSON schema the final answer must match, when the agent declares an output type."""
    temperature: float | None = None
    """Sampling temperature; None leaves the provider's default."""
    max_output_tokens: int | None = None
    """Cap on generated tokens."""
    tool_choice: str = "auto"
    """`"auto"` (the model decides), `"required"` (must call a tool), `"none"`, or a tool name."""
    run_id: str | None = None
    """The run making the call (for tracing and test scripts; never sent to a provider)."""
    turn: int = 0
    """Which model call of the run this is, from 1."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelResponse:
    """What a model call returned."""

    message: Message
    """The assistant message: text, tool calls, or both."""
    finish_reason: FinishReason = FinishReason.STOP
    """Why the model stopped."""
    usage: Usage = field(default_factory=Usage)
    """Tokens (from the provider, or estimated) and cost."""
    model: str = ""
    """Which model answered (`provider:name`)."""
    request_id: str | None = None
    """Provider's request id."""


@runtime_checkable
class ModelAdapter(Protocol):
    """A model the loop can call."""

    name: str
    """`provider:model`, recorded on every model-call event."""

    async def complete(self, request: ModelRequest) -> ModelResponse:
        """Answer one request. Raise ModelError (retryable or not) on failure."""
        ...


@runtime_checkable
class StreamingModelAdapter(ModelAdapter, Protocol):
    """A model that can also stream its answer as it is generated."""

    def stream(self, request: ModelRequest) -> AsyncIterator[str | ModelResponse]:
        """Yield text deltas as they arrive, then exactly one final ModelResponse."""
        ...
