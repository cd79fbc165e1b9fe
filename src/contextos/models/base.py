"""The model protocol: one request in, one response out. A model proposes; it never acts."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol, runtime_checkable

from contextos.errors import ModelProtocolError
from contextos.messages import FinishReason, Message, ToolCall, ToolSpec, Usage

MAX_TOKENS_PER_CALL = 1_000_000_000
"""More tokens than any model reads or writes in one call: a larger count is a broken answer."""

MAX_COST_PER_CALL_USD = 1_000_000.0
"""More than any one model call costs: a larger cost is a broken answer or a broken price."""


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
    deadline_at: datetime | None = None
    """The run's deadline (UTC): no retry or wait of the call goes past it."""


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


def check_response(response: object, *, model: str) -> ModelResponse:
    """`response` when it is a well-formed ModelResponse that an event can store; otherwise a
    ModelProtocolError. The runtime checks every answer this way before recording it, whatever
    adapter produced it."""

    def refuse(problem: str) -> ModelProtocolError:
        return ModelProtocolError(f"{model}: the answer {problem}", provider=model)

    if not isinstance(response, ModelResponse):
        raise refuse(f"is a {type(response).__name__}, not a ModelResponse")
    m = response.message
    if not isinstance(m, Message) or m.role != "assistant" or not isinstance(m.content, str):
        raise refuse("is not an assistant message with text content")
    if not isinstance(m.tool_calls, tuple) or not all(
        isinstance(c, ToolCall) and _all_str(c.id, c.name, c.arguments) for c in m.tool_calls
    ):
        raise refuse("has a tool call that is not a ToolCall of strings")
    if not isinstance(response.finish_reason, FinishReason):
        raise refuse(f"has an unknown finish reason {response.finish_reason!r}")
    if not _all_str(response.model) or not (
        response.request_id is None or _all_str(response.request_id)
    ):
        raise refuse("has a model name or request id that is not text")
    problem = usage_problem(response.usage)
    if problem is not None:
        raise refuse(f"reports impossible usage: {problem}")
    calls = [text for c in m.tool_calls for text in (c.id, c.name, c.arguments)]
    try:
        for text in (m.content, response.model, *calls):
            text.encode()
    except UnicodeEncodeError:
        raise refuse("holds text that is not valid Unicode") from None
    return response


def usage_problem(usage: object) -> str | None:
    """Why `usage` cannot be recorded (negative, fractional, absurd), or None when it can."""
    if not isinstance(usage, Usage):
        return f"{type(usage).__name__} is not a Usage"
    for name in ("input_tokens", "output_tokens", "requests"):
        value = getattr(usage, name)
        if type(value) is not int or not 0 <= value <= MAX_TOKENS_PER_CALL:
            return f"{name} is {value!r}, not a whole number from 0 to {MAX_TOKENS_PER_CALL}"
    cost = usage.cost_usd
    if type(cost) not in (int, float) or not (
        math.isfinite(cost) and 0 <= cost <= MAX_COST_PER_CALL_USD
    ):
        return f"cost_usd is {cost!r}, not an amount from 0 to {MAX_COST_PER_CALL_USD:g}"
    return None


def _all_str(*values: object) -> bool:
    return all(isinstance(v, str) for v in values)
