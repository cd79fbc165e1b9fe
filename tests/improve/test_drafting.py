"""A model may draft a proposal: its answer is checked into the typed record and kept beside
the rules' proposals, or refused with nothing kept; a kept draft changes nothing until a
candidate made from it is replayed and released."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from orders import desk
from test_improve_cli import cli_for
from test_improvement_loop import REF, seed

from contextos import Runtime
from contextos.errors import ProposalRefused
from contextos.events import RunCreated
from contextos.improve import Finding, Improvements, Layer
from contextos.improve.ledger import PREFIX
from contextos.models.base import ModelRequest, ModelResponse
from contextos.testing import ScriptedModel, reply

WORDED = "Look an order up by its id, which starts with ORD- (ORD-1234), never a bare number."


def drafted(finding: Finding, **changes: Any) -> dict[str, Any]:
    """A well-formed draft for the order desk's finding, with `changes` made to it."""
    return {
        "layer": "tool_description",
        "scope": "agent order-desk, tool lookup_order",
        "change": WORDED,
        "rationale": "the model called with a bare number, then with ORD-: nobody told it",
        "impact": {"metric": "tool_error per run", "baseline": 1.0, "target": 0.0},
        "trace_refs": [f"{e.run_id}#{e.seq}" for e in finding.evidence],
        **changes,
    }


async def scanned(rt: Runtime) -> tuple[Improvements, Finding, str]:
    _, golden = await seed(rt)
    loop = Improvements(rt)
    [finding] = (await loop.scan()).findings
    return loop, finding, golden


async def kept_proposals(rt: Runtime) -> list[str]:
    return [s.run_id for s in await rt.runs(limit=500) if s.agent_name == PREFIX + "proposal"]


async def test_a_drafted_proposal_is_kept_and_changes_nothing_until_released(
    tmp_path: Path,
) -> None:
    async with Runtime(str(tmp_path / "c.db")) as rt:
        loop, finding, golden = await scanned(rt)
        seen: list[ModelRequest] = []

        def draft(request: ModelRequest) -> ModelResponse:
            seen.append(request)
            return reply(json.dumps(drafted(finding)))

        model = ScriptedModel([draft])
        proposal = await loop.draft(finding.finding_id, model)
        model.assert_complete()
        shown = json.loads(seen[0].messages[-1].content or "")
        assert shown["finding"]["finding_id"] == finding.finding_id  # worded from the evidence
        assert shown["rung"] == "tool_description"
        assert seen[0].output_schema is not None

        assert (proposal.layer, proposal.change, proposal.drafted_by) == (
            Layer.TOOL_DESCRIPTION,
            WORDED,
            "model scripted",
        )
        assert (proposal.finding_id, proposal.agent, proposal.agent_ref) == (
            finding.finding_id,
            "order-desk",
            REF,
        )
        [rules, listed] = await loop.proposals()  # kept beside the rules' proposal
        assert rules.drafted_by == "rules" and listed == proposal
        assert await loop.proposal(proposal.proposal_id) == proposal

        later = await rt.run(desk(), "Where is order 3?")  # a proposal is never a write
        created = (await rt.events(later.run_id))[0]
        assert isinstance(created, RunCreated)
        assert created.agent_hash == desk().identity_hash()
        assert await loop.current("order-desk") is None

        candidate = await loop.candidate(proposal.proposal_id)  # the way it can reach runs
        assert candidate.change.text == WORDED and candidate.change.target == "lookup_order"
        report = await loop.check(candidate.candidate_id, golden=[golden])
        assert (report.count("fixed"), report.count("regressed")) == (3, 0)


REFUSED = [
    ({"layer": "prompt_rewrite"}, "layer: Input should be"),
    ({"layer": "policy_rule"}, "higher on the ladder than tool_description"),
    ({"scope": "agent billing, tool refund"}, "not inside 'agent order-desk'"),
    ({"trace_refs": ["run_made_up#3"]}, "it cites run_made_up#3"),
    ({"trace_refs": []}, "must cite the finding's own evidence"),
    ({"change": "  "}, "proposes no change"),
]


@pytest.mark.parametrize(("changes", "why"), REFUSED)
async def test_a_draft_the_ladder_does_not_allow_is_refused_and_nothing_is_kept(
    tmp_path: Path, changes: dict[str, Any], why: str
) -> None:
    async with Runtime(str(tmp_path / "c.db")) as rt:
        loop, finding, _ = await scanned(rt)
        model = ScriptedModel([reply(json.dumps(drafted(finding, **changes)))])
        with pytest.raises(ProposalRefused, match=why) as refused:
            await loop.draft(finding.finding_id, model)
        assert "nothing was kept" in str(refused.value) and "\n" not in str(refused.value)
        assert await kept_proposals(rt) == []
        assert [p.drafted_by for p in await loop.proposals()] == ["rules"]


async def test_an_answer_that_is_not_a_draft_is_refused(tmp_path: Path) -> None:
    async with Runtime(str(tmp_path / "c.db")) as rt:
        loop, finding, _ = await scanned(rt)
        for answer in ("Change the description to say ORD-.", json.dumps({"layer": "gate"})):
            with pytest.raises(ProposalRefused, match="is not a proposal"):
                await loop.draft(finding.finding_id, ScriptedModel([reply(answer)]))
        assert await kept_proposals(rt) == []


DRAFTER = """
import json
from contextos.testing import ScriptedModel, reply

def answer(request):
    finding = json.loads(request.messages[-1].content)["finding"]
    refs = [f"{e['run_id']}#{e['seq']}" for e in finding["evidence"]]
    return reply(json.dumps({
        "layer": "tool_description",
        "scope": "agent order-desk, tool lookup_order",
        "change": "Order ids start with ORD-.",
        "rationale": "bare numbers fail",
        "impact": {"metric": "tool_error per run", "baseline": 1.0, "target": 0.0},
        "trace_refs": refs[:1],
    }))

model = ScriptedModel([answer])
wrong = ScriptedModel([reply('{"layer": "policy_rule"}')])
"""


async def test_drafting_from_the_command_line(tmp_path: Path) -> None:
    cli = cli_for(tmp_path)
    drafter = tmp_path / "drafter.py"
    drafter.write_text(DRAFTER)
    async with Runtime(str(tmp_path / "c.db")) as rt:
        _, finding, _ = await scanned(rt)
    done = cli("proposals", "--draft", finding.finding_id, "--model", f"{drafter}:model")
    assert done.returncode == 0, done.stderr
    assert "change: Order ids start with ORD-." in done.stdout
    assert "drafted by model scripted" in done.stdout and "drafted by rules" in done.stdout
    refused = cli("proposals", "--draft", finding.finding_id, "--model", f"{drafter}:wrong")
    assert refused.returncode == 1 and "Traceback" not in refused.stderr
    assert "is not a proposal" in refused.stderr
    alone = cli("proposals", "--draft", finding.finding_id)
    assert alone.returncode == 1 and "go together" in alone.stderr
