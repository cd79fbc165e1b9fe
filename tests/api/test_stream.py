"""A run's events as Server-Sent Events over real HTTP: live while a person approves, each
once, resumable with Last-Event-ID, closed with an `end` event, scoped to the token's tenant."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from api_agents import PAYMENTS_ENV, POLICY
from api_server import PAYER, error_of, serving, token_for

from contextos.api import ApiConfig


async def sse(response: httpx.Response) -> Any:
    """(id, event, data) of each event of a stream, as they arrive."""
    fields: dict[str, str] = {}
    async for line in response.aiter_lines():
        if line == "":
            if "event" in fields or "data" in fields:
                yield fields.get("id"), fields.get("event", "message"), json.loads(fields["data"])
            fields = {}
        elif not line.startswith(":"):
            name, _, value = line.partition(":")
            fields[name] = value.removeprefix(" ")


@pytest.fixture
def config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ApiConfig:
    monkeypatch.setenv(PAYMENTS_ENV, str(tmp_path / "payments.log"))
    (tmp_path / "policy.toml").write_text(POLICY)
    return ApiConfig(
        store=f"sqlite:///{tmp_path}/runs.db",
        agents=(PAYER,),
        worker=True,
        policy=str(tmp_path / "policy.toml"),
    )


@pytest.mark.timeout(120)
async def test_a_run_streams_live_and_resumes_after_the_last_event(config: ApiConfig) -> None:
    assert config.store is not None
    bob = await token_for(config.store, tenant="acme", user="bob")
    alice = await token_for(config.store, tenant="acme", user="alice", roles=("finance",))
    with serving(config) as base:
        async with httpx.AsyncClient(base_url=base, timeout=60, headers=bob) as http:
            started = await http.post("/v1/runs", json={"agent": "payer", "input": "pay"})
            run_id = started.json()["run_id"]
            stream = f"/v1/runs/{run_id}/events/stream"
            seen: list[tuple[int, str]] = []
            end: dict[str, Any] = {}
            async with http.stream("GET", stream) as response:
                assert response.status_code == 200
                assert response.headers["content-type"].startswith("text/event-stream")
                async for event_id, event, data in sse(response):
                    if event == "end":
                        end = data
                        break
                    assert event_id is not None and int(event_id) == data["seq"]
                    assert (event, data["run_id"]) == (data["type"], run_id) and data["line"]
                    seen.append((data["seq"], event))
                    if event == "interrupt_raised":  # approved while the stream is open
                        iid = data["interrupt_id"]
                        approved = await http.post(
                            f"/v1/interrupts/{iid}/approve", json={}, headers=alice
                        )
                        assert approved.status_code == 200, approved.text
            types = [t for _, t in seen]
            assert types.index("interrupt_raised") < types.index("approval_granted")
            assert types[-1] == "run_completed"
            assert [s for s, _ in seen] == list(range(1, len(seen) + 1))  # each once, in order
            assert end == {"run_id": run_id, "status": "completed", "last_seq": len(seen)}

            resumed_at = len(seen) // 2
            async with http.stream(
                "GET", stream, headers={"Last-Event-ID": str(resumed_at)}
            ) as response:
                rest = [(int(i), e) async for i, e, _ in sse(response) if e != "end"]
            assert rest == seen[resumed_at:]

            error_of(
                await http.get(stream, headers={"Last-Event-ID": "x1"}), 422, "invalid_request"
            )
            carol = await token_for(config.store, tenant="globex", user="carol")
            error_of(await http.get(stream, headers=carol), 404, "run_not_found")
