"""A long-lived process (a worker) keeps nothing of the runs it has finished.

Each check runs in a fresh interpreter: the caches it is about are process-wide, so in the test
process itself earlier tests would already have filled them.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest


def python(script: str, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script), *args],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_reading_the_rows_of_many_runs_keeps_none_of_their_values() -> None:
    # pydantic caches every short string it reads unless told otherwise: a run id per row read
    retained = python(
        """
        import gc, tracemalloc, uuid
        from contextos import codec
        from contextos.events import ModelResponded, RunStarted, ToolCompleted
        from contextos.messages import FinishReason, Message, ToolCall, Usage

        rows = []
        for _ in range(4000):
            rid = str(uuid.uuid4())
            call = ToolCall(id="call-" + rid[:8], name="echo", arguments='{"text": "hi"}')
            for event in (
                RunStarted(run_id=rid, seq=2, worker_id="w1"),
                ModelResponded(
                    run_id=rid, seq=3, message=Message(role="assistant", tool_calls=(call,)),
                    finish_reason=FinishReason.TOOL_CALLS, usage=Usage(), model="m",
                ),
                ToolCompleted(run_id=rid, seq=4, call_id=call.id, name="echo", output="hi"),
            ):
                at = event.occurred_at.isoformat()
                rows.append((rid, event.seq, event.type, 1, codec.pack(event), at))
        tracemalloc.start()
        gc.collect()
        before = tracemalloc.get_traced_memory()[0]
        for row in rows:
            codec.decode(*row)
        gc.collect()
        print((tracemalloc.get_traced_memory()[0] - before) / 4000)
        """
    )
    assert float(retained) < 5  # bytes per run: before, each run's ids stayed (about 140)


@pytest.mark.slow
def test_a_process_driving_run_after_run_holds_no_more_memory_per_run(tmp_path: Path) -> None:
    grown = python(
        """
        import asyncio, gc, sys, tracemalloc
        from contextos import Agent, Runtime, tool
        from contextos.testing import ScriptedModel, call_tool, reply

        @tool
        async def echo(text: str) -> str:
            "Return the text."
            return text

        steps = [call_tool("echo", {"text": "hello"}), call_tool("echo", {"text": "again"})]
        model = ScriptedModel([*steps, reply("done")], by_turn=True)
        agent = Agent(name="short", model=model, tools=[echo])

        async def main(url: str, warm: int, runs: int) -> float:
            async with Runtime(url) as rt:
                for i in range(warm + runs):
                    if i == warm:
                        gc.collect()
                        before = tracemalloc.take_snapshot()
                    assert (await rt.run(agent, "hi")).ok
                    model.requests.clear()  # the test double's own record of the calls
                gc.collect()
                after = tracemalloc.take_snapshot()
            mine = [tracemalloc.Filter(True, "*/contextos/*")]
            diff = after.filter_traces(mine).compare_to(before.filter_traces(mine), "filename")
            return sum(stat.size_diff for stat in diff) / runs

        tracemalloc.start()
        print(asyncio.run(main(sys.argv[1], 30, 300)))
        """,
        f"sqlite:///{tmp_path / 'runs.db'}",
    )
    # What the runtime allocated and still holds, per run, after 300 runs in one process: what
    # is in flight when the two snapshots are taken moves it by about a hundred bytes either
    # way. Before, every run's tool schemas were derived anew and kept in the context
    # compiler's table (about 870 bytes a run until the table filled, then cleared).
    assert float(grown) < 300


@pytest.mark.slow
def test_one_long_run_holds_each_message_not_a_copy_per_guard(tmp_path: Path) -> None:
    per_turn = python(
        """
        import asyncio, gc, sys, tracemalloc
        from contextos import Agent, Budget, Runtime
        from contextos.testing import call_tool, reply

        TURNS, HALF = 400, 200
        text = "a plain sentence of tool input that holds no personal data " * 3
        steps = [call_tool("echo", {"text": text}) for _ in range(TURNS)] + [reply("done")]
        snaps = []

        class Script:  # keeps nothing of what it is asked, unlike the recording test double
            name = "scripted"

            async def complete(self, request):
                if request.turn in (HALF + 1, TURNS + 1):
                    gc.collect()
                    snaps.append(tracemalloc.take_snapshot())
                return steps[request.turn - 1]

        async def echo(text: str) -> str:
            "Return the text."
            return text

        agent = Agent(name="long", model=Script(), tools=[echo], budget=Budget(max_turns=TURNS + 1))

        async def main(url: str) -> None:
            async with Runtime(url) as rt:  # the platform guards on, as by default
                assert (await rt.run(agent, "echo it")).ok

        tracemalloc.start()
        asyncio.run(main(sys.argv[1]))
        mine = [tracemalloc.Filter(True, "*/contextos/*")]
        before, after = (s.filter_traces(mine) for s in snaps)
        grown = sum(stat.size_diff for stat in after.compare_to(before, "filename"))
        print(grown / (TURNS - HALF))
        """,
        f"sqlite:///{tmp_path / 'runs.db'}",
    )
    # What the runtime allocates per turn and keeps for the rest of the run: each turn adds
    # two messages of about 200 characters, held by the run's state, the content guards'
    # rewrite of the tool result, the snapshot's encoding and the history index. Before, each
    # guard's copy of an entry had a set of its own and every entry kept its hashed form as
    # bytes (about 4.9 kB a turn in all; now about 2.9 kB).
    assert float(per_turn) < 3400
