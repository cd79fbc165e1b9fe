"""Agents asking people: a question, a choice, a review. Each raises its typed interrupt; the
answer, checked against the kind's schema, becomes the tool's result, read from the log."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from contextos import Agent, RunStatus, Runtime
from contextos import events as ev
from contextos.errors import AnswerInvalid
from contextos.policy import Expiry, Policy, Principal
from contextos.policy.authority import Authority
from contextos.policy.expiry import expire_overdue
from contextos.testing import ScriptedModel, call_tool, reply
from contextos.tools import ask_tools
from support.stores import Crash, CrashAfter

ASK, REVIEW = ask_tools()
BOB = Principal.user("bob", scopes=("*",))


def asking(*steps: object) -> Agent:
    return Agent(
        name="asker",
        model=ScriptedModel(list(steps), by_turn=True),  # type: ignore[arg-type]
        tools=[ASK, REVIEW],
    )


async def ask_and_answer(tmp_path: Path, step: object, value: str) -> tuple[str, list[ev.Event]]:
    a = asking(step, reply("thanks"))
    async with Runtime(str(tmp_path / "runs.db"), policy=Authority(Policy())) as rt:
        started = await rt.run(a, "go", principal=BOB)
        assert started.status is RunStatus.INPUT_REQUIRED
        (pending,) = await rt.inbox()
        await rt.answer(pending.id, value, answered_by="bob")
    async with Runtime(str(tmp_path / "runs.db"), policy=Authority(Policy())) as rt:
        done = await rt.resume(started.run_id, a)
        assert done.status is RunStatus.COMPLETED
        return pending.kind, await rt.events(started.run_id)


def result_of(events: Sequence[ev.Event]) -> ev.ToolCompleted:
    (done,) = [e for e in events if isinstance(e, ev.ToolCompleted)]
    return done


async def test_a_choice(tmp_path: Path) -> None:
    step = call_tool("ask_human", {"question": "Which warehouse?", "options": ["north", "south"]})
    kind, events = await ask_and_answer(tmp_path, step, "south")
    assert kind == "choice_required"
    done = result_of(events)
    assert not done.is_error and done.output == '{"choice": "south"}'
    raised = next(e for e in events if isinstance(e, ev.InterruptRaised))
    assert raised.payload["question"] == "Which warehouse?"


async def test_missing_information(tmp_path: Path) -> None:
    step = call_tool("ask_human", {"question": "What is the customer's IBAN?"})
    kind, events = await ask_and_answer(tmp_path, step, "DE89370400440532013000")
    assert kind == "missing_information"
    # The answer is recorded like any tool result: through the default PII redaction.
    assert result_of(events).output == '{"value": "[REDACTED:IBAN]"}'
    raw = "DE89370400440532013000"
    assert all(raw not in getattr(e, "output", "") for e in events)


async def test_a_review(tmp_path: Path) -> None:
    step = call_tool("request_review", {"summary": "Draft reply to the customer"})
    kind, events = await ask_and_answer(
        tmp_path, step, '{"verdict": "revise", "comments": "shorter"}'
    )
    assert kind == "review_required"
    assert result_of(events).output == '{"verdict": "revise", "comments": "shorter"}'


async def test_a_wrong_answer_is_refused_and_the_run_keeps_waiting(tmp_path: Path) -> None:
    a = asking(call_tool("ask_human", {"question": "Pick", "options": ["a", "b"]}), reply("ok"))
    async with Runtime(str(tmp_path / "runs.db"), policy=Authority(Policy())) as rt:
        started = await rt.run(a, "go", principal=BOB)
        (pending,) = await rt.inbox()
        with pytest.raises(AnswerInvalid):
            await rt.answer(pending.id, "c", answered_by="bob")
        assert (await rt.state(started.run_id)).status is RunStatus.INPUT_REQUIRED
        assert (await rt.resume(started.run_id, a)).status is RunStatus.INPUT_REQUIRED


def allowed(e: ev.Event) -> bool:
    """The process dies once the answered call is allowed, before the tool runs."""
    return isinstance(e, ev.PolicyDecided) and e.decision == "allow"


async def test_the_answer_survives_a_crash_before_the_tool_ran(tmp_path: Path) -> None:
    db = str(tmp_path / "runs.db")
    a = asking(call_tool("ask_human", {"question": "Which?", "options": ["x", "y"]}), reply("ok"))
    async with Runtime(db, policy=Authority(Policy())) as rt:
        started = await rt.run(a, "go", principal=BOB)
        (pending,) = await rt.inbox()
        await rt.answer(pending.id, "y", answered_by="bob")
    crashing = Runtime(CrashAfter(db, allowed), policy=Authority(Policy()))
    try:
        with pytest.raises(Crash):
            await crashing.resume(started.run_id, a)
    finally:
        await crashing.close()
    async with Runtime(db, policy=Authority(Policy())) as rt:  # a new worker
        done = await rt.resume(started.run_id, a)
        assert done.status is RunStatus.COMPLETED
        events = await rt.events(started.run_id)
    assert result_of(events).output == '{"choice": "y"}'
    assert any(isinstance(e, ev.RuntimeCrashDetected) for e in events)


async def test_asking_works_without_a_policy(tmp_path: Path) -> None:
    a = asking(call_tool("ask_human", {"question": "Name?"}), reply("hi"))
    async with Runtime(str(tmp_path / "runs.db")) as rt:
        started = await rt.run(a, "go")
        (pending,) = await rt.inbox()
        await rt.answer(pending.id, "Ada", answered_by="bob")
        assert (await rt.resume(started.run_id, a)).status is RunStatus.COMPLETED
        assert result_of(await rt.events(started.run_id)).output == '{"value": "Ada"}'


async def test_the_default_answer_of_an_expired_question_reaches_the_asking_tool(
    tmp_path: Path,
) -> None:
    ask, review = ask_tools(expiry=Expiry(after_s=300, on_expiry="default", default="north"))
    step = call_tool("ask_human", {"question": "Which warehouse?", "options": ["north", "south"]})
    a = Agent(
        name="asker",
        model=ScriptedModel([step, reply("thanks")], by_turn=True),
        tools=[ask, review],
    )
    async with Runtime(str(tmp_path / "runs.db"), policy=Authority(Policy())) as rt:
        started = await rt.run(a, "go", principal=BOB)
        assert started.status is RunStatus.INPUT_REQUIRED
        later = datetime.now(UTC) + timedelta(hours=1)
        await expire_overdue(rt.store, started.run_id, now=later)
        done = await rt.resume(started.run_id, a)
        events = await rt.events(started.run_id)
    assert done.status is RunStatus.COMPLETED
    assert any(isinstance(e, ev.InterruptExpired) for e in events)
    assert result_of(events).output == '{"choice": "north"}'
