"""The one write the scan may propose: frontmatter for the pages that have none, after a
person approves that exact list of files.

The proposal is computed from a report (no model); it runs as a run whose only tool,
`add_frontmatter`, is governed by `FIX_POLICY`: the call stops in `input_required` with a
frozen action (the files, their titles, the blast radius) and runs only under an approval of
that action's hash. An approval for twelve files does not cover a thirteenth: that is another
action, another approval. A revoked approval is refused when the run resumes.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from contextos import (
    Agent,
    Budget,
    FinishReason,
    Interrupt,
    Message,
    ModelRequest,
    ModelResponse,
    Policy,
    Rule,
    RunNotFound,
    RunStatus,
    Runtime,
    ToolCall,
    Usage,
    tool,
)
from contextos.errors import ConfigError
from contextos.jobs.kb.findings import FindingKind
from contextos.jobs.kb.markdown import parse
from contextos.jobs.kb.report import Report
from contextos.policy import Decision

FIX_TOOL = "add_frontmatter"
FIX_AGENT = "kb-fix-frontmatter"

EDITOR = "kb-editor"
"""The approver role the fix needs."""


def fix_policy(editors: tuple[str, ...]) -> Policy:
    """Every call of the fix tool waits for the approval of one of `editors` (the role
    `kb-editor`), bound to its exact arguments."""
    return Policy(name="kb-fix", version="1", rules=(FIX_RULE,), roles={EDITOR: editors})


FIX_RULE = Rule(
    id="kb-fix-needs-approval",
    tools=(FIX_TOOL,),
    decision=Decision.REQUIRE_APPROVAL,
    approver_role=EDITOR,
    reason="the scan writes to the knowledge base only with a person's approval",
    preview="Add a `title` frontmatter block to {count} page(s): {files}",
    blast_radius="writes {count} file(s) under {root}, lines 1-3 of each: {files}",
)


class Proposal(BaseModel):
    """What the fix would write: a frozen list of pages and the title each one gets."""

    model_config = ConfigDict(frozen=True)

    root: str
    files: tuple[str, ...]
    titles: tuple[str, ...]

    @property
    def key(self) -> str:
        """The same proposal always has the same key; a different list, another one."""
        return hashlib.sha256(self.model_dump_json().encode()).hexdigest()[:24]


def propose_frontmatter(root: str | os.PathLike[str], report: Report) -> Proposal:
    """Frontmatter for every page the report says has none (still there now)."""
    base = Path(os.path.realpath(root))
    files = sorted({f.path for f in report.current() if f.kind is FindingKind.MISSING_FRONTMATTER})
    titles = [_title(base / path) for path in files]
    return Proposal(root=str(base), files=tuple(files), titles=tuple(titles))


def _title(page: Path) -> str:
    found = parse(page.read_text(errors="replace")).title
    return found or page.stem.replace("-", " ").replace("_", " ").capitalize()


def fix_agent(proposal: Proposal) -> Agent:
    """The run that applies `proposal`: one governed tool call, proposed by code."""
    base = Path(proposal.root)

    @tool(name=FIX_TOOL, effect="reversible_write", risk="high", scopes=("files:write",))
    def add_frontmatter(
        files: list[str], titles: list[str], count: int, root: str
    ) -> dict[str, Any]:
        """Prepend `---\\ntitle: …\\n---` to each page that still has no frontmatter."""
        if root != str(proposal.root) or len(files) != len(titles) or count != len(files):
            raise ConfigError("the fix's arguments do not match its proposal")
        written: list[str] = []
        for path, title in zip(files, titles, strict=True):
            real = Path(os.path.realpath(base / path))
            if base not in real.parents or path not in proposal.files:
                raise ConfigError(f"{path} is not a page of the approved proposal")
            text = real.read_text()
            if parse(text).frontmatter.present:
                continue  # fixed since it was proposed: nothing to add
            real.write_text(f"---\ntitle: {json.dumps(title)}\n---\n{text}")
            written.append(path)
        return {"written": written}

    return Agent(
        name=FIX_AGENT,
        model=_Proposer(proposal),
        instructions="Apply the approved frontmatter proposal.",
        tools=[add_frontmatter],
        budget=Budget(max_turns=3),
    )


class _Proposer:
    """The fix's proposer: code, not a model. It calls the fix tool once with the proposal,
    then reports what the tool did."""

    name = "kb-fix:proposer"

    def __init__(self, proposal: Proposal) -> None:
        self.proposal = proposal

    async def complete(self, request: ModelRequest) -> ModelResponse:
        results = [m for m in request.messages if m.role == "tool"]
        usage = Usage(input_tokens=0, output_tokens=0, requests=1)
        if not results:
            p = self.proposal
            args = {"files": list(p.files), "titles": list(p.titles), "count": len(p.files)}
            call = ToolCall(id="fix", name=FIX_TOOL, arguments=json.dumps({**args, "root": p.root}))
            return ModelResponse(
                message=Message(role="assistant", tool_calls=(call,)),
                finish_reason=FinishReason.TOOL_CALLS,
                usage=usage,
                model=self.name,
            )
        return ModelResponse(
            message=Message(role="assistant", content=results[-1].content or ""),
            finish_reason=FinishReason.STOP,
            usage=usage,
            model=self.name,
        )


@dataclass(kw_only=True, slots=True)
class FixOutcome:
    """What one `fix_frontmatter` call did."""

    written: list[str] = field(default_factory=list)
    """Files written, each under an approval of the exact list it was part of."""
    waiting: list[Interrupt] = field(default_factory=list)
    """Proposals waiting for a person: each interrupt holds the frozen action to approve."""


async def fix_frontmatter(
    store: str | None,
    root: str | os.PathLike[str],
    report: Report,
    *,
    editors: tuple[str, ...],
) -> FixOutcome:
    """Apply what was approved, then propose what is still missing.

    First every earlier fix run for this folder is resumed: one whose frozen list was
    approved writes exactly that list (a revoked or expired approval writes nothing and asks
    again); one not approved yet keeps waiting. Then the pages still without frontmatter that
    no waiting run covers become a new proposal, which waits for an approval of its own.
    """
    outcome = FixOutcome()
    proposal = propose_frontmatter(root, report)
    base = proposal.root
    covered: set[str] = set()
    async with Runtime(store, policy=fix_policy(editors)) as rt:
        pending = [
            run.run_id
            for status in (RunStatus.QUEUED, RunStatus.INPUT_REQUIRED)
            for run in await rt.runs(status=status, limit=1000)
            if run.agent_name == FIX_AGENT
        ]
        for run_id in pending:
            earlier = Proposal.model_validate_json((await rt.state(run_id)).input)
            if earlier.root != base:
                continue
            done = await rt.resume(run_id, fix_agent(earlier))
            if done.status is RunStatus.COMPLETED:
                outcome.written += await _written(rt, run_id)
            else:
                covered.update(earlier.files)
                outcome.waiting += [i for i in await rt.inbox() if i.run_id == run_id]
        fresh = _still_missing(proposal, covered)
        if fresh.files:
            new_id = f"run_kbfix_{fresh.key}"
            try:
                await rt.state(new_id)
            except RunNotFound:
                await rt.run(fix_agent(fresh), fresh.model_dump_json(), run_id=new_id)
            outcome.waiting += [i for i in await rt.inbox() if i.run_id == new_id]
    return outcome


async def _written(rt: Runtime, run_id: str) -> list[str]:
    """The files the fix tool wrote, as its recorded result says (what the model was shown
    is that result inside an untrusted-data block, not the result itself)."""
    for entry in reversed(await rt.timeline(run_id)):
        data = entry.data
        if entry.type == "tool_completed" and data.get("name") == FIX_TOOL:
            if data.get("is_error"):
                return []
            written: list[str] = json.loads(data["output"])["written"]
            return written
    return []


def _still_missing(proposal: Proposal, covered: set[str]) -> Proposal:
    """The part of `proposal` that no waiting run covers and that still has no frontmatter."""
    base = Path(proposal.root)
    kept = [
        (f, t)
        for f, t in zip(proposal.files, proposal.titles, strict=True)
        if f not in covered and not parse((base / f).read_text()).frontmatter.present
    ]
    return Proposal(
        root=proposal.root,
        files=tuple(f for f, _ in kept),
        titles=tuple(t for _, t in kept),
    )
