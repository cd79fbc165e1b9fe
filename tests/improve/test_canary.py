"""Canaries: a release that serves a fraction of new runs (picked by run id), judged on those
runs' logs and rolled back (a recorded decision) when they fail too often."""

from __future__ import annotations

from pathlib import Path

from orders import desk
from test_improve_cli import cli_for
from test_improvement_loop import REF, seed

from contextos import Runtime
from contextos.events import RunCreated
from contextos.improve import Change, Improvements
from contextos.releases import binding_of, in_canary


async def canary_of(rt: Runtime, loop: Improvements, candidate_id: str, golden: str) -> str:
    report = await loop.check(candidate_id, golden=[golden])
    asked = await loop.request_release(
        candidate_id, report.report_id, releasers=("alice",), fraction=0.5
    )
    assert asked.action is not None and asked.action.arguments["fraction"] == 0.5
    done = await loop.approve(asked.id, approver="alice")
    assert done.decision.fraction == 0.5
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


async def test_a_healthy_canary_serves_its_fraction_and_stays(tmp_path: Path) -> None:
    async with Runtime(str(tmp_path / "c.db")) as rt:
        _, golden = await seed(rt)
        loop = Improvements(rt)
        [proposal] = (await loop.scan()).proposals
        candidate = await loop.candidate(proposal.proposal_id)
        salt = await canary_of(rt, loop, candidate.candidate_id, golden)
        assert (await loop.released(desk())).identity_hash() == desk().identity_hash()  # no key
        on, off = await serve(rt, salt)
        verdict = await loop.watch("order-desk", max_failure_rate=0.2, min_runs=3)
    assert (verdict.runs, verdict.failures, verdict.action) == (on, 0, "healthy")
    assert off >= 1  # the stable runs failed their first call, and do not count against it


async def test_a_failing_canary_is_rolled_back(tmp_path: Path) -> None:
    async with Runtime(str(tmp_path / "c.db")) as rt:
        _, golden = await seed(rt)
        loop = Improvements(rt)
        vague = Change(kind="tool_description", target="lookup_order", text="Look an order up.")
        candidate = await loop.change(REF, vague)  # replays the golden run equal, fixes nothing
        salt = await canary_of(rt, loop, candidate.candidate_id, golden)
        early = await loop.watch("order-desk", max_failure_rate=0.2, min_runs=3)
        assert early.action == "wait"
        on, _ = await serve(rt, salt)
        # the watch runs in a process of its own, as a cron job or an operator would run it
        cli = cli_for(tmp_path)
        watched = cli(
            "release", "watch", "order-desk", "--max-failure-rate", "0.2", "--min-runs", "100"
        )
        assert watched.returncode == 0 and "-> wait" in watched.stdout
        watched = cli(
            "release", "watch", "order-desk", "--max-failure-rate", "0.2", "--min-runs", "3"
        )
        assert watched.returncode == 1, watched.stderr
        assert f"{on} of {on} runs failed (100%, limit 20%) -> rolled_back" in watched.stdout
        [*_, last] = await loop.history("order-desk")
        assert (last.decision.action, last.decision.decided_by) == ("rollback", "canary-watch")
        assert f"canary: {on} of {on} runs failed" in last.decision.reason
        for i in range(5):  # the next runs after the rollback all run the code as it is
            done = await rt.run(desk(), f"Where is order {i}?", run_id=f"run_after_{i}")
            created = (await rt.events(done.run_id))[0]
            assert isinstance(created, RunCreated)
            assert created.agent_hash == desk().identity_hash()
