"""A model's tool arguments are outside input: non-finite numbers, nesting past the depth limit
and text past the size limit go back to the model as a correctable error, and its next (fixed)
call proceeds. None of them reaches policy, a limit or the frozen action's hash."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from contextos import Agent, RunStatus, Runtime, tool
from contextos import events as ev
from contextos.policy import Decision, Limit, Policy, Principal, Rule
from contextos.policy.rules import conditions
from contextos.testing import ScriptedModel, call_tool, reply

refunded: list[float] = []
stored: list[object] = []


@tool(effect="irreversible", risk="high", description="Refund an amount in EUR on an order.")
def refund(order_id: str, amount: float) -> str:
    refunded.append(amount)
    return f"refunded {amount}"


@tool(effect="write", description="Store a document.")
def store(document: Any) -> str:
    stored.append(document)
    return "stored"


@tool(effect="write", description="Store a large document.", max_arg_bytes=1024 * 1024)
def store_large(document: Any) -> str:
    stored.append(document)
    return "stored"


POLICY = Policy(
    rules=(
        Rule(
            id="refund-over-100",
            tools=("refund",),
            decision=Decision.REQUIRE_APPROVAL,
            approver_role="finance",
            when=conditions({"amount": {"gt": 100}}),
        ),
    ),
    limits=(Limit(id="refund-budget", tools=("refund",), sum_of="amount", max_total=1000),),
    roles={"finance": ("alice",)},
)


@pytest.fixture(autouse=True)
def _reset() -> None:
    refunded.clear()
    stored.clear()


def completed(events: list[ev.Event]) -> list[ev.ToolCompleted]:
    return [e for e in events if isinstance(e, ev.ToolCompleted)]


async def run(tmp_path: Path, *steps: object, tools: list[object]) -> tuple[Any, list[ev.Event]]:
    agent = Agent(
        name="agent",
        model=ScriptedModel(list(steps)),  # type: ignore[arg-type]
        tools=tools,  # type: ignore[arg-type]
    )
    async with Runtime(str(tmp_path / "runs.db"), policy=POLICY) as rt:
        result = await rt.run(agent, "go", principal=Principal.user("bob"))
        return result, await rt.events(result.run_id)


@pytest.mark.parametrize(
    "arguments",
    [
        '{"order_id": "A-1", "amount": NaN}',
        '{"order_id": "A-1", "amount": Infinity}',
        '{"order_id": "A-1", "amount": -Infinity}',
        '{"order_id": "A-1", "amount": 1e400}',
        '{"order_id": "A-1", "amount": "nan"}',
        '{"order_id": "A-1", "amount": "-inf"}',
    ],
)
async def test_non_finite_numbers_go_back_to_the_model(tmp_path: Path, arguments: str) -> None:
    result, events = await run(
        tmp_path,
        call_tool("refund", arguments),
        call_tool("refund", {"order_id": "A-1", "amount": 50}),
        reply("refunded"),
        tools=[refund],
    )
    assert result.status is RunStatus.COMPLETED
    first, second = completed(events)
    assert first.error_code == "invalid_arguments"
    assert "not a finite number" in first.output
    assert second.is_error is False
    assert refunded == [50]
    # the refused call never reached policy: only the fixed one was decided on
    decided = [e for e in events if isinstance(e, ev.PolicyDecided)]
    assert [d.call_id for d in decided] == [second.call_id]


def nested(depth: int) -> str:
    return '{"document": ' + "[" * (depth - 1) + "]" * (depth - 1) + "}"


@pytest.mark.parametrize("depth", [33, 1_000, 100_000])
async def test_arguments_nested_too_deep_are_a_correctable_error(
    tmp_path: Path, depth: int
) -> None:
    result, events = await run(
        tmp_path,
        call_tool("store", nested(depth)),
        call_tool("store", nested(32)),
        reply("stored"),
        tools=[store],
    )
    assert result.status is RunStatus.COMPLETED
    first, second = completed(events)
    assert first.error_code == "invalid_arguments"
    assert "nested more than 32 levels deep" in first.output
    assert second.is_error is False and len(stored) == 1


async def test_arguments_past_the_size_limit_are_a_correctable_error(tmp_path: Path) -> None:
    big = json.dumps({"document": "x" * (300 * 1024)})
    result, events = await run(
        tmp_path,
        call_tool("store", big),
        call_tool("store_large", big),
        reply("stored"),
        tools=[store, store_large],
    )
    assert result.status is RunStatus.COMPLETED
    first, second = completed(events)
    assert first.error_code == "invalid_arguments"
    assert "more than 262144 bytes" in first.output
    # the limit is part of the tool's contract: a tool that declares a larger one takes it
    assert second.is_error is False and stored == ["x" * (300 * 1024)]


async def test_an_integer_too_long_to_read_is_a_correctable_error(tmp_path: Path) -> None:
    result, events = await run(
        tmp_path,
        call_tool("store", '{"document": ' + "9" * 5_000 + "}"),
        call_tool("store", {"document": 9}),
        reply("stored"),
        tools=[store],
    )
    assert result.status is RunStatus.COMPLETED
    first, second = completed(events)
    assert first.error_code == "invalid_arguments"
    assert "cannot be read" in first.output
    assert second.is_error is False and stored == [9]
