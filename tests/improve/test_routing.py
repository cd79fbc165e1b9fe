"""The runtime runs what an agent's release says: every new run of the agent, however it is
started, runs the released candidate and records the release in its first event; a worker that
claims it runs the same definition; a rollback takes effect for the next run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
from api_server import serving
from orders import Question, desk, desk_flow
from test_governance import candidate_ready
from test_improvement_loop import REF

from contextos import RunStatus, Runtime
from contextos.api import ApiConfig
from contextos.events import RunCreated, ToolCompleted
from contextos.improve import Improvements
from contextos.releases import Binding, binding_of
from support.processes import ROOT, ended, spawn_worker, stop_all


async def ran(rt: Runtime, run_id: str) -> tuple[RunCreated, list[bool]]:
    """A run's first event, and whether each of its tool calls failed."""
    events = await rt.events(run_id)
    created = events[0]
    assert isinstance(created, RunCreated)
    return created, [e.is_error for e in events if isinstance(e, ToolCompleted)]


async def test_new_runs_run_the_release_and_a_rollback_takes_effect_for_the_next(
    backend_url: str, tmp_path: Path
) -> None:
    async with Runtime(backend_url) as rt:
        loop, candidate_id, report_id = await candidate_ready(rt)
        candidate = await loop.get_candidate(candidate_id)
        before = await rt.run(desk(), "Where is order 41?")
        created, calls = await ran(rt, before.run_id)
        assert binding_of(created.metadata) is None and calls == [True, False]

        asked = await loop.request_release(candidate_id, report_id, releasers=("alice",))
        release = await loop.approve(asked.id, approver="alice")
        expected = Binding(
            decision=release.run_id, candidate_id=candidate_id, change=candidate.change
        )

        driven = await rt.run(desk(), "Where is order 42?")  # given the agent's code
        created, calls = await ran(rt, driven.run_id)
        assert created.agent_hash == candidate.candidate_hash
        assert binding_of(created.metadata) == expected
        assert calls == [False]  # the released description: right the first time

        queued = await rt.start(desk(), "Where is order 43?", agent_ref=REF)
        worker = spawn_worker(backend_url, tmp_path / "worker.log")
        try:  # the worker imports the agent's code from REF and makes the release's change
            assert await ended(rt, queued) is RunStatus.COMPLETED
        finally:
            stop_all([worker])
        created, calls = await ran(rt, queued)
        assert binding_of(created.metadata) == expected and calls == [False]
        assert (await rt.replay(queued)).equal  # replayed as it ran, from its reference

        back = await loop.rollback("order-desk", by="bob")
        after = await rt.run(desk(), "Where is order 44?")
        created, calls = await ran(rt, after.run_id)
        assert created.agent_hash == desk().identity_hash() and calls == [True, False]
        assert binding_of(created.metadata) == Binding(decision=back.run_id, candidate_id=None)


async def test_contextos_run_runs_the_release(tmp_path: Path) -> None:
    store = tmp_path / "c.db"
    async with Runtime(str(store)) as rt:
        loop, candidate_id, report_id = await candidate_ready(rt)
        asked = await loop.request_release(candidate_id, report_id, releasers=("alice",))
        await loop.approve(asked.id, approver="alice")
    done = subprocess.run(
        [sys.executable, "-m", "contextos", "run", REF, "Where is order 7?", "--json"],
        cwd=ROOT,
        env={**os.environ, "CONTEXTOS_STORE": str(store)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    run_id = json.loads(done.stdout)["run_id"]
    async with Runtime(str(store)) as rt:
        created, calls = await ran(rt, run_id)
    binding = binding_of(created.metadata)
    assert binding is not None and binding.candidate_id == candidate_id
    assert calls == [False]


async def test_post_v1_runs_runs_the_release(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path}/runs.db"
    async with Runtime(store) as rt:
        loop, candidate_id, report_id = await candidate_ready(rt)
        asked = await loop.request_release(candidate_id, report_id, releasers=("alice",))
        await loop.approve(asked.id, approver="alice")
        config = ApiConfig(store=store, agents=(REF,), open_access=True, worker=True)
        with serving(config) as base:
            async with httpx.AsyncClient(base_url=base, timeout=60) as http:
                started = await http.post(
                    "/v1/runs", json={"agent": "order-desk", "input": "Where is order 8?"}
                )
                assert started.status_code == 201, started.text
                run_id = started.json()["run_id"]
                assert await ended(rt, run_id) is RunStatus.COMPLETED  # the server's worker
        created, calls = await ran(rt, run_id)
    binding = binding_of(created.metadata)
    assert binding is not None and binding.candidate_id == candidate_id
    assert calls == [False]


async def test_a_workflows_agent_node_runs_the_release_of_its_agent(backend_url: str) -> None:
    """A workflow's child runs are created and driven like any run: each new child of the
    node runs the release of the node's agent, recorded in its first event."""
    flow_ref = f"{REF.rpartition(':')[0]}:flow"
    async with Runtime(backend_url) as rt:

        async def asked(question: str) -> str:
            done = await rt.run(desk_flow(), Question(text=question), agent_ref=flow_ref)
            assert done.status is RunStatus.COMPLETED
            [child] = (await rt.tree(done.run_id)).child_run_ids()
            return child

        nodes = [await asked(f"Where is order {n}?") for n in ("1234", "77")]
        golden = await asked("What are your opening hours?")
        loop = Improvements(rt)
        [proposal] = (await loop.scan()).proposals
        assert proposal.agent_ref == f"{flow_ref}#ask" and proposal.trace_refs[0].startswith(
            nodes[0]
        )
        candidate = await loop.candidate(proposal.proposal_id)
        report = await loop.check(candidate.candidate_id, golden=[golden])
        assert (report.count("fixed"), report.count("regressed")) == (2, 0)
        asked_for = await loop.request_release(
            candidate.candidate_id, report.report_id, releasers=("alice",)
        )
        release = await loop.approve(asked_for.id, approver="alice")

        created, calls = await ran(rt, await asked("Where is order 42?"))
        assert created.agent_hash == candidate.candidate_hash and calls == [False]
        assert binding_of(created.metadata) == Binding(
            decision=release.run_id, candidate_id=candidate.candidate_id, change=candidate.change
        )
        back = await loop.rollback("order-desk", by="bob")
        created, calls = await ran(rt, await asked("Where is order 43?"))
        assert created.agent_hash == desk().identity_hash() and calls == [True, False]
        assert binding_of(created.metadata) == Binding(decision=back.run_id, candidate_id=None)
