# ruff: noqa: RUF001, RUF002
"""Fan-out: a 100-way map of one-turn agent children and a code reduce, durable at each step.

ContextOS: a `Workflow` with a `map` over the items (each child an agent run under a
delegation contract, each with its own event log) and a `reduce` node, on a `SqliteStore`
file. LangGraph: a `StateGraph` whose conditional edge returns one `Send` per item to a node
that invokes a one-turn `create_agent` (so each child checkpoints as a subgraph of the same
thread), and a reduce node, on `SqliteSaver` with `durability="sync"`. Both get the same
zero-latency scripted model: each child answers its item at once.

`python -m bench.fanout SYSTEM JSON-KWARGS` measures one side in this process; the driver
(`bench_fanout`, called by `bench.run`) alternates fresh processes of both.
"""

from __future__ import annotations

import asyncio
import json
import operator
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Annotated, Any, TypedDict

from bench import explain
from bench.common import MESSAGE, disk_bytes, emit, median, now
from bench.harness import (
    ROOT,
    Plan,
    Report,
    WorkerFailed,
    log,
    ms,
    ratios,
    rounds,
    size,
    spread,
    table,
    times,
)

FANOUT_N = 100
"""Children per run."""


def items(n: int) -> list[str]:
    """The items: 200 characters each, like every message of the benchmark."""
    return [f"item {i:03d}: {MESSAGE}"[: len(MESSAGE)] for i in range(n)]


# -- ContextOS ----------------------------------------------------------------------------------


def contextos(db: str, n: int, warmup: bool = True) -> dict[str, Any]:
    return asyncio.run(_contextos(Path(db), n, warmup))


def _flow(n: int) -> Any:
    from pydantic import BaseModel

    from contextos import Agent, Budget, Workflow
    from contextos.models.base import ModelRequest, ModelResponse
    from contextos.testing import ScriptedModel, reply

    class Batch(BaseModel):
        items: list[str]

    class Summary(BaseModel):
        answers: int
        first: str

    def answer(request: ModelRequest) -> ModelResponse:
        return reply("done: " + json.loads(request.messages[-1].content.rsplit("\n", 1)[-1]))

    def summarize(answers: list[str]) -> Summary:
        return Summary(answers=len(answers), first=min(answers))

    # Like LangGraph's bare agent child: no platform guards (the governed table measures them).
    bare = "compared with a bare agent child; the governed table measures the guards"
    child = Agent(
        name="child",
        model=ScriptedModel([answer], by_turn=True),
        opt_out=dict.fromkeys(("budget", "pii", "sanitize"), bare),
    )
    # Enough budget for every child at once (each holds its 20 turns while it runs).
    flow = Workflow("fanout", input=Batch, budget=Budget(max_turns=20 * n))
    flow.map("children", child, over="items", concurrency=n)
    flow.reduce("summary", summarize)
    return flow, Batch(items=items(n))


async def _contextos(db: Path, n: int, warmup: bool) -> dict[str, Any]:
    from contextos import Runtime
    from contextos.store import SqliteStore

    if warmup:
        flow, batch = _flow(5)
        async with Runtime(SqliteStore(db.with_name(db.stem + "-warmup.db"))) as rt:
            await rt.run(flow, batch)
    async with Runtime(SqliteStore(db)) as rt:
        await rt.runs()  # creates the schema: what an empty store takes on disk
    empty = disk_bytes(db)
    flow, batch = _flow(n)
    async with Runtime(SqliteStore(db)) as rt:
        started, cpu = now(), time.process_time()
        result = await rt.run(flow, batch)
        elapsed, cpu = now() - started, time.process_time() - cpu
        runs = len(await rt.runs(limit=10 * n))
    conn = sqlite3.connect(db)
    events = conn.execute("SELECT count(*) FROM events").fetchone()[0]
    conn.close()
    return {
        "elapsed_s": elapsed,
        "cpu_s": cpu,
        "status": result.status.value,
        "output": result.structured_output,
        "bytes": disk_bytes(db) - empty,
        "runs": runs,
        "rows": events,
    }


# -- LangGraph ----------------------------------------------------------------------------------

SHAPES = ("subgraph", "node")
"""How the LangGraph children are made: `subgraph`, the agent graph itself is the node each
`Send` targets (its messages are reduced into the parent's state, as map-reduce over agent
nodes is written); `node`, a plain node that invokes the agent and returns only its answer."""


