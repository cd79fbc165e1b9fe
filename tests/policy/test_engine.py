"""The engine: authority as an intersection of layers; the most restrictive answer wins."""

from __future__ import annotations

from pathlib import Path

import pytest

from contextos.errors import AuthorityWidened
from contextos.policy import (
    CallHistory,
    Containment,
    Decision,
    Engine,
    Limit,
    NetworkPolicy,
    Policy,
    Principal,
    ProposedCall,
    Rule,
    RunContext,
)
from contextos.policy.rules import conditions
from contextos.tools import Tool, file_tools, http_tools, tool


@tool(effect="irreversible", risk="high", scopes=("payments:refund",))
def refund(order_id: str, amount: float) -> str:
    """Refund an order."""
    return "ok"


@tool(data_classification="restricted")
def read_medical(patient: str) -> str:
    """Read a medical record."""
    return "x"


POLICY = Policy(
    rules=(
        Rule(
            id="refund-over-100",
            tools=("refund",),
            decision=Decision.REQUIRE_APPROVAL,
            approver_role="finance",
            when=conditions({"amount": {"gt": 100}}),
            reason="refunds over 100 need finance",
        ),
        Rule(
            id="no-huge",
            tools=("refund",),
            decision=Decision.DENY,
            absolute=True,
            when=conditions({"amount": {"gt": 10_000}}),
            reason="never refund more than 10000",
        ),
        Rule(
            id="weekend-freeze",
            tools=("refund",),
            decision=Decision.DENY,
            exception_role="cfo",
            when=conditions({"order_id": {"glob": "FROZEN-*"}}),
            reason="frozen orders",
        ),
        Rule(
            id="refund-cap",
            tools=("refund",),
            decision=Decision.CONSTRAIN,
            constraints={"max_amount": 5000},
        ),
    ),
    limits=(Limit(id="refund-budget", tools=("refund",), sum_of="amount", max_total=1000),),
)


def ctx(**kw: object) -> RunContext:
    principal = kw.pop("principal", Principal.user("u", scopes=("payments:*",)))
    return RunContext(principal=principal, **kw)  # type: ignore[arg-type]


def proposal(t: Tool, **arguments: object) -> ProposedCall:
    """What the gateway asks policy about a call of `t`."""
    return t.proposal("r", "c", dict(arguments))


def decide(t: Tool | None, call: ProposedCall, context: RunContext | None = None, **kw: object):  # type: ignore[no-untyped-def]
    return Engine(POLICY).evaluate(call, context or ctx(), in_manifest=t is not None, **kw)  # type: ignore[arg-type]


def test_small_refund_is_allowed_within_constraints() -> None:
    d = decide(refund, proposal(refund, order_id="A", amount=50))
    assert d.decision is Decision.CONSTRAIN and d.allowed
    assert d.constraints == {"max_amount": 5000}
    assert d.snapshot_hash == POLICY.snapshot_hash
    assert {c.layer for c in d.checks} >= {
        "manifest",
        "allowlist",
        "scopes",
        "classification",
        "policy",
        "limits",
    }


def test_large_refund_requires_approval_with_role() -> None:
    d = decide(refund, proposal(refund, order_id="A", amount=500), history=CallHistory())
    assert d.decision is Decision.REQUIRE_APPROVAL
    assert d.rule_ids == ("refund-over-100",)
    assert d.approver_role == "finance" and d.approver_roles == ("finance",)
    assert d.reasons == ("refunds over 100 need finance",)
    assert "require_approval by refund-over-100 (role finance)" in d.summary


def test_absolute_deny_wins_over_everything() -> None:
    d = decide(refund, proposal(refund, order_id="A", amount=20_000))
    assert d.decision is Decision.DENY and d.absolute
    assert "no-huge" in d.rule_ids
    assert d.exception_role is None


def test_deny_open_to_exception_names_the_role() -> None:
    d = decide(refund, proposal(refund, order_id="FROZEN-1", amount=50))
    assert d.decision is Decision.DENY and not d.absolute
    assert d.exception_role == "cfo"


def test_missing_scope_is_an_absolute_deny() -> None:
    c = ctx(principal=Principal.user("u", scopes=("files:read",)))
    d = decide(refund, proposal(refund, order_id="A", amount=5), c)
    assert d.decision is Decision.DENY and d.absolute
    assert d.rule_ids == ("scope:payments:refund",)
    # delegation can only narrow: delegated scopes beyond the principal's do not count
    c2 = ctx(principal=Principal.user("u", scopes=("files:read",)), scopes=("payments:refund",))
    assert decide(refund, proposal(refund, order_id="A", amount=5), c2).decision is Decision.DENY


def test_tool_allowlist_and_manifest() -> None:
    d = decide(refund, proposal(refund, order_id="A", amount=5), ctx(tools=("lookup_*",)))
    assert d.decision is Decision.DENY and d.absolute and d.rule_ids == ("allowlist",)
    d = decide(None, proposal(refund, order_id="A", amount=5))
    assert d.decision is Decision.DENY and d.rule_ids == ("manifest",)


