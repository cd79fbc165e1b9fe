"""An agent that delegates, and a workflow, whose models and tools log every call to files.

Imported by reference in processes that get killed (`tests/graph/crash_targets.py:planner`,
`…:scan`); CRASH_LOG_DIR says where the logs go, so a test can count calls across processes.
"""

from __future__ import annotations

import json
import os
import signal
from collections import Counter
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


_calls: Counter[str] = Counter()


def kill_once(step: str) -> None:
    """With CRASH_KILL_AT=`step`:N, SIGKILL this process at its Nth call of `step`, in the first
    process only (a marker file in CRASH_LOG_DIR remembers the kill)."""
    at, _, n = os.environ.get("CRASH_KILL_AT", "").partition(":")
    _calls[step] += 1
    marker = LOG_DIR / "killed"
    if at == step and _calls[step] == int(n) and not marker.exists():
        marker.write_text(str(os.getpid()))
        os.kill(os.getpid(), signal.SIGKILL)


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


# -- a workflow: fan-out of 3 agent nodes -> code reduce -> gate over 10 items -> synthesis ----

from contextos.graph.workflow import ClaimCheck, Workflow  # noqa: E402
from contextos.models.base import ModelRequest, ModelResponse  # noqa: E402


class Scan(BaseModel):
    folders: list[str]


class Findings(BaseModel):
    links: list[str]


class Candidates(BaseModel):
    links: list[str]


class Report(BaseModel):
    dead: list[str]
    alive: int


def given(request: ModelRequest) -> object:
    """What a child run was given: the JSON after its objective."""
    return json.loads(request.messages[-1].content.rsplit("\n", 1)[-1])


def scan_folder(request: ModelRequest) -> ModelResponse:
    folder = given(request)
    links = [f"{folder}/page-{i}" for i in range(3)] + ["shared/home"]
    return reply(json.dumps({"links": links}))


def disprove(request: ModelRequest) -> ModelResponse:
    kill_once("disprove")
    link = str(given(request))
    dead = link.endswith("-1") or link.endswith("-2")
    reason = "404 on every try" if dead else "answered 200"
    return reply(json.dumps({"holds": dead, "reason": reason}))


def synthesize(request: ModelRequest) -> ModelResponse:
    checked = given(request)
    dead = sorted(checked["passed"])  # type: ignore[index]
    return reply(json.dumps({"dead": dead, "alive": len(checked["rejected"])}))  # type: ignore[index]


def dedupe(found: list[Findings]) -> Candidates:
    log("code.jsonl", node="dedup")
    seen: dict[str, None] = {}
    for f in found:
        seen.update(dict.fromkeys(f.links))
    return Candidates(links=list(seen))


def scripted(name: str, step: object, output: type[BaseModel]) -> Agent:
    return Agent(
        name=name,
        model=ScriptedModel([step], by_turn=True, log_path=LOG_DIR / "model.jsonl"),  # type: ignore[list-item]
        output_type=output,
    )


scan = Workflow("link-scan", input=Scan)
scan.map(
    "scan", scripted("scanner", scan_folder, Findings), over="folders", item=str, concurrency=3
)
scan.reduce("dedup", dedupe)
scan.gate(
    "recheck",
    scripted("checker", disprove, ClaimCheck),
    over="links",
    claim="this link is dead",
    concurrency=4,
)
scan.agent("report", scripted("writer", synthesize, Report))
