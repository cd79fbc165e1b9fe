"""Real worker processes against tools that misbehave: a worker outlives a tool raising
SystemExit, a tool that keeps killing its worker ends its run `tool_crashed`, and a sync tool
hung in its thread cannot keep a stopping worker alive.

The worker processes run on SQLite: what is tested here does not depend on the store.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from worker_helpers import AGENTS

from contextos import Runtime, load_agent
from contextos import events as ev
from contextos.runs import FailureReason, RunId, RunStatus
from contextos.store.queue import WorkerStatus
from contextos.workers import list_workers
from support.processes import spawn_worker, wait_until

DIR_ENV = "CONTEXTOS_TEST_DIR"
"""Read by the hanging tools in agents.py."""
EXIT_WAIT_S = 30.0
"""How long a stopped worker may take to exit before the test calls it hung (not a speed claim)."""


@pytest.fixture
def store_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'store.db'}"


@pytest.fixture
async def runtime(store_url: str) -> AsyncIterator[Runtime]:
    async with Runtime(store_url, worker_id="starter") as rt:
        yield rt


@pytest.fixture
def folder(tmp_path: Path) -> Iterator[Path]:
    """Where hanging tools leave their marks; `go` lets any still hanging finish."""
    path = tmp_path / "calls"
    path.mkdir()
    yield path
    (path / "go").touch()


def worker(
    store_url: str, folder: Path, *args: str, lease_s: float = 2.0
) -> subprocess.Popen[bytes]:
    return spawn_worker(
        store_url, folder / "worker.log", *args, env={DIR_ENV: str(folder)}, lease_s=lease_s
    )


async def start(rt: Runtime, name: str) -> RunId:
    ref = f"{AGENTS}:{name}"
    return await rt.start(load_agent(ref), "go", agent_ref=ref)


async def terminal(rt: Runtime, rid: RunId) -> bool:
    return (await rt.store.get_run(rid)).status.is_terminal


async def exited(proc: subprocess.Popen[bytes]) -> bool:
    """Wait (a generous while) for the process to exit; True if it did."""
    try:
        await asyncio.to_thread(proc.wait, EXIT_WAIT_S)
    except subprocess.TimeoutExpired:
        return False
    return True


def log_of(folder: Path) -> str:
    path = folder / "worker.log"
    return path.read_text() if path.exists() else ""


async def test_a_worker_outlives_a_tool_raising_system_exit(
    runtime: Runtime, store_url: str, folder: Path
) -> None:
    proc = worker(store_url, folder)
    try:
        crashed = await start(runtime, "crasher")
        await wait_until(lambda: terminal(runtime, crashed), what="the crasher run to end")
        assert proc.poll() is None, log_of(folder)
        after = await start(runtime, "quick")  # the same worker goes on with other work
        await wait_until(lambda: terminal(runtime, after), what="the next run to end")
        assert proc.poll() is None, log_of(folder)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert await exited(proc) and proc.returncode == 0, log_of(folder)
    state = await runtime.state(crashed)
    assert state.status is RunStatus.COMPLETED and state.output == "the worker survived"
    events = await runtime.events(crashed)
    (done,) = (e for e in events if isinstance(e, ev.ToolCompleted))
    assert done.is_error and done.error_code == "tool_crashed" and "SystemExit: 3" in done.output
    assert not any(isinstance(e, ev.RuntimeCrashDetected) for e in events)
    assert (await runtime.state(after)).status is RunStatus.COMPLETED
    drivers = {
        e.worker_id
        for rid in (crashed, after)
        for e in await runtime.events(rid)
        if isinstance(e, ev.RunStarted)
    }
    assert len(drivers) == 1


async def test_a_tool_that_keeps_killing_its_worker_ends_the_run_tool_crashed(
    runtime: Runtime, store_url: str, folder: Path
) -> None:
    rid = await start(runtime, "killer")
    spawned = 0
    while not await terminal(runtime, rid):
        assert spawned < 6, f"the run never ended; workers' log:\n{log_of(folder)}"
        proc = worker(store_url, folder, "--max-attempts", "2", lease_s=1.0)
        spawned += 1

        async def done(proc: subprocess.Popen[bytes] = proc) -> bool:
            return proc.poll() is not None or await terminal(runtime, rid)

        try:
            await wait_until(done, what="the worker to die or the run to end")
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
            assert await exited(proc), log_of(folder)
    state = await runtime.state(rid)
    assert state.status is RunStatus.FAILED
    assert state.failure_reason is FailureReason.TOOL_CRASHED, state.failure_message
    failed = (await runtime.events(rid))[-1]
    assert isinstance(failed, ev.RunFailed)
    assert failed.error["tool"] == "kill_process" and failed.error["attempts"] == 2
    assert "kill_process" in failed.message
    assert spawned == 3  # two died driving it; the third gave up on it


async def test_a_worker_stops_at_the_second_sigterm_with_a_sync_tool_hung(
    runtime: Runtime, store_url: str, folder: Path
) -> None:
    rid = await start(runtime, "hanger")
    proc = worker(store_url, folder)
    try:
        await wait_until(
            lambda: asyncio.to_thread((folder / f"hanging-{rid}").exists),
            what="the tool to hang",
        )
        proc.send_signal(signal.SIGTERM)  # drains: waits for the step, which never ends

        async def draining() -> bool:
            workers = await list_workers(runtime.store, live_within_s=None)
            return any(w.status is WorkerStatus.DRAINING for w in workers)

        await wait_until(draining, what="the worker to drain")
        assert proc.poll() is None
        proc.send_signal(signal.SIGTERM)  # stops at once
        assert await exited(proc), "a hung tool thread kept the worker alive"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    # Abandoned mid-step: the run is left to its lease, for the next worker to recover.
    assert (await runtime.state(rid)).status is RunStatus.RUNNING


async def test_a_timed_out_sync_call_does_not_hold_a_stopping_worker(
    runtime: Runtime, store_url: str, folder: Path
) -> None:
    rid = await start(runtime, "timed_out")
    proc = worker(store_url, folder)
    try:
        await wait_until(lambda: terminal(runtime, rid), what="the run to end")
        assert (folder / f"hanging-{rid}").exists()  # its thread still hangs
        proc.send_signal(signal.SIGTERM)
        assert await exited(proc), "a timed-out call's thread kept the worker alive"
        assert proc.returncode == 0, log_of(folder)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    state = await runtime.state(rid)
    assert state.status is RunStatus.COMPLETED and state.output == "gave up on it"
    (done,) = (e for e in await runtime.events(rid) if isinstance(e, ev.ToolCompleted))
    assert done.is_error and done.error_code == "tool_timeout"
