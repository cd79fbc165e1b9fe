"""Workflows: typed nodes and edges, recorded outputs, fan-out, gates, loops, budgets, people,
and what `show`, `runs` and traces make of them."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from pydantic import BaseModel

from contextos import (
    Agent,
    AgentChanged,
    Budget,
    ConfigError,
    FailureReason,
    Policy,
    Principal,
    Rule,
    RunStatus,
    Runtime,
    Workflow,
    tool,
)
from contextos import events as ev
from contextos.graph import ClaimCheck, load_runnable
from contextos.models.base import ModelRequest, ModelResponse
from contextos.policy import Decision
from contextos.telemetry import spans_for
from contextos.telemetry._ids import span_id_for, trace_id_for
from contextos.testing import ScriptedModel, call_tool, reply
from support.waiting import never_answering

ROOT = Path(__file__).resolve().parents[2]


class Numbers(BaseModel):
    values: list[int]


class Total(BaseModel):
    total: int


class Doubled(BaseModel):
    value: int


@pytest.fixture
async def rt(tmp_path: Path) -> AsyncIterator[Runtime]:
    async with Runtime(str(tmp_path / "runs.db")) as runtime:
        yield runtime


def given(request: ModelRequest) -> object:
    return json.loads(request.messages[-1].content.rsplit("\n", 1)[-1])


def doubler(**kw: object) -> Agent:
    def step(request: ModelRequest) -> ModelResponse:
        return reply(json.dumps({"value": 2 * int(given(request))}))  # type: ignore[call-overload]

    return Agent(name="doubler", model=ScriptedModel([step] * 20), output_type=Doubled, **kw)  # type: ignore[arg-type]


def add_up(parts: list[Doubled]) -> Total:
    return Total(total=sum(p.value for p in parts))


# -- declared types ---------------------------------------------------------------------------


def test_edges_are_typed_when_the_workflow_is_declared() -> None:
    flow = Workflow("typed", input=Numbers)
    doubled = flow.map("double", doubler(), over="values")

    def wants_numbers(n: Numbers) -> Total:
        return Total(total=0)

    with pytest.raises(ConfigError, match="parameter n takes Numbers, but it is given list"):
        flow.code("wrong", wants_numbers, after=doubled)
    with pytest.raises(ConfigError, match="reduces a list"):
        flow.reduce("nothing-to-reduce", wants_numbers, after=flow.start)
    with pytest.raises(ConfigError, match="no field of that name"):
        flow.map("over-what", doubler(), over="missing", after=flow.start)
    with pytest.raises(ConfigError, match="return annotation or output"):
        flow.code("untyped", lambda parts: parts, after=doubled)
    with pytest.raises(ConfigError, match="two nodes named"):
        flow.map("double", doubler(), over="values", after=flow.start)
    with pytest.raises(ConfigError, match="node name"):
        flow.reduce("has.dot", add_up)
    total = flow.reduce("sum", add_up)
    assert total.output is Total and flow.output_node is total


def test_a_reference_to_a_class_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "flows.py").write_text(
        "from pydantic import BaseModel\n\nclass Scan(BaseModel):\n    folders: list[str]\n"
    )
    with pytest.raises(ConfigError, match="it names the class Scan; name an agent, a workflow"):
        load_runnable(f"{tmp_path / 'flows.py'}:Scan")


async def test_the_input_is_any_type_pydantic_checks(rt: Runtime) -> None:
    def grow(n: int) -> int:
        return n * 2

    counting = Workflow("counting", input=int)
    counting.loop("grow", grow, until=lambda n: n > 100, max_rounds=10)
    assert (await rt.run(counting, "5")).structured_output == 160  # text is read as JSON
    once = await rt.run(counting, 60)  # type: ignore[arg-type]
    assert once.structured_output == 120
    (drawn,) = (await rt.tree(once.run_id)).children
    assert drawn.detail == "1 round, converged"  # what `contextos show` draws
    with pytest.raises(ConfigError, match=r"is not a valid int: \(root\): Invalid JSON"):
        await rt.run(counting, "five")

    def shout(text: str) -> str:
        return text.upper()

    echo = Workflow("echo", input=str)
    echo.code("shout", shout)
    assert (await rt.run(echo, "hello")).structured_output == "HELLO"  # text is the value

    class Opaque:
        pass

    with pytest.raises(ConfigError, match="its input type Opaque is not one Pydantic can check"):
        Workflow("opaque", input=Opaque)


async def test_a_workflow_is_not_replayed_but_its_child_runs_are(rt: Runtime) -> None:
    flow = Workflow("sum-doubles", input=Numbers)
    flow.map("double", doubler(), over="values")
    flow.reduce("sum", add_up)
    result = await rt.run(flow, Numbers(values=[1, 2]))
    with pytest.raises(ConfigError, match="is a workflow: replay compares an agent's decisions"):
        await rt.replay(result.run_id)
    report = await rt.replay(f"{result.run_id}.double.1", doubler())
    assert report.status == "replay_equal", report.differences


def test_the_structure_is_part_of_the_identity() -> None:
    def build(kind: str) -> Workflow:
        flow = Workflow("same-name", input=Numbers)
        if kind == "map":
            flow.map("double", doubler(), over="values")
        else:
            flow.gate("double", lambda n: True, over="values")
        return flow

    assert build("map").identity_hash() == build("map").identity_hash()
    assert build("map").identity_hash() != build("gate").identity_hash()


async def test_a_run_never_resumes_under_a_different_graph(rt: Runtime) -> None:
    flow = Workflow("guarded", input=Numbers)
    flow.map("double", doubler(), over="values")
    run_id = await rt.start(flow, Numbers(values=[1]))
    changed = Workflow("guarded", input=Numbers)
    changed.map("double", doubler(), over="values")
    changed.reduce("sum", add_up)
    with pytest.raises(AgentChanged):
        await rt.resume(run_id, changed)
    assert (await rt.resume(run_id, flow)).status is RunStatus.COMPLETED


# -- running ----------------------------------------------------------------------------------


async def test_a_fan_out_runs_each_item_as_a_child_and_a_reduce_folds_them(rt: Runtime) -> None:
    flow = Workflow("sum-doubles", input=Numbers)
    flow.map("double", doubler(), over="values", concurrency=2)
    flow.reduce("sum", add_up)
    result = await rt.run(flow, Numbers(values=[1, 2, 3, 4, 5]))
    assert result.status is RunStatus.COMPLETED
    assert result.structured_output == {"total": 30}
    assert json.loads(result.output or "") == {"total": 30}
    state = await rt.state(result.run_id)
    assert state.nodes["double"].output == [{"value": v} for v in (2, 4, 6, 8, 10)]
    assert sorted(state.children) == [f"double.{i}" for i in range(5)]
    assert state.child_turns == 5 and result.turns == 5
    for child in state.children.values():
        assert child.contract.node == "double"
        assert child.contract.input_refs == (
            f"{result.run_id}#{state.nodes['double'].started_seq}",
        )


async def test_a_child_driven_from_its_creation_to_its_end_is_never_read_back(
    rt: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The parent hands its new child the state it was created with, and takes the child's
    log from what it committed for the hash of its record: neither is read from the store."""
    looked_at: list[str] = []
    for name in ("read", "get_run", "state"):
        original = getattr(rt.store, name)

        def watched(run_id: str, *a: object, _original=original, **kw: object) -> object:  # type: ignore[no-untyped-def]
            looked_at.append(run_id)
            return _original(run_id, *a, **kw)

        monkeypatch.setattr(rt.store, name, watched)
    flow = Workflow("sum-doubles", input=Numbers)
    flow.map("double", doubler(), over="values")
    flow.reduce("sum", add_up)
    result = await rt.run(flow, Numbers(values=[1, 2, 3]))
    assert result.structured_output == {"total": 12}
    children = [f"{result.run_id}.double.{i}" for i in range(3)]
    assert not set(looked_at) & set(children)
    # and the hash each child's finish records is still that of its stored log
    monkeypatch.undo()
    for child_id in children:
        [vouched] = await rt.receipts(child_id)
        assert vouched.matches and vouched.anchor.startswith(result.run_id + "#")
        assert vouched.record_hash == (await rt.record(child_id)).record_hash


