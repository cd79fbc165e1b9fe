"""A model server is an untrusted input: real loopback servers answer with malformed bodies,
impossible usage and oversized answers, and every run ends with a reason and a readable log."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from model_servers import Handler, LoopbackServer, Reply, Seen

from contextos import Agent, Budget, FailureReason, RunResult, RunStatus, Runtime
from contextos.messages import Message, ToolCall, Usage
from contextos.models._http import HTTPOptions
from contextos.models.anthropic import AnthropicModel
from contextos.models.base import ModelAdapter, ModelResponse
from contextos.models.openai import OpenAIModel
from contextos.models.pricing import Price
from contextos.telemetry.timeline import describe
from contextos.testing import ScriptedModel

Start = Callable[[list[Reply] | Handler], LoopbackServer]

PRICE = Price(input_per_mtok=1.0, output_per_mtok=2.0)
RETRIES = 1


def get_weather(city: str) -> dict[str, object]:
    """Get the current weather for a city."""
    return {"city": city, "temp_c": 18}


def chat(message: Any, *, usage: Any = None) -> Reply:
    """An OpenAI chat completion whose first choice holds `message` (None: no message)."""
    choice: dict[str, Any] = {"index": 0, "finish_reason": "stop"}
    if message is not None:
        choice["message"] = message
    payload: dict[str, Any] = {"id": "chatcmpl-1", "model": "m", "choices": [choice]}
    if usage is not None:
        payload["usage"] = usage
    return Reply(body=payload)


def text(content: Any = "It is 18 degrees.") -> dict[str, Any]:
    return {"role": "assistant", "content": content}


def tool_call(name: Any = "get_weather", arguments: Any = '{"city": "Paris"}') -> dict[str, Any]:
    call = {"id": "c1", "type": "function", "function": {"name": name, "arguments": arguments}}
    return {"role": "assistant", "content": None, "tool_calls": [call]}


USAGE = {"prompt_tokens": 300, "completion_tokens": 300}


_ABSENT = object()


def claude_answer(**fields: Any) -> Reply:
    """An Anthropic answer with `fields` replaced (or, given _ABSENT, left out)."""
    body = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-4-5",
        "content": [{"type": "text", "text": "It is 18 degrees."}],
        "stop_reason": "end_turn",
        "usage": {"input_tokens": 10, "output_tokens": 5},
    }
    for key, value in fields.items():
        if value is _ABSENT:
            body.pop(key, None)
        else:
            body[key] = value
    return Reply(body=body)


def openai(server: LoopbackServer, **http: Any) -> OpenAIModel:
    options = HTTPOptions(**{"backoff_s": 0.01, "max_retries": RETRIES, **http})
    return OpenAIModel(
        model="m",
        base_url=f"{server.url}/v1",
        provider="openai-compatible",
        price=PRICE,
        http=options,
    )


def claude(server: LoopbackServer) -> AnthropicModel:
    return AnthropicModel(
        "claude-sonnet-4-5",
        base_url=server.url,
        api_key="sk-ant-test-0123456789",
        price=PRICE,
        http=HTTPOptions(backoff_s=0.01, max_retries=RETRIES),
    )


def always(reply: Reply) -> Handler:
    return lambda seen: reply


def weather(model: ModelAdapter, **fields: Any) -> Agent:
    return Agent(name="weather", model=model, tools=[get_weather], **fields)


def today() -> str:
    return datetime.now(UTC).date().isoformat()


def store(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'runs.db'}"


QUESTION = "Weather in Paris?"


async def assert_readable(runtime: Runtime, result: RunResult) -> None:
    """Every event decodes and reads as a line; resume and cancel answer with the same end."""
    events = await runtime.events(result.run_id)
    assert all(describe(e) for e in events)
    again = await runtime.resume(result.run_id)
    cancelled = await runtime.cancel(result.run_id)
    assert again.status is cancelled.status is result.status


def assert_protocol_failure(result: RunResult, events: list[Any]) -> None:
    assert result.status is RunStatus.FAILED, result.failure_message
    assert result.failure_reason is FailureReason.MODEL_ERROR
    failed = events[-1]
    assert failed.type == "run_failed"
    assert failed.error["code"] == "model_protocol_error", failed.error
    assert not any(e.type == "model_responded" for e in events)


OPENAI_MALFORMED = {
    "arguments that are a list": chat(tool_call(arguments=[1, 2])),
    "a numeric tool name": chat(tool_call(name=42)),
    "content that is an object": chat(text({"text": "hi"})),
    "a choice without a message": chat(None),
    "no choices": Reply(body={"id": "x", "model": "m", "choices": []}),
    "an error body with status 200": Reply(body={"error": {"message": "upstream failed"}}),
    "a body that is not JSON": Reply(raw=b"<html>502 from the proxy</html>"),
    "negative usage": chat(text(), usage={"prompt_tokens": -30_000_000, "completion_tokens": 5}),
    "usage of 1e20 tokens": chat(text(), usage={"prompt_tokens": 10**20, "completion_tokens": 5}),
    "usage of 1e300 tokens": chat(text(), usage={"prompt_tokens": 1e300, "completion_tokens": 5}),
    "fractional usage": chat(text(), usage={"prompt_tokens": 10.5, "completion_tokens": 5}),
    "usage as text": chat(text(), usage={"prompt_tokens": "10", "completion_tokens": 5}),
    "more cached tokens than prompt tokens": chat(
        text(),
        usage={
            "prompt_tokens": 10,
            "completion_tokens": 5,
            "prompt_tokens_details": {"cached_tokens": 99},
        },
    ),
    "a lone surrogate in an error body": Reply(raw=b'{"error": {"message": "bad \\ud800"}}'),
}


@pytest.mark.parametrize("answer", OPENAI_MALFORMED.values(), ids=OPENAI_MALFORMED.keys())
async def test_a_malformed_openai_answer_fails_the_run_with_model_protocol_error(
    loopback: Start, tmp_path: Path, answer: Reply
) -> None:
    server = loopback(always(answer))
    async with Runtime(store(tmp_path)) as runtime:
        result = await runtime.run(weather(openai(server)), QUESTION)
        assert_protocol_failure(result, await runtime.events(result.run_id))
        assert len(server.seen) == 1 + RETRIES  # retried like a 5xx, then given up
        await assert_readable(runtime, result)


ANTHROPIC_MALFORMED = {
    "no content": claude_answer(content=_ABSENT),
    "content null": claude_answer(content=None),
    "an error body with status 200": Reply(
        body={"type": "error", "error": {"type": "api_error", "message": "internal"}}
    ),
    "a tool_use block with a numeric name": claude_answer(
        content=[{"type": "tool_use", "id": "t1", "name": 7, "input": {}}], stop_reason="tool_use"
    ),
    "a text block without text": claude_answer(content=[{"type": "text", "text": None}]),
    "tool input that is a list": claude_answer(
        content=[{"type": "tool_use", "id": "t1", "name": "get_weather", "input": [1]}]
    ),
    "negative usage": claude_answer(usage={"input_tokens": -30_000_000, "output_tokens": 5}),
}


@pytest.mark.parametrize("answer", ANTHROPIC_MALFORMED.values(), ids=ANTHROPIC_MALFORMED.keys())
async def test_a_malformed_anthropic_answer_fails_the_run_with_model_protocol_error(
    loopback: Start, tmp_path: Path, answer: Reply
) -> None:
    server = loopback(always(answer))
    async with Runtime(store(tmp_path)) as runtime:
        result = await runtime.run(weather(claude(server)), QUESTION)
        assert_protocol_failure(result, await runtime.events(result.run_id))
        assert len(server.seen) == 1 + RETRIES
        await assert_readable(runtime, result)


async def test_a_malformed_answer_is_asked_again_and_a_good_one_completes_the_run(
    loopback: Start, tmp_path: Path
) -> None:
    server = loopback([chat(None), chat(text("It is 18 degrees."), usage=USAGE)])
    async with Runtime(store(tmp_path)) as runtime:
        result = await runtime.run(weather(openai(server)), QUESTION)
        assert result.status is RunStatus.COMPLETED, result.failure_message
        assert result.output == "It is 18 degrees."
        assert len(server.seen) == 2
        await assert_readable(runtime, result)


async def test_tool_arguments_sent_as_an_object_are_accepted(
    loopback: Start, tmp_path: Path
) -> None:
    server = loopback(
        [chat(tool_call(arguments={"city": "Paris"})), chat(text("It is 18 degrees in Paris."))]
    )
    async with Runtime(store(tmp_path)) as runtime:
        result = await runtime.run(weather(openai(server)), QUESTION)
        assert result.status is RunStatus.COMPLETED, result.failure_message
        events = await runtime.events(result.run_id)
        (call,) = events[2].message.tool_calls
        assert call.arguments == '{"city": "Paris"}'
        tool = next(e for e in events if e.type == "tool_completed")
        assert '"city": "Paris"' in tool.output and not tool.is_error
        await assert_readable(runtime, result)


ANY_ADAPTER = {
    "content that is not text": ModelResponse(message=Message(role="assistant", content=7)),  # type: ignore[arg-type]
    "arguments that are not text": ModelResponse(
        message=Message(
            role="assistant",
            tool_calls=(ToolCall(id="c", name="get_weather", arguments={"city": "P"}),),  # type: ignore[arg-type]
        )
    ),
    "negative usage": ModelResponse(
        message=Message(role="assistant", content="hi"), usage=Usage(input_tokens=-5)
    ),
    "a cost that is not a number": ModelResponse(
        message=Message(role="assistant", content="hi"), usage=Usage(cost_usd=float("nan"))
    ),
    "a lone surrogate": ModelResponse(message=Message(role="assistant", content="\ud800")),
}


@pytest.mark.parametrize("answer", ANY_ADAPTER.values(), ids=ANY_ADAPTER.keys())
async def test_the_runtime_refuses_what_no_event_can_hold_from_any_adapter(
    tmp_path: Path, answer: ModelResponse
) -> None:
    async with Runtime(store(tmp_path)) as runtime:
        result = await runtime.run(weather(ScriptedModel([answer])), QUESTION)
        assert_protocol_failure(result, await runtime.events(result.run_id))
        await assert_readable(runtime, result)


# -- usage ----------------------------------------------------------------------------------


async def test_negative_usage_cannot_switch_the_token_budget_off(
    loopback: Start, tmp_path: Path
) -> None:
    answers = iter(
        [
            chat(tool_call(), usage={"prompt_tokens": -30_000_000, "completion_tokens": 5}),
            chat(tool_call(), usage=USAGE),  # the retry of the refused answer
        ]
    )
    server = loopback(lambda seen: next(answers, chat(tool_call(), usage=USAGE)))
    async with Runtime(store(tmp_path)) as runtime:
        result = await runtime.run(
            weather(openai(server), budget=Budget(max_tokens=1000)), QUESTION
        )
        assert result.failure_reason is FailureReason.BUDGET_EXHAUSTED, result.failure_message
        assert "1200 of 1000 tokens" in (result.failure_message or "")
        assert result.usage.total_tokens == 1200 and result.usage.cost_usd > 0


def usage_free(seen: Seen) -> Reply:
    """An Anthropic server that never reports usage and always asks for the weather."""
    block = {"type": "tool_use", "id": "t1", "name": "get_weather", "input": {"city": "Paris"}}
    return claude_answer(content=[block], stop_reason="tool_use", usage=_ABSENT)


async def test_missing_usage_is_estimated_so_the_budget_still_moves(
    loopback: Start, tmp_path: Path
) -> None:
    server = loopback(usage_free)
    async with Runtime(store(tmp_path)) as runtime:
        result = await runtime.run(weather(claude(server), budget=Budget(max_tokens=400)), QUESTION)
        assert result.failure_reason is FailureReason.BUDGET_EXHAUSTED, result.failure_message
        assert "tokens" in (result.failure_message or "")
        responded = [e for e in await runtime.events(result.run_id) if e.type == "model_responded"]
        assert len(responded) < 20  # stopped by tokens long before the turn limit
        assert all(e.usage.estimated and e.usage.total_tokens > 0 for e in responded)
        assert all(e.usage.cost_usd > 0 for e in responded)


async def test_the_daily_usage_row_never_goes_down(loopback: Start, tmp_path: Path) -> None:
    good = loopback([chat(text(), usage=USAGE)])
    negative = loopback(
        always(chat(text(), usage={"prompt_tokens": -30_000_000, "completion_tokens": -5}))
    )
    async with Runtime(store(tmp_path)) as runtime:
        await runtime.run(weather(openai(good)), QUESTION)
        before = await runtime.store.daily_usage("-/-", today())  # type: ignore[attr-defined]
        result = await runtime.run(weather(openai(negative)), QUESTION)
        after = await runtime.store.daily_usage("-/-", today())  # type: ignore[attr-defined]
    assert result.status is RunStatus.FAILED
    assert before == (600, 1, pytest.approx(0.0009))
    assert after == before  # the refused answers added nothing, and took nothing away


# -- size -----------------------------------------------------------------------------------


async def test_an_answer_over_the_size_cap_is_refused_and_not_stored(
    loopback: Start, tmp_path: Path
) -> None:
    server = loopback(always(chat(text("x" * 20_000_000))))
    async with Runtime(store(tmp_path)) as runtime:
        result = await runtime.run(weather(openai(server)), QUESTION)
        assert_protocol_failure(result, await runtime.events(result.run_id))
        assert "over the cap" in (result.failure_message or "")
        assert len(server.seen) == 1  # the same answer would come again: not retried
        await assert_readable(runtime, result)
    assert (tmp_path / "runs.db").stat().st_size < 1_000_000


async def test_a_long_answer_is_stored_once(loopback: Start, tmp_path: Path) -> None:
    answer = "y" * 3_000_000  # under the 4 MiB cap
    server = loopback([chat(text(answer), usage=USAGE)])
    async with Runtime(store(tmp_path)) as runtime:
        result = await runtime.run(weather(openai(server)), QUESTION)
        assert result.status is RunStatus.COMPLETED, result.failure_message
        assert result.output == answer
        assert (await runtime.result(result.run_id)).output == answer
        await assert_readable(runtime, result)
    db = sqlite3.connect(tmp_path / "runs.db")
    (stored,) = db.execute("SELECT sum(length(payload)) FROM events").fetchone()
    assert len(answer) < stored < len(answer) + 100_000
