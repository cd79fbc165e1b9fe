"""The Anthropic adapter against a loopback server that speaks the Messages wire format."""

from __future__ import annotations

import json
from collections.abc import Callable
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
from model_servers import Handler, LoopbackServer, Reply, Seen

from contextos import Agent, Budget, FailureReason, RunStatus, Runtime
from contextos.errors import ModelError
from contextos.messages import FinishReason, Message, ToolCall, ToolSpec
from contextos.middleware import Sanitizer
from contextos.models import resolve_model
from contextos.models._http import HTTPOptions
from contextos.models.anthropic import AnthropicModel
from contextos.models.base import ModelRequest, ModelResponse
from contextos.models.pricing import DEFAULT_PRICES, Price
from support.blocks import block_body

Start = Callable[[list[Reply] | Handler], LoopbackServer]

KEY = "sk-ant-test-0123456789SECRET"
MODEL = "claude-sonnet-4-5-20250929"


def get_weather(city: str) -> dict[str, object]:
    """Get the current weather for a city."""
    return {"city": city, "temp_c": 18, "sky": "cloudy"}


def message(content: list[dict[str, Any]], stop_reason: str, **usage: int) -> Reply:
    return Reply(
        body={
            "id": "msg_01",
            "type": "message",
            "role": "assistant",
            "model": MODEL,
            "content": content,
            "stop_reason": stop_reason,
            "stop_sequence": None,
            "usage": {"input_tokens": 100, "output_tokens": 20, **usage},
        },
        headers={"request-id": "req_ant_1"},
    )


def wire_problems(seen: Seen) -> list[str]:
    """What a Messages API server would reject in this request."""
    problems = []
    if seen.path != "/v1/messages":
        problems.append(f"path {seen.path}")
    if seen.headers.get("x-api-key") != KEY:
        problems.append("x-api-key")
    if not seen.headers.get("anthropic-version"):
        problems.append("anthropic-version")
    body = seen.body
    if not isinstance(body.get("max_tokens"), int):
        problems.append("max_tokens")
    roles = [m["role"] for m in body["messages"]]
    if roles[0] != "user" or any(a == b for a, b in pairwise(roles)):
        problems.append(f"roles do not alternate: {roles}")
    for i, m in enumerate(body["messages"]):
        if m["role"] == "system":
            problems.append("system inside messages")
        blocks = m["content"] if isinstance(m["content"], list) else []
        results = [b for b in blocks if b["type"] == "tool_result"]
        if results:
            before = body["messages"][i - 1]["content"]
            asked = {b["id"] for b in before if b["type"] == "tool_use"}
            if {b["tool_use_id"] for b in results} != asked:
                problems.append("tool_result ids do not answer the previous tool_use")
            if blocks[: len(results)] != results:
                problems.append("tool_result blocks must come first")
    for t in body.get("tools", []):
        if set(t) != {"name", "description", "input_schema"}:
            problems.append(f"tool shape {sorted(t)}")
    return problems


def weather_server(seen: Seen) -> Reply:
    """Calls get_weather first, then answers from the tool result."""
    problems = wire_problems(seen)
    if problems:
        return Reply(
            status=400,
            body={
                "type": "error",
                "error": {"type": "invalid_request_error", "message": "; ".join(problems)},
            },
        )
    last = seen.body["messages"][-1]["content"]
    results = [b for b in last if b["type"] == "tool_result"]
    if not results:
        return message(
            [
                {"type": "text", "text": "Let me check."},
                {
                    "type": "tool_use",
                    "id": "toolu_01",
                    "name": "get_weather",
                    "input": {"city": "Paris"},
                },
            ],
            "tool_use",
            cache_read_input_tokens=1000,
            cache_creation_input_tokens=50,
        )
    weather = json.loads(block_body(results[0]["content"]))  # shown inside its data block
    return message(
        [{"type": "text", "text": f"It is {weather['temp_c']} degrees in Paris."}], "end_turn"
    )


def claude(server: LoopbackServer, **kw: Any) -> AnthropicModel:
    return AnthropicModel(
        MODEL, base_url=server.url, api_key=KEY, http=HTTPOptions(backoff_s=0.01), **kw
    )


