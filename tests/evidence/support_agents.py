"""A support agent with a read tool, a write tool under an approval policy and a verifier, for
the evidence tests (also loaded by reference: `tests/evidence/support_agents.py:agent`).

Every call of a write tool appends a line to the file EVIDENCE_LEDGER names, so a test can
count the writes that really happened.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from contextos import Agent, Budget, ToolContext, ToolResult, tool
from contextos.agents import Subagent
from contextos.models.base import ModelRequest, ModelResponse
from contextos.policy import Decision, Policy, Rule
from contextos.policy.rules import conditions
from contextos.testing import ScriptedModel, call_tool, reply

INSTRUCTIONS = "Look the order up, refund what was paid, then confirm in one sentence."
CREDIT_INSTRUCTIONS = "Look the order up; never refund: give store credit, then confirm."


def _write(line: dict[str, Any]) -> None:
    with Path(os.environ["EVIDENCE_LEDGER"]).open("a") as f:
        f.write(json.dumps(line) + "\n")


def writes(path: Path) -> list[dict[str, Any]]:
    """Every write the tools made, in order."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


def lookup(order_id: str) -> dict[str, Any]:
    """Look an order up."""
    return {"order_id": order_id, "status": "delivered", "paid": 250.0, "email": "jo@example.com"}


@tool(effect="write", risk="high", scopes=("payments:refund",), description="Refund an order.")
def refund(order_id: str, amount: float, ctx: ToolContext) -> ToolResult:
    _write({"tool": "refund", "order_id": order_id, "amount": amount, "key": ctx.idempotency_key})
    return ToolResult(output={"refunded": amount}, receipts={"refund_id": f"rf_{order_id}"})


@tool(effect="write", description="Give store credit on an order.")
def credit(order_id: str, amount: float) -> dict[str, Any]:
    _write({"tool": "credit", "order_id": order_id, "amount": amount})
    return {"credited": amount}


POLICY = Policy(
    name="refunds",
    version="1",
    rules=(
        Rule(
            id="refund-over-100",
            tools=("refund",),
            decision=Decision.REQUIRE_APPROVAL,
            approver_role="finance",
            when=conditions({"amount": {"gt": 100}}),
            reason="refunds over 100 EUR need a finance approver",
        ),
    ),
    roles={"finance": ("alice", "alice@acme")},  # the default tenant and acme
)


def confirmed(answer: str) -> bool:
    """The answer says what was done."""
    return "250" in answer


def _second_turn(request: ModelRequest) -> ModelResponse:
    """Refund, unless the instructions say to give store credit instead."""
    system = request.messages[0].content if request.messages[0].role == "system" else ""
    chosen = "credit" if "store credit" in system else "refund"
    return call_tool(chosen, {"order_id": "A-1", "amount": 250.0})


def _answer(request: ModelRequest) -> ModelResponse:
    last = request.messages[-1].content
    return reply("Credited 250 EUR." if "credited" in last else "Refunded 250 EUR on A-1.")


def model() -> ScriptedModel:
    """The scripted model: look up, refund (or credit), confirm; chosen by turn."""
    return ScriptedModel(
        [call_tool("lookup", {"order_id": "A-1"}), _second_turn, _answer], by_turn=True
    )


def support(instructions: str = INSTRUCTIONS, *, tools: tuple[Any, ...] = ()) -> Agent:
    return Agent(
        name="support",
        model=model(),
        instructions=instructions,
        tools=tools or (lookup, refund, credit),
        verifier=confirmed,
        budget=Budget(max_turns=6),
    )


agent = support()
credit_agent = support(CREDIT_INSTRUCTIONS)


def cites(answer: str) -> list[str]:
    """The answer cites a source."""
    return [] if "[1]" in answer else ["cite a source as [1]"]


writer = Agent(
    name="writer",
    model=ScriptedModel([reply("Paris."), reply("Paris [1].")], by_turn=True),
    instructions="Answer in one sentence and cite your source.",
    verifier=cites,
)
"""An agent whose first answer fails verification and whose second passes."""

checker = Agent(name="checker", model=ScriptedModel([reply("A-1 is paid.")], by_turn=True))
planner = Agent(
    name="planner",
    model=ScriptedModel(
        [call_tool("delegate_to_checker", {"task": "Is order A-1 paid?"}), reply("It is paid.")],
        by_turn=True,
    ),
    subagents=[Subagent(agent=checker)],
)
"""An agent that hands one question to a child run."""
