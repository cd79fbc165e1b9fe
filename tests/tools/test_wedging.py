"""No tool can wedge a run: whatever a tool returns, raises or does to the event loop ends as a
recorded outcome, and the run goes on (or ends with the reason that fits).

The worker-process side (a worker that outlives a SystemExit tool, one that stops at the second
SIGTERM with a sync tool hung in a thread, a tool that keeps killing its process) is in
tests/workers/test_misbehaving_tools.py.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest

from contextos import Agent, Budget, FailureReason, RunStatus, Runtime
from contextos import events as ev
from contextos.ledger import EffectState
from contextos.testing import ScriptedModel, call_tool, reply
from contextos.tools import RetryPolicy, Tool, ToolContext, tool


async def run_one(runtime: Runtime, t: Tool, **agent: Any) -> tuple[Any, list[ev.Event]]:
    """One call to `t`, then a reply: the run must get past the call."""
    model = ScriptedModel([call_tool(t.name), reply("carried on")])
    result = await runtime.run(Agent(name="wedge", model=model, tools=[t], **agent), "go")
    return result, await runtime.events(result.run_id)


def completed(events: list[ev.Event]) -> ev.ToolCompleted:
    (done,) = (e for e in events if isinstance(e, ev.ToolCompleted))
    return done


# -- outputs that cannot be rendered or recorded --------------------------------------------


class Unprintable:
    def __str__(self) -> str:
        raise RuntimeError("no text for you")

    __repr__ = __str__


def cyclic() -> Any:
    data: list[Any] = [1]
    data.append(data)
    return data


def nested(depth: int) -> Any:
    data: list[Any] = []
    for _ in range(depth):
        data = [data]
    return data


UNRENDERABLE: dict[str, tuple[Callable[[], Any], str]] = {
    "cyclic": (cyclic, "Circular reference"),
    "raising __str__": (lambda: {"value": Unprintable()}, "no text for you"),
    "lone surrogate": (lambda: "half a pair: \ud800", "not valid Unicode"),
    "surrogate in a structure": (lambda: {"name": "\udcff"}, "not valid Unicode"),
    "nested past the recursion limit": (lambda: nested(100_000), "RecursionError"),
    "keys JSON cannot have": (lambda: {(1, 2): "tuple key"}, "TypeError"),
}


@pytest.mark.parametrize("case", list(UNRENDERABLE))
async def test_an_output_that_cannot_be_recorded_is_a_tool_failure(
    runtime: Runtime, case: str
) -> None:
    make, reason = UNRENDERABLE[case]

    @tool
    def odd() -> Any:
        """Return something odd."""
        return make()

    result, events = await run_one(runtime, odd)
    assert result.status is RunStatus.COMPLETED
    done = completed(events)
    assert done.is_error and done.error_code == "tool_output_invalid"
    assert reason in done.output and done.output.startswith("odd failed: ")
    done.output.encode("utf-8")  # what was recorded is text


async def test_a_write_whose_output_cannot_be_shown_is_still_committed(runtime: Runtime) -> None:
    sent: list[str] = []

    @tool(effect="write")
    def send() -> Any:
        """Send, and return a cyclic receipt."""
        sent.append("sent")
        return cyclic()

    result, events = await run_one(runtime, send)
    assert result.status is RunStatus.COMPLETED and sent == ["sent"]
    (effect,) = (await runtime.state(result.run_id)).effects.values()
    assert effect.state is EffectState.COMMITTED  # it happened: the ledger must not say otherwise
    done = completed(events)
    assert done.is_error and done.error_code == "tool_output_invalid"
    assert "went through" in done.output


async def test_receipts_and_error_texts_that_cannot_be_stored_are_escaped(
    runtime: Runtime,
) -> None:
    class Broken(Exception):
        def __str__(self) -> str:
            raise ValueError("no message")

    @tool(effect="write")
    def pay(ctx: ToolContext) -> Any:
        """Pay."""
        ctx.receipts["request"] = "req_\udfff"
        ctx.receipts["object"] = Unprintable()  # type: ignore[assignment]
        raise Broken()

    result, events = await run_one(runtime, pay)
    assert result.status is RunStatus.COMPLETED
    done = completed(events)
    assert done.output == "pay failed: Broken: <Broken whose str() raised ValueError>"
    (effect,) = (await runtime.state(result.run_id)).effects.values()
    assert effect.state is EffectState.FAILED
    assert effect.receipts["request"] == "req_\\udfff"
    assert effect.receipts["object"] == "<Unprintable whose str() raised RuntimeError>"


async def test_output_is_cut_at_the_contracts_limit_with_a_note(runtime: Runtime) -> None:
    @tool(max_output_chars=100)
    def chatty() -> str:
        """Say a lot."""
        return "x" * 5000

    result, events = await run_one(runtime, chatty)
    assert result.status is RunStatus.COMPLETED
    done = completed(events)
    assert done.truncated and not done.is_error
    kept, note = done.output.split("\n")
    assert kept == "x" * 100
    assert note == "[output truncated: showing 100 of 5000 characters]"
    assert chatty.contract()["max_output_chars"] == 100


# -- BaseException from a tool ----------------------------------------------------------------


CRASHES: dict[str, Callable[[], BaseException]] = {
    "SystemExit": lambda: SystemExit(3),
    "KeyboardInterrupt": KeyboardInterrupt,
    "CancelledError": asyncio.CancelledError,
}


def crashing(kind: str, *, is_async: bool, **contract: Any) -> Tool:
    if is_async:

        async def explode() -> str:
            """Explode."""
            await asyncio.sleep(0)
            raise CRASHES[kind]()

        return tool(**contract)(explode)

    def explode_sync() -> str:
        """Explode."""
        raise CRASHES[kind]()

    return tool(name="explode", **contract)(explode_sync)


@pytest.mark.parametrize(
    ("kind", "is_async"),
    [
        ("SystemExit", False),
        ("SystemExit", True),
        ("KeyboardInterrupt", False),
        ("KeyboardInterrupt", True),
        ("CancelledError", False),
        ("CancelledError", True),
    ],
)
async def test_a_tool_raising_a_base_exception_is_recorded_as_crashed(
    runtime: Runtime, kind: str, is_async: bool
) -> None:
    result, events = await run_one(runtime, crashing(kind, is_async=is_async))
    assert result.status is RunStatus.COMPLETED and result.output == "carried on"
    done = completed(events)
    assert done.is_error and done.error_code == "tool_crashed"
    assert kind in done.output and done.output.startswith("explode failed: ")
    (attempt,) = (e for e in events if isinstance(e, ev.ToolAttemptFailed))
    assert attempt.error_type == kind and not attempt.will_retry


async def test_a_crash_is_never_retried_even_when_everything_is_declared_safe(
    runtime: Runtime,
) -> None:
    t = crashing(
        "SystemExit", is_async=False, retry=RetryPolicy(attempts=3, safe_on=(BaseException,))
    )
    _, events = await run_one(runtime, t)
    assert [e.will_retry for e in events if isinstance(e, ev.ToolAttemptFailed)] == [False]


async def test_a_write_that_crashes_has_an_unknown_outcome_and_is_reconciled(
    runtime: Runtime,
) -> None:
    looked_up: list[str] = []

    def find(key: str) -> None:
        looked_up.append(key)
        return None  # the provider never saw it

    t = crashing("SystemExit", is_async=True, effect="write", reconcile=find)
    result, events = await run_one(runtime, t)
    assert result.status is RunStatus.COMPLETED
    changes = [e for e in events if isinstance(e, ev.EffectChanged)]
    unknown = next(c for c in changes if c.state is EffectState.OUTCOME_UNKNOWN)
    assert unknown.error_code == "tool_crashed" and "SystemExit" in unknown.note
    assert [c.state.value for c in changes][-2:] == ["reconciling", "failed"]
    assert len(looked_up) == 1
    assert completed(events).error_code == "not_committed"


async def test_a_tool_that_keeps_crashing_ends_the_run_as_tool_crashed(runtime: Runtime) -> None:
    t = crashing("SystemExit", is_async=False)
    model = ScriptedModel([call_tool("explode"), call_tool("explode")])
    agent = Agent(
        name="wedge", model=model, tools=[t], budget=Budget(max_consecutive_tool_errors=2)
    )
    result = await runtime.run(agent, "go")
    assert result.status is RunStatus.FAILED
    assert result.failure_reason is FailureReason.TOOL_CRASHED
    assert "SystemExit" in (result.failure_message or "")


async def test_a_stray_cancellation_is_a_crash_and_a_real_one_cancels(runtime: Runtime) -> None:
    stray, _ = await run_one(runtime, crashing("CancelledError", is_async=True))
    assert stray.status is RunStatus.COMPLETED

    started = asyncio.Event()
    seen: list[str] = []

    @tool
    async def wait_forever() -> str:
        """Wait."""
        started.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise
        return "never"

    model = ScriptedModel([call_tool("wait_forever"), reply("never")])
    running = asyncio.create_task(
        runtime.run(Agent(name="wedge", model=model, tools=[wait_forever]), "go")
    )
    await started.wait()
    summary = next(r for r in await runtime.runs() if r.run_id != stray.run_id)
    await runtime.cancel(summary.run_id)
    result = await running
    assert result.status is RunStatus.CANCELLED and seen == ["cancelled"]
    events = await runtime.events(summary.run_id)
    assert not any(isinstance(e, ev.ToolCompleted | ev.ToolAttemptFailed) for e in events)


# -- calls past their limit ------------------------------------------------------------------


async def test_an_async_tool_that_ignores_cancellation_is_abandoned(runtime: Runtime) -> None:
    release = asyncio.Event()
    cancels: list[str] = []

    @tool(timeout_s=0.2)
    async def stubborn() -> str:
        """Ignore every cancellation."""
        give_up = time.monotonic() + 30  # so that a regression fails instead of hanging
        while not release.is_set() and time.monotonic() < give_up:
            try:
                await asyncio.sleep(0.05)
            except asyncio.CancelledError:
                cancels.append("ignored")
        return "finished late"

    try:
        result, events = await run_one(runtime, stubborn)
    finally:
        release.set()
        await asyncio.sleep(0.2)  # let the abandoned call see it and end
    assert result.status is RunStatus.COMPLETED and cancels
    done = completed(events)
    assert done.is_error and done.error_code == "tool_timeout"
    assert "ignored its cancellation" in done.output


def hog_the_loop(seconds: float) -> None:
    time.sleep(seconds)  # blocks the event loop: no timer can fire meanwhile


async def test_an_async_tool_that_blocks_the_event_loop_past_its_limit_timed_out(
    runtime: Runtime,
) -> None:
    @tool(timeout_s=0.2)
    async def hog() -> str:
        """Block the loop."""
        hog_the_loop(1.0)
        return "done, late"

    result, events = await run_one(runtime, hog)
    assert result.status is RunStatus.COMPLETED
    done = completed(events)
    assert done.is_error and done.error_code == "tool_timeout"
    assert "held the event loop" in done.output


async def test_a_write_that_blocked_the_event_loop_has_an_unknown_outcome(
    runtime: Runtime,
) -> None:
    @tool(effect="write", timeout_s=0.2)
    async def slow_write() -> str:
        """Write, blocking the loop."""
        hog_the_loop(1.0)
        return "written"

    result, events = await run_one(runtime, slow_write)
    # No reconcile and not idempotent: a person must say whether it happened.
    assert result.status is RunStatus.INPUT_REQUIRED
    (effect,) = (await runtime.state(result.run_id)).effects.values()
    assert effect.state is EffectState.OUTCOME_UNKNOWN
    unknown = next(
        e
        for e in events
        if isinstance(e, ev.EffectChanged) and e.state is EffectState.OUTCOME_UNKNOWN
    )
    assert "held the event loop" in unknown.note


async def test_a_compensation_whose_output_cannot_be_shown_still_undoes_the_write(
    runtime: Runtime,
) -> None:
    booked: list[str] = []

    @tool(effect="reversible_write", compensation="cancel_booking")
    def book(slot: str) -> str:
        """Book a slot."""
        booked.append(slot)
        return f"booked {slot}"

    @tool(effect="write")
    def cancel_booking(slot: str) -> Any:
        """Cancel a booking, answering with a cyclic receipt."""
        booked.remove(slot)
        return cyclic()

    model = ScriptedModel([call_tool("book", {"slot": "9:00"}), reply("never reached")])
    agent = Agent(
        name="wedge", model=model, tools=[book, cancel_booking], budget=Budget(max_turns=1)
    )
    result = await runtime.run(agent, "book")
    assert result.status is RunStatus.FAILED
    assert result.failure_reason is FailureReason.BUDGET_EXHAUSTED
    original, compensation = (await runtime.state(result.run_id)).effects.values()
    assert original.state is EffectState.COMPENSATED and booked == []
    assert compensation.state is EffectState.COMMITTED
    assert "cannot be shown" in (compensation.output or "")