def _graph(checkpointer: Any, shape: str) -> Any:
    from langchain.agents import create_agent
    from langchain_core.language_models.chat_models import BaseChatModel
    from langchain_core.messages import AIMessage, AnyMessage
    from langchain_core.outputs import ChatGeneration, ChatResult
    from langgraph.graph import END, START, StateGraph
    from langgraph.graph.message import add_messages
    from langgraph.types import Send

    class AnswerModel(BaseChatModel):
        """Answers its item at once."""

        @property
        def _llm_type(self) -> str:
            return "bench-answer"

        def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
            return self

        def _generate(self, messages: list[Any], stop: Any = None, **kwargs: Any) -> ChatResult:
            text = "done: " + str(messages[-1].content)
            return ChatResult(generations=[ChatGeneration(message=AIMessage(content=text))])

    # The functional form: its types are objects now, not names LangGraph resolves later.
    State = TypedDict(  # noqa: UP013
        "State",
        {
            "items": list[str],
            "answers": Annotated[list[str], operator.add],
            "messages": Annotated[list[AnyMessage], add_messages],
            "summary": dict[str, Any],
        },
    )

    agent = create_agent(AnswerModel(), [])

    def ask(item: str) -> dict[str, Any]:
        return {"messages": [{"role": "user", "content": item}]}

    def child(state: dict[str, Any]) -> dict[str, Any]:
        out = agent.invoke(ask(state["item"]))
        return {"answers": [out["messages"][-1].content]}

    def fan_out(state: dict[str, Any]) -> list[Any]:
        if shape == "subgraph":
            return [Send("child", ask(item)) for item in state["items"]]
        return [Send("child", {"item": item}) for item in state["items"]]

    def summarize(state: dict[str, Any]) -> dict[str, Any]:
        answers = state["answers"] or [
            str(m.content) for m in state["messages"] if isinstance(m, AIMessage)
        ]
        return {"summary": {"answers": len(answers), "first": min(answers)}}

    graph = StateGraph(State)
    graph.add_node("child", agent if shape == "subgraph" else child)
    graph.add_node("summary", summarize)
    graph.add_conditional_edges(START, fan_out, ["child"])
    graph.add_edge("child", "summary")
    graph.add_edge("summary", END)
    return graph.compile(checkpointer=checkpointer)


def langgraph(db: str, n: int, shape: str = "subgraph", warmup: bool = True) -> dict[str, Any]:
    from langgraph.checkpoint.sqlite import SqliteSaver

    path = Path(db)

    def connect(p: Path) -> sqlite3.Connection:
        conn = sqlite3.connect(p, check_same_thread=False)
        conn.execute("PRAGMA synchronous=FULL")  # what ContextOS uses
        return conn

    config = {"configurable": {"thread_id": "fanout"}, "recursion_limit": 10_000}
    start = {"items": items(n), "answers": [], "messages": []}
    if warmup:
        with connect(path.with_name(path.stem + "-warmup.db")) as wconn:
            warm = {**start, "items": items(5)}
            _graph(SqliteSaver(wconn), shape).invoke(warm, config, durability="sync")
    conn = connect(path)
    SqliteSaver(conn).setup()
    conn.close()
    empty = disk_bytes(path)
    conn = connect(path)
    graph = _graph(SqliteSaver(conn), shape)
    started, cpu = now(), time.process_time()
    out = graph.invoke(start, config, durability="sync")
    elapsed, cpu = now() - started, time.process_time() - cpu
    rows = conn.execute("SELECT (SELECT count(*) FROM checkpoints) + (SELECT count(*) FROM writes)")
    (count,) = rows.fetchone()
    conn.close()
    return {
        "elapsed_s": elapsed,
        "cpu_s": cpu,
        "status": "completed",
        "output": out["summary"],
        "bytes": disk_bytes(path) - empty,
        "rows": count,
    }


# -- the driver ---------------------------------------------------------------------------------