async def test_a_fan_out_keeps_to_its_concurrency(rt: Runtime) -> None:
    running = 0
    most = 0

    @tool(timeout_s=10)
    async def hold(q: str) -> str:
        """Hold a slot."""
        nonlocal running, most
        running += 1
        most = max(most, running)
        await asyncio.sleep(0.05)
        running -= 1
        return "held"

    def step(request: ModelRequest) -> ModelResponse:
        if request.turn == 1:
            return call_tool("hold", {"q": "x"})
        return reply(json.dumps({"value": 0}))

    worker = Agent(
        name="holder", model=ScriptedModel([step] * 40), tools=[hold], output_type=Doubled
    )
    flow = Workflow("bounded", input=Numbers)
    flow.map("hold", worker, over="values", concurrency=2)
    result = await rt.run(flow, Numbers(values=list(range(6))))
    assert result.status is RunStatus.COMPLETED
    assert 1 <= most <= 2


async def test_nodes_that_read_only_finished_nodes_run_at_the_same_time(rt: Runtime) -> None:
    meeting = asyncio.Barrier(2)

    async def left(n: Numbers) -> Total:
        await asyncio.wait_for(meeting.wait(), 5)
        return Total(total=min(n.values))

    async def right(n: Numbers) -> Total:
        await asyncio.wait_for(meeting.wait(), 5)
        return Total(total=max(n.values))

    def spread(low: Total, high: Total) -> Total:
        return Total(total=high.total - low.total)

    flow = Workflow("waves", input=Numbers)
    low = flow.code("low", left, after=flow.start)
    high = flow.code("high", right, after=flow.start)
    flow.code("spread", spread, after=(low, high))
    result = await rt.run(flow, Numbers(values=[3, 9, 4]))
    assert result.status is RunStatus.COMPLETED, result.failure_message
    assert result.structured_output == {"total": 6}


