"""An agent that delegates, and a workflow, whose models and tools log every call to files.

Imported by reference in processes that get killed (`tests/graph/crash_targets.py:planner`,
`…:scan`); CRASH_LOG_DIR says where the logs go, so a test can count calls across processes.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from pydantic import BaseModel

from contextos import Agent, Budget
from contextos.agents import Subagent
from contextos.testing import ScriptedModel, call_tool, reply

LOG_DIR = Path(os.environ.get("CRASH_LOG_DIR", "."))


def log(name: str, **fields: object) -> None:
    with (LOG_DIR / name).open("a") as f:
        f.write(json.dumps({**fields, "pid": os.getpid()}) + "\n")
        f.flush()
        os.fsync(f.fileno())


def lookup(order_id: str) -> str:
    """Look up an order."""
    log("tools.jsonl", tool="lookup", arg=order_id)
    return f"order {order_id}: shipped"


class Orders(BaseModel):
    shipped: list[str]


researcher = Agent(
    name="researcher",
    model=ScriptedModel(
        [
            call_tool("lookup", {"order_id": "A-1"}),
            call_tool("lookup", {"order_id": "B-2"}),
            reply('{"shipped": ["A-1", "B-2"]}'),
        ],
        by_turn=True,
        log_path=LOG_DIR / "model.jsonl",
    ),
    instructions="Look the orders up.",
    tools=[lookup],
    output_type=Orders,
)

planner = Agent(
    name="planner",
    model=ScriptedModel(
        [
            call_tool("delegate_to_researcher", {"task": "Are A-1 and B-2 shipped?"}),
            reply("FINAL: both shipped"),
        ],
        by_turn=True,
        log_path=LOG_DIR / "model.jsonl",
    ),
    instructions="Answer order questions; delegate the look-ups.",
    subagents=[Subagent(agent=researcher, budget=Budget(max_turns=5))],
    budget=Budget(max_turns=10),
)
