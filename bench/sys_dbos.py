"""DBOS under benchmark: a durable workflow whose every step is checkpointed on SQLite.

The agent loop is written the DBOS way: a workflow calls a `model` step (the zero-latency
scripted answer) and an `echo` step per turn; DBOS records each step's output before the
workflow moves on, and a recovered workflow replays from those records. DBOS's own SQLite
settings are kept (its system database, default journal and synchronous modes).
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

from bench.common import (
    CONCURRENT_CALLS,
    MESSAGE,
    MODEL_SLEEP_S,
    cpu,
    disk_bytes,
    emit,
    now,
    peak_rss_mb,
    percentile,
    rss_mb,
)

WORKFLOW_ID = "bench"
_stop_at: int | None = None
"""When set, the model step for this turn ends the process (a crash, after reporting)."""
_on_stop: Any = None


def _define() -> Any:
    """Register the workflow and its steps (once per process) and return them."""
    from dbos import DBOS

    @DBOS.step()
    def model(done: int, turns: int) -> str | None:
        if done < turns:
            return MESSAGE
        if _stop_at is not None and done >= _stop_at:
            _on_stop()
        return None

    @DBOS.step()
    def echo(text: str) -> str:
        return text

    @DBOS.workflow()
    def agent(turns: int) -> str:
        done = 0
        while True:
            text = model(done, turns)
            if text is None:
                return "done"
            echo(text)
            done += 1

    @DBOS.step()
    async def amodel(done: int, turns: int) -> str | None:
        await asyncio.sleep(MODEL_SLEEP_S)
        return MESSAGE if done < turns else None

    @DBOS.step()
    async def aecho(text: str) -> str:
        return text

    @DBOS.workflow()
    async def aagent(turns: int) -> str:
        done = 0
        while True:
            text = await amodel(done, turns)
            if text is None:
                return "done"
            await aecho(text)
            done += 1

    return agent, aagent


def _launch(db: Path) -> Any:
    from dbos import DBOS

    DBOS(config={"name": "bench", "system_database_url": f"sqlite:///{db}"})
    DBOS.launch()
    return DBOS


def turns(db: str, n: int, crash: bool = False, warmup: bool = True) -> dict[str, Any]:
    global _stop_at, _on_stop
    path = Path(db)
    agent, _ = _define()
    dbos = _launch(path)
    if warmup:
        agent(3)  # same file: DBOS keeps one system database per process
    empty = disk_bytes(path)
    started, cpu_started = now(), cpu()

    def result(status: str) -> dict[str, Any]:
        elapsed, used = now() - started, cpu() - cpu_started
        return {
            "elapsed_s": elapsed,
            "per_turn_us": elapsed / n * 1e6,
            "cpu_per_turn_us": used / n * 1e6,
            "status": status,
            "bytes": disk_bytes(path),
            "empty_bytes": empty,
        }

    if crash:
        _stop_at = n

        def stop() -> None:
            emit(result("stopped"))
            os._exit(0)  # a crash: the workflow stays pending in the database

        _on_stop = stop
    from dbos import SetWorkflowID

    with SetWorkflowID(WORKFLOW_ID):
        agent(n)
    out = result("completed")
    dbos.destroy()
    return out


def load(db: str, n: int) -> dict[str, Any]:
    """In a fresh process: launch DBOS (which recovers the pending workflow) and wait for it."""
    _define()
    t0 = now()
    dbos = _launch(Path(db))
    t1 = now()
    handle = dbos.retrieve_workflow(WORKFLOW_ID)
    status = handle.get_status()
    t2 = now()
    out = handle.get_result()
    t3 = now()
    assert out == "done", out
    assert status is not None
    dbos.destroy()
    return {"open_ms": (t1 - t0) * 1e3, "load_ms": (t2 - t1) * 1e3, "resume_ms": (t3 - t2) * 1e3}


def concurrent(db: str, runs: int) -> dict[str, Any]:
    _, aagent = _define()
    dbos = _launch(Path(db))

    async def main() -> dict[str, Any]:
        await aagent(1)  # warm up
        base_rss = rss_mb()
        latencies: list[float] = []
        errors: list[str] = []
        started = now()

        async def one() -> None:
            try:
                if await aagent(CONCURRENT_CALLS - 1) != "done":
                    errors.append("did not finish")
            except Exception as exc:
                errors.append(f"{type(exc).__name__}: {exc}")
            latencies.append(now() - started)

        await asyncio.gather(*(one() for _ in range(runs)))
        wall = now() - started
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

    try:
        return asyncio.run(main())
    finally:
        dbos.destroy()


def startup(db: str) -> dict[str, Any]:
    rss0 = rss_mb()
    t0 = now()
    import dbos  # noqa: F401

    t1 = now()
    rss1 = rss_mb()
    agent, _ = _define()
    instance = _launch(Path(db))
    t2 = now()
    rss2 = rss_mb()
    out = agent(1)
    t3 = now()
    assert out == "done"
    instance.destroy()
    return {
        "import_ms": (t1 - t0) * 1e3,
        "define_ms": (t2 - t1) * 1e3,
        "start_ms": None,
        "first_run_ms": (t3 - t2) * 1e3,
        "rss_import_mb": rss1 - rss0,
        "rss_define_mb": rss2 - rss1,
        "rss_total_mb": rss_mb(),
    }
