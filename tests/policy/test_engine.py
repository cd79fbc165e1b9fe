"""The engine: authority as an intersection of layers; the most restrictive answer wins."""

from __future__ import annotations

from decimal import Decimal
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
    PolicyDecision,
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


def test_a_history_kept_up_as_calls_succeed_decides_as_one_made_afresh() -> None:
    """The gate adds each call to one history as it succeeds; a limit, a budget and the repeat
    guard (its index made on the first question) then see every call added since."""
    engine = Engine(
        Policy(
            repeat_writes=2,
            limits=(
                Limit(id="three-lookups", tools=("lookup_*",), max_calls=3),
                Limit(id="refunds", tools=("refund",), sum_of="amount", max_total=100),
            ),
        )
    )
    history = CallHistory()
    refund_a = proposal(refund, order_id="A", amount=40)
    for _ in range(2):
        assert engine.evaluate(refund_a, ctx(), history=history).allowed
        history.add("refund", {"order_id": "A", "amount": 40})
    d = engine.evaluate(proposal(refund, order_id="A", amount=20), ctx(), history=history)
    assert d.allowed  # 80 spent of 100, other arguments: no repeat
    d = engine.evaluate(refund_a, ctx(), history=history)
    assert d.decision is Decision.DENY and "refunds" in d.rule_ids  # 80 + 40 > 100
    assert "repeat_writes" in {c.rule_id for c in d.checks if c.decision is not Decision.ALLOW}
    history.add("lookup_order", {"order_id": "A"})
    history.add("lookup_customer", {"customer": "c"})
    history.add("refund", {"order_id": "B", "amount": 1})
    assert history.repeats("refund", {"amount": 40, "order_id": "A"}) == 2
    history.add("refund", {"amount": 40, "order_id": "A"})
    assert history.repeats("refund", {"order_id": "A", "amount": 40}) == 3
    assert len(history) == 6
    assert history.count(engine.policy.limits[0].covers) == 2  # the lookups, of 6 calls
    fresh = CallHistory(succeeded=[("refund", {"order_id": "A", "amount": 40})] * 3)
    assert fresh.repeats("refund", {"order_id": "A", "amount": 40}) == 3


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


def test_a_deny_outranks_a_required_approval() -> None:
    history = CallHistory(succeeded=(("refund", {"amount": 910}),))
    d = decide(refund, proposal(refund, order_id="A", amount=500), history=history)
    assert d.decision is Decision.DENY and not d.absolute  # nobody can approve past the budget
    assert d.rule_ids == ("refund-budget",) and d.approver_roles == ()


def test_every_layer_records_its_check_under_its_own_name(tmp_path: Path) -> None:
    read_file, _, _ = file_tools()
    limits = (Limit(id="refunds", tools=("refund",), max_calls=1), Limit(id="reads", max_calls=5))
    engine = Engine(Policy(limits=limits))
    run_ctx = ctx(
        principal=Principal.user("u", scopes=("*",)),
        containment=Containment(roots=(str(tmp_path),)),
    )
    d = engine.evaluate(proposal(read_file, path="a.txt"), run_ctx)
    assert [(c.layer, c.decision, c.rule_id, c.reason) for c in d.checks] == [
        ("manifest", Decision.ALLOW, "manifest", ""),
        ("containment", Decision.ALLOW, "containment", ""),
        ("allowlist", Decision.ALLOW, "allowlist", ""),
        ("scopes", Decision.ALLOW, "scopes", ""),
        ("classification", Decision.ALLOW, "classification", ""),
        ("policy", Decision.ALLOW, "policy:default", ""),
        ("limits", Decision.ALLOW, "reads", ""),
    ]