def test_data_classification() -> None:
    d = decide(read_medical, proposal(read_medical, patient="p"))
    assert d.decision is Decision.DENY and d.absolute and d.rule_ids == ("classification",)
    assert decide(
        read_medical, proposal(read_medical, patient="p"), ctx(clearance="restricted")
    ).allowed


def test_budget_limit_counts_what_already_ran() -> None:
    history = CallHistory(succeeded=(("refund", {"amount": 91}),) * 10)
    under = decide(refund, proposal(refund, order_id="A", amount=90), history=history)
    assert under.allowed
    d = decide(refund, proposal(refund, order_id="A", amount=99), history=history)
    assert d.decision is Decision.DENY and not d.absolute
    assert d.rule_ids == ("refund-budget",)
    assert "910 already used" in d.reasons[0]


def test_rate_limit() -> None:
    engine = Engine(Policy(limits=(Limit(id="twice", tools=("refund",), max_calls=2),)))
    c = proposal(refund, order_id="A", amount=1)
    assert engine.evaluate(c, ctx(), history=CallHistory(succeeded=(("refund", {}),))).allowed
    d = engine.evaluate(c, ctx(), history=CallHistory(succeeded=(("refund", {}),) * 2))
    assert d.decision is Decision.DENY and d.rule_ids == ("twice",)


def test_broken_constraint_denies() -> None:
    engine = Engine(
        Policy(rules=(Rule(id="cap", decision=Decision.CONSTRAIN, constraints={"max_amount": 10}),))
    )
    d = engine.evaluate(proposal(refund, order_id="A", amount=11), ctx())
    assert d.decision is Decision.DENY and not d.absolute
    assert "amount=11 breaks max_amount=10" in d.reasons[0]


def test_default_deny_policy() -> None:
    engine = Engine(Policy(default=Decision.DENY))
    d = engine.evaluate(proposal(refund, order_id="A", amount=1), ctx())
    assert d.decision is Decision.DENY and d.rule_ids == ("policy:default",)


def test_containment_layer_checks_paths_and_urls_before_dispatch(tmp_path: Path) -> None:
    read_file, write_file, _ = file_tools()
    http_get, _ = http_tools()
    run_ctx = ctx(
        principal=Principal.user("u", scopes=("*",)),
        containment=Containment(
            roots=(str(tmp_path),), network=NetworkPolicy(allow=("127.0.0.1",))
        ),
    )
    engine = Engine()
    ok = engine.evaluate(proposal(read_file, path="a.txt"), run_ctx)
    assert ok.allowed
    bad = engine.evaluate(proposal(write_file, path="../x", content=""), run_ctx)
    assert bad.decision is Decision.DENY and bad.absolute and bad.rule_ids == ("containment:path",)
    assert "climbs out" in bad.reasons[0]
    url = engine.evaluate(proposal(http_get, url="http://example.org/"), run_ctx)
    assert url.decision is Decision.DENY and url.absolute and "allow list" in url.reasons[0]
    unconfined = ctx(principal=Principal.user("u", scopes=("*",)))
    none = engine.evaluate(proposal(read_file, path="a.txt"), unconfined)
    assert none.decision is Decision.DENY and "no containment configured" in none.reasons[0]


def test_a_child_context_can_only_narrow(tmp_path: Path) -> None:
    parent = RunContext(
        principal=Principal.user("u", scopes=("payments:*", "files:read")),
        tools=("refund", "lookup_*"),
        clearance="confidential",
        containment=Containment(roots=(str(tmp_path),)),
    )
    child = parent.delegate(run_id="run_p", scopes=("payments:refund",), tools=("lookup_order",))
    assert child.effective_scopes == ("payments:refund",)
    assert child.principal_chain == ("run:run_p",) and child.parent_run_id == "run_p"
    child.check_narrows(parent)
    for wider in (
        dict(scopes=("admin:*",)),
        dict(tools=("delete_everything",)),
        dict(tools=("*",)),
        dict(clearance="restricted"),
        dict(containment=Containment(roots=(str(tmp_path.parent),))),
    ):
        with pytest.raises(AuthorityWidened):
            parent.delegate(**wider)
    assert RunContext.from_dict(child.to_dict()) == child
    assert child.hash() != parent.hash()


def test_an_exception_to_a_deny_cannot_lift_a_broken_constraint() -> None:
    freeze, cap = POLICY.rules[2], POLICY.rules[3]  # open to a cfo's exception; max_amount 5000
    engine = Engine(Policy(rules=(freeze, cap)))
    within = engine.evaluate(proposal(refund, order_id="FROZEN-1", amount=50), ctx())
    assert within.decision is Decision.DENY and within.exception_role == "cfo"
    over = engine.evaluate(proposal(refund, order_id="FROZEN-1", amount=6000), ctx())
    assert over.decision is Decision.DENY and not over.absolute
    assert over.rule_ids == ("weekend-freeze", "constraints")
    assert over.exception_role is None and over.approver_roles == ()
