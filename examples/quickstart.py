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


def lookup_order(order_id: str) -> str:
    """Look up an order by its id (like A-1001) and return its status, carrier and ETA."""
    key = order_id.strip().upper()
    order = ORDERS.get(key)
    if order is None:
        return f"There is no order {order_id}. Known orders: {', '.join(sorted(ORDERS))}."
    carrier = f" with {order['carrier']}" if order["carrier"] else ""
    return f"Order {key} is {order['status']}{carrier}; it arrives in {order['eta']}."


def answers_from_the_lookup(answer: str) -> list[str]:
    """Done means the answer states what the lookup found for one order: that order's status,
    together with its id, carrier or arrival time (numbers that merely look alike do not
    count: "1002 orders processed in 5 days" is not an answer)."""
    text = answer.lower()
    for order_id, order in ORDERS.items():
        details = [order_id, order["carrier"], order["eta"]]
        if str(order["status"]) in text and any(d and d.lower() in text for d in details):
            return []
    if "no order" in text:
        return []
    return ["Tell the customer what lookup_order said: the order's status and when it arrives."]


agent = Agent(
    name="order-support",
    version="1",
    model=os.environ.get("CONTEXTOS_MODEL", "local"),
    instructions=(
        "You are a support agent. To answer a question about an order, call lookup_order "
        "with the order id, then reply to the customer with the sentence it returned, "
        "word for word."
    ),
    tools=[lookup_order],
    verifier=answers_from_the_lookup,
    budget=Budget(max_turns=6, deadline_s=300),
)