async def test_tool_use_round_trip_through_the_runtime(loopback: Start, tmp_path: Path) -> None:
    server = loopback(weather_server)
    agent = Agent(
        name="weather", model=claude(server), instructions="Be brief.", tools=[get_weather]
    )
    async with Runtime(f"sqlite:///{tmp_path / 'runs.db'}") as runtime:
        result = await runtime.run(agent, "What is the weather in Paris?")
        events = await runtime.events(result.run_id)
    assert result.status is RunStatus.COMPLETED, result.failure_message
    assert result.output == "It is 18 degrees in Paris."
    first, second = (s.body for s in server.seen)
    # the system messages (the instructions, the default sanitizer's notice) in one field
    assert first["system"] == f"Be brief.\n\n{Sanitizer().notice().content}"
    assert first["tools"][0]["input_schema"]["properties"]["city"]["type"] == "string"
    assert first["tool_choice"] == {"type": "auto"}
    assert [m["role"] for m in second["messages"]] == ["user", "assistant", "user"]
    assert second["messages"][1]["content"][1] == {
        "type": "tool_use",
        "id": "call_1_0",
        "name": "get_weather",
        "input": {"city": "Paris"},
    }

    # Usage: cache reads and writes count as input and are priced at their own rates.
    responded = [e for e in events if e.type == "model_responded"]
    usage = responded[0].usage
    assert (usage.input_tokens, usage.output_tokens) == (1150, 20)
    p = DEFAULT_PRICES["anthropic:claude-sonnet-4-5"]
    assert p.cache_read_per_mtok is not None and p.cache_write_per_mtok is not None
    expected = (
        100 * p.input_per_mtok
        + 1000 * p.cache_read_per_mtok
        + 50 * p.cache_write_per_mtok
        + 20 * p.output_per_mtok
    ) / 1e6
    assert usage.cost_usd == pytest.approx(expected)
    assert responded[0].request_id == "req_ant_1"
    assert result.usage.cost_usd == pytest.approx(sum(e.usage.cost_usd for e in responded))


async def test_a_cost_budget_stops_the_run(loopback: Start, tmp_path: Path) -> None:
    server = loopback(weather_server)
    agent = Agent(
        name="weather",
        model=claude(server, price=Price(input_per_mtok=100.0, output_per_mtok=100.0)),
        tools=[get_weather],
        budget=Budget(max_cost_usd=0.01),
    )
    async with Runtime(f"sqlite:///{tmp_path / 'runs.db'}") as runtime:
        result = await runtime.run(agent, "What is the weather in Paris?")
    assert result.status is RunStatus.FAILED
    assert result.failure_reason is FailureReason.BUDGET_EXHAUSTED
    assert len(server.seen) == 1  # the over-budget second call never reached the provider
    assert result.usage.cost_usd >= 0.01


@pytest.mark.parametrize(
    ("stop_reason", "finish"),
    [
        ("end_turn", FinishReason.STOP),
        ("stop_sequence", FinishReason.STOP),
        ("max_tokens", FinishReason.LENGTH),
        ("refusal", FinishReason.REFUSED),
    ],
)
async def test_stop_reasons(loopback: Start, stop_reason: str, finish: FinishReason) -> None:
    server = loopback([message([{"type": "text", "text": "x"}], stop_reason)])
    response = await claude(server).complete(
        ModelRequest(messages=(Message(role="user", content="hi"),))
    )
    assert response.finish_reason is finish


async def test_consecutive_results_and_text_share_one_user_turn(loopback: Start) -> None:
    server = loopback([message([{"type": "text", "text": "ok"}], "end_turn")])
    calls = (
        ToolCall(id="a", name="get_weather", arguments='{"city": "Paris"}'),
        ToolCall(id="b", name="get_weather", arguments='{"city": "Rome"}'),
    )
    await claude(server).complete(
        ModelRequest(
            messages=(
                Message(role="user", content="Paris and Rome?"),
                Message(role="assistant", tool_calls=calls),
                Message(role="tool", content="sunny", tool_call_id="a", name="get_weather"),
                Message(role="tool", content="rain", tool_call_id="b", name="get_weather"),
                Message(role="user", content="Now compare."),
            ),
            tools=(ToolSpec(name="get_weather", description="Weather.", parameters={}),),
            tool_choice="required",
        )
    )
    body = server.seen[0].body
    assert wire_problems(server.seen[0]) == []
    assert [b["type"] for b in body["messages"][2]["content"]] == [
        "tool_result",
        "tool_result",
        "text",
    ]
    assert body["tool_choice"] == {"type": "any"}