async def test_an_output_that_fails_its_type_is_a_recorded_failure(rt: Runtime) -> None:
    after: list[object] = []

    def broken(n: Numbers) -> Total:
        return {"total": "many"}  # type: ignore[return-value]

    def next_step(t: Total) -> Total:
        after.append(t)
        return t

    flow = Workflow("invalid", input=Numbers)
    flow.code("count", broken)
    flow.code("next", next_step)
    result = await rt.run(flow, Numbers(values=[1]))
    assert result.status is RunStatus.FAILED
    assert result.failure_reason is FailureReason.OUTPUT_INVALID
    (failed,) = [e for e in await rt.events(result.run_id) if isinstance(e, ev.NodeFailed)]
    assert failed.node == "count" and failed.reason is FailureReason.OUTPUT_INVALID
    assert failed.errors and "total" in failed.errors[0]
    assert after == []  # nothing after it ran


async def test_a_child_whose_answer_never_fits_the_node_type_fails_it_as_output_invalid(
    rt: Runtime,
) -> None:
    """The child is asked for the node's type and corrected until its verification rounds run
    out; the parent records why it failed, and the node fails output_invalid, nothing after it
    running."""
    after: list[object] = []

    def next_step(d: Doubled) -> Doubled:
        after.append(d)
        return d

    vague = Agent(name="vague", model=ScriptedModel([reply('{"value": "two"}')] * 10))
    flow = Workflow("strict", input=Numbers)
    flow.agent("guess", vague, output=Doubled)
    flow.code("next", next_step)
    result = await rt.run(flow, Numbers(values=[1]))
    assert result.status is RunStatus.FAILED
    assert result.failure_reason is FailureReason.OUTPUT_INVALID
    events = await rt.events(result.run_id)
    (finished,) = [e for e in events if isinstance(e, ev.ChildRunFinished)]
    assert finished.status == "failed" and finished.reason == "output_invalid"
    assert "value" in finished.message
    (failed,) = [e for e in events if isinstance(e, ev.NodeFailed)]
    assert failed.node == "guess" and failed.reason is FailureReason.OUTPUT_INVALID
    assert after == []


async def test_code_that_raises_fails_the_workflow_with_its_own_reason(rt: Runtime) -> None:
    def explode(n: Numbers) -> Total:
        raise RuntimeError("the disk is full")

    flow = Workflow("raises", input=Numbers)
    flow.code("explode", explode)
    result = await rt.run(flow, Numbers(values=[1]))
    assert result.failure_reason is FailureReason.NODE_FAILED
    assert "the disk is full" in (result.failure_message or "")


