"""Nothing in the improvement loop changes what an agent runs without a recorded release
decision: each other path is tried here and leaves the agent as its code is."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from orders import desk
from test_improvement_loop import seed

from contextos import Agent, RunStatus, Runtime
from contextos.errors import ApprovalRefused, ReleaseRefused
from contextos.events import ToolCompleted
from contextos.improve import Improvements
from contextos.improve.release import (
    RELEASE_AGENT,
    RELEASE_TOOL,
    ReleaseRequest,
    RollbackRequest,
    release_agent,
    release_policy,
    rollback_agent,
)
from contextos.testing import ScriptedModel, call_tool, reply


async def candidate_ready(rt: Runtime) -> tuple[Improvements, str, str]:
    _, golden = await seed(rt)
    loop = Improvements(rt)
    [proposal] = (await loop.scan()).proposals
    candidate = await loop.candidate(proposal.proposal_id)
    report = await loop.check(candidate.candidate_id, golden=[golden])
    return loop, candidate.candidate_id, report.report_id


async def unchanged(loop: Improvements) -> bool:
    return (await loop.released(desk())).identity_hash() == desk().identity_hash()


async def test_asking_denying_or_a_wrong_approver_releases_nothing(tmp_path: Path) -> None:
    async with Runtime(str(tmp_path / "c.db")) as rt:
        loop, candidate_id, report_id = await candidate_ready(rt)
        assert await unchanged(loop)  # a candidate and its replay change nothing

        asked = await loop.request_release(candidate_id, report_id, releasers=("alice",))
        assert await unchanged(loop)  # waiting for a person changes nothing
        with pytest.raises(ApprovalRefused):
            await loop.approve(asked.id, approver="mallory")  # not a releaser
        assert await unchanged(loop)
        await loop.deny(asked.id, approver="alice", reason="not this week")
        assert await unchanged(loop)
        assert await loop.history("order-desk") == []
        assert (await rt.state(asked.run_id)).status is RunStatus.COMPLETED


async def test_an_approval_of_another_report_does_not_cover_this_one(tmp_path: Path) -> None:
    async with Runtime(str(tmp_path / "c.db")) as rt:
        loop, candidate_id, report_id = await candidate_ready(rt)
        asked = await loop.request_release(candidate_id, report_id, releasers=("alice",))
        policy = release_policy(("alice",))
        async with Runtime(str(tmp_path / "c.db"), policy=policy) as governed:
            with pytest.raises(ApprovalRefused):
                await governed.approve(asked.id, approver="alice", action_hash="0" * 64)
        assert await unchanged(loop)


async def test_a_run_that_calls_the_release_tool_without_an_approval_is_no_release(
    tmp_path: Path,
) -> None:
    """Even a run named like a release, whose release call completed, counts for nothing
    unless a person approved that call."""
    async with Runtime(str(tmp_path / "c.db")) as rt:
        loop, candidate_id, report_id = await candidate_ready(rt)
        request = ReleaseRequest(
            candidate=await loop.get_candidate(candidate_id),
            report=await loop.report(report_id),
            releasers=("alice",),
        )
        forged = Agent(
            name=RELEASE_AGENT,
            model=ScriptedModel([call_tool(RELEASE_TOOL, request.arguments()), reply("done")]),
            tools=release_agent(request).tools,
        )
        done = await rt.run(forged, request.model_dump_json())  # no policy: nobody asked
        assert done.status is RunStatus.COMPLETED
        completed = [e for e in await rt.events(done.run_id) if e.type == "tool_completed"]
        assert isinstance(completed[0], ToolCompleted)
        assert json.loads(completed[0].output)["released"] == candidate_id
        assert await loop.history("order-desk") == []
        assert await unchanged(loop)


async def test_a_release_made_for_other_code_is_refused_when_loaded(tmp_path: Path) -> None:
    async with Runtime(str(tmp_path / "c.db")) as rt:
        loop, candidate_id, report_id = await candidate_ready(rt)
        asked = await loop.request_release(candidate_id, report_id, releasers=("alice",))
        await loop.approve(asked.id, approver="alice")
        edited = dataclasses.replace(desk(), instructions="Answer in French.")
        with pytest.raises(ReleaseRefused, match="release a candidate made from the current"):
            await loop.released(edited)
        before = await rt.runs(limit=1000)
        with pytest.raises(ReleaseRefused, match="contextos rollback order-desk"):
            await rt.run(edited, "Where is order 9?", run_id="run_edited")
        assert await rt.runs(limit=1000) == before  # refused before anything was written


async def test_a_rollback_cannot_reach_a_candidate_nobody_released(tmp_path: Path) -> None:
    """Rolling back needs no approval, so a rollback run naming a candidate that was never
    released counts for nothing."""
    async with Runtime(str(tmp_path / "c.db")) as rt:
        loop, candidate_id, _ = await candidate_ready(rt)
        request = RollbackRequest(
            agent="order-desk", from_candidate="cnd_x", to_candidate=candidate_id, by="mallory"
        )
        done = await rt.run(rollback_agent(request), request.model_dump_json())
        assert done.status is RunStatus.COMPLETED
        assert await loop.history("order-desk") == []
        assert await unchanged(loop)
