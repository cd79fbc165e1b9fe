"""Helpers for the trigger tests: the agents, and what started each run."""

from __future__ import annotations

from contextos import Runtime
from contextos import events as ev
from contextos.runs import RunId
from contextos.store.queue import RunQueue, queue_of

AGENTS = "tests/triggers/trigger_agents.py"
WRITER = f"{AGENTS}:writer"
FAILING_WRITER = f"{AGENTS}:failing_writer"
REVIEWER = f"{AGENTS}:reviewer"
PUBLISHER = f"{AGENTS}:publisher"
LOOPER = f"{AGENTS}:looper"
GATED = f"{AGENTS}:gated"
COUNTER = f"{AGENTS}:counter"


def queue(rt: Runtime) -> RunQueue:
    q = queue_of(rt.store)
    assert q is not None
    return q


async def created(rt: Runtime, run_id: str) -> ev.RunCreated:
    first = (await rt.events(run_id))[0]
    assert isinstance(first, ev.RunCreated)
    return first


async def runs_of(rt: Runtime, agent: str) -> list[RunId]:
    """Every run of an agent, by name."""
    return [r.run_id for r in await rt.runs(limit=1000) if r.agent_name == agent]


async def started_after(rt: Runtime, agent: str) -> dict[str, list[RunId]]:
    """Runs of `agent` by the source run whose ending started them."""
    out: dict[str, list[RunId]] = {}
    for run_id in await runs_of(rt, agent):
        source = (await created(rt, run_id)).metadata.get("source_run")
        out.setdefault(str(source), []).append(run_id)
    return out
