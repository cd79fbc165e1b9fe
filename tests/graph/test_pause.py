"""Pausing a workflow: it starts nothing new, its children in flight stop at their next step,
and it pauses once they have; resumed, it drives them on, and nothing runs twice."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from contextos import Agent, RunStatus, Runtime, Workflow
from contextos.models.base import ModelRequest, ModelResponse
from contextos.testing import ScriptedModel, call_tool, reply


class Items(BaseModel):
    values: list[int]


class Tenfold(BaseModel):
    value: int


def stepping(started: asyncio.Event, go: asyncio.Event, steps: list[int]) -> Workflow:
    """Each item's child calls `step` once (which waits for `go`), then answers its item."""

    async def step(n: int) -> str:
        """Do step n."""
        steps.append(n)
        if len(steps) == 2:
            started.set()
        await go.wait()
        return f"step {n} done"

    def turn(request: ModelRequest) -> ModelResponse:
        n = int(json.loads(request.messages[1].content.rsplit("\n", 1)[-1]))
        if request.turn == 1:
            return call_tool("step", {"n": n})
        return reply(json.dumps({"value": n * 10}))

    worker = Agent(
        name="worker",
        model=ScriptedModel([turn, turn], by_turn=True),
        tools=[step],
        output_type=Tenfold,
    )

    def total(answers: list[Tenfold]) -> int:
        return sum(a.value for a in answers)

    flow = Workflow("steps", input=Items)
    flow.map("each", worker, over="values", concurrency=2)
    flow.reduce("total", total)
    return flow


async def test_a_paused_workflow_stops_its_children_and_resumes_them(backend_url: str) -> None:
    started, go = asyncio.Event(), asyncio.Event()
    steps: list[int] = []
    flow = stepping(started, go, steps)
    async with Runtime(backend_url) as rt:
        driving = asyncio.create_task(rt.run(flow, Items(values=[1, 2, 3]), run_id="run_p"))
        await started.wait()  # items 1 and 2 are in their tool calls; item 3 waits its turn
        asked = await rt.pause("run_p", reason="look first")
        assert asked.status is RunStatus.RUNNING  # its driver takes the request in
        go.set()
        paused = await driving
        assert paused.status is RunStatus.PAUSED
        children = {k: (await rt.state(f"run_p.each.{k}")).status for k in (0, 1)}
        assert children == {0: RunStatus.PAUSED, 1: RunStatus.PAUSED}
        assert sorted(steps) == [1, 2]  # item 3 did not start
        tree = await rt.tree("run_p")
        drawn = tree.children
        assert [(n.label, n.status) for n in drawn] == [("each", "paused"), ("total", "pending")]
        # The paused children's spend so far counts in the workflow's line as in its node's.
        assert tree.tokens == drawn[0].tokens > 0 and tree.turns == drawn[0].turns == 2

        done = await rt.resume("run_p", flow)
        parent = await rt.events("run_p")
        child = await rt.events("run_p.each.0")
    assert done.status is RunStatus.COMPLETED and done.structured_output == 60
    assert sorted(steps) == [1, 2, 3]  # no step ran twice
    kinds = [e.type for e in parent]
    assert kinds.index("run_pause_requested") < kinds.index("run_paused")
    assert kinds.count("run_paused") == 1 and kinds.count("child_run_finished") == 3
    assert [e.type for e in child].count("tool_completed") == 1


async def test_a_workflow_nobody_drives_pauses_at_once_and_resumes(backend_url: str) -> None:
    started, go = asyncio.Event(), asyncio.Event()
    go.set()
    steps: list[int] = []
    flow = stepping(started, go, steps)
    async with Runtime(backend_url) as rt:
        queued = await rt.start(flow, Items(values=[4]), run_id="run_q")
        paused = await rt.pause(queued)
        assert paused.status is RunStatus.PAUSED and steps == []
        done = await rt.resume(queued, flow)
    assert done.status is RunStatus.COMPLETED and done.structured_output == 40


async def test_a_paused_workflow_let_go_to_the_queue_wakes_its_children(
    backend_url: str,
) -> None:
    started, go = asyncio.Event(), asyncio.Event()
    steps: list[int] = []
    flow = stepping(started, go, steps)
    async with Runtime(backend_url) as rt:
        driving = asyncio.create_task(rt.run(flow, Items(values=[1, 2]), run_id="run_u"))
        await started.wait()
        await rt.pause("run_u")
        go.set()
        assert (await driving).status is RunStatus.PAUSED
        queued = await rt.unpause("run_u")
        assert queued.status is RunStatus.QUEUED
        assert (await rt.state("run_u.each.0")).status is RunStatus.PAUSED  # until driven
        # What a worker does with a queued run: drive it on.
        done = await rt.resume("run_u", flow)
    assert done.status is RunStatus.COMPLETED and done.structured_output == 30
    assert sorted(steps) == [1, 2]


def test_the_command_line_queues_a_paused_workflow_for_the_workers(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    flow = stepping(asyncio.Event(), asyncio.Event(), [])

    async def paused() -> None:
        async with Runtime(str(db)) as rt:
            await rt.start(flow, Items(values=[1]), run_id="run_c")
            await rt.pause("run_c")

    asyncio.run(paused())

    def resume_queue() -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "contextos", "resume", "run_c", "--queue"]
        return subprocess.run(
            [*command, "--store", str(db), "--json"], capture_output=True, text=True, timeout=60
        )

    queued = resume_queue()
    assert queued.returncode == 0, queued.stderr
    assert json.loads(queued.stdout)["status"] == "queued"
    again = resume_queue()
    assert again.returncode == 1
    assert again.stderr.strip() == (
        "error: run run_c is queued, not paused; there is nothing to let go on"
    )


async def test_a_child_created_while_the_pause_came_in_does_not_start(backend_url: str) -> None:
    started, go = asyncio.Event(), asyncio.Event()
    go.set()
    steps: list[int] = []
    flow = stepping(started, go, steps)
    async with Runtime(backend_url) as rt:
        children = rt._children
        create = children._create_child

        async def pause_lands_first(start: Any) -> bool:
            # The request lands after the workflow recorded the child's contract but before
            # the child run exists, so pausing the workflow finds no child to pause.
            if not steps and start.fresh:
                await rt.pause("run_w", reason="look first")
            return await create(start)

        children._create_child = pause_lands_first  # type: ignore[method-assign]
        paused = await rt.run(flow, Items(values=[1]), run_id="run_w")
        assert paused.status is RunStatus.PAUSED
        child = await rt.events("run_w.each.0")
        assert steps == []  # the child took no step while its workflow was paused
        assert [e.type for e in child][-1] == "run_paused"
        done = await rt.resume("run_w", flow)
    assert done.status is RunStatus.COMPLETED and done.structured_output == 10
    assert steps == [1]
