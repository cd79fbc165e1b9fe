"""Child runs under delegation contracts: narrower than their parent by construction, budgets
carved out of the parent's and returned, contexts holding only what the contract passes, and
typed results coming back instead of transcripts."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from pydantic import BaseModel

from contextos import (
    Agent,
    Budget,
    ConfigError,
    Containment,
    FailureReason,
    NetworkPolicy,
    Policy,
    Principal,
    Rule,
    RunContext,
    RunStatus,
    Runtime,
    tool,
)
from contextos import events as ev
from contextos.agents import Subagent
from contextos.delegation import MAX_DEPTH, ChildStatus
from contextos.graph.children import merge
from contextos.middleware import Sanitizer
from contextos.policy import Decision
from contextos.runs import RunId
from contextos.state import RunState, fold
from contextos.testing import ScriptedModel, call_tool, call_tools, reply
from support.waiting import never_answering


class Fare(BaseModel):
    carrier: str
    price: float


def read_doc(name: str) -> str:
    """Read a document."""
    return f"doc {name}: the change fee is zero"


def search(q: str) -> str:
    """Search the fare database."""
    return f"3 fares match {q}"


@tool(effect="write")
def write_doc(name: str, text: str) -> str:
    """Write a document."""
    return "written"


@tool(effect="irreversible")
def purchase(item: str) -> str:
    """Buy something."""
    return "bought"


@pytest.fixture
async def rt(tmp_path: Path) -> AsyncIterator[Runtime]:
    async with Runtime(str(tmp_path / "runs.db")) as runtime:
        yield runtime


def planner(*steps: object, sub: Subagent, budget: Budget | None = None) -> Agent:
    return Agent(
        name="planner",
        model=ScriptedModel(list(steps)),  # type: ignore[arg-type]
        instructions="Plan the trip.",
        subagents=[sub],
        budget=budget or Budget(max_turns=10),
    )


def delegate(task: str) -> object:
    return call_tool("delegate_to_helper", {"task": task})


async def test_a_child_declared_wider_than_its_parent_runs_with_exactly_the_intersection(
    rt: Runtime, tmp_path: Path
) -> None:
    own, shared = tmp_path / "own", tmp_path / "shared"
    own.mkdir()
    shared.mkdir()
    own_real, shared_real = str(own.resolve()), str(shared.resolve())
    bob = Principal.user("bob", scopes=("docs:read", "payments:refund"))
    parent_ctx = RunContext(
        principal=bob,
        tools=("read_doc", "search", "purchase", "delegate_to_helper"),
        clearance="confidential",
        containment=Containment(
            roots=(str(own),),
            read_only=(str(shared),),
            network=NetworkPolicy(allow=("api.example.com",)),
        ),
    )
    child_model = ScriptedModel([reply('{"carrier": "BA", "price": 420}')])
    helper = Agent(
        name="helper",
        model=child_model,
        tools=[read_doc, search, write_doc, purchase],
        output_type=Fare,
        budget=Budget(max_turns=50, max_tokens=10_000_000),
    )
    wide = Subagent(
        agent=helper,
        forbidden_effects=("irreversible",),
        scopes=("*",),
        clearance="restricted",
        containment=Containment(
            roots=(str(tmp_path),), network=NetworkPolicy(allow=("*.example.com",))
        ),
    )
    p = planner(
        delegate("find a fare"),
        reply("done"),
        sub=wide,
        budget=Budget(max_turns=3, max_tokens=1000),
    )
    result = await rt.run(p, "go", context=parent_ctx)
    assert result.status is RunStatus.COMPLETED

    child_id = f"{result.run_id}.call_1_0"
    child = await rt.state(child_id)
    assert child.status is RunStatus.COMPLETED
    assert child.context is not None
    bound = RunContext.from_dict(child.context.context)
    assert bound.principal == bob
    assert bound.effective_scopes == ("docs:read", "payments:refund")
    # write_doc is not the parent's to give; purchase is irreversible, which is forbidden
    assert bound.tools == ("read_doc", "search")
    assert bound.clearance == "confidential"
    assert bound.containment is not None
    assert bound.containment.roots == (own_real,)
    assert bound.containment.read_only == (shared_real,)
    assert bound.containment.network.allow == ("api.example.com",)
    assert bound.parent_run_id == result.run_id
    # 1 of the parent's 3 turns and 15 of its 1,000 tokens were spent when it delegated
    assert (child.budget.max_turns, child.budget.max_tokens) == (2, 985)
    # its model is shown only what it may call
    assert [t.name for t in child_model.requests[0].tools] == ["read_doc", "search"]

    # the contract is recorded in both logs, the same
    (started,) = [e for e in await rt.events(result.run_id) if isinstance(e, ev.ChildRunStarted)]
    (bound_event,) = [e for e in await rt.events(child_id) if isinstance(e, ev.DelegationBound)]
    assert bound_event.contract == started.contract
    assert started.contract.allowed_tools == ("read_doc", "search")
    assert started.contract.forbidden_effects == ("irreversible",)
    assert started.contract.expected_output == "Fare"


def test_a_subagent_allowed_a_tool_its_agent_does_not_have_is_refused_when_declared() -> None:
    helper = Agent(name="helper", model=ScriptedModel([]), tools=[read_doc, search])
    assert Subagent(agent=helper, tools=("read_*",)).tools == ("read_*",)
    with pytest.raises(ConfigError, match=r"allows the tool 'rm_rf', which none of agent "):
        Subagent(agent=helper, tools=("read_doc", "rm_rf"))


async def test_cancelling_an_agent_while_its_subagent_runs_counts_what_the_child_spent(
    rt: Runtime,
) -> None:
    wait = never_answering()

    helper = Agent(
        name="helper", model=ScriptedModel([call_tool("wait", {"q": "x"})] * 3), tools=[wait]
    )
    p = planner(delegate("wait for it"), reply("done"), sub=Subagent(agent=helper))
    running = asyncio.create_task(rt.run(p, "go"))
    while not [r for r in await rt.runs(status=RunStatus.RUNNING) if "." in r.run_id]:
        await asyncio.sleep(0.02)
    (top,) = await rt.runs(top_level=True)
    cancelled = await rt.cancel(top.run_id, reason="stop")
    assert cancelled.status is RunStatus.CANCELLED and (await running).status is cancelled.status
    events = await rt.events(top.run_id)
    assert [e.type for e in events if e.type.startswith(("run_", "child_"))][-3:] == [
        "run_ending",
        "child_run_finished",
        "run_cancelled",
    ]
    (child,) = [r for r in await rt.runs() if "." in r.run_id]
    (parent,) = await rt.runs(top_level=True)
    assert child.status is RunStatus.CANCELLED and child.turns == 1
    assert parent.turns == 1 + child.turns  # its own model call and what its child spent


async def test_a_separately_started_child_gets_at_most_what_its_parent_has_left(
    rt: Runtime,
) -> None:
    parent_ctx = RunContext(principal=Principal.user("bob", scopes=("*",)), tools=("read_doc",))
    parent_agent = Agent(
        name="parent",
        model=ScriptedModel([reply("-")]),
        budget=Budget(max_turns=2, max_tokens=1000),
    )
    parent = await rt.start(parent_agent, "parent", context=parent_ctx)
    child_model = ScriptedModel([reply("ok")])
    child_agent = Agent(
        name="child",
        model=child_model,
        tools=[read_doc, purchase],
        budget=Budget(max_turns=50, max_tokens=10_000_000),
    )
    result = await rt.run(child_agent, "child", context=parent_ctx.delegate(run_id=parent))
    child = await rt.state(result.run_id)
    assert (child.budget.max_turns, child.budget.max_tokens) == (2, 1000)
    assert [t.name for t in child_model.requests[0].tools] == ["read_doc"]


async def test_spending_past_the_carved_budget_ends_the_child_and_the_parent_goes_on(
    rt: Runtime,
) -> None:
    digging = ScriptedModel([call_tool("search", {"q": "LHR"})] * 6)
    helper = Agent(name="helper", model=digging, tools=[search], budget=Budget(max_turns=50))
    p = planner(
        delegate("dig"),
        reply("the helper ran out of budget; answering from what I have"),
        sub=Subagent(agent=helper, budget=Budget(max_turns=3)),
    )
    result = await rt.run(p, "go")
    assert result.status is RunStatus.COMPLETED

    child = await rt.state(f"{result.run_id}.call_1_0")
    assert child.failure_reason is FailureReason.BUDGET_EXHAUSTED
    assert child.turns == 3 and len(digging.requests) == 3
    events = await rt.events(result.run_id)
    (finished,) = [e for e in events if isinstance(e, ev.ChildRunFinished)]
    assert finished.status is ChildStatus.FAILED and finished.reason == "budget_exhausted"
    (told,) = [e for e in events if isinstance(e, ev.ToolCompleted)]
    assert told.is_error and json.loads(told.output)["reason"] == "budget_exhausted"
    parent = await rt.state(result.run_id)
    assert (parent.turns, parent.child_turns) == (2, 3)


async def test_budget_is_reserved_for_running_children_and_returned_when_they_finish(
    rt: Runtime,
) -> None:
    helper = Agent(
        name="helper",
        model=ScriptedModel([reply("a"), reply("b"), reply("c")]),
        budget=Budget(max_turns=50),
    )
    p = planner(
        call_tools(
            [
                ("delegate_to_helper", '{"task": "one"}', None),
                ("delegate_to_helper", '{"task": "two"}', None),
            ]
        ),
        delegate("three"),
        reply("done"),
        sub=Subagent(agent=helper, budget=Budget(max_turns=5)),
        budget=Budget(max_turns=10),
    )
    result = await rt.run(p, "go")
    assert result.status is RunStatus.COMPLETED
    contracts = [
        e.contract for e in await rt.events(result.run_id) if isinstance(e, ev.ChildRunStarted)
    ]
    # turn 1 started two children at once: the second got what the first left (9 - 5)
    assert [c.budget.max_turns for c in contracts] == [5, 4, 5]
    # each used 1 turn and gave the rest back: the third, after turn 2, got its 5 again
    parent = await rt.state(result.run_id)
    assert (parent.turns, parent.child_turns) == (3, 3)


async def test_the_child_sees_only_its_task_and_the_parent_only_a_typed_result(
    rt: Runtime,
) -> None:
    child_model = ScriptedModel(
        [call_tool("read_doc", {"name": "fare rules"}), reply('{"carrier": "BA", "price": 420}')]
    )
    helper = Agent(
        name="helper",
        model=child_model,
        instructions="Find fares.",
        tools=[read_doc],
        output_type=Fare,
    )
    planner_model = ScriptedModel([delegate("cheapest LHR-JFK"), reply("BA at 420")])  # type: ignore[list-item]
    p = Agent(
        name="planner",
        model=planner_model,
        tools=[search],
        subagents=[Subagent(agent=helper)],
    )
    result = await rt.run(p, "My card is 4111 and I want the cheapest fare to New York")
    assert result.status is RunStatus.COMPLETED

    (system, task) = child_model.requests[0].messages
    # its own instructions, then the notice of the sanitizer every agent has by default
    assert system.role == "system" and system.content.startswith("Find fares.")
    assert system.content.endswith(Sanitizer().notice().content) and "4111" not in system.content
    assert (task.role, task.content) == ("user", "cheapest LHR-JFK")
    # specialist tools live on the subagent only
    assert [t.name for t in planner_model.requests[0].tools] == ["search", "delegate_to_helper"]
    assert [t.name for t in child_model.requests[0].tools] == ["read_doc"]

    (told,) = [e for e in await rt.events(result.run_id) if isinstance(e, ev.ToolCompleted)]
    answer = json.loads(told.output)
    assert answer["status"] == "completed"
    assert answer["result"] == {"carrier": "BA", "price": 420.0}
    assert answer["evidence"]["tool_calls"] == {"read_doc": 1}
    assert answer["spent"]["turns"] == 2
    # what the child read along the way never reaches the parent
    seen = " ".join(m.content for m in planner_model.requests[1].messages)
    assert "change fee" not in seen and "change fee" not in told.output


async def test_policy_decides_a_delegation_like_any_call(tmp_path: Path) -> None:
    policy = Policy(
        rules=(Rule(id="no-subagents", tools=("delegate_to_*",), decision=Decision.DENY),)
    )
    child_model = ScriptedModel([reply("never")])
    p = planner(
        delegate("dig"),
        reply("I will do it myself"),
        sub=Subagent(agent=Agent(name="helper", model=child_model)),
    )
    async with Runtime(str(tmp_path / "runs.db"), policy=policy) as rt:
        result = await rt.run(p, "go", principal=Principal.user("bob", scopes=("*",)))
        assert result.status is RunStatus.COMPLETED
        events = await rt.events(result.run_id)
    assert not any(isinstance(e, ev.ChildRunStarted) for e in events)
    (told,) = [e for e in events if isinstance(e, ev.ToolCompleted)]
    assert told.error_code == "policy_denied"
    assert child_model.requests == []


async def test_delegation_stops_at_the_depth_limit(rt: Runtime) -> None:
    deepest = Agent(name="level-9", model=ScriptedModel([reply("bottom")]))
    agent = deepest
    for level in range(MAX_DEPTH, -1, -1):
        agent = Agent(
            name=f"level-{level}",
            model=ScriptedModel(
                [call_tool(f"delegate_to_level-{level + 1}", {"task": "go on"}), reply("up")]
            ),
            subagents=[agent],
            budget=Budget(max_turns=100),
        )
    result = await rt.run(agent, "dig forever")
    assert result.status is RunStatus.COMPLETED
    run_id = result.run_id
    for _ in range(MAX_DEPTH):
        state = await rt.state(run_id)
        (child,) = state.children.values()
        run_id = child.contract.child_run_id
    last = await rt.state(run_id)
    assert last.delegation is not None and last.delegation.depth == MAX_DEPTH
    assert not last.children
    (told,) = [e for e in await rt.events(run_id) if isinstance(e, ev.ToolCompleted)]
    assert told.error_code == "delegation_refused"


async def test_a_parent_waits_without_a_worker_while_its_child_waits_for_a_person(
    tmp_path: Path,
) -> None:
    sent: list[str] = []

    @tool(effect="write")
    def send(text: str) -> str:
        """Send a message."""
        sent.append(text)
        return "sent"

    helper = Agent(
        name="helper",
        model=ScriptedModel([call_tool("send", {"text": "hi"}), reply("sent it")]),
        tools=[send],
    )
    p = planner(delegate("say hi"), reply("done"), sub=Subagent(agent=helper))
    rule = Rule(id="ask", tools=("send",), decision=Decision.REQUIRE_APPROVAL, approver_role="ops")
    policy = Policy(rules=(rule,), roles={"ops": ("olga",)})
    async with Runtime(str(tmp_path / "runs.db"), policy=policy) as rt:
        first = await rt.run(p, "go", principal=Principal.user("bob", scopes=("*",)))
        assert first.status is RunStatus.QUEUED  # handed back: no worker held while it waits
        events = await rt.events(first.run_id)
        assert isinstance(events[-1], ev.RunReleased)
        assert "child run" in events[-1].reason
        (pending,) = await rt.inbox()
        assert pending.run_id == f"{first.run_id}.call_1_0"
        await rt.approve(pending.id, approver="olga")
        done = await rt.resume(first.run_id, p)
    assert done.status is RunStatus.COMPLETED and done.output == "done"
    assert sent == ["hi"]


async def test_cancelling_an_agent_parked_behind_its_subagents_approval_counts_its_spend(
    tmp_path: Path,
) -> None:
    def lookup(q: str) -> str:
        """Look something up."""
        return "found"

    helper = Agent(
        name="helper", model=ScriptedModel([call_tool("lookup", {"q": "x"})]), tools=[lookup]
    )
    p = planner(delegate("look it up"), reply("done"), sub=Subagent(agent=helper))
    rule = Rule(
        id="ask", tools=("lookup",), decision=Decision.REQUIRE_APPROVAL, approver_role="ops"
    )
    async with Runtime(str(tmp_path / "runs.db"), policy=Policy(rules=(rule,))) as rt:
        first = await rt.run(p, "go", principal=Principal.user("bob", scopes=("*",)))
        assert first.status is RunStatus.QUEUED  # parked: nobody drives it
        cancelled = await rt.cancel(first.run_id, reason="not needed")
        events = await rt.events(first.run_id)
        child = await rt.state(f"{first.run_id}.call_1_0")
    assert cancelled.status is child.status is RunStatus.CANCELLED
    assert [e.type for e in events][-2:] == ["child_run_finished", "run_cancelled"]
    assert cancelled.turns == 1 + child.turns == 2  # its own call and what its child spent


def test_the_parent_validates_what_a_child_gives_back() -> None:
    def ended(structured: object) -> RunState:
        rid = RunId("run_parent.call_1_0")
        created = ev.RunCreated(
            run_id=rid, seq=1, agent_name="helper", agent_version="1", agent_hash="h", input="-"
        )
        done = ev.RunCompleted(run_id=rid, seq=2, output="-", structured_output=structured)
        return fold([created, done])

    ok = merge(ended({"carrier": "BA", "price": "420"}), Fare)
    assert ok == (ChildStatus.COMPLETED, {"carrier": "BA", "price": 420.0}, None, "")
    status, result, reason, message = merge(ended({"carrier": "BA"}), Fare)
    assert (status, result, reason) == (ChildStatus.REJECTED, None, "output_invalid")
    assert message == "the result is not a valid Fare: price: Field required"
