"""The improvement loop's records: what was observed, what should change and where, the exact
change, the replay evidence and the decision to release it.

They are data, never writes: each is kept as the output of a run of its own (see `ledger`),
so it has a log, an artifact and a place in `contextos runs` like everything else.
"""

from __future__ import annotations

import hashlib
import json
from datetime import datetime
from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, ConfigDict

from contextos.releases import Change, Decision


def digest(value: object) -> str:
    """sha256 of canonical JSON, hex."""
    blob = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


class _Record(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    def content_hash(self) -> str:
        """sha256 of the record's JSON: what an approval is bound to."""
        return digest(self.model_dump(mode="json"))


class FindingKind(StrEnum):
    """What went wrong, as the log shows it."""

    TOOL_ERROR = "tool_error"
    """A tool call failed."""
    INVALID_ARGUMENTS = "invalid_arguments"
    """The model's arguments did not match the tool's schema."""
    OUTCOME_UNKNOWN = "outcome_unknown"
    """A side effect's outcome could not be told."""
    POLICY_DENIED = "policy_denied"
    """Policy refused a call the model chose."""
    VERIFICATION_FAILED = "verification_failed"
    """The verifier rejected an answer."""
    BUDGET_EXHAUSTED = "budget_exhausted"
    """A run ran out of turns, tokens, money or time."""
    REPEATED_INTERRUPTS = "repeated_interrupts"
    """One run stopped for people again and again."""


class RootCause(StrEnum):
    """Which part of the harness the pattern points at."""

    TOOL_DESCRIPTION = "tool_description"
    """The model called the tool wrongly, then rightly: the description did not say how."""
    TOOL_CONTRACT = "tool_contract"
    """The schema, idempotency or reconciliation of the tool is what fails."""
    TOOL_FAILURE = "tool_failure"
    """The tool itself fails, whatever it is asked."""
    INSTRUCTIONS = "instructions"
    """The model was never told: it keeps choosing what policy forbids, or it meets a check
    only once the check's gaps are written back to it."""
    VERIFIER = "verifier"
    """Answers miss what done means, the same way each time."""
    RUN_CONSTRAINT = "run_constraint"
    """The budget does not fit the work."""
    POLICY = "policy"
    """People are asked about calls a rule could decide."""


class Layer(StrEnum):
    """The promotion ladder: where a correction can live, narrowest first."""

    RUN_CONSTRAINT = "run_constraint"
    SCOPED_INSTRUCTION = "scoped_instruction"
    SKILL = "skill"
    GATE = "gate"
    TOOL_DESCRIPTION = "tool_description"
    TOOL_CONTRACT = "tool_contract"
    POLICY_RULE = "policy_rule"
    MODEL_CHOICE = "model_choice"


class Evidence(BaseModel):
    """One occurrence of a pattern in one run's log."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    run_id: str
    seq: int
    """The event that shows it."""
    at: datetime
    detail: str
    """What happened there, in one line (a failing call with its arguments, a gap, …)."""
    call: str = ""
    """For a failed tool call: `tool {arguments}`, as a replay's trail shows calls."""
    recovered: bool = False
    """True when the run got past it (a near miss, not a failure)."""
    fix_hint: str = ""
    """What got the run past it: the arguments of the later call of the same tool that
    worked, or the gaps a rejected answer was told before the next one passed."""


class Finding(_Record):
    """A recurring pattern across runs of one agent, with its evidence."""

    finding_id: str
    kind: FindingKind
    root_cause: RootCause
    agent: str
    """The agent's name."""
    agent_hash: str
    """The identity hash of the latest run that showed it."""
    agent_ref: str | None
    """The reference the latest such run was started from (what a candidate changes)."""
    subject: str
    """What it is about: a tool, a verifier, a rule, the budget."""
    signature: str
    """The pattern, with numbers and quoted values folded (`ValueError: no order N: …`)."""
    count: int
    """Occurrences."""
    runs: tuple[str, ...]
    """The runs that show it, oldest first."""
    recovered: int
    """Occurrences the run got past (near misses)."""
    first_seen: datetime
    last_seen: datetime
    evidence: tuple[Evidence, ...]

    def line(self) -> str:
        return (
            f"{self.finding_id} {self.kind} on {self.subject} in {self.agent}: {self.count}x in "
            f"{len(self.runs)} runs ({self.recovered} recovered) · root cause {self.root_cause}"
        )


class Impact(BaseModel):
    """What a change should move, and by how much."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    metric: str
    baseline: float
    target: float


class Proposal(_Record):
    """What should change, at which rung of the ladder, in the narrowest scope: a proposal,
    never a write."""

    proposal_id: str
    finding_id: str
    agent: str
    agent_ref: str | None
    layer: Layer
    scope: str
    """The narrowest place the change applies: `agent order-desk, tool lookup_order`."""
    change: str
    """The change, in words or as the text to use (a tool description)."""
    rationale: str
    impact: Impact
    trace_refs: tuple[str, ...]
    """`RUN#SEQ` of the evidence."""
    drafted_by: str = "rules"
    """`rules` (deterministic, from the root cause) or the model that drafted it."""


class Candidate(_Record):
    """A versioned change to an agent: a new identity, kept beside the current release."""

    candidate_id: str
    agent: str
    agent_ref: str
    """Where the released agent is defined (its code); the candidate is that plus `change`."""
    base_hash: str
    """The identity hash of the agent the change applies to."""
    candidate_hash: str
    """The identity hash of the changed agent."""
    change: Change
    proposal_id: str | None = None
    finding_id: str | None = None


Outcome = Literal["fixed", "regressed", "unchanged"]


class Case(BaseModel):
    """One recorded run, replayed against the candidate."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    source: str
    """The run replayed (its id; a packet's source run)."""
    golden: bool
    """A golden run must replay equal; a finding's run should stop failing."""
    outcome: Outcome
    replay_status: str
    diff: str
    """The replay's report: verdict and each difference."""


class ReleaseReport(_Record):
    """The replay evidence a release decision is made on."""

    report_id: str
    candidate_id: str
    candidate_hash: str
    cases: tuple[Case, ...]

    def count(self, outcome: Outcome) -> int:
        return sum(1 for c in self.cases if c.outcome == outcome)

    @property
    def regressions(self) -> tuple[Case, ...]:
        return tuple(c for c in self.cases if c.outcome == "regressed")

    def line(self) -> str:
        return (
            f"{self.report_id} for {self.candidate_id}: {self.count('fixed')} fixed, "
            f"{self.count('regressed')} regressed, {self.count('unchanged')} unchanged"
        )


__all__ = [
    "Candidate",
    "Case",
    "Change",
    "Decision",
    "Evidence",
    "Finding",
    "FindingKind",
    "Impact",
    "Layer",
    "Outcome",
    "Proposal",
    "ReleaseReport",
    "RootCause",
    "digest",
]
