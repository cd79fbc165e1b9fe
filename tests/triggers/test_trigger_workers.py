"""Run triggers across real worker processes, on both backends: fired when a run ends, caught
up when nobody fired, exactly once through a SIGKILL in between and with workers racing."""

from __future__ import annotations

import signal
from pathlib import Path

from trigger_helpers import (
    GATED,
    PUBLISHER,
    REVIEWER,
    WRITER,
    created,
    queue,
    runs_of,
    started_after,
)

from contextos import Runtime, load_agent
from contextos.runs import RunStatus
from contextos.workers import add_trigger
from support.processes import spawn_worker, stop_all, wait_until


async def all_done(rt: Runtime, agent: str, n: int) -> bool:
    runs = [r for r in await rt.runs(limit=1000) if r.agent_name == agent]
    return len(runs) >= n and all(r.status is RunStatus.COMPLETED for r in runs)


async def test_a_chain_of_triggers_runs_through_a_worker(backend_url: str, tmp_path: Path) -> None:
    async with Runtime(backend_url) as rt:
        q = queue(rt)
        await add_trigger(q, "review", REVIEWER, after="writer", input="Review: {output}")
        await add_trigger(q, "publish", PUBLISHER, after="reviewer")
        source = await rt.start(load_agent(WRITER), "write it", agent_ref=WRITER)
        procs = [spawn_worker(backend_url, tmp_path / "w.log")]
        try:
            await wait_until(lambda: all_done(rt, "publisher", 1), what="the chain to finish")
            for p in procs:
                p.send_signal(signal.SIGTERM)
            for p in procs:
                assert p.wait(timeout=30) == 0
        finally:
            stop_all(procs)
        (review,) = await runs_of(rt, "reviewer")
        (publish,) = await runs_of(rt, "publisher")
        assert (await created(rt, review)).input == "Review: draft: the quarterly report"
        assert (await created(rt, review)).metadata["source_run"] == source
        published = await created(rt, publish)
        assert published.input == "reviewed"
        assert (published.metadata["source_run"], published.metadata["chain_depth"]) == (review, 2)
        assert await q.due_firings() == []


async def test_the_worker_that_ends_a_run_fires_at_once(backend_url: str, tmp_path: Path) -> None:
    async with Runtime(backend_url) as rt:
        q = queue(rt)
        await add_trigger(q, "review", REVIEWER, after="writer")
        # This worker looks for firings nobody started once, at startup, then not for an hour:
        # a review can only come from the worker firing as the run it drove ends.
        procs = [spawn_worker(backend_url, tmp_path / "w.log", "--trigger-poll", "3600")]
        try:
            await rt.start(load_agent(PUBLISHER), "warm up", agent_ref=PUBLISHER)
            await wait_until(lambda: all_done(rt, "publisher", 1), what="the first run")
            source = await rt.start(load_agent(WRITER), "write it", agent_ref=WRITER)
            await wait_until(lambda: all_done(rt, "reviewer", 1), what="the review")
        finally:
            stop_all(procs)
        assert await started_after(rt, "reviewer") == {source: await runs_of(rt, "reviewer")}


async def test_a_worker_catches_up_on_endings_nobody_fired(
    backend_url: str, tmp_path: Path
) -> None:
    async with Runtime(backend_url) as rt:
        q = queue(rt)
        await add_trigger(q, "review", REVIEWER, after="writer")
        sources = [
            await rt.start(load_agent(WRITER), f"write {i}", agent_ref=WRITER) for i in range(3)
        ]
        # A worker that fires no triggers drives the sources to their end ...
        procs = [spawn_worker(backend_url, tmp_path / "a.log", "--no-triggers")]
        try:
            await wait_until(lambda: all_done(rt, "writer", 3), what="the sources")
            procs[0].send_signal(signal.SIGTERM)
            procs[0].wait(timeout=30)
            assert await runs_of(rt, "reviewer") == []
            assert {f.run_id for f in await q.due_firings()} == set(sources)
            # ... and the next worker starts what those endings owe.
            procs.append(spawn_worker(backend_url, tmp_path / "b.log"))
            await wait_until(lambda: all_done(rt, "reviewer", 3), what="the reviews")
        finally:
            stop_all(procs)
        by_source = await started_after(rt, "reviewer")
        assert {s: len(r) for s, r in by_source.items()} == {s: 1 for s in sources}


async def test_a_kill_between_the_end_and_the_firing_still_fires_once(
    backend_url: str, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    gate.mkdir()
    async with Runtime(backend_url) as rt:
        q = queue(rt)
        # The trigger's agent comes from a factory that, in the first worker, blocks: that
        # worker has ended the source run and is starting the trigger's run when it is killed.
        await add_trigger(q, "review", GATED, after="writer")
        source = await rt.start(load_agent(WRITER), "write it", agent_ref=WRITER)
        doomed = spawn_worker(
            backend_url, tmp_path / "doomed.log", env={"CONTEXTOS_TEST_GATE": str(gate)}
        )
        procs = [doomed]
        try:

            async def stuck_firing() -> bool:
                return any(gate.glob(f"loading-{doomed.pid}"))

            await wait_until(stuck_firing, what="the worker to start firing")
            assert (await rt.result(source)).status is RunStatus.COMPLETED
            doomed.kill()
            doomed.wait(timeout=30)
            assert await runs_of(rt, "reviewer") == []
            assert [f.run_id for f in await q.due_firings()] == [source]

            (gate / "go").touch()
            env = {"CONTEXTOS_TEST_GATE": str(gate)}
            procs += [spawn_worker(backend_url, tmp_path / f"w{i}.log", env=env) for i in range(2)]
            await wait_until(lambda: all_done(rt, "reviewer", 1), what="the review")
            for p in procs[1:]:
                p.send_signal(signal.SIGTERM)
            for p in procs[1:]:
                p.wait(timeout=30)
        finally:
            stop_all(procs)
        assert await started_after(rt, "reviewer") == {source: await runs_of(rt, "reviewer")}
        assert len(await runs_of(rt, "reviewer")) == 1
        assert await q.due_firings() == []


async def test_racing_workers_start_one_run_per_finished_run(
    backend_url: str, tmp_path: Path
) -> None:
    n = 24
    async with Runtime(backend_url) as rt:
        q = queue(rt)
        await add_trigger(q, "review", REVIEWER, after="writer")
        writer = load_agent(WRITER)
        sources = [await rt.start(writer, f"write {i}", agent_ref=WRITER) for i in range(n)]
        procs = [spawn_worker(backend_url, tmp_path / f"w{i}.log") for i in range(3)]
        try:
            await wait_until(lambda: all_done(rt, "reviewer", n), what="every review")
            for p in procs:
                p.send_signal(signal.SIGTERM)
            for p in procs:
                p.wait(timeout=30)
        finally:
            stop_all(procs)
        by_source = await started_after(rt, "reviewer")
        assert {s: len(r) for s, r in by_source.items()} == {s: 1 for s in sources}
        assert await q.due_firings() == []
