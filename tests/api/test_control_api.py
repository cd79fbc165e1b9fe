"""Pause and follow-up messages over real HTTP: a conversation goes on as the same run with the
message sent to the model, followed live on the event stream until it is idle again; a paused
run waits; what a run cannot take is a 4xx with a reason, scoped to the token's tenant."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from api_server import GREETINGS, error_of, serving, token_for
from test_stream import sse

from contextos import Runtime
from contextos.api import ApiConfig
from support.processes import wait_until

CHAT = "tests/drivers/chat_agent.py:agent"


async def follow_until_idle(http: httpx.AsyncClient, run_id: str, after: int) -> list[Any]:
    """The events after `after`, as the stream sends them, up to its `idle` event."""
    seen: list[Any] = []
    stream = f"/v1/runs/{run_id}/events/stream?after={after}"
    async with http.stream("GET", stream) as response:
        assert response.status_code == 200
        async for _, event, data in sse(response):
            seen.append((event, data))
            if event in ("idle", "end"):
                break
    return seen


@pytest.mark.timeout(120)
async def test_a_message_continues_a_conversation_followed_on_the_stream(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path}/runs.db"
    bob = await token_for(store, tenant="acme", user="bob")
    with serving(ApiConfig(store=store, agents=(CHAT,), worker=True)) as base:
        async with httpx.AsyncClient(base_url=base, timeout=60, headers=bob) as http:
            started = await http.post("/v1/runs?wait=true", json={"agent": CHAT, "input": "hi"})
            run = started.json()
            assert (run["status"], run["output"]) == ("input_required", "user: hi"), run
            run_id, answered_at = run["run_id"], run["last_seq"]

            sent = await http.post(f"/v1/runs/{run_id}/messages", json={"message": "in euros?"})
            assert sent.status_code == 202, sent.text
            assert (sent.json()["run_id"], sent.json()["status"]) == (run_id, "queued")

            seen = await follow_until_idle(http, run_id, answered_at)
            kinds = [event for event, _ in seen]
            assert kinds[0] == "user_message_added" and seen[0][1]["content"] == "in euros?"
            assert seen[0][1]["actor"] == "user:bob@acme"
            assert kinds[-2:] == ["run_answered", "idle"]
            assert seen[-1][1]["status"] == "input_required"

            now = (await http.get(f"/v1/runs/{run_id}")).json()
            assert now["output"] == "user: hi | assistant: user: hi | user: in euros?"
            assert now["turns"] == 2

            # What the run cannot take: each a 4xx with a reason, nothing recorded.
            refused = error_of(
                await http.post(f"/v1/runs/{run_id}/messages", json={"message": "more"}),
                409,
                "control_refused",
            )
            assert "no budget left" in str(refused["message"])
            error_of(await http.post(f"/v1/runs/{run_id}/pause"), 409, "control_refused")
            for empty in ({"message": "  "}, {"message": ""}, {}):
                error_of(
                    await http.post(f"/v1/runs/{run_id}/messages", json=empty),
                    422,
                    "invalid_request",
                )
            error_of(
                await http.post("/v1/runs/run_nope/messages", json={"message": "hi"}),
                404,
                "run_not_found",
            )
            carol = await token_for(store, tenant="globex", user="carol")
            for path, body in (("pause", {}), ("messages", {"message": "x"})):
                error_of(
                    await http.post(f"/v1/runs/{run_id}/{path}", json=body, headers=carol),
                    404,
                    "run_not_found",
                )
            assert (await http.get(f"/v1/runs/{run_id}")).json()["last_seq"] == now["last_seq"]

            # Another tenant cannot finish it; its own user closes it with the last answer.
            error_of(
                await http.post(f"/v1/runs/{run_id}/finish", headers=carol), 404, "run_not_found"
            )
            finished = await http.post(f"/v1/runs/{run_id}/finish")
            assert finished.status_code == 200, finished.text
            assert finished.json()["status"] == "completed"
            assert finished.json()["output"] == now["output"]
            again = error_of(await http.post(f"/v1/runs/{run_id}/finish"), 409, "control_refused")
            assert "already completed" in str(again["message"])


async def test_a_paused_run_waits_until_it_is_sent_a_message(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path}/runs.db"
    bob = await token_for(store, tenant="acme", user="bob")
    with serving(ApiConfig(store=store, agents=(CHAT,))) as base:  # no worker: nothing drives it
        async with httpx.AsyncClient(base_url=base, timeout=60, headers=bob) as http:
            run_id = (await http.post("/v1/runs", json={"agent": CHAT, "input": "hi"})).json()[
                "run_id"
            ]
            paused = await http.post(f"/v1/runs/{run_id}/pause", json={"reason": "wait"})
            assert paused.status_code == 200, paused.text
            assert paused.json()["status"] == "paused"
            listed = (await http.get("/v1/runs?status=paused")).json()["runs"]
            assert [r["run_id"] for r in listed] == [run_id]

            sent = await http.post(f"/v1/runs/{run_id}/messages", json={"message": "go on"})
            assert sent.json()["status"] == "queued"
            await http.post(f"/v1/runs/{run_id}/cancel", json={})
            ended = error_of(await http.post(f"/v1/runs/{run_id}/pause"), 409, "control_refused")
            assert "already cancelled" in str(ended["message"])


async def test_a_paused_workflow_goes_on_when_resumed_over_http(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path}/runs.db"
    body = {"agent": "greetings", "input": '{"names": ["ada"]}'}
    with serving(ApiConfig(open_access=True, store=store, agents=(GREETINGS,))) as base:
        async with httpx.AsyncClient(base_url=base, timeout=60) as http:  # no worker here
            run_id = (await http.post("/v1/runs", json=body)).json()["run_id"]
            refused = error_of(await http.post(f"/v1/runs/{run_id}/resume"), 409, "control_refused")
            assert "is queued, not paused" in str(refused["message"])
            paused = await http.post(f"/v1/runs/{run_id}/pause", json={"reason": "wait"})
            assert paused.json()["status"] == "paused"
            resumed = await http.post(f"/v1/runs/{run_id}/resume")
            assert resumed.status_code == 202, resumed.text
            assert resumed.json()["status"] == "queued"
    # A worker takes the run it let go, and finishes it.
    config = ApiConfig(open_access=True, store=store, agents=(GREETINGS,), worker=True)
    with serving(config) as base:
        async with httpx.AsyncClient(base_url=base, timeout=60) as http:

            async def ended() -> bool:
                return (await http.get(f"/v1/runs/{run_id}")).json()["status"] == "completed"

            await wait_until(ended, what="a worker to finish the run it was let go")
            run = (await http.get(f"/v1/runs/{run_id}")).json()
            assert run["structured_output"] == ["hello ada"]
    async with Runtime(store) as rt:
        kinds = [e.type for e in await rt.events(run_id)]
    assert kinds.index("run_paused") < kinds.index("run_unpaused") < kinds.index("run_completed")
