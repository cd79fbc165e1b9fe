"""Runtime facade: resume, changed agents, cancellation from another process, deadlines."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

from contextos import Agent, AgentChanged, Budget, FailureReason, RunIsTerminal, RunStatus, Runtime
from contextos import events as ev
from contextos.state import apply
from contextos.store.base import append_after
from contextos.testing import ScriptedModel, call_tool, reply

finished: list[str] = []


async def wait_for_approval(ticket: str) -> str:
    """An async tool that takes a long time."""
    await asyncio.sleep(30)
    finished.append(ticket)
    return "approved"


async def test_resume_of_a_finished_run_does_nothing(tmp_path: Path) -> None:
    model = ScriptedModel([reply("done")])
    async with Runtime(str(tmp_path / "r.db")) as rt:
        result = await rt.run(Agent(name="a", model=model), "x")
        again = await rt.resume(result.run_id, Agent(name="a", model=model))
    assert again == result
    assert len(model.requests) == 1


async def test_resume_with_a_changed_agent_is_refused(tmp_path: Path) -> None:
    async with Runtime(str(tmp_path / "r.db")) as rt:
        v1 = Agent(name="a", model=ScriptedModel([reply("done")]), instructions="be brief")
        run_id = await rt.start(v1, "x")
        v2 = Agent(name="a", model=ScriptedModel([reply("done")]), instructions="be verbose")
        with pytest.raises(AgentChanged, match="identity"):
            await rt.resume(run_id, v2)
        result = await rt.resume(run_id, v2, allow_changed_agent=True)
    assert result.status is RunStatus.COMPLETED


async def test_cancel_from_another_process_stops_an_in_flight_tool(tmp_path: Path) -> None:
    db = tmp_path / "r.db"
    model = ScriptedModel([call_tool("wait_for_approval", {"ticket": "T-1"}), reply("never")])
    agent = Agent(name="a", model=model, tools=[wait_for_approval])
    async with Runtime(str(db), cancel_poll_s=0.05) as rt:
        run_id = await rt.start(agent, "x")
        driving = asyncio.create_task(rt.resume(run_id, agent))
        while (await rt.store.get_run(run_id)).turns < 1:  # the tool is now in flight
            await asyncio.sleep(0.02)
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "contextos",
            "cancel",
            run_id,
            "--reason",
            "customer left",
            "--store",
            str(db),
            env={**os.environ, "NO_COLOR": "1"},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        _out, errs = await proc.communicate()
        assert proc.returncode == 0, errs.decode()
        result = await asyncio.wait_for(driving, timeout=10)
        events = await rt.events(run_id)
    assert result.status is RunStatus.CANCELLED
    assert result.failure_reason is FailureReason.CANCELLED
    assert finished == []  # the in-flight tool was cancelled, not awaited to the end
    assert events[-1].type == "run_cancelled" and events[-1].actor == "user:cli"
    assert isinstance(events[-1], ev.RunCancelled) and events[-1].reason == "customer left"
    assert len(model.requests) == 1


async def test_a_stale_worker_cannot_append_after_cancel(tmp_path: Path) -> None:
    async with Runtime(str(tmp_path / "r.db")) as rt:
        run_id = await rt.start(Agent(name="a", model=ScriptedModel([])), "x")
        await rt.cancel(run_id, reason="stop")
        late = ev.RunStarted(run_id=run_id, seq=3, worker_id="late")
        with pytest.raises(RunIsTerminal):
            await rt.store.append(run_id, [late], expected_seq=2)
        # Cancelling again is harmless and changes nothing.
        again = await rt.cancel(run_id)
        assert again.status is RunStatus.CANCELLED
        assert len(await rt.events(run_id)) == 2


async def test_a_driver_cannot_append_a_move_the_fold_would_refuse(tmp_path: Path) -> None:
    """A second question while a run already waits for a person would leave a log no fold
    can read: the append refuses it, and writes nothing."""
    async with Runtime(str(tmp_path / "r.db")) as rt:
        run_id = await rt.start(Agent(name="a", model=ScriptedModel([])), "x")
        state = await rt.state(run_id)

        def asked(seq: int) -> ev.InterruptRaised:
            return ev.InterruptRaised(
                run_id=run_id, seq=seq, interrupt_id=f"{run_id}.i{seq}", kind="review_required"
            )

        started = ev.RunStarted(run_id=run_id, seq=state.seq + 1, worker_id="w")
        await append_after(rt.store, state, [started, asked(state.seq + 2)], requests=())
        for e in await rt.store.read(run_id, after_seq=state.seq):
            apply(state, e)
        with pytest.raises(ValueError, match="interrupt_raised would move a input_required run"):
            await append_after(rt.store, state, [asked(state.seq + 1)], requests=())
        assert len(await rt.events(run_id)) == state.seq  # nothing was written
        assert (await rt.state(run_id)).status is RunStatus.INPUT_REQUIRED


async def test_deadline_recorded_at_start_survives_resume(tmp_path: Path) -> None:
    async with Runtime(str(tmp_path / "r.db")) as rt:
        agent = Agent(
            name="a", model=ScriptedModel([reply("late")]), budget=Budget(deadline_s=0.01)
        )
        run_id = await rt.start(agent, "x")
        await asyncio.sleep(0.05)
        result = await rt.resume(run_id, agent)
    assert result.failure_reason is FailureReason.TIMEOUT


def test_sync_facade_runs_to_the_end(tmp_path: Path) -> None:
    from contextos import run

    result = run(
        Agent(name="a", model=ScriptedModel([reply("hi")])), "x", store=str(tmp_path / "s.db")
    )
    assert result.ok and result.output == "hi"
