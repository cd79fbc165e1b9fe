"""A workflow that fans out to agent children, for workers to load by reference
(`tests/graph/spread_targets.py:flow`)."""

from __future__ import annotations

import json

from pydantic import BaseModel

from contextos import Agent, Workflow
from contextos.models.base import ModelRequest, ModelResponse
from contextos.testing import ScriptedModel, reply


class Numbers(BaseModel):
    values: list[int]


class Doubled(BaseModel):
    value: int


def double(request: ModelRequest) -> ModelResponse:
    n = int(request.messages[-1].content.rsplit("\n", 1)[-1])
    return reply(json.dumps({"value": 2 * n}))


doubler = Agent(name="doubler", model=ScriptedModel([double], by_turn=True), output_type=Doubled)

flow = Workflow("spread", input=Numbers)
flow.map("double", doubler, over="values", concurrency=8)
