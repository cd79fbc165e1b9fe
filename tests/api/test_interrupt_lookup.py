"""An interrupt id names its run (`RUN_ID.iSEQ`): looking one up reads that run's log and no
other, and an id of any other form is not found at once, over HTTP and from Python."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import httpx
import pytest
from api_agents import PAYMENTS_ENV, POLICY
from api_server import GREETER, PAYER, error_of, serving

from contextos import EventStore, RunStatus, RunSummary, Runtime, open_store
from contextos import events as ev
from contextos.api import ApiConfig
from contextos.errors import InterruptNotFound
from contextos.runs import RunId


class CountingStore:
    """An EventStore that remembers which runs were read, and whether runs were listed."""

    def __init__(self, inner: EventStore) -> None:
        self.inner = inner
        self.url = inner.url
        self.reads: list[str] = []
        self.listed = 0

    async def append(
        self,
        run_id: RunId,
        events: Sequence[ev.Event],
        *,
        expected_seq: int,
        synchronous: bool = True,
    ) -> int:
        return await self.inner.append(
            run_id, events, expected_seq=expected_seq, synchronous=synchronous
        )

    async def read(self, run_id: RunId, *, after_seq: int = 0) -> list[ev.Event]:
        self.reads.append(run_id)
        return await self.inner.read(run_id, after_seq=after_seq)

    async def get_run(self, run_id: RunId) -> RunSummary:
        self.reads.append(run_id)
        return await self.inner.get_run(run_id)

    async def list_runs(
        self, *, status: RunStatus | None = None, limit: int = 50, tenant: str | None = None
    ) -> list[RunSummary]:
        self.listed += 1
        return await self.inner.list_runs(status=status, limit=limit, tenant=tenant)

    async def close(self) -> None:
        await self.inner.close()


async def test_an_unknown_interrupt_id_reads_no_other_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(PAYMENTS_ENV, str(tmp_path / "payments.log"))
    (tmp_path / "policy.toml").write_text(POLICY)
    policy = str(tmp_path / "policy.toml")
    url = f"sqlite:///{tmp_path}/runs.db"
    config = ApiConfig(
        open_access=True, store=url, agents=(PAYER, GREETER), worker=True, policy=policy
    )
    with serving(config) as base:
        async with httpx.AsyncClient(base_url=base, timeout=60) as http:
            waiting = []
            for _ in range(5):
                started = await http.post(
                    "/v1/runs",
                    params={"wait": "true", "timeout": "60"},
                    json={"agent": "payer", "input": "pay"},
                )
                assert started.json()["status"] == "input_required", started.text
                waiting.append(started.json())
            for _ in range(5):
                done = await http.post(
                    "/v1/runs",
                    params={"wait": "true", "timeout": "60"},
                    json={"agent": "greeter", "input": "hi"},
                )
                assert done.json()["status"] == "completed", done.text
            first = waiting[0]
            (iid,) = first["waiting_on"]
            assert iid.startswith(first["run_id"] + ".i")

            unknown = [
                "int_nope",
                "nope",
                f"{first['run_id']}:call_1_0",
                "run_missing.i3",
                f"{first['run_id']}.i999",
                f"{first['run_id']}.ix",
            ]
            for bad in unknown:
                refused = await http.post(f"/v1/interrupts/{bad}/approve", json={"approver": "a"})
                error_of(refused, 404, "interrupt_not_found")

    store = CountingStore(open_store(url))
    async with Runtime(store, policy=policy) as rt:
        for bad in unknown:
            store.reads.clear()
            with pytest.raises(InterruptNotFound):
                await rt.interrupt(bad)
            with pytest.raises(InterruptNotFound):
                await rt.deny(bad, approver="alice")
            # Only the run the id names is read (none, when it names none): never another.
            named = bad.rpartition(".")[0] if ".i" in bad else None
            assert set(store.reads) <= {named}, (bad, store.reads)
        store.reads.clear()
        found = await rt.interrupt(iid)
        assert found.id == iid and found.run_id == first["run_id"]
        assert set(store.reads) == {first["run_id"]}
        assert store.listed == 0
