"""A small support agent: looks up an order with a tool, then answers.

Run it (on the embedded local model, no key, no network):

    contextos run examples/quickstart.py:agent "Where is order A-1001?"
    contextos show <run id>

Set CONTEXTOS_MODEL to use another model, e.g. "openai:gpt-4.1-mini" or
"openai-compatible:http://127.0.0.1:8080/v1#my-model".
"""

from __future__ import annotations

import os

from contextos import Agent, Budget

ORDERS = {
    "A-1001": {"status": "shipped", "carrier": "DHL", "eta": "2 days"},
    "A-1002": {"status": "processing", "carrier": None, "eta": "5 days"},
}


def lookup_order(order_id: str) -> dict[str, object]:
    """Look up an order by its id (like A-1001) and return its status, carrier and ETA."""
    order = ORDERS.get(order_id.strip().upper())
    if order is None:
        return {"error": f"no order {order_id}", "known_orders": sorted(ORDERS)}
    return {"order_id": order_id, **order}


def mentions_status(answer: str) -> list[str]:
    """Done means the answer tells the customer the order's status."""
    words = ("shipped", "processing", "no order")
    if any(w in answer.lower() for w in words):
        return []
    return ["Tell the customer the order's status (shipped or processing) from lookup_order."]


agent = Agent(
    name="order-support",
    version="1",
    model=os.environ.get("CONTEXTOS_MODEL", "local"),
    instructions=(
        "You are a support agent. To answer a question about an order, call lookup_order "
        "with the order id, then answer in one sentence with the order's status and ETA."
    ),
    tools=[lookup_order],
    verifier=mentions_status,
    budget=Budget(max_turns=6, deadline_s=300),
)
