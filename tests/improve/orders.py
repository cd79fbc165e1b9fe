"""An order-desk agent whose lookup tool is described misleadingly, for the improvement tests
(also loaded by reference: `tests/improve/orders.py:agent`).

The tool takes ids like `ORD-1234`, but its description says "its number, e.g. 1234". The
scripted model does what the description says: without `ORD-` in it, it first calls the tool
with the bare number, which fails, then corrects itself from the error; with it, it calls the
tool right the first time. A question about opening hours uses no tool at all, unless the
description says the tool tells opening hours too. `flow` runs the same agent as the node of
a workflow (`tests/improve/orders.py:flow#ask`).
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel

from contextos import Agent, Budget, Workflow, tool
from contextos.models.base import ModelRequest, ModelResponse
from contextos.testing import ScriptedModel, call_tool, reply

MISLEADING = "Look an order up by its number, e.g. 1234."
ORDERS = {"ORD-1234": "shipped", "ORD-77": "delivered", "ORD-5": "packed"}


@tool(description=MISLEADING)
def lookup_order(order_id: str) -> dict[str, Any]:
    if not order_id.startswith("ORD-"):
        raise ValueError(f"no order {order_id}: order ids look like ORD-1234")
    return {"order_id": order_id, "status": ORDERS.get(order_id, "unknown")}


def decide(request: ModelRequest) -> ModelResponse:
    """What a literal-minded model does with the order desk's tools."""
    ask = next(m.content or "" for m in request.messages if m.role == "user")
    described = next(t.description for t in request.tools if t.name == "lookup_order")
    last = request.messages[-1]
    if "hours" in ask:
        if "opening hours" in described and last.role != "tool":
            return call_tool("lookup_order", {"order_id": "hours"})
        return reply("We are open 9 to 5.")
    number = re.search(r"\d+", ask)
    assert number is not None
    if last.role == "tool":
        if "order ids look like ORD-" in (last.content or ""):
            return call_tool("lookup_order", {"order_id": f"ORD-{number.group()}"})
        status = re.search(r'"status": ?"(\w+)"', last.content or "")
        return reply(f"Order {number.group()} is {status.group(1) if status else 'unknown'}.")
    order_id = f"ORD-{number.group()}" if "ORD-" in described else number.group()
    return call_tool("lookup_order", {"order_id": order_id})


def desk() -> Agent:
    return Agent(
        name="order-desk",
        model=ScriptedModel([decide] * 8, by_turn=True),
        instructions="Answer questions about orders in one sentence.",
        tools=(lookup_order,),
        budget=Budget(max_turns=6),
    )


agent = desk()


class Question(BaseModel):
    text: str


def desk_flow() -> Workflow:
    """A workflow whose one agent node runs the order desk, as a child run."""
    flow = Workflow("desk-flow", input=Question)
    flow.agent("ask", desk())
    return flow


flow = desk_flow()
