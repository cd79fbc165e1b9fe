"""The improvement loop on one store, from Python: what `contextos findings`, `proposals`,
`candidate`, `release` and `rollback` call.

    async with Runtime(store) as rt:
        loop = Improvements(rt)
        review = await loop.scan()                       # a run of the findings job
        await loop.draft(review.findings[0].finding_id, model)  # a model's wording, checked
        candidate = await loop.candidate(review.proposals[0].proposal_id)
        report = await loop.check(candidate.candidate_id, golden=[good_run])
        asked = await loop.request_release(candidate.candidate_id, report.report_id,
                                           releasers=("alice",))
        await loop.approve(asked.id, approver="alice")  # releases: a recorded decision
        await rt.run(base_agent, "...")                 # new runs run the release
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from contextos.agents import Agent, load_agent
from contextos.errors import ConfigError, ImprovementNotFound, ReleaseRefused
from contextos.events import Event, RunCreated
from contextos.evidence.canonical import ReplayPacket
from contextos.improve import ledger
from contextos.improve.canary import CanaryVerdict, Criterion, judge
from contextos.improve.candidates import make, propose_change
from contextos.improve.drafting import draft_with, model_of
from contextos.improve.job import JOB, FindingsRequest, Review, findings_job
from contextos.improve.records import Candidate, Change, Decision, Finding, Proposal, ReleaseReport
from contextos.improve.release import (
    RELEASE_AGENT,
    Decided,
    ReleaseRequest,
    RollbackRequest,
    check,
    decided,
    refuse_regressions,
    release_agent,
    release_policy,
    rollback_agent,
)
from contextos.models.base import ModelAdapter
from contextos.records.interrupts import Interrupt
from contextos.releases import binding_of, decision_run_id, release_line, route
from contextos.runs import RunStatus
from contextos.runtime import Runtime


class Improvements:
    """Findings, proposals, candidates and release decisions kept in `runtime`'s store."""

    def __init__(self, runtime: Runtime) -> None:
        self.rt = runtime

    # -- findings and proposals -----------------------------------------------------------

    async def scan(self, *, limit: int = 1000, min_runs: int = 2) -> Review:
        """Run the findings job now (a run on this store) and return what it found."""
        request = FindingsRequest(store=self.rt.store.url, limit=limit, min_runs=min_runs)
        done = await self.rt.run(findings_job, request, agent_ref="contextos.improve:findings_job")
        if done.status is not RunStatus.COMPLETED:
            raise ImprovementNotFound(
                f"the findings job ended {done.status}: see `contextos show {done.run_id}`",
                run_id=done.run_id,
            )
        return Review.model_validate(done.structured_output)

    async def review(self) -> Review:
        """The latest findings job's output (scheduled or run by `scan`)."""
        for summary in await self.rt.runs(status=RunStatus.COMPLETED, limit=ledger.SCAN_LIMIT):
            if summary.agent_name == JOB:
                state = await self.rt.state(summary.run_id)
                return Review.model_validate(state.structured_output)
        raise ImprovementNotFound(
            "the findings job has not run on this store: `contextos findings --scan` runs it"
        )

    async def finding(self, finding_id: str) -> Finding:
        for f in (await self.review()).findings:
            if f.finding_id == finding_id:
                return f
        raise ImprovementNotFound(f"no finding {finding_id} in the latest findings", id=finding_id)

    async def draft(self, finding_id: str, model: ModelAdapter | str) -> Proposal:
        """Ask `model` (an adapter, a model string, or a reference `path.py:attr` to an
        adapter) to draft a proposal for a finding of the latest findings. The draft is
        checked into a proposal (ProposalRefused, with nothing kept, when it is not one the
        ladder allows) and kept beside the rules' proposals; like them, it changes nothing
        until a candidate made from it is replayed and released."""
        finding = await self.finding(finding_id)
        drafted = await draft_with(model_of(model), finding)
        await ledger.keep(self.rt, "proposal", drafted.proposal_id, drafted)
        return drafted

    async def proposals(self) -> list[Proposal]:
        """The latest findings' proposals: the rules' first, then those models drafted."""
        review = await self.review()
        current = {f.finding_id for f in review.findings}
        drafted = [p for _, p in await ledger.listing(self.rt, "proposal", Proposal)]
        return [*review.proposals, *(p for p in drafted if p.finding_id in current)]

    async def proposal(self, proposal_id: str) -> Proposal:
        for p in await self.proposals():
            if p.proposal_id == proposal_id:
                return p
        raise ImprovementNotFound(
            f"no proposal {proposal_id} in the latest findings: list them with "
            "`contextos proposals`",
            id=proposal_id,
        )

    # -- candidates ----------------------------------------------------------------------

    async def candidate(
        self,
        proposal_id: str,
        *,
        text: str | None = None,
        agent_ref: str | None = None,
    ) -> Candidate:
        """The candidate change a proposal asks for (`text`: other words for it), kept beside
        the current release; nothing runs it until a release decision says so."""
        proposal = await self.proposal(proposal_id)
        ref = agent_ref or proposal.agent_ref
        if not ref:
            raise ConfigError(
                f"the runs of agent {proposal.agent} name no agent reference: pass --agent REF"
            )
        change = propose_change(proposal, text)
        found = make(load_agent(ref), ref, change, proposal)
        await ledger.keep(self.rt, "candidate", found.candidate_id, found)
        return found

    async def change(self, agent_ref: str, change: Change) -> Candidate:
        """A candidate written by a person rather than drafted from a proposal."""
        found = make(load_agent(agent_ref), agent_ref, change)
        await ledger.keep(self.rt, "candidate", found.candidate_id, found)
        return found

    async def get_candidate(self, candidate_id: str) -> Candidate:
        return await ledger.read(self.rt, "candidate", candidate_id, Candidate)

    async def candidates(self) -> list[Candidate]:
        return [c for _, c in await ledger.listing(self.rt, "candidate", Candidate)]

    # -- release decisions ---------------------------------------------------------------

    async def check(
        self,
        candidate_id: str,
        *,
        golden: Sequence[str | ReplayPacket] = (),
        base: Agent | None = None,
    ) -> ReleaseReport:
        """Replay the candidate over `golden` recorded runs (run ids or ReplayPackets) and its
        finding's runs; the report is kept."""
        candidate = await self.get_candidate(candidate_id)
        finding = await self.finding(candidate.finding_id) if candidate.finding_id else None
        if not golden and finding is None:
            raise ConfigError("give at least one golden run to replay the candidate over")
        report = await check(self.rt, candidate, golden=golden, finding=finding, base=base)
        await ledger.keep(self.rt, "report", report.report_id, report)
        return report

    async def report(self, report_id: str) -> ReleaseReport:
        return await ledger.read(self.rt, "report", report_id, ReleaseReport)

    async def request_release(
        self,
        candidate_id: str,
        report_id: str,
        *,
        releasers: Sequence[str],
        fraction: float = 1.0,
        criteria: Sequence[Criterion | str] = (),
    ) -> Interrupt:
        """Ask for a release: refused when the report regresses a golden run; otherwise a
        release run waits for one of `releasers` to approve the candidate's and the report's
        hashes (the interrupt returned). Below 1, `fraction` makes it a canary, judged by
        `watch` on `criteria` (`tool_error_rate <= 0.1`, `cost_per_run - stable <= 0.01`, …),
        which the releaser approves with it."""
        candidate = await self.get_candidate(candidate_id)
        report = await self.report(report_id)
        refuse_regressions(report, candidate)
        if not releasers:
            raise ConfigError("name who may approve the release (--releaser NAME)")
        if criteria and fraction >= 1:
            raise ConfigError("criteria judge a canary: release to a fraction below 1")
        request = ReleaseRequest(
            candidate=candidate,
            report=report,
            releasers=tuple(releasers),
            fraction=fraction,
            criteria=tuple(c if isinstance(c, Criterion) else Criterion.parse(c) for c in criteria),
        )
        async with Runtime(self.rt.store.url, policy=release_policy(releasers)) as rt:
            done = await rt.run(
                release_agent(request),
                request.model_dump_json(),
                run_id=decision_run_id(candidate.agent),
            )
            waiting = [i for i in await rt.inbox() if i.run_id == done.run_id]
        if not waiting:
            raise ReleaseRefused(
                f"the release run {done.run_id} ended {done.status} without asking anyone: "
                "nothing was released",
                run_id=done.run_id,
            )
        return waiting[0]

    async def approve(self, interrupt_id: str, *, approver: str) -> Decided:
        """Approve a release (as a releaser the request named) and carry it out."""
        interrupt, request = await self._release_asked(interrupt_id)
        async with Runtime(self.rt.store.url, policy=release_policy(request.releasers)) as rt:
            await rt.approve(interrupt_id, approver=approver)
            await rt.resume(interrupt.run_id, release_agent(request))
            found = decided(await rt.events(interrupt.run_id))
        if found is None:
            raise ReleaseRefused(
                f"the release run {interrupt.run_id} did not release: see "
                f"`contextos show {interrupt.run_id}`",
                run_id=interrupt.run_id,
            )
        return found

    async def deny(self, interrupt_id: str, *, approver: str, reason: str = "") -> None:
        """Refuse a release; the release run ends without releasing."""
        interrupt, request = await self._release_asked(interrupt_id)
        async with Runtime(self.rt.store.url, policy=release_policy(request.releasers)) as rt:
            await rt.deny(interrupt_id, approver=approver, reason=reason)
            await rt.resume(interrupt.run_id, release_agent(request))

    async def _release_asked(self, interrupt_id: str) -> tuple[Interrupt, ReleaseRequest]:
        interrupt = await self.rt.interrupt(interrupt_id)
        state = await self.rt.state(interrupt.run_id)
        if state.agent_name != RELEASE_AGENT:
            raise ConfigError(
                f"{interrupt_id} is not a release's question: answer it with `contextos approve`"
            )
        return interrupt, ReleaseRequest.model_validate_json(state.input)

    async def history(self, agent: str | None = None) -> list[Decided]:
        """Every release and rollback decision, oldest first (of one agent, when named).

        A rollback counts only when it goes back to a release made before it (or to the code):
        rolling back needs no approval, so it can never reach what nobody approved."""
        return await release_line(self.rt.store, agent)

    async def current(self, agent: str) -> Decision | None:
        """The decision the agent runs under now (None: its code as it is, never released)."""
        line = await self.history(agent)
        return line[-1].decision if line else None

    async def released(self, base: Agent, *, key: str | None = None) -> Agent:
        """The agent a new run with id `key` runs: `base` with its current release's change,
        if any (what the runtime itself does when it creates a run of `base`).

        During a canary, only the runs whose `key` falls in its fraction get the candidate;
        the others (and `key` None) get the release before it."""
        agent, _ = await route(self.rt.store, base, key)
        return agent

    async def watch(
        self,
        agent: str,
        *,
        max_failure_rate: float | None = None,
        min_runs: int = 5,
        by: str = "canary-watch",
    ) -> CanaryVerdict:
        """Judge the agent's canary on the criteria its release names (and, when given, a
        failure rate of at most `max_failure_rate`), measured on its runs and on the stable
        runs since the release; roll it back (a recorded decision) when any fails once at
        least `min_runs` canary runs ended."""
        line = await self.history(agent)
        last = line[-1] if line else None
        if last is None or last.decision.action != "release" or last.decision.fraction >= 1:
            raise ConfigError(f"agent {agent} has no canary running")
        criteria = [Criterion.parse(c) for c in last.decision.criteria]
        if max_failure_rate is not None:
            criteria.append(Criterion(metric="failure_rate", at_most=max_failure_rate))
        if not criteria:
            raise ConfigError(
                f"the canary of {agent} names no criteria: pass --max-failure-rate RATE"
            )
        arms: dict[bool, list[list[Event]]] = {True: [], False: []}
        for summary in await self.rt.runs(limit=ledger.SCAN_LIMIT):
            if summary.agent_name != agent or summary.created_at < last.at:
                continue  # the runs since the release: only they can be on either arm
            if not summary.status.is_terminal:
                continue
            events = await self.rt.events(summary.run_id)
            created = events[0]
            assert isinstance(created, RunCreated)
            binding = binding_of(created.metadata)
            if (
                binding is not None
                and binding.decision == last.run_id
                and binding.canary is not None
            ):
                arms[binding.canary].append(events)
        judged = judge(criteria, arms[True], arms[False])
        action: Literal["wait", "healthy", "rolled_back"] = "healthy"
        if len(arms[True]) < min_runs:
            action = "wait"
        elif any(not j.passed for j in judged):
            action = "rolled_back"
            why = "; ".join(j.line() for j in judged if not j.passed)
            await self.rollback(agent, by=by, reason=f"canary: {why}")
        return CanaryVerdict(
            agent=agent,
            candidate_id=last.decision.candidate_id or "",
            runs=len(arms[True]),
            stable_runs=len(arms[False]),
            judged=judged,
            action=action,
        )

    async def rollback(self, agent: str, *, by: str, reason: str = "") -> Decided:
        """Go back to the release before the current one (or the agent's code): one run,
        recorded like a release."""
        line = await self.history(agent)
        if not line or line[-1].decision.candidate_id is None:
            raise ConfigError(f"agent {agent} runs its code as it is: nothing to roll back")
        released = [d.decision.candidate_id for d in line if d.decision.action == "release"]
        current = line[-1].decision.candidate_id
        earlier = released[: len(released) - 1 - released[::-1].index(current)]
        request = RollbackRequest(
            agent=agent,
            from_candidate=current,
            to_candidate=earlier[-1] if earlier else None,
            by=by,
            reason=reason,
        )
        done = await self.rt.run(
            rollback_agent(request), request.model_dump_json(), run_id=decision_run_id(agent)
        )
        found = decided(await self.rt.events(done.run_id))
        if found is None:  # pragma: no cover - the rollback's call cannot be refused
            raise ReleaseRefused(f"the rollback run {done.run_id} did not roll back")
        return found


__all__ = ["Improvements"]
