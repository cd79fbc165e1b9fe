"""The effect ledger against a real payments service on loopback.

A "crash" here is a BaseException raised by the store at the moment the call's outcome is to be
recorded, right after the service charged: the driver dies mid-call exactly as a killed worker
would (the log ends at `dispatched`), and a fresh Runtime resumes the run. (A BaseException
raised by the tool itself is the tool's failure, not a crash: see test_wedging.py.) The SIGKILL
version of this runs in test_fault_injection.py.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from payments_service import PaymentsService
from payments_tools import ALL, ChargeCard

from contextos import Agent, Budget, FailureReason, RunStatus, Runtime
from contextos import events as ev
from contextos.ledger import EffectState
from contextos.records.interrupts import interrupt_id_for
from contextos.runs import RunId
from contextos.store import SqliteStore
from contextos.store.base import RunSummary
from contextos.testing import ScriptedModel, call_tool, reply
from contextos.tools import Tool, ToolContext, as_tool, tool
from contextos.tools.effects import confirmation
from support.blocks import block_body
from support.stores import Crash

ORDER = {"customer": "cus_1", "amount": 1250, "order_id": "order-1"}


class DiesAround(SqliteStore):
    """The process 'dies' around a call to `tool`: after it, when its outcome is about to be
    recorded (the log ends at `dispatched`, the call was made), or, with `before_call`, once
    `dispatched` is recorded and before the tool is called."""

    def __init__(self, path: str, tool: str, *, before_call: bool = False) -> None:
        super().__init__(path)
        self.tool = tool
        self.before_call = before_call
        self.effects: set[str] = set()

    async def append(
        self,
        run_id: RunId,
        events: Sequence[ev.Event],
        *,
        expected_seq: int,
        synchronous: bool = True,
        **options: Any,
    ) -> int:
        changes = []
        for e in events:
            if isinstance(e, ev.EffectProposed) and e.tool == self.tool:
                self.effects.add(e.effect_id)
            if isinstance(e, ev.EffectChanged) and e.effect_id in self.effects:
                changes.append(e.state)
        if not self.before_call and set(changes) & OUTCOMES:
            raise Crash()
        seq = await super().append(
            run_id, events, expected_seq=expected_seq, synchronous=synchronous, **options
        )
        if self.before_call and EffectState.DISPATCHED in changes:
            raise Crash()
        return seq


OUTCOMES = {EffectState.COMMITTED, EffectState.FAILED, EffectState.OUTCOME_UNKNOWN}


def tools(extra: list[Any] | None = None) -> list[Tool]:
    return [as_tool(t) for t in [*ALL, *(extra or [])]]


def agent(model: ScriptedModel, **kw: Any) -> Agent:
    return Agent(name="shop", model=model, tools=tools(kw.pop("extra", None)), **kw)


def effect_states(events: list[ev.Event]) -> list[str]:
    return [e.state.value for e in events if isinstance(e, ev.EffectChanged)]


def script(name: str, args: dict[str, Any] = ORDER) -> list[Any]:
    return [call_tool(name, args), reply("done")]


async def test_write_goes_through_the_ledger_with_receipts(
    runtime: Runtime, payments: PaymentsService
) -> None:
    model = ScriptedModel(script("charge_card"))
    result = await runtime.run(agent(model), "charge it")
    assert result.status is RunStatus.COMPLETED
    events = await runtime.events(result.run_id)
    proposed = next(e for e in events if isinstance(e, ev.EffectProposed))
    assert proposed.kind == "irreversible"
    assert proposed.idempotency_key == f"{result.run_id}/{proposed.call_id}"
    assert proposed.arguments["customer"] == "[redacted]"  # redact_fields
    assert effect_states(events) == ["validated", "authorised", "dispatched", "committed"]
    decided = next(e for e in events if isinstance(e, ev.PolicyDecided))
    assert (decided.call_id, decided.tool, decided.effect_id) == (
        proposed.call_id,
        "charge_card",
        proposed.effect_id,
    )
    dispatched = next(
        e for e in events if isinstance(e, ev.EffectChanged) and e.state == "dispatched"
    )
    assert decided.seq < dispatched.seq
    state = await runtime.state(result.run_id)
    effect = state.effects[proposed.effect_id]
    assert effect.state is EffectState.COMMITTED
    (charge_id,) = payments.query("SELECT charge_id FROM charges")[0]
    assert effect.receipts["charge_id"] == charge_id
    assert effect.receipts["provider_request_id"].startswith("req_")
    done = next(e for e in events if isinstance(e, ev.ToolCompleted))
    assert done.effect_id == proposed.effect_id and done.untrusted


async def test_dispatched_is_durable_before_the_tool_runs(runtime: Runtime, tmp_path: Path) -> None:
    seen: list[str] = []

    @tool(effect="write")
    async def send_email(to: str, ctx: ToolContext) -> str:
        """Send an email."""
        store = SqliteStore(tmp_path / "runs.db")  # a second connection: only committed rows
        try:
            events = await store.read(ctx.run_id)  # type: ignore[arg-type]
        finally:
            await store.close()
        last = events[-1]
        assert isinstance(last, ev.EffectChanged)
        seen.append(last.state.value)
        return "sent"

    model = ScriptedModel(script("send_email", {"to": "a@example.org"}))
    result = await runtime.run(Agent(name="mail", model=model, tools=[send_email]), "go")
    assert result.status is RunStatus.COMPLETED
    assert seen == ["dispatched"]


async def test_unsafe_error_is_not_retried(runtime: Runtime, payments: PaymentsService) -> None:
    model = ScriptedModel(script("charge_card", {**ORDER, "customer": "declined"}))
    result = await runtime.run(agent(model), "charge it")
    events = await runtime.events(result.run_id)
    assert effect_states(events) == ["validated", "authorised", "dispatched", "failed"]
    failed = [e for e in events if isinstance(e, ev.ToolAttemptFailed)]
    assert [(f.error_type, f.will_retry) for f in failed] == [("CardDeclined", False)]
    assert payments.query("SELECT outcome FROM attempts") == [("declined",)]
    done = next(e for e in events if isinstance(e, ev.ToolCompleted))
    assert done.is_error and "CardDeclined" in done.output
    assert block_body(model.requests[1].messages[-1].content) == done.output
    settled = [e for e in events if isinstance(e, ev.EffectChanged)][-1]
    assert (settled.output, settled.error_code) == (done.output, done.error_code)
    assert done.error_code is not None
    assert settled.note == "CardDeclined is not declared safe to retry"
    assert done.effect_id == settled.effect_id


async def test_two_runs_making_the_same_call_get_keys_of_their_own(
    runtime: Runtime, payments: PaymentsService
) -> None:
    """Models number their calls per conversation, so two runs often send the same call id: the
    idempotency key must name the run too, or the service takes the second charge for a retry
    of the first and never makes it."""
    keys = []
    for order in ("order-1", "order-2"):
        steps = [call_tool("charge_card", {**ORDER, "order_id": order}, call_id="call_1")]
        result = await runtime.run(agent(ScriptedModel([*steps, reply("done")])), "charge it")
        assert result.status is RunStatus.COMPLETED
        events = await runtime.events(result.run_id)
        keys.append(next(e for e in events if isinstance(e, ev.EffectProposed)).idempotency_key)
    assert payments.stats()["charges"] == 2
    assert keys[0] != keys[1]


async def test_safe_error_is_retried_with_the_same_key(
    runtime: Runtime, payments: PaymentsService
) -> None:
    model = ScriptedModel(script("charge_card", {**ORDER, "unavailable_first": 2}))
    result = await runtime.run(agent(model), "charge it")
    assert result.status is RunStatus.COMPLETED
    events = await runtime.events(result.run_id)
    attempts = [e for e in events if isinstance(e, ev.ToolAttemptFailed)]
    assert [(a.attempt, a.error_type, a.will_retry) for a in attempts] == [
        (1, "ServiceUnavailable", True),
        (2, "ServiceUnavailable", True),
    ]
    (proposed,) = [e for e in events if isinstance(e, ev.EffectProposed)]
    assert {a.effect_id for a in attempts} == {proposed.effect_id}
    dispatches = [
        e.attempt for e in events if isinstance(e, ev.EffectChanged) and e.state == "dispatched"
    ]
    assert dispatches == [1, 2, 3]
    rows = payments.query("SELECT idempotency_key, outcome FROM attempts ORDER BY n")
    key = next(e for e in events if isinstance(e, ev.EffectProposed)).idempotency_key
    assert rows == [(key, "unavailable"), (key, "unavailable"), (key, "charged")]
    assert payments.stats()["charges"] == 1


async def test_dropped_response_is_reconciled_not_resent(
    runtime: Runtime, payments: PaymentsService
) -> None:
    model = ScriptedModel(script("charge_card", {**ORDER}))
    # the service charges, then drops the connection before answering
    t = as_tool(ChargeCard)

    async def drop(**kw: Any) -> Any:
        from payments_tools import _charge

        return await _charge(
            kw["customer"], kw["amount"], kw["order_id"], kw["ctx"], drop_response=True
        )

    a = Agent(name="shop", model=model, tools=[dataclasses.replace(t, fn=drop), *tools()[2:]])
    result = await runtime.run(a, "charge it")
    assert result.status is RunStatus.COMPLETED
    events = await runtime.events(result.run_id)
    assert effect_states(events) == [
        "validated",
        "authorised",
        "dispatched",
        "outcome_unknown",
        "reconciling",
        "committed",
    ]
    assert payments.query("SELECT COUNT(*) FROM attempts")[0][0] == 1
    assert payments.stats()["charges"] == 1


async def test_crash_after_dispatch_is_reconciled(
    tmp_path: Path, payments: PaymentsService
) -> None:
    db = str(tmp_path / "runs.db")
    async with Runtime(DiesAround(db, "charge_card")) as rt:
        with pytest.raises(Crash):
            await rt.run(agent(ScriptedModel(script("charge_card"))), "go")
        (summary,) = await rt.runs()
        state = await rt.state(summary.run_id)
        (effect,) = state.effects.values()
        assert effect.state is EffectState.DISPATCHED
    assert payments.stats()["charges"] == 1
    async with Runtime(db) as rt:
        model = ScriptedModel(script("charge_card"), by_turn=True)
        result = await rt.resume(summary.run_id, agent(model))
        assert result.status is RunStatus.COMPLETED
        events = await rt.events(summary.run_id)
    assert effect_states(events) == [
        "validated",
        "authorised",
        "dispatched",
        "outcome_unknown",
        "reconciling",
        "committed",
    ]
    assert payments.query("SELECT COUNT(*) FROM attempts")[0][0] == 1  # never re-sent
    assert payments.stats()["charges"] == 1
    unknown, _, committed = [e for e in events if isinstance(e, ev.EffectChanged)][-3:]
    assert unknown.error_code == "outcome_unknown"
    assert unknown.note == (
        "the worker stopped after dispatching the call and before its outcome was recorded"
    )
    # what the provider has: its receipt and its record, told to the model
    (charge_id,) = payments.query("SELECT charge_id FROM charges")[0]
    assert committed.note == "reconcile: the provider has the call"
    assert committed.receipts == {"charge_id": charge_id}
    done = next(e for e in events if isinstance(e, ev.ToolCompleted))
    assert done.output == committed.output and not done.is_error
    assert json.loads(done.output) == {"charged": ORDER["amount"], "charge_id": charge_id}


async def test_crash_before_the_service_acted_reconciles_to_failed(
    tmp_path: Path, payments: PaymentsService
) -> None:
    db = str(tmp_path / "runs.db")
    base = as_tool(ChargeCard)
    async with Runtime(DiesAround(db, "charge_card", before_call=True)) as rt:
        with pytest.raises(Crash):
            await rt.run(
                Agent(name="shop", model=ScriptedModel(script("charge_card")), tools=[base]), "go"
            )
        (summary,) = await rt.runs()
    async with Runtime(db) as rt:
        model = ScriptedModel(script("charge_card"), by_turn=True)
        result = await rt.resume(summary.run_id, Agent(name="shop", model=model, tools=[base]))
        events = await rt.events(summary.run_id)
    assert result.status is RunStatus.COMPLETED
    assert effect_states(events)[-3:] == ["outcome_unknown", "reconciling", "failed"]
    done = next(e for e in events if isinstance(e, ev.ToolCompleted))
    assert done.is_error and done.error_code == "not_committed"
    assert done.output == (
        "The call to charge_card did not take effect (checked with the provider by its "
        "idempotency key). Nothing was done; call it again if needed."
    )
    failed = [e for e in events if isinstance(e, ev.EffectChanged)][-1]
    assert (failed.output, failed.error_code) == (done.output, done.error_code)
    assert failed.note == "reconcile: the provider has no record of the call"
    assert done.effect_id == failed.effect_id
    assert payments.stats()["charges"] == 0


async def test_crash_with_idempotent_contract_is_resent_with_the_same_key(
    tmp_path: Path, payments: PaymentsService
) -> None:
    db = str(tmp_path / "runs.db")
    async with Runtime(DiesAround(db, "charge_card_keyed")) as rt:
        with pytest.raises(Crash):
            await rt.run(agent(ScriptedModel(script("charge_card_keyed"))), "go")
        (summary,) = await rt.runs()
    async with Runtime(db) as rt:
        model = ScriptedModel(script("charge_card_keyed"), by_turn=True)
        result = await rt.resume(summary.run_id, agent(model))
        events = await rt.events(summary.run_id)
    assert result.status is RunStatus.COMPLETED
    assert effect_states(events) == [
        "validated",
        "authorised",
        "dispatched",
        "outcome_unknown",
        "dispatched",
        "committed",
    ]
    rows = payments.query("SELECT idempotency_key, outcome FROM attempts ORDER BY n")
    assert [r[1] for r in rows] == ["charged", "replayed"]
    assert rows[0][0] == rows[1][0]
    assert payments.stats()["charges"] == 1


async def test_crash_without_reconcile_or_safe_retry_asks_a_person(
    tmp_path: Path, payments: PaymentsService
) -> None:
    db = str(tmp_path / "runs.db")
    name = "charge_card_unchecked"
    async with Runtime(DiesAround(db, name)) as rt:
        with pytest.raises(Crash):
            await rt.run(agent(ScriptedModel(script(name))), "go")
        (summary,) = await rt.runs()
    rid = summary.run_id
    async with Runtime(db) as rt:
        model = ScriptedModel(script(name), by_turn=True)
        result = await rt.resume(rid, agent(model))
        assert result.status is RunStatus.INPUT_REQUIRED
        state = await rt.state(rid)
        (interrupt,) = state.pending_interrupts.values()
        assert interrupt.kind == "external_confirmation_required"
        (effect,) = state.effects.values()
        assert interrupt.effect_id == effect.effect_id
        assert effect.state is EffectState.OUTCOME_UNKNOWN
        assert interrupt.id == interrupt_id_for(rid, interrupt.raised_seq)
        assert interrupt.payload == {
            "question": f"Did the call to {name} take effect? The runtime cannot tell: it has no "
            "way to look the call up and re-sending it is not declared safe.",
            "tool": name,
            "effect_kind": "irreversible",
            "arguments": ORDER,
            "idempotency_key": effect.idempotency_key,
            "attempts": 1,
            "receipts": effect.receipts,
            "answers": ["committed", "failed"],
        }
        # resuming again neither re-sends nor asks twice
        again = await rt.resume(rid, agent(model))
        assert again.status is RunStatus.INPUT_REQUIRED
        assert len((await rt.state(rid)).pending_interrupts) == 1
    assert payments.query("SELECT COUNT(*) FROM attempts")[0][0] == 1

    # The answer path (built on this seam): a person says it went through; the run goes on and
    # the model is told the confirmed outcome.
    async with Runtime(db) as rt:
        state = await rt.state(rid)
        await rt.store.append(
            state.run_id,
            [
                confirmation(
                    state,
                    effect.effect_id,
                    happened=True,
                    actor="user:ops",
                    note="charged, seen in the bank portal",
                    receipts={"ticket": "T-1"},
                ),
                ev.RunReleased(
                    run_id=state.run_id, seq=state.seq + 2, worker_id="user:ops", reason="answered"
                ),
            ],
            expected_seq=state.seq,
        )
        result = await rt.resume(rid, agent(ScriptedModel(script(name), by_turn=True)))
        assert result.status is RunStatus.COMPLETED
        events = await rt.events(rid)
        assert (await rt.state(rid)).pending_interrupts == {}
    done = next(e for e in events if isinstance(e, ev.ToolCompleted))
    assert done.output == "charge_card_unchecked: charged, seen in the bank portal"
    assert not done.is_error
    assert payments.query("SELECT COUNT(*) FROM attempts")[0][0] == 1


async def test_compensation_on_cancel_reaches_the_call_in_flight(
    runtime: Runtime, payments: PaymentsService
) -> None:
    started = asyncio.Event()

    @tool
    async def wait_for_bank(reference: str) -> str:
        """Wait for the bank (slow)."""
        started.set()
        await asyncio.sleep(60)
        return "never"

    model = ScriptedModel(
        [
            call_tool("charge_refundable", ORDER),
            call_tool("wait_for_bank", {"reference": "r"}),
            reply("unreachable"),
        ]
    )
    a = agent(model, extra=[wait_for_bank])
    rid = await runtime.start(a, "charge then wait")
    driving = asyncio.create_task(runtime.resume(rid, a))
    await asyncio.wait_for(started.wait(), 10)
    await runtime.cancel(rid, reason="customer changed their mind")
    result = await asyncio.wait_for(driving, 20)
    assert result.status is RunStatus.CANCELLED
    events = await runtime.events(rid)
    state = await runtime.state(rid)
    charge, refund = state.effects.values()
    assert charge.tool == "charge_refundable" and charge.state is EffectState.COMPENSATED
    assert refund.tool == "refund_charge" and refund.compensates == charge.effect_id
    assert refund.state is EffectState.COMMITTED
    (charge_id,) = payments.query("SELECT charge_id FROM charges")[0]
    assert payments.query("SELECT charge_id FROM refunds") == [(charge_id,)]
    assert refund.receipts["refund_id"] == payments.query("SELECT refund_id FROM refunds")[0][0]
    # the slow call was cancelled in flight and recorded, then the saga, then the end
    waited = next(
        e for e in events if isinstance(e, ev.ToolCompleted) and e.name == "wait_for_bank"
    )
    ending = next(e for e in events if isinstance(e, ev.RunEnding))
    assert ending.seq < waited.seq and waited.is_error and waited.error_code == "cancelled"
    compensating = next(
        e for e in events if isinstance(e, ev.EffectChanged) and e.state == "compensating"
    )
    assert waited.seq < compensating.seq
    assert isinstance(events[-1], ev.RunCancelled)
    assert events[-1].reason == "customer changed their mind"


async def test_compensation_when_the_run_fails(runtime: Runtime, payments: PaymentsService) -> None:
    model = ScriptedModel([call_tool("charge_refundable", ORDER), reply("x")])
    a = agent(model, budget=Budget(max_turns=1))
    result = await runtime.run(a, "charge")
    assert result.status is RunStatus.FAILED
    assert result.failure_reason is FailureReason.BUDGET_EXHAUSTED
    state = await runtime.state(result.run_id)
    charge, refund = state.effects.values()
    assert charge.state is EffectState.COMPENSATED and refund.state is EffectState.COMMITTED
    assert payments.stats()["refunds"] == 1


async def died_sending_an_unchecked_charge(db: str) -> RunSummary:
    """A run that charged a refundable order, then died while an unchecked charge was out
    (its outcome unknown)."""
    model = ScriptedModel(
        [
            call_tool("charge_refundable", ORDER),
            call_tool("charge_card_unchecked", {**ORDER, "order_id": "o2"}),
            reply("x"),
        ]
    )
    async with Runtime(DiesAround(db, "charge_card_unchecked")) as rt:
        with pytest.raises(Crash):
            await rt.run(agent(model), "go")
        (summary,) = await rt.runs()
    return summary


async def test_cancel_of_a_run_nobody_drives_runs_its_saga(
    tmp_path: Path, payments: PaymentsService
) -> None:
    db = str(tmp_path / "runs.db")
    summary = await died_sending_an_unchecked_charge(db)
    async with Runtime(db) as rt:
        waiting = await rt.resume(summary.run_id, agent(ScriptedModel([], by_turn=True)))
        assert waiting.status is RunStatus.INPUT_REQUIRED
        (asked,) = (await rt.state(summary.run_id)).pending_interrupts
        result = await rt.cancel(summary.run_id, agent=agent(ScriptedModel([])))
        # the unknown charge still needs a person; the refundable one is not undone before that
        assert result.status is RunStatus.INPUT_REQUIRED
        state = await rt.state(summary.run_id)
        assert state.ending is not None and state.ending.outcome == "cancelled"
        assert list(state.pending_interrupts) == [asked]  # the same question, not asked twice


async def test_a_cancelled_run_waiting_on_a_person_ends_once_they_answer(
    tmp_path: Path, payments: PaymentsService
) -> None:
    db = str(tmp_path / "runs.db")
    summary = await died_sending_an_unchecked_charge(db)
    rid = summary.run_id
    async with Runtime(db) as rt:
        await rt.resume(rid, agent(ScriptedModel([], by_turn=True)))
        waiting = await rt.cancel(rid, agent=agent(ScriptedModel([])))
        assert waiting.status is RunStatus.INPUT_REQUIRED
        (asked,) = await rt.inbox()
        await rt.answer(asked.id, '{"outcome": "committed"}', answered_by="ops")
        result = await rt.resume(rid, agent(ScriptedModel([])))
        state = await rt.state(rid)
    assert result.status is RunStatus.CANCELLED
    refundable, unchecked = [e for e in state.effects.values() if e.compensates is None]
    assert unchecked.state is EffectState.COMMITTED  # as the person said; never sent again
    assert unchecked.output == "charge_card_unchecked: confirmed done by a person"
    assert refundable.state is EffectState.COMPENSATED
    assert payments.stats()["charges"] == 2 and payments.stats()["refunds"] == 1


async def test_cancel_with_a_write_in_flight_reconciles_then_compensates(
    runtime: Runtime, payments: PaymentsService
) -> None:
    charged = asyncio.Event()
    base = as_tool(ALL[4])  # charge_refundable
    assert base.name == "charge_refundable"

    async def slow_answer(**kw: Any) -> Any:
        await base.fn(**kw)  # the service charges...
        charged.set()
        await asyncio.sleep(60)  # ...and the answer never arrives before the cancel

    a = Agent(
        name="shop",
        model=ScriptedModel(script("charge_refundable")),
        tools=[dataclasses.replace(base, fn=slow_answer), *tools()[5:]],
    )
    rid = await runtime.start(a, "charge")
    driving = asyncio.create_task(runtime.resume(rid, a))
    await asyncio.wait_for(charged.wait(), 10)
    await runtime.cancel(rid, reason="stop")
    result = await asyncio.wait_for(driving, 20)
    assert result.status is RunStatus.CANCELLED
    state = await runtime.state(result.run_id)
    charge, refund = state.effects.values()
    assert [s.value for _, s in charge.history] == [
        "proposed",
        "validated",
        "authorised",
        "dispatched",
        "outcome_unknown",
        "reconciling",
        "committed",
        "compensating",
        "compensated",
    ]
    assert refund.state is EffectState.COMMITTED
    (charge_id,) = payments.query("SELECT charge_id FROM charges")[0]
    assert payments.query("SELECT charge_id FROM refunds") == [(charge_id,)]


@pytest.mark.parametrize(
    ("before_call", "states", "refunds"),
    [
        (False, ["reconciling", "committed", "compensating", "compensated"], 1),
        (True, ["reconciling", "failed"], 0),
    ],
    ids=["charged", "never charged"],
)
async def test_cancelling_a_crashed_run_settles_its_write_in_flight_in_one_go(
    tmp_path: Path, payments: PaymentsService, before_call: bool, states: list[str], refunds: int
) -> None:
    db = str(tmp_path / "runs.db")
    name = "charge_refundable"
    async with Runtime(DiesAround(db, name, before_call=before_call)) as rt:
        with pytest.raises(Crash):
            await rt.run(agent(ScriptedModel(script(name))), "go")
        (summary,) = await rt.runs()
    async with Runtime(db) as rt:
        # the dead worker still holds the run: the cancel is recorded, and the resume that
        # takes the run over looks the charge up, then undoes it, in one go
        await rt.cancel(summary.run_id, agent=agent(ScriptedModel([])))
        result = await rt.resume(summary.run_id, agent(ScriptedModel([])))
        assert result.status is RunStatus.CANCELLED
        state = await rt.state(summary.run_id)
    charge = next(e for e in state.effects.values() if e.tool == name)
    assert [s.value for _, s in charge.history][-len(states) :] == states
    assert payments.stats()["refunds"] == refunds


async def test_a_look_up_that_cannot_reach_the_provider_asks_a_person(
    tmp_path: Path, payments: PaymentsService, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = str(tmp_path / "runs.db")
    async with Runtime(DiesAround(db, "charge_card")) as rt:
        with pytest.raises(Crash):
            await rt.run(agent(ScriptedModel(script("charge_card"))), "go")
        (summary,) = await rt.runs()
    monkeypatch.setenv("PAYMENTS_URL", "http://127.0.0.1:9")  # nothing listens there
    async with Runtime(db) as rt:
        model = ScriptedModel(script("charge_card"), by_turn=True)
        result = await rt.resume(summary.run_id, agent(model))
        assert result.status is RunStatus.INPUT_REQUIRED
        events = await rt.events(summary.run_id)
        state = await rt.state(summary.run_id)
    assert effect_states(events)[-3:] == ["outcome_unknown", "reconciling", "outcome_unknown"]
    failed = [e for e in events if isinstance(e, ev.EffectChanged)][-1]
    assert failed.error_code == "reconcile_failed"
    assert failed.note.startswith("reconcile failed: ConnectError")
    (asked,) = state.pending_interrupts.values()
    assert asked.kind == "external_confirmation_required" and asked.effect_id == failed.effect_id
    assert payments.stats()["charges"] == 1  # charged once, and never sent again


@pytest.mark.parametrize(
    ("before_call", "state", "charges"),
    [(False, EffectState.COMMITTED, 1), (True, EffectState.FAILED, 0)],
    ids=["charged", "never charged"],
)
async def test_cancelling_a_run_that_asked_a_person_settles_by_looking_the_call_up_again(
    tmp_path: Path,
    payments: PaymentsService,
    monkeypatch: pytest.MonkeyPatch,
    before_call: bool,
    state: EffectState,
    charges: int,
) -> None:
    """The provider was unreachable, so a person was asked; once it answers again, cancelling
    the run looks the charge up and ends the run at once, without waiting for the person."""
    db = str(tmp_path / "runs.db")
    async with Runtime(DiesAround(db, "charge_card", before_call=before_call)) as rt:
        with pytest.raises(Crash):
            await rt.run(agent(ScriptedModel(script("charge_card"))), "go")
        (summary,) = await rt.runs()
    with monkeypatch.context() as unreachable:
        unreachable.setenv("PAYMENTS_URL", "http://127.0.0.1:9")  # nothing listens there
        async with Runtime(db) as rt:
            waiting = await rt.resume(summary.run_id, agent(ScriptedModel([], by_turn=True)))
    assert waiting.status is RunStatus.INPUT_REQUIRED
    async with Runtime(db) as rt:
        result = await rt.cancel(summary.run_id, agent=agent(ScriptedModel([])))
        after = await rt.state(summary.run_id)
    assert result.status is RunStatus.CANCELLED
    (effect,) = after.effects.values()
    assert effect.state is state and after.pending_interrupts == {}
    assert payments.stats()["charges"] == charges
