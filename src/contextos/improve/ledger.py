"""Where the loop's records live: each is the output of a run of its own.

Keeping a record is a run whose "model" is code that answers with the record's JSON, checked
against the record's type like any structured answer. So every finding set, candidate, replay
report and release decision has a log, an output artifact with its hash and a place among the
store's runs, on SQLite and PostgreSQL alike, with no table of its own. The run id is derived
from the record's id: keeping the same record twice keeps it once.
"""

from __future__ import annotations

from typing import TypeVar

from pydantic import BaseModel

from contextos.agents import Agent
from contextos.errors import ImprovementNotFound, RunNotFound
from contextos.messages import FinishReason, Message, Usage
from contextos.models.base import ModelRequest, ModelResponse
from contextos.runs import Budget, RunStatus
from contextos.runtime import Runtime

R = TypeVar("R", bound=BaseModel)

PREFIX = "contextos-improve-"
"""The agent name of a record's run is this plus the record's kind."""
_HINTS = {
    "candidate": "list them with `contextos candidate list`",
    "report": "make one with `contextos release check CANDIDATE --golden RUN`",
    "proposal": "list them with `contextos proposals`",
}
SCAN_LIMIT = 10_000
"""Runs read when listing records of one kind (the most recent first)."""


class _Writer:
    """The 'model' of a record's run: code that answers with the record, once."""

    name = "contextos-improve:record"

    def __init__(self, text: str) -> None:
        self.text = text

    async def complete(self, request: ModelRequest) -> ModelResponse:
        return ModelResponse(
            message=Message(role="assistant", content=self.text),
            finish_reason=FinishReason.STOP,
            usage=Usage(input_tokens=0, output_tokens=0, requests=1),
            model=self.name,
        )


def run_id_of(record_id: str) -> str:
    return f"run_improve_{record_id}"


async def keep(rt: Runtime, kind: str, record_id: str, record: BaseModel) -> str:
    """Keep `record` as the output of its own run; the run's id."""
    run_id = run_id_of(record_id)
    try:
        await rt.state(run_id)
        return run_id  # kept before: a record's id names its content
    except RunNotFound:
        pass
    agent = Agent(
        name=PREFIX + kind,
        model=_Writer(record.model_dump_json()),
        instructions=f"Keep the {kind} record.",
        output_type=type(record),
        budget=Budget(max_turns=1),
    )
    done = await rt.run(agent, record_id, run_id=run_id, metadata={"improve": kind})
    if done.status is not RunStatus.COMPLETED:  # pragma: no cover - the writer cannot fail
        raise ImprovementNotFound(f"the {kind} record {record_id} was not kept: {done.status}")
    return run_id


async def read(rt: Runtime, kind: str, record_id: str, as_type: type[R]) -> R:
    """The record kept under `record_id`."""
    try:
        state = await rt.state(run_id_of(record_id))
    except RunNotFound:
        raise ImprovementNotFound(
            f"no {kind} {record_id} in this store: {_HINTS[kind]}",
            id=record_id,
        ) from None
    if state.agent_name != PREFIX + kind or state.status is not RunStatus.COMPLETED:
        raise ImprovementNotFound(f"{record_id} is not a kept {kind}", id=record_id)
    return as_type.model_validate(state.structured_output)


async def listing(rt: Runtime, kind: str, as_type: type[R]) -> list[tuple[str, R]]:
    """Every kept record of a kind with its run id, oldest first."""
    rows = [
        s
        for s in await rt.runs(status=RunStatus.COMPLETED, limit=SCAN_LIMIT)
        if s.agent_name == PREFIX + kind
    ]
    rows.sort(key=lambda s: (s.created_at, s.run_id))
    out: list[tuple[str, R]] = []
    for s in rows:
        state = await rt.state(s.run_id)
        out.append((s.run_id, as_type.model_validate(state.structured_output)))
    return out


__all__ = ["PREFIX", "keep", "listing", "read", "run_id_of"]
