"""A workflow's deadline holds while its code runs: the workflow fails `timeout` at it instead
of waiting for a node's function to return, and no code starts once it passed."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from contextos import Budget, FailureReason, RetryPolicy, RunStatus, Runtime, Workflow


@pytest.fixture
async def rt(tmp_path: Path) -> AsyncIterator[Runtime]:
    async with Runtime(str(tmp_path / "runs.db")) as runtime:
        yield runtime


def timed(name: str) -> Workflow:
    return Workflow(name, input=str, budget=Budget(deadline_s=0.3))


async def test_a_plain_function_past_the_deadline_is_let_go(rt: Runtime) -> None:
    release = threading.Event()
    returned: list[str] = []

    def crawl(url: str) -> str:
        release.wait(60)
        returned.append(url)
        return url

    flow = timed("crawl")
    flow.code("crawl", crawl)
    flow.code("after", str.upper, output=str)
    try:
        result = await rt.run(flow, "https://example.org")
        # The run ended while the function still ran: it was not waited for.
        assert returned == []
    finally:
        release.set()
    assert (result.status, result.failure_reason) == (RunStatus.FAILED, FailureReason.TIMEOUT)
    assert result.failure_message == "the workflow's deadline passed while node crawl ran"
    state = await rt.state(result.run_id)
    assert state.nodes["crawl"].status.value == "failed" and "after" not in state.nodes


async def test_an_async_function_past_the_deadline_is_cancelled(rt: Runtime) -> None:
    cancelled: list[str] = []

    async def crawl(url: str) -> str:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.append(url)
            raise
        return url

    flow = timed("crawl-async")
    flow.code("crawl", crawl)
    result = await rt.run(flow, "https://example.org")
    assert result.failure_reason is FailureReason.TIMEOUT
    assert cancelled == ["https://example.org"]


async def test_no_attempt_starts_after_the_deadline(rt: Runtime) -> None:
    calls: list[str] = []

    def fetch(url: str) -> str:
        calls.append(url)
        raise ConnectionError(f"{url}: connection refused")

    slow_retry = RetryPolicy(attempts=3, safe_on=(ConnectionError,), backoff_s=60, max_backoff_s=60)
    flow = timed("fetch")
    flow.code("fetch", fetch, retry=slow_retry)
    result = await rt.run(flow, "https://example.org")
    assert result.failure_reason is FailureReason.TIMEOUT
    assert calls == ["https://example.org"]  # the back-off reached past the deadline
