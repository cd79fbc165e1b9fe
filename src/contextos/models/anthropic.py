"""Anthropic's Messages API: tools as `tool_use` / `tool_result` blocks, usage, stop reasons."""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import Discriminator, StrictInt, StrictStr, Tag, TypeAdapter

from contextos.errors import ModelError, ModelProtocolError
from contextos.messages import FinishReason, Message, ToolCall, Usage
from contextos.models import _wire
from contextos.models._http import HTTPOptions, Secret, Transport
from contextos.models._wire import Label, Name, Tokens, Wire
from contextos.models.base import ModelRequest, ModelResponse
from contextos.models.pricing import Price, cost_usd, estimate_prompt_tokens, estimate_tokens

if TYPE_CHECKING:
    import httpx

ANTHROPIC_BASE_URL = "https://api.anthropic.com"
ANTHROPIC_VERSION = "2023-06-01"

_STOP = {
    "end_turn": FinishReason.STOP,
    "stop_sequence": FinishReason.STOP,
    "pause_turn": FinishReason.STOP,
    "tool_use": FinishReason.TOOL_CALLS,
    "max_tokens": FinishReason.LENGTH,
    "model_context_window_exceeded": FinishReason.LENGTH,
    "refusal": FinishReason.REFUSED,
}


class AnthropicModel:
    """A Claude model (`"anthropic:claude-sonnet-4-5"`); key from ANTHROPIC_API_KEY."""

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        api_key_env: str = "ANTHROPIC_API_KEY",
        max_output_tokens: int = 4096,
        price: Price | None = None,
        timeout_s: float = 120.0,
        max_retries: int = 4,
        http: HTTPOptions | None = None,
        extra_body: dict[str, Any] | None = None,
    ) -> None:
        self.model = model
        self.name = f"anthropic:{model}"
        self.base_url = (base_url or ANTHROPIC_BASE_URL).rstrip("/")
        self.api_key_env = api_key_env
        key = api_key if api_key is not None else os.environ.get(api_key_env) or None
        self._key = Secret(key) if key else None
        self.max_output_tokens = max_output_tokens
        self.price = price
        self.extra_body = dict(extra_body or {})
        options = http or HTTPOptions(timeout_s=timeout_s, max_retries=max_retries)
        self._transport = Transport(
            provider=self.name,
            base_url=self.base_url,
            headers=self._headers,
            options=options,
            secret=self._key,
            describe_error=_describe_error,
        )

    def __repr__(self) -> str:
        return f"AnthropicModel({self.name!r}, base_url={self.base_url!r})"

    async def aclose(self) -> None:
        await self._transport.aclose()

    def _headers(self) -> dict[str, str]:
        if self._key is None:
            raise ModelError(f"{self.name}: no API key; set {self.api_key_env}", provider=self.name)
        return {"x-api-key": self._key.reveal(), "anthropic-version": ANTHROPIC_VERSION}

    # -- the protocol ---------------------------------------------------------------------

    async def complete(self, request: ModelRequest) -> ModelResponse:
        return await self._transport.call(
            "v1/messages",
            self.body(request),
            lambda headers, content: self.read_answer(headers, content, request),
            deadline_at=request.deadline_at,
        )

    async def stream(self, request: ModelRequest) -> AsyncIterator[str | ModelResponse]:
        """Yield text deltas as they arrive, then the final ModelResponse."""
        acc = _StreamState()
        async with self._transport.stream(
            "v1/messages", {**self.body(request), "stream": True}, deadline_at=request.deadline_at
        ) as opened:
            acc.request_id = opened.headers.get("request-id")
            async for event, data in opened.events:
                payload = _wire.loads(data, provider=self.name, what="a stream event")
                if isinstance(payload, dict) and (payload.get("type") or event) == "error":
                    error = payload.get("error")
                    raise ModelError(
                        f"{self.name}: the stream reported "
                        f"{_wire.clip(_describe_error(0, payload) or 'an error')}",
                        provider=self.name,
                        retryable=isinstance(error, dict)
                        and error.get("type") in ("overloaded_error", "api_error"),
                    )
                parsed = _wire.read(
                    _Event.model_validate, payload, provider=self.name, what="a stream event"
                )
                kind = parsed.type or event
                delta = acc.feed(kind, parsed)
                if delta:
                    yield delta
                if kind == "message_stop":
                    break
        blocks = [
            _wire.read(_BLOCK.validate_python, b, provider=self.name, what="the streamed answer")
            for b in acc.blocks()
        ]
        message = _message(blocks)
        yield self.sealed(
            ModelResponse(
                message=message,
                finish_reason=_finish(acc.stop_reason, message),
                usage=self.usage(acc.usage, request, message),
                model=f"anthropic:{acc.model or self.model}",
                request_id=acc.request_id or acc.id,
            )
        )

    # -- building and reading -------------------------------------------------------------

    def body(self, request: ModelRequest) -> dict[str, Any]:
        """The JSON body of a Messages request."""
        system = [m.content for m in request.messages if m.role == "system" and m.content]
        if request.output_schema is not None:
            system.append(
                "Give your final answer as a single JSON value matching this JSON schema, "
                f"with no other text: {json.dumps(request.output_schema)}"
            )
        body: dict[str, Any] = {
            "model": self.model,
            "max_tokens": request.max_output_tokens or self.max_output_tokens,
            "messages": _wire_messages(request.messages),
        }
        if system:
            body["system"] = "\n\n".join(system)
        if request.tools and request.tool_choice != "none":
            body["tools"] = [
                {
                    "name": t.name,
                    "description": t.description,
                    "input_schema": t.parameters or {"type": "object", "properties": {}},
                }
                for t in request.tools
            ]
            body["tool_choice"] = _tool_choice(request.tool_choice)
        if request.temperature is not None:
            body["temperature"] = request.temperature
        body.update(self.extra_body)
        return body

    def read_answer(
        self, headers: httpx.Headers, content: bytes, request: ModelRequest
    ) -> ModelResponse:
        """A Messages API body as a ModelResponse, or a ModelProtocolError."""
        data = _wire.loads(content, provider=self.name, what="the answer")
        if isinstance(data, dict) and (data.get("type") == "error" or "error" in data):
            raise ModelProtocolError(
                f"{self.name}: a successful answer carries an error: "
                f"{_wire.clip(_describe_error(0, data) or str(data.get('error')))}",
                provider=self.name,
            )
        answer = _wire.read(_Answer.model_validate, data, provider=self.name, what="the answer")
        message = _message(answer.content)
        return self.sealed(
            ModelResponse(
                message=message,
                finish_reason=_finish(answer.stop_reason, message),
                usage=self.usage(answer.usage, request, message),
                model=f"anthropic:{answer.model or self.model}",
                request_id=headers.get("request-id") or answer.id,
            )
        )

    def usage(self, raw: _Usage | None, request: ModelRequest, message: Message) -> Usage:
        """Tokens as reported (cache reads and writes count as input), estimated when not
        reported; and their cost."""
        raw = raw or _Usage()
        fresh, output = raw.input_tokens, raw.output_tokens
        read = raw.cache_read_input_tokens or 0
        write = raw.cache_creation_input_tokens or 0
        estimated = fresh is None or output is None
        if fresh is None:
            fresh = max(estimate_prompt_tokens(request.messages, request.tools) - read - write, 0)
        if output is None:
            output = estimate_tokens(message.content) + sum(
                estimate_tokens(c.name) + estimate_tokens(c.arguments) for c in message.tool_calls
            )
        cost = cost_usd(
            self.name,
            fresh,
            output,
            price=self.price,
            cache_read_tokens=read,
            cache_write_tokens=write,
        )
        return Usage(
            input_tokens=fresh + read + write,
            output_tokens=output,
            cost_usd=cost,
            requests=1,
            estimated=estimated,
        )

    def sealed(self, response: ModelResponse) -> ModelResponse:
        return _wire.sealed(response, max_answer_bytes=self._transport.options.max_answer_bytes)


