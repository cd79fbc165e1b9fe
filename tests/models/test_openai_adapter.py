"""The OpenAI-compatible adapter against a real server: llama-cpp-python's OpenAI-compatible
server on loopback, serving the embedded model."""

from __future__ import annotations

import json

import pytest

from contextos.messages import FinishReason, Message, ToolCall, ToolSpec
from contextos.models import resolve_model
from contextos.models.base import ModelRequest, ModelResponse, StreamingModelAdapter
from contextos.models.openai import OpenAIModel

pytestmark = pytest.mark.local_model

WEATHER = ToolSpec(
    name="get_weather",
    description="Get the current weather for a city.",
    parameters={
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
        "additionalProperties": False,
    },
)
ADD = ToolSpec(
    name="add",
    description="Add two integers and return the sum.",
    parameters={
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a", "b"],
        "additionalProperties": False,
    },
)
QUESTION = Message(role="user", content="What is the weather in Paris?")


def server_model(base_url: str, **kw: object) -> OpenAIModel:
    return OpenAIModel(
        model="smollm2",
        base_url=base_url,
        provider="openai-compatible",
        max_retries=0,
        **kw,  # type: ignore[arg-type]
    )


def answered(call: ToolCall, result: str) -> tuple[Message, ...]:
    return (
        QUESTION,
        Message(role="assistant", tool_calls=(call,)),
        Message(role="tool", content=result, tool_call_id=call.id, name=call.name),
    )


async def test_native_tool_call_round_trip(llama_server: str) -> None:
    model = resolve_model(f"openai-compatible:{llama_server}#smollm2")
    assert isinstance(model, OpenAIModel)
    assert model.name == "openai-compatible:smollm2"
    # llama-cpp-python's server makes a native tool call when the tool is named.
    first = await model.complete(
        ModelRequest(messages=(QUESTION,), tools=(WEATHER,), tool_choice="get_weather")
    )
    (call,) = first.message.tool_calls
    assert call.name == "get_weather"
    assert isinstance(json.loads(call.arguments)["city"], str)
    assert first.finish_reason is FinishReason.TOOL_CALLS
    assert first.usage.input_tokens > 0 and first.usage.output_tokens > 0
    assert first.request_id

    # The assistant's call and the tool's result go back in OpenAI's wire format.
    second = await model.complete(
        ModelRequest(
            messages=answered(call, '{"city": "Paris", "temp_c": 18, "sky": "cloudy"}'),
            tools=(WEATHER,),
            tool_choice="none",
            max_output_tokens=48,
        )
    )
    assert second.message.tool_calls == ()
    assert second.message.content
    assert second.finish_reason in (FinishReason.STOP, FinishReason.LENGTH)


async def test_json_tool_mode_round_trip_with_automatic_choice(llama_server: str) -> None:
    # The server ignores `tools` unless one is named; in json mode the adapter constrains the
    # reply with a JSON schema response format instead and the model picks the tool itself.
    model = server_model(llama_server, tool_mode="json", response_format="json_object")
    first = await model.complete(ModelRequest(messages=(QUESTION,), tools=(WEATHER, ADD)))
    (call,) = first.message.tool_calls
    assert call.name in ("get_weather", "add")
    args = json.loads(call.arguments)
    if call.name == "get_weather":
        assert set(args) == {"city"}
    else:
        assert set(args) == {"a", "b"} and all(isinstance(v, int) for v in args.values())
    assert first.finish_reason is FinishReason.TOOL_CALLS

    second = await model.complete(
        ModelRequest(
            messages=answered(call, '{"city": "Paris", "temp_c": 18}'),
            tools=(WEATHER, ADD),
            tool_choice="none",
        )
    )
    assert second.message.tool_calls == ()
    assert second.message.content


async def test_streaming_text(llama_server: str) -> None:
    model = server_model(llama_server)
    assert isinstance(model, StreamingModelAdapter)
    items = [
        x
        async for x in model.stream(
            ModelRequest(
                messages=(Message(role="user", content="Write one sentence about the sea."),),
                max_output_tokens=24,
            )
        )
    ]
    *deltas, final = items
    assert isinstance(final, ModelResponse)
    text = [d for d in deltas if isinstance(d, str)]
    assert len(text) == len(deltas) > 1
    assert "".join(text) == final.message.content
    # This server sends no usage in streams: the adapter estimates it.
    assert final.usage.input_tokens > 0 and final.usage.output_tokens > 0


async def test_streaming_tool_call(llama_server: str) -> None:
    model = server_model(llama_server)
    items = [
        x
        async for x in model.stream(
            ModelRequest(messages=(QUESTION,), tools=(WEATHER,), tool_choice="get_weather")
        )
    ]
    final = items[-1]
    assert isinstance(final, ModelResponse)
    (call,) = final.message.tool_calls
    # The server repeats the name in every chunk; it must not be concatenated.
    assert call.name == "get_weather"
    assert set(json.loads(call.arguments)) == {"city"}
    assert final.finish_reason is FinishReason.TOOL_CALLS


async def test_structured_output(llama_server: str) -> None:
    model = server_model(llama_server, response_format="json_object")
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string"}, "sunny": {"type": "boolean"}},
        "required": ["city", "sunny"],
    }
    response = await model.complete(
        ModelRequest(
            messages=(Message(role="user", content="Paris is sunny. Report it as JSON."),),
            output_schema=schema,
        )
    )
    data = json.loads(response.message.content)
    assert isinstance(data["city"], str) and isinstance(data["sunny"], bool)
