"""Canaries: a release that serves a fraction of new runs (picked by run id), judged on those
runs' logs on the criteria its release names, each measured on both arms, and rolled back (a
recorded decision) when one fails."""

from __future__ import annotations

import math
from datetime import timedelta
from pathlib import Path

import pytest
from orders import desk
from test_improve_cli import cli_for
from test_improvement_loop import REF, seed

from contextos import Agent, RunStatus, Runtime
from contextos.errors import ConfigError
from contextos.events import RunCreated
from contextos.improve import (
    Change,
    Criterion,
    Improvements,
    Watched,
    WatchRequest,
    canary_watch,
)
from contextos.improve.canary import measure, percentile
from contextos.messages import FinishReason, Message, Usage
from contextos.models.base import ModelResponse
from contextos.releases import binding_of, in_canary
from contextos.testing import ScriptedModel, reply
from contextos.workers import add_schedule
from contextos.workers.scheduler import fire_schedules


async def canary_of(
    loop: Improvements, candidate_id: str, golden: str, criteria: tuple[str, ...]
) -> str:
    report = await loop.check(candidate_id, golden=[golden])
    asked = await loop.request_release(
        candidate_id, report.report_id, releasers=("alice",), fraction=0.5, criteria=criteria
    )
    assert asked.action is not None and asked.action.arguments["fraction"] == 0.5
    assert asked.action.arguments["criteria"] == list(criteria)  # approved with the release
    done = await loop.approve(asked.id, approver="alice")
    assert (done.decision.fraction, done.decision.criteria) == (0.5, criteria)
    return done.run_id


async def serve(rt: Runtime, salt: str) -> tuple[int, int]:
    """Run order questions until both sides served a few; (canary, stable) runs. The runtime
    picks the side of each new run by its id, and its first event records which."""
    base_hash = desk().identity_hash()
    on = off = 0
    for i in range(60):
        done = await rt.run(desk(), f"Where is order {i + 10}?", run_id=f"run_ticket_{i}")
        created = (await rt.events(done.run_id))[0]
        assert isinstance(created, RunCreated)
        binding = binding_of(created.metadata)
        assert binding is not None and binding.decision == salt
        canary = in_canary(done.run_id, 0.5, salt=salt)
        assert binding.canary is canary
        assert (created.agent_hash != base_hash) is canary
        on, off = (on + 1, off) if canary else (on, off + 1)
        if on >= 3 and off >= 1:
            break
    return on, off


async def test_a_healthy_canary_is_judged_on_each_criterion_against_the_stable_arm(
    tmp_path: Path,
) -> None:
    criteria = (
        "tool_error_rate <= 0.1",
        "turns_per_run - stable <= 0",
        "verification_pass_rate >= 1",
        "cost_per_run - stable <= 0.01",
    )
    async with Runtime(str(tmp_path / "c.db")) as rt:
        _, golden = await seed(rt)
        loop = Improvements(rt)
        [proposal] = (await loop.scan()).proposals
        candidate = await loop.candidate(proposal.proposal_id)
        salt = await canary_of(loop, candidate.candidate_id, golden, criteria)
        on, off = await serve(rt, salt)
        verdict = await loop.watch("order-desk", min_runs=3)
    assert (verdict.runs, verdict.stable_runs, verdict.action) == (on, off, "healthy")
    measured = [(j.criterion.text(), j.canary, j.stable, j.passed) for j in verdict.judged]
    assert measured == [
        ("tool_error_rate <= 0.1", 0.0, 0.5, True),  # the stable arm fails its first call
        ("turns_per_run - stable <= 0", 2.0, 3.0, True),
        ("verification_pass_rate >= 1", 1.0, 1.0, True),
        ("cost_per_run - stable <= 0.01", 0.0, 0.0, True),
    ]


def test_criteria_are_read_or_refused_in_one_line() -> None:
    read = Criterion.parse("cost_per_run - stable <= 0.002")
    assert (read.metric, read.over_stable, read.at_most) == ("cost_per_run", True, 0.002)
    assert read.text() == "cost_per_run - stable <= 0.002"
    with pytest.raises(ConfigError, match="METRIC <= NUMBER") as refused:
        Criterion.parse("latency < 3")
    assert "\n" not in str(refused.value)