async def test_streaming_text_and_a_tool_call(loopback: Start) -> None:
    events = [
        (
            "message_start",
            {
                "type": "message_start",
                "message": {
                    "id": "msg_02",
                    "model": MODEL,
                    "usage": {"input_tokens": 40, "output_tokens": 1},
                },
            },
        ),
        (
            "content_block_start",
            {"type": "content_block_start", "index": 0, "content_block": {"type": "text"}},
        ),
        ("ping", {"type": "ping"}),
        (
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "text_delta", "text": "Che"},
            },
        ),
        (
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "text_delta", "text": "cking"},
            },
        ),
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        (
            "content_block_start",
            {
                "type": "content_block_start",
                "index": 1,
                "content_block": {
                    "type": "tool_use",
                    "id": "toolu_9",
                    "name": "get_weather",
                    "input": {},
                },
            },
        ),
        (
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": 1,
                "delta": {"type": "input_json_delta", "partial_json": '{"city": "Pa'},
            },
        ),
        (
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": 1,
                "delta": {"type": "input_json_delta", "partial_json": 'ris"}'},
            },
        ),
        ("content_block_stop", {"type": "content_block_stop", "index": 1}),
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": "tool_use"},
                "usage": {"output_tokens": 15},
            },
        ),
        ("message_stop", {"type": "message_stop"}),
    ]
    server = loopback([Reply(sse=events, headers={"request-id": "req_s"})])
    items = [
        x
        async for x in claude(server).stream(
            ModelRequest(messages=(Message(role="user", content="Weather in Paris?"),))
        )
    ]
    assert items[:2] == ["Che", "cking"]
    final = items[-1]
    assert isinstance(final, ModelResponse)
    assert final.message.content == "Checking"
    (call,) = final.message.tool_calls
    assert (call.id, call.name, json.loads(call.arguments)) == (
        "toolu_9",
        "get_weather",
        {"city": "Paris"},
    )
    assert final.finish_reason is FinishReason.TOOL_CALLS
    assert (final.usage.input_tokens, final.usage.output_tokens) == (40, 15)
    assert final.request_id == "req_s"
    assert server.seen[0].body["stream"] is True


async def test_overloaded_is_retried(loopback: Start) -> None:
    overloaded = Reply(
        status=529, body={"type": "error", "error": {"type": "overloaded_error", "message": "busy"}}
    )
    server = loopback([overloaded, message([{"type": "text", "text": "done"}], "end_turn")])
    response = await claude(server).complete(
        ModelRequest(messages=(Message(role="user", content="hi"),))
    )
    assert response.message.content == "done"
    assert len(server.seen) == 2


async def test_errors_are_clear_and_carry_no_key(loopback: Start) -> None:
    server = loopback(
        [
            Reply(
                status=400,
                body={
                    "type": "error",
                    "error": {
                        "type": "invalid_request_error",
                        "message": f"max_tokens: too large (key {KEY})",
                    },
                },
            )
        ]
    )
    model = claude(server)
    with pytest.raises(ModelError) as caught:
        await model.complete(ModelRequest(messages=(Message(role="user", content="hi"),)))
    error = caught.value
    assert not error.retryable
    assert "HTTP 400 (bad request): invalid_request_error: max_tokens: too large" in error.message
    for shown in (str(error), str(error.to_dict()), repr(model)):
        assert KEY not in shown and "SECRET" not in shown


def test_model_string_reads_the_key_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
    model = resolve_model(f"anthropic:{MODEL}")
    assert isinstance(model, AnthropicModel)
    assert model.name == f"anthropic:{MODEL}"
    assert KEY not in repr(model) and KEY not in repr(vars(model))


async def test_without_a_key_the_call_says_which_variable_to_set(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    with pytest.raises(ModelError, match="set ANTHROPIC_API_KEY"):
        await AnthropicModel(MODEL).complete(
            ModelRequest(messages=(Message(role="user", content="hi"),))
        )
