"""Workers on both backends: claiming, draining on SIGTERM, taking over from a dead worker,
stopping after a lost lease, retry timers, and concurrency limits across workers."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import signal
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from worker_helpers import AGENTS, overlapping_writers

from contextos import Runtime, load_agent
from contextos import events as ev
from contextos.errors import ConcurrencyConflict, RunIsTerminal
from contextos.runs import FailureReason, RunId, RunStatus
from contextos.store import open_store
from contextos.store.queue import LimitScope, RunQueue, WorkerStatus, queue_of
from contextos.workers import Worker, WorkerConfig, list_workers
from support.processes import spawn_worker, stop_all, wait_until

QUICK = f"{AGENTS}:quick"
SLOW = f"{AGENTS}:slow"


@pytest.fixture
async def runtime(backend_url: str) -> AsyncIterator[Runtime]:
    rt = Runtime(backend_url, worker_id="starter")
    try:
        yield rt
    finally:
        await rt.close()


def queue(rt: Runtime) -> RunQueue:
    q = queue_of(rt.store)
    assert q is not None
    return q


async def start(rt: Runtime, ref: str, n: int = 1, **kw: object) -> list[RunId]:
    agent = load_agent(ref)
    return [await rt.start(agent, f"job {i}", agent_ref=ref, **kw) for i in range(n)]  # type: ignore[arg-type]


async def all_terminal(rt: Runtime, ids: list[RunId]) -> bool:
    for rid in ids:
        if not (await rt.store.get_run(rid)).status.is_terminal:
            return False
    return True


@contextlib.asynccontextmanager
async def workers_running(*workers: Worker) -> AsyncIterator[None]:
    tasks = [asyncio.create_task(w.run()) for w in workers]
    try:
        yield
    finally:
        for w in workers:
            w.stop()
        await asyncio.gather(*tasks)


def fast(**kw: object) -> WorkerConfig:
    base: dict[str, object] = {"poll_s": 0.05, "lease_s": 5.0, "heartbeat_s": 0.5}
    return WorkerConfig(**{**base, **kw})  # type: ignore[arg-type]


# -- claiming and driving ---------------------------------------------------------------------


async def test_workers_drive_queued_runs_to_completion(backend_url: str, runtime: Runtime) -> None:
    ids = await start(runtime, QUICK, 12)
    w1 = Worker(backend_url, config=fast(concurrency=3), worker_id="w1")
    w2 = Worker(backend_url, config=fast(concurrency=3), worker_id="w2")
    async with workers_running(w1, w2):
        await wait_until(lambda: all_terminal(runtime, ids), what="all runs to finish")
    drivers = set()
    for rid in ids:
        state = await runtime.state(rid)
        assert state.status is RunStatus.COMPLETED and state.output == "A-1 is in stock"
        events = await runtime.events(rid)
        starts = [e for e in events if isinstance(e, ev.RunStarted)]
        assert len(starts) == 1 and not starts[0].recovered
        assert overlapping_writers(events) == []
        drivers.add(starts[0].worker_id)
        entry = await queue(runtime).queue_entry(rid)
        assert entry is not None and entry.lease_owner is None  # given back
    assert drivers <= {"w1", "w2"}
    assert w1.driven + w2.driven == 12
    registry = {w.worker_id: w for w in await list_workers(runtime.store, live_within_s=None)}
    assert registry["w1"].status is WorkerStatus.STOPPED
    assert registry["w2"].status is WorkerStatus.STOPPED


async def test_worker_processes_share_the_queue(
    backend_url: str, runtime: Runtime, tmp_path: Path
) -> None:
    ids = await start(runtime, QUICK, 24)
    procs = [spawn_worker(backend_url, tmp_path / f"w{i}.log", concurrency=3) for i in range(3)]

    async def all_registered() -> bool:  # signal handlers are in place from then on
        return len(await list_workers(runtime.store)) == 3

    try:
        await wait_until(all_registered, what="three workers")
        await wait_until(lambda: all_terminal(runtime, ids), what="all runs to finish")
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            assert p.wait(timeout=30) == 0, (tmp_path / "w0.log").read_text()
    for rid in ids:
        events = await runtime.events(rid)
        assert (await runtime.state(rid)).status is RunStatus.COMPLETED
        assert sum(isinstance(e, ev.RunStarted) for e in events) == 1
        assert overlapping_writers(events) == []


async def test_workers_claim_only_the_agents_they_serve(backend_url: str, runtime: Runtime) -> None:
    quick_ids = await start(runtime, QUICK, 2)
    ticker_ids = await start(runtime, f"{AGENTS}:ticker", 2)
    only_ticker = Worker(backend_url, config=fast(agents=("ticker",)), worker_id="tw")
    async with workers_running(only_ticker):
        await wait_until(lambda: all_terminal(runtime, ticker_ids), what="ticker runs")
    for rid in quick_ids:
        assert (await runtime.store.get_run(rid)).status is RunStatus.QUEUED


# -- shutdown, death, lost leases -------------------------------------------------------------


async def test_sigterm_finishes_the_step_and_hands_the_run_back(
    backend_url: str, runtime: Runtime, tmp_path: Path
) -> None:
    env = {"CONTEXTOS_TEST_DIR": str(tmp_path)}
    (rid,) = await start(runtime, SLOW)
    proc = spawn_worker(backend_url, tmp_path / "a.log", env=env, lease_s=30)
    try:
        await wait_until(
            lambda: asyncio.sleep(0, (tmp_path / f"started-{rid}").exists()),
            what="the tool to start",
        )
        proc.send_signal(signal.SIGTERM)  # it drains: the step in flight finishes first
        (tmp_path / "go").touch()
        assert proc.wait(timeout=30) == 0, (tmp_path / "a.log").read_text()
    finally:
        stop_all([proc])

    events = await runtime.events(rid)
    first_driver = next(e for e in events if isinstance(e, ev.RunStarted)).worker_id
    assert [type(e) for e in events[-2:]] == [ev.ToolCompleted, ev.RunReleased]
    assert events[-1].actor == events[-2].actor == f"worker:{first_driver}"
    assert (await runtime.store.get_run(rid)).status is RunStatus.QUEUED
    entry = await queue(runtime).queue_entry(rid)
    assert entry is not None and entry.lease_owner is None and entry.attempts == 0

    successor = Worker(backend_url, config=fast(), worker_id="successor")
    async with workers_running(successor):
        await wait_until(lambda: all_terminal(runtime, [rid]), what="the run to finish")
    events = await runtime.events(rid)
    assert (await runtime.state(rid)).status is RunStatus.COMPLETED
    assert not any(isinstance(e, ev.RuntimeCrashDetected) for e in events)
    restarted = [e for e in events if isinstance(e, ev.RunStarted)][-1]
    assert restarted.worker_id == "successor" and not restarted.recovered
    assert len((tmp_path / "calls.log").read_text().splitlines()) == 1  # the tool ran once
    assert overlapping_writers(events) == []


async def test_a_dead_workers_run_is_resumed_by_another_after_its_lease_expires(
    backend_url: str, runtime: Runtime, tmp_path: Path
) -> None:
    env = {"CONTEXTOS_TEST_DIR": str(tmp_path)}
    (rid,) = await start(runtime, SLOW)
    proc = spawn_worker(backend_url, tmp_path / "a.log", env=env, lease_s=1.0)
    try:
        await wait_until(
            lambda: asyncio.sleep(0, (tmp_path / f"started-{rid}").exists()),
            what="the tool to start",
        )
        proc.kill()
        proc.wait(timeout=10)
    finally:
        stop_all([proc])
    dead = (await runtime.state(rid)).worker_id
    (tmp_path / "go").touch()

    successor = Worker(backend_url, config=fast(lease_s=1.0), worker_id="successor")
    async with workers_running(successor):
        await wait_until(lambda: all_terminal(runtime, [rid]), what="the run to finish")

    events = await runtime.events(rid)
    assert (await runtime.state(rid)).status is RunStatus.COMPLETED
    crash = next(e for e in events if isinstance(e, ev.RuntimeCrashDetected))
    assert crash.previous_worker_id == dead and crash.actor == "worker:successor"
    restarted = [e for e in events if isinstance(e, ev.RunStarted)][-1]
    assert restarted.worker_id == "successor" and restarted.recovered
    assert overlapping_writers(events) == []
    entry = await queue(runtime).queue_entry(rid)
    assert entry is not None and entry.attempts == 1


async def test_a_worker_that_lost_its_lease_stops_and_cannot_append(
    backend_url: str, runtime: Runtime, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CONTEXTOS_TEST_DIR", str(tmp_path))
    (rid,) = await start(runtime, SLOW)
    slow_worker = Runtime(backend_url, worker_id="A", lease_s=0.3)
    try:
        driving = asyncio.create_task(slow_worker.resume(rid))
        await wait_until(
            lambda: asyncio.sleep(0, (tmp_path / f"started-{rid}").exists()),
            what="the tool to start",
        )
        seen = (await runtime.store.get_run(rid)).last_seq
        # Another worker takes the run over, as after A's lease expired.
        lease_b = await queue(runtime).acquire(rid, "B", lease_s=30)
        result = await asyncio.wait_for(driving, timeout=30)  # A notices and stops
        assert result.status is RunStatus.RUNNING
        assert (await runtime.store.get_run(rid)).last_seq == seen  # A wrote nothing more

        (tmp_path / "go").touch()
        async with Runtime(backend_url, worker_id="B") as rt_b:
            done = await rt_b.resume(rid, lease=lease_b)
        assert done.status is RunStatus.COMPLETED
        # Whatever A still tries to write, the expected-seq fence refuses.
        late = ev.UserMessageAdded(run_id=rid, seq=seen + 1, content="late", actor="worker:A")
        with pytest.raises((ConcurrencyConflict, RunIsTerminal)):
            await slow_worker.store.append(rid, [late], expected_seq=seen)
    finally:
        await slow_worker.close()

    events = await runtime.events(rid)
    b_started = next(e for e in events if isinstance(e, ev.RunStarted) and e.worker_id == "B")
    assert all(e.actor != "worker:A" for e in events if e.seq > b_started.seq)
    assert not any(isinstance(e, ev.ToolCompleted) and e.actor == "worker:A" for e in events)
    assert overlapping_writers(events) == []


# -- retries ----------------------------------------------------------------------------------


async def test_a_failed_attempt_waits_on_a_durable_timer(
    backend_url: str, runtime: Runtime
) -> None:
    agent = load_agent(QUICK)
    rid = await runtime.start(agent, "x", agent_ref=f"{AGENTS}:no_such_agent")
    worker = Worker(backend_url, config=fast(retry_base_s=3600, retry_cap_s=3600), worker_id="w1")

    async def attempted() -> bool:
        entry = await queue(runtime).queue_entry(rid)
        return entry is not None and entry.attempts == 1

    async with workers_running(worker):
        await wait_until(attempted, what="the first attempt to fail")
    entry = await queue(runtime).queue_entry(rid)
    assert entry is not None and entry.lease_owner is None and entry.not_before is not None
    assert entry.not_before > datetime.now(UTC) + timedelta(minutes=29)
    # The timer lives in the store: a fresh worker process would not claim the run either.
    other = open_store(backend_url)
    try:
        q = queue_of(other)
        assert q is not None and await q.claim("w2", lease_s=30) is None
    finally:
        await other.close()
    assert (await runtime.store.get_run(rid)).status is RunStatus.QUEUED


async def test_a_run_that_keeps_failing_is_failed_after_its_attempts(
    backend_url: str, runtime: Runtime
) -> None:
    agent = load_agent(QUICK)
    rid = await runtime.start(agent, "x", agent_ref=f"{AGENTS}:no_such_agent")
    worker = Worker(backend_url, config=fast(retry_base_s=0.01, retry_cap_s=0.05, max_attempts=3))
    async with workers_running(worker):
        await wait_until(lambda: all_terminal(runtime, [rid]), what="the run to be failed")
    state = await runtime.state(rid)
    assert state.status is RunStatus.FAILED
    assert state.failure_reason is FailureReason.RUNTIME_CRASHED
    failed = (await runtime.events(rid))[-1]
    assert isinstance(failed, ev.RunFailed) and failed.error == {
        "code": "too_many_attempts",
        "attempts": 3,
    }


# -- limits across workers --------------------------------------------------------------------


async def test_an_agent_limit_holds_across_workers(backend_url: str, runtime: Runtime) -> None:
    await queue(runtime).set_limit(LimitScope.AGENT, "quick", 1)
    ids = await start(runtime, QUICK, 6)
    workers = [Worker(backend_url, config=fast(concurrency=4), worker_id=f"w{i}") for i in (1, 2)]
    async with workers_running(*workers):
        await wait_until(lambda: all_terminal(runtime, ids), what="all runs to finish")
    spans = []
    for rid in ids:
        events = await runtime.events(rid)
        begin = next(e for e in events if isinstance(e, ev.RunStarted)).occurred_at
        spans.append((begin, events[-1].occurred_at))
    spans.sort()
    for (_, end), (begin, _) in itertools.pairwise(spans):
        assert end <= begin  # never two at once
