"""An agent that delegates, and a workflow, whose models and tools log every call to files.

Imported by reference in processes that get killed (`tests/graph/crash_targets.py:planner`,
`…:scan`); they log through `support.crashes`, so a test can count calls across processes.
"""

from __future__ import annotations

import json
import os
import time

from pydantic import BaseModel

from contextos import Agent, Budget, RetryPolicy
from contextos.agents import Subagent
from contextos.testing import ScriptedModel, call_tool, reply
from support.crashes import kill_once, lines, log, log_dir

LOG_DIR = log_dir()


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


# -- a routed workflow: fan-out of 2 agent nodes -> code reduce -> route -> agent or code ------


class Order(BaseModel):
    items: list[str]


class Priced(BaseModel):
    item: str
    price: float


class Total(BaseModel):
    total: float


class Decision(BaseModel):
    approved: bool
    by: str


def price_item(request: ModelRequest) -> ModelResponse:
    item = str(given(request))
    return reply(json.dumps({"item": item, "price": 40.0 * len(item)}))


def review(request: ModelRequest) -> ModelResponse:
    total = given(request)["total"]  # type: ignore[index]
    return reply(json.dumps({"approved": total < 1000, "by": "reviewer"}))


def add_prices(priced: list[Priced]) -> Total:
    log("code.jsonl", node="total")
    return Total(total=sum(p.price for p in priced))


def auto_approve(total: Total) -> Decision:
    log("code.jsonl", node="approve")
    return Decision(approved=True, by="rule")


def is_big(total: Total) -> bool:
    log("route.jsonl", node="total")
    return total.total >= 200


orders = Workflow("orders", input=Order)
orders.map("price", scripted("pricer", price_item, Priced), over="items", item=str, concurrency=1)
summed = orders.reduce("total", add_prices)
reviewed = orders.agent("review", scripted("reviewer", review, Decision), after=summed)
approved = orders.code("approve", auto_approve, after=summed)
orders.route(summed, (is_big, reviewed), otherwise=approved)
orders.join("decision", after=[reviewed, approved])


# -- a code node that acts on the world: at most once -----------------------------------------


class Payment(BaseModel):
    order: str
    amount: float


class Receipt(BaseModel):
    charged: str


def charge(p: Payment) -> Receipt:
    log("code.jsonl", node="charge")
    kill_once("charge")
    return Receipt(charged=f"{p.order}: {p.amount:.2f}")


def file_receipt(r: Receipt) -> Receipt:
    log("code.jsonl", node="file")
    return r


payments = Workflow("payments", input=Payment)
payments.code("charge", charge, effect="write")
payments.code("file", file_receipt)

careless = Workflow("payments-careless", input=Payment)
careless.code("charge", charge)  # no effect declared: run again when its output was not recorded
careless.code("file", file_receipt)


# -- a code node that acts, with a reconcile: the bank says what became of a call -------------


def charge_at_the_bank(p: Payment, *, idempotency_key: str) -> Receipt:
    log("code.jsonl", node="charge", key=idempotency_key)
    kill_once("send")  # stopped before the bank took the charge
    charged = f"{p.order}: {p.amount:.2f}"
    log("bank.jsonl", key=idempotency_key, charged=charged)
    kill_once("charge")  # stopped after the bank took it, before its output was recorded
    return Receipt(charged=charged)


def find_charge(idempotency_key: str) -> Receipt | None:
    """The bank's record of the charge made under the key, if any."""
    if os.environ.get("CRASH_BANK_DOWN"):
        raise ConnectionError("the bank does not answer")
    for r in lines(LOG_DIR / "bank.jsonl"):
        if r["key"] == idempotency_key:
            return Receipt(charged=str(r["charged"]))
    return None


reconciled = Workflow("payments-reconciled", input=Payment)
reconciled.code("charge", charge_at_the_bank, effect="write", reconcile=find_charge)
reconciled.code("file", file_receipt)


# -- two code nodes that act, side by side, both stopped mid-call ----------------------------


def charge_side(side: str, p: Payment) -> Receipt:
    dying = not (LOG_DIR / "killed").exists()  # the first process, the one that is killed
    log("pair.jsonl", side=side)
    while len(lines(LOG_DIR / "pair.jsonl")) < 2:  # both calls are under way
        time.sleep(0.01)
    kill_once(f"pair-{side}")
    while dying:  # the other call kills the process: this one must not finish (and be
        time.sleep(0.01)  # recorded) before it dies
    return Receipt(charged=f"{p.order} ({side})")


def both(a: Receipt, b: Receipt) -> Receipt:
    return Receipt(charged=f"{a.charged}, {b.charged}")


pair = Workflow("payments-pair", input=Payment)
first = pair.code("charge_a", lambda p: charge_side("a", p), effect="write", output=Receipt)
second = pair.code(
    "charge_b", lambda p: charge_side("b", p), after=pair.start, effect="write", output=Receipt
)
pair.code("both", both, after=[first, second])


# -- a fallback chain: a map that takes the first item giving a result ------------------------


class Mirrors(BaseModel):
    names: list[str]


class Fetched(BaseModel):
    mirror: str


def fetch_from(request: ModelRequest) -> ModelResponse:
    mirror = str(given(request))
    if mirror == "down":
        raise RuntimeError(f"mirror {mirror} does not answer")
    return reply(json.dumps({"mirror": mirror}))


fallback = Workflow("fallback", input=Mirrors)
fallback.map(
    "fetch",
    scripted("fetcher", fetch_from, Fetched),
    over="names",
    item=str,
    concurrency=1,
    merge="first",
)


# -- a code node retried on errors it declares safe --------------------------------------------


def fetch_page(url: str) -> str:
    """Never reaches its server: each attempt is logged, then refused."""
    log("code.jsonl", node="fetch")
    kill_once("fetch")
    raise ConnectionError(f"{url}: connection refused")


flaky = Workflow("flaky", input=str)
flaky.code(
    "fetch", fetch_page, retry=RetryPolicy(attempts=2, safe_on=(ConnectionError,), backoff_s=0)
)


# -- a map whose worker is a function: each item's output recorded as it finishes --------------


class Urls(BaseModel):
    urls: list[str]


def fetch_each(url: str) -> str:
    log("code.jsonl", node="fetch", item=url)
    kill_once("fetch")
    return f"<html>{url}</html>"


pages = Workflow("pages", input=Urls)
pages.map("fetch", fetch_each, over="urls", concurrency=1)


# -- a reviewed draft, sent back to be revised -------------------------------------------------


class Topic(BaseModel):
    name: str


class Draft(BaseModel):
    text: str


def draft(request: ModelRequest) -> ModelResponse:
    """A note on the topic; a revision (told the comments) is stopped mid-call at CRASH_KILL_AT
    `revise`, and then says what it answers."""
    asked = request.messages[-1].content
    name = json.loads(asked.rsplit("\n", 1)[-1])["name"]
    _, _, comments = asked.partition("\nComments: ")
    if not comments:
        return reply(json.dumps({"text": f"a note on {name}"}))
    kill_once("revise")
    return reply(json.dumps({"text": f"a note on {name}, {comments.splitlines()[0]}"}))


def publish(d: Draft) -> str:
    log("code.jsonl", node="publish")
    return f"published: {d.text}"


drafted = Workflow("publish", input=Topic)
drafted.agent("draft", scripted("writer", draft, Draft), review=True, revisions=1)
drafted.code("publish", publish)
