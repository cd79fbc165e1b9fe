"""The API's limits over real HTTP: numbers past what the stores keep, values JSON does not
allow, bodies past the size limit. Each gets a 4xx JSON error, and nothing is written."""

from __future__ import annotations

import json
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
from api_agents import PAYMENTS_ENV, POLICY, payer
from api_server import GREETER, PAYER, error_of, serving

from contextos import Runtime
from contextos.api import ApiConfig

JSON = {"content-type": "application/json"}


async def test_numbers_past_what_the_stores_keep_are_refused(backend_url: str) -> None:
    with serving(ApiConfig(open_access=True, store=backend_url, agents=(GREETER,))) as base:
        async with httpx.AsyncClient(base_url=base, timeout=60) as http:
            for priority in ("1e23", str(2**31), str(-(2**31) - 1), str(2**63), "1.5"):
                body = f'{{"agent": "greeter", "input": "x", "priority": {priority}}}'
                refused = await http.post("/v1/runs", content=body, headers=JSON)
                assert "body.priority" in str(error_of(refused, 422, "invalid_request")["message"])
            # Python's JSON reader lets NaN and infinities through; the API does not.
            for number in ("NaN", "Infinity", "-Infinity", "1e400"):
                body = f'{{"agent": "greeter", "input": "x", "metadata": {{"amount": {number}}}}}'
                refused = await http.post("/v1/runs", content=body, headers=JSON)
                message = str(error_of(refused, 422, "invalid_request")["message"])
                assert "metadata.amount" in message and "finite number" in message, message
                approve = f'{{"approver": "alice", "expires_in": {number}}}'
                refused = await http.post(
                    "/v1/interrupts/run_x.i3/approve", content=approve, headers=JSON
                )
                error_of(refused, 422, "invalid_request")
            for timeout in ("inf", "nan", "1e400"):
                refused = await http.post(
                    "/v1/runs",
                    params={"wait": "true", "timeout": timeout},
                    json={"agent": "greeter", "input": "x"},
                )
                error_of(refused, 422, "invalid_request")
            for limit in (2**70, -1, "many"):
                error_of(
                    await http.get("/v1/runs", params={"limit": limit}), 422, "invalid_request"
                )

            highest = {"agent": "greeter", "input": "x", "priority": 2**31 - 1}
            started = await http.post("/v1/runs", json=highest)
            assert started.status_code == 201, started.text
            run_id = started.json()["run_id"]
            events = f"/v1/runs/{run_id}/events"
            for after in (2**63, 2**95):
                refused = await http.get(events, params={"after": after})
                assert "query.after" in str(error_of(refused, 422, "invalid_request")["message"])
            last = await http.get(events, params={"after": 2**63 - 1})
            assert last.status_code == 200 and last.json()["events"] == []
    async with Runtime(backend_url) as rt:
        assert [r.run_id for r in await rt.runs()] == [run_id]


async def test_text_no_store_keeps_and_deep_nesting_are_refused(backend_url: str) -> None:
    with serving(ApiConfig(open_access=True, store=backend_url, agents=(GREETER,))) as base:
        async with httpx.AsyncClient(base_url=base, timeout=60) as http:
            for body in (
                '{"agent": "greeter", "input": "a\\u0000b"}',
                '{"agent": "greeter", "input": "a\\ud800b"}',
                '{"agent": "greeter", "input": "x", "tenant": "t\\u0000"}',
            ):
                refused = await http.post("/v1/runs", content=body, headers=JSON)
                assert "is not text" in str(error_of(refused, 422, "invalid_request")["message"])
            deep = {
                "agent": "greeter",
                "input": "x",
                "metadata": {"a": json.loads("[" * 40 + "]" * 40)},
            }
            refused = await http.post("/v1/runs", json=deep)
            message = str(error_of(refused, 422, "invalid_request")["message"])
            assert "metadata nests deeper than 32 levels" in message
            error_of(await http.get("/v1/runs/run%00x"), 404, "run_not_found")
            error_of(await http.get("/v1/runs/run%00x/events"), 404, "run_not_found")
    async with Runtime(backend_url) as rt:
        assert await rt.runs() == []


