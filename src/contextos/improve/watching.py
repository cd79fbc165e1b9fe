"""The canary watch as a job: a workflow a schedule fires, so a worker judges the canary.

    watch

Each tick looks at the agent's canary, if it has one running, judges it on the criteria its
release names (as `contextos release watch` does), and rolls it back when one fails: that
rollback is a recorded decision like any other. With no canary running, the tick records that
and ends; it never releases anything.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

from contextos.graph import Workflow
from contextos.improve.service import Improvements
from contextos.runtime import Runtime

WATCH = "contextos-improve-watch"
"""The workflow's name: its runs are the scheduled looks at a canary."""


class WatchRequest(BaseModel):
    """What one tick of the watch looks at."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    agent: str
    """The agent whose canary is judged."""
    store: str | None = None
    """The store (default: $CONTEXTOS_STORE, else ./.contextos/contextos.db)."""
    max_failure_rate: float | None = None
    """One more criterion, beside those the release names."""
    min_runs: int = 5
    """Canary runs that must have ended before a failed criterion rolls it back."""


class Watched(BaseModel):
    """What one tick found, and what it did."""

    agent: str
    action: Literal["none", "wait", "healthy", "rolled_back"]
    """`none`: no canary running; `wait`: too few canary runs ended to judge yet."""
    candidate_id: str = ""
    runs: int = 0
    """Canary runs ended since the release."""
    stable_runs: int = 0
    judged: list[str] = []
    """Each criterion, measured on both arms, one line each."""


async def look(request: WatchRequest) -> Watched:
    """Judge the agent's canary now (and roll it back when a criterion fails)."""
    async with Runtime(request.store) as rt:
        loop = Improvements(rt)
        last = await loop.current(request.agent)
        if last is None or last.action != "release" or last.fraction >= 1:
            return Watched(agent=request.agent, action="none")
        verdict = await loop.watch(
            request.agent,
            max_failure_rate=request.max_failure_rate,
            min_runs=request.min_runs,
            by="canary-watch (scheduled)",
        )
    return Watched(
        agent=verdict.agent,
        action=verdict.action,
        candidate_id=verdict.candidate_id,
        runs=verdict.runs,
        stable_runs=verdict.stable_runs,
        judged=[j.line() for j in verdict.judged],
    )


def watch_workflow() -> Workflow:
    flow = Workflow(WATCH, input=WatchRequest)
    flow.code("watch", look)
    return flow


canary_watch = watch_workflow()

__all__ = ["WATCH", "WatchRequest", "Watched", "canary_watch", "look", "watch_workflow"]