async def test_criteria_judge_only_a_canary(tmp_path: Path) -> None:
    async with Runtime(str(tmp_path / "c.db")) as rt:
        _, golden = await seed(rt)
        loop = Improvements(rt)
        [proposal] = (await loop.scan()).proposals
        candidate = await loop.candidate(proposal.proposal_id)
        report = await loop.check(candidate.candidate_id, golden=[golden])
        with pytest.raises(ConfigError, match="fraction below 1"):
            await loop.request_release(
                candidate.candidate_id,
                report.report_id,
                releasers=("alice",),
                criteria=("failure_rate <= 0.1",),
            )
        await canary_of(loop, candidate.candidate_id, golden, ())
        with pytest.raises(ConfigError, match="names no criteria"):
            await loop.watch("order-desk")


async def test_a_failing_canary_is_rolled_back(tmp_path: Path) -> None:
    async with Runtime(str(tmp_path / "c.db")) as rt:
        _, golden = await seed(rt)
        loop = Improvements(rt)
        vague = Change(kind="tool_description", target="lookup_order", text="Look an order up.")
        candidate = await loop.change(REF, vague)  # replays the golden run equal, fixes nothing
        report = await loop.check(candidate.candidate_id, golden=[golden])
        cli = cli_for(tmp_path)  # asked for and watched from the command line, in processes
        asked = cli(
            *("release", "request", candidate.candidate_id, report.report_id),
            *("--releaser", "alice", "--fraction", "0.5", "--criterion", "tool_error_rate<=0.2"),
        )
        assert asked.returncode == 0, asked.stderr
        [question] = await rt.inbox()
        assert question.action is not None
        assert question.action.arguments["criteria"] == ["tool_error_rate <= 0.2"]
        salt = (await loop.approve(question.id, approver="alice")).run_id
        early = await loop.watch("order-desk", min_runs=3)
        assert early.action == "wait"
        on, off = await serve(rt, salt)
        watched = cli("release", "watch", "order-desk", "--min-runs", "100")
        assert watched.returncode == 0 and "-> wait" in watched.stdout
        watched = cli(
            "release", "watch", "order-desk", "--max-failure-rate", "0.2", "--min-runs", "3"
        )
        assert watched.returncode == 1, watched.stderr
        assert f"{on} canary runs, {off} stable -> rolled_back" in watched.stdout
        failing = "tool_error_rate <= 0.2: canary 0.5, stable 0.5 -> FAILED"
        assert failing in watched.stdout
        assert "failure_rate <= 0.2: canary 1, stable 1 -> FAILED" in watched.stdout
        [*_, last] = await loop.history("order-desk")
        assert (last.decision.action, last.decision.decided_by) == ("rollback", "canary-watch")
        assert last.decision.reason.startswith(f"canary: {failing}")
        for i in range(5):  # the next runs after the rollback all run the code as it is
            done = await rt.run(desk(), f"Where is order {i}?", run_id=f"run_after_{i}")
            created = (await rt.events(done.run_id))[0]
            assert isinstance(created, RunCreated)
            assert created.agent_hash == desk().identity_hash()


async def test_each_metric_is_measured_from_the_runs_logs(tmp_path: Path) -> None:
    def must_cite(answer: str) -> list[str]:
        return [] if "[source]" in answer else ["Cite a [source]."]

    priced = ModelResponse(
        message=Message(role="assistant", content="Paris [source]."),
        finish_reason=FinishReason.STOP,
        usage=Usage(input_tokens=10, output_tokens=5, cost_usd=0.25, requests=1),
        model="scripted",
    )
    async with Runtime(str(tmp_path / "c.db")) as rt:
        runs = []
        for steps in ([reply("Paris."), priced], [priced]):
            qa = Agent(name="qa", model=ScriptedModel(steps), verifier=must_cite)
            runs.append(await rt.events((await rt.run(qa, "Capital?")).run_id))
    assert measure("verification_pass_rate", runs) == 2 / 3  # one rejected answer of three
    assert measure("failure_rate", runs) == 0.5  # the rejection is a pattern the job looks for
    assert measure("cost_per_run", runs) == 0.25
    assert measure("turns_per_run", runs) == 1.5
    assert measure("tool_error_rate", runs) is None  # no tool was called: nothing to judge
    assert measure("turns_per_run", []) is None