# -- the wire ---------------------------------------------------------------------------------


class _Text(Wire):
    type: Literal["text"]
    text: StrictStr


class _ToolUse(Wire):
    type: Literal["tool_use"]
    id: Label | None = None
    name: Name
    input: dict[str, Any] | StrictStr | None = None
    """An object; JSON text when accumulated from a stream."""


class _Other(Wire):
    """A block the runtime does not use (thinking, server tools, ...)."""

    type: StrictStr


def _block_kind(value: Any) -> str:
    kind = value.get("type") if isinstance(value, dict) else None
    return kind if kind in ("text", "tool_use") else "other"


_Block = Annotated[
    Annotated[_Text, Tag("text")]
    | Annotated[_ToolUse, Tag("tool_use")]
    | Annotated[_Other, Tag("other")],
    Discriminator(_block_kind),
]
_BLOCK: TypeAdapter[_Block] = TypeAdapter(_Block)


class _Usage(Wire):
    input_tokens: Tokens | None = None
    output_tokens: Tokens | None = None
    cache_read_input_tokens: Tokens | None = None
    cache_creation_input_tokens: Tokens | None = None


class _Answer(Wire):
    type: Literal["message"] = "message"
    id: Label | None = None
    model: Label | None = None
    content: list[_Block]
    stop_reason: Label | None = None
    usage: _Usage | None = None


class _StartedMessage(Wire):
    id: Label | None = None
    model: Label | None = None
    usage: _Usage | None = None


class _StartedBlock(Wire):
    type: StrictStr
    id: Label | None = None
    name: StrictStr | None = None
    text: StrictStr | None = None


class _Delta(Wire):
    type: Label | None = None
    text: StrictStr | None = None
    partial_json: StrictStr | None = None
    stop_reason: Label | None = None


class _Event(Wire):
    """One stream event; which fields it has depends on its type."""

    type: Label | None = None
    index: StrictInt = 0
    message: _StartedMessage | None = None
    content_block: _StartedBlock | None = None
    delta: _Delta | None = None
    usage: _Usage | None = None