def measure(system: str, **kwargs: Any) -> dict[str, Any]:
    """One measurement in a fresh process."""

    cmd = [sys.executable, "-m", "bench.fanout", system, json.dumps(kwargs)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    for line in proc.stdout.splitlines():
        if line.startswith("BENCH_RESULT "):
            result: dict[str, Any] = json.loads(line.removeprefix("BENCH_RESULT "))
            return result
    raise WorkerFailed(f"fanout {system} exited {proc.returncode}:\n{proc.stderr[-3000:]}")


SYSTEMS = ("contextos", "langgraph", "langgraph-node")


def bench_fanout(plan: Plan, work: Path, report: Report) -> None:
    """The fan-out table: time and storage of one 100-way map plus a reduce."""

    n_rounds = max(1, plan.startup_rounds)
    elapsed: dict[str, list[float]] = {s: [] for s in SYSTEMS}
    stored: dict[str, list[float]] = {s: [] for s in SYSTEMS}
    cpu: dict[str, list[float]] = {s: [] for s in SYSTEMS}
    rows_written: dict[str, float] = {}
    outputs: dict[str, Any] = {}
    for r, order in enumerate(rounds(n_rounds, list(SYSTEMS))):
        log(f"fan-out round {r + 1}/{n_rounds}: {', '.join(order)}")
        for system in order:
            db = work / f"fanout-{system}-{r}.db"
            kwargs: dict[str, Any] = {"db": str(db), "n": FANOUT_N}
            if system == "langgraph-node":
                kwargs["shape"] = "node"
            res = measure(system.split("-")[0], **kwargs)
            elapsed[system].append(res["elapsed_s"] * 1000)
            stored[system].append(res["bytes"])
            cpu[system].append(res["cpu_s"] * 1000)
            rows_written[system] = res["rows"]
            outputs[system] = res["output"]
            for p in work.glob(f"fanout-{system}-{r}*"):
                p.unlink()
    assert len({json.dumps(o, sort_keys=True) for o in outputs.values()}) == 1, outputs

    def row(what: str, values: dict[str, list[float]], fmt: Any, per: int = 1) -> list[str]:
        out = [what, spread([v / per for v in values["contextos"]], fmt)]
        for peer in SYSTEMS[1:]:
            out.append(spread([v / per for v in values[peer]], fmt))
            out.append(spread(ratios(values[peer], values["contextos"]), times) if per == 1 else "")
        return out

    time_ratio = ratios(elapsed["langgraph"], elapsed["contextos"])
    size_ratio = ratios(stored["langgraph"], stored["contextos"])
    report.add(
        f"## Fan-out: a {FANOUT_N}-way map and a reduce\n\n"
        f"One workflow run over {FANOUT_N} items: each item is a child that makes one model "
        "call (the scripted model answers at once), then a code step reduces the answers. "
        "ContextOS: a `Workflow` with `map` (each child an agent run under a recorded "
        "delegation contract, with its own event log, all at once: the workflow's budget "
        "holds every child's 20 turns together, where the default of 1,000 would start them "
        "50 at a time) and `reduce`, on a `SqliteStore` file. LangGraph: a `StateGraph` "
        "whose conditional edge returns one "
        '`Send` per item, then a reduce node, on `SqliteSaver` with `durability="sync"`; the '
        "child is a one-turn `create_agent`, either as the node each `Send` targets (its "
        "messages reduced into the parent's state: map-reduce over agent nodes as LangGraph "
        "writes it, and the shape the target is measured on), or invoked inside a "
        "plain node that returns only the answer (its checkpoints still go to the thread). All "
        "give the same output; items and answers are 200 characters, like every message of "
        "the benchmark. Storage is what the run added to an empty database on disk "
        f"(file, WAL and shared memory). {n_rounds} interleaved rounds; median (min–max).\n\n"
        + table(
            [
                "",
                "ContextOS",
                "LangGraph, agent as the node",
                "÷ ContextOS",
                "LangGraph, agent inside a node",
                "÷ ContextOS",
            ],
            [
                row("time for the run", elapsed, ms),
                row("time per child", elapsed, ms, FANOUT_N),
                row("CPU time per child (process time)", cpu, ms, FANOUT_N),
                row("storage for the run", stored, size),
                row("storage per child", stored, size, FANOUT_N),
                [
                    "rows written",
                    f"{rows_written.get('contextos', 0):,.0f} events",
                    f"{rows_written.get('langgraph', 0):,.0f} checkpoints + writes",
                    "",
                    f"{rows_written.get('langgraph-node', 0):,.0f} checkpoints + writes",
                    "",
                ],
            ],
        )
    )
    if time_ratio and size_ratio:
        per_child = {k: median(v) / FANOUT_N for k, v in stored.items()}
        why = explain.fanout(FANOUT_N, per_child["contextos"], per_child["langgraph"])
        if why:
            report.add(why)
        slow = explain.fanout_time(
            FANOUT_N,
            {s: median(v) / FANOUT_N for s, v in cpu.items()},
            {s: median(v) / FANOUT_N for s, v in elapsed.items()},
            rows_written.get("contextos", 0) / FANOUT_N,
        )
        if slow:
            report.add(slow)
        report.target(
            f"Fan-out: a {FANOUT_N}-way map of one-turn agent children and a reduce, ≥ 5× less "
            "time and ≥ 10× less storage than LangGraph's `Send` (agent as the node)",
            f"{_less(median(time_ratio), 'time')} "
            f"({ms(median(elapsed['contextos']) / FANOUT_N)} a child against "
            f"{ms(median(elapsed['langgraph']) / FANOUT_N)}); "
            f"{_less(median(size_ratio), 'storage')} ({size(per_child['contextos'])} a child "
            f"against {size(per_child['langgraph'])})"
            + (": a child run keeps its own log, contract and lineage" if why else ""),
            median(time_ratio) >= 5 and median(size_ratio) >= 10,
        )


def _less(ratio: float, what: str) -> str:
    """LangGraph ÷ ContextOS as words: `2.8× less time`, or `1.5× more storage`."""
    return f"{ratio:.1f}× less {what}" if ratio >= 1 else f"{1 / ratio:.1f}× more {what}"


def main() -> None:
    system, raw = sys.argv[1], sys.argv[2]
    run = {"contextos": contextos, "langgraph": langgraph}[system]
    emit(run(**json.loads(raw)))


if __name__ == "__main__":
    main()