async def test_a_gate_passes_and_rejects_each_item(rt: Runtime) -> None:
    def disprove_dead(link: str) -> ClaimCheck:
        alive = link.endswith("/ok")
        return ClaimCheck(holds=not alive, reason="it answered 200" if alive else "404")

    class Links(BaseModel):
        links: list[str]

    flow = Workflow("recheck", input=Links)
    flow.gate("dead", disprove_dead, over="links", claim="this link is dead")
    result = await rt.run(flow, Links(links=["a/404", "b/ok", "c/404"]))
    assert result.structured_output == {
        "passed": ["a/404", "c/404"],
        "rejected": [{"item": "b/ok", "reason": "it answered 200"}],
    }


async def test_an_agent_gate_runs_one_verifier_per_item(rt: Runtime) -> None:
    def verdict(request: ModelRequest) -> ModelResponse:
        assert "Try to disprove" in request.messages[-1].content
        assert "this number is even" in request.messages[-1].content
        return reply(json.dumps({"holds": int(given(request)) % 2 == 0}))  # type: ignore[call-overload]

    checker = Agent(name="checker", model=ScriptedModel([verdict] * 10), output_type=ClaimCheck)
    flow = Workflow("even", input=Numbers)
    flow.gate("even", checker, over="values", claim="this number is even")
    result = await rt.run(flow, Numbers(values=[1, 2, 4, 7]))
    assert result.structured_output == {
        "passed": [2, 4],
        "rejected": [{"item": 1, "reason": ""}, {"item": 7, "reason": ""}],
    }
    assert len((await rt.state(result.run_id)).children) == 4


