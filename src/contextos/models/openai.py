"""OpenAI chat completions, and every server that speaks them: vLLM, Ollama, llama.cpp's
servers, LM Studio.

Tools go out as native `tools` by default. A server that ignores `tools` but honours JSON
schema response formats (llama.cpp's `llama-server`, small local models) can be driven with
`tool_mode="json"`: the tools are described in the system message and the reply is constrained
to one JSON decision, a call of a visible tool or the final answer.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import Field, StrictInt, StrictStr

from contextos.errors import ModelError, ModelProtocolError
from contextos.messages import FinishReason, Message, ToolCall, Usage
from contextos.models import _jsontools as jt
from contextos.models import _wire
from contextos.models._http import HTTPOptions, Secret, Transport
from contextos.models._wire import Label, Name, Tokens, Wire
from contextos.models.base import ModelRequest, ModelResponse
from contextos.models.pricing import Price, cost_usd, estimate_prompt_tokens, estimate_tokens

if TYPE_CHECKING:
    import httpx

OPENAI_BASE_URL = "https://api.openai.com/v1"

_FINISH = {
    "stop": FinishReason.STOP,
    "tool_calls": FinishReason.TOOL_CALLS,
    "function_call": FinishReason.TOOL_CALLS,
    "length": FinishReason.LENGTH,
    "content_filter": FinishReason.REFUSED,
}


class OpenAIModel:
    """A chat-completions model (`"openai:gpt-4.1-mini"`, or any compatible server).

    The key comes from `api_key`, else from the environment variable `api_key_env`
    (`OPENAI_API_KEY` for OpenAI itself; unset for other servers, so a key meant for OpenAI is
    never sent to a third-party endpoint by accident).

    `response_format` is how a JSON schema is asked for: `"json_schema"` (OpenAI, vLLM, Ollama,
    LM Studio, llama-server) or `"json_object"` (`{"type": "json_object", "schema": ...}`, the
    form llama-cpp-python's server accepts).
    """

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        provider: str = "openai",
        api_key: str | None = None,
        api_key_env: str | None = None,
        tool_mode: Literal["native", "json"] = "native",
        response_format: Literal["json_schema", "json_object"] = "json_schema",
        price: Price | None = None,
        timeout_s: float = 120.0,
        max_retries: int = 4,
        http: HTTPOptions | None = None,
        extra_body: dict[str, Any] | None = None,
    ) -> None:
        self.model = model
        self.provider = provider
        self.name = f"{provider}:{model}"
        self.base_url = (base_url or OPENAI_BASE_URL).rstrip("/")
        if api_key_env is None and provider == "openai":
            api_key_env = "OPENAI_API_KEY"
        self.api_key_env = api_key_env
        key = api_key if api_key is not None else os.environ.get(api_key_env or "", "") or None
        self._key = Secret(key) if key else None
        self.tool_mode = tool_mode
        self.response_format = response_format
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
        return f"OpenAIModel({self.name!r}, base_url={self.base_url!r})"

    async def aclose(self) -> None:
        await self._transport.aclose()

    def _headers(self) -> dict[str, str]:
        if self._key is None:
            if self.provider == "openai":
                raise ModelError(
                    f"{self.name}: no API key; set {self.api_key_env}", provider=self.name
                )
            return {}
        return {"Authorization": f"Bearer {self._key.reveal()}"}

    # -- the protocol ---------------------------------------------------------------------

    async def complete(self, request: ModelRequest) -> ModelResponse:
        return await self._transport.call(
            "chat/completions",
            self.body(request),
            lambda headers, content: self.read_answer(headers, content, request),
            deadline_at=request.deadline_at,
        )

    async def stream(self, request: ModelRequest) -> AsyncIterator[str | ModelResponse]:
        """Yield content deltas as they arrive, then the final ModelResponse."""
        body = {**self.body(request), "stream": True, "stream_options": {"include_usage": True}}
        acc = _StreamState()
        async with self._transport.stream(
            "chat/completions", body, deadline_at=request.deadline_at
        ) as opened:
            acc.request_id = opened.headers.get("x-request-id")
            async for _, data in opened.events:
                if data.strip() == "[DONE]":
                    break
                payload = _wire.loads(data, provider=self.name, what="a stream chunk")
                if isinstance(payload, dict) and "error" in payload:
                    raise ModelError(
                        f"{self.name}: the stream reported an error: "
                        f"{_wire.clip(_describe_error(0, payload) or str(payload))}",
                        provider=self.name,
                        retryable=True,
                    )
                chunk = _wire.read(
                    _Chunk.model_validate, payload, provider=self.name, what="a stream chunk"
                )
                delta = acc.feed(chunk)
                if delta and self.tool_mode == "native":
                    yield delta
        raw = _wire.read(
            _Message.model_validate,
            {"content": acc.text(), "tool_calls": acc.tool_calls()},
            provider=self.name,
            what="the streamed answer",
        )
        message = self.parse_message(raw, request)
        if self.tool_mode == "json" and message.content:
            yield message.content
        yield self.sealed(
            ModelResponse(
                message=message,
                finish_reason=_finish(acc.finish_reason, message, refusal=acc.refusal or None),
                usage=self.usage(acc.usage, request, message),
                model=f"{self.provider}:{acc.model or self.model}",
                request_id=acc.request_id or acc.id,
            )
        )

    # -- building and reading -------------------------------------------------------------

    def body(self, request: ModelRequest) -> dict[str, Any]:
        """The JSON body of a chat-completions request."""
        body: dict[str, Any] = {"model": self.model}
        if self.tool_mode == "json" and (
            jt.visible_tools(request.tools, request.tool_choice) or request.output_schema
        ):
            system = jt.system_prompt(
                request.tools, output_schema=request.output_schema, tool_choice=request.tool_choice
            )
            body["messages"] = jt.render_messages(request.messages, system)
            schema = jt.decision_schema(
                request.tools, output_schema=request.output_schema, tool_choice=request.tool_choice
            )
            body["response_format"] = self._response_format("decision", schema)
        else:
            body["messages"] = [_wire_message(m) for m in request.messages]
            if request.tools and request.tool_choice != "none" and self.tool_mode == "native":
                body["tools"] = [
                    {
                        "type": "function",
                        "function": {
                            "name": t.name,
                            "description": t.description,
                            "parameters": t.parameters or {"type": "object", "properties": {}},
                        },
                    }
                    for t in request.tools
                ]
                body["tool_choice"] = _tool_choice(request.tool_choice)
            if request.output_schema is not None:
                body["response_format"] = self._response_format("answer", request.output_schema)
        if request.temperature is not None:
            body["temperature"] = request.temperature
        if request.max_output_tokens is not None:
            # OpenAI's newer models only take max_completion_tokens; other servers max_tokens.
            key = "max_completion_tokens" if self.provider == "openai" else "max_tokens"
            body[key] = request.max_output_tokens
        body.update(self.extra_body)
        return body

    def _response_format(self, name: str, schema: dict[str, Any]) -> dict[str, Any]:
        if self.response_format == "json_object":
            return {"type": "json_object", "schema": schema}
        return {"type": "json_schema", "json_schema": {"name": name, "schema": schema}}

    def read_answer(
        self, headers: httpx.Headers, content: bytes, request: ModelRequest
    ) -> ModelResponse:
        """A chat completion's body as a ModelResponse, or a ModelProtocolError."""
        data = _wire.loads(content, provider=self.name, what="the answer")
        if isinstance(data, dict) and "error" in data and "choices" not in data:
            raise ModelProtocolError(
                f"{self.name}: a successful answer carries an error: "
                f"{_wire.clip(_describe_error(0, data) or str(data['error']))}",
                provider=self.name,
            )
        completion = _wire.read(
            _Completion.model_validate, data, provider=self.name, what="the answer"
        )
        choice = completion.choices[0]
        message = self.parse_message(choice.message, request)
        return self.sealed(
            ModelResponse(
                message=message,
                finish_reason=_finish(
                    choice.finish_reason, message, refusal=choice.message.refusal
                ),
                usage=self.usage(completion.usage, request, message),
                model=f"{self.provider}:{completion.model or self.model}",
                request_id=headers.get("x-request-id") or completion.id,
            )
        )

    def parse_message(self, raw: _Message, request: ModelRequest) -> Message:
        content = raw.text()
        if self.tool_mode == "json" and (
            jt.visible_tools(request.tools, request.tool_choice) or request.output_schema
        ):
            return jt.parse_decision(content, output_schema=request.output_schema)
        calls = tuple(
            ToolCall(
                id=c.id or f"call_{i}",
                name=c.function.name,
                arguments=_wire.arguments_text(c.function.arguments),
            )
            for i, c in enumerate(raw.tool_calls or ())
        )
        return Message(role="assistant", content=content or raw.refusal or "", tool_calls=calls)

    def usage(self, raw: _Usage | None, request: ModelRequest, message: Message) -> Usage:
        """Tokens from the provider when it reports them, estimated otherwise; and the cost."""
        prompt = raw.prompt_tokens if raw else None
        completion = raw.completion_tokens if raw else None
        details = raw.prompt_tokens_details if raw else None
        cached = (details.cached_tokens if details else None) or 0
        estimated = prompt is None or completion is None
        if prompt is None:
            prompt = estimate_prompt_tokens(request.messages, request.tools)
        if completion is None:
            completion = estimate_tokens(message.content) + sum(
                estimate_tokens(c.name) + estimate_tokens(c.arguments) for c in message.tool_calls
            )
        if cached > prompt:
            raise ModelProtocolError(
                f"{self.name}: the answer reports {cached} cached of {prompt} prompt tokens",
                provider=self.name,
            )
        cost = cost_usd(
            self.name,
            prompt - cached,
            completion,
            price=self.price,
            cache_read_tokens=cached,
        )
        return Usage(
            input_tokens=prompt,
            output_tokens=completion,
            cost_usd=cost,
            requests=1,
            estimated=estimated,
        )

    def sealed(self, response: ModelResponse) -> ModelResponse:
        return _wire.sealed(response, max_answer_bytes=self._transport.options.max_answer_bytes)


# -- the wire ---------------------------------------------------------------------------------


class _Function(Wire):
    name: Name
    arguments: StrictStr | dict[str, Any] | None = None


class _Call(Wire):
    id: Label | None = None
    function: _Function


class _Part(Wire):
    type: Label | None = None
    text: StrictStr | None = None


class _Message(Wire):
    content: StrictStr | list[_Part] | None = None
    tool_calls: list[_Call] | None = None
    refusal: StrictStr | None = None

    def text(self) -> str:
        if isinstance(self.content, list):  # some servers send content parts
            return "".join(p.text for p in self.content if p.text is not None)
        return self.content or ""


class _Choice(Wire):
    message: _Message
    finish_reason: Label | None = None


class _Details(Wire):
    cached_tokens: Tokens | None = None


class _Usage(Wire):
    prompt_tokens: Tokens | None = None
    completion_tokens: Tokens | None = None
    prompt_tokens_details: _Details | None = None


class _Completion(Wire):
    id: Label | None = None
    model: Label | None = None
    choices: Annotated[list[_Choice], Field(min_length=1)]
    usage: _Usage | None = None


class _DeltaFunction(Wire):
    name: StrictStr | None = None
    arguments: StrictStr | dict[str, Any] | None = None


class _DeltaCall(Wire):
    index: StrictInt = 0
    id: Label | None = None
    function: _DeltaFunction | None = None


class _Delta(Wire):
    content: StrictStr | None = None
    refusal: StrictStr | None = None
    tool_calls: list[_DeltaCall] | None = None


class _ChunkChoice(Wire):
    index: StrictInt = 0
    delta: _Delta | None = None
    finish_reason: Label | None = None


class _Chunk(Wire):
    id: Label | None = None
    model: Label | None = None
    choices: list[_ChunkChoice] | None = None
    usage: _Usage | None = None


# -- wire helpers -------------------------------------------------------------------------


def _wire_message(m: Message) -> dict[str, Any]:
    if m.role == "tool":
        return {"role": "tool", "tool_call_id": m.tool_call_id or "", "content": m.content}
    out: dict[str, Any] = {"role": m.role, "content": m.content}
    if m.role == "assistant" and m.tool_calls:
        # Some servers reject a null content next to tool calls; an empty string is accepted
        # everywhere.
        out["tool_calls"] = [
            {
                "id": c.id,
                "type": "function",
                "function": {"name": c.name, "arguments": c.arguments},
            }
            for c in m.tool_calls
        ]
    return out


def _tool_choice(choice: str) -> Any:
    if choice in ("auto", "required", "none"):
        return choice
    return {"type": "function", "function": {"name": choice}}


def _finish(reason: str | None, message: Message, *, refusal: str | None) -> FinishReason:
    if refusal:
        return FinishReason.REFUSED
    if message.tool_calls:
        return FinishReason.TOOL_CALLS
    return _FINISH.get(reason or "stop", FinishReason.STOP)


def _describe_error(status: int, payload: Any) -> str:
    if isinstance(payload, dict):
        error = payload.get("error")
        if isinstance(error, dict):
            return str(error.get("message") or error.get("type") or "")
        if isinstance(error, str):
            return error
        if "detail" in payload:
            return str(payload["detail"])
    return ""


@dataclass(kw_only=True, slots=True)
class _StreamState:
    """Accumulates a streamed chat completion."""

    parts: list[str] = field(default_factory=list)
    calls: dict[int, dict[str, str]] = field(default_factory=dict)
    finish_reason: str | None = None
    usage: _Usage | None = None
    refusal: str = ""
    model: str | None = None
    id: str | None = None
    request_id: str | None = None

    def feed(self, chunk: _Chunk) -> str:
        """Take one chunk; return its new content text."""
        self.id = self.id or chunk.id
        self.model = self.model or chunk.model
        if chunk.usage:
            self.usage = chunk.usage
        text = ""
        for choice in chunk.choices or ():
            if choice.index != 0:
                continue
            delta = choice.delta or _Delta()
            text += delta.content or ""
            self.refusal += delta.refusal or ""
            for call in delta.tool_calls or ():
                slot = self.calls.setdefault(call.index, {"id": "", "name": "", "arguments": ""})
                fn = call.function or _DeltaFunction()
                # Some servers repeat the id and name in every chunk: keep the first.
                slot["id"] = slot["id"] or call.id or ""
                slot["name"] = slot["name"] or fn.name or ""
                if fn.arguments:  # a piece of JSON text, or (some servers) the whole object
                    slot["arguments"] += _wire.arguments_text(fn.arguments)
            if choice.finish_reason:
                self.finish_reason = choice.finish_reason
        self.parts.append(text)
        return text

    def text(self) -> str:
        return "".join(self.parts)

    def tool_calls(self) -> list[dict[str, Any]]:
        return [
            {"id": c["id"] or None, "function": {"name": c["name"], "arguments": c["arguments"]}}
            for _, c in sorted(self.calls.items())
        ]
