# ruff: noqa: RUF001
"""Long-run memory: the RSS of one worker driving many runs, and of one very long run.

Many runs: N runs of two echo turns are queued on a SQLite store, then one `contextos worker`
process (`--concurrency 1`, so strictly one run after another) drives them all; its model
samples the process's RSS every N/20 runs. One long run: a single run of N echo turns driven by
`Runtime.run` in this process, sampling RSS every N/20 turns. The model is `bench.agents.Script`,
which keeps nothing of what it was asked, so what grows is the runtime's.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench import explain
from bench.common import MESSAGE, rss_mb
from bench.harness import log, table, worker

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = 20


def many_runs(db: str, runs: int) -> dict[str, Any]:
    return asyncio.run(_many_runs(Path(db), runs))


async def _many_runs(db: Path, runs: int) -> dict[str, Any]:
    from bench.agents import EVERY_ENV, LOG_ENV, ref, short
    from contextos import RunStatus, Runtime

    url = f"sqlite:///{db}"
    every = max(1, runs // SAMPLES)
    samples = db.with_name(db.stem + "-rss.txt")
    async with Runtime(url) as rt:
        for _ in range(runs):
            await rt.start(short, MESSAGE, agent_ref=ref("short"))
    env = {**os.environ, LOG_ENV: str(samples), EVERY_ENV: str(every)}
    proc = _worker(url, env)
    started = time.monotonic()
    try:
        points = _wait_for(samples, runs, proc)
        took = time.monotonic() - started
        await asyncio.sleep(0.5)  # the last run's final steps
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    async with Runtime(url) as rt:
        completed = len(await rt.runs(status=RunStatus.COMPLETED, limit=runs + 1))
    return {"points": points, "completed": completed, "runs_per_s": runs / took}


def _worker(url: str, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """One `contextos worker` driving one run at a time."""
    command = [sys.executable, "-m", "contextos", "worker", "--store", url, "--concurrency", "1"]
    command += ["--log-level", "WARNING", "--poll", "0.2"]
    return subprocess.Popen(
        command, cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL
    )


def _wait_for(samples: Path, runs: int, proc: subprocess.Popen[bytes]) -> list[list[float]]:
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"the worker exited {proc.returncode} before driving every run")
        if samples.exists():
            points = [
                [float(x) for x in line.split()] for line in samples.read_text().split("\n")[:-1]
            ]
            if points and points[-1][0] >= runs:
                return points
        time.sleep(0.2)


def long_run(db: str, turns: int) -> dict[str, Any]:
    return asyncio.run(_long_run(Path(db), turns))


async def _long_run(db: Path, turns: int) -> dict[str, Any]:
    from bench.agents import echo_agent
    from contextos import Runtime

    every = max(1, turns // SAMPLES)
    points: list[list[float]] = []

    def sample(turn: int) -> None:
        if turn == 1 or turn % every == 0:
            points.append([turn - 1, rss_mb()])

    agent = echo_agent(turns, on_turn=sample)
    started = time.monotonic()
    async with Runtime(f"sqlite:///{db}") as rt:
        result = await rt.run(agent, MESSAGE)
        assert result.ok, result
        state = await rt.state(result.run_id)
    took = time.monotonic() - started
    history = sum(
        len(m.content or "") + sum(len(c.arguments) for c in m.tool_calls) for m in state.messages
    )
    return {"points": points, "turns_per_s": turns / took, "history_chars": history}


def memory_sites(db: str, turns: int, top: int = 6) -> dict[str, Any]:
    """What a long run's growth is, by the ContextOS function that allocated it: the
    difference between tracemalloc snapshots at half-way and at the end, per 1,000 turns."""
    return asyncio.run(_memory_sites(Path(db), turns, top))


async def _memory_sites(db: Path, turns: int, top: int) -> dict[str, Any]:
    import tracemalloc

    from bench.agents import echo_agent
    from contextos import Runtime

    half = turns // 2
    snaps: dict[int, Any] = {}

    def snap(turn: int) -> None:
        if turn in (half + 1, turns + 1):
            snaps[turn] = tracemalloc.take_snapshot()

    tracemalloc.start(12)
    async with Runtime(f"sqlite:///{db}") as rt:
        await rt.run(echo_agent(turns, on_turn=snap), MESSAGE)
    tracemalloc.stop()
    grown: dict[str, float] = {}
    for stat in snaps[turns + 1].compare_to(snaps[half + 1], "traceback"):
        site = next(
            (
                f"{f.filename.split('/contextos/', 1)[1]}:{f.lineno}"
                for f in reversed(stat.traceback)
                if "/contextos/" in f.filename
            ),
            "elsewhere",
        )
        grown[site] = grown.get(site, 0.0) + stat.size_diff
    ranked = sorted(grown.items(), key=lambda kv: -kv[1])[:top]
    per = 1000 / (turns - half) / 1024
    return {"from": half, "to": turns, "sites": [(w, b * per) for w, b in ranked]}


# -- the table --------------------------------------------------------------------------------

SIZES = {"quick": (500, 500), "default": (10_000, 10_000), "full": (10_000, 10_000)}
"""Runs driven by one worker, and turns of one run."""
FLAT_KB = 100
"""Growth per 1,000 runs (or turns) over the second half that still counts as flat: allocator
and SQLite page-cache noise, far below what a run or a turn holds (a run's state is tens of
kB, a turn's two messages about one)."""


def bench(plan: str, where: Path, report: Any) -> None:
    """RSS over many runs in one worker and over one long run; whether each is flat."""

    runs, turns = SIZES[plan]
    log(f"memory: one worker driving {runs:,} runs")
    many = worker("longrun", "many_runs", db=str(where / "memory-many.db"), runs=runs)
    log(f"memory: one run of {turns:,} turns")
    long = worker("longrun", "long_run", db=str(where / "memory-long.db"), turns=turns)
    traced = min(turns, 2_000)
    sites = worker("longrun", "memory_sites", db=str(where / "memory-sites.db"), turns=traced)
    for p in where.glob("memory-*"):
        p.unlink()
    assert many["completed"] == runs, many

    def at(points: list[list[float]], fraction: float) -> list[float]:
        return min(points, key=lambda p: abs(p[0] - fraction * points[-1][0]))

    def growth_kb(points: list[list[float]], per: int) -> float:
        """RSS growth over the second half, in kB per `per` steps."""
        (n0, r0), (n1, r1) = at(points, 0.5), points[-1]
        return (r1 - r0) * 1024 / (n1 - n0) * per

    rows = []
    for fraction in (0.05, 0.25, 0.5, 0.75, 1.0):
        m, t = at(many["points"], fraction), at(long["points"], fraction)
        rows.append(
            [f"{m[0]:,.0f} runs", f"{m[1]:,.1f} MB", f"{t[0]:,.0f} turns", f"{t[1]:,.1f} MB"]
        )
    per_run = growth_kb(many["points"], 1000)
    per_turn = growth_kb(long["points"], 1000)
    history_kb = long["history_chars"] / 1024 / turns * 1000
    rows.append(
        [
            "growth over the second half",
            f"{per_run:,.0f} kB per 1,000 runs",
            "",
            f"{per_turn:,.0f} kB per 1,000 turns",
        ]
    )
    guarded = explain.long_run(sites["sites"], per_turn)
    report.add(
        "## Long-run memory\n\n"
        f"Resident memory (RSS) of one `contextos worker` process (`--concurrency 1`) driving "
        f"{runs:,} queued runs one after another (each two echo turns and the answer, on a "
        f"SQLite store; {many['runs_per_s']:,.0f} runs/s), and of one process driving a single "
        f"run of {turns:,} echo turns with `Runtime.run` ({long['turns_per_s']:,.0f} turns/s), "
        "sampled as they went. The scripted model keeps nothing of what it was asked.\n\n"
        + table(["worker", "RSS", "one long run", "RSS"], rows)
        + "\n\nA worker's RSS rises over its first runs before it levels (the allocator's "
        "arenas, the statement and schema caches filling once), so the flat test is the second "
        "half. Nothing of a finished run stays: rows are read without pydantic's process-wide "
        "string cache (which would keep every run id read), and each tool's schema is one object "
        "for every run, so what the context compiler derives from it is derived once.\n\n"
        "A run keeps its history in memory to send it to the model (compaction bounds what a "
        "call sees, not what the run holds), so one long run cannot stay flat: the question "
        f"is by how much it grows. Its text is {history_kb:,.0f} kB per 1,000 turns here, and "
        f"the process grows {per_turn:,.0f} kB per 1,000 turns ({per_turn / history_kb:.1f}× "
        "the text): the messages are held more than once. The largest sites of that growth, by the "
        "line of ContextOS that allocated it (tracemalloc over turns "
        f"{sites['from']:,}–{sites['to']:,} of a separate run):\n\n"
        + table(
            ["allocated in", "kB per 1,000 turns"],
            [[f"`{where}`", f"{kb:,.0f}"] for where, kb in sites["sites"]],
        )
        + (f"\n\n{guarded}" if guarded else "")
    )
    report.target(
        f"Memory flat over {runs:,} runs in one worker",
        f"{per_run:,.0f} kB per 1,000 runs over the second half "
        f"({at(many['points'], 0.05)[1]:,.1f} → {many['points'][-1][1]:,.1f} MB)",
        per_run <= FLAT_KB if runs >= 10_000 else None,
    )
    report.target(
        f"Memory flat over one {turns:,}-turn run",
        f"{per_turn:,.0f} kB per 1,000 turns, {per_turn / history_kb:.1f}× the conversation's "
        f"text ({long['points'][-1][1]:,.1f} MB at the end): the run holds its history"
        + (", and the guards their rewrite of it" if explain.guard_sites(sites["sites"]) else ""),
        per_turn <= FLAT_KB if turns >= 10_000 else None,
    )