# -- wire helpers -------------------------------------------------------------------------


def _wire_messages(messages: tuple[Message, ...]) -> list[dict[str, Any]]:
    """User and assistant turns with content blocks; tool results ride in user turns.

    The API wants turns to alternate, and every tool_result to sit in the user turn right after
    the assistant turn that asked for it, before any text: consecutive same-role turns merge.
    """
    out: list[dict[str, Any]] = []

    def add(role: str, blocks: list[dict[str, Any]]) -> None:
        if not blocks:
            return
        if out and out[-1]["role"] == role:
            out[-1]["content"].extend(blocks)
        else:
            out.append({"role": role, "content": blocks})

    for m in messages:
        if m.role == "system":
            continue
        if m.role == "tool":
            add(
                "user",
                [
                    {
                        "type": "tool_result",
                        "tool_use_id": m.tool_call_id or "",
                        "content": m.content,
                    }
                ],
            )
        elif m.role == "assistant":
            blocks: list[dict[str, Any]] = []
            if m.content:
                blocks.append({"type": "text", "text": m.content})
            for c in m.tool_calls:
                blocks.append(
                    {"type": "tool_use", "id": c.id, "name": c.name, "input": _input_of(c)}
                )
            add("assistant", blocks)
        else:
            add("user", [{"type": "text", "text": m.content or " "}])
    return out


def _input_of(call: ToolCall) -> dict[str, Any]:
    # tool_use input must be an object; arguments that never parsed (the gateway already told
    # the model so) are kept as a string field rather than dropped.
    try:
        value = json.loads(call.arguments) if call.arguments.strip() else {}
    except json.JSONDecodeError:
        return {"_raw_arguments": call.arguments}
    return value if isinstance(value, dict) else {"_raw_arguments": call.arguments}


def _tool_choice(choice: str) -> dict[str, Any]:
    if choice == "auto":
        return {"type": "auto"}
    if choice == "required":
        return {"type": "any"}
    return {"type": "tool", "name": choice}


def _message(blocks: list[_Block]) -> Message:
    text = "".join(b.text for b in blocks if isinstance(b, _Text))
    calls = tuple(
        ToolCall(id=b.id or f"toolu_{i}", name=b.name, arguments=_args(b))
        for i, b in enumerate(blocks)
        if isinstance(b, _ToolUse)
    )
    return Message(role="assistant", content=text, tool_calls=calls)


def _args(block: _ToolUse) -> str:
    if isinstance(block.input, str):  # accumulated from a stream's partial JSON
        return block.input or "{}"
    return json.dumps(block.input if block.input is not None else {})


def _finish(stop_reason: str | None, message: Message) -> FinishReason:
    if message.tool_calls:
        return FinishReason.TOOL_CALLS
    return _STOP.get(stop_reason or "end_turn", FinishReason.STOP)


def _describe_error(status: int, payload: Any) -> str:
    if isinstance(payload, dict):
        error = payload.get("error")
        if isinstance(error, dict):
            kind = error.get("type", "")
            return f"{kind}: {error.get('message', '')}" if kind else str(error.get("message", ""))
    return ""


@dataclass(kw_only=True, slots=True)
class _StreamState:
    """Accumulates a streamed message from its server-sent events."""

    content: dict[int, dict[str, Any]] = field(default_factory=dict)
    stop_reason: str | None = None
    usage: _Usage | None = None
    model: str | None = None
    id: str | None = None
    request_id: str | None = None

    def feed(self, kind: str, event: _Event) -> str:
        """Take one event; return the text it adds."""
        if kind == "message_start" and event.message is not None:
            self.id, self.model = event.message.id, event.message.model
            self.add_usage(event.message.usage)
        elif kind == "content_block_start" and event.content_block is not None:
            block = event.content_block.model_dump(exclude_none=True)
            if block["type"] == "tool_use":
                block["input"] = ""  # filled by input_json_delta events
            elif block["type"] == "text":
                block.setdefault("text", "")
            self.content[event.index] = block
        elif kind == "content_block_delta" and event.delta is not None:
            block = self.content.setdefault(event.index, {"type": "text"})
            delta = event.delta
            if delta.type == "text_delta" and delta.text is not None:
                block["text"] = block.get("text", "") + delta.text
                return delta.text
            if delta.type == "input_json_delta" and delta.partial_json is not None:
                block["input"] = block.get("input", "") + delta.partial_json
        elif kind == "message_delta":
            if event.delta is not None:
                self.stop_reason = event.delta.stop_reason or self.stop_reason
            self.add_usage(event.usage)
        return ""

    def add_usage(self, usage: _Usage | None) -> None:
        """Later counts replace earlier ones; a count left out keeps the earlier one."""
        if usage is not None:
            counts = {k: v for k, v in usage.model_dump().items() if v}
            merged = (self.usage or _Usage()).model_dump() | counts
            self.usage = _Usage.model_validate(merged)

    def blocks(self) -> list[dict[str, Any]]:
        return [self.content[i] for i in sorted(self.content)]
