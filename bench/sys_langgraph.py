"""LangGraph under benchmark: `langchain.agents.create_agent` on the SQLite checkpointer.

The chat model is a zero-latency fake that calls `echo` until the thread holds `n` tool
results, then answers; it counts results in its input, so a resumed thread gets the right
step. Durability is `"sync"`: every step's checkpoint is written before the next step starts.
"""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

from bench.common import (
    CONCURRENT_CALLS,
    MESSAGE,
    MODEL_SLEEP_S,
    STAMPS,
    cpu,
    disk_bytes,
    now,
    peak_rss_mb,
    percentile,
    rss_mb,
    turn_medians,
)

THREAD = "bench"
RECURSION_LIMIT = 100_000


class ModelStopped(Exception):
    """The fake model's way of stopping a run mid-way (LangGraph keeps the last checkpoint)."""


def _model_class() -> Any:
    from langchain_core.language_models.chat_models import BaseChatModel
    from langchain_core.messages import AIMessage, ToolMessage
    from langchain_core.outputs import ChatGeneration, ChatResult

    class EchoChatModel(BaseChatModel):
        """Calls echo until `turns` tool results are in the thread, then answers."""

        turns: int
        crash: bool = False
        delay_s: float = 0.0

        @property
        def _llm_type(self) -> str:
            return "bench-echo"

        def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
            return self

        def _answer(self, messages: list[Any]) -> ChatResult:
            STAMPS.append(now())
            done = sum(1 for m in messages if isinstance(m, ToolMessage))
            if done < self.turns:
                msg = AIMessage(
                    content="",
                    tool_calls=[
                        {
                            "name": "echo",
                            "args": {"text": MESSAGE},
                            "id": f"call_{done + 1}",
                            "type": "tool_call",
                        }
                    ],
                )
            elif self.crash:
                raise ModelStopped()
            else:
                msg = AIMessage(content="done")
            return ChatResult(generations=[ChatGeneration(message=msg)])

        def _generate(self, messages: list[Any], stop: Any = None, **kwargs: Any) -> ChatResult:
            return self._answer(messages)

        async def _agenerate(
            self, messages: list[Any], stop: Any = None, **kwargs: Any
        ) -> ChatResult:
            if self.delay_s:
                await asyncio.sleep(self.delay_s)
            return self._answer(messages)

    return EchoChatModel


def _echo_tool() -> Any:
    from langchain_core.tools import tool

    @tool
    def echo(text: str) -> str:
        """Return the text unchanged."""
        return text

    return echo


def _connect(db: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(db, check_same_thread=False)
    # The checkpointer turns WAL on itself; FULL is what ContextOS and the raw floor use.
    conn.execute("PRAGMA synchronous=FULL")
    return conn


def _agent(turns: int, checkpointer: Any, *, crash: bool = False, delay_s: float = 0.0) -> Any:
    from langchain.agents import create_agent

    model = _model_class()(turns=turns, crash=crash, delay_s=delay_s)
    return create_agent(model, [_echo_tool()], checkpointer=checkpointer)


def _config(thread: str = THREAD) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread}, "recursion_limit": RECURSION_LIMIT}


def _input() -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": MESSAGE}]}


def turns(db: str, n: int, crash: bool = False, warmup: bool = True) -> dict[str, Any]:
    from langgraph.checkpoint.sqlite import SqliteSaver

    path = Path(db)
    if warmup:
        warm = path.with_name(path.stem + "-warmup.db")
        with _connect(warm) as wconn:
            _agent(3, SqliteSaver(wconn)).invoke(_input(), _config(), durability="sync")
    conn = _connect(path)
    SqliteSaver(conn).setup()
    conn.close()
    empty = disk_bytes(path)  # what an empty checkpointer takes on disk
    conn = _connect(path)
    saver = SqliteSaver(conn)
    saver.setup()
    agent = _agent(n, saver, crash=crash)
    STAMPS.clear()
    started, cpu_started = now(), cpu()
    try:
        agent.invoke(_input(), _config(), durability="sync")
        status = "completed"
    except ModelStopped:
        status = "stopped"
    elapsed, used = now() - started, cpu() - cpu_started
    rows = conn.execute("SELECT (SELECT COUNT(*) FROM checkpoints), (SELECT COUNT(*) FROM writes)")
    checkpoints, writes = rows.fetchone()
    conn.close()
    return {
        "elapsed_s": elapsed,
        "per_turn_us": elapsed / n * 1e6,
        "cpu_per_turn_us": used / n * 1e6,
        "status": status,
        "checkpoints": checkpoints,
        "writes": writes,
        "bytes": disk_bytes(path),
        "empty_bytes": empty,
        "first_turns_us": turn_medians(STAMPS)[0],
        "last_turns_us": turn_medians(STAMPS)[1],
    }


