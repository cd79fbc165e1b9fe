"""An effect whose outcome is unknown and cannot be looked up is put to a person; their answer
(`contextos answer ID committed`) settles it in the ledger, and the call is never sent again."""

from __future__ import annotations

from pathlib import Path

import pytest

from contextos import Agent, RunStatus, Runtime, ToolContext, tool
from contextos import events as ev
from contextos.errors import ToolOutcomeUnknown
from contextos.ledger import EffectState
from contextos.runs import RunId
from contextos.testing import ScriptedModel, call_tool, reply
from contextos.tools.effects import confirmation
from support.stores import Crash, CrashAfter

sent: list[str] = []


@tool(effect="write", risk="high")
def wire(account: str) -> str:
    """Wire money; the bank offers no way to look a transfer up."""
    sent.append(account)
    return "sent"


def dispatched(e: ev.Event) -> bool:
    """The process dies right after recording `dispatched`, before the tool is called."""
    return isinstance(e, ev.EffectChanged) and e.state == "dispatched"


async def unknown_outcome(db: str) -> tuple[RunId, Agent, str]:
    sent.clear()
    a = Agent(
        name="wirer",
        model=ScriptedModel([call_tool("wire", {"account": "X"}), reply("ok")], by_turn=True),
        tools=[wire],
    )
    crashing = Runtime(CrashAfter(db, dispatched))
    try:
        with pytest.raises(Crash):
            await crashing.run(a, "pay")
    finally:
        await crashing.close()
    async with Runtime(db) as rt:
        (summary,) = await rt.runs()
        waiting = await rt.resume(summary.run_id, a)
        assert waiting.status is RunStatus.INPUT_REQUIRED
        (pending,) = await rt.inbox()
        assert pending.kind == "external_confirmation_required"
        return summary.run_id, a, pending.id


@pytest.mark.parametrize(("outcome", "state"), [("committed", "committed"), ("failed", "failed")])
async def test_a_person_confirms_what_happened(tmp_path: Path, outcome: str, state: str) -> None:
    db = str(tmp_path / "runs.db")
    run_id, a, iid = await unknown_outcome(db)
    async with Runtime(db) as rt:
        await rt.answer(iid, f'{{"outcome": "{outcome}", "receipt": "bank-42"}}', answered_by="ops")
        done = await rt.resume(run_id, a)
        assert done.status is RunStatus.COMPLETED
        events = await rt.events(run_id)
    assert sent == []  # never sent again
    (effect_done,) = [
        e for e in events if isinstance(e, ev.EffectChanged) and e.actor == "user:ops"
    ]
    assert effect_done.state == EffectState(state)
    assert effect_done.receipts == {"confirmation": "bank-42"}
    (completed,) = [e for e in events if isinstance(e, ev.ToolCompleted)]
    assert completed.is_error is (outcome == "failed")
    assert sum(isinstance(e, ev.InterruptRaised) for e in events) == 1


@pytest.mark.parametrize(
    ("answer", "output", "error_code"),
    [
        (
            '{"outcome": "committed", "note": "seen on the statement"}',
            "seen on the statement",
            None,
        ),
        ('{"outcome": "committed"}', "confirmed done by a person", None),
        ('{"outcome": "failed"}', "confirmed not done by a person", "not_committed"),
    ],
)
async def test_the_model_is_told_what_the_person_confirmed(
    tmp_path: Path, answer: str, output: str, error_code: str | None
) -> None:
    db = str(tmp_path / "runs.db")
    run_id, a, iid = await unknown_outcome(db)
    async with Runtime(db) as rt:
        await rt.answer(iid, answer, answered_by="ops")
        await rt.resume(run_id, a)
        events = await rt.events(run_id)
    (settled,) = [e for e in events if isinstance(e, ev.EffectChanged) and e.actor == "user:ops"]
    assert settled.note == output
    assert settled.receipts == {}  # no receipt was given, so none is recorded
    assert (settled.output, settled.error_code) == (f"wire: {output}", error_code)
    (completed,) = [e for e in events if isinstance(e, ev.ToolCompleted)]
    assert (completed.output, completed.error_code, completed.is_error) == (
        f"wire: {output}",
        error_code,
        error_code is not None,
    )
    assert completed.effect_id == settled.effect_id


async def test_a_receipt_the_write_got_before_its_outcome_was_lost_is_shown_to_the_person(
    tmp_path: Path,
) -> None:
    @tool(effect="write")
    def transfer(account: str, ctx: ToolContext) -> str:
        """Transfer money; the bank hangs up after taking the request."""
        ctx.receipts["request_id"] = "req_7"
        raise ToolOutcomeUnknown("the bank hung up after taking the request")

    model = ScriptedModel([call_tool("transfer", {"account": "X"}), reply("ok")])
    async with Runtime(str(tmp_path / "runs.db")) as rt:
        result = await rt.run(Agent(name="payer", model=model, tools=[transfer]), "pay")
        events = await rt.events(result.run_id)
        state = await rt.state(result.run_id)
    assert result.status is RunStatus.INPUT_REQUIRED
    (unknown,) = [
        e
        for e in events
        if isinstance(e, ev.EffectChanged) and e.state is EffectState.OUTCOME_UNKNOWN
    ]
    assert unknown.receipts == {"request_id": "req_7"}
    assert unknown.error_code == "outcome_unknown"
    assert unknown.note == "ToolOutcomeUnknown: the bank hung up after taking the request"
    (asked,) = state.pending_interrupts.values()
    assert asked.payload["receipts"] == {"request_id": "req_7"}


async def test_the_confirmation_event_records_the_answer_and_only_for_a_call_in_flight(
    tmp_path: Path,
) -> None:
    db = str(tmp_path / "runs.db")
    run_id, a, iid = await unknown_outcome(db)
    async with Runtime(db) as rt:
        state = await rt.state(run_id)
    (effect,) = state.effects.values()
    done = confirmation(state, effect.effect_id, happened=True, actor="user:ops")
    assert (done.run_id, done.seq, done.actor, done.effect_id) == (
        run_id,
        state.seq + 1,
        "user:ops",
        effect.effect_id,
    )
    assert (done.state, done.output, done.note, done.error_code, done.receipts) == (
        EffectState.COMMITTED,
        "wire: confirmed done by a person",
        "confirmed done by a person",
        None,
        {},
    )
    later = confirmation(state, effect.effect_id, happened=False, actor="user:ops", seq=40)
    assert (later.seq, later.state, later.error_code) == (40, EffectState.FAILED, "not_committed")
    async with Runtime(db) as rt:
        await rt.answer(iid, '{"outcome": "committed"}', answered_by="ops")
        await rt.resume(run_id, a)
        settled = await rt.state(run_id)
    with pytest.raises(ValueError) as refused:
        confirmation(settled, effect.effect_id, happened=False, actor="user:ops")
    assert str(refused.value) == (
        f"effect {effect.effect_id} is committed, not waiting for a confirmation"
    )
