"""Property: whatever a provider sends, each parser returns a ModelResponse that an event can
store, or raises a ModelError; nothing else, ever."""

from __future__ import annotations

import json
from typing import Any

import httpx
from hypothesis import given, settings
from hypothesis import strategies as st

from contextos import codec
from contextos import events as ev
from contextos.errors import ModelError
from contextos.messages import Message, ToolSpec
from contextos.models import _jsontools as jt
from contextos.models.anthropic import AnthropicModel
from contextos.models.base import ModelRequest, ModelResponse, check_response
from contextos.models.openai import OpenAIModel
from contextos.runs import RunId

TOOL = ToolSpec(name="get_weather", description="Weather.", parameters={"type": "object"})
REQUEST = ModelRequest(messages=(Message(role="user", content="hi"),), tools=(TOOL,))
OPENAI = OpenAIModel(model="m", base_url="http://127.0.0.1:9/v1", provider="openai-compatible")
OPENAI_JSON = OpenAIModel(
    model="m", base_url="http://127.0.0.1:9/v1", provider="openai-compatible", tool_mode="json"
)
ANTHROPIC = AnthropicModel("claude-sonnet-4-5", base_url="http://127.0.0.1:9", api_key="sk-x")

# Text with every code point a JSON string can carry, and often the awkward ones: lone
# surrogates (no UTF-8 for them), NUL, characters of two to four bytes. (Built from lists:
# st.text() leaves surrogates out.)
awkward = st.sampled_from(["\ud800", "\udfff", "\x00", "é", "😀"])
text = st.lists(st.characters(exclude_categories=()) | awkward, max_size=20).map("".join)
numbers = (
    st.integers(min_value=-(10**30), max_value=10**30)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.sampled_from([0, 1, 10**12, 10**20, -1, 1e300, 0.5])
)
scalars = st.none() | st.booleans() | numbers | text
anything = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(text, inner, max_size=4),
    max_leaves=25,
)


def either(valid: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """A field's valid value, or (one time in ten) any JSON value at all in its place: rare
    enough that whole answers often parse and their deepest fields are reached."""
    return st.integers(0, 9).flatmap(lambda i: anything if i == 0 else valid)


def record(required: dict[str, Any], optional: dict[str, Any]) -> st.SearchStrategy[Any]:
    return either(st.fixed_dictionaries(required, optional=optional))


counts = either(st.integers(min_value=0, max_value=10**6))
openai_usage = record(
    {},
    {
        "prompt_tokens": counts,
        "completion_tokens": counts,
        "prompt_tokens_details": record({}, {"cached_tokens": counts}),
    },
)
openai_call = record(
    {"function": record({}, {"name": either(st.just("get_weather")), "arguments": anything})},
    {"id": either(text), "type": either(st.just("function"))},
)
openai_message = record(
    {},
    {
        "role": either(st.just("assistant")),
        "content": either(text),
        "tool_calls": either(st.lists(openai_call, max_size=3)),
        "refusal": either(text),
    },
)
openai_body = record(
    {"choices": either(st.lists(record({"message": openai_message}, {}), min_size=1, max_size=2))},
    {
        "id": either(text),
        "model": either(text),
        "usage": openai_usage,
        "finish_reason": either(st.sampled_from(["stop", "tool_calls", "length"])),
    },
)

anthropic_block = either(
    st.fixed_dictionaries({"type": st.just("text"), "text": either(text)})
    | st.fixed_dictionaries(
        {
            "type": st.just("tool_use"),
            "id": either(text),
            "name": either(st.just("get_weather")),
            "input": anything,
        }
    )
    | st.fixed_dictionaries({"type": either(st.just("thinking"))})
)
anthropic_body = record(
    {"content": either(st.lists(anthropic_block, min_size=1, max_size=3))},
    {
        "type": either(st.sampled_from(["message", "error"])),
        "id": either(text),
        "model": either(text),
        "stop_reason": either(st.sampled_from(["end_turn", "tool_use", "max_tokens"])),
        "usage": record(
            {},
            {
                "input_tokens": counts,
                "output_tokens": counts,
                "cache_read_input_tokens": counts,
                "cache_creation_input_tokens": counts,
            },
        ),
        "error": anything,
    },
)
bodies = st.binary(max_size=64) | st.builds(
    lambda v: json.dumps(v).encode(), anything | openai_body | anthropic_body
)


def storable(response: ModelResponse) -> None:
    """The response passes the runtime's own check, and an event holding it round-trips."""
    check_response(response, model="m")
    event = ev.ModelResponded(
        run_id=RunId("r"),
        seq=1,
        message=response.message,
        finish_reason=response.finish_reason,
        usage=response.usage,
        model=response.model,
        request_id=response.request_id,
    )
    assert codec.decode("r", 1, event.type, 1, codec.encode(event)) == event


def answer_or_model_error(parse: Any, body: bytes) -> None:
    try:
        response = parse(httpx.Headers(), body, REQUEST)
    except ModelError:
        return
    assert isinstance(response, ModelResponse)
    storable(response)


@settings(max_examples=400, deadline=None)
@given(body=st.one_of(bodies, st.builds(lambda v: json.dumps(v).encode(), openai_body)))
def test_any_openai_answer_is_a_response_or_a_model_error(body: bytes) -> None:
    answer_or_model_error(OPENAI.read_answer, body)
    answer_or_model_error(OPENAI_JSON.read_answer, body)


@settings(max_examples=400, deadline=None)
@given(body=st.one_of(bodies, st.builds(lambda v: json.dumps(v).encode(), anthropic_body)))
def test_any_anthropic_answer_is_a_response_or_a_model_error(body: bytes) -> None:
    answer_or_model_error(ANTHROPIC.read_answer, body)


decisions = st.builds(
    json.dumps,
    anything
    | record({"name": either(st.just("get_weather")), "arguments": anything}, {})
    | record({"answer": anything}, {}),
)


@settings(max_examples=400, deadline=None)
@given(decision=decisions | text)
def test_any_json_decision_is_a_message_or_a_model_error(decision: str) -> None:
    try:
        message = jt.parse_decision(decision)
    except ModelError:
        return
    assert isinstance(message, Message) and message.role == "assistant"
    assert all(isinstance(c.name, str) and c.name for c in message.tool_calls)
    assert all(isinstance(c.arguments, str) for c in message.tool_calls)
