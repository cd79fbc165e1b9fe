"""A provider's answer is untrusted input: it becomes a ModelResponse or a ModelProtocolError.

Each hosted adapter declares the wire shapes it reads as Pydantic models (strict: a number is
not a string, a string is not a number) and reads every answer through `read`. The response it
builds then passes `sealed`: lone surrogates (which no event could store) become U+FFFD, and an
answer over the size cap is refused, never truncated, so nothing half-written is acted on.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import replace
from typing import Annotated, Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from contextos.errors import ModelProtocolError
from contextos.messages import Message, ToolCall
from contextos.models.base import MAX_TOKENS_PER_CALL, ModelResponse

Tokens = Annotated[int, Field(ge=0, le=MAX_TOKENS_PER_CALL)]
"""A token count a provider reports: a whole number, not negative, not absurd."""

Label = Annotated[str, Field(max_length=256)]
"""An id, a model name, a stop reason: short text (the size cap counts only the answer)."""

Name = Annotated[str, Field(min_length=1, max_length=256)]
"""A tool name: a non-empty string."""


class Wire(BaseModel):
    """Base of the wire shapes: strict types, unknown fields ignored."""

    model_config = ConfigDict(strict=True, extra="ignore", frozen=True)


T = TypeVar("T")

_SURROGATE = re.compile("[\ud800-\udfff]")


def loads(content: bytes | str, *, provider: str, what: str) -> Any:
    """JSON text as Python values, or a ModelProtocolError."""
    try:
        return json.loads(content)
    except (ValueError, RecursionError):
        raise ModelProtocolError(f"{provider}: {what} is not JSON", provider=provider) from None


def read(validate: Callable[[Any], T], data: Any, *, provider: str, what: str) -> T:
    """`data` through a wire shape's validator, or a ModelProtocolError naming the first
    problem (`validate`: a shape's `model_validate`, or a TypeAdapter's `validate_python`)."""
    try:
        return validate(data)
    except ValidationError as exc:
        first = exc.errors(include_url=False, include_input=False)[0]
        where = ".".join(str(p) for p in first["loc"]) or "the body"
        raise ModelProtocolError(
            f"{provider}: {what} is malformed at {where}: {first['msg']}",
            provider=provider,
            field=where,
        ) from None
    except RecursionError:
        raise ModelProtocolError(
            f"{provider}: {what} is nested too deeply", provider=provider
        ) from None


def arguments_text(value: str | dict[str, Any] | None) -> str:
    """Tool-call arguments as JSON text: text is kept verbatim (the gateway tells the model
    when it does not parse); an object, which some servers send instead, is serialised."""
    if isinstance(value, dict):
        return json.dumps(value)
    return value or "{}"


def sealed(response: ModelResponse, *, max_answer_bytes: int) -> ModelResponse:
    """The response with storable text, or a ModelProtocolError when it is over the cap."""
    m = response.message
    size = len(m.content) + sum(len(c.name) + len(c.arguments) for c in m.tool_calls)
    if size > max_answer_bytes // 4:  # a character is at most 4 bytes: count only when close
        size = len(m.content.encode("utf-8", "surrogatepass")) + sum(
            len(c.name.encode("utf-8", "surrogatepass"))
            + len(c.arguments.encode("utf-8", "surrogatepass"))
            for c in m.tool_calls
        )
    if size > max_answer_bytes:
        raise ModelProtocolError(
            f"{response.model}: the answer is {size} bytes, over the cap of {max_answer_bytes} "
            "(raise HTTPOptions.max_answer_bytes if such answers are expected)",
            retryable=False,
            provider=response.model,
            max_answer_bytes=max_answer_bytes,
        )
    message = Message(
        role="assistant",
        content=_storable(m.content),
        tool_calls=tuple(
            ToolCall(id=_storable(c.id), name=_storable(c.name), arguments=_storable(c.arguments))
            for c in m.tool_calls
        ),
    )
    return replace(
        response,
        message=message,
        model=_storable(response.model),
        request_id=_storable(response.request_id[:256]) if response.request_id else None,
    )


def _storable(text: str) -> str:
    # json.loads turns an escaped lone surrogate ("\ud800") into a code point UTF-8 cannot hold.
    return _SURROGATE.sub("\ufffd", text) if _SURROGATE.search(text) else text


def clip(text: str, limit: int = 300) -> str:
    """Provider text for an error message: short, on one line, storable."""
    text = " ".join(text[: limit * 4].split())
    return _storable(text if len(text) <= limit else text[: limit - 1] + "…")
