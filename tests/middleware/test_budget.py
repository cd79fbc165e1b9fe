"""The budget gate: a call over any cap ends the run and never reaches the model."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from contextos import Agent, ConfigError, FailureReason, Principal, RunStatus, Runtime
from contextos import events as ev
from contextos.middleware import BudgetGate, StoreDailySpend
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

    with pytest.raises(ConfigError):
        Chain([BudgetGate(daily_tokens=10)], model=ScriptedModel([]))


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
