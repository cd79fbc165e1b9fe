"""The budget gate: a call over any cap ends the run and never reaches the model."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from contextos import Agent, ConfigError, FailureReason, Principal, RunStatus, Runtime
from contextos import events as ev
from contextos.messages import FinishReason, Message, Usage
from contextos.middleware import BudgetGate, StoreDailySpend, daily_spend_of, stack_identity
from contextos.models.base import ModelResponse
from contextos.testing import ScriptedModel, reply


async def test_a_call_over_the_run_cap_never_reaches_the_model(tmp_path: Path) -> None:
    model = ScriptedModel([reply("never")])
    gate = BudgetGate(run_tokens=100, reserve_output_tokens=50)
    agent = Agent(name="a", model=model, middleware=[gate])
    async with Runtime(str(tmp_path / "r.db")) as rt:
        result = await rt.run(agent, "x" * 400)  # ~100 input tokens + 50 reserved > 100
        events = await rt.events(result.run_id)
    assert model.requests == []
    assert result.status is RunStatus.FAILED
    assert result.failure_reason is FailureReason.BUDGET_EXHAUSTED
    failed = events[-1]
    assert isinstance(failed, ev.RunFailed) and failed.error["layer"] == "budget"


async def test_max_model_calls_is_a_ceiling(tmp_path: Path) -> None:
    from contextos.testing import call_tool

    def ping() -> str:
        """Ping."""
        return "pong"

    model = ScriptedModel([call_tool("ping"), call_tool("ping"), reply("done")])
    agent = Agent(name="a", model=model, tools=[ping], middleware=[BudgetGate(max_model_calls=2)])
    async with Runtime(str(tmp_path / "r.db")) as rt:
        result = await rt.run(agent, "go")
    assert len(model.requests) == 2
    assert result.failure_reason is FailureReason.BUDGET_EXHAUSTED


async def test_the_daily_cap_per_principal_spans_runs_and_is_kept_in_the_store(
    backend_url: str,
) -> None:
    model = ScriptedModel(
        [reply("one", input_tokens=300, output_tokens=100), reply("two"), reply("other")]
    )
    gate = BudgetGate(daily_tokens=500, reserve_output_tokens=10)
    agent = Agent(name="a", model=model, middleware=[gate])
    alice = Principal.user("alice", tenant="acme")
    async with Runtime(backend_url) as rt:
        first = await rt.run(agent, "hi", principal=alice)
        second = await rt.run(agent, "x" * 400, principal=alice)  # 400 spent + ~110 > 500
        bob = await rt.run(agent, "hi", principal=Principal.user("bob", tenant="acme"))
        today = datetime.now(UTC).date()
        spent = await StoreDailySpend(rt.store).spent(alice.ref, today)  # type: ignore[arg-type]
    assert first.status is RunStatus.COMPLETED
    assert second.failure_reason is FailureReason.BUDGET_EXHAUSTED
    assert bob.status is RunStatus.COMPLETED  # another principal has its own budget
    assert len(model.requests) == 2
    assert (spent.tokens, spent.calls) == (400, 1)


async def test_daily_caps_need_a_store_that_keeps_the_ledger() -> None:
    from contextos.middleware import Chain

    with pytest.raises(ConfigError) as refused:
        Chain([BudgetGate(daily_tokens=10)], model=ScriptedModel([]))
    assert refused.value.to_dict() == {
        "code": "config_error",
        "message": "the budget gate has daily caps but the store keeps no daily usage counters",
        "layer": "budget",
    }


async def test_only_a_store_that_counts_daily_usage_lends_the_gate_its_spend(
    tmp_path: Path,
) -> None:
    assert daily_spend_of(object()) is None  # a store of one's own without the counters
    async with Runtime(str(tmp_path / "r.db")) as rt:
        assert isinstance(daily_spend_of(rt.store), StoreDailySpend)


async def test_the_daily_cap_is_charged_to_the_bound_principal_never_to_labels(
    tmp_path: Path,
) -> None:
    model = ScriptedModel([reply("one", input_tokens=300, output_tokens=100)])
    gate = BudgetGate(daily_tokens=500, reserve_output_tokens=10)
    agent = Agent(name="a", model=model, middleware=[gate])
    alice = Principal.user("alice", tenant="acme")
    async with Runtime(str(tmp_path / "r.db")) as rt:
        # A caller cannot name whom a run is charged to, nor run capped work bound to no one.
        with pytest.raises(ConfigError, match="set by the runtime"):
            await rt.run(agent, "hi", principal=alice, metadata={"principal": "someone-else"})
        with pytest.raises(ConfigError, match="none bound"):
            await rt.run(agent, "hi", metadata={"tenant_id": "acme", "user_id": "alice"})
        first = await rt.run(agent, "hi", principal=alice)
        today = datetime.now(UTC).date()
        charged = await StoreDailySpend(rt.store).spent(alice.ref, today)  # type: ignore[arg-type]
        labelled = await StoreDailySpend(rt.store).spent("acme/alice", today)  # type: ignore[arg-type]
    assert first.status is RunStatus.COMPLETED
    assert (charged.tokens, labelled.tokens) == (400, 0)


async def test_the_daily_call_cap_allows_exactly_that_many_calls(tmp_path: Path) -> None:
    model = ScriptedModel([reply("one"), reply("two"), reply("never")])
    agent = Agent(name="a", model=model, middleware=[BudgetGate(daily_calls=2)])
    alice = Principal.user("alice", tenant="acme")
    async with Runtime(str(tmp_path / "r.db")) as rt:
        results = [await rt.run(agent, "hi", principal=alice) for _ in range(3)]
    assert [r.status for r in results] == [RunStatus.COMPLETED] * 2 + [RunStatus.FAILED]
    assert results[2].failure_reason is FailureReason.BUDGET_EXHAUSTED
    assert len(model.requests) == 2


async def test_a_call_that_exactly_fits_the_run_cap_reaches_the_model(tmp_path: Path) -> None:
    async def run_under(cap: int) -> tuple[RunStatus, list[ev.Event]]:
        agent = Agent(
            name="a", model=ScriptedModel([reply("fits")]), middleware=[BudgetGate(run_tokens=cap)]
        )
        async with Runtime(str(tmp_path / f"r{cap}.db")) as rt:
            result = await rt.run(agent, "x" * 400)
            return result.status, await rt.events(result.run_id)

    # What the call needs as the gate (outermost) sees it: ~100 tokens of task plus the
    # default reserve of 512 for the answer.
    needed = 100 + 512
    _, events = await run_under(10_000)
    responded = next(e for e in events if isinstance(e, ev.ModelResponded))
    assert responded.context["telemetry"] == {"budget.estimate": needed}

    fits, events = await run_under(needed)
    assert fits is RunStatus.COMPLETED
    assert any(isinstance(e, ev.ModelResponded) for e in events)
    over, events = await run_under(needed - 1)
    assert over is RunStatus.FAILED
    assert not any(isinstance(e, ev.ModelResponded) for e in events)


async def test_a_call_that_exactly_fits_the_daily_token_cap_reaches_the_model(
    tmp_path: Path,
) -> None:
    model = ScriptedModel(
        [reply("one", input_tokens=300, output_tokens=100), reply("two"), reply("never")]
    )
    # 400 spent by the first run, then ~100 input + 10 reserved: exactly the cap.
    gate = BudgetGate(daily_tokens=400 + 110, reserve_output_tokens=10)
    agent = Agent(name="a", model=model, middleware=[gate])
    alice = Principal.user("alice", tenant="acme")
    async with Runtime(str(tmp_path / "r.db")) as rt:
        results = [await rt.run(agent, "x" * 400, principal=alice) for _ in range(3)]
    assert [r.status for r in results] == [RunStatus.COMPLETED] * 2 + [RunStatus.FAILED]
    assert results[2].failure_reason is FailureReason.BUDGET_EXHAUSTED
    assert len(model.requests) == 2


def priced(text: str, cost_usd: float) -> ModelResponse:
    """An answer from a model that reports what the call cost."""
    return ModelResponse(
        message=Message(role="assistant", content=text),
        finish_reason=FinishReason.STOP,
        usage=Usage(input_tokens=10, output_tokens=5, requests=1, cost_usd=cost_usd),
        model="scripted",
    )


async def test_the_daily_cost_cap_refuses_once_the_money_is_spent(backend_url: str) -> None:
    model = ScriptedModel([priced("one", 0.5), priced("two", 0.5), priced("never", 0.5)])
    agent = Agent(name="a", model=model, middleware=[BudgetGate(daily_cost_usd=1.0)])
    alice = Principal.user("alice", tenant="acme")
    async with Runtime(backend_url) as rt:
        results = [await rt.run(agent, "hi", principal=alice) for _ in range(3)]
        events = await rt.events(results[2].run_id)
        today = datetime.now(UTC).date()
        spent = await StoreDailySpend(rt.store).spent(alice.ref, today)  # type: ignore[arg-type]
    assert [r.status for r in results] == [RunStatus.COMPLETED] * 2 + [RunStatus.FAILED]
    assert results[2].failure_reason is FailureReason.BUDGET_EXHAUSTED
    assert len(model.requests) == 2
    assert spent.cost_usd == 1.0
    failed = events[-1]
    assert isinstance(failed, ev.RunFailed)
    assert failed.message == f"{alice.ref} spent $1.0000 of the daily $1.0000"


def test_every_cap_enters_the_agent_identity_under_a_stable_name() -> None:
    # A run resumes only under the identity hash it started with: renaming a field here would
    # leave every run in flight unable to resume after an upgrade.
    gate = BudgetGate(
        run_tokens=1,
        max_model_calls=2,
        daily_tokens=3,
        daily_calls=4,
        daily_cost_usd=5.0,
        reserve_output_tokens=6,
    )
    assert stack_identity([gate]) == [
        {
            "layer": "budget",
            "platform": True,
            "run_tokens": 1,
            "max_model_calls": 2,
            "daily_tokens": 3,
            "daily_calls": 4,
            "daily_cost_usd": 5.0,
            "reserve_output_tokens": 6,
        }
    ]
