"""The one fold also holds what people were asked and what they said, and the policy gate
decides from it: no second reading of the log."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from contextos import RunState
from contextos import events as ev
from contextos.ledger import EffectState as S
from contextos.messages import FinishReason, Message, ToolCall, Usage
from contextos.policy import Decision, Policy, Rule
from contextos.policy.authority import Authority
from contextos.policy.gate import Gate
from contextos.policy.rules import conditions
from contextos.runs import RunId
from contextos.state import apply, fold
from contextos.tools import tool

RID = RunId("run_p")
CALL = ToolCall(id="call_1_0", name="refund", arguments='{"order_id": "A-1", "amount": 250}')
SOON = datetime.now(UTC) + timedelta(hours=1)


@tool(effect="irreversible", risk="high")
def refund(order_id: str, amount: float) -> str:
    """Refund an order."""
    return "ok"


def asked_twice() -> list[ev.Event]:
    """A call asked about, the run driven again, and the same call asked about once more."""
    return [
        ev.RunCreated(
            run_id=RID, seq=1, agent_name="a", agent_version="1", agent_hash="h", input="hi"
        ),
        ev.RunStarted(run_id=RID, seq=2, worker_id="w1"),
        ev.ModelResponded(
            run_id=RID,
            seq=3,
            message=Message(role="assistant", tool_calls=(CALL,)),
            finish_reason=FinishReason.TOOL_CALLS,
            usage=Usage(),
            model="m",
        ),
        ev.InterruptRaised(
            run_id=RID, seq=4, interrupt_id=f"{RID}.i4", kind="approval_required", call_id=CALL.id
        ),
        ev.RunStarted(run_id=RID, seq=5, worker_id="w2"),
        ev.InterruptRaised(
            run_id=RID, seq=6, interrupt_id=f"{RID}.i6", kind="approval_required", call_id=CALL.id
        ),
    ]


def test_a_question_asked_again_supersedes_the_first() -> None:
    state = fold(asked_twice())
    first, second = state.interrupts.values()
    assert (first.status, second.status) == ("superseded", "pending")
    assert list(state.pending_interrupts) == [second.id]
    assert state.latest_interrupt(CALL.id) is second


def test_approvals_and_revocations_are_folded_with_the_run() -> None:
    state = fold(asked_twice())
    apply(
        state,
        ev.ApprovalGranted(
            run_id=RID,
            seq=7,
            approval_id=f"apr.{RID}.7",
            interrupt_id=f"{RID}.i6",
            action_hash="abc",
            approver="alice",
            expires_at=SOON,
        ),
    )
    interrupt = state.interrupts[f"{RID}.i6"]
    assert interrupt.status == "approved" and interrupt.approval is not None
    apply(
        state, ev.ApprovalRevoked(run_id=RID, seq=8, approval_id=f"apr.{RID}.7", revoked_by="bob")
    )
    assert state.approvals[f"apr.{RID}.7"].revoked_by == "bob"
    assert interrupt.approval is not None and interrupt.approval.revoked


def test_a_question_about_an_effect_that_settled_no_longer_stands() -> None:
    state = fold(asked_twice()[:3])
    effect = "eff_1"
    for e in (
        ev.EffectProposed(
            run_id=RID,
            seq=4,
            effect_id=effect,
            call_id=CALL.id,
            tool="refund",
            kind="irreversible",
            idempotency_key="k",
            contract_hash="c",
        ),
        ev.EffectChanged(run_id=RID, seq=5, effect_id=effect, state=S.VALIDATED),
        ev.EffectChanged(run_id=RID, seq=6, effect_id=effect, state=S.AUTHORISED),
        ev.EffectChanged(run_id=RID, seq=7, effect_id=effect, state=S.DISPATCHED, attempt=1),
        ev.EffectChanged(run_id=RID, seq=8, effect_id=effect, state=S.OUTCOME_UNKNOWN),
        ev.InterruptRaised(
            run_id=RID,
            seq=9,
            interrupt_id=f"{RID}.i9",
            kind="external_confirmation_required",
            call_id=CALL.id,
            effect_id=effect,
        ),
        ev.RunStarted(run_id=RID, seq=10, worker_id="w2"),
        ev.EffectChanged(run_id=RID, seq=11, effect_id=effect, state=S.RECONCILING),
        ev.EffectChanged(run_id=RID, seq=12, effect_id=effect, state=S.COMMITTED),
    ):
        apply(state, e)
    assert state.interrupts[f"{RID}.i9"].status == "superseded"
    assert state.pending_interrupts == {}


def test_the_calls_that_succeeded_are_folded_for_rate_and_budget_limits() -> None:
    state = fold(asked_twice()[:3])
    apply(state, ev.ToolCompleted(run_id=RID, seq=4, call_id=CALL.id, name="refund", output="ok"))
    assert state.succeeded == [CALL.id]
    assert state.tool_call(CALL.id) == CALL


def state_waiting_on(rule: Rule) -> tuple[RunState, Gate]:
    state = fold(asked_twice()[:3])
    validated: Any = lambda name, arguments: arguments  # noqa: E731
    policy = Policy(rules=(rule,), roles={"finance": ("alice",)})
    return state, Gate(Authority(policy), state, validated)


async def test_the_gate_decides_from_the_runs_state_alone() -> None:
    """No store anywhere: what the gate knows of the run is the state its driver folds."""
    rule = Rule(
        id="big",
        tools=("refund",),
        decision=Decision.REQUIRE_APPROVAL,
        approver_role="finance",
        when=conditions({"amount": {"gt": 100}}),
    )
    state, gate = state_waiting_on(rule)
    call = refund.proposal(RID, CALL.id, {"order_id": "A-1", "amount": 250.0})
    asked = await gate.evaluate(call)
    assert asked.decision is Decision.REQUIRE_APPROVAL
    for e in (
        ev.InterruptRaised(
            run_id=RID,
            seq=4,
            interrupt_id=f"{RID}.i4",
            kind="approval_required",
            call_id=CALL.id,
            payload=dict(asked.interrupt_payload),
        ),
        ev.ApprovalGranted(
            run_id=RID,
            seq=5,
            approval_id=f"apr.{RID}.5",
            interrupt_id=f"{RID}.i4",
            action_hash=asked.action_hash,
            approver="alice",
            approver_roles=("finance",),
            expires_at=SOON,
        ),
    ):
        apply(state, e)
    allowed = await gate.evaluate(call)
    assert allowed.decision is Decision.ALLOW and allowed.approval_id == f"apr.{RID}.5"
