"""Policy fails closed in live runs: amounts compare as exact decimals from the tool's validated
arguments (a Decimal or a numeric string is still a number), a value that cannot be compared
makes a restricting rule apply and an allowing rule not, budgets never count a word as nothing,
and the same write call repeated in a run needs a person's approval after the second."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import pytest

from contextos import Agent, RunStatus, Runtime, tool
from contextos import events as ev
from contextos.policy import Decision, Limit, Policy, Principal, Rule
from contextos.policy.rules import conditions
from contextos.testing import ScriptedModel, call_tool, reply

BOB = Principal.user("bob")
done: list[tuple[str, object]] = []


@tool(effect="irreversible", risk="high", description="Refund an amount (a decimal) on an order.")
def refund(order_id: str, amount: Decimal) -> str:
    done.append(("refund", amount))
    return "refunded"


@tool(effect="irreversible", risk="high", description="Refund an amount (as text) on an order.")
def refund_text(order_id: str, amount: str) -> str:
    done.append(("refund_text", amount))
    return "refunded"


@tool(effect="write", description="Set a customer's credit limit (none: unlimited).")
def set_limit(customer: str, limit: int | None = None) -> str:
    done.append(("set_limit", limit))
    return "set"


@tool(effect="write", description="Send an e-mail.")
def send_email(to: str, body: str) -> str:
    done.append(("send_email", (to, body)))
    return "sent"


@pytest.fixture(autouse=True)
def _reset() -> None:
    done.clear()


def agent(*steps: object, tools: list[object]) -> Agent:
    return Agent(
        name="agent",
        model=ScriptedModel(list(steps), by_turn=True),  # type: ignore[arg-type]
        tools=tools,  # type: ignore[arg-type]
    )


def approval_over_100(tools: tuple[str, ...]) -> Rule:
    return Rule(
        id="over-100",
        tools=tools,
        decision=Decision.REQUIRE_APPROVAL,
        approver_role="finance",
        when=conditions({"amount": {"gt": 100}}),
    )


@pytest.mark.parametrize(
    ("tool_name", "amount"),
    [("refund", "5000"), ("refund", 5000), ("refund", "100.01"), ("refund_text", "5000")],
)
async def test_decimal_and_string_amounts_trigger_the_approval(
    tmp_path: Path, tool_name: str, amount: object
) -> None:
    policy = Policy(rules=(approval_over_100(("refund*",)),), roles={"finance": ("alice",)})
    a = agent(
        call_tool(tool_name, {"order_id": "A-1", "amount": amount}),
        reply("done"),
        tools=[refund, refund_text],
    )
    async with Runtime(str(tmp_path / "runs.db"), policy=policy) as rt:
        result = await rt.run(a, "refund", principal=BOB)
        assert result.status is RunStatus.INPUT_REQUIRED
        (pending,) = await rt.inbox()
        assert pending.payload["rule_ids"] == ["over-100"]
    assert done == []


async def test_an_amount_at_the_threshold_compares_exactly(tmp_path: Path) -> None:
    policy = Policy(rules=(approval_over_100(("refund",)),), roles={"finance": ("alice",)})
    a = agent(
        call_tool("refund", {"order_id": "A-1", "amount": "100.00"}),
        call_tool("refund", {"order_id": "A-2", "amount": "100.0000000000000000000000000001"}),
        reply("done"),
        tools=[refund],
    )
    async with Runtime(str(tmp_path / "runs.db"), policy=policy) as rt:
        result = await rt.run(a, "refund", principal=BOB)
        # 100.00 is not over 100 and runs; a hair over 100 (lost in a float) asks a person
        assert result.status is RunStatus.INPUT_REQUIRED
    assert done == [("refund", Decimal("100.00"))]


async def test_a_value_that_cannot_be_compared_makes_a_restricting_rule_apply(
    tmp_path: Path,
) -> None:
    policy = Policy(
        rules=(
            approval_over_100(("refund_text",)),
            Rule(
                id="no-big-limits",
                tools=("set_limit",),
                decision=Decision.DENY,
                when=conditions({"limit": {"gt": 10_000}}),
                reason="credit limits over 10000 are not allowed",
            ),
        ),
        roles={"finance": ("alice",)},
    )
    a = agent(
        call_tool("set_limit", {"customer": "c1", "limit": None}),  # null: unlimited
        call_tool("set_limit", {"customer": "c1", "limit": 500}),
        call_tool("refund_text", {"order_id": "A-1", "amount": "five thousand"}),
        reply("done"),
        tools=[set_limit, refund_text],
    )
    async with Runtime(str(tmp_path / "runs.db"), policy=policy) as rt:
        result = await rt.run(a, "go", principal=BOB)
        assert result.status is RunStatus.INPUT_REQUIRED
        events = await rt.events(result.run_id)
        (pending,) = await rt.inbox()
    denied, allowed = [e for e in events if isinstance(e, ev.ToolCompleted)]
    assert denied.error_code == "policy_denied"
    assert "cannot tell whether limit gt 10000 for limit=None" in denied.output
    assert allowed.is_error is False
    assert pending.payload["rule_ids"] == ["over-100"]
    assert "cannot tell whether amount gt 100" in pending.payload["reasons"][0]
    assert done == [("set_limit", 500)]


async def test_an_allowing_rule_allows_only_what_it_can_evaluate(tmp_path: Path) -> None:
    policy = Policy(
        default=Decision.DENY,
        rules=(
            Rule(
                id="small-refunds",
                tools=("refund_text",),
                decision=Decision.ALLOW,
                when=conditions({"amount": {"le": 100}}),
            ),
        ),
    )
    a = agent(
        call_tool("refund_text", {"order_id": "A-1", "amount": "a little"}),
        call_tool("refund_text", {"order_id": "A-1", "amount": "99.99"}),
        reply("done"),
        tools=[refund_text],
    )
    async with Runtime(str(tmp_path / "runs.db"), policy=policy) as rt:
        result = await rt.run(a, "go", principal=BOB)
        events = await rt.events(result.run_id)
    assert result.status is RunStatus.COMPLETED
    refused, ran = [e for e in events if isinstance(e, ev.ToolCompleted)]
    assert refused.error_code == "policy_denied" and ran.is_error is False
    assert done == [("refund_text", "99.99")]


async def test_a_budget_never_counts_what_it_cannot_read_as_nothing(tmp_path: Path) -> None:
    policy = Policy(
        limits=(Limit(id="budget", tools=("refund*",), sum_of="amount", max_total=1000),),
    )
    a = agent(
        call_tool("refund_text", {"order_id": "A-1", "amount": "everything"}),
        call_tool("refund", {"order_id": "A-2", "amount": "999.99"}),
        call_tool("refund_text", {"order_id": "A-3", "amount": "0.02"}),
        call_tool("refund_text", {"order_id": "A-4", "amount": "0.01"}),
        reply("done"),
        tools=[refund, refund_text],
    )
    async with Runtime(str(tmp_path / "runs.db"), policy=policy) as rt:
        result = await rt.run(a, "go", principal=BOB)
        events = await rt.events(result.run_id)
    assert result.status is RunStatus.COMPLETED
    outcomes = [e.error_code for e in events if isinstance(e, ev.ToolCompleted)]
    assert outcomes == ["policy_denied", None, "policy_denied", None]
    assert done == [("refund", Decimal("999.99")), ("refund_text", "0.01")]


# -- the same write call again ----------------------------------------------------------------


async def test_the_third_identical_write_call_needs_an_approval(tmp_path: Path) -> None:
    same = {"to": "ann@example.com", "body": "Your refund is on its way."}
    other = {"to": "ben@example.com", "body": "Your refund is on its way."}
    a = agent(
        call_tool("send_email", same),
        call_tool("send_email", same),
        call_tool("send_email", other),  # different arguments: not a repeat
        call_tool("send_email", same),  # the third identical call
        reply("done"),
        tools=[send_email],
    )
    db = str(tmp_path / "runs.db")
    async with Runtime(db, policy=Policy()) as rt:
        result = await rt.run(a, "tell them", principal=BOB)
        assert result.status is RunStatus.INPUT_REQUIRED
        (pending,) = await rt.inbox()
        assert pending.kind == "approval_required"
        assert pending.payload["rule_ids"] == ["repeat_writes"]
        assert "already succeeded 2 times" in pending.payload["reasons"][0]
        assert [args for _, args in done] == [tuple(same.values())] * 2 + [tuple(other.values())]
        await rt.approve(pending.id, approver="alice")
    # a new process: the count comes from the run's log, so the approval is what lets it run
    async with Runtime(db, policy=Policy()) as rt:
        resumed = await rt.resume(result.run_id, a)
    assert resumed.status is RunStatus.COMPLETED
    assert [args for _, args in done].count(tuple(same.values())) == 3


async def test_the_repeat_guard_can_be_turned_off(tmp_path: Path) -> None:
    same = {"to": "ann@example.com", "body": "hello"}
    a = agent(*[call_tool("send_email", same)] * 3, reply("done"), tools=[send_email])
    async with Runtime(str(tmp_path / "runs.db"), policy=Policy(repeat_writes=0)) as rt:
        result = await rt.run(a, "tell them", principal=BOB)
    assert result.status is RunStatus.COMPLETED and len(done) == 3
