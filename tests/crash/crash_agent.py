"""A multi-turn agent with tools whose model and tools log every call to files.

Imported by reference (`tests/crash/crash_agent.py:agent`) in worker processes that get killed;
CRASH_LOG_DIR says where the logs go, so the test can count calls across processes.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from contextos import Agent, Budget
from contextos.testing import ScriptedModel, call_tool, call_tools, reply

LOG_DIR = Path(os.environ.get("CRASH_LOG_DIR", "."))


DELAY_S = float(os.environ.get("CRASH_DELAY_S", "0"))


def _log(name: str, **fields: object) -> None:
    time.sleep(DELAY_S)
    with (LOG_DIR / name).open("a") as f:
        f.write(json.dumps({**fields, "pid": os.getpid()}) + "\n")
        f.flush()
        os.fsync(f.fileno())


def lookup(order_id: str) -> str:
    """Look up an order."""
    _log("tools.jsonl", tool="lookup", arg=order_id)
    return f"order {order_id}: shipped"


def stock(sku: str) -> int:
    """Units in stock for a SKU."""
    _log("tools.jsonl", tool="stock", arg=sku)
    return len(sku) * 7


def must_say_final(answer: str) -> list[str]:
    return [] if answer.startswith("FINAL") else ["Start the answer with FINAL."]


agent = Agent(
    name="crash-test",
    model=ScriptedModel(
        [
            call_tool("lookup", {"order_id": "A-1"}),
            call_tools(
                [("stock", '{"sku": "SKU-9"}', None), ("lookup", '{"order_id": "B-2"}', None)]
            ),
            reply("draft answer"),
            reply("FINAL: A-1 shipped, 35 in stock"),
        ],
        by_turn=True,
        log_path=LOG_DIR / "model.jsonl",
    ),
    instructions="Answer order questions.",
    tools=[lookup, stock],
    verifier=must_say_final,
    budget=Budget(max_turns=8),
)
