"""Approvals over frozen actions, end to end through the runtime, the tool runner and a real
SQLite refund ledger: the action runs only under an approval that still holds when it runs."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import pytest
from refunds import POLICY, ledger, refund_agent

from contextos import EffectState, FrozenAction, Interrupt, RunStatus, Runtime
from contextos import events as ev
from contextos.errors import AnswerInvalid, ApprovalRefused, InterruptNotFound
from contextos.policy import Decision, Limit, Policy, Principal, Rule
from contextos.policy.authority import Authority
from contextos.runs import RunId

BOB = Principal.user("bob", scopes=("payments:*",))


class Clock:
    def __init__(self) -> None:
        self.now = datetime(2026, 11, 30, 9, 0, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now


class Directory:
    """Roles that can change while a run waits (someone leaves the finance team)."""

    def __init__(self) -> None:
        self.roles = {"alice": {"finance"}, "carol": {"cfo", "finance"}, "dave": set()}

    async def roles_of(self, principal_id: str, *, tenant: str) -> frozenset[str]:
        return frozenset(self.roles.get(principal_id, set()))


@pytest.fixture
def refunds_db(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "refunds.db"
    monkeypatch.setenv("REFUND_LEDGER", str(path))
    return path


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def directory() -> Directory:
    return Directory()


@pytest.fixture
async def rt(
    tmp_path: Path, refunds_db: Path, clock: Clock, directory: Directory
) -> AsyncIterator[Runtime]:
    runtime = Runtime(
        str(tmp_path / "runs.db"), policy=Authority(POLICY, directory=directory, clock=clock)
    )
    yield runtime
    await runtime.close()


async def waiting(rt: Runtime, *amounts: float) -> tuple[RunId, Interrupt]:
    agent = refund_agent(*amounts)
    result = await rt.run(agent, "refund please", principal=BOB)
    assert result.status is RunStatus.INPUT_REQUIRED
    (pending,) = [i for i in await rt.inbox() if i.run_id == result.run_id]
    return result.run_id, pending


def decisions(events: list[ev.Event]) -> list[ev.PolicyDecided]:
    return [e for e in events if isinstance(e, ev.PolicyDecided)]


def raised(events: list[ev.Event]) -> list[ev.InterruptRaised]:
    return [e for e in events if isinstance(e, ev.InterruptRaised)]


async def test_a_refund_under_the_threshold_goes_through(rt: Runtime, refunds_db: Path) -> None:
    result = await rt.run(refund_agent(40), "refund 40", principal=BOB)
    assert result.status is RunStatus.COMPLETED
    events = await rt.events(result.run_id)
    assert isinstance(events[1], ev.ContextBound)
    assert events[1].context["principal"]["id"] == "bob"
    assert events[1].snapshot_hash == POLICY.snapshot_hash
    (decided,) = decisions(events)
    assert decided.decision == "allow" and decided.snapshot_hash == POLICY.snapshot_hash
    assert {c["layer"] for c in decided.checks} >= {"manifest", "scopes", "policy"}
    dispatched = next(
        e for e in events if isinstance(e, ev.EffectChanged) and e.state == "dispatched"
    )
    assert decided.seq < dispatched.seq  # decided and recorded before anything was sent
    assert ledger(refunds_db)[0] == [(f"{result.run_id}/call_1_0", "A-0", 40.0)]


async def test_over_the_threshold_the_run_waits_holding_nothing(
    rt: Runtime, refunds_db: Path
) -> None:
    run_id, pending = await waiting(rt, 500)
    assert pending.kind == "approval_required"
    assert pending.prompt == "Refund 500.0 EUR on order A-0"
    action = pending.action
    assert action is not None and action.tool == "refund"
    assert action.arguments == {"order_id": "A-0", "amount": 500.0}
    assert action.blast_radius == "irreversible: 1 payment of 500.0 EUR leaves the company"
    assert pending.approver_roles == ("finance",)
    (decided,) = decisions(await rt.events(run_id))
    assert decided.decision == "require_approval" and decided.rule_ids == ("refund-over-100",)
    assert decided.action_hash == action.hash == pending.action_hash
    assert ledger(refunds_db) == ([], 0)
    # resuming a waiting run does nothing: no worker is held, nothing is sent
    again = await rt.resume(run_id, refund_agent(500))
    assert again.status is RunStatus.INPUT_REQUIRED
    assert ledger(refunds_db) == ([], 0)
    summary = (await rt.runs(status=RunStatus.INPUT_REQUIRED))[0]
    assert summary.run_id == run_id


async def test_approve_then_resume_runs_the_action_once(rt: Runtime, refunds_db: Path) -> None:
    run_id, pending = await waiting(rt, 500)
    approval = await rt.approve(pending.id, approver="alice", action_hash=pending.action_hash)
    assert approval.approver == "alice" and approval.action_hash == pending.action_hash
    assert (await rt.state(run_id)).status is RunStatus.QUEUED
    # approving twice is idempotent: the same approval, no second event
    twice = await rt.approve(pending.id, approver="alice")
    assert twice == approval
    result = await rt.resume(run_id, refund_agent(500))
    assert result.status is RunStatus.COMPLETED
    events = await rt.events(run_id)
    assert sum(isinstance(e, ev.ApprovalGranted) for e in events) == 1
    last = decisions(events)[-1]
    assert last.decision == "allow" and last.approval_id == approval.id
    assert f"approval:{approval.id}" in last.rule_ids
    (proposed,) = [e for e in events if isinstance(e, ev.EffectProposed)]
    assert last.effect_id == proposed.effect_id  # the new decision is the effect's
    assert ledger(refunds_db) == ([(f"{run_id}/call_1_0", "A-0", 500.0)], 1)
    assert await rt.inbox() == []


async def test_cancelling_a_run_waiting_for_an_approval_needs_no_agent(
    rt: Runtime, refunds_db: Path
) -> None:
    run_id, pending = await waiting(rt, 500)
    # Started in this process (no agent reference) and cancelled without its agent: the
    # refund was never sent, so nothing is left for its tools to settle.
    result = await rt.cancel(run_id, reason="the customer withdrew")
    assert result.status is RunStatus.CANCELLED
    state = await rt.state(run_id)
    (refund,) = state.effects.values()
    assert (refund.state, refund.error_code) == (EffectState.FAILED, "not_sent")
    assert refund.output == "the run was cancelled before the call was sent"
    assert await rt.inbox() == []
    with pytest.raises(ApprovalRefused):
        await rt.approve(pending.id, approver="alice")
    assert ledger(refunds_db) == ([], 0)


async def test_forged_approval_with_another_hash_is_refused(rt: Runtime, refunds_db: Path) -> None:
    run_id, pending = await waiting(rt, 500)
    with pytest.raises(ApprovalRefused, match="not the hash of the action"):
        await rt.approve(pending.id, approver="alice", action_hash="f" * 64)
    # an approval event written straight into the log with a hash of another action
    state = await rt.state(run_id)
    forged = ev.ApprovalGranted(
        run_id=run_id,
        seq=state.seq + 1,
        approval_id=f"apr.{run_id}.{state.seq + 1}",
        interrupt_id=pending.id,
        action_hash="f" * 64,
        approver="alice",
        approver_roles=("finance",),
        expires_at=datetime(2030, 1, 1, tzinfo=UTC),
    )
    await rt.store.append(run_id, [forged], expected_seq=state.seq)
    result = await rt.resume(run_id, refund_agent(500))
    assert result.status is RunStatus.INPUT_REQUIRED
    assert ledger(refunds_db) == ([], 0)
    (fresh,) = await rt.inbox()
    assert fresh.id != pending.id and fresh.action_hash == pending.action_hash
    assert any("is for action ffffffffffff" in r for r in fresh.payload["reasons"])


async def test_expired_approval_is_refused(rt: Runtime, refunds_db: Path, clock: Clock) -> None:
    run_id, pending = await waiting(rt, 500)
    approval = await rt.approve(pending.id, approver="alice", expires_in=timedelta(minutes=5))
    assert approval.expires_at == clock.now + timedelta(minutes=5)
    clock.now += timedelta(minutes=6)
    result = await rt.resume(run_id, refund_agent(500))
    assert result.status is RunStatus.INPUT_REQUIRED
    assert ledger(refunds_db) == ([], 0)
    (fresh,) = await rt.inbox()
    assert any("expired" in r for r in fresh.payload["reasons"])
    assert fresh.payload["replaces"] == pending.id
    # a fresh approval of the new interrupt lets it run
    await rt.approve(fresh.id, approver="alice")
    assert (await rt.resume(run_id, refund_agent(500))).status is RunStatus.COMPLETED
    assert len(ledger(refunds_db)[0]) == 1


async def test_expiry_must_be_positive_and_bounded(rt: Runtime) -> None:
    _, pending = await waiting(rt, 500)
    with pytest.raises(ApprovalRefused, match="in the future"):
        await rt.approve(pending.id, approver="alice", expires_in=0)
    with pytest.raises(ApprovalRefused, match="at most"):
        await rt.approve(pending.id, approver="alice", expires_in=timedelta(days=30))


@pytest.mark.parametrize("expires_in", [float("nan"), Decimal("NaN"), "soon", True])
async def test_an_expiry_that_is_not_a_number_of_seconds_is_refused(
    rt: Runtime, expires_in: object
) -> None:
    _, pending = await waiting(rt, 500)
    with pytest.raises(ApprovalRefused) as refused:
        await rt.approve(pending.id, approver="alice", expires_in=expires_in)  # type: ignore[arg-type]
    assert refused.value.fields["code_detail"] == "invalid_expiry"
    assert "an approval's expiry must be in the future" in refused.value.message
    assert (await rt.interrupt(pending.id)).status == "pending"  # nothing was recorded


async def test_approval_conditions_must_be_checkable(rt: Runtime) -> None:
    _, pending = await waiting(rt, 500)
    with pytest.raises(ApprovalRefused, match="conditions cannot be checked"):
        await rt.approve(pending.id, approver="alice", conditions={"max_amount": float("inf")})
    assert (await rt.interrupt(pending.id)).status == "pending"


async def test_approver_without_the_role_is_refused(
    rt: Runtime, refunds_db: Path, directory: Directory
) -> None:
    run_id, pending = await waiting(rt, 500)
    with pytest.raises(ApprovalRefused, match="dave does not hold finance"):
        await rt.approve(pending.id, approver="dave")
    directory.roles["bob"] = {"finance"}  # even holding the role, bob started this run
    with pytest.raises(ApprovalRefused, match="cannot approve its own action"):
        await rt.approve(pending.id, approver="bob")
    del directory.roles["bob"]
    # alice approves, then leaves the finance team before the run resumes
    await rt.approve(pending.id, approver="alice")
    directory.roles["alice"] = set()
    result = await rt.resume(run_id, refund_agent(500))
    assert result.status is RunStatus.INPUT_REQUIRED
    assert ledger(refunds_db) == ([], 0)
    (fresh,) = await rt.inbox()
    assert any(
        "alice does not (or no longer) hold role finance" in r for r in fresh.payload["reasons"]
    )


async def test_revoked_approval_is_refused(rt: Runtime, refunds_db: Path) -> None:
    run_id, pending = await waiting(rt, 500)
    approval = await rt.approve(pending.id, approver="alice")
    with pytest.raises(ApprovalRefused, match="only its approver"):
        await rt.revoke(approval.id, revoked_by="dave")
    revoked = await rt.revoke(approval.id, revoked_by="alice", reason="customer is a fraudster")
    assert revoked.revoked and revoked.revoked_by == "alice"
    assert await rt.revoke(approval.id, revoked_by="alice") == revoked  # idempotent
    result = await rt.resume(run_id, refund_agent(500))
    assert result.status is RunStatus.INPUT_REQUIRED
    assert ledger(refunds_db) == ([], 0)
    (fresh,) = await rt.inbox()
    assert any("was revoked by alice" in r for r in fresh.payload["reasons"])


async def test_changed_arguments_raise_a_new_interrupt(rt: Runtime, refunds_db: Path) -> None:
    # the first refund (500) is approved and runs; the model then asks for 900 on the same
    # order: the old approval does not stretch to it
    run_id, first = await waiting(rt, 500, 900)
    approval = await rt.approve(first.id, approver="alice")
    result = await rt.resume(run_id, refund_agent(500, 900))
    assert result.status is RunStatus.INPUT_REQUIRED
    (second,) = await rt.inbox()
    assert second.id != first.id
    assert second.action is not None and second.action.arguments["amount"] == 900.0
    assert second.action_hash != first.action_hash
    last = decisions(await rt.events(run_id))[-1]
    assert last.decision == "require_approval" and last.approval_id is None
    assert ledger(refunds_db)[1] == 1
    # an approver shown the old arguments cannot approve the new action with them
    with pytest.raises(ApprovalRefused, match="not the hash"):
        await rt.approve(second.id, approver="alice", action_hash=first.action_hash)
    # nor does the first approval's hash match the new frozen action
    assert first.action is not None and second.action is not None
    moved = FrozenAction.from_dict({**first.action.to_dict(), "arguments": second.action.arguments})
    assert moved.hash != approval.action_hash


async def test_deny_ends_the_action_not_the_run(rt: Runtime, refunds_db: Path) -> None:
    run_id, pending = await waiting(rt, 500)
    with pytest.raises(ApprovalRefused, match="needs role finance"):
        await rt.deny(pending.id, approver="dave", reason="nope")
    await rt.deny(pending.id, approver="alice", reason="over the goodwill budget")
    await rt.deny(pending.id, approver="alice", reason="again")  # idempotent
    with pytest.raises(ApprovalRefused, match="already denied"):
        await rt.approve(pending.id, approver="alice")
    agent = refund_agent(500)
    result = await rt.resume(run_id, agent)
    assert result.status is RunStatus.COMPLETED and result.output == "Done."
    events = await rt.events(run_id)
    done = next(e for e in events if isinstance(e, ev.ToolCompleted))
    assert done.is_error and done.error_code == "policy_denied"
    assert "alice denied this action: over the goodwill budget" in done.output
    # the model was told, inside the untrusted-data block (the reason is a person's free text)
    told = agent.model.requests[-1].messages[-1].content  # type: ignore[union-attr]
    assert told.startswith("<<untrusted-data") and f"\n{done.output}\n<<end" in told
    assert ledger(refunds_db) == ([], 0)
    assert sum(isinstance(e, ev.ApprovalDenied) for e in events) == 1


async def test_an_absolute_deny_cannot_be_approved(rt: Runtime, refunds_db: Path) -> None:
    result = await rt.run(refund_agent(50_000), "refund", principal=BOB)
    assert result.status is RunStatus.COMPLETED  # the model was told and answered
    events = await rt.events(result.run_id)
    assert raised(events) == []
    (decided,) = decisions(events)
    assert decided.decision == "deny" and decided.absolute
    assert "refund-ceiling" in decided.rule_ids
    assert ledger(refunds_db) == ([], 0)


async def test_interrupt_ids_are_found_and_unknown_ones_refused(rt: Runtime) -> None:
    run_id, pending = await waiting(rt, 500)
    assert pending.id.startswith(run_id)
    assert (await rt.interrupt(pending.id)).status == "pending"
    with pytest.raises(InterruptNotFound):
        await rt.interrupt("run_nope.i3")
    with pytest.raises(AnswerInvalid, match="'approve' or 'deny'"):
        await rt.answer(pending.id, "maybe", answered_by="alice")


async def test_answer_approve_goes_through_the_same_checks(rt: Runtime, refunds_db: Path) -> None:
    run_id, pending = await waiting(rt, 500)
    with pytest.raises(ApprovalRefused, match="dave does not hold"):
        await rt.answer(pending.id, "approve", answered_by="dave")
    await rt.answer(pending.id, '{"decision": "approve", "expires_in_s": 60}', answered_by="alice")
    assert (await rt.resume(run_id, refund_agent(500))).status is RunStatus.COMPLETED
    assert len(ledger(refunds_db)[0]) == 1


async def test_a_policy_change_after_approval_is_honoured(
    tmp_path: Path, refunds_db: Path, directory: Directory
) -> None:
    db = str(tmp_path / "runs.db")
    async with Runtime(db, policy=Authority(POLICY, directory=directory)) as rt:
        run_id, pending = await waiting(rt, 500)
        await rt.approve(pending.id, approver="alice")
    stricter = Policy(
        name=POLICY.name,
        version="2",
        rules=(
            *POLICY.rules,
            Rule(
                id="refund-freeze",
                tools=("refund",),
                decision=Decision.DENY,
                absolute=True,
                reason="refunds are frozen during the audit",
            ),
        ),
        roles=POLICY.roles,
    )
    async with Runtime(db, policy=Authority(stricter, directory=directory)) as rt:
        result = await rt.resume(run_id, refund_agent(500))
        events = await rt.events(run_id)
    assert result.status is RunStatus.COMPLETED  # the model was told; the run went on
    last = decisions(events)[-1]
    assert last.decision == "deny" and last.absolute and "refund-freeze" in last.rule_ids
    assert last.snapshot_hash == stricter.snapshot_hash != POLICY.snapshot_hash
    assert last.approval_id is None
    assert ledger(refunds_db) == ([], 0)


async def test_the_budget_must_still_have_room_when_the_approved_action_runs(
    tmp_path: Path, refunds_db: Path, directory: Directory
) -> None:
    def budgeted(max_total: float) -> Authority:
        limit = Limit(id="refund-budget", tools=("refund",), sum_of="amount", max_total=max_total)
        return Authority(
            Policy(rules=POLICY.rules, roles=POLICY.roles, limits=(limit,)), directory=directory
        )

    db = str(tmp_path / "runs.db")
    async with Runtime(db, policy=budgeted(600)) as rt:
        run_id, first = await waiting(rt, 500)
        await rt.approve(first.id, approver="alice")
    # while the run waits in the queue the refund budget is cut to 400: no room for 500 now
    async with Runtime(db, policy=budgeted(400)) as rt:
        assert (await rt.resume(run_id, refund_agent(500))).status is RunStatus.COMPLETED
        last = decisions(await rt.events(run_id))[-1]
    assert last.decision == "deny" and last.rule_ids == ("refund-budget",)
    assert "would pass the limit of 400" in last.reasons[0]
    assert ledger(refunds_db) == ([], 0)


async def test_a_worker_without_the_runs_policy_fails_closed(
    tmp_path: Path, refunds_db: Path, directory: Directory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CONTEXTOS_POLICY", raising=False)
    db = str(tmp_path / "runs.db")
    async with Runtime(db, policy=Authority(POLICY, directory=directory)) as rt:
        run_id, pending = await waiting(rt, 500)
        await rt.approve(pending.id, approver="alice")
    async with Runtime(db) as rt:  # a worker someone forgot to give the policy
        assert (await rt.resume(run_id, refund_agent(500))).status is RunStatus.COMPLETED
        last = decisions(await rt.events(run_id))[-1]
    assert last.decision == "deny" and last.rule_ids == ("policy:missing",)
    assert ledger(refunds_db) == ([], 0)
