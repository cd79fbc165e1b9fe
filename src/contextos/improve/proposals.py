"""Proposals: what a finding says should change, at the narrowest rung of the ladder that can
own the correction. Drafted from the finding's root cause by code; a model may draft one too,
and it is still a proposal: nothing here changes an agent.
"""

from __future__ import annotations

from contextos.agents import Agent
from contextos.improve.findings import example_calls
from contextos.improve.records import (
    Finding,
    FindingKind,
    Impact,
    Layer,
    Proposal,
    RootCause,
    digest,
)

LADDER: dict[RootCause, Layer] = {
    RootCause.TOOL_DESCRIPTION: Layer.TOOL_DESCRIPTION,
    RootCause.TOOL_CONTRACT: Layer.TOOL_CONTRACT,
    RootCause.TOOL_FAILURE: Layer.TOOL_CONTRACT,
    RootCause.INSTRUCTIONS: Layer.SCOPED_INSTRUCTION,
    RootCause.VERIFIER: Layer.GATE,
    RootCause.RUN_CONSTRAINT: Layer.RUN_CONSTRAINT,
    RootCause.POLICY: Layer.POLICY_RULE,
}
"""The rung each root cause is corrected on."""


def draft(finding: Finding, agent: Agent | None = None) -> Proposal:
    """The proposal for a finding (`agent`: the agent as it is now, to quote what changes)."""
    layer = LADDER[finding.root_cause]
    scope = f"agent {finding.agent}"
    if finding.subject and layer in (Layer.TOOL_DESCRIPTION, Layer.TOOL_CONTRACT):
        scope += f", tool {finding.subject}"
    change, rationale = _words(finding, layer, agent)
    return Proposal(
        proposal_id="prp_" + digest([finding.finding_id, layer, change])[:16],
        finding_id=finding.finding_id,
        agent=finding.agent,
        agent_ref=finding.agent_ref,
        layer=layer,
        scope=scope,
        change=change,
        rationale=rationale,
        impact=Impact(
            metric=f"{finding.kind} per run",
            baseline=round(finding.count / len(finding.runs), 3),
            target=0.0,
        ),
        trace_refs=tuple(f"{e.run_id}#{e.seq}" for e in finding.evidence),
        drafted_by="rules",
    )


def _words(finding: Finding, layer: Layer, agent: Agent | None) -> tuple[str, str]:
    seen = f"seen {finding.count} times in {len(finding.runs)} runs: {finding.signature}"
    match layer:
        case Layer.TOOL_DESCRIPTION:
            now = _description(agent, finding.subject)
            example = example_calls(finding)
            if example is None:
                return (now, seen)
            failing, worked = example
            text = (
                f"{now} Call it with arguments like {worked}, not {failing} "
                f"(that fails: {finding.signature})."
            ).strip()
            return (
                text,
                f"the model's first call failed and a corrected call then worked, {seen}; "
                "the description does not say what the tool accepts",
            )
        case Layer.TOOL_CONTRACT:
            return (
                f"make {finding.subject}'s contract say what fails ({finding.signature}): "
                "its argument schema, or its idempotency and reconciliation",
                seen,
            )
        case Layer.SCOPED_INSTRUCTION if finding.kind is FindingKind.VERIFICATION_FAILED:
            told = next((e.fix_hint for e in finding.evidence if e.fix_hint), finding.signature)
            return (
                f"Your answer is checked ({finding.subject}) before it is accepted; write it "
                f"so that it passes the first time: {told}",
                f"the check rejected the first answer and the model met it once told, {seen}; "
                "the instructions do not say what the check requires",
            )
        case Layer.SCOPED_INSTRUCTION:
            return (
                f"tell the agent that {finding.subject} is refused here ({finding.signature}) "
                "and what to do instead",
                f"policy keeps refusing what the model chooses, {seen}",
            )
        case Layer.GATE:
            return (
                f"check '{finding.signature}' with a deterministic gate before answering",
                f"answers miss the same thing, {seen}",
            )
        case Layer.RUN_CONSTRAINT:
            return ("raise this agent's budget or split its work", seen)
        case _:
            return (
                f"let a rule decide {finding.subject} instead of asking a person each time",
                seen,
            )


def _description(agent: Agent | None, tool: str) -> str:
    """The tool's description as the agent's code has it now ("" when unknown)."""
    tools = agent.tool_list if agent is not None else ()
    return next((t.description for t in tools if t.name == tool), "")


__all__ = ["LADDER", "draft"]