async def test_latency_is_judged_on_both_arms_from_the_runs_logs(tmp_path: Path) -> None:
    async with Runtime(str(tmp_path / "c.db")) as rt:
        _, golden = await seed(rt)
        loop = Improvements(rt)
        [proposal] = (await loop.scan()).proposals
        candidate = await loop.candidate(proposal.proposal_id)
        salt = await canary_of(loop, candidate.candidate_id, golden, ("p95_duration_s <= 3600",))
        await serve(rt, salt)
        arms: dict[bool, list[float]] = {True: [], False: []}
        for summary in await rt.runs(prefix="run_ticket_", limit=100):
            events = await rt.events(summary.run_id)
            binding = binding_of(events[0].metadata) if isinstance(events[0], RunCreated) else None
            if binding is not None and binding.canary is not None:
                ended = events[-1].occurred_at - events[0].occurred_at
                arms[binding.canary].append(ended.total_seconds())
        verdict = await loop.watch("order-desk", min_runs=3)
    [judged] = verdict.judged
    for arm, measured in ((True, judged.canary), (False, judged.stable)):
        durations = sorted(arms[arm])  # nearest rank: the smallest 95% of runs are within it
        assert measured == durations[math.ceil(0.95 * len(durations)) - 1]
    assert judged.passed and verdict.action == "healthy"
    assert judged.line().startswith("p95_duration_s <= 3600: canary ")


def test_latency_is_the_nearest_rank_percentile() -> None:
    assert percentile([3.0, 1.0, 2.0], 0.95) == 3.0
    assert percentile([float(n) for n in range(1, 21)], 0.95) == 19.0
    assert percentile([0.5], 0.95) == 0.5


async def test_a_schedule_fires_the_watch_and_it_rolls_a_failing_canary_back(
    tmp_path: Path,
) -> None:
    """The watch is a workflow a schedule starts like any agent: each tick judges the canary
    and rolls it back when a criterion fails, a recorded decision; with no canary, it ends."""
    db = str(tmp_path / "c.db")
    async with Runtime(db) as rt:
        _, golden = await seed(rt)
        loop = Improvements(rt)

        request = WatchRequest(store=db, agent="order-desk", min_runs=3)
        schedule = await add_schedule(
            rt.store,
            "canary-watch",
            "contextos.improve:canary_watch",
            "0 6 * * *",
            input=request.model_dump_json(),
        )
        day = schedule.next_tick_at

        async def tick() -> Watched:
            nonlocal day
            [fired] = await fire_schedules(rt, now=day)
            [(_, run_id)] = fired.runs
            day += timedelta(days=1)
            done = await rt.resume(run_id, canary_watch)
            assert done.status is RunStatus.COMPLETED
            return Watched.model_validate(done.structured_output)

        assert (await tick()).action == "none"  # nothing to judge: the tick says so and ends
        vague = Change(kind="tool_description", target="lookup_order", text="Look an order up.")
        candidate = await loop.change(REF, vague)
        salt = await canary_of(loop, candidate.candidate_id, golden, ("tool_error_rate <= 0.2",))
        on, off = await serve(rt, salt)
        watched = await tick()
        assert (watched.action, watched.runs, watched.stable_runs) == ("rolled_back", on, off)
        assert watched.judged == ["tool_error_rate <= 0.2: canary 0.5, stable 0.5 -> FAILED"]
        [*_, last] = await loop.history("order-desk")
    assert (last.decision.action, last.decision.candidate_id) == ("rollback", None)
    assert last.decision.decided_by == "canary-watch (scheduled)"
