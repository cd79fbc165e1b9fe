"""Retries, Retry-After, timeouts, clear errors, keys and usage of the hosted-model adapters,
against real HTTP servers on loopback that misbehave on purpose."""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable

import pytest
from model_servers import LoopbackServer, Reply

from contextos.errors import ModelError, ModelRateLimited, ModelTimeout
from contextos.messages import Message, ToolCall, ToolSpec
from contextos.models._http import HTTPOptions
from contextos.models.base import ModelRequest
from contextos.models.openai import OpenAIModel
from contextos.models.pricing import DEFAULT_PRICES, Price

Start = Callable[[list[Reply]], LoopbackServer]

KEY = "sk-test-0123456789abcdefSECRET"
REQUEST = ModelRequest(messages=(Message(role="user", content="hi"),))


def ok(content: str = "hello", usage: dict[str, object] | None = None) -> Reply:
    body: dict[str, object] = {
        "id": "chatcmpl-1",
        "model": "m",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content},
                "finish_reason": "stop",
            }
        ],
    }
    if usage is not None:
        body["usage"] = usage
    return Reply(body=body, headers={"x-request-id": "req_123"})


def adapter(server: LoopbackServer, **http: float) -> OpenAIModel:
    options = HTTPOptions(**{"backoff_s": 0.01, "max_retries": 3, **http})  # type: ignore[arg-type]
    return OpenAIModel(
        model="m", base_url=f"{server.url}/v1", provider="openai-compatible", http=options
    )


async def test_429_with_retry_after_is_waited_for_then_retried(
    loopback: Start, caplog: pytest.LogCaptureFixture
) -> None:
    server = loopback(
        [
            Reply(
                status=429, body={"error": {"message": "slow down"}}, headers={"Retry-After": "1"}
            ),
            ok("after the wait"),
        ]
    )
    with caplog.at_level(logging.WARNING, logger="contextos.models"):
        response = await adapter(server).complete(REQUEST)
    assert response.message.content == "after the wait"
    assert len(server.seen) == 2
    # The wait came from the server's Retry-After, not from the (0.01 s) backoff.
    assert "HTTP 429; retry 1 of 3 in 1.00s (Retry-After)" in caplog.text


async def test_retry_after_too_far_away_fails_at_once_as_retryable(loopback: Start) -> None:
    server = loopback(
        [Reply(status=429, body={"error": {"message": "quota"}}, headers={"Retry-After": "3600"})]
    )
    with pytest.raises(ModelRateLimited) as caught:
        await adapter(server).complete(REQUEST)
    assert caught.value.retryable
    assert caught.value.fields["retry_after_s"] == 3600
    assert caught.value.fields["status"] == 429
    assert len(server.seen) == 1


async def test_persistent_rate_limit_gives_up_after_the_retries(loopback: Start) -> None:
    server = loopback([Reply(status=429, body={"error": {"message": "no"}})] * 3)
    with pytest.raises(ModelRateLimited, match="rate limited"):
        await adapter(server, max_retries=2).complete(REQUEST)
    assert len(server.seen) == 3


async def test_server_errors_are_retried_with_backoff(loopback: Start) -> None:
    server = loopback(
        [Reply(status=503, body={"error": {"message": "busy"}}), Reply(status=500), ok("fine")]
    )
    response = await adapter(server).complete(REQUEST)
    assert response.message.content == "fine"
    assert len(server.seen) == 3


async def test_a_slow_server_times_out_after_retrying(loopback: Start) -> None:
    server = loopback([Reply(delay_s=3, body={}), Reply(delay_s=3, body={})])
    with pytest.raises(ModelTimeout) as caught:
        await adapter(server, timeout_s=0.3, max_retries=1).complete(REQUEST)
    assert caught.value.retryable
    assert caught.value.code == "model_timeout"
    assert len(server.seen) == 2


async def test_client_errors_are_not_retried_and_say_what_is_wrong(loopback: Start) -> None:
    server = loopback(
        [Reply(status=400, body={"error": {"message": "'messages' must not be empty"}})]
    )
    with pytest.raises(ModelError) as caught:
        await adapter(server).complete(REQUEST)
    assert not caught.value.retryable
    assert "HTTP 400 (bad request): 'messages' must not be empty" in caught.value.message
    assert caught.value.fields["status"] == 400
    assert len(server.seen) == 1


async def test_an_unreachable_server_is_a_retryable_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    model = OpenAIModel(
        model="m",
        base_url=f"http://127.0.0.1:{port}/v1",
        provider="openai-compatible",
        http=HTTPOptions(max_retries=1, backoff_s=0.01),
    )
    with pytest.raises(ModelError, match="cannot reach") as caught:
        await model.complete(REQUEST)
    assert caught.value.retryable


