"""A worker process driving a workflow is SIGKILLed in the middle of its gate's fan-out; another
worker takes the workflow over once the dead one's lease runs out and finishes it: finished
nodes and finished child runs are never run again, children in flight are resumed, not started
again, and the output is the one a clean run gives."""

from __future__ import annotations

import signal
from collections import Counter
from pathlib import Path

import pytest

from contextos import RunStatus, Runtime
from contextos.graph import load_runnable
from support.crashes import crash_env, lines
from support.processes import ended, spawn_worker, stop_all, wait_until

pytestmark = pytest.mark.slow

FLOW = "tests/graph/crash_targets.py:scan"
CHILDREN = [
    *(f"run_w.scan.{i}" for i in range(3)),
    *(f"run_w.recheck.{i}" for i in range(10)),
    "run_w.report",
]
DEAD = ["blog/page-1", "blog/page-2", "docs/page-1", "docs/page-2", "wiki/page-1", "wiki/page-2"]


async def test_a_workflow_outlives_its_killed_worker(tmp_path: Path) -> None:
    db = str(tmp_path / "runs.db")
    env = crash_env(tmp_path, CRASH_KILL_AT="disprove:6")
    first = spawn_worker(db, tmp_path / "first.log", env=env, lease_s=2.0)
    procs = [first]
    try:
        async with Runtime(db, worker_id="starter") as rt:
            flow = load_runnable(FLOW)
            await rt.start(
                flow, {"folders": ["docs", "blog", "wiki"]}, run_id="run_w", agent_ref=FLOW
            )

            async def killed() -> bool:
                return first.poll() is not None

            await wait_until(killed, what="the first worker to be killed")
            assert first.returncode == -signal.SIGKILL
            before = await rt.state("run_w")
            assert before.status is RunStatus.RUNNING
            done_before = {n for n, node in before.nodes.items() if node.status == "completed"}
            assert done_before == {"scan", "dedup"}  # killed inside the gate
            turns_before = {}
            for run_id in CHILDREN:
                try:
                    turns_before[run_id] = (await rt.state(run_id)).turns
                except Exception:  # not created before the kill
                    turns_before[run_id] = 0
            first_pid = int((tmp_path / "killed").read_text())

            procs.append(spawn_worker(db, tmp_path / "second.log", env=env, lease_s=2.0))
            assert await ended(rt, "run_w") is RunStatus.COMPLETED
            after = await rt.state("run_w")
            runs = sorted(r.run_id for r in await rt.runs(limit=100))
            turns_after = {run_id: (await rt.state(run_id)).turns for run_id in CHILDREN}
    finally:
        stop_all(procs)

    assert after.structured_output == {"dead": DEAD, "alive": 4}
    assert runs == sorted(["run_w", *CHILDREN])  # no child run started twice
    assert all(turns == 1 for turns in turns_after.values()), turns_after
    requests = lines(tmp_path / "model.jsonl")
    again = Counter(str(r["run_id"]) for r in requests if r["pid"] != first_pid)
    for run_id in CHILDREN:  # a recorded turn is never asked for again
        assert again[run_id] == (0 if turns_before[run_id] else 1), run_id
    assert [r["pid"] for r in lines(tmp_path / "code.jsonl")] == [first_pid]  # dedup ran once
    assert {str(r["run_id"]) for r in requests if r["pid"] != first_pid} >= {"run_w.report"}