def raw_request(base: str, head: bytes) -> bytes:
    """Send a request's head and none of its body; return the response as it comes."""
    url = urlsplit(base)
    assert url.hostname is not None and url.port is not None
    with socket.create_connection((url.hostname, url.port), timeout=30) as sock:
        sock.sendall(head)
        response = b""
        while b"\r\n\r\n" not in response or not response.rstrip().endswith(b"}"):
            chunk = sock.recv(65536)
            if not chunk:
                break
            response += chunk
    return response


async def test_a_body_past_the_limit_is_refused_before_it_is_read(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/runs.db"
    mib = 1 << 20
    with serving(ApiConfig(open_access=True, store=url, agents=(GREETER,))) as base:
        async with httpx.AsyncClient(base_url=base, timeout=60) as http:
            big = {"agent": "greeter", "input": "x" * (2 * mib)}
            refused = error_of(await http.post("/v1/runs", json=big), 413, "body_too_large")
            assert refused["max_body_bytes"] == mib

            async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: counted as it comes
                yield b'{"agent": "greeter", "input": "'
                for _ in range(32):
                    yield b"x" * (64 << 10)
                yield b'"}'

            chunked = await http.post("/v1/runs", content=chunks(), headers=JSON)
            error_of(chunked, 413, "body_too_large")

            under = {"agent": "greeter", "input": "x" * (mib - 100)}
            started = await http.post("/v1/runs", json=under)
            assert started.status_code == 201, started.text

        # Only the head is sent, announcing 2 MiB: the answer comes without waiting for them.
        head = (
            b"POST /v1/runs HTTP/1.1\r\nHost: api\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % (2 * mib)
        )
        response = raw_request(base, head)
        assert response.startswith(b"HTTP/1.1 413 "), response
        assert b'"code":"body_too_large"' in response

    with serving(
        ApiConfig(open_access=True, store=url, agents=(GREETER,), max_body_bytes=1000)
    ) as base:
        async with httpx.AsyncClient(base_url=base, timeout=60) as http:
            small = {"agent": "greeter", "input": "x" * 2000}
            refused = error_of(await http.post("/v1/runs", json=small), 413, "body_too_large")
            assert refused["max_body_bytes"] == 1000
    async with Runtime(url) as rt:
        assert [r.run_id for r in await rt.runs()] == [started.json()["run_id"]]


async def test_an_answer_holding_a_number_no_clock_can_add_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(PAYMENTS_ENV, str(tmp_path / "payments.log"))
    (tmp_path / "policy.toml").write_text(POLICY)
    policy = str(tmp_path / "policy.toml")
    url = f"sqlite:///{tmp_path}/runs.db"
    async with Runtime(url, policy=policy) as rt:
        run_id = (await rt.run(payer, "pay")).run_id
        (interrupt_id,) = (await rt.state(run_id)).pending_interrupts
        seq = (await rt.state(run_id)).seq
    with serving(ApiConfig(open_access=True, store=url, agents=(PAYER,), policy=policy)) as base:
        async with httpx.AsyncClient(base_url=base, timeout=60) as http:
            answer = f"/v1/interrupts/{interrupt_id}/answer"
            # JSON strings that Python reads as NaN or infinity, where a number of seconds goes.
            for seconds in ("nan", "inf", "-Infinity", "1e400"):
                value = {"decision": "approve", "expires_in_s": seconds}
                refused = await http.post(answer, json={"value": value, "answered_by": "alice"})
                assert "finite number" in str(error_of(refused, 422, "answer_invalid")["message"])
    async with Runtime(url) as rt:
        assert (await rt.state(run_id)).seq == seq  # nothing was recorded
