"""The findings job: a workflow that reads the store's runs and writes findings and proposals.

    read ─▶ propose

It is a run like any other (schedule it: `contextos schedule add findings
--agent contextos.improve:findings_job --cron '0 6 * * *'`), and its output, kept as the run's
artifact, is the loop's list of findings and proposals. It reads; it never changes an agent.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from contextos.agents import Agent, load_agent
from contextos.errors import ContextOSError
from contextos.graph import Workflow
from contextos.improve.findings import RunLog, cluster, observe
from contextos.improve.ledger import PREFIX
from contextos.improve.proposals import draft
from contextos.improve.records import Finding, Proposal
from contextos.runs import RunStatus
from contextos.store import open_store

JOB = "contextos-improve-findings"
"""The workflow's name: its runs are the loop's findings."""


class FindingsRequest(BaseModel):
    """What one pass of the job reads."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    store: str | None = None
    """The store to read (default: $CONTEXTOS_STORE, else ./.contextos/contextos.db)."""
    limit: int = 1000
    """The most recently updated runs read."""
    min_runs: int = 2
    """A pattern is a finding once this many runs show it."""


class Findings(BaseModel):
    """What the read found."""

    runs_read: int
    findings: list[Finding]


class Review(BaseModel):
    """The job's output: the findings and a proposal for each."""

    runs_read: int
    findings: list[Finding]
    proposals: list[Proposal]


async def read(request: FindingsRequest) -> Findings:
    """Read each finished or waiting run's log (the loop's own runs aside) and cluster."""
    store = open_store(request.store, create=False)
    try:
        logs: list[RunLog] = []
        for summary in await store.list_runs(limit=request.limit):
            waiting = summary.status is RunStatus.INPUT_REQUIRED
            if summary.agent_name.startswith(PREFIX) or not (summary.status.is_terminal or waiting):
                continue
            logs.append(observe(await store.read(summary.run_id)))
    finally:
        await store.close()
    return Findings(runs_read=len(logs), findings=cluster(logs, min_runs=request.min_runs))


def propose(found: Findings) -> Review:
    """A proposal for each finding, drafted from its root cause."""
    return Review(
        runs_read=found.runs_read,
        findings=found.findings,
        proposals=[draft(f, _agent(f.agent_ref)) for f in found.findings],
    )


def _agent(ref: str | None) -> Agent | None:
    """The agent as its code is now, when its reference still loads."""
    if not ref:
        return None
    try:
        return load_agent(ref)
    except ContextOSError:
        return None


def findings_workflow() -> Workflow:
    flow = Workflow(JOB, input=FindingsRequest)
    flow.code("read", read)
    flow.code("propose", propose)
    return flow


findings_job = findings_workflow()

__all__ = ["JOB", "Findings", "FindingsRequest", "Review", "findings_job", "findings_workflow"]
