"""Conditional edges: a node's output picks the one node that runs next, the choice is
recorded with that output, skipped branches never run, and a join brings the branches back."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Literal

import pytest
from pydantic import BaseModel

from contextos import Agent, ConfigError, FailureReason, RunStatus, Runtime, Workflow
from contextos import events as ev
from contextos.testing import ScriptedModel, reply


class Ticket(BaseModel):
    text: str


class Triage(BaseModel):
    kind: Literal["refund", "question", "spam"]
    amount: float = 0


class Answer(BaseModel):
    said: str


def triage(ticket: Ticket) -> Triage:
    if "refund" in ticket.text:
        return Triage(kind="refund", amount=float(ticket.text.split()[-1]))
    return Triage(kind="question" if ticket.text.endswith("?") else "spam")


def refund(t: Triage) -> Answer:
    return Answer(said=f"refunded {t.amount:.2f}")


def is_refund(t: Triage) -> bool:
    return t.kind == "refund"


def is_question(t: Triage) -> bool:
    return t.kind == "question"


def helpdesk() -> Agent:
    return Agent(
        name="helpdesk",
        model=ScriptedModel([reply(json.dumps({"said": "see the FAQ"}))]),
        output_type=Answer,
    )


def support(*, otherwise: bool = True) -> Workflow:
    flow = Workflow("support", input=Ticket)
    kind = flow.code("triage", triage)
    paid = flow.code("refund", refund, after=kind)
    answered = flow.agent("answer", helpdesk(), after=kind, output=Answer)
    dropped = flow.code("drop", lambda t: Answer(said="dropped"), after=kind, output=Answer)
    flow.route(
        kind,
        (is_refund, paid),
        (is_question, answered),
        otherwise=dropped if otherwise else None,
    )
    flow.join("reply", after=[paid, answered, dropped])
    return flow


@pytest.fixture
async def rt(tmp_path: Path) -> AsyncIterator[Runtime]:
    async with Runtime(str(tmp_path / "runs.db")) as runtime:
        yield runtime


async def test_a_route_runs_the_chosen_branch_only_and_records_the_choice(rt: Runtime) -> None:
    done = await rt.run(support(), Ticket(text="please refund 12.5"))
    assert done.status is RunStatus.COMPLETED
    assert done.structured_output == {"said": "refunded 12.50"}
    state = await rt.state(done.run_id)
    assert set(state.nodes) == {"triage", "refund", "reply"}  # answer and drop never started
    assert state.children == {}  # the agent branch started no child run
    completed = [e for e in await rt.events(done.run_id) if isinstance(e, ev.NodeCompleted)]
    assert [(e.node, e.route) for e in completed] == [
        ("triage", "refund"),
        ("refund", None),
        ("reply", None),
    ]
    lines = [t.line for t in await rt.timeline(done.run_id) if t.type == "node_completed"]
    assert lines[0].startswith("triage completed → refund: ")
    drawn = (await rt.tree(done.run_id)).children
    assert drawn[0].detail == "routed to refund"  # `show` says which branch it took
    tree = {n.label: n.status for n in drawn}
    assert tree == {
        "triage": "completed",
        "refund": "completed",
        "answer": "skipped",
        "drop": "skipped",
        "reply": "completed",
    }


async def test_the_other_cases_and_otherwise_take_their_branches(rt: Runtime) -> None:
    asked = await rt.run(support(), Ticket(text="where is my parcel?"))
    assert asked.structured_output == {"said": "see the FAQ"}
    assert [c.contract.node for c in (await rt.state(asked.run_id)).children.values()] == ["answer"]
    spam = await rt.run(support(), Ticket(text="buy now"))
    assert spam.structured_output == {"said": "dropped"}
    assert set((await rt.state(spam.run_id)).nodes) == {"triage", "drop", "reply"}


async def test_no_route_holding_without_otherwise_fails_the_workflow(rt: Runtime) -> None:
    done = await rt.run(support(otherwise=False), Ticket(text="buy now"))
    assert done.status is RunStatus.FAILED
    assert done.failure_reason is FailureReason.NODE_FAILED
    assert "no route out of node triage" in (done.failure_message or "")
    assert "triage" not in {
        n for n, node in (await rt.state(done.run_id)).nodes.items() if node.status == "completed"
    }


async def test_a_predicate_that_answers_no_bool_fails_the_node(rt: Runtime) -> None:
    flow = Workflow("loose", input=Ticket)
    kind = flow.code("triage", triage)
    paid = flow.code("refund", refund, after=kind)
    flow.route(kind, (lambda t: t.kind, paid))
    done = await rt.run(flow, Ticket(text="refund 1"))
    assert done.status is RunStatus.FAILED
    assert "returned str, not a bool" in (done.failure_message or "")


async def test_a_skipped_output_node_is_a_clear_failure(rt: Runtime) -> None:
    flow = Workflow("unjoined", input=Ticket)
    kind = flow.code("triage", triage)
    paid = flow.code("refund", refund, after=kind)
    dropped = flow.code("drop", lambda t: Answer(said="dropped"), after=kind, output=Answer)
    flow.route(kind, (is_refund, paid), otherwise=dropped)
    flow.output(paid)
    done = await rt.run(flow, Ticket(text="hello"))
    assert done.status is RunStatus.FAILED
    assert "the output node refund was skipped" in (done.failure_message or "")
    assert "flow.join" in (done.failure_message or "")


def test_routes_are_part_of_the_identity() -> None:
    plain = Workflow("support", input=Ticket)
    kind = plain.code("triage", triage)
    plain.code("refund", refund, after=kind)
    assert "routes" not in plain.identity()  # a graph without routes keeps its hash

    def routed(predicate: object) -> Workflow:
        flow = Workflow("support", input=Ticket)
        kind = flow.code("triage", triage)
        flow.route(kind, (predicate, flow.code("refund", refund, after=kind)))  # type: ignore[arg-type]
        return flow

    assert routed(is_refund).identity_hash() == routed(is_refund).identity_hash()
    assert routed(is_refund).identity_hash() != routed(is_question).identity_hash()
    assert routed(is_refund).identity_hash() != plain.identity_hash()
    assert support().identity_hash() != support(otherwise=False).identity_hash()


def test_routes_are_checked_when_declared() -> None:
    flow = Workflow("checked", input=Ticket)
    kind = flow.code("triage", triage)
    paid = flow.code("refund", refund, after=kind)
    stranger = flow.code("other", lambda t: Answer(said=t.text), after=flow.start, output=Answer)
    with pytest.raises(ConfigError, match="'other' is not a node that reads 'triage'"):
        flow.route(kind, (is_refund, stranger))

    def wrong(t: Ticket) -> bool:
        return True

    with pytest.raises(ConfigError, match="parameter t takes Ticket, but it is given Triage"):
        flow.route(kind, (wrong, paid))

    def vague(t: Triage) -> str:
        return t.kind

    with pytest.raises(ConfigError, match="a predicate returns bool, not str"):
        flow.route(kind, (vague, paid))  # type: ignore[arg-type]  # what a type checker flags too
    with pytest.raises(ConfigError, match="needs at least one case"):
        flow.route(kind)
    flow.route(kind, (is_refund, paid))
    with pytest.raises(ConfigError, match="has its routes already"):
        flow.route(kind, (is_question, paid))
    with pytest.raises(ConfigError, match="its branches give Answer, Triage"):
        flow.join("reply", after=[paid, kind])


async def test_a_node_reading_a_skipped_node_is_skipped_and_one_reading_the_source_runs(
    rt: Runtime,
) -> None:
    flow = Workflow("audited", input=Ticket)
    kind = flow.code("triage", triage)
    paid = flow.code("refund", refund, after=kind)
    dropped = flow.code("drop", lambda t: Answer(said="dropped"), after=kind, output=Answer)
    flow.route(kind, (is_refund, paid), otherwise=dropped)
    flow.code("audit", lambda t, a: Answer(said=a.said), after=[kind, paid], output=Answer)
    flow.code("log", lambda t: Answer(said=t.kind), after=kind, output=Answer)
    flow.join("reply", after=[paid, dropped])
    done = await rt.run(flow, Ticket(text="hello"))
    assert done.structured_output == {"said": "dropped"}
    drawn = (await rt.tree(done.run_id)).children
    assert drawn[0].detail == "routed to drop"  # `show` says which branch it took
    tree = {n.label: n.status for n in drawn}
    assert tree == {
        "triage": "completed",
        "refund": "skipped",
        "drop": "completed",
        "audit": "skipped",
        "log": "completed",
        "reply": "completed",
    }
    assert set((await rt.state(done.run_id)).nodes) == {"triage", "drop", "log", "reply"}
