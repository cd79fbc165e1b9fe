"""A child's result put to a person before its workflow takes it in (`review=True`, merge
policy `person_reviews`): the workflow waits on a `review_required` interrupt holding the
result; accepted, the node takes it; rejected, the node takes it as a failure; sent back with
comments, a new child run revises it (given the earlier result and the comments, never the
earlier child's transcript) and its result is reviewed in turn."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from pydantic import BaseModel

from contextos import Agent, ConfigError, RunStatus, Runtime, Workflow
from contextos.delegation import MergePolicy
from contextos.errors import AnswerInvalid
from contextos.models.base import ModelRequest, ModelResponse
from contextos.records.interrupts import InterruptKind
from contextos.testing import ScriptedModel, reply


class Topic(BaseModel):
    name: str


class Topics(BaseModel):
    names: list[str]


class Draft(BaseModel):
    text: str


def drafting(request: ModelRequest) -> ModelResponse:
    """A note on the topic; a revision (told the comments) says what it answers."""
    asked = request.messages[-1].content
    given = json.loads(asked.rsplit("\n", 1)[-1])
    name = given["name"] if isinstance(given, dict) else given
    _, _, comments = asked.partition("\nComments: ")
    if comments:
        return reply(json.dumps({"text": f"a note on {name}, {comments.split(chr(10))[0]}"}))
    return reply(json.dumps({"text": f"a note on {name}"}))


writer = Agent(name="writer", model=ScriptedModel([drafting], by_turn=True), output_type=Draft)


def publish(draft: Draft) -> str:
    return f"published: {draft.text}"


def one_draft(revisions: int = 3) -> Workflow:
    flow = Workflow("publish", input=Topic)
    flow.agent("draft", writer, review=True, revisions=revisions)
    flow.code("publish", publish)
    return flow


@pytest.fixture
async def rt(tmp_path: Path) -> AsyncIterator[Runtime]:
    async with Runtime(str(tmp_path / "runs.db")) as runtime:
        yield runtime


def contextos(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "contextos", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "NO_COLOR": "1", "COLUMNS": "200"},
    )


async def test_an_accepted_result_is_taken_in(rt: Runtime, tmp_path: Path) -> None:
    flow = one_draft(revisions=0)
    waiting = await rt.run(flow, Topic(name="tides"), run_id="run_r")
    assert waiting.status is RunStatus.INPUT_REQUIRED
    state = await rt.state("run_r")
    (asked,) = state.pending_interrupts.values()
    assert asked.kind is InterruptKind.REVIEW_REQUIRED
    assert asked.payload["result"] == {"text": "a note on tides"}
    assert asked.payload["child_run_id"] == "run_r.draft"
    assert "publish" not in state.nodes  # nothing downstream ran on an unreviewed result
    child = await rt.state("run_r.draft")
    assert child.delegation is not None
    assert child.delegation.merge_policy is MergePolicy.PERSON_REVIEWS

    with pytest.raises(AnswerInvalid, match="'revise' is not a verdict this review takes"):
        await rt.answer(asked.id, {"verdict": "revise"}, answered_by="alice")
    # As docs/graph.md shows it, on the command line.
    store = ["--store", str(tmp_path / "runs.db")]
    inbox = contextos("inbox", *store)
    assert asked.id == "run_r.i7" and asked.id in inbox.stdout, inbox.stdout
    assert 'run_r.draft: {"text": "a note on tides"}. Accept it' in inbox.stdout
    answered = contextos("answer", asked.id, "accept", *store, "--as", "alice")
    assert answered.returncode == 0, answered.stderr
    done = await rt.resume("run_r", flow)
    assert done.status is RunStatus.COMPLETED
    assert done.structured_output == "published: a note on tides"
    assert [e.type for e in await rt.events("run_r.draft")].count("model_responded") == 1


async def test_a_rejected_result_fails_the_node_with_the_reviewers_comments(rt: Runtime) -> None:
    flow = one_draft()
    await rt.run(flow, Topic(name="tides"), run_id="run_r")
    (asked,) = (await rt.state("run_r")).pending_interrupts.values()
    verdict = {"verdict": "reject", "comments": "too short"}
    await rt.answer(asked.id, verdict, answered_by="alice")
    failed = await rt.resume("run_r", flow)
    assert failed.status is RunStatus.FAILED
    assert failed.failure_message == (
        "child run run_r.draft of node draft ended rejected (review): alice rejected it: too short"
    )
    assert "publish" not in (await rt.state("run_r")).nodes


async def test_a_map_collects_the_items_a_person_rejected_as_failed(rt: Runtime) -> None:
    flow = Workflow("notes", input=Topics)
    flow.map("drafts", writer, over="names", merge="collect", review=True)
    waiting = await rt.run(flow, Topics(names=["tides", "moons"]), run_id="run_m")
    assert waiting.status is RunStatus.INPUT_REQUIRED
    (question,) = (await rt.state("run_m")).pending_interrupts.values()  # one for the map
    entries = question.payload["items"]
    assert [(e["item"], e["child_run_id"]) for e in entries] == [
        (0, "run_m.drafts.0"),
        (1, "run_m.drafts.1"),
    ]
    assert [e["result"] for e in entries] == [
        {"text": "a note on tides"},
        {"text": "a note on moons"},
    ]
    verdict = {"verdict": "accept", "items": {"1": {"verdict": "reject", "comments": "off topic"}}}
    await rt.answer(question.id, verdict, answered_by="bo")
    done = await rt.resume("run_m", flow)
    assert done.status is RunStatus.COMPLETED
    out = done.structured_output
    assert out["results"] == [{"text": "a note on tides"}]
    assert [f["item"] for f in out["failed"]] == ["moons"]
    assert out["failed"][0]["reason"] == "output_invalid"
    assert out["failed"][0]["message"].endswith(
        "ended rejected (review): bo rejected it: off topic"
    )
    children = [e.type for e in await rt.events("run_m.drafts.1")]
    assert children.count("model_responded") == 1  # its child ran once, before the review


async def test_a_result_sent_back_is_revised_by_a_new_child_given_only_the_comments(
    rt: Runtime, tmp_path: Path
) -> None:
    flow = one_draft(revisions=1)
    await rt.run(flow, Topic(name="tides"), run_id="run_r")
    (first,) = (await rt.state("run_r")).pending_interrupts.values()
    assert first.payload["verdicts"] == ["accept", "reject", "revise"]
    assert "send it back with comments to be revised (1 revision left)" in str(
        first.payload["question"]
    )
    # As docs/graph.md shows it, on the command line.
    sent_back = '{"verdict": "revise", "comments": "name the moon"}'
    store = ["--store", str(tmp_path / "runs.db")]
    answered = contextos("answer", first.id, sent_back, *store, "--as", "alice")
    assert answered.returncode == 0, answered.stderr
    waiting = await rt.resume("run_r", flow)
    assert waiting.status is RunStatus.INPUT_REQUIRED  # the revision is reviewed in turn
    (second,) = (await rt.state("run_r")).pending_interrupts.values()
    assert second.payload["child_run_id"] == "run_r.draft.v2"
    assert second.payload["result"] == {"text": "a note on tides, name the moon"}
    assert second.payload["verdicts"] == ["accept", "reject"]  # no revision left
    with pytest.raises(AnswerInvalid, match="'revise' is not a verdict this review takes"):
        await rt.answer(second.id, "revise", answered_by="alice")

    # The revision's child was told the earlier result and the comments, nothing of the
    # earlier child's run but that.
    revision = await rt.state("run_r.draft.v2")
    assert revision.delegation is not None
    told = revision.messages[0].content
    assert 'Earlier result (child run run_r.draft): {"text": "a note on tides"}' in told
    assert "A reviewer (alice) sent back an earlier result" in told
    assert told.endswith('Input (Topic):\n{"name":"tides"}')
    assert [m.role for m in revision.messages] == ["user", "assistant"]

    await rt.answer(second.id, "accept", answered_by="alice")
    done = await rt.resume("run_r", flow)
    assert done.status is RunStatus.COMPLETED
    assert done.structured_output == "published: a note on tides, name the moon"
    for child in ("run_r.draft", "run_r.draft.v2"):  # each ran once
        assert [e.type for e in await rt.events(child)].count("model_responded") == 1
    (node, _) = (await rt.tree("run_r")).children
    assert [c.label for c in node.children] == ["run_r.draft", "run_r.draft.v2"]


async def test_a_map_is_reviewed_in_one_question_and_its_revisions_in_the_next(
    rt: Runtime, tmp_path: Path
) -> None:
    flow = Workflow("notes", input=Topics)
    flow.map("drafts", writer, over="names", review=True, revisions=1)
    names = ["tides", "moons", "comets"]
    waiting = await rt.run(flow, Topics(names=names), run_id="run_m")
    (first,) = (await rt.state("run_m")).pending_interrupts.values()
    assert first.id == "run_m.i11"  # as docs/graph.md names it
    assert [e["delegation"] for e in first.payload["items"]] == [
        "drafts.0",
        "drafts.1",
        "drafts.2",
    ]
    assert first.payload["verdicts"] == ["accept", "reject", "revise"]
    question = str(first.payload["question"])
    assert question.startswith("Review the 3 results of node drafts: item 0, from child run")
    assert 'item 2, from child run run_m.drafts.2: {"text": "a note on comets"}' in question
    with pytest.raises(
        AnswerInvalid, match="this review covers no item 7; it covers items 0, 1, 2"
    ):
        await rt.answer(
            first.id, {"verdict": "accept", "items": {"7": {"verdict": "reject"}}}, answered_by="bo"
        )
    # As docs/graph.md shows it, on the command line: two sent back, one accepted.
    sent_back = (
        '{"verdict": "revise", "comments": "shorter", "items": {"0": {"verdict": "accept"}}}'
    )
    store = ["--store", str(tmp_path / "runs.db")]
    answered = contextos("answer", first.id, sent_back, *store, "--as", "bo")
    assert answered.returncode == 0, answered.stderr
    waiting = await rt.resume("run_m", flow)
    assert waiting.status is RunStatus.INPUT_REQUIRED  # the two revisions, in one question
    (second,) = (await rt.state("run_m")).pending_interrupts.values()
    entries = second.payload["items"]
    assert [(e["item"], e["child_run_id"], e["revision"]) for e in entries] == [
        (1, "run_m.drafts.1.v2", 2),
        (2, "run_m.drafts.2.v2", 2),
    ]
    assert [e["result"]["text"] for e in entries] == [
        "a note on moons, shorter",
        "a note on comets, shorter",
    ]
    assert second.payload["verdicts"] == ["accept", "reject"]  # no revision left for either
    with pytest.raises(AnswerInvalid, match="'revise' is not a verdict item 2 takes"):
        await rt.answer(
            second.id,
            {"verdict": "accept", "items": {"2": {"verdict": "revise"}}},
            answered_by="bo",
        )
    await rt.answer(second.id, "accept", answered_by="bo")
    done = await rt.resume("run_m", flow)
    assert done.status is RunStatus.COMPLETED
    assert done.structured_output == [
        {"text": "a note on tides"},
        {"text": "a note on moons, shorter"},
        {"text": "a note on comets, shorter"},
    ]
    reviews = [
        i
        for i in (await rt.state("run_m")).interrupts.values()
        if i.kind is InterruptKind.REVIEW_REQUIRED
    ]
    assert len(reviews) == 2  # three results and two revisions, two questions
    for child in ("run_m.drafts.0", "run_m.drafts.1", "run_m.drafts.1.v2", "run_m.drafts.2.v2"):
        assert [e.type for e in await rt.events(child)].count("model_responded") == 1


async def test_a_review_of_one_result_takes_no_items(rt: Runtime) -> None:
    await rt.run(one_draft(), Topic(name="tides"), run_id="run_r")
    (asked,) = (await rt.state("run_r")).pending_interrupts.values()
    with pytest.raises(AnswerInvalid, match="this review is of one result"):
        await rt.answer(
            asked.id, {"verdict": "accept", "items": {"0": {"verdict": "accept"}}}, answered_by="bo"
        )


def test_review_is_for_agents_and_part_of_the_identity() -> None:
    flow = Workflow("w", input=Topics)
    with pytest.raises(ConfigError, match="review is of a child run's result"):
        flow.map("drafts", lambda name: name, over="names", item=str, output=str, review=True)
    with pytest.raises(ConfigError, match="add review=True"):
        flow.agent("draft", writer, revisions=1)
    with pytest.raises(ConfigError, match="revisions is a whole number of at least 0"):
        flow.agent("draft", writer, review=True, revisions=-1)
    assert one_draft(revisions=1).identity_hash() != one_draft().identity_hash()

    def build(review: bool) -> Workflow:
        flow = Workflow("publish", input=Topic)
        flow.agent("draft", writer, review=review)
        return flow

    assert build(True).identity_hash() != build(False).identity_hash()
    assert build(False).identity_hash() == one_draft_without_review().identity_hash()


def one_draft_without_review() -> Workflow:
    flow = Workflow("publish", input=Topic)
    flow.agent("draft", writer)
    return flow
