"""Refunds under a policy: one under the threshold goes through, one over it stops for approval.

Run it (scripted model: no key, no network, a throwaway store):

    python examples/refund_approval.py

Or drive it from the command line against a store of your own:

    export CONTEXTOS_POLICY=examples/refund_policy.toml
    contextos run examples/refund_approval.py:large_refund "Refund order A-2 please"
    contextos inbox
    contextos approve <interrupt id> --as alice
    contextos resume <run id>
    contextos show <run id>
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
from pathlib import Path
from typing import Any

from contextos import Agent, RunStatus, Runtime, ToolContext, tool
from contextos.policy import Decision, Policy, Principal, Rule
from contextos.policy.authority import Authority
from contextos.policy.rules import conditions
from contextos.testing import ScriptedModel, call_tool, reply

REFUNDS: dict[str, dict[str, Any]] = {}
"""The payment provider's ledger, keyed by idempotency key (a real one would be remote)."""


@tool(
    effect="irreversible",
    risk="high",
    scopes=("payments:refund",),
    reconcile=lambda key: REFUNDS.get(key),
)
def refund(order_id: str, amount: float, ctx: ToolContext) -> dict[str, Any]:
    """Refund an amount in EUR on an order."""
    key = ctx.idempotency_key or ""
    REFUNDS.setdefault(key, {"order_id": order_id, "refunded": amount})
    return REFUNDS[key]


POLICY = Policy(
    name="refunds",
    version="2026-11",
    rules=(
        Rule(
            id="refund-over-100",
            tools=("refund",),
            decision=Decision.REQUIRE_APPROVAL,
            approver_role="finance",
            when=conditions({"amount": {"gt": 100}}),
            reason="refunds over 100 EUR need a finance approver",
            preview="Refund {amount} EUR on order {order_id}",
            blast_radius="irreversible: {amount} EUR leave the company",
        ),
        Rule(
            id="refund-ceiling",
            tools=("refund",),
            decision=Decision.DENY,
            absolute=True,
            when=conditions({"amount": {"gt": 10_000}}),
            reason="no refund above 10000 EUR, whoever approves",
        ),
    ),
    roles={"finance": ("alice",)},
    approval_ttl_s=3600,
)


def refund_agent(order_id: str, amount: float) -> Agent:
    model = ScriptedModel(
        [
            call_tool("refund", {"order_id": order_id, "amount": amount}),
            reply(f"Refunded {amount:.2f} EUR on order {order_id}."),
        ],
        by_turn=True,  # a resumed run gets the step for the turn it is on
    )
    return Agent(name="refunds", model=model, tools=[refund], instructions="Issue refunds.")


small_refund = refund_agent("A-1", 40)
large_refund = refund_agent("A-2", 250)

CUSTOMER_AGENT = Principal.user("support-bot", scopes=("payments:refund",))


async def main(store: str) -> None:
    async with Runtime(store, policy=Authority(POLICY)) as rt:
        small = await rt.run(small_refund, "Refund order A-1", principal=CUSTOMER_AGENT)
        print(f"40 EUR refund: {small.status}: {small.output}")

        large = await rt.run(large_refund, "Refund order A-2", principal=CUSTOMER_AGENT)
        print(f"250 EUR refund: {large.status}")
        assert large.status is RunStatus.INPUT_REQUIRED and not any(
            v["order_id"] == "A-2" for v in REFUNDS.values()
        )

        (pending,) = await rt.inbox()
        action = pending.action
        assert action is not None
        print(f"  inbox: {pending.id} [{pending.kind}] {pending.prompt}")
        print(f"  blast radius: {action.blast_radius}; needs role: {pending.approver_roles}")
        print(f"  frozen action hash: {action.hash}")

        approval = await rt.approve(
            pending.id, approver="alice", expires_in=3600, action_hash=action.hash
        )
        print(f"  {approval.id} by {approval.approver} until {approval.expires_at:%H:%M} UTC")

        done = await rt.resume(large.run_id, large_refund)
        print(f"250 EUR refund after approval: {done.status}: {done.output}")

        print("\nthe trail of the large refund:")
        for entry in await rt.timeline(large.run_id):
            print(f"  #{entry.seq} {entry.type}: {entry.line}")


if __name__ == "__main__":
    if len(sys.argv) > 1:
        asyncio.run(main(sys.argv[1]))
    else:
        with tempfile.TemporaryDirectory() as tmp:
            asyncio.run(main(str(Path(tmp) / "runs.db")))
