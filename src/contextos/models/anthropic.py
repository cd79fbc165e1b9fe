"""Anthropic's Messages API: tools as `tool_use` / `tool_result` blocks, usage, stop reasons."""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from contextos.errors import ModelError
from contextos.messages import FinishReason, Message, ToolCall, Usage
from contextos.models._http import HTTPOptions, Secret, Transport, sse_events
from contextos.models.base import ModelRequest, ModelResponse
from contextos.models.pricing import Price, cost_usd

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
        response = await self._transport.post("v1/messages", self.body(request))
        data = response.json()
        message = _message(data.get("content") or [])
        return ModelResponse(
            message=message,
            finish_reason=_finish(data.get("stop_reason"), message),
            usage=self.usage(data.get("usage") or {}),
            model=f"anthropic:{data.get('model') or self.model}",
            request_id=response.headers.get("request-id") or data.get("id"),
        )

    async def stream(self, request: ModelRequest) -> AsyncIterator[str | ModelResponse]:
        """Yield text deltas as they arrive, then the final ModelResponse."""
        acc = _StreamState()
        async with self._transport.stream(
            "v1/messages", {**self.body(request), "stream": True}
        ) as response:
            acc.request_id = response.headers.get("request-id")
            async for event, data in sse_events(response):
                try:
                    payload = json.loads(data)
                except json.JSONDecodeError as exc:
                    raise ModelError(
                        f"{self.name}: a stream event is not JSON", provider=self.name
                    ) from exc
                kind = payload.get("type") or event
                if kind == "error":
                    error = payload.get("error") or {}
                    raise ModelError(
                        f"{self.name}: the stream reported {error.get('type', 'an error')}: "
                        f"{error.get('message', '')}",
                        provider=self.name,
                        retryable=error.get("type") in ("overloaded_error", "api_error"),
                    )
                delta = acc.feed(kind, payload)
                if delta:
                    yield delta
                if kind == "message_stop":
                    break
        message = _message(acc.blocks())
        yield ModelResponse(
            message=message,
            finish_reason=_finish(acc.stop_reason, message),
            usage=self.usage(acc.usage),
            model=f"anthropic:{acc.model or self.model}",
            request_id=acc.request_id or acc.id,
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

    def usage(self, raw: dict[str, Any]) -> Usage:
        """Tokens as reported (cache reads and writes count as input), and their cost."""
        fresh = int(raw.get("input_tokens") or 0)
        read = int(raw.get("cache_read_input_tokens") or 0)
        write = int(raw.get("cache_creation_input_tokens") or 0)
        output = int(raw.get("output_tokens") or 0)
        cost = cost_usd(
            self.name,
            fresh,
            output,
            price=self.price,
            cache_read_tokens=read,
            cache_write_tokens=write,
        )
        return Usage(
            input_tokens=fresh + read + write, output_tokens=output, cost_usd=cost, requests=1
        )


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


def _message(blocks: list[dict[str, Any]]) -> Message:
    text = "".join(b.get("text", "") for b in blocks if b.get("type") == "text")
    calls = tuple(
        ToolCall(id=b.get("id") or f"toolu_{i}", name=b.get("name", ""), arguments=_args(b))
        for i, b in enumerate(blocks)
        if b.get("type") == "tool_use"
    )
    return Message(role="assistant", content=text, tool_calls=calls)


def _args(block: dict[str, Any]) -> str:
    raw = block.get("input")
    if isinstance(raw, str):  # accumulated from a stream's partial JSON
        return raw or "{}"
    return json.dumps(raw if raw is not None else {})


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
    usage: dict[str, Any] = field(default_factory=dict)
    model: str | None = None
    id: str | None = None
    request_id: str | None = None

    def feed(self, kind: str, payload: dict[str, Any]) -> str:
        """Take one event; return the text it adds."""
        if kind == "message_start":
            msg = payload.get("message") or {}
            self.id, self.model = msg.get("id"), msg.get("model")
            self.usage.update(msg.get("usage") or {})
        elif kind == "content_block_start":
            block = dict(payload.get("content_block") or {})
            if block.get("type") == "tool_use":
                block["input"] = ""  # filled by input_json_delta events
            self.content[int(payload.get("index", 0))] = block
        elif kind == "content_block_delta":
            block = self.content.setdefault(int(payload.get("index", 0)), {"type": "text"})
            delta = payload.get("delta") or {}
            if delta.get("type") == "text_delta":
                block["text"] = block.get("text", "") + delta.get("text", "")
                return str(delta.get("text", ""))
            if delta.get("type") == "input_json_delta":
                block["input"] = block.get("input", "") + delta.get("partial_json", "")
        elif kind == "message_delta":
            delta = payload.get("delta") or {}
            self.stop_reason = delta.get("stop_reason") or self.stop_reason
            self.usage.update({k: v for k, v in (payload.get("usage") or {}).items() if v})
        return ""

    def blocks(self) -> list[dict[str, Any]]:
        return [self.content[i] for i in sorted(self.content)]
