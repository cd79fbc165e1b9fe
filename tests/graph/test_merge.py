"""How a map takes in its items' results: `all` (every item must give one), `collect` (the
results there are, and the failures beside them), `first` (the first item that gives one; no
item after it starts)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from contextos import Agent, Budget, ConfigError, FailureReason, RunStatus, Runtime, Workflow
from contextos import events as ev
from contextos.graph.workflow import Collected
from contextos.models.base import ModelRequest, ModelResponse
from contextos.runs import RunId
from contextos.store import SqliteStore
from contextos.testing import ScriptedModel, reply


class Numbers(BaseModel):
    values: list[int]


class Doubled(BaseModel):
    value: int


class Total(BaseModel):
    total: int
    failed: list[int]


@pytest.fixture
async def rt(tmp_path: Path) -> AsyncIterator[Runtime]:
    async with Runtime(str(tmp_path / "runs.db")) as runtime:
        yield runtime


def failing_doubler(fails: set[int], asked: list[int]) -> Agent:
    """Doubles the number it is given; its provider is down for the numbers in `fails`."""

    def step(request: ModelRequest) -> ModelResponse:
        n = int(request.messages[-1].content.rsplit("\n", 1)[-1])
        asked.append(n)
        if n in fails:
            raise RuntimeError("the provider is down")
        return reply(json.dumps({"value": 2 * n}))

    return Agent(name="doubler", model=ScriptedModel([step], by_turn=True), output_type=Doubled)


async def test_collect_keeps_the_results_there_are_and_the_failures_beside_them(
    rt: Runtime,
) -> None:
    asked: list[int] = []
    flow = Workflow("collect", input=Numbers)
    doubled = flow.map(
        "double", failing_doubler({2}, asked), over="values", concurrency=3, merge="collect"
    )
    assert doubled.output is Collected[int, Doubled]

    def add_up(got: Collected[int, Doubled]) -> Total:
        return Total(total=sum(d.value for d in got.results), failed=[f.item for f in got.failed])

    flow.code("sum", add_up)
    result = await rt.run(flow, Numbers(values=[1, 2, 3]))

    assert result.status is RunStatus.COMPLETED, result.failure_message
    assert result.structured_output == {"total": 8, "failed": [2]}
    node = (await rt.state(result.run_id)).nodes["double"]
    assert node.output["results"] == [{"value": 2}, {"value": 6}]
    (failure,) = node.output["failed"]
    assert failure["item"] == 2 and failure["reason"] == FailureReason.CHILD_FAILED.value
    assert "item 1" in failure["message"] and "model_error" in failure["message"]
    (drawn,) = [n for n in (await rt.tree(result.run_id)).children if n.label == "double"]
    assert drawn.detail == "3 items, 2 results, 1 failed"  # what `contextos show` draws


async def test_all_is_the_default_and_a_failed_item_fails_the_node(rt: Runtime) -> None:
    flow = Workflow("all", input=Numbers)
    doubled = flow.map("double", failing_doubler({2}, []), over="values", concurrency=1)
    assert doubled.output == list[Doubled] and doubled.merge == "all"
    result = await rt.run(flow, Numbers(values=[1, 2, 3]))
    assert result.status is RunStatus.FAILED
    assert result.failure_reason is FailureReason.CHILD_FAILED


async def test_first_takes_the_first_result_and_starts_no_item_after_it(rt: Runtime) -> None:
    asked: list[int] = []
    flow = Workflow("fallback", input=Numbers)
    first = flow.map(
        "try", failing_doubler({1}, asked), over="values", concurrency=1, merge="first"
    )
    assert first.output is Doubled
    result = await rt.run(flow, Numbers(values=[1, 5, 7, 9]))

    assert result.status is RunStatus.COMPLETED, result.failure_message
    assert result.structured_output == {"value": 10}
    assert asked == [1, 5]  # 7 and 9 were never tried
    state = await rt.state(result.run_id)
    assert {k: c.status.value for k, c in state.children.items()} == {
        "try.0": "failed",
        "try.1": "completed",
    }
    (drawn,) = (await rt.tree(result.run_id)).children
    assert drawn.detail == "4 items, took the first result"


async def test_first_starts_no_item_waiting_for_budget_once_an_item_gave_its_result(
    rt: Runtime,
) -> None:
    asked: list[int] = []
    # Room for one child's 20 turns at a time: the others wait for the first to end.
    flow = Workflow("narrow", input=Numbers, budget=Budget(max_turns=30))
    flow.map("try", failing_doubler(set(), asked), over="values", concurrency=3, merge="first")
    result = await rt.run(flow, Numbers(values=[5, 7, 9]))

    assert result.status is RunStatus.COMPLETED, result.failure_message
    assert result.structured_output == {"value": 10}
    assert asked == [5]
    state = await rt.state(result.run_id)
    assert list(state.children) == ["try.0"]


class _LateCreation(SqliteStore):
    """A store on which the run of item 1's child is created only after item 0's child has
    given its result and a moment has passed: the window in which the map cancels the
    children still running, where item 1's is recorded started but not yet created."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.answered = asyncio.Event()

    async def append(self, run_id: RunId, events: Sequence[ev.Event], **kwargs: Any) -> int:
        if isinstance(events[0], ev.RunCreated) and events[0].input.endswith("\n7"):
            await self.answered.wait()
            await asyncio.sleep(0.2)
        seq = await super().append(run_id, events, **kwargs)
        if any(isinstance(e, ev.ChildRunFinished) for e in events):
            self.answered.set()
        return seq