async def test_a_loop_runs_until_it_converges_or_its_round_limit(rt: Runtime) -> None:
    calls: list[int] = []

    def halve(t: Total) -> Total:
        calls.append(t.total)
        return Total(total=t.total // 2)

    def settled(t: Total) -> bool:
        return t.total < 3

    def start(n: Numbers) -> Total:
        return Total(total=sum(n.values))

    for limit, on_limit, status in ((10, "fail", RunStatus.COMPLETED), (2, "fail", None)):
        calls.clear()
        flow = Workflow("halving", input=Numbers)
        flow.code("start", start)
        flow.loop("halve", halve, until=settled, max_rounds=limit, on_limit=on_limit)  # type: ignore[arg-type]
        result = await rt.run(flow, Numbers(values=[40]))
        if status is RunStatus.COMPLETED:
            assert result.structured_output == {"total": 2}
            assert calls == [40, 20, 10, 5]
            state = await rt.state(result.run_id)
            assert [r["total"] for r in state.nodes["halve"].rounds] == [20, 10, 5, 2]
            assert state.nodes["halve"].converged is True
        else:
            assert result.failure_reason is FailureReason.NOT_CONVERGED
            assert calls == [40, 20]

    accepting = Workflow("halving-accept", input=Numbers)
    accepting.code("start", start)
    accepting.loop("halve", halve, until=settled, max_rounds=2, on_limit="accept")
    result = await rt.run(accepting, Numbers(values=[40]))
    assert result.structured_output == {"total": 10}
    assert (await rt.state(result.run_id)).nodes["halve"].converged is False


async def test_children_are_carved_out_of_the_workflow_budget_and_give_back_the_rest(
    rt: Runtime,
) -> None:
    flow = Workflow("budgeted", input=Numbers, budget=Budget(max_turns=8))
    flow.map("double", doubler(budget=Budget(max_turns=3)), over="values", concurrency=6)
    flow.reduce("sum", add_up)
    result = await rt.run(flow, Numbers(values=[1, 2, 3, 4, 5, 6]))
    assert result.status is RunStatus.COMPLETED, result.failure_message
    contracts = [
        e.contract for e in await rt.events(result.run_id) if isinstance(e, ev.ChildRunStarted)
    ]
    # Two fit in the workflow's 8 turns at once; each later one waited for a sibling to give
    # back the 2 turns it did not use, rather than start cut short
    assert [c.budget.max_turns for c in contracts] == [3] * 6
    assert (await rt.state(result.run_id)).child_turns == 6


async def test_a_child_waiting_for_a_person_parks_the_workflow(tmp_path: Path) -> None:
    sent: list[str] = []

    @tool(effect="write")
    def send(text: str) -> str:
        """Send a message."""
        sent.append(text)
        return "sent"

    def step(request: ModelRequest) -> ModelResponse:
        if request.turn == 1:
            return call_tool("send", {"text": "hello"})
        return reply(json.dumps({"value": 1}))

    messenger = Agent(
        name="messenger", model=ScriptedModel([step] * 4), tools=[send], output_type=Doubled
    )
    flow = Workflow("needs-approval", input=Numbers)
    flow.agent("message", messenger)
    policy = Policy(
        rules=(
            Rule(
                id="ask", tools=("send",), decision=Decision.REQUIRE_APPROVAL, approver_role="ops"
            ),
        ),
        roles={"ops": ("olga",)},
    )
    async with Runtime(str(tmp_path / "runs.db"), policy=policy) as rt:
        bob = Principal.user("bob", scopes=("*",))
        first = await rt.run(flow, Numbers(values=[1]), principal=bob)
        assert first.status is RunStatus.QUEUED  # handed back, holding no worker
        (pending,) = await rt.inbox()
        assert pending.run_id == f"{first.run_id}.message"
        await rt.approve(pending.id, approver="olga")
        done = await rt.resume(first.run_id, flow)
    assert done.status is RunStatus.COMPLETED
    assert done.structured_output == {"value": 1}
    assert sent == ["hello"]


async def test_cancelling_a_workflow_cancels_its_children(tmp_path: Path) -> None:
    def lookup(q: str) -> str:
        """Look something up."""
        return "found"

    asker = Agent(
        name="asker",
        model=ScriptedModel([call_tool("lookup", {"q": "x"})]),
        tools=[lookup],
        output_type=Doubled,
    )
    flow = Workflow("cancelled", input=Numbers)
    flow.agent("ask", asker)
    rule = Rule(
        id="ask", tools=("lookup",), decision=Decision.REQUIRE_APPROVAL, approver_role="ops"
    )
    async with Runtime(str(tmp_path / "runs.db"), policy=Policy(rules=(rule,))) as rt:
        bob = Principal.user("bob", scopes=("*",))
        first = await rt.run(flow, Numbers(values=[1]), principal=bob)
        assert first.status is RunStatus.QUEUED
        assert (await rt.state(f"{first.run_id}.ask")).status is RunStatus.INPUT_REQUIRED
        cancelled = await rt.cancel(first.run_id, reason="not needed")
        child = await rt.state(f"{first.run_id}.ask")
        parent = await rt.state(first.run_id)
    assert child.status is RunStatus.CANCELLED
    assert f"its parent run {first.run_id} was cancelled" in (child.failure_message or "")
    assert cancelled.status is parent.status is RunStatus.CANCELLED  # nobody drove it
    # The child's turn counts in the workflow's, and the workflow recorded how it ended.
    assert parent.children["ask"].status.value == "cancelled"
    assert (parent.child_turns, cancelled.turns) == (1, 1)


async def test_cancelling_a_workflow_settles_a_childs_write_waiting_for_approval(
    tmp_path: Path,
) -> None:
    sent: list[str] = []

    @tool(effect="write")
    def send(text: str) -> str:
        """Send a message."""
        sent.append(text)
        return "sent"

    messenger = Agent(
        name="messenger",
        model=ScriptedModel([call_tool("send", {"text": "hello"})]),
        tools=[send],
        output_type=Doubled,
    )
    flow = Workflow("cancelled-write", input=Numbers)
    flow.agent("message", messenger)
    rule = Rule(id="ask", tools=("send",), decision=Decision.REQUIRE_APPROVAL, approver_role="ops")
    async with Runtime(str(tmp_path / "runs.db"), policy=Policy(rules=(rule,))) as rt:
        bob = Principal.user("bob", scopes=("*",))
        first = await rt.run(flow, Numbers(values=[1]), principal=bob)
        cancelled = await rt.cancel(first.run_id, reason="not needed")
        child = await rt.state(f"{first.run_id}.message")
        parent = await rt.state(first.run_id)
        inbox = await rt.inbox()
    # Neither the workflow nor its child was started from a reference a worker could load,
    # and the write was never sent: both end now instead of the child staying "ending".
    assert cancelled.status is child.status is RunStatus.CANCELLED
    assert child.ending is None and inbox == []
    (write,) = child.effects.values()
    assert write.error_code == "not_sent" and sent == []
    assert parent.children["message"].status.value == "cancelled"


async def test_cancelling_a_running_workflow_ends_it_with_what_its_children_spent(
    rt: Runtime,
) -> None:
    wait = never_answering()

    worker = Agent(
        name="worker",
        model=ScriptedModel([call_tool("wait", {"q": "x"})] * 3),
        tools=[wait],
        output_type=Doubled,
    )
    flow = Workflow("stopped", input=Numbers)
    flow.map("work", worker, over="values", concurrency=2)
    flow.reduce("sum", add_up)
    running = asyncio.create_task(rt.run(flow, Numbers(values=[1, 2, 3])))
    while len([r for r in await rt.runs(status=RunStatus.RUNNING) if ".work." in r.run_id]) < 2:
        await asyncio.sleep(0.02)
    (top,) = await rt.runs(top_level=True)
    cancelled = await rt.cancel(top.run_id, reason="wrong batch")
    result = await running  # the driver ends it: no error escapes
    assert cancelled.status is RunStatus.CANCELLED and result.status is RunStatus.CANCELLED
    events = await rt.events(top.run_id)
    assert [e.type for e in events[-4:]] == [
        "run_ending",
        "child_run_finished",
        "child_run_finished",
        "run_cancelled",
    ]
    assert events[-1].actor == "user"  # who asked, not the worker that recorded it
    children = [r for r in await rt.runs() if ".work." in r.run_id]
    assert {r.status for r in children} == {RunStatus.CANCELLED}
    (summary,) = await rt.runs(top_level=True)
    assert summary.turns == sum(r.turns for r in children) == 2
    assert summary.input_tokens == sum(r.input_tokens for r in children) > 0
    tree = await rt.tree(top.run_id)
    assert [(n.label, n.status) for n in tree.children] == [
        ("work", "cancelled"),
        ("sum", "not run"),
    ]


async def test_a_workflow_asked_to_end_while_nobody_drove_it_ends_when_next_driven(
    rt: Runtime,
) -> None:
    flow = Workflow("ending", input=Numbers)
    flow.map("double", doubler(), over="values")
    run_id = await rt.start(flow, Numbers(values=[1]))
    # What a cancel leaves when the driver it asked dies before ending the run.
    state = await rt.state(run_id)
    asked = ev.RunEnding(
        run_id=run_id, seq=state.seq + 1, outcome="cancelled", reason="stop", actor="user"
    )
    await rt.store.append(run_id, [asked], expected_seq=state.seq)
    result = await rt.resume(run_id, flow)
    assert result.status is RunStatus.CANCELLED
    assert (await rt.events(run_id))[-1].type == "run_cancelled"
    assert (await rt.state(run_id)).children == {}  # it started nothing more


async def test_a_map_whose_items_cannot_be_listed_fails_with_a_readable_log(rt: Runtime) -> None:
    class Maybe(BaseModel):
        values: list[int] | None = None

    def lost(m: Maybe) -> list[int]:
        raise LookupError("the listing service is down")

    for over, reason, says in (
        (lambda m: m.values, FailureReason.OUTPUT_INVALID, "not a list of int: got NoneType"),
        (lost, FailureReason.NODE_FAILED, "the listing service is down"),
    ):
        flow = Workflow("unlisted", input=Maybe)
        flow.map("work", doubler(), over=over, item=int)
        result = await rt.run(flow, Maybe())
        assert result.status is RunStatus.FAILED and result.failure_reason is reason
        assert says in (result.failure_message or "")
        state = await rt.state(result.run_id)  # the log folds: the node started, then failed
        assert state.nodes["work"].status.value == "failed"
        assert [n.status for n in (await rt.tree(result.run_id)).children] == ["failed"]


def test_a_map_over_a_field_that_is_missing_or_no_list_is_refused_when_declared() -> None:
    class Named(BaseModel):
        name: str
        values: list[int]

    flow = Workflow("declared", input=Named)
    with pytest.raises(ConfigError, match="no field of that name; its fields: name, values"):
        flow.map("work", doubler(), over="nope", item=int)
    with pytest.raises(ConfigError, match=r"maps over Named.name, a str, not a list"):
        flow.map("work", doubler(), over="name", item=str)
    with pytest.raises(ConfigError, match="not a list"):
        flow.map("work", doubler(), over="name")


# -- seeing it --------------------------------------------------------------------------------


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "contextos", *args],
        cwd=ROOT,
        env={**os.environ, "NO_COLOR": "1", "COLUMNS": "200"},
        capture_output=True,
        text=True,
        timeout=60,
    )


