"""`Runtime.pause` and `Runtime.send` from Python: a run driven in this process pauses at its
next step, a paused run is claimed by no worker until it goes on, and a conversation's
follow-up reaches the model after the whole conversation, as the same run. On SQLite and on
PostgreSQL."""

from __future__ import annotations

import asyncio

import pytest

from contextos import (
    Agent,
    ConfigError,
    ControlRefused,
    ModelRequest,
    RunInUse,
    RunStatus,
    Runtime,
)
from contextos import events as ev
from contextos.store.queue import queue_of
from contextos.testing import ScriptedModel, call_tool, reply


def said(request: ModelRequest) -> list[tuple[str, str]]:
    """The conversation a model call was sent, without the system prompt."""
    return [(m.role, m.content) for m in request.messages if m.role in ("user", "assistant")]


async def test_a_follow_up_reaches_the_model_after_the_whole_conversation(
    backend_url: str,
) -> None:
    model = ScriptedModel([reply("42 orders"), reply("38 of them shipped")])
    agent = Agent(name="chat", model=model, conversation=True)
    async with Runtime(backend_url) as rt:
        first = await rt.run(agent, "how many orders?")
        assert (first.status, first.output) == (RunStatus.INPUT_REQUIRED, "42 orders")

        second = await rt.send(first.run_id, "and how many shipped?", agent=agent)
        assert second.run_id == first.run_id
        assert (second.status, second.output) == (RunStatus.INPUT_REQUIRED, "38 of them shipped")
        assert second.turns == 2
        events = await rt.events(first.run_id)
    assert said(model.requests[1]) == [
        ("user", "how many orders?"),
        ("assistant", "42 orders"),
        ("user", "and how many shipped?"),
    ]
    added = [e for e in events if isinstance(e, ev.UserMessageAdded)]
    assert [(e.content, e.actor) for e in added] == [("and how many shipped?", "user")]
    model.assert_complete()


async def test_a_paused_run_is_claimed_by_no_worker_until_it_is_sent_a_message(
    backend_url: str,
) -> None:
    model = ScriptedModel([reply("both noted")])
    agent = Agent(name="chat", model=model, conversation=True)
    async with Runtime(backend_url) as rt:
        queue = queue_of(rt.store)
        assert queue is not None
        run_id = await rt.start(agent, "note the first thing")
        paused = await rt.pause(run_id, reason="one more thing first")
        assert paused.status is RunStatus.PAUSED
        assert await queue.claim("w1", lease_s=30) is None

        sent = await rt.send(run_id, "and the second thing", drive=False)
        assert sent.status is RunStatus.QUEUED
        lease = await queue.claim("w1", lease_s=30)
        assert lease is not None and lease.run_id == run_id
        answered = await rt.resume(run_id, agent, lease=lease)
    assert (answered.status, answered.output) == (RunStatus.INPUT_REQUIRED, "both noted")
    assert said(model.requests[0]) == [
        ("user", "note the first thing"),
        ("user", "and the second thing"),
    ]


async def test_pause_of_a_run_driven_here_takes_effect_at_its_next_step(backend_url: str) -> None:
    started, go = asyncio.Event(), asyncio.Event()
    steps: list[int] = []

    async def step(n: int) -> str:
        """Do step n."""
        steps.append(n)
        started.set()
        await go.wait()
        return f"step {n} done"

    def agent() -> Agent:
        script = [call_tool("step", {"n": 1}), call_tool("step", {"n": 2}), reply("done")]
        return Agent(name="steps", model=ScriptedModel(script, by_turn=True), tools=[step])

    async with Runtime(backend_url) as rt:
        driving = asyncio.create_task(rt.run(agent(), "two steps", run_id="run_here"))
        await started.wait()
        asked = await rt.pause("run_here", reason="look first")
        assert asked.status is RunStatus.RUNNING  # its driver takes the request in later
        with pytest.raises(ControlRefused, match="is running and has not answered yet"):
            await rt.send("run_here", "hurry")
        go.set()
        paused = await driving
        assert paused.status is RunStatus.PAUSED and steps == [1]

        done = await rt.resume("run_here", agent())
        events = await rt.events("run_here")
    assert done.status is RunStatus.COMPLETED and steps == [1, 2]  # no step ran twice
    kinds = [e.type for e in events]
    assert kinds.index("run_pause_requested") < kinds.index("run_paused")
    assert kinds.count("run_paused") == 1 and kinds.count("tool_completed") == 2


async def test_resume_refuses_a_run_this_runtime_is_driving(backend_url: str) -> None:
    """Its lease is this runtime's own, so only the runtime can tell it is in use."""
    started, go = asyncio.Event(), asyncio.Event()
    steps: list[int] = []

    async def step(n: int) -> str:
        """Do step n."""
        steps.append(n)
        started.set()
        await go.wait()
        return f"step {n} done"

    script = [call_tool("step", {"n": 1}), reply("done")]
    agent = Agent(name="steps", model=ScriptedModel(script, by_turn=True), tools=[step])
    async with Runtime(backend_url) as rt:
        driving = asyncio.create_task(rt.run(agent, "one step", run_id="run_busy"))
        await started.wait()
        with pytest.raises(RunInUse, match="this runtime"):
            await rt.resume("run_busy", agent)
        go.set()
        done = await driving
    assert done.status is RunStatus.COMPLETED and steps == [1]  # the step ran once


async def test_what_a_run_cannot_take_is_refused_and_nothing_recorded(backend_url: str) -> None:
    async with Runtime(backend_url) as rt:
        done = await rt.run(Agent(name="once", model=ScriptedModel([reply("done")])), "x")
        recorded = len(await rt.events(done.run_id))
        with pytest.raises(ControlRefused, match="completed and is final"):
            await rt.send(done.run_id, "more")
        with pytest.raises(ControlRefused, match="already completed; there is nothing to pause"):
            await rt.pause(done.run_id)
        with pytest.raises(ConfigError, match="needs some text"):
            await rt.send(done.run_id, " \n")
        assert len(await rt.events(done.run_id)) == recorded


async def test_a_pause_asked_of_a_run_its_driver_let_go_of_is_recorded_at_once(
    backend_url: str,
) -> None:
    started, go = asyncio.Event(), asyncio.Event()

    async def step() -> str:
        """Take a while."""
        started.set()
        await go.wait()
        return "done"

    script = [call_tool("step", {}), reply("finished")]
    agent = Agent(name="slow", model=ScriptedModel(script, by_turn=True), tools=[step])
    async with Runtime(backend_url) as rt:
        driving = asyncio.create_task(rt.run(agent, "go", run_id="run_let_go"))
        await started.wait()
        assert (await rt.pause("run_let_go")).status is RunStatus.RUNNING
        rt.drain(reason="shutting down")  # the driver stops first: released, request pending
        go.set()
        assert (await driving).status is RunStatus.QUEUED

        paused = await rt.pause("run_let_go")  # nobody drives it now: paused here and now
        kinds = [e.type for e in await rt.events("run_let_go")]
    assert paused.status is RunStatus.PAUSED
    assert kinds[-3:] == ["tool_completed", "run_released", "run_paused"]