def test_each_layer_denies_under_its_own_name_and_says_why() -> None:
    def denial(d: PolicyDecision) -> tuple[str, str, str, bool]:
        (check,) = [c for c in d.checks if c.decision is Decision.DENY]
        return check.layer, check.rule_id, check.reason, d.absolute

    call = proposal(refund, order_id="A", amount=5)
    read_file, _, _ = file_tools()
    twice = Engine(Policy(limits=(Limit(id="twice", tools=("refund",), max_calls=2),)))
    done_twice = CallHistory(succeeded=(("refund", {}),) * 2)
    unscoped = ctx(principal=Principal.user("u", scopes=("files:read",)))
    cases = [
        (decide(None, call), ("manifest", "manifest", "refund is not in the run's manifest")),
        (
            decide(refund, call, ctx(tools=("lookup_*", "search"))),
            (
                "allowlist",
                "allowlist",
                "refund is not on this run's tool allowlist (lookup_*, search)",
            ),
        ),
        (
            decide(refund, call, unscoped),
            (
                "scopes",
                "scope:payments:refund",
                "user:u@default has not delegated scope payments:refund to this run",
            ),
        ),
        (
            decide(read_medical, proposal(read_medical, patient="p")),
            (
                "classification",
                "classification",
                "read_medical handles restricted data; this run is cleared up to internal",
            ),
        ),
        (
            Engine().evaluate(
                proposal(read_file, path="a.txt"), ctx(principal=Principal.user("u", scopes=("*",)))
            ),
            ("containment", "containment", "read_file: no containment configured"),
        ),
    ]
    for decision, (layer, rule_id, reason) in cases:
        assert denial(decision) == (layer, rule_id, reason, True)  # no approval widens these
    assert denial(twice.evaluate(call, ctx(), history=done_twice)) == (
        "limits",
        "twice",
        "rate limit: 2 of 2 calls used",
        False,
    )
    assert denial(Engine(Policy(default=Decision.DENY)).evaluate(call, ctx())) == (
        "policy",
        "policy:default",
        "no rule allows this call",
        False,
    )


def test_every_covering_limit_is_counted_after_one_denies() -> None:
    limits = (
        Limit(id="spend", tools=("refund",), sum_of="amount", max_total=100),
        Limit(id="twice", tools=("refund",), max_calls=2, sum_of="amount"),  # counts calls only
        Limit(id="spend-again", tools=("refund",), sum_of="amount", max_total=100),
    )
    history = CallHistory(succeeded=(("refund", {"amount": 1}),) * 2)
    d = Engine(Policy(limits=limits)).evaluate(
        proposal(refund, order_id="A", amount=500), ctx(), history=history
    )
    assert d.decision is Decision.DENY and d.rule_ids == ("spend", "twice", "spend-again")


def test_a_call_without_the_budgeted_argument_spends_nothing() -> None:
    engine = Engine(
        Policy(limits=(Limit(id="spend", tools=("refund",), sum_of="amount", max_total=10),))
    )
    history = CallHistory(
        succeeded=(*(("refund", {"order_id": o}) for o in "BCD"), ("refund", {"amount": 8}))
    )
    assert engine.evaluate(proposal(refund, order_id="A", amount=2), ctx(), history=history).allowed
    assert engine.evaluate(proposal(refund, order_id="A"), ctx(), history=history).allowed


def test_budget_amounts_add_up_exactly_past_the_usual_decimal_precision() -> None:
    engine = Engine(
        Policy(limits=(Limit(id="spend", tools=("refund",), sum_of="amount", max_total=1000),))
    )
    history = CallHistory(
        succeeded=(("refund", {"amount": Decimal("999.999999999999999999999999999")}),)
    )
    tiny = Decimal("0.000000000000000000000000002")  # 1000.000…001 in all: over the limit
    d = engine.evaluate(proposal(refund, order_id="A", amount=tiny), ctx(), history=history)
    assert d.decision is Decision.DENY and d.rule_ids == ("spend",)


def test_an_amount_that_is_not_a_number_is_named_in_the_denial() -> None:
    engine = Engine(Policy(limits=POLICY.limits))
    d = engine.evaluate(proposal(refund, order_id="A", amount="ten"), ctx())
    assert d.reasons == (
        "budget refund-budget: amount='ten' is not a finite number, so it cannot be counted "
        "against the limit",
    )


