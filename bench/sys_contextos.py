"""ContextOS under benchmark: a Runtime on a SQLite file, the scripted model, one echo tool.

Every function runs in its own worker process and returns a dict the driver aggregates.
Imports of contextos stay inside the functions so the start-up benchmark can time them.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from bench.common import (
    CONCURRENT_CALLS,
    MESSAGE,
    MODEL_SLEEP_S,
    STAMPS,
    Crash,
    cpu,
    disk_bytes,
    now,
    peak_rss_mb,
    percentile,
    rss_mb,
    turn_medians,
)

RUN_ID = "run_bench"


async def echo(text: str) -> str:
    """Return the text unchanged."""
    return text


def _stamped(response: Any) -> Any:
    """A script step that notes when it was asked for (None: the process stops there)."""

    def step(_: Any) -> Any:
        STAMPS.append(now())
        if response is None:
            raise Crash()
        return response

    return step


def _agent(turns: int, *, crash: bool, delay_s: float = 0.0) -> Any:
    from contextos import Agent, Budget
    from contextos.testing import ScriptedModel, call_tool, reply

    steps: list[Any] = [_stamped(call_tool("echo", {"text": MESSAGE})) for _ in range(turns)]
    steps.append(_stamped(None) if crash else _stamped(reply("done")))
    model: Any = ScriptedModel(steps, by_turn=True)
    if delay_s:
        model = _Sleepy(model, delay_s)
    # The bare turn, like LangGraph's bare agent: the platform guards are measured on their
    # own in the governed table (bench/stack.py).
    bare = "the bare turn is compared with a bare agent; the governed table measures the guards"
    return Agent(
        name="bench",
        model=model,
        tools=[echo],
        budget=Budget(max_turns=turns + 1),
        opt_out=dict.fromkeys(("budget", "pii", "sanitize"), bare),
    )


class _Sleepy:
    """A scripted model whose every answer takes `delay_s` (an async sleep, like a network call)."""

    def __init__(self, inner: Any, delay_s: float) -> None:
        self.inner = inner
        self.name = "scripted-sleepy"
        self.delay_s = delay_s

    async def complete(self, request: Any) -> Any:
        await asyncio.sleep(self.delay_s)
        return await self.inner.complete(request)


def turns(
    db: str, n: int, crash: bool = False, warmup: bool = True, floor: bool = False
) -> dict[str, Any]:
    """Drive one run of `n` echo turns, durable after every step; optionally stop before the end.

    With `floor`, the raw sqlite3 floor for the same turns is measured in this process right
    before and right after the run, beside the same file, so the pair sees the same disk.
    """
    if not floor:
        return asyncio.run(_turns(Path(db), n, crash, warmup))
    from bench import sys_raw

    def raw(tag: str, per_commit: int) -> tuple[float, float]:
        path = Path(db).with_name(f"{Path(db).stem}-floor{per_commit}-{tag}.db")
        res = sys_raw.turns(str(path), n, per_commit=per_commit)
        for p in path.parent.glob(path.name + "*"):
            p.unlink()
        return float(res["per_turn_us"]), float(res["cpu_per_turn_us"])

    before = (raw("a", 1), raw("a", 2))
    out = asyncio.run(_turns(Path(db), n, crash, warmup))
    after = (raw("b", 1), raw("b", 2))
    out["floor1_us"] = (before[0][0] + after[0][0]) / 2
    out["floor2_us"] = (before[1][0] + after[1][0]) / 2
    out["floor1_cpu_us"] = (before[0][1] + after[0][1]) / 2
    return out


async def _turns(db: Path, n: int, crash: bool, warmup: bool) -> dict[str, Any]:
    from contextos import Runtime
    from contextos.store import SqliteStore

    if warmup:  # first-use costs (schema builds, code paths) are not per-turn costs
        warm = db.with_name(db.stem + "-warmup.db")
        async with Runtime(SqliteStore(warm)) as rt:
            await rt.run(_agent(3, crash=False), MESSAGE)
    async with Runtime(SqliteStore(db)) as rt:
        await rt.runs()  # creates the schema: what an empty store takes on disk
    empty = disk_bytes(db)
    agent = _agent(n, crash=crash)
    STAMPS.clear()
    async with Runtime(SqliteStore(db)) as rt:
        started, cpu_started = now(), cpu()
        try:
            result = await rt.run(agent, MESSAGE, run_id=RUN_ID)
            status = result.status.value
        except Crash:
            status = "stopped"
        elapsed, used = now() - started, cpu() - cpu_started
        last_seq = (await rt.store.get_run(RUN_ID)).last_seq  # type: ignore[arg-type]
    return {
        "elapsed_s": elapsed,
        "per_turn_us": elapsed / n * 1e6,
        "cpu_per_turn_us": used / n * 1e6,
        "status": status,
        "events": last_seq,
        "bytes": disk_bytes(db),
        "empty_bytes": empty,
        "first_turns_us": turn_medians(STAMPS)[0],
        "last_turns_us": turn_medians(STAMPS)[1],
    }


def load(db: str, n: int) -> dict[str, Any]:
    """In a fresh process: fold a stopped `n`-turn run, then resume it to the end."""
    return asyncio.run(_load(Path(db), n))


async def _load(db: Path, n: int) -> dict[str, Any]:
    from contextos import Runtime
    from contextos.store import SqliteStore

    agent = _agent(n, crash=False)
    async with Runtime(SqliteStore(db)) as rt:
        t0 = now()
        await rt.store.get_run(RUN_ID)  # type: ignore[arg-type]  # opens the file
        t1 = now()
        state = await rt.state(RUN_ID)
        t2 = now()
        result = await rt.resume(RUN_ID, agent)
        t3 = now()
    assert state.turns == n, state.turns
    assert result.ok, result
    return {
        "open_ms": (t1 - t0) * 1e3,
        "load_ms": (t2 - t1) * 1e3,
        "resume_ms": (t3 - t2) * 1e3,
        "events": state.seq,
    }


def concurrent(db: str, runs: int) -> dict[str, Any]:
    """`runs` runs at once on one runtime, each 5 model calls that sleep 200 ms."""
    return asyncio.run(_concurrent(Path(db), runs))


async def _concurrent(db: Path, runs: int) -> dict[str, Any]:
    from contextos import Runtime
    from contextos.store import SqliteStore

    agent = _agent(CONCURRENT_CALLS - 1, crash=False, delay_s=MODEL_SLEEP_S)
    async with Runtime(SqliteStore(db)) as rt:
        await rt.run(_agent(1, crash=False), MESSAGE)  # warm up and open the file
        base_rss = rss_mb()
        latencies: list[float] = []
        errors: list[str] = []
        started, cpu_started = now(), cpu()

        async def one() -> None:
            try:
                result = await rt.run(agent, MESSAGE)
                if not result.ok:
                    errors.append(f"{result.status}: {result.failure_message}")
            except Exception as exc:
                errors.append(f"{type(exc).__name__}: {exc}")
            latencies.append(now() - started)

        await asyncio.gather(*(one() for _ in range(runs)))
        wall, used = now() - started, cpu() - cpu_started
    return {**_concurrency_result(wall, latencies, errors, runs, base_rss), "cpu_s": used}


def _concurrency_result(
    wall: float, latencies: list[float], errors: list[str], runs: int, base_rss: float
) -> dict[str, Any]:
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
    """Import, define an agent, start a run and drive it one turn, from a cold process."""
    rss0 = rss_mb()
    t0 = now()
    import contextos  # noqa: F401
    from contextos import Runtime
    from contextos.store import SqliteStore

    t1 = now()
    rss1 = rss_mb()
    agent = _agent(1, crash=False)
    t2 = now()
    rss2 = rss_mb()

    async def first_run() -> tuple[float, float]:
        async with Runtime(SqliteStore(db)) as rt:
            a = now()
            await rt.start(agent, MESSAGE)
            b = now()
            result = await rt.run(agent, MESSAGE)
            c = now()
            assert result.ok
            return b - a, c - b

    start_s, run_s = asyncio.run(first_run())
    rss3 = rss_mb()
    return {
        "import_ms": (t1 - t0) * 1e3,
        "define_ms": (t2 - t1) * 1e3,
        "start_ms": start_s * 1e3,
        "first_run_ms": run_s * 1e3,
        "rss_import_mb": rss1 - rss0,
        "rss_define_mb": rss2 - rss1,
        "rss_total_mb": rss3,
    }


CPU_PARTS = (
    ("run set-up: agent identity and tool schemas, per run", ("_create", "identity_hash")),
    ("context compilation, manifest, middleware chain", ("/context/", "/middleware/")),
    ("tool path: gateway, policy hook, effect ledger (tools/)", ("/tools/",)),
    (
        "event store: encode, SQLite, commit incl. fsync on disk (store/, events.py)",
        ("/store/", "encode"),
    ),
    ("fold: applying events to the state (state.py)", ("/state.py",)),
)


def profile(db: str, n: int, concurrent_runs: int = 0) -> dict[str, Any]:
    """Where the time goes: the per-turn workload (or `concurrent_runs` runs) under pyinstrument.

    Returns the profile as text, the busy time split into the parts of `CPU_PARTS`, the
    functions with the most time of their own, and (for the per-turn workload) the time per
    turn of the same run without the profiler, which slows what it measures.
    """
    from pyinstrument import Profiler

    from bench.profiling import IDLE, hotspots, split

    profiler = Profiler(interval=0.0002, async_mode="disabled")
    plain: list[float] = []

    async def main() -> None:
        from contextos import Runtime
        from contextos.store import SqliteStore

        async with Runtime(SqliteStore(Path(db).with_name("profile-warmup.db"))) as rt:
            await rt.run(_agent(3, crash=False), MESSAGE)
            if not concurrent_runs:  # the profiler slows code down: time the run without it
                started = now()
                await rt.run(_agent(n, crash=False), MESSAGE)
                plain.append((now() - started) / n * 1e6)
        async with Runtime(SqliteStore(db)) as rt:
            if concurrent_runs:
                agent = _agent(CONCURRENT_CALLS - 1, crash=False, delay_s=MODEL_SLEEP_S)
                profiler.start()
                await asyncio.gather(*(rt.run(agent, MESSAGE) for _ in range(concurrent_runs)))
            else:
                agent = _agent(n, crash=False)
                profiler.start()
                await rt.run(agent, MESSAGE)
            profiler.stop()

    asyncio.run(main())
    root = profiler.last_session.root_frame() if profiler.last_session else None
    parts = split(root, CPU_PARTS) if root is not None else {}
    idle = parts.pop(IDLE, 0.0)
    busy = sum(parts.values()) or 1.0
    return {
        "text": profiler.output_text(unicode=True, color=False),
        "parts": {k: v / busy for k, v in parts.items()},
        "idle": idle / (busy + idle),
        "plain_per_turn_us": plain[0] if plain else None,
        "hotspots": hotspots(root) if root is not None else [],
    }