async def test_first_cancels_a_child_created_after_an_item_gave_its_result(
    tmp_path: Path,
) -> None:
    asked: list[int] = []
    flow = Workflow("late", input=Numbers)
    flow.map("try", failing_doubler(set(), asked), over="values", concurrency=2, merge="first")
    async with Runtime(_LateCreation(tmp_path / "runs.db")) as rt:
        result = await rt.run(flow, Numbers(values=[5, 7]))
        state = await rt.state(result.run_id)
        late = await rt.state(state.children["try.1"].contract.child_run_id)

    assert result.status is RunStatus.COMPLETED, result.failure_message
    assert result.structured_output == {"value": 10}
    assert asked == [5]
    assert state.children["try.1"].status.value == "cancelled"
    assert late.status is RunStatus.CANCELLED


async def test_first_cancels_the_children_still_running_once_an_item_gives_its_result(
    tmp_path: Path,
) -> None:
    released = asyncio.Event()  # never set: the slow provider answers only when cancelled

    async def step(request: ModelRequest) -> ModelResponse:
        n = int(request.messages[-1].content.rsplit("\n", 1)[-1])
        if n == 7:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(released.wait(), 30)
        return reply(json.dumps({"value": 2 * n}))

    slow = Agent(name="doubler", model=ScriptedModel([step], by_turn=True), output_type=Doubled)
    flow = Workflow("race", input=Numbers)
    flow.map("try", slow, over="values", concurrency=2, merge="first")
    async with Runtime(str(tmp_path / "runs.db"), cancel_poll_s=0.05) as rt:
        result = await rt.run(flow, Numbers(values=[5, 7]))
        state = await rt.state(result.run_id)
        slow_child = await rt.state(state.children["try.1"].contract.child_run_id)

    assert result.status is RunStatus.COMPLETED, result.failure_message
    assert result.structured_output == {"value": 10}
    assert {k: c.status.value for k, c in state.children.items()} == {
        "try.0": "completed",
        "try.1": "cancelled",
    }
    assert slow_child.status is RunStatus.CANCELLED
    assert "item 0 of node try gave the result first" in (slow_child.failure_message or "")


async def test_first_with_code_stops_at_the_first_item_that_does_not_raise(rt: Runtime) -> None:
    tried: list[str] = []

    def fetch(mirror: str) -> str:
        tried.append(mirror)
        if mirror != "b":
            raise ConnectionError(f"{mirror} is down")
        return f"payload from {mirror}"

    class Mirrors(BaseModel):
        names: list[str]

    flow = Workflow("mirrors", input=Mirrors)
    flow.map("fetch", fetch, over="names", concurrency=1, merge="first")
    result = await rt.run(flow, Mirrors(names=["a", "b", "c"]))
    assert result.status is RunStatus.COMPLETED, result.failure_message
    assert result.output == '"payload from b"'
    assert tried == ["a", "b"]


async def test_first_with_no_item_giving_a_result_fails_the_node_with_every_reason(
    rt: Runtime,
) -> None:
    flow = Workflow("nothing", input=Numbers)
    flow.map("try", failing_doubler({1, 2}, []), over="values", concurrency=2, merge="first")
    result = await rt.run(flow, Numbers(values=[1, 2]))
    assert result.status is RunStatus.FAILED
    assert result.failure_reason is FailureReason.CHILD_FAILED
    message = result.failure_message or ""
    assert message.startswith("no item of node try gave a result")
    assert "item 0" in message and "item 1" in message


async def test_a_code_map_that_finds_nothing_names_its_items_and_quotes_a_few(
    rt: Runtime,
) -> None:
    def fetch(mirror: str) -> str:
        raise ConnectionError(f"{mirror} is down")

    class Mirrors(BaseModel):
        names: list[str]

    flow = Workflow("mirrors", input=Mirrors)
    flow.map("fetch", fetch, over="names", concurrency=1, merge="first")
    result = await rt.run(flow, Mirrors(names=["a", "b", "c", "d", "e"]))
    assert result.status is RunStatus.FAILED
    message = result.failure_message or ""
    assert "a is down (item 0)" in message and "c is down (item 2)" in message
    assert "d is down" not in message and message.endswith("; and 2 more")


def test_the_merge_policy_is_declared_and_part_of_the_identity() -> None:
    def build(merge: str | None) -> Workflow:
        flow = Workflow("same", input=Numbers)
        extra = {"merge": merge} if merge else {}
        flow.map("double", failing_doubler(set(), []), over="values", **extra)  # type: ignore[arg-type]
        return flow

    assert build(None).identity_hash() == build("all").identity_hash()
    assert "merge" not in build(None).nodes[0].identity()  # older graphs keep their hash
    assert build("collect").identity_hash() != build("all").identity_hash()
    assert build("first").identity_hash() != build("collect").identity_hash()
    with pytest.raises(ConfigError, match="merge is 'all', 'collect' or 'first'"):
        build("some")
