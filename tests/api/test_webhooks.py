"""Webhook triggers over real HTTP, on both backends: the body becomes the run's input, the
HMAC-SHA256 signature is checked, each delivery id starts one run; refusals write nothing."""

from __future__ import annotations

import json

import httpx
import pytest
from api_server import GREETER, serving

from contextos import Runtime
from contextos.api import ApiConfig
from contextos.store.queue import queue_of
from contextos.triggers import DELIVERY_HEADER, SIGNATURE_HEADER, add_trigger, sign

SECRET_ENV = "CONTEXTOS_TEST_HOOK_SECRET"


def signed(body: bytes, delivery: str, secret: str = "shh") -> dict[str, str]:
    return {
        SIGNATURE_HEADER: sign(secret, body),
        DELIVERY_HEADER: delivery,
        "content-type": "application/json",
    }


async def test_a_signed_webhook_starts_one_run_per_delivery(
    backend_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(SECRET_ENV, "shh")
    async with Runtime(backend_url) as rt:
        q = queue_of(rt.store)
        assert q is not None
        await add_trigger(q, "orders", GREETER, webhook=True, secret_env=SECRET_ENV)
        await add_trigger(q, "open", GREETER, webhook=True)
        await add_trigger(q, "after-greeter", GREETER, after="somebody")
        await add_trigger(q, "unset", GREETER, webhook=True, secret_env="CONTEXTOS_TEST_NOT_SET")

    body = json.dumps({"order": "A-1", "total": 12.5}).encode()
    with serving(ApiConfig(store=backend_url, max_body_bytes=4096)) as base:
        async with httpx.AsyncClient(base_url=base, timeout=60) as http:
            first = await http.post("/v1/hooks/orders", content=body, headers=signed(body, "d-1"))
            assert first.status_code == 202, first.text
            run_id = first.json()["run_id"]
            assert first.json() == {
                "run_id": run_id,
                "trigger": "orders",
                "delivery": "d-1",
                "duplicate": False,
            }
            retry = await http.post("/v1/hooks/orders", content=body, headers=signed(body, "d-1"))
            assert retry.status_code == 200
            assert (retry.json()["run_id"], retry.json()["duplicate"]) == (run_id, True)
            other = await http.post("/v1/hooks/orders", content=body, headers=signed(body, "d-2"))
            assert other.status_code == 202 and other.json()["run_id"] != run_id

            run = (await http.get(f"/v1/runs/{run_id}")).json()
            assert run["input"] == body.decode()
            assert run["metadata"] == {"trigger": "orders", "delivery": "d-1"}
            assert run["started_by"] == "started by webhook orders, delivery d-1"

            unsigned = await http.post(
                "/v1/hooks/open", content=b"plain text", headers={DELIVERY_HEADER: "x-1"}
            )
            assert unsigned.status_code == 202

            def refused(response: httpx.Response, status: int, code: str) -> None:
                assert response.status_code == status, response.text
                error = response.json()["error"]
                assert error["code"] == code and error["hint"], error

            hook = "/v1/hooks/orders"
            no_delivery = signed(body, "")
            refused(
                await http.post(hook, content=body, headers=no_delivery), 400, "missing_delivery_id"
            )
            forged = signed(body, "d-3", secret="guess")
            refused(await http.post(hook, content=body, headers=forged), 401, "bad_signature")
            tampered = signed(body, "d-3")
            refused(
                await http.post(hook, content=body + b" ", headers=tampered), 401, "bad_signature"
            )
            bare = {DELIVERY_HEADER: "d-3"}
            refused(await http.post(hook, content=body, headers=bare), 401, "bad_signature")
            big = b"x" * 5000
            refused(
                await http.post(hook, content=big, headers=signed(big, "d-4")),
                413,
                "body_too_large",
            )
            latin = "café".encode("latin-1")
            refused(
                await http.post(hook, content=latin, headers=signed(latin, "d-5")),
                400,
                "body_not_text",
            )
            refused(
                await http.post("/v1/hooks/nobody", content=body, headers=bare),
                404,
                "unknown_webhook",
            )
            refused(
                await http.post("/v1/hooks/after-greeter", content=body, headers=bare),
                404,
                "unknown_webhook",
            )
            refused(
                await http.post("/v1/hooks/unset", content=body, headers=bare),
                503,
                "webhook_secret_missing",
            )

    async with Runtime(backend_url) as rt:
        runs = await rt.runs(limit=100)
        assert len(runs) == 3  # d-1, d-2 and the unsigned one: nothing else was written
