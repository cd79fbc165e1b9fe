"""A workflow's fan-out on PostgreSQL: its children are queued runs, and idle workers elsewhere
pick them up while the workflow waits for them."""

from __future__ import annotations

import asyncio

import pytest

from contextos import RunStatus, Runtime
from contextos import events as ev
from contextos.agents import load_ref
from contextos.workers import Worker, WorkerConfig

pytestmark = pytest.mark.postgres

FLOW = "tests/graph/spread_targets.py:flow"


async def test_fan_out_children_spread_across_workers(postgres_url: str) -> None:
    flow = load_ref(FLOW)
    quick = {"poll_s": 0.05, "lease_s": 5.0, "heartbeat_s": 0.5, "schedules": False}
    # One worker serves only the workflow, the other only the agent its children run.
    parent = Worker(
        postgres_url,
        config=WorkerConfig(concurrency=1, agents=("spread",), **quick),  # type: ignore[arg-type]
        worker_id="w-flow",
    )
    helper = Worker(
        postgres_url,
        config=WorkerConfig(concurrency=8, agents=("doubler",), **quick),  # type: ignore[arg-type]
        worker_id="w-help",
    )
    tasks = [asyncio.create_task(w.run()) for w in (parent, helper)]
    try:
        async with Runtime(postgres_url, worker_id="starter") as rt:
            run_id = await rt.start(flow, {"values": [1, 2, 3, 4, 5, 6]}, agent_ref=FLOW)
            for _ in range(600):
                if (await rt.store.get_run(run_id)).status.is_terminal:
                    break
                await asyncio.sleep(0.05)
            result = await rt.result(run_id)
            state = await rt.state(run_id)
            drivers = {}
            for key, child in state.children.items():
                events = await rt.events(child.contract.child_run_id)
                (started,) = [e for e in events if isinstance(e, ev.RunStarted)]
                drivers[key] = started.worker_id
            flow_events = await rt.events(run_id)
    finally:
        for w in (parent, helper):
            w.stop()
        await asyncio.gather(*tasks)
    assert result.status is RunStatus.COMPLETED, result.failure_message
    assert result.structured_output == [{"value": 2 * n} for n in range(1, 7)]
    (flow_start,) = [e for e in flow_events if isinstance(e, ev.RunStarted)]
    assert flow_start.worker_id == "w-flow"
    assert "w-help" in drivers.values()  # children ran on another worker than their parent
