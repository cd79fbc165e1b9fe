"""What became of the call of a code node that acts on the world, found stopped after its
intent was recorded and before its output was: its `reconcile` looks it up, or a person is
asked (`external_confirmation_required`), and the node never runs again unless one of them
says it did not act."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from contextos import events as ev
from contextos.agents import load_ref
from contextos.delegation import NodeRun
from contextos.errors import AnswerInvalid
from contextos.graph.code import CodeJournal, NodeCode, NodeFailed
from contextos.graph.declared import problems, type_name
from contextos.graph.workflow import Node, Workflow
from contextos.records.interrupts import Interrupt, InterruptKind
from contextos.runs import FailureReason
from contextos.state import RunState
from contextos.tools._invoke import error_text


@dataclass(frozen=True, slots=True)
class Acted:
    """The call acted, and the node gave `output` (checked with its type)."""

    output: Any


DID_NOT_ACT = object()
"""The call did not act: the node runs again, under a new intent."""

ASKED = object()
"""A person is asked (or was, and has not answered yet): the workflow waits."""


class Outcomes:
    """One workflow run's answers to "did this node's call act?"."""

    def __init__(
        self, journal: CodeJournal, code: NodeCode, *, may_ask: Callable[[], bool]
    ) -> None:
        self.j = journal
        self.code = code
        self._may_ask = may_ask
        """Whether the workflow may put a question to a person now (one at a time)."""

    async def of(self, node: Node[Any], started: NodeRun) -> Any:
        """What became of the call of the node's latest intent: Acted, DID_NOT_ACT or ASKED."""
        asked = self._asked_about(node.name, started.started_seq)
        return await (self._reconciled(node) if asked is None else self._told(node, asked))

    async def _reconciled(self, node: Node[Any]) -> Any:
        """What the node's reconcile finds; a person is asked when it has none, or it raised,
        or it gave what is not the node's output."""
        if node.reconcile is None:
            return await self._ask(node)
        try:
            key, found = await self.code.reconcile(node)
        except NodeFailed:
            raise
        except Exception as exc:
            return await self._ask(node, f"Its reconcile raised {error_text(exc)}.")
        if found is None:
            await self.j.record(ev.NodeReconciled, node=node.name, idempotency_key=key, acted=False)
            return DID_NOT_ACT
        try:
            value = node.adapter.validate_python(found)
        except ValidationError as exc:
            return await self._ask(
                node,
                f"Its reconcile found that it acted, but what it gave is not a valid "
                f"{type_name(node.output)}: {problems(exc)}.",
            )
        output = node.adapter.dump_python(value, mode="json")
        await self.j.record(
            ev.NodeReconciled, False, node=node.name, idempotency_key=key, acted=True, output=output
        )
        return Acted(value)

    async def _told(self, node: Node[Any], asked: Interrupt) -> Any:
        """What a person said, or ASKED while they have not."""
        if asked.status == "expired":
            raise NodeFailed(
                node.name,
                FailureReason.OUTCOME_UNKNOWN,
                f"node {node.name} ({node.effect}) was stopped after it started and before "
                "its output was recorded, and nobody said whether its effect happened, so "
                "it is not run again",
            )
        if asked.status != "answered" or asked.answer is None:
            return ASKED
        if asked.answer.get("outcome") != "committed":
            return DID_NOT_ACT
        try:
            value = node.adapter.validate_python(asked.answer.get("output"))
        except ValidationError as exc:
            return await self._ask(node, f"The output given before was refused: {problems(exc)}.")
        return Acted(value)

    def _asked_about(self, node: str, since_seq: int) -> Interrupt | None:
        """The latest question to a person about a node's unknown outcome, raised after its
        latest intent (an answer about an earlier attempt says nothing of this one)."""
        found = None
        for asked in self.j.state.interrupts.values():
            if asked.payload.get("node") == node and asked.raised_seq > since_seq:
                found = asked
        return found

    async def _ask(self, node: Node[Any], note: str = "") -> Any:
        """Ask a person whether the node's effect happened and, if it did, what the node gave;
        `note`: what was found or refused before."""
        if not self._may_ask():
            return ASKED
        again = f" {note}" if note else ""
        question = (
            f"Node {node.name} ({node.effect}) was stopped after it started and before its "
            "output was recorded: did its effect happen? Answer outcome=committed with the "
            f"node's output (a {type_name(node.output)}) as `output` if it did, or "
            f"outcome=failed to run it again.{again}"
        )
        payload = {
            "question": question,
            "node": node.name,
            "effect": node.effect,
            "output_schema": node.adapter.json_schema(),
            "answers": ["committed", "failed"],
        }
        kind = InterruptKind.EXTERNAL_CONFIRMATION_REQUIRED.value
        await self.j.record(ev.InterruptRaised, kind=kind, payload=payload)
        return ASKED


def check_confirmed_output(state: RunState, asked: Interrupt, answer: Mapping[str, Any]) -> None:
    """Refuse at once (AnswerInvalid) a person's word that a workflow node's effect happened
    when the output they give is not the node's type. Where the workflow's code does not load,
    the workflow refuses it when it goes on, and asks again."""
    node = asked.payload.get("node")
    if not isinstance(node, str) or answer.get("outcome") != "committed" or not state.agent_ref:
        return
    try:
        workflow = load_ref(state.agent_ref)
        declared = workflow.node(node) if isinstance(workflow, Workflow) else None
    except Exception:  # its code is not at hand here, or no longer has the node
        return
    if declared is None:
        return
    try:
        declared.adapter.validate_python(answer.get("output"))
    except ValidationError as exc:
        raise AnswerInvalid(
            f"the output is not a valid {type_name(declared.output)} (node {node}): "
            + problems(exc)
        ) from None
