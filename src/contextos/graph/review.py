"""Children's results put to a person before their workflow takes them in (merge policy
`person_reviews`): the workflow waits on a `review_required` interrupt holding the result;
accepted, the result is taken in; rejected, the child's delegation ends `rejected`, a failure
of its node or item; sent back with comments (`revise`, while the node has revisions left), a
new child run is given the same input, the earlier result and the comments, and its result is
reviewed in turn. A map's results are put to a person together: one question covers every
item's result that waits for review, and its answer gives a verdict for all of them, or one
for each; the revisions it asks for run side by side and are reviewed together in turn. Like
every question a workflow asks, one is put to a person at a time, since answering one queues
the workflow again."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from contextos import events as ev
from contextos.delegation import ChildRun, ChildStatus, MergePolicy
from contextos.graph.code import CodeJournal
from contextos.graph.workflow import Node
from contextos.records.interrupts import Interrupt, InterruptKind, ReviewAnswer

SHOWN_CHARS = 300
"""How much of a child's result a review's question quotes (its payload holds all of it)."""

SHOWN_ITEMS = 10
"""How many of a map's results a review's question quotes (its payload holds all of them)."""


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
        self._unasked: dict[str, list[tuple[ChildRun, int]]] = {}
        """By map node: its items' results (with their revision numbers) that wait for the
        node's next question (`ask_together`)."""

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
        found = _asked_about(self.j.state.interrupts.values(), child.contract.delegation_id)
        if found is None:
            if node.kind == "map":
                self._unasked.setdefault(node.name, []).append((child, number))
            elif self._may_ask():
                await self._ask(node, child, number)
            return None
        asked, entry = found
        if asked.status != "answered" or asked.answer is None:
            return None
        verdict, said = ReviewAnswer.model_validate(asked.answer).given(str(entry.get("item")))
        if verdict == "accept":
            return child
        said = said or "no comments"
        who = asked.answered_by or "a person"
        if verdict == "revise":
            return Revise(number=number + 1, earlier=child, comments=said, by=who)
        return replace(
            child,
            status=ChildStatus.REJECTED,
            reason="review",
            message=f"{who} rejected it: {said}",
        )

    async def ask_together(self, node: Node[Any]) -> None:
        """Put the results of a map's items that wait for review to a person in one question
        (when the workflow may ask now; else on a later drive)."""
        waiting = sorted(self._unasked.pop(node.name, []), key=lambda w: w[0].contract.index)
        if not waiting or not self._may_ask():
            return
        entries = [_entry(node, child, number) for child, number in waiting]
        shown = "; ".join(
            f"item {e['item']}, from child run {e['child_run_id']}: {_clipped(e['result'])}"
            for e in entries[:SHOWN_ITEMS]
        )
        if len(entries) > SHOWN_ITEMS:
            shown += f"; and {len(entries) - SHOWN_ITEMS} more (the question's items hold all)"
        spent = [str(e["item"]) for e in entries if "revise" not in e["verdicts"]]
        if len(spent) == len(entries):
            back = ""
        elif spent:
            none_left = f"items {', '.join(spent)}: no revision left"
            back = f", or send back with comments to be revised ({none_left})"
        else:
            back = ", or send back with comments to be revised"
        count = f"the {len(entries)} results" if len(entries) > 1 else "the result"
        payload = {
            "question": (
                f"Review {count} of node {node.name}: {shown}. Accept, reject with comments "
                f"(the node takes a rejected result as a failure){back}: one verdict for "
                'all, or one for each as {"verdict": "accept", "items": {"<item>": '
                '{"verdict": "reject", "comments": "…"}}}.'
            ),
            "node": node.name,
            "items": entries,
            "verdicts": _common(entries),
        }
        await self._raise(payload)

    async def _ask(self, node: Node[Any], child: ChildRun, number: int) -> None:
        entry = _entry(node, child, number)
        left = node.revisions - (number - 1)
        back = (
            f", or send it back with comments to be revised ({left} revision"
            f"{'' if left == 1 else 's'} left)"
            if left > 0
            else ""
        )
        payload = {
            "question": (
                f"Review the result of node {node.name}, from child run "
                f"{entry['child_run_id']}: {_clipped(child.result)}. Accept it, reject it with "
                f"comments (the node takes a rejected result as a failure){back}."
            ),
            "node": node.name,
            **{k: v for k, v in entry.items() if k != "item"},
        }
        await self._raise(payload)

    async def _raise(self, payload: dict[str, Any]) -> None:
        kind = InterruptKind.REVIEW_REQUIRED.value
        await self.j.record(ev.InterruptRaised, kind=kind, payload=payload)


def _entry(node: Node[Any], child: ChildRun, number: int) -> dict[str, Any]:
    """What a review question holds of one result: whose it is, it, the verdicts it takes."""
    c = child.contract
    left = node.revisions - (number - 1)
    return {
        "item": c.index,
        "delegation": c.delegation_id,
        "child_run_id": c.child_run_id,
        "result": child.result,
        "revision": number,
        "verdicts": ["accept", "reject", "revise"] if left > 0 else ["accept", "reject"],
    }


def _common(entries: list[dict[str, Any]]) -> list[str]:
    """The verdicts every entry takes: what one verdict for all may be."""
    return [v for v in ("accept", "reject", "revise") if all(v in e["verdicts"] for e in entries)]


def _asked_about(interrupts: Iterable[Interrupt], key: str) -> tuple[Interrupt, Any] | None:
    """The review question about the child of delegation `key`, with what it holds of that
    child's result (a map's question covers several)."""
    for asked in interrupts:
        if asked.kind != InterruptKind.REVIEW_REQUIRED:
            continue
        payload = asked.payload
        if payload.get("delegation") == key:
            return asked, payload
        for entry in payload.get("items") or ():
            if isinstance(entry, Mapping) and entry.get("delegation") == key:
                return asked, entry
    return None


def _clipped(result: Any) -> str:
    text = json.dumps(result, ensure_ascii=False)
    return text if len(text) <= SHOWN_CHARS else text[: SHOWN_CHARS - 1] + "…"
