"""Chaos: 4 worker processes on PostgreSQL drive hundreds of runs with tools while workers are
SIGKILLed (and sometimes SIGTERMed) and restarted at random.

Afterwards every run must be terminal, no run may have been driven by two workers at once
(read from the event logs), and no effect may exist twice (the tools write to a table keyed
by the call's idempotency key, with no constraint that would hide a second write).
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest
from worker_helpers import AGENTS, create_effect_tables, overlapping_writers

from contextos import Runtime, load_agent
from contextos import events as ev
from contextos.runs import RunStatus
from support.processes import spawn_worker, stop_all

CHAOS = f"{AGENTS}:chaos"
RUNS = int(os.environ.get("CONTEXTOS_CHAOS_RUNS", "500"))
WORKERS = 4
LEASE_S = 2.0
CHAOS_EVENTS = 60
"""Kills and stops before the workers are left alone to finish."""
TIME_LIMIT_S = 420.0
"""A hang guard, not a timing claim: the test takes one to two minutes."""


def registered(url: str) -> set[str]:
    import psycopg

    with psycopg.connect(url) as conn:
        return {str(r[0]) for r in conn.execute("SELECT worker_id FROM workers").fetchall()}


def count_terminal(url: str) -> int:
    import psycopg

    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT count(*) FROM runs"
            " WHERE status IN ('completed', 'failed', 'cancelled', 'expired')"
        ).fetchone()
    assert row is not None
    return int(row[0])


@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.timeout(600)
async def test_chaos_kills_lose_nothing_and_duplicate_nothing(
    postgres_url: str, tmp_path: Path
) -> None:
    import psycopg

    with psycopg.connect(postgres_url, autocommit=True) as conn:
        create_effect_tables(conn)
    env = {"CONTEXTOS_TEST_EFFECTS": postgres_url}
    rng = random.Random(20261129)

    async with Runtime(postgres_url) as rt:
        agent = load_agent(CHAOS)
        ids = [await rt.start(agent, f"job {i}", agent_ref=CHAOS) for i in range(RUNS)]

    names: dict[int, str] = {}

    def spawn(n: int) -> subprocess.Popen[bytes]:
        proc = spawn_worker(
            postgres_url,
            tmp_path / f"worker-{n}.log",
            "--worker-id",
            f"chaos-{n}",
            "--max-attempts",
            "1000",
            "--retry-base",
            "0.2",
            "--no-schedules",
            env=env,
            lease_s=LEASE_S,
            concurrency=4,
        )
        names[proc.pid] = f"chaos-{n}"
        return proc

    spawned = 0
    live: list[subprocess.Popen[bytes]] = []
    gone: list[subprocess.Popen[bytes]] = []
    for _ in range(WORKERS):
        live.append(spawn(spawned))
        spawned += 1
    killed_pids: set[int] = set()
    kills = terms = events = 0
    started = time.monotonic()
    try:
        while count_terminal(postgres_url) < RUNS:
            assert time.monotonic() - started < TIME_LIMIT_S, (
                f"{count_terminal(postgres_url)}/{RUNS} runs finished in {TIME_LIMIT_S}s"
            )
            if events >= CHAOS_EVENTS:
                await asyncio.sleep(0.5)  # the workers finish on their own
                continue
            await asyncio.sleep(rng.uniform(0.2, 1.2))
            events += 1
            ready = registered(postgres_url)
            if events % 4 == 0 and any(names[p.pid] in ready for p in live):
                # Every fourth event stops a worker politely: it drains while its successor
                # starts. (Only a registered one: before that its handler is not installed.)
                slot = next(i for i, p in enumerate(live) if names[p.pid] in ready)
                victim = live[slot]
                victim.send_signal(signal.SIGTERM)
                terms += 1
            else:
                # Mostly working workers (killing one still starting up proves little).
                working = [i for i, p in enumerate(live) if names[p.pid] in ready]
                slot = rng.choice(working if working and rng.random() < 0.9 else range(WORKERS))
                victim = live[slot]
                victim.kill()
                killed_pids.add(victim.pid)
                kills += 1
            gone.append(victim)
            live[slot] = spawn(spawned)
            spawned += 1
        for p in live:
            p.send_signal(signal.SIGTERM)
        for p in [*live, *gone]:
            p.wait(timeout=60)
    finally:
        stop_all([*live, *gone])
    elapsed = time.monotonic() - started

    # -- every run terminal, none driven by two workers at once ----------------------------
    statuses: Counter[str] = Counter()
    recoveries = releases = 0
    overlaps: list[str] = []
    completed_calls: set[str] = set()
    not_committed = 0
    async with Runtime(postgres_url) as rt:
        for rid in ids:
            events = await rt.events(rid)
            statuses[str((await rt.state(rid)).status)] += 1
            overlaps += overlapping_writers(events)
            recoveries += sum(isinstance(e, ev.RuntimeCrashDetected) for e in events)
            releases += sum(isinstance(e, ev.RunReleased) for e in events)
            for e in events:
                if isinstance(e, ev.ToolCompleted):
                    if e.is_error:
                        not_committed += 1
                    else:
                        completed_calls.add(f"{rid}/{e.call_id}")

    # -- effects: each recorded call's effect exactly once, nothing else ------------------------
    with psycopg.connect(postgres_url) as conn:
        effects = conn.execute("SELECT key, pid FROM effects").fetchall()
        attempts = conn.execute("SELECT key, pid FROM effect_attempts").fetchall()
    per_key = Counter(key for key, _ in effects)
    duplicated = {k: n for k, n in per_key.items() if n > 1}
    sends = Counter(key for key, _ in attempts)
    resent = {k: n for k, n in sends.items() if n > 1}

    report = (
        f"chaos: {RUNS} runs, {spawned} worker processes, {kills} SIGKILLs, {terms} SIGTERMs, "
        f"{elapsed:.0f}s; statuses {dict(statuses)}; {recoveries} recoveries after a dead "
        f"worker, {releases} hand-backs on drain; {len(effects)} effects, "
        f"{len(duplicated)} duplicated; {len(attempts)} tool executions, {len(resent)} calls "
        f"sent again after a kill; {not_committed} calls reconciled as not committed; "
        f"{len(overlaps)} overlapping writers; "
        f"{RUNS - statuses[str(RunStatus.COMPLETED)]} runs not completed"
    )
    print(report)
    (tmp_path / "report.txt").write_text(report + "\n")

    assert statuses == {str(RunStatus.COMPLETED): RUNS}, report
    assert overlaps == [], overlaps[:10]
    assert duplicated == {}, report
    assert set(per_key) == completed_calls, report
    # A call is sent again only when its first send died with a killed worker before the
    # provider had it (reconcile found nothing).
    pid_of_sends: dict[str, list[int]] = {}
    for key, pid in attempts:
        pid_of_sends.setdefault(key, []).append(int(pid))
    for key in resent:
        assert any(pid in killed_pids for pid in pid_of_sends[key]), (key, pid_of_sends[key])
    # How many kills land before the work runs out depends on the machine's speed.
    assert kills >= 10, report
    assert terms == 0 or releases > 0, report  # drained runs were handed back
