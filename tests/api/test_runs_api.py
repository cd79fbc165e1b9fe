"""Runs over real HTTP: start (queued, or waited for), idempotency keys, list, read, the
paginated timeline, cancel; bad requests get a JSON error and change nothing."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from api_server import GREETER, GREETINGS, error_of, serving

from contextos import Runtime
from contextos.api import ApiConfig


async def test_start_wait_read_and_page_through_a_run(backend_url: str) -> None:
    config = ApiConfig(open_access=True, store=backend_url, agents=(GREETER,), worker=True)
    with serving(config) as base:
        async with httpx.AsyncClient(base_url=base, timeout=60) as http:
            started = await http.post(
                "/v1/runs",
                params={"wait": "true", "timeout": "60"},
                json={"agent": "greeter", "input": "say hello", "metadata": {"ticket": "T-1"}},
            )
            assert started.status_code == 201, started.text
            run = started.json()
            assert (run["status"], run["output"], run["failure"]) == (
                "completed",
                "hello from greeter",
                None,
            )
            assert run["agent"] == {"name": "greeter", "version": "1", "ref": GREETER}
            # The request's labels, and the key the runtime charges the run to: its principal.
            labels = dict(run["metadata"])
            assert labels.pop("principal").startswith("user:") and labels == {"ticket": "T-1"}
            assert run["input"] == "say hello"

            read = await http.get(f"/v1/runs/{run['run_id']}")
            assert read.status_code == 200 and read.json()["output"] == "hello from greeter"

            by_ref = await http.post("/v1/runs", json={"agent": GREETER, "input": "again"})
            assert by_ref.status_code == 201 and by_ref.json()["status"] == "queued"

            listed = (await http.get("/v1/runs", params={"status": "completed"})).json()["runs"]
            assert run["run_id"] in [r["run_id"] for r in listed]
            assert all(r["status"] == "completed" for r in listed)
            assert len((await http.get("/v1/runs", params={"limit": 1})).json()["runs"]) == 1

            seqs: list[int] = []
            after = 0
            while True:
                page = await http.get(
                    f"/v1/runs/{run['run_id']}/events", params={"after": after, "limit": 2}
                )
                assert page.status_code == 200
                body = page.json()
                assert len(body["events"]) <= 2
                seqs += [e["seq"] for e in body["events"]]
                if body["next_after"] is None:
                    break
                after = body["next_after"]
            assert seqs == list(range(1, run["last_seq"] + 1))
            first = (await http.get(f"/v1/runs/{run['run_id']}/events")).json()["events"][0]
            assert first["type"] == "run_created" and first["input"] == "say hello"


async def test_an_idempotency_key_returns_the_first_run(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/runs.db"
    with serving(ApiConfig(open_access=True, store=url, agents=(GREETER,))) as base:
        async with httpx.AsyncClient(base_url=base, timeout=60) as http:
            body = {"agent": "greeter", "input": "once"}
            headers = {"Idempotency-Key": "order-42"}
            first = await http.post("/v1/runs", json=body, headers=headers)
            again = await http.post("/v1/runs", json=body, headers=headers)
            assert (first.status_code, again.status_code) == (201, 200)
            assert first.json()["run_id"] == again.json()["run_id"]

            other = await http.post(
                "/v1/runs", json={"agent": "greeter", "input": "twice"}, headers=headers
            )
            assert other.status_code == 409
            assert other.json()["error"]["code"] == "idempotency_key_reused"

            fresh = await http.post("/v1/runs", json=body, headers={"Idempotency-Key": "o-43"})
            assert fresh.status_code == 201 and fresh.json()["run_id"] != first.json()["run_id"]

            # No worker: a waited-for run comes back as it stands when the wait is over.
            waited = await http.post(
                "/v1/runs", params={"wait": "true", "timeout": "0.2"}, json=body
            )
            assert waited.status_code == 202 and waited.json()["status"] == "queued"
    async with Runtime(url) as rt:
        assert len(await rt.runs()) == 3


async def test_a_workflow_starts_over_http_and_a_retry_finds_it(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/runs.db"
    config = ApiConfig(open_access=True, store=url, agents=(GREETINGS, GREETER), worker=True)
    with serving(config) as base:
        async with httpx.AsyncClient(base_url=base, timeout=60) as http:
            body = {"agent": "greetings", "input": '{"names": ["ada", "bob"]}'}
            headers = {"Idempotency-Key": "greet-1"}
            waited = {"wait": "true", "timeout": "60"}
            first = await http.post("/v1/runs", params=waited, json=body, headers=headers)
            assert first.status_code == 201, first.text
            run = first.json()
            assert (run["status"], run["structured_output"]) == (
                "completed",
                ["hello ada", "hello bob"],
            )
            # The same body again is the same request, though the run keeps its input as the
            # JSON the workflow's type gives
            again = await http.post("/v1/runs", json=body, headers=headers)
            assert again.status_code == 200, again.text
            assert again.json()["run_id"] == run["run_id"]

            # The input as a JSON object, not JSON text, is the same request too.
            as_object = {**body, "input": {"names": ["ada", "bob"]}}
            same = await http.post("/v1/runs", json=as_object, headers=headers)
            assert same.status_code == 200, same.text
            assert same.json()["run_id"] == run["run_id"]
            fresh = await http.post("/v1/runs", params=waited, json=as_object)
            assert fresh.json()["structured_output"] == ["hello ada", "hello bob"]

            bad = await http.post("/v1/runs", json={"agent": "greetings", "input": "[1]"})
            assert "is not a valid Greetings" in str(error_of(bad, 400, "config_error")["message"])
            wrong = {"agent": "greetings", "input": {"names": "ada"}}
            problem = error_of(await http.post("/v1/runs", json=wrong), 400, "config_error")
            assert "names: Input should be a valid list" in str(problem["message"])
            to_agent = {"agent": "greeter", "input": {"names": ["ada"]}}
            refused = error_of(await http.post("/v1/runs", json=to_agent), 422, "invalid_request")
            assert refused["message"] == "agent greeter takes text as its input, not a JSON object"
    async with Runtime(url) as rt:
        assert len(await rt.runs()) == 2  # the bad requests left nothing behind


async def test_cancel_over_http(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/runs.db"
    with serving(ApiConfig(open_access=True, store=url, agents=(GREETER,))) as base:
        async with httpx.AsyncClient(base_url=base, timeout=60) as http:
            run_id = (await http.post("/v1/runs", json={"agent": "greeter", "input": "x"})).json()[
                "run_id"
            ]
            cancelled = await http.post(
                f"/v1/runs/{run_id}/cancel", json={"reason": "changed my mind"}
            )
            assert cancelled.status_code == 200
            assert cancelled.json()["status"] == "cancelled"
            assert cancelled.json()["failure"]["message"] == "changed my mind"
            again = await http.post(f"/v1/runs/{run_id}/cancel")  # no body: fine, and idempotent
            assert again.status_code == 200 and again.json()["status"] == "cancelled"


@pytest.mark.parametrize("token", [None, "s3cret"])
async def test_bad_requests_get_json_errors_and_change_nothing(
    tmp_path: Path, token: str | None
) -> None:
    url = f"sqlite:///{tmp_path}/runs.db"
    auth = {"Authorization": f"Bearer {token}"} if token else {}
    with serving(ApiConfig(open_access=True, store=url, agents=(GREETER,), token=token)) as base:
        async with httpx.AsyncClient(base_url=base, timeout=60, headers=auth) as http:
            post = http.post
            malformed = await post(
                "/v1/runs",
                content=b'{"agent": "greeter",',
                headers={"content-type": "application/json"},
            )
            assert "not valid JSON" in str(error_of(malformed, 400, "malformed_json")["message"])
            missing = error_of(
                await post("/v1/runs", json={"agent": "greeter"}), 422, "invalid_request"
            )
            assert missing["problems"] == [{"where": "body.input", "problem": "Field required"}]
            extra = await post("/v1/runs", json={"agent": "greeter", "input": "x", "prio": 1})
            assert "body.prio" in str(error_of(extra, 422, "invalid_request")["message"])
            form = await post("/v1/runs", data={"agent": "greeter", "input": "x"})
            error_of(form, 415, "not_json")
            unknown = await post("/v1/runs", json={"agent": "os:getcwd", "input": "x"})
            assert "it starts: greeter" in str(error_of(unknown, 422, "unknown_agent")["message"])
            too_long = await post(
                "/v1/runs",
                params={"wait": "true", "timeout": "9999"},
                json={"agent": "greeter", "input": "x"},
            )
            error_of(too_long, 422, "invalid_request")
            error_of(await http.get("/v1/runs/run_nope"), 404, "run_not_found")
            error_of(await http.get("/v1/runs/run_nope/events"), 404, "run_not_found")
            error_of(await post("/v1/runs/run_nope/cancel"), 404, "run_not_found")
            error_of(await http.get("/v1/runs", params={"status": "done"}), 422, "invalid_request")
            error_of(await http.get("/v1/runs", params={"limit": 0}), 422, "invalid_request")
            error_of(await http.get("/v2/runs"), 404, "not_found")
            error_of(await http.delete("/v1/runs"), 405, "method_not_allowed")
            error_of(
                await post("/v1/interrupts/int_nope/approve", json={"approver": "alice"}),
                404,
                "interrupt_not_found",
            )
            error_of(
                await post("/v1/interrupts/int_nope/deny", json={"reason": 5}),
                422,
                "invalid_request",
            )
            assert (await http.get("/v1/runs")).json() == {"runs": []}
        if token:
            async with httpx.AsyncClient(base_url=base, timeout=60) as anonymous:
                error_of(await anonymous.get("/v1/runs"), 401, "unauthorized")
                wrong = {"Authorization": "Bearer nope"}
                error_of(await anonymous.get("/v1/runs", headers=wrong), 401, "unauthorized")
                error_of(
                    await anonymous.post("/v1/runs", json={"agent": "greeter", "input": "x"}),
                    401,
                    "unauthorized",
                )
                assert (await anonymous.get("/v1/health")).json()["status"] == "ok"
    async with Runtime(url) as rt:
        assert await rt.runs() == []
