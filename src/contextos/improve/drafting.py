"""A model drafts a proposal: words, checked into the typed record, never a write.

The model is shown a finding (its evidence, root cause and the rung the rules assign) and asked
for a proposal as JSON. Its answer is kept only when it is a proposal the rules could have
made: a layer on the ladder no wider than the finding's rung, a scope inside the finding's
agent, and trace refs taken from the finding's own evidence. Anything else is refused and
nothing is kept. A kept draft is one more proposal: it changes nothing until a candidate is
made from it, replayed and released.
"""

from __future__ import annotations

import json

from pydantic import BaseModel, ConfigDict, ValidationError

from contextos.agents import load_ref
from contextos.errors import ConfigError, ProposalRefused
from contextos.improve.proposals import LADDER
from contextos.improve.records import Finding, Impact, Layer, Proposal, digest
from contextos.messages import Message
from contextos.models import resolve_model
from contextos.models.base import ModelAdapter, ModelRequest

RUNGS = list(Layer)
"""The ladder, narrowest first."""

INSTRUCTIONS = (
    "You draft one improvement proposal for an agent from a finding: a pattern of failures "
    "seen across its runs. Propose the narrowest change that would stop it, on the rung of "
    "the promotion ladder given or a narrower one, scoped to the agent (and the tool, when the "
    "change is to a tool). For a tool description or a scoped instruction, `change` is the "
    "exact text to use. Cite only trace refs (RUN#SEQ) listed in the finding. Answer with the "
    "JSON object only."
)


class Draft(BaseModel):
    """What the model must answer: a proposal without the fields the runtime fills in."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    layer: Layer
    scope: str
    change: str
    rationale: str
    impact: Impact
    trace_refs: tuple[str, ...]


def request_for(finding: Finding) -> ModelRequest:
    """The model call that asks for a draft."""
    shown = {
        "finding": finding.model_dump(mode="json"),
        "rung": LADDER[finding.root_cause],
        "ladder_narrowest_first": RUNGS,
        "trace_refs": refs(finding),
    }
    return ModelRequest(
        messages=(
            Message(role="system", content=INSTRUCTIONS),
            Message(role="user", content=json.dumps(shown, indent=1, default=str)),
        ),
        output_schema=Draft.model_json_schema(),
        temperature=0.0,
    )


def refs(finding: Finding) -> list[str]:
    return [f"{e.run_id}#{e.seq}" for e in finding.evidence]


def checked(finding: Finding, text: str, *, model: str) -> Proposal:
    """The proposal the model's answer `text` drafts, or ProposalRefused saying why not."""
    try:
        draft = Draft.model_validate_json(_unfenced(text))
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or '(answer)'}: {e['msg']}"
            for e in exc.errors()[:3]
        )
        raise ProposalRefused(
            f"the model's draft is not a proposal ({problems}): nothing was kept; draft "
            "again, or use the rules' proposal",
            finding=finding.finding_id,
        ) from None
    rung = LADDER[finding.root_cause]
    if RUNGS.index(draft.layer) > RUNGS.index(rung):
        raise ProposalRefused(
            f"the draft puts the change on {draft.layer}, higher on the ladder than {rung}, "
            f"the rung a {finding.root_cause} finding is corrected on: nothing was kept",
            finding=finding.finding_id,
        )
    own = f"agent {finding.agent}"
    if draft.scope != own and not draft.scope.startswith(f"{own},"):
        raise ProposalRefused(
            f"the draft's scope {draft.scope!r} is not inside {own!r}, the agent the finding "
            "is about: nothing was kept",
            finding=finding.finding_id,
        )
    cited = set(draft.trace_refs)
    if not cited or not cited <= set(refs(finding)):
        invented = ", ".join(sorted(cited - set(refs(finding)))) or "none"
        raise ProposalRefused(
            f"the draft must cite the finding's own evidence (it cites {invented} that the "
            "finding does not have): nothing was kept",
            finding=finding.finding_id,
        )
    if not draft.change.strip():
        raise ProposalRefused(
            "the draft proposes no change: nothing was kept", finding=finding.finding_id
        )
    return Proposal(
        proposal_id="prp_" + digest([finding.finding_id, draft.layer, draft.change, model])[:16],
        finding_id=finding.finding_id,
        agent=finding.agent,
        agent_ref=finding.agent_ref,
        layer=draft.layer,
        scope=draft.scope,
        change=draft.change.strip(),
        rationale=draft.rationale,
        impact=draft.impact,
        trace_refs=draft.trace_refs,
        drafted_by=f"model {model}",
    )


def model_of(spec: str | ModelAdapter) -> ModelAdapter:
    """A model string (`openai:MODEL`, `local`, …), or a reference (`path.py:attr`,
    `module:attr`) to a model adapter, as its adapter."""
    if not isinstance(spec, str):
        return spec
    head = spec.partition(":")[0]
    if not (head.endswith(".py") or "." in head):
        return resolve_model(spec)
    found = load_ref(spec)
    if not isinstance(found, ModelAdapter):
        raise ConfigError(
            f"{spec} names a {type(found).__name__}, not a model: name a model adapter, or "
            "give a model string such as openai:MODEL",
            ref=spec,
        )
    return found


async def draft_with(model: ModelAdapter, finding: Finding) -> Proposal:
    """Ask `model` to draft a proposal for `finding`; the checked proposal (not yet kept)."""
    response = await model.complete(request_for(finding))
    return checked(finding, response.message.content or "", model=response.model or model.name)


def _unfenced(text: str) -> str:
    """The answer without a Markdown code fence around it, as models often add one."""
    t = text.strip()
    if t.startswith("```"):
        t = t.split("\n", 1)[1] if "\n" in t else ""
        t = t.rstrip().removesuffix("```")
    return t.strip()


__all__ = ["INSTRUCTIONS", "Draft", "checked", "draft_with", "model_of", "request_for"]
