"""Candidates: an exact change applied to an agent's definition, giving a new identity.

The agent's code stays as it is: a candidate is its reference plus a `Change`, applied when
the candidate is loaded. Loading checks both hashes, so a candidate made for one version of
the agent never silently applies to another.
"""

from __future__ import annotations

from contextos.agents import Agent, load_agent
from contextos.errors import ConfigError, ReleaseRefused
from contextos.improve.records import Candidate, Change, Layer, Proposal, digest
from contextos.releases import apply

CHANGEABLE = {Layer.TOOL_DESCRIPTION: "tool_description", Layer.SCOPED_INSTRUCTION: "instructions"}
"""The rungs a candidate can change in an agent's definition; the others are changed by a
person, in code or policy, and released as a new version of it."""


def propose_change(proposal: Proposal, text: str | None = None) -> Change:
    """The exact change a proposal asks for (`text` overrides the drafted words)."""
    kind = CHANGEABLE.get(proposal.layer)
    if kind is None:
        raise ConfigError(
            f"a {proposal.layer} change is made by a person in the agent's code or its policy; "
            "a candidate changes only a tool description or the instructions"
        )
    target = proposal.scope.rpartition("tool ")[2] if kind == "tool_description" else ""
    return Change(kind=kind, target=target, text=text or proposal.change)


def make(
    agent: Agent, agent_ref: str, change: Change, proposal: Proposal | None = None
) -> Candidate:
    """The candidate of `change` to `agent` (loaded from `agent_ref`)."""
    changed = apply(agent, change)
    if changed.identity_hash() == agent.identity_hash():
        raise ConfigError("the change leaves the agent as it is: nothing to release")
    return Candidate(
        candidate_id="cnd_" + digest([agent.identity_hash(), change.model_dump()])[:16],
        agent=agent.name,
        agent_ref=agent_ref,
        base_hash=agent.identity_hash(),
        candidate_hash=changed.identity_hash(),
        change=change,
        proposal_id=proposal.proposal_id if proposal else None,
        finding_id=proposal.finding_id if proposal else None,
    )


def load(candidate: Candidate, base: Agent | None = None) -> Agent:
    """The candidate's agent: its base (loaded from its reference unless given) with its change,
    refused when either hash differs from the candidate's."""
    agent = base if base is not None else load_agent(candidate.agent_ref)
    if agent.identity_hash() != candidate.base_hash:
        raise ReleaseRefused(
            f"candidate {candidate.candidate_id} was made for agent {candidate.agent} "
            f"{candidate.base_hash[:12]}, but {candidate.agent_ref} is now "
            f"{agent.identity_hash()[:12]}: make a new candidate from the current code",
            candidate=candidate.candidate_id,
        )
    changed = apply(agent, candidate.change)
    if changed.identity_hash() != candidate.candidate_hash:  # pragma: no cover - deterministic
        raise ReleaseRefused(f"candidate {candidate.candidate_id} no longer gives its hash")
    return changed


__all__ = ["CHANGEABLE", "apply", "load", "make", "propose_change"]