async def test_the_key_is_sent_but_never_shown(
    loopback: Start, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def echo_key(status: int) -> Reply:
        return Reply(
            status=status,
            body={"error": {"message": f"Incorrect API key provided: {KEY}"}},
        )

    server = loopback([echo_key(500), echo_key(401)])
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    model = OpenAIModel(
        model="gpt-4.1-mini", base_url=f"{server.url}/v1", http=HTTPOptions(backoff_s=0.01)
    )
    with caplog.at_level(logging.DEBUG), pytest.raises(ModelError) as caught:
        await model.complete(REQUEST)
    assert server.seen[0].headers["authorization"] == f"Bearer {KEY}"
    error = caught.value
    assert "authentication failed" in error.message
    for shown in (str(error), repr(error), str(error.to_dict()), repr(model), caplog.text):
        assert KEY not in shown
        assert "SECRET" not in shown


async def test_an_openai_key_is_not_sent_to_other_servers(
    loopback: Start, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    server = loopback([ok()])
    await adapter(server).complete(REQUEST)
    assert "authorization" not in server.seen[0].headers


async def test_openai_without_a_key_says_which_variable_to_set(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with pytest.raises(ModelError, match="set OPENAI_API_KEY"):
        await OpenAIModel(model="gpt-4.1-mini").complete(REQUEST)


async def test_provider_usage_is_recorded_and_priced_from_the_table(loopback: Start) -> None:
    usage = {
        "prompt_tokens": 1000,
        "completion_tokens": 200,
        "prompt_tokens_details": {"cached_tokens": 400},
    }
    server = loopback([ok(usage=usage)])
    model = OpenAIModel(
        model="gpt-4.1-mini", base_url=f"{server.url}/v1", api_key=KEY, max_retries=0
    )
    response = await model.complete(REQUEST)
    price = DEFAULT_PRICES["openai:gpt-4.1-mini"]
    assert response.usage.input_tokens == 1000
    assert response.usage.output_tokens == 200
    assert price.cache_read_per_mtok is not None
    expected = (
        600 * price.input_per_mtok + 400 * price.cache_read_per_mtok + 200 * price.output_per_mtok
    ) / 1e6
    assert response.usage.cost_usd == pytest.approx(expected)
    assert response.request_id == "req_123"


async def test_missing_usage_is_estimated_and_priced(loopback: Start) -> None:
    server = loopback([ok("a reply of some length, for the estimate")])
    model = OpenAIModel(
        model="m",
        base_url=f"{server.url}/v1",
        provider="openai-compatible",
        price=Price(input_per_mtok=1.0, output_per_mtok=2.0),
    )
    response = await model.complete(REQUEST)
    u = response.usage
    assert u.input_tokens > 0 and u.output_tokens > 0
    assert u.cost_usd == pytest.approx((u.input_tokens * 1.0 + u.output_tokens * 2.0) / 1e6)


async def test_wire_format_of_calls_results_and_tool_choice(loopback: Start) -> None:
    server = loopback([ok(), ok()])
    call = ToolCall(id="call_1_0", name="get_weather", arguments='{"city": "Paris"}')
    request = ModelRequest(
        messages=(
            Message(role="system", content="Be brief."),
            Message(role="user", content="Weather in Paris?"),
            Message(role="assistant", tool_calls=(call,)),
            Message(role="tool", content="sunny", tool_call_id="call_1_0", name="get_weather"),
        ),
        tools=(
            ToolSpec(name="get_weather", description="Weather.", parameters={"type": "object"}),
        ),
        tool_choice="get_weather",
        max_output_tokens=50,
        temperature=0.0,
    )
    await adapter(server).complete(request)
    body = server.seen[0].body
    assert server.seen[0].path == "/v1/chat/completions"
    assert body["messages"][2] == {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": "call_1_0",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
            }
        ],
    }
    assert body["messages"][3] == {"role": "tool", "tool_call_id": "call_1_0", "content": "sunny"}
    assert body["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    assert body["tools"][0]["function"]["name"] == "get_weather"
    assert body["max_tokens"] == 50 and body["temperature"] == 0.0

    # OpenAI itself takes max_completion_tokens.
    openai = OpenAIModel(model="gpt-4.1-mini", base_url=f"{server.url}/v1", api_key=KEY)
    await openai.complete(request)
    assert server.seen[1].body["max_completion_tokens"] == 50
    assert "max_tokens" not in server.seen[1].body


async def test_a_refusal_is_reported_as_refused(loopback: Start) -> None:
    server = loopback(
        [
            Reply(
                body={
                    "choices": [
                        {
                            "message": {"role": "assistant", "content": None, "refusal": "No."},
                            "finish_reason": "stop",
                        }
                    ]
                }
            )
        ]
    )
    response = await adapter(server).complete(REQUEST)
    assert response.finish_reason.value == "refused"
    assert response.message.content == "No."


async def test_a_stream_that_fails_before_starting_is_retried(loopback: Start) -> None:
    chunks = [
        ("", {"id": "c1", "model": "m", "choices": [{"index": 0, "delta": {"content": "Hel"}}]}),
        ("", {"choices": [{"index": 0, "delta": {"content": "lo"}, "finish_reason": "stop"}]}),
        ("", {"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 2}}),
        ("", "[DONE]"),
    ]
    server = loopback([Reply(status=429, headers={"retry-after-ms": "10"}), Reply(sse=chunks)])
    items = [x async for x in adapter(server).stream(REQUEST)]
    assert items[:2] == ["Hel", "lo"]
    final = items[-1]
    assert not isinstance(final, str)
    assert final.message.content == "Hello"
    assert (final.usage.input_tokens, final.usage.output_tokens) == (7, 2)
    assert server.seen[1].body["stream"] is True