async def test_show_draws_the_tree_runs_lists_top_level_and_traces_join(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    flow = Workflow("sum-doubles", input=Numbers)
    flow.map("double", doubler(), over="values")
    flow.reduce("sum", add_up)
    async with Runtime(str(db)) as rt:
        result = await rt.run(flow, Numbers(values=[1, 2]))
        events = await rt.events(result.run_id)
        child_events = await rt.events(f"{result.run_id}.double.0")
    run_id = result.run_id

    # a short prefix names the workflow, not the child runs whose ids start with its id
    shown = await asyncio.to_thread(cli, "show", run_id[:8], "--store", str(db))
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert any(
        f"{run_id} workflow completed" in line and "2 turns · 30 tokens" in line for line in lines
    )
    assert any("double map completed" in line and "2 items" in line for line in lines)
    assert any(f"{run_id}.double.1 child completed" in line and "doubler" in line for line in lines)
    assert any("sum reduce completed" in line for line in lines)

    listed = await asyncio.to_thread(cli, "runs", "--top-level", "--json", "--store", str(db))
    assert [r["run_id"] for r in json.loads(listed.stdout)] == [run_id]
    everything = await asyncio.to_thread(cli, "runs", "--json", "--store", str(db))
    assert len(json.loads(everything.stdout)) == 3

    spans = spans_for(events)
    root = spans[-1]
    assert root.name == "invoke_workflow sum-doubles"
    assert root.attributes["gen_ai.operation.name"] == "invoke_workflow"
    assert root.attributes["gen_ai.workflow.name"] == "sum-doubles"
    nodes = {s.name: s for s in spans if s.name.startswith("node ")}
    assert set(nodes) == {"node double", "node sum"}
    assert all(s.parent_id == root.span_id and s.status == "ok" for s in nodes.values())
    child_root = spans_for(child_events)[-1]
    assert child_root.name == "invoke_agent doubler"
    assert child_root.trace_id == root.trace_id == trace_id_for(run_id)
    assert (
        child_root.parent_id == nodes["node double"].span_id == span_id_for(run_id, "node/double")
    )

    traced = await asyncio.to_thread(cli, "trace", run_id, "--json", "--store", str(db))
    names = [s["name"] for s in json.loads(traced.stdout)]
    assert names.count("invoke_agent doubler") == 2  # one trace: the children's spans too
    assert "invoke_workflow sum-doubles" in names


async def test_a_failed_child_fails_its_node_and_stops_its_siblings(rt: Runtime) -> None:
    wait = never_answering()

    def step(request: ModelRequest) -> ModelResponse:
        if given(request) == 0:
            raise RuntimeError("the provider is down")
        return call_tool("wait", {"q": "x"})

    worker = Agent(name="worker", model=ScriptedModel([step], by_turn=True), tools=[wait])
    flow = Workflow("fails", input=Numbers)
    flow.map("work", worker, over="values", concurrency=4)
    result = await rt.run(flow, Numbers(values=[0, 1, 2, 3]))
    assert result.status is RunStatus.FAILED
    assert result.failure_reason is FailureReason.CHILD_FAILED
    assert "item 0" in (result.failure_message or "") and "model_error" in (
        result.failure_message or ""
    )
    state = await rt.state(result.run_id)
    assert {k: c.status.value for k, c in state.children.items()} == {
        "work.0": "failed",
        "work.1": "cancelled",
        "work.2": "cancelled",
        "work.3": "cancelled",
    }
    for i in (1, 2, 3):
        assert (await rt.state(f"{result.run_id}.work.{i}")).status is RunStatus.CANCELLED
    (failed,) = [e for e in await rt.events(result.run_id) if isinstance(e, ev.NodeFailed)]
    assert failed.node == "work" and failed.reason is FailureReason.CHILD_FAILED
