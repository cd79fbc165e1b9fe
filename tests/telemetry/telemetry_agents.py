"""Agents the telemetry tests run: tools that answer, a tool that fails."""

from __future__ import annotations

from contextos import Agent, Budget
from contextos.testing import ScriptedModel, call_tool, call_tools, reply


def lookup(order_id: str) -> str:
    """Look up an order."""
    return f"order {order_id}: shipped"


def stock(sku: str) -> int:
    """Units in stock for a SKU."""
    return len(sku) * 7


def charge(amount: int) -> str:
    """Charge a card."""
    raise ValueError(f"card declined for {amount}")


def orders_agent() -> Agent:
    return Agent(
        name="orders",
        version="2",
        model=ScriptedModel(
            [
                call_tool("lookup", {"order_id": "A-1"}),
                call_tools(
                    [("stock", '{"sku": "SKU-9"}', None), ("lookup", '{"order_id": "B-2"}', None)]
                ),
                reply("A-1 shipped; SECRET-ANSWER 35 in stock", input_tokens=40, output_tokens=9),
            ]
        ),
        instructions="Answer order questions.",
        tools=[lookup, stock],
        budget=Budget(max_turns=6),
    )


def failing_agent() -> Agent:
    return Agent(
        name="billing",
        model=ScriptedModel([call_tool("charge", {"amount": 12}), reply("could not charge")]),
        tools=[charge],
    )
