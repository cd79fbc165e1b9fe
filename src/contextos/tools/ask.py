"""Tools through which an agent asks a person: a question, a choice, a review.

Calling one raises a typed interrupt (`missing_information`, `choice_required` or
`review_required`); the run waits, holding nothing. Once a person answers, the call completes
with the answer as its result, which the tool runner reads from the run's log into the call's
`ToolContext` (so a crash in between loses nothing). The policy gate does the asking; the tools
only read.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

from contextos.errors import ToolError
from contextos.policy.hook import ProposedCall
from contextos.records.deadlines import Expiry
from contextos.records.interrupts import InterruptKind
from contextos.tools.contract import EffectKind, Risk, Tool, ToolContext, tool


@dataclass(frozen=True, kw_only=True)
class HumanTool(Tool):
    """A tool whose result is a person's answer."""

    interrupt_kind: InterruptKind = InterruptKind.MISSING_INFORMATION
    """The kind raised (a `choice_required` instead when the call offers options)."""
    expiry: Expiry | None = None
    """How long the question waits for an answer and what happens then (None: the policy's)."""

    def proposal(self, run_id: str, call_id: str, arguments: dict[str, Any]) -> ProposedCall:
        proposed = super().proposal(run_id, call_id, arguments)
        return replace(proposed, asks=self.interrupt_kind, expiry=self.expiry)


def _human(t: Tool, kind: InterruptKind, expiry: Expiry | None = None) -> HumanTool:
    data: dict[str, Any] = {f.name: getattr(t, f.name) for f in fields(t)}
    return HumanTool(**data, interrupt_kind=kind, expiry=expiry)


def _answer(ctx: ToolContext) -> dict[str, Any]:
    if ctx.answer is None:
        raise ToolError("no answer is recorded for this question; ask again")
    return ctx.answer


def ask_tools(
    *, expiry: Expiry | None = None, review_expiry: Expiry | None = None
) -> tuple[HumanTool, HumanTool]:
    """`ask_human` (a question, or a choice among `options`) and `request_review`.

    `expiry` is how long a question waits and what happens then, e.g.
    `Expiry(after_s=3600, on_expiry="default", default="north")`; `review_expiry` the same
    for reviews (None: the policy's or the runtime's default, else they wait until answered).
    """

    @tool(name="ask_human", effect=EffectKind.READ, risk=Risk.LOW)
    async def ask_human(
        question: str, ctx: ToolContext, options: list[str] | None = None
    ) -> dict[str, Any]:
        """Ask a person for information only they have, or to choose one of `options`.
        The run waits for the answer."""
        return _answer(ctx)

    @tool(name="request_review", effect=EffectKind.READ, risk=Risk.LOW)
    async def request_review(summary: str, ctx: ToolContext) -> dict[str, Any]:
        """Ask a person to review a result before going on: they accept, reject or ask for a
        revision with comments. The run waits for the verdict."""
        return _answer(ctx)

    return (
        _human(ask_human, InterruptKind.MISSING_INFORMATION, expiry),
        _human(request_review, InterruptKind.REVIEW_REQUIRED, review_expiry),
    )