def load(db: str, n: int) -> dict[str, Any]:
    from langchain_core.messages import ToolMessage
    from langgraph.checkpoint.sqlite import SqliteSaver

    conn = _connect(Path(db))
    saver = SqliteSaver(conn)
    agent = _agent(n, saver)
    t0 = now()
    saver.setup()
    t1 = now()
    state = agent.get_state(_config())
    t2 = now()
    out = agent.invoke(None, _config(), durability="sync")
    t3 = now()
    conn.close()
    results = sum(1 for m in state.values["messages"] if isinstance(m, ToolMessage))
    assert results == n, results
    assert out["messages"][-1].content == "done"
    return {"open_ms": (t1 - t0) * 1e3, "load_ms": (t2 - t1) * 1e3, "resume_ms": (t3 - t2) * 1e3}


def concurrent(db: str, runs: int) -> dict[str, Any]:
    return asyncio.run(_concurrent(Path(db), runs))


async def _concurrent(db: Path, runs: int) -> dict[str, Any]:
    import aiosqlite
    from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

    conn = await aiosqlite.connect(db)
    await conn.execute("PRAGMA synchronous=FULL")
    saver = AsyncSqliteSaver(conn)
    await saver.setup()
    agent = _agent(CONCURRENT_CALLS - 1, saver, delay_s=MODEL_SLEEP_S)
    warm = _agent(1, saver)
    await warm.ainvoke(_input(), _config("warmup"), durability="sync")
    base_rss = rss_mb()
    latencies: list[float] = []
    errors: list[str] = []
    started = now()

    async def one(i: int) -> None:
        try:
            out = await agent.ainvoke(_input(), _config(f"t{i}"), durability="sync")
            if out["messages"][-1].content != "done":
                errors.append("did not finish")
        except Exception as exc:
            errors.append(f"{type(exc).__name__}: {exc}")
        latencies.append(now() - started)

    await asyncio.gather(*(one(i) for i in range(runs)))
    wall = now() - started
    await conn.close()
    peak = peak_rss_mb()
    return {
        "wall_s": wall,
        "runs_per_s": runs / wall,
        "p50_s": percentile(latencies, 50),
        "p99_s": percentile(latencies, 99),
        "errors": len(errors),
        "first_error": errors[0] if errors else None,
        "peak_rss_mb": peak,
        "base_rss_mb": base_rss,
        "per_run_kb": (peak - base_rss) * 1024 / runs,
    }


def startup(db: str) -> dict[str, Any]:
    rss0 = rss_mb()
    t0 = now()
    from langchain.agents import create_agent  # noqa: F401
    from langgraph.checkpoint.sqlite import SqliteSaver

    t1 = now()
    rss1 = rss_mb()
    conn = _connect(Path(db))
    saver = SqliteSaver(conn)
    agent = _agent(1, saver)
    t2 = now()
    rss2 = rss_mb()
    out = agent.invoke(_input(), _config(), durability="sync")
    t3 = now()
    assert out["messages"][-1].content == "done"
    conn.close()
    return {
        "import_ms": (t1 - t0) * 1e3,
        "define_ms": (t2 - t1) * 1e3,
        "start_ms": None,
        "first_run_ms": (t3 - t2) * 1e3,
        "rss_import_mb": rss1 - rss0,
        "rss_define_mb": rss2 - rss1,
        "rss_total_mb": rss_mb(),
    }
