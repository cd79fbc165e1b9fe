"""Children's results put to a person before their workflow takes them in (merge policy
`person_reviews`): the workflow waits on a `review_required` interrupt holding the result;
accepted, the result is taken in; rejected, the child's delegation ends `rejected`, a failure
of its node or item. Like every question a workflow asks, one is put to a person at a time,
since answering one queues the workflow again."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from contextos import events as ev
from contextos.delegation import ChildRun, ChildStatus, MergePolicy
from contextos.graph.code import CodeJournal
from contextos.graph.workflow import Node
from contextos.records.interrupts import InterruptKind

SHOWN_CHARS = 300
"""How much of a child's result a review's question quotes (its payload holds all of it)."""


class Reviews:
    """One workflow run's reviews of its children's results."""

    def __init__(self, journal: CodeJournal, *, may_ask: Callable[[], bool]) -> None:
        self.j = journal
        self._may_ask = may_ask
        """Whether the workflow may put a question to a person now (one at a time)."""

    async def taken_in(self, node: Node[Any], child: ChildRun) -> ChildRun | None:
        """A finished child as its workflow takes it in: under `person_reviews`, a completed
        one once a person accepted its result (None while they have not; one they rejected
        ends `rejected`)."""
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
                await self._ask(node, child)
            return None
        if asked.status != "answered" or asked.answer is None:
            return None
        if asked.answer.get("verdict") == "accept":
            return child
        said = str(asked.answer.get("comments") or "no comments")
        who = asked.answered_by or "a person"
        return replace(
            child,
            status=ChildStatus.REJECTED,
            reason="review",
            message=f"{who} rejected it: {said}",
        )

    async def _ask(self, node: Node[Any], child: ChildRun) -> None:
        c = child.contract
        which = f" (item {c.index})" if node.kind == "map" else ""
        payload = {
            "question": (
                f"Review the result of node {node.name}{which}, from child run "
                f"{c.child_run_id}: {_clipped(child.result)}. Accept it, or reject it with "
                "comments (the node takes a rejected result as a failure)."
            ),
            "node": node.name,
            "delegation": c.delegation_id,
            "child_run_id": c.child_run_id,
            "result": child.result,
            "verdicts": ["accept", "reject"],
        }
        kind = InterruptKind.REVIEW_REQUIRED.value
        await self.j.record(ev.InterruptRaised, kind=kind, payload=payload)


def _clipped(result: Any) -> str:
    text = json.dumps(result, ensure_ascii=False)
    return text if len(text) <= SHOWN_CHARS else text[: SHOWN_CHARS - 1] + "…"
