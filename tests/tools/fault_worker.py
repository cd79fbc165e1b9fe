"""A worker process for the fault-injection test: drives a batch of payment runs to their end.

`python fault_worker.py DB RUN_ID...` starts each run that does not exist yet and resumes the
others, all concurrently. It prints `ready` once imported so the test can time its SIGKILL.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))

from payments_tools import ALL, warm_up

from contextos import Agent, Runtime
from contextos.errors import RunNotFound
from contextos.models.base import ModelRequest, ModelResponse
from contextos.testing import ScriptedModel, call_tool, reply

VARIANTS = ("charge_card", "charge_card_keyed", "charge_card_unchecked", "charge_refundable")


def variant(run_id: str) -> str:
    return VARIANTS[int(run_id.rsplit("_", 1)[1]) % len(VARIANTS)]


def _customer(request: ModelRequest) -> str:
    return f"cus_{request.run_id}"


def lookup(request: ModelRequest) -> ModelResponse:
    return call_tool("lookup_customer", {"customer": _customer(request)})


def charge(request: ModelRequest) -> ModelResponse:
    rid = str(request.run_id)
    args: dict[str, Any] = {"customer": _customer(request), "amount": 1000, "order_id": rid}
    return call_tool(variant(rid), args)


def check(request: ModelRequest) -> ModelResponse:
    """After the charge: when it did not go through, charge again (a new call, a new key)."""
    last = request.messages[-1]
    if (
        last.role == "tool"
        and last.content.startswith("The call to")
        and "did not take" in (last.content)
    ):
        return charge(request)
    return reply("charged")


def payment_agent() -> Agent:
    model = ScriptedModel([lookup, charge, check, reply("charged")], by_turn=True)
    return Agent(name="checkout", model=model, tools=ALL, instructions="Charge the order.")


async def drive(rt: Runtime, agent: Agent, run_id: str) -> str:
    try:
        await rt.state(run_id)
    except RunNotFound:
        result = await rt.run(agent, "charge the order", run_id=run_id)
    else:
        result = await rt.resume(run_id, agent)
    return result.status.value


async def main() -> None:
    db, run_ids = sys.argv[1], sys.argv[2:]
    agent = payment_agent()
    async with Runtime(db, cancel_poll_s=0.2) as rt:
        await rt.store.list_runs(limit=1)  # open the store before the clock starts
        await warm_up()  # the connection pool, too: kills should land in calls, not set-up
        print("ready", flush=True)
        statuses = await asyncio.gather(*(drive(rt, agent, r) for r in run_ids))
    print(json.dumps(dict(zip(run_ids, statuses, strict=True))), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