def test_a_rule_applied_because_it_fails_closed_says_which_conditions_were_unclear() -> None:
    rule = Rule(
        id="big",
        tools=("refund",),
        decision=Decision.REQUIRE_APPROVAL,
        approver_role="finance",
        reason="refunds over 100 need finance",
        when=conditions({"amount": {"gt": 100}, "order_id": {"glob": "A*"}}),
    )
    d = Engine(Policy(rules=(rule,))).evaluate(proposal(refund, order_id=7, amount="lots"), ctx())
    assert d.reasons == (
        "refunds over 100 need finance (applied: cannot tell whether amount gt 100 for "
        "amount='lots'; order_id glob 'A*' for order_id=7)",
    )


def test_several_constrain_rules_keep_the_tightest_of_each_constraint() -> None:
    loose = {"max_amount": 100, "min_amount": 1, "currency_in": ["EUR", "USD"], "note": "a"}
    tight = {"max_amount": 50, "min_amount": 5, "currency_in": ["USD", "GBP"], "note": "b"}
    rules = tuple(
        Rule(id=f"r{i}", decision=Decision.CONSTRAIN, constraints=c)
        for i, c in enumerate((loose, tight))
    )
    d = Engine(Policy(rules=rules)).evaluate(proposal(refund, order_id="A", amount=20), ctx())
    assert d.decision is Decision.CONSTRAIN
    assert d.constraints == {"max_amount": 50, "min_amount": 5, "currency_in": ["USD"], "note": "b"}
    tight_first = Engine(Policy(rules=rules[::-1])).evaluate(
        proposal(refund, order_id="A", amount=20), ctx()
    )
    assert tight_first.constraints == {
        **d.constraints,
        "note": "a",
    }  # unknown: the later word stands


def test_a_repeated_write_needs_the_policy_s_approver_and_a_repeated_read_does_not() -> None:
    read_file, _, _ = file_tools()
    engine = Engine(Policy(repeat_writes=2, repeat_approver_role="ops"))
    # Arguments in another key order and not plain JSON are still the same call.
    done = CallHistory(succeeded=(("refund", {"amount": Decimal("5"), "order_id": "A"}),) * 2)
    d = engine.evaluate(proposal(refund, order_id="A", amount=Decimal("5")), ctx(), history=done)
    assert d.decision is Decision.REQUIRE_APPROVAL and d.approver_roles == ("ops",)
    (check,) = [c for c in d.checks if c.decision is Decision.REQUIRE_APPROVAL]
    assert (check.layer, check.rule_id, check.reason) == (
        "limits",
        "repeat_writes",
        "the same call to refund (same arguments) already succeeded 2 times in this run; "
        "a person must approve another",
    )
    reads = CallHistory(succeeded=(("read_file", {"path": "a.txt"}),) * 5)
    confined = ctx(
        principal=Principal.user("u", scopes=("*",)), containment=Containment(roots=("/tmp",))
    )
    assert engine.evaluate(proposal(read_file, path="a.txt"), confined, history=reads).allowed


def test_a_path_needs_its_access_from_the_run_s_containment_and_the_tool_s_own(
    tmp_path: Path,
) -> None:
    rw, ro = tmp_path / "rw", tmp_path / "ro"
    (rw / "sub").mkdir(parents=True)
    ro.mkdir()
    run_ctx = ctx(
        principal=Principal.user("u", scopes=("*",)),
        containment=Containment(roots=(str(rw),), read_only=(str(ro),)),
    )
    _, write_file, _ = file_tools()
    d = Engine().evaluate(proposal(write_file, path=str(ro / "x"), content=""), run_ctx)
    (check,) = [c for c in d.checks if c.decision is Decision.DENY]
    assert (check.layer, check.rule_id, d.absolute) == ("containment", "containment:path", True)
    # The tool's own walls: writes only under rw/sub, reads anywhere in rw.
    read_own, write_own, _ = file_tools(roots=(str(rw / "sub"),), read_only=(str(rw),))
    assert Engine().evaluate(proposal(read_own, path=str(rw / "x")), run_ctx).allowed
    assert (
        Engine()
        .evaluate(proposal(write_own, path=str(rw / "sub" / "x"), content=""), run_ctx)
        .allowed
    )
    outside = Engine().evaluate(proposal(write_own, path=str(rw / "x"), content=""), run_ctx)
    assert outside.decision is Decision.DENY and outside.rule_ids == ("containment:path",)
