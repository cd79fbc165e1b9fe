"""A node's function tried again on the errors its retry policy declares safe: each failed
attempt recorded before the next, counted per item or round, and counted on by a resume in a
new process after a SIGKILL, so no call is tried more often than the policy says."""

from __future__ import annotations

import json
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from pydantic import BaseModel

from contextos import Agent, ConfigError, RetryPolicy, RunStatus, Runtime, Workflow
from contextos import events as ev
from contextos.telemetry import spans_for
from contextos.testing import ScriptedModel, reply
from support import crashes
from support.crashes import lines, resume, states

FLAKY = "tests/graph/crash_targets.py:flaky"
SAFE = RetryPolicy(attempts=3, safe_on=(ConnectionError,), backoff_s=0)


class Pages(BaseModel):
    urls: list[str]


@pytest.fixture
async def rt(tmp_path: Path) -> AsyncIterator[Runtime]:
    async with Runtime(str(tmp_path / "runs.db")) as runtime:
        yield runtime


def refusing(times: int, calls: list[str]) -> object:
    """A fetch that is refused its first `times` calls for each url, then answers."""

    def fetch(url: str) -> str:
        calls.append(url)
        if calls.count(url) <= times:
            raise ConnectionError(f"{url}: connection refused")
        return f"<html>{url}</html>"

    return fetch


def attempts(events: list[ev.Event]) -> list[tuple[str, str, int]]:
    return [(e.node, e.where, e.attempt) for e in events if isinstance(e, ev.NodeAttemptFailed)]


async def test_a_code_node_is_tried_again_after_an_error_it_declares_safe(rt: Runtime) -> None:
    calls: list[str] = []
    flow = Workflow("fetch-one", input=str)
    flow.code("fetch", refusing(2, calls), retry=SAFE)
    result = await rt.run(flow, "https://example.org")
    assert result.status is RunStatus.COMPLETED, result.failure_message
    assert result.structured_output == "<html>https://example.org</html>"
    assert len(calls) == 3
    events = await rt.events(result.run_id)
    assert attempts(events) == [("fetch", "", 1), ("fetch", "", 2)]
    failed = next(e for e in events if isinstance(e, ev.NodeAttemptFailed))
    assert (failed.error_type, failed.error) == (
        "ConnectionError",
        "https://example.org: connection refused",
    )
    # Each failed attempt is seen in the node's span and in the timeline.
    (span,) = [s for s in spans_for(events) if s.name == "node fetch"]
    assert [
        e.attributes["attempt"] for e in span.events if e.name == "contextos.node_attempt_failed"
    ] == [
        1,
        2,
    ]


async def test_an_error_not_declared_safe_fails_the_node_at_once(rt: Runtime) -> None:
    calls: list[str] = []

    def parse(text: str) -> int:
        calls.append(text)
        raise ValueError(f"not a number: {text}")

    flow = Workflow("parse", input=str)
    flow.code("parse", parse, retry=RetryPolicy(attempts=3, safe_on=(ConnectionError,)))
    result = await rt.run(flow, "x")
    assert result.status is RunStatus.FAILED
    assert result.failure_message == "node parse raised ValueError: not a number: x"
    assert calls == ["x"] and attempts(await rt.events(result.run_id)) == []


async def test_the_last_attempt_fails_the_node_and_says_so(rt: Runtime) -> None:
    calls: list[str] = []
    flow = Workflow("fetch-down", input=str)
    flow.code("fetch", refusing(5, calls), retry=SAFE)
    result = await rt.run(flow, "https://down.example")
    assert result.status is RunStatus.FAILED
    assert result.failure_message == (
        "node fetch raised ConnectionError: https://down.example: connection refused "
        "(attempt 3 of 3)"
    )
    assert len(calls) == 3
    assert attempts(await rt.events(result.run_id)) == [("fetch", "", 1), ("fetch", "", 2)]


async def test_a_map_counts_the_attempts_of_each_item(rt: Runtime) -> None:
    calls: list[str] = []
    fetch = refusing(0, calls)

    def flaky_b(url: str) -> str:
        if url == "b" and calls.count("b") < 2:
            calls.append("b")
            raise ConnectionError("b: connection reset")
        return str(fetch(url))

    flow = Workflow("fetch-all", input=Pages)
    flow.map("fetch", flaky_b, over="urls", item=str, concurrency=2, retry=SAFE)
    result = await rt.run(flow, Pages(urls=["a", "b", "c"]))
    assert result.status is RunStatus.COMPLETED, result.failure_message
    assert result.structured_output == ["<html>a</html>", "<html>b</html>", "<html>c</html>"]
    assert attempts(await rt.events(result.run_id)) == [
        ("fetch", "item 1", 1),
        ("fetch", "item 1", 2),
    ]
    state = await rt.state(result.run_id)
    assert state.nodes["fetch"].failed_attempts == {"item 1": 2}
    (drawn,) = (await rt.tree(result.run_id)).children
    assert drawn.detail == "3 items, 2 attempts failed and tried again"


def len_of(pages: Pages) -> int:
    return len(pages.urls)


def test_retry_is_for_functions_and_changes_the_workflows_identity() -> None:
    agent = Agent(name="a", model=ScriptedModel([reply("x")]))
    flow = Workflow("agents", input=Pages)
    with pytest.raises(ConfigError, match="retry is for a function"):
        flow.map("each", agent, over="urls", item=str, retry=SAFE)
    with pytest.raises(ConfigError, match="retry is a RetryPolicy"):
        flow.code("count", len_of, retry=3)  # type: ignore[arg-type]

    def hashed(retry: RetryPolicy | None) -> str:
        flow = Workflow("hash", input=str)
        flow.code("fetch", refusing(0, []), retry=retry)
        return flow.identity_hash()

    assert hashed(None) == hashed(RetryPolicy())
    assert hashed(SAFE) != hashed(None)


def test_a_resume_after_a_kill_counts_on_from_the_attempts_recorded(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    # Attempt 1 is refused and recorded; the process is killed during attempt 2.
    killed = crashes.kill_after(
        db, "run_f", 0, FLAKY, "https://example.org", tmp_path, CRASH_KILL_AT="fetch:2"
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert states(db)["run_f"].nodes["fetch"].failed_attempts == {"": 1}
    resumed = resume(db, "run_f", tmp_path)
    assert json.loads(resumed.stdout)["status"] == "failed", resumed.stderr
    ended = states(db)["run_f"]
    # The cut-off attempt 2 ran again, as the last of 2: not a fresh count of attempts.
    assert ended.failure_message == (
        "node fetch raised ConnectionError: https://example.org: connection refused "
        "(attempt 2 of 2)"
    )
    assert len(lines(tmp_path / "code.jsonl")) == 3
