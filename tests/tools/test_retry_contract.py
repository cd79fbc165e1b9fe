"""A failed call is sent again only when its contract says the error is safe to retry.

Every execution of the tool appends a line to a file, so the count is what really ran (a retry
the ledger forgot to record would still show up).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from contextos import Agent, RunStatus, Runtime
from contextos import events as ev
from contextos.errors import ToolOutcomeUnknown
from contextos.ledger import MAX_DISPATCHES, EffectState
from contextos.runs import RunId
from contextos.store import SqliteStore
from contextos.testing import ScriptedModel, call_tool, reply
from contextos.tools import RetryPolicy, Tool, ToolContext, tool


def flaky_write(log: Path, retry: RetryPolicy, *errors: Exception) -> Tool:
    """A write tool that raises `errors` in turn (then succeeds), logging every execution."""
    pending = list(errors)

    @tool(effect="write", retry=retry)
    def book(slot: str) -> str:
        """Book a slot."""
        with log.open("a") as f:
            f.write(f"{slot}\n")
        if pending:
            raise pending.pop(0)
        return f"booked {slot}"

    return book


async def run_booking(runtime: Runtime, book: Tool) -> list[ev.Event]:
    model = ScriptedModel([call_tool("book", {"slot": "9:00"}), reply("done")])
    result = await runtime.run(Agent(name="booker", model=model, tools=[book]), "book 9:00")
    assert result.status is RunStatus.COMPLETED
    return await runtime.events(result.run_id)


def executions(log: Path) -> int:
    return len(log.read_text().splitlines()) if log.exists() else 0


@pytest.mark.parametrize(
    "retry",
    [
        RetryPolicy(attempts=3, safe_on=(ConnectionError,), backoff_s=0),
        RetryPolicy(attempts=3, backoff_s=0),
        RetryPolicy(attempts=3, unsafe_on=(KeyError,), backoff_s=0),
    ],
    ids=["other error safe", "nothing declared", "other error unsafe"],
)
async def test_an_undeclared_error_on_a_write_is_dispatched_once(
    runtime: Runtime, tmp_path: Path, retry: RetryPolicy
) -> None:
    log = tmp_path / "executions.log"
    events = await run_booking(runtime, flaky_write(log, retry, ValueError("slot taken?")))
    assert executions(log) == 1
    failed = [e for e in events if isinstance(e, ev.ToolAttemptFailed)]
    assert [(f.error_type, f.will_retry) for f in failed] == [("ValueError", False)]
    dispatched = [
        e for e in events if isinstance(e, ev.EffectChanged) and e.state is EffectState.DISPATCHED
    ]
    assert len(dispatched) == 1
    done = next(e for e in events if isinstance(e, ev.ToolCompleted))
    assert done.is_error and "ValueError" in done.output


@pytest.mark.parametrize(
    ("safe", "unsafe"),
    [(ConnectionResetError, ConnectionResetError), (OSError, ConnectionError)],
    ids=["the same class", "through its base classes"],
)
async def test_an_error_declared_both_safe_and_unsafe_is_not_retried(
    runtime: Runtime, tmp_path: Path, safe: type[Exception], unsafe: type[Exception]
) -> None:
    log = tmp_path / "executions.log"
    retry = RetryPolicy(attempts=3, safe_on=(safe,), unsafe_on=(unsafe,), backoff_s=0)
    events = await run_booking(runtime, flaky_write(log, retry, ConnectionResetError("reset")))
    assert executions(log) == 1
    failed = [e for e in events if isinstance(e, ev.ToolAttemptFailed)]
    assert [(f.error_type, f.will_retry) for f in failed] == [("ConnectionResetError", False)]


async def test_an_error_declared_safe_is_retried_up_to_the_attempts(
    runtime: Runtime, tmp_path: Path
) -> None:
    log = tmp_path / "executions.log"
    retry = RetryPolicy(attempts=3, safe_on=(ConnectionError,), backoff_s=0)
    book = flaky_write(log, retry, ConnectionError("down"), ConnectionError("still down"))
    events = await run_booking(runtime, book)
    assert executions(log) == 3
    failed = [e for e in events if isinstance(e, ev.ToolAttemptFailed)]
    assert [f.will_retry for f in failed] == [True, True]
    done = next(e for e in events if isinstance(e, ev.ToolCompleted))
    assert done.output == "booked 9:00" and not done.is_error


async def test_a_safe_error_is_tried_no_more_often_than_the_attempts(
    runtime: Runtime, tmp_path: Path
) -> None:
    log = tmp_path / "executions.log"
    retry = RetryPolicy(attempts=3, safe_on=(ConnectionError,), backoff_s=0)
    book = flaky_write(log, retry, *(ConnectionError(f"down {n}") for n in range(5)))
    events = await run_booking(runtime, book)
    assert executions(log) == 3  # `attempts` counts the first one too
    failed = [e for e in events if isinstance(e, ev.ToolAttemptFailed)]
    assert [f.will_retry for f in failed] == [True, True, False]
    done = next(e for e in events if isinstance(e, ev.ToolCompleted))
    assert done.is_error and "ConnectionError" in done.output


async def test_the_backoff_doubles_up_to_its_ceiling(runtime: Runtime, tmp_path: Path) -> None:
    """The planned delays are recorded with each failed attempt (read here, never timed)."""
    log = tmp_path / "executions.log"
    retry = RetryPolicy(attempts=4, safe_on=(ConnectionError,), backoff_s=0.01, max_backoff_s=0.025)
    book = flaky_write(log, retry, *(ConnectionError("down") for _ in range(4)))
    events = await run_booking(runtime, book)
    failed = [e for e in events if isinstance(e, ev.ToolAttemptFailed)]
    assert [(f.attempt, f.will_retry, f.delay_s) for f in failed] == [
        (1, True, 0.01),
        (2, True, 0.02),
        (3, True, 0.025),
        (4, False, 0.0),
    ]


# -- a run that ends between two attempts ---------------------------------------------------


class CancelsAfter(SqliteStore):
    """A SQLite store on which a person cancels the run as soon as an append holding a matching
    event committed: the request to end arrives while the call waits for its next attempt."""

    def __init__(self, path: Path, when: Callable[[ev.Event], bool]) -> None:
        super().__init__(path)
        self.when = when
        self.runtime: Runtime | None = None

    async def append(
        self,
        run_id: RunId,
        events: Sequence[ev.Event],
        *,
        expected_seq: int,
        synchronous: bool = True,
        **options: Any,
    ) -> int:
        seq = await super().append(
            run_id, events, expected_seq=expected_seq, synchronous=synchronous, **options
        )
        if self.runtime is not None and any(self.when(e) for e in events):
            await self.runtime.cancel(run_id, reason="stop booking")
        return seq


def dispatches(events: list[ev.Event]) -> list[int]:
    return [
        e.attempt
        for e in events
        if isinstance(e, ev.EffectChanged) and e.state is EffectState.DISPATCHED
    ]


def last_change(events: list[ev.Event]) -> ev.EffectChanged:
    return [e for e in events if isinstance(e, ev.EffectChanged)][-1]


async def test_a_run_asked_to_end_during_an_attempt_does_not_send_the_next_one(
    runtime: Runtime, tmp_path: Path
) -> None:
    log = tmp_path / "executions.log"
    retry = RetryPolicy(attempts=3, safe_on=(ConnectionError,), backoff_s=0)

    @tool(effect="write", retry=retry)
    async def book(slot: str, ctx: ToolContext) -> str:
        """Book a slot; the person cancels the run while the first attempt fails."""
        with log.open("a") as f:
            f.write(f"{slot}\n")
        await runtime.cancel(ctx.run_id, reason="stop booking")
        raise ConnectionError("down")

    model = ScriptedModel([call_tool("book", {"slot": "9:00"}), reply("done")])
    result = await runtime.run(Agent(name="booker", model=model, tools=[book]), "book 9:00")
    assert result.status is RunStatus.CANCELLED
    assert executions(log) == 1
    events = await runtime.events(result.run_id)
    (failed,) = [e for e in events if isinstance(e, ev.ToolAttemptFailed)]
    assert failed.will_retry
    assert dispatches(events) == [1]  # known before the next attempt: it is not even recorded
    abandoned = last_change(events)
    assert abandoned.state is EffectState.FAILED and abandoned.error_code == "not_sent"
    assert abandoned.output == abandoned.note == "the run is ending; the call was not sent"
    (effect,) = (await runtime.state(result.run_id)).effects.values()
    assert abandoned.effect_id == effect.effect_id and effect.error_code == "not_sent"


async def test_a_run_asked_to_end_while_a_call_waits_to_be_retried_does_not_send_it(
    tmp_path: Path,
) -> None:
    log = tmp_path / "executions.log"
    retry = RetryPolicy(attempts=3, safe_on=(ConnectionError,), backoff_s=0)
    book = flaky_write(log, retry, ConnectionError("down"))
    store = CancelsAfter(tmp_path / "runs.db", lambda e: isinstance(e, ev.ToolAttemptFailed))
    async with Runtime(store) as rt:
        store.runtime = rt
        model = ScriptedModel([call_tool("book", {"slot": "9:00"}), reply("done")])
        result = await rt.run(Agent(name="booker", model=model, tools=[book]), "book 9:00")
        events = await rt.events(result.run_id)
    assert result.status is RunStatus.CANCELLED
    assert executions(log) == 1  # the second attempt was never made
    # the request to end came in with the commit of the next attempt, before the call
    assert dispatches(events) == [1, 2]
    abandoned = last_change(events)
    assert abandoned.state is EffectState.FAILED and abandoned.error_code == "not_sent"
    assert abandoned.note == "the run is ending; the call was not sent"


async def test_a_call_whose_outcome_is_unknown_is_sent_again_even_as_its_run_ends(
    tmp_path: Path,
) -> None:
    """The first attempt may have acted, so the call is not recorded as never sent: its
    contract says sending it again with its key is safe, and that settles what happened."""
    log = tmp_path / "executions.log"
    lost = [ToolOutcomeUnknown("the connection dropped after the request was sent")]

    @tool(effect="write", idempotent=True)
    def book(slot: str) -> str:
        """Book a slot (idempotent: the service dedupes by key)."""
        with log.open("a") as f:
            f.write(f"{slot}\n")
        if lost:
            raise lost.pop()
        return f"booked {slot}"

    def unknown(e: ev.Event) -> bool:
        return isinstance(e, ev.EffectChanged) and e.state is EffectState.OUTCOME_UNKNOWN

    store = CancelsAfter(tmp_path / "runs.db", unknown)
    async with Runtime(store) as rt:
        store.runtime = rt
        model = ScriptedModel([call_tool("book", {"slot": "9:00"}), reply("done")])
        result = await rt.run(Agent(name="booker", model=model, tools=[book]), "book 9:00")
        state = await rt.state(result.run_id)
    assert result.status is RunStatus.CANCELLED
    assert executions(log) == 2
    (effect,) = state.effects.values()
    assert [s.value for _, s in effect.history][-4:] == [
        "dispatched",
        "outcome_unknown",
        "dispatched",
        "committed",
    ]


async def test_a_call_whose_outcome_stays_unknown_is_sent_at_most_max_dispatches_times(
    runtime: Runtime, tmp_path: Path
) -> None:
    log = tmp_path / "executions.log"

    @tool(effect="write", idempotent=True)
    def book(slot: str) -> str:
        """Book a slot; the answer never arrives."""
        with log.open("a") as f:
            f.write(f"{slot}\n")
        raise ToolOutcomeUnknown("the connection dropped after the request was sent")

    model = ScriptedModel([call_tool("book", {"slot": "9:00"}), reply("done")])
    result = await runtime.run(Agent(name="booker", model=model, tools=[book]), "book 9:00")
    assert result.status is RunStatus.INPUT_REQUIRED  # then a person decides
    assert executions(log) == MAX_DISPATCHES
    state = await runtime.state(result.run_id)
    (effect,) = state.effects.values()
    assert effect.state is EffectState.OUTCOME_UNKNOWN and effect.attempts == MAX_DISPATCHES
    (asked,) = state.pending_interrupts.values()
    assert asked.kind == "external_confirmation_required"
    assert asked.payload["attempts"] == MAX_DISPATCHES


async def test_a_failed_attempt_records_the_errors_text_or_its_type_when_it_has_none(
    runtime: Runtime, tmp_path: Path
) -> None:
    log = tmp_path / "executions.log"
    retry = RetryPolicy(attempts=3, safe_on=(ConnectionError,), backoff_s=0)
    book = flaky_write(log, retry, ConnectionError("down for maintenance"), ConnectionError())
    events = await run_booking(runtime, book)
    failed = [e for e in events if isinstance(e, ev.ToolAttemptFailed)]
    assert [(f.call_id, f.tool, f.attempt, f.error_type, f.error) for f in failed] == [
        ("call_1_0", "book", 1, "ConnectionError", "down for maintenance"),
        ("call_1_0", "book", 2, "ConnectionError", "ConnectionError"),
    ]


# -- reads ----------------------------------------------------------------------------------


@pytest.mark.parametrize("error", ["error", "timeout"])
async def test_a_read_is_tried_again_as_its_contract_allows(
    runtime: Runtime, tmp_path: Path, error: str
) -> None:
    log = tmp_path / "executions.log"
    retry = RetryPolicy(attempts=3, safe_on=(ConnectionError, TimeoutError), backoff_s=0)

    attempts: list[int] = []

    @tool(retry=retry, timeout_s=0.05)
    async def lookup(q: str, ctx: ToolContext) -> str:
        """Look something up; the first two tries fail."""
        attempts.append(ctx.attempt)
        with log.open("a") as f:
            f.write(f"{q}\n")
        if executions(log) < 3:
            if error == "timeout":
                await asyncio.sleep(5)
            raise ConnectionError("reset")
        return f"found {q}"

    model = ScriptedModel([call_tool("lookup", {"q": "x"}), reply("done")])
    result = await runtime.run(Agent(name="reader", model=model, tools=[lookup]), "look")
    assert result.status is RunStatus.COMPLETED
    events = await runtime.events(result.run_id)
    failed = [e for e in events if isinstance(e, ev.ToolAttemptFailed)]
    assert [(f.attempt, f.will_retry, f.effect_id) for f in failed] == [
        (1, True, None),
        (2, True, None),
    ]
    assert executions(log) == 3 and attempts == [1, 2, 3]  # the tool is told which try it is
    done = next(e for e in events if isinstance(e, ev.ToolCompleted))
    assert done.output == "found x" and not done.is_error
