"""Release decisions: replay evidence, a person's approval, and the release line of an agent.

A candidate is replayed over a golden set of recorded runs (each must replay equal) and over
the runs of the finding it answers (each should stop failing); the report says fixed,
regressed or unchanged per run, with the diff. A report with a regression is refused.

A release is a run like any other: its one tool, `release_candidate`, is called by code with
the candidate's hash and the report's hash, and policy makes that call wait for a `releaser`'s
approval of exactly those hashes (a typed interrupt over a frozen action). Once approved and
resumed, the call completes: that event, with the approval before it, is the release decision.
A rollback is a run too, whose tool names the release it goes back to. The agent's current
release is derived from those runs' logs (`contextos.releases`, which the runtime reads when it
creates a run); nothing else can move it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from contextos.agents import Agent
from contextos.errors import ReleaseRefused
from contextos.evidence.canonical import ReplayPacket
from contextos.evidence.replay import ReplayReport
from contextos.improve.canary import Criterion
from contextos.improve.candidates import load
from contextos.improve.records import (
    Candidate,
    Case,
    Finding,
    FindingKind,
    Outcome,
    ReleaseReport,
    digest,
)
from contextos.messages import FinishReason, Message, ToolCall, Usage
from contextos.models.base import ModelRequest, ModelResponse
from contextos.policy import Decision as Ruling
from contextos.policy import Policy, Rule
from contextos.releases import (
    RELEASE_AGENT,
    RELEASE_TOOL,
    ROLLBACK_AGENT,
    ROLLBACK_TOOL,
    Decided,
    decided,
)
from contextos.runs import Budget
from contextos.runtime import Runtime
from contextos.tools.contract import Tool, tool

RELEASER = "releaser"
"""The approver role a release needs."""

RELEASE_RULE = Rule(
    id="release-needs-approval",
    tools=(RELEASE_TOOL,),
    decision=Ruling.REQUIRE_APPROVAL,
    approver_role=RELEASER,
    reason="a changed agent reaches production only with a releaser's approval",
    preview=(
        "Release candidate {candidate_id} of agent {agent} (hash {candidate_hash}) on replay "
        "report {report_id} (hash {report_hash}) to a fraction {fraction} of new runs"
    ),
    blast_radius="that fraction of the new runs of agent {agent} runs the candidate",
)


def release_policy(releasers: Sequence[str]) -> Policy:
    """Every release waits for the approval of one of `releasers`."""
    return Policy(
        name="contextos-release",
        version="1",
        rules=(RELEASE_RULE,),
        roles={RELEASER: tuple(releasers)},
    )


# -- replay evidence ---------------------------------------------------------------------------


def judge(
    report: ReplayReport, *, golden: bool, failing: Sequence[str], checks: Sequence[str] = ()
) -> Outcome:
    """A replayed run's outcome: a golden run must replay equal; a finding's run is fixed when
    the replay completes without making any of its failing calls again, and without any of
    the `checks` (verifiers) that rejected its answers rejecting one again."""
    if report.equal:
        return "unchanged"
    if golden:
        return "regressed"
    completed = report.replayed.output[0].startswith("completed")
    if not completed and report.recorded.output[0].startswith("completed"):
        return "regressed"
    rejected = any(
        line.startswith(f"{c}: failed") for c in checks for line in report.replayed.verification
    )
    if completed and not set(failing) & set(report.replayed.tool_calls) and not rejected:
        return "fixed"
    return "unchanged"


async def check(
    rt: Runtime,
    candidate: Candidate,
    *,
    golden: Sequence[str | ReplayPacket],
    finding: Finding | None = None,
    base: Agent | None = None,
) -> ReleaseReport:
    """Replay the candidate over the golden runs and the finding's runs (no tool is called)."""
    agent = load(candidate, base)
    cases: list[Case] = []
    seen: set[str] = set()
    for source in golden:
        report = await rt.replay(source, agent)
        seen.add(report.source_run_id)
        cases.append(_case(report, golden=True, outcome=judge(report, golden=True, failing=())))
    evidence = finding.evidence if finding is not None else ()
    checks = (
        [finding.subject]
        if finding is not None and finding.kind is FindingKind.VERIFICATION_FAILED
        else []
    )
    for run_id in finding.runs if finding is not None else ():
        if run_id in seen:
            continue
        failing = [e.call for e in evidence if e.run_id == run_id and e.call]
        report = await rt.replay(run_id, agent)
        outcome = judge(report, golden=False, failing=failing, checks=checks)
        cases.append(_case(report, golden=False, outcome=outcome))
    return ReleaseReport(
        report_id="rpt_" + digest([candidate.candidate_id, [c.model_dump() for c in cases]])[:16],
        candidate_id=candidate.candidate_id,
        candidate_hash=candidate.candidate_hash,
        cases=tuple(cases),
    )


def _case(report: ReplayReport, *, golden: bool, outcome: Outcome) -> Case:
    return Case(
        source=report.source_run_id,
        golden=golden,
        outcome=outcome,
        replay_status=str(report.replay_status),
        diff=report.text().split("\n", 1)[-1] if not report.equal else "",
    )


