"""Children's results put to a person before their workflow takes them in (merge policy
`person_reviews`): the workflow waits on a `review_required` interrupt holding the result;
accepted, the result is taken in; rejected, the child's delegation ends `rejected`, a failure
of its node or item; sent back with comments (`revise`, while the node has revisions left), a
new child run is given the same input, the earlier result and the comments, and its result is
reviewed in turn. Like every question a workflow asks, one is put to a person at a time, since
answering one queues the workflow again."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from contextos import events as ev
from contextos.delegation import ChildRun, ChildStatus, MergePolicy
from contextos.graph.code import CodeJournal
from contextos.graph.workflow import Node
from contextos.records.interrupts import InterruptKind

SHOWN_CHARS = 300
"""How much of a child's result a review's question quotes (its payload holds all of it)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Revise:
    """A person sent a child's result back: the next revision is to be made."""

    number: int
    """Which revision to make (the first child is revision 1; its key `revision_key` gives)."""
    earlier: ChildRun
    comments: str
    by: str

    def objective(self, objective: str) -> str:
        """What the revision's child is told: the node's objective, then what it revises."""
        return (
            f"{objective}\n\nA reviewer ({self.by}) sent back an earlier result with comments; "
            f"give a revised result.\nEarlier result (child run "
            f"{self.earlier.contract.child_run_id}): "
            f"{json.dumps(self.earlier.result, ensure_ascii=False)}\nComments: {self.comments}"
        )


def revision_key(key: str, number: int) -> str:
    """The delegation key of revision `number` of the child keyed `key`."""
    return key if number == 1 else f"{key}.v{number}"


class Reviews:
    """One workflow run's reviews of its children's results."""

    def __init__(self, journal: CodeJournal, *, may_ask: Callable[[], bool]) -> None:
        self.j = journal
        self._may_ask = may_ask
        """Whether the workflow may put a question to a person now (one at a time)."""

    async def taken_in(
        self, node: Node[Any], child: ChildRun, *, number: int = 1
    ) -> ChildRun | Revise | None:
        """A finished child (revision `number` of its node's child) as its workflow
        takes it in: under `person_reviews`, a completed one once a person accepted its result
        (None while they have not; one they rejected ends `rejected`; one they sent back is
        the next revision to make)."""
        policy = child.contract.merge_policy
        if policy is not MergePolicy.PERSON_REVIEWS or child.status is not ChildStatus.COMPLETED:
            return child
        key = child.contract.delegation_id
        state = self.j.state
        asked = next(
            (i for i in state.interrupts.values() if i.payload.get("delegation") == key), None
        )
        if asked is None:
            if self._may_ask():
                await self._ask(node, child, number)
            return None
        if asked.status != "answered" or asked.answer is None:
            return None
        verdict = asked.answer.get("verdict")
        if verdict == "accept":
            return child
        said = str(asked.answer.get("comments") or "no comments")
        who = asked.answered_by or "a person"
        if verdict == "revise":
            return Revise(number=number + 1, earlier=child, comments=said, by=who)
        return replace(
            child,
            status=ChildStatus.REJECTED,
            reason="review",
            message=f"{who} rejected it: {said}",
        )

    async def _ask(self, node: Node[Any], child: ChildRun, number: int) -> None:
        c = child.contract
        which = f" (item {c.index})" if node.kind == "map" else ""
        left = node.revisions - (number - 1)
        verdicts = ["accept", "reject", "revise"] if left > 0 else ["accept", "reject"]
        back = (
            f", or send it back with comments to be revised ({left} revision"
            f"{'' if left == 1 else 's'} left)"
            if left > 0
            else ""
        )
        payload = {
            "question": (
                f"Review the result of node {node.name}{which}, from child run "
                f"{c.child_run_id}: {_clipped(child.result)}. Accept it, reject it with "
                f"comments (the node takes a rejected result as a failure){back}."
            ),
            "node": node.name,
            "delegation": c.delegation_id,
            "child_run_id": c.child_run_id,
            "result": child.result,
            "revision": number,
            "verdicts": verdicts,
        }
        kind = InterruptKind.REVIEW_REQUIRED.value
        await self.j.record(ev.InterruptRaised, kind=kind, payload=payload)


def _clipped(result: Any) -> str:
    text = json.dumps(result, ensure_ascii=False)
    return text if len(text) <= SHOWN_CHARS else text[: SHOWN_CHARS - 1] + "…"
