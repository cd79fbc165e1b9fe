"""Cron schedules across worker processes: three workers fire one schedule together, one of
them killed, then three more after a restart, and every tick starts exactly one run.

The scheduler's own tests (`test_schedules.py`) fire schedules from several runtimes in one
process; this one runs whole worker processes, so it is the slowest, and kept apart."""

from __future__ import annotations

import signal
from collections import Counter
from datetime import datetime, timedelta
from pathlib import Path

from worker_helpers import AGENTS

from contextos import Runtime
from contextos import events as ev
from contextos.runs import RunId
from contextos.store.queue import RunQueue, queue_of
from contextos.workers.scheduler import add_schedule
from support.processes import spawn_worker, stop_all, wait_until

TICKER = f"{AGENTS}:ticker"


def queue(rt: Runtime) -> RunQueue:
    q = queue_of(rt.store)
    assert q is not None
    return q


async def test_three_workers_and_a_restart_fire_each_tick_exactly_once(
    backend_url: str, tmp_path: Path
) -> None:
    async with Runtime(backend_url) as rt:
        await add_schedule(queue(rt), "every-second", TICKER, "* * * * * *")

        async def ticks_fired(n: int) -> bool:
            return len(await rt.runs(limit=1000)) >= n

        procs = [spawn_worker(backend_url, tmp_path / f"a{i}.log") for i in range(3)]
        try:
            await wait_until(lambda: ticks_fired(4), what="four ticks")
            procs[0].kill()  # one dies at a random point of its firing loop
            for p in procs[1:]:
                p.send_signal(signal.SIGTERM)
            for p in procs:
                p.wait(timeout=30)
            before = len(await rt.runs(limit=1000))
            procs = [spawn_worker(backend_url, tmp_path / f"b{i}.log") for i in range(3)]
            await wait_until(lambda: ticks_fired(before + 4), what="four more ticks")
            for p in procs:
                p.send_signal(signal.SIGTERM)
            for p in procs:
                p.wait(timeout=30)
        finally:
            stop_all(procs)

        ticks: Counter[str] = Counter()
        for summary in await rt.runs(limit=1000):
            created = (await rt.events(summary.run_id))[0]
            assert isinstance(created, ev.RunCreated)
            assert created.metadata["schedule"] == "every-second"
            ticks[created.metadata["tick"]] += 1
        assert max(ticks.values()) == 1, ticks  # no tick started two runs
        fired = sorted(datetime.fromisoformat(t) for t in ticks)
        # Every second from the first tick to the last fired, the restart's gap included
        # (it was within the misfire grace): none lost, none repeated.
        expected = [fired[0] + timedelta(seconds=i) for i in range(len(fired))]
        assert fired == expected
        (schedule,) = await queue(rt).list_schedules()
        assert schedule.last_tick_at in fired
        assert schedule.last_run_id is not None
        assert RunId(schedule.last_run_id) in {r.run_id for r in await rt.runs(limit=1000)}
