"""Findings from real logs: each kind of failure, clustered across runs, lands on the rung of
the promotion ladder that owns it; a pattern seen in one run only is not yet a finding."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from contextos import Agent, Budget, Policy, Rule, Runtime, tool
from contextos.improve import FindingKind, Improvements, Layer, RootCause, findings_job
from contextos.models.base import ModelResponse
from contextos.policy import Decision
from contextos.testing import ScriptedModel, call_tool, reply
from contextos.workers import add_schedule
from contextos.workers.scheduler import fire_schedules


@tool(effect="write", description="Refund an order.")
def refund(order_id: str) -> str:
    return f"refunded {order_id}"


def count(n: int) -> int:
    """Count to n."""
    return n


def agent(*steps: ModelResponse, **options: Any) -> Agent:
    return Agent(
        name="clerk",
        model=ScriptedModel(list(steps)),
        tools=(refund, count),
        **options,
    )


NO_REFUNDS = Policy(
    name="shop",
    rules=(Rule(id="no-refunds", tools=("refund",), decision=Decision.DENY, reason="no"),),
)


def denied() -> Agent:
    return agent(call_tool("refund", {"order_id": "A-1"}), reply("I cannot refund."))


def exhausted() -> Agent:
    return agent(call_tool("count", {"n": 1}), budget=Budget(max_turns=1))


def rejected() -> Agent:
    budget = Budget(max_verification_attempts=1)
    return agent(reply("maybe"), reply("perhaps"), verifier=says_done, budget=budget)


def corrected() -> Agent:
    """Rejected, then right once the check's gaps were written back: it was never told."""
    return agent(reply("maybe"), reply("yes, done"), verifier=says_done)


def says_done(answer: str) -> list[str]:
    return [] if "done" in answer else ["say done"]


def off_schema() -> Agent:
    return agent(call_tool("count", {"n": "many"}), reply("I could not count."))


K, C, L = FindingKind, RootCause, Layer
CASES = [
    (denied, K.POLICY_DENIED, C.INSTRUCTIONS, L.SCOPED_INSTRUCTION, "refund"),
    (exhausted, K.BUDGET_EXHAUSTED, C.RUN_CONSTRAINT, L.RUN_CONSTRAINT, "budget"),
    (rejected, K.VERIFICATION_FAILED, C.VERIFIER, L.GATE, "says_done"),
    (corrected, K.VERIFICATION_FAILED, C.INSTRUCTIONS, L.SCOPED_INSTRUCTION, "says_done"),
    (off_schema, K.INVALID_ARGUMENTS, C.TOOL_CONTRACT, L.TOOL_CONTRACT, "count"),
]


@pytest.mark.parametrize(("make", "kind", "cause", "layer", "subject"), CASES)
async def test_each_kind_of_failure_lands_on_its_rung(
    tmp_path: Path,
    make: Callable[[], Agent],
    kind: FindingKind,
    cause: RootCause,
    layer: Layer,
    subject: str,
) -> None:
    async with Runtime(str(tmp_path / "c.db"), policy=NO_REFUNDS) as rt:
        first = await rt.run(make(), "go")
        loop = Improvements(rt)
        assert (await loop.scan()).findings == []  # one run is not a pattern yet
        second = await rt.run(make(), "go")
        review = await loop.scan()
    [finding] = review.findings
    assert (finding.kind, finding.root_cause, finding.subject) == (kind, cause, subject)
    assert finding.runs == (first.run_id, second.run_id)
    assert finding.recovered == (2 if make is corrected else 0)
    [proposal] = review.proposals
    assert proposal.layer is layer
    assert proposal.finding_id == finding.finding_id
    if make is corrected:  # the instruction says what the check wrote back
        assert proposal.change.endswith("the first time: say done")


async def test_the_findings_job_runs_on_a_schedule(tmp_path: Path) -> None:
    """The job is a workflow a schedule starts like any agent; its output is the findings."""
    db = str(tmp_path / "c.db")
    async with Runtime(db, policy=NO_REFUNDS) as rt:
        for _ in range(2):
            await rt.run(denied(), "go")
        schedule = await add_schedule(
            rt.store,
            "findings",
            "contextos.improve:findings_job",
            "0 6 * * *",
            input=f'{{"store": "{db}"}}',
        )
        [fired] = await fire_schedules(rt, now=schedule.next_tick_at)
        [(_, run_id)] = fired.runs
        done = await rt.resume(run_id, findings_job)
        assert done.status.value == "completed"
        [finding] = (await Improvements(rt).review()).findings
    assert finding.kind is FindingKind.POLICY_DENIED
