"""Typed interrupts: answer schemas, frozen actions and their hashes, approval checks."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from contextos.errors import AnswerInvalid
from contextos.policy.approvals import check_approval, render_template
from contextos.records.interrupts import (
    ANSWER_SCHEMAS,
    Approval,
    FrozenAction,
    InterruptKind,
    answer_schema,
    parse_answer,
)

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)

ACTION = FrozenAction(
    run_id="run_1",
    call_id="call_1_0",
    tool="refund",
    arguments={"order_id": "A-17", "amount": 250},
    contract_hash="c0ffee",
    effect="irreversible",
    risk="high",
    preview="Refund 250 EUR on order A-17",
)


def approval(**kw: object) -> Approval:
    base = Approval(
        id="apr.run_1.5",
        interrupt_id="i",
        run_id="run_1",
        action_hash=ACTION.hash,
        approver="alice",
        approver_roles=("finance",),
        granted_at=NOW,
        expires_at=NOW + timedelta(hours=1),
    )
    return replace(base, **kw)  # type: ignore[arg-type]


def problems(a: Approval, **kw: object) -> list[str]:
    args: dict[str, object] = dict(
        action_hash=ACTION.hash,
        arguments=ACTION.arguments,
        now=NOW,
        approver_roles=frozenset({"finance"}),
        required_roles=("finance",),
        run_principal="bob",
    )
    args.update(kw)
    return [p.code for p in check_approval(a, **args)]  # type: ignore[arg-type]


def test_every_kind_has_an_answer_schema() -> None:
    assert set(ANSWER_SCHEMAS) == set(InterruptKind)
    for kind in InterruptKind:
        assert answer_schema(kind)["type"] == "object"
    assert {k.value for k in InterruptKind} == {
        "approval_required",
        "missing_information",
        "choice_required",
        "policy_exception_requested",
        "external_confirmation_required",
        "review_required",
    }


def test_answers_are_validated_against_their_kind() -> None:
    assert parse_answer("choice_required", "blue", {"options": ["red", "blue"]}) == {
        "choice": "blue"
    }
    with pytest.raises(AnswerInvalid, match="not one of the options"):
        parse_answer("choice_required", "green", {"options": ["red", "blue"]})
    assert parse_answer("missing_information", "DE-1234")["value"] == "DE-1234"
    assert parse_answer("review_required", '{"verdict": "revise", "comments": "shorter"}') == {
        "verdict": "revise",
        "comments": "shorter",
    }
    with pytest.raises(AnswerInvalid, match="verdict"):
        parse_answer("review_required", "maybe")
    assert parse_answer("external_confirmation_required", "committed")["outcome"] == "committed"
    with pytest.raises(AnswerInvalid):
        parse_answer("external_confirmation_required", {"outcome": "committed", "extra": 1})
    assert parse_answer("approval_required", "approve")["decision"] == "approve"
    with pytest.raises(AnswerInvalid, match="not valid JSON"):
        parse_answer("review_required", "{nope")


def test_the_hash_covers_what_the_action_does_not_how_it_is_described() -> None:
    assert replace(ACTION, preview="something else").hash == ACTION.hash
    for changed in (
        replace(ACTION, arguments={"order_id": "A-17", "amount": 251}),
        replace(ACTION, tool="refund_v2"),
        replace(ACTION, contract_hash="beef"),
        replace(ACTION, call_id="call_2_0"),
        replace(ACTION, run_id="run_2"),
    ):
        assert changed.hash != ACTION.hash
    # argument order does not matter
    same = replace(ACTION, arguments={"amount": 250, "order_id": "A-17"})
    assert same.hash == ACTION.hash
    assert FrozenAction.from_dict(ACTION.to_dict()) == ACTION


def test_a_valid_approval_has_no_problems() -> None:
    assert problems(approval()) == []


def test_forged_hash_expired_revoked_role_self_and_conditions() -> None:
    assert problems(approval(action_hash="0" * 64)) == ["hash_mismatch"]
    assert problems(approval(), now=NOW + timedelta(hours=1)) == ["expired"]
    assert problems(approval(revoked_at=NOW, revoked_by="carol")) == ["revoked"]
    assert problems(approval(), approver_roles=frozenset()) == ["role_missing"]
    assert problems(approval(), required_roles=("finance", "cfo")) == ["role_missing"]
    assert problems(approval(), run_principal="alice") == ["self_approval"]
    assert problems(approval(), run_principal="alice", allow_self_approval=True) == []
    assert problems(approval(conditions={"max_amount": 200})) == ["condition_failed"]
    changed = replace(ACTION, arguments={"order_id": "A-17", "amount": 900})
    assert problems(approval(), action_hash=changed.hash, arguments=changed.arguments) == [
        "hash_mismatch"
    ]


def test_templates_fill_plain_names_only() -> None:
    args = {"amount": 250, "order": {"id": "A-17"}}
    assert render_template("Refund {amount} on {order.id}", args) == "Refund 250 on A-17"
    assert (
        render_template("{missing} and {amount.__class__}", args)
        == "{missing} and {amount.__class__}"
    )
