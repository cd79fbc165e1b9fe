"""Agents the API tests start over HTTP (by reference or by name).

Each answers from a scripted model by turn. `payer` pays through a tool the policy makes wait
for a finance approver; `asker` asks a person a question; `greetings` is a workflow of one code
node. Payments are lines in the file named by CONTEXTOS_TEST_PAYMENTS, so a test can count how
often the tool really ran.
"""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import BaseModel

from contextos import Agent, ToolContext, Workflow, tool
from contextos.testing import ScriptedModel, call_tool, reply
from contextos.tools import ask_tools

greeter = Agent(name="greeter", model=ScriptedModel([reply("hello from greeter")], by_turn=True))


class Greetings(BaseModel):
    names: list[str]


def greet(names: Greetings) -> list[str]:
    return [f"hello {name}" for name in names.names]


greetings = Workflow("greetings", input=Greetings)
greetings.code("greet", greet)
"""A workflow: its input is JSON."""

PAYMENTS_ENV = "CONTEXTOS_TEST_PAYMENTS"


@tool(effect="irreversible", risk="high", description="Pay an amount in EUR to a supplier.")
def pay(supplier: str, amount: float, ctx: ToolContext) -> str:
    with Path(os.environ[PAYMENTS_ENV]).open("a") as f:
        f.write(f"{ctx.run_id} {supplier} {amount}\n")
    return f"paid {amount} EUR to {supplier}"


payer = Agent(
    name="payer",
    model=ScriptedModel(
        [call_tool("pay", {"supplier": "acme", "amount": 900.0}), reply("Done.")], by_turn=True
    ),
    tools=[pay],
)

ASK, _REVIEW = ask_tools()

asker = Agent(
    name="asker",
    model=ScriptedModel(
        [call_tool("ask_human", {"question": "Which warehouse?"}), reply("thanks")], by_turn=True
    ),
    tools=[ASK],
)

POLICY = """
name = "payments"
version = "1"

[roles]
finance = ["alice", "alice@acme", "carol@globex"]

[[rules]]
id = "pay-over-100"
tools = ["pay"]
decision = "require_approval"
approver_role = "finance"
reason = "payments over 100 EUR need a finance approver"
preview = "Pay {amount} EUR to {supplier}"
when = { amount = { gt = 100 } }
"""