def refuse_regressions(report: ReleaseReport, candidate: Candidate) -> None:
    """ReleaseRefused unless the report is about this candidate and regresses nothing."""
    if report.candidate_hash != candidate.candidate_hash:
        raise ReleaseRefused(
            f"report {report.report_id} replayed another candidate: check "
            f"{candidate.candidate_id} again",
            report=report.report_id,
        )
    if report.regressions:
        runs = ", ".join(c.source for c in report.regressions)
        raise ReleaseRefused(
            f"candidate {candidate.candidate_id} regresses {len(report.regressions)} golden "
            f"run(s) ({runs}): it was not released; see the report's diffs",
            candidate=candidate.candidate_id,
            runs=runs,
        )


# -- the release and rollback runs -------------------------------------------------------------


class ReleaseRequest(BaseModel):
    """A release run's input: what is released, on what evidence, approved by whom."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    candidate: Candidate
    report: ReleaseReport
    releasers: tuple[str, ...]
    fraction: float = Field(default=1.0, gt=0.0, le=1.0)
    """The share of new runs to serve (below 1: a canary)."""
    criteria: tuple[Criterion, ...] = ()
    """What the canary is judged on."""

    def arguments(self) -> dict[str, Any]:
        return {
            "agent": self.candidate.agent,
            "candidate_id": self.candidate.candidate_id,
            "candidate_hash": self.candidate.candidate_hash,
            "report_id": self.report.report_id,
            "report_hash": self.report.content_hash(),
            "fraction": self.fraction,
            "criteria": [c.text() for c in self.criteria],
        }


class RollbackRequest(BaseModel):
    """A rollback run's input."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    agent: str
    from_candidate: str
    to_candidate: str | None
    """The release before it (None: the agent's code as it is)."""
    by: str
    reason: str = ""


def release_agent(request: ReleaseRequest) -> Agent:
    """The run that releases: one governed call, made by code."""

    @tool(name=RELEASE_TOOL, effect="write", risk="high")
    def release_candidate(
        agent: str,
        candidate_id: str,
        candidate_hash: str,
        report_id: str,
        report_hash: str,
        fraction: float,
        criteria: list[str],
    ) -> dict[str, Any]:
        """Make the approved candidate the agent's current release (for `fraction` of runs,
        judged on `criteria`)."""
        if request.arguments() != {
            "agent": agent,
            "candidate_id": candidate_id,
            "candidate_hash": candidate_hash,
            "report_id": report_id,
            "report_hash": report_hash,
            "fraction": fraction,
            "criteria": criteria,
        }:
            raise ReleaseRefused("the release's arguments are not its request's")
        refuse_regressions(request.report, request.candidate)
        return {"released": candidate_id, "agent": agent}

    return _code_run(RELEASE_AGENT, release_candidate, request.arguments())


def rollback_agent(request: RollbackRequest) -> Agent:
    @tool(name=ROLLBACK_TOOL, effect="write", risk="medium")
    def roll_back_release(
        agent: str, from_candidate: str, to_candidate: str | None, by: str, reason: str
    ) -> dict[str, Any]:
        """Go back to the agent's release before the current one."""
        return {"agent": agent, "current": to_candidate}

    return _code_run(ROLLBACK_AGENT, roll_back_release, request.model_dump())


def _code_run(name: str, only: Tool, arguments: dict[str, Any]) -> Agent:
    return Agent(
        name=name,
        model=_Caller(only.name, arguments),
        instructions=f"Call {only.name} once with the request's arguments.",
        tools=[only],
        budget=Budget(max_turns=3),
    )


class _Caller:
    """The 'model' of a release or rollback run: code that makes its one call, then says
    what the call answered."""

    name = "contextos-improve:caller"

    def __init__(self, tool_name: str, arguments: dict[str, Any]) -> None:
        self.tool_name = tool_name
        self.arguments = arguments

    async def complete(self, request: ModelRequest) -> ModelResponse:
        results = [m for m in request.messages if m.role == "tool"]
        usage = Usage(input_tokens=0, output_tokens=0, requests=1)
        if not results:
            call = ToolCall(id="decide", name=self.tool_name, arguments=json.dumps(self.arguments))
            message = Message(role="assistant", tool_calls=(call,))
            return ModelResponse(
                message=message, finish_reason=FinishReason.TOOL_CALLS, usage=usage, model=self.name
            )
        return ModelResponse(
            message=Message(role="assistant", content=results[-1].content or "done"),
            finish_reason=FinishReason.STOP,
            usage=usage,
            model=self.name,
        )


__all__ = [
    "RELEASER",
    "RELEASE_AGENT",
    "RELEASE_TOOL",
    "ROLLBACK_AGENT",
    "Decided",
    "ReleaseRequest",
    "RollbackRequest",
    "check",
    "decided",
    "judge",
    "refuse_regressions",
    "release_agent",
    "release_policy",
    "rollback_agent",
]
