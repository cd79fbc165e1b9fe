"""A model server does not decide how long a call takes: Retry-After is read strictly and
clamped, and every call has a total deadline, against real loopback servers."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from model_servers import LoopbackServer, Reply

from contextos import Agent, Budget, FailureReason, RunStatus, Runtime
from contextos.errors import ModelProtocolError, ModelRateLimited, ModelTimeout
from contextos.messages import Message
from contextos.models._http import HTTPOptions
from contextos.models.base import ModelRequest
from contextos.models.openai import OpenAIModel

Start = Callable[[list[Reply]], LoopbackServer]

REQUEST = ModelRequest(messages=(Message(role="user", content="hi"),))


def ok(content: str = "fine") -> Reply:
    message = {"role": "assistant", "content": content}
    choice = {"index": 0, "message": message, "finish_reason": "stop"}
    return Reply(body={"id": "c", "model": "m", "choices": [choice]})


def adapter(server: LoopbackServer, **http: Any) -> OpenAIModel:
    options = HTTPOptions(**{"backoff_s": 0.01, "max_retries": 3, **http})
    return OpenAIModel(
        model="m", base_url=f"{server.url}/v1", provider="openai-compatible", http=options
    )


@pytest.mark.timeout(30)
@pytest.mark.parametrize("value", ["nan", "inf", "-5", "1e3", "soon", "Wed, 99 Foo 2026"])
async def test_a_retry_after_that_is_not_seconds_or_a_date_falls_back_to_the_backoff(
    loopback: Start, caplog: pytest.LogCaptureFixture, value: str
) -> None:
    limited = Reply(status=429, body={"error": {"message": "slow"}}, headers={"Retry-After": value})
    server = loopback([limited, ok("after the backoff")])
    with caplog.at_level(logging.WARNING, logger="contextos.models"):
        response = await adapter(server).complete(REQUEST)
    assert response.message.content == "after the backoff"
    assert "HTTP 429; retry 1 of 3" in caplog.text
    assert "(backoff)" in caplog.text and "(Retry-After)" not in caplog.text


@pytest.mark.timeout(30)
async def test_a_wait_past_the_runs_deadline_is_not_waited_for(
    loopback: Start, tmp_path: Path
) -> None:
    limited = Reply(status=429, body={"error": {"message": "slow"}}, headers={"Retry-After": "50"})
    server = loopback([limited, ok()])
    agent = Agent(name="a", model=adapter(server), budget=Budget(deadline_s=5))
    async with Runtime(f"sqlite:///{tmp_path / 'runs.db'}") as runtime:
        result = await runtime.run(agent, "hi")
        failed = (await runtime.events(result.run_id))[-1]
    # The call gives up at once (retryable) instead of sleeping into the run's deadline.
    assert result.status is RunStatus.FAILED
    assert result.failure_reason is FailureReason.MODEL_ERROR, result.failure_message
    assert failed.error["code"] == "model_rate_limited"
    assert failed.error["retryable"] is True
    assert len(server.seen) == 1


@pytest.mark.timeout(60)
async def test_a_call_ends_at_its_deadline_however_many_retries_are_left(
    loopback: Start,
) -> None:
    server = loopback([Reply(delay_s=5, body={})] * 5)
    with pytest.raises(ModelTimeout, match="ran out of time") as caught:
        await adapter(server, timeout_s=1, call_timeout_s=2.5, max_retries=4).complete(REQUEST)
    assert caught.value.retryable
    assert caught.value.fields["timeout_s"] == 2.5
    assert len(server.seen) < 5  # the retries left were not made


@pytest.mark.timeout(60)
async def test_a_slow_drip_stream_ends_at_the_calls_deadline(loopback: Start) -> None:
    chunk = {"choices": [{"index": 0, "delta": {"content": "."}}]}
    server = loopback([Reply(sse=[("", chunk)] * 200, drip_s=0.2)])
    model = adapter(server, timeout_s=1, call_timeout_s=2)
    with pytest.raises(ModelTimeout, match="ran out of time"):
        async for _ in model.stream(REQUEST):
            pass
    assert len(server.seen) == 1


async def test_a_stream_longer_than_the_answer_cap_is_refused(loopback: Start) -> None:
    chunk = {"choices": [{"index": 0, "delta": {"content": "x" * 100}}]}
    server = loopback([Reply(sse=[("", chunk)] * 50)])
    model = adapter(server, max_answer_bytes=1000)
    with pytest.raises(ModelProtocolError, match="over the cap of 1000") as caught:
        async for _ in model.stream(REQUEST):
            pass
    assert not caught.value.retryable


@pytest.mark.timeout(30)
async def test_a_rate_limit_without_a_usable_retry_after_still_gives_up(
    loopback: Start,
) -> None:
    limited = Reply(status=429, body={"error": {"message": "no"}}, headers={"Retry-After": "nan"})
    server = loopback([limited] * 3)
    with pytest.raises(ModelRateLimited) as caught:
        await adapter(server, max_retries=2).complete(REQUEST)
    assert "retry_after_s" not in caught.value.fields
    assert len(server.seen) == 3
