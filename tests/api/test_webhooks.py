"""Webhook triggers over real HTTP, on both backends: the body becomes the run's input, the
timestamped HMAC-SHA256 signature is checked, each delivery id and each signature starts one
run (a replayed capture starts nothing); refusals write nothing."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import httpx
import pytest
from api_server import GREETER, GREETINGS, error_of, serving, token_for

from contextos import Runtime
from contextos.api import ApiConfig
from contextos.store.queue import queue_of
from contextos.workers.triggers import (
    DELIVERY_HEADER,
    SIGNATURE_HEADER,
    add_trigger,
    sign,
    trigger_run_id,
)
from support.processes import wait_until

SECRET_ENV = "CONTEXTOS_TEST_HOOK_SECRET"


def signed(
    body: bytes, delivery: str, secret: str = "shh", timestamp: int | None = None
) -> dict[str, str]:
    return {
        SIGNATURE_HEADER: sign(secret, body, timestamp=timestamp),
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
    with serving(ApiConfig(open_access=True, store=backend_url, max_body_bytes=4096)) as base:
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
            body2 = json.dumps({"order": "A-2", "total": 3.0}).encode()
            other = await http.post("/v1/hooks/orders", content=body2, headers=signed(body2, "d-2"))
            assert other.status_code == 202 and other.json()["run_id"] != run_id

            run = (await http.get(f"/v1/runs/{run_id}")).json()
            assert run["input"] == body.decode()
            assert run["metadata"] == {"trigger": "orders", "delivery": "d-1"}
            assert run["started_by"] == "started by webhook orders, delivery d-1"

            unsigned = await http.post(
                "/v1/hooks/open", content=b"plain text", headers={DELIVERY_HEADER: "x-1"}
            )
            assert unsigned.status_code == 202
            # Another unsigned delivery, and another trigger's delivery under an id already
            # seen at "orders": each starts its own run.
            for delivery in ("x-2", "d-1"):
                again = await http.post(
                    "/v1/hooks/open", content=b"plain text", headers={DELIVERY_HEADER: delivery}
                )
                assert again.status_code == 202 and again.json()["run_id"] != run_id, again.text

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
        assert len(runs) == 5  # d-1, d-2 and three unsigned: nothing else was written


async def test_a_replayed_delivery_starts_no_second_run(
    backend_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(SECRET_ENV, "shh")
    async with Runtime(backend_url) as rt:
        q = queue_of(rt.store)
        assert q is not None
        await add_trigger(q, "orders", GREETER, webhook=True, secret_env=SECRET_ENV)

    body = json.dumps({"order": "A-1"}).encode()
    captured = signed(body, "d-1")
    with serving(ApiConfig(open_access=True, store=backend_url)) as base:
        async with httpx.AsyncClient(base_url=base, timeout=60) as http:
            first = await http.post("/v1/hooks/orders", content=body, headers=captured)
            assert first.status_code == 202, first.text
            run_id = first.json()["run_id"]
            # The same body and signature under new delivery ids: the first run, nothing new.
            for delivery in ("d-2", "d-3"):
                replay = await http.post(
                    "/v1/hooks/orders",
                    content=body,
                    headers={**captured, DELIVERY_HEADER: delivery},
                )
                assert replay.status_code == 200, replay.text
                assert replay.json() == {
                    "run_id": run_id,
                    "trigger": "orders",
                    "delivery": delivery,
                    "duplicate": True,
                }
            # The sender sending the same body again signs it anew: that is a new delivery.
            again = signed(body, "d-4", timestamp=int(time.time()) - 5)
            fresh = await http.post("/v1/hooks/orders", content=body, headers=again)
            assert fresh.status_code == 202 and fresh.json()["run_id"] != run_id

    async with Runtime(backend_url) as rt:
        runs = await rt.runs(limit=100)
        assert sorted(r.run_id for r in runs) == sorted([run_id, fresh.json()["run_id"]])
        for delivery in ("d-2", "d-3"):
            assert trigger_run_id("orders", f"delivery:{delivery}") not in [r.run_id for r in runs]


async def test_a_delivery_signed_outside_the_window_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(SECRET_ENV, "shh")
    url = f"sqlite:///{tmp_path}/runs.db"
    async with Runtime(url) as rt:
        q = queue_of(rt.store)
        assert q is not None
        await add_trigger(q, "orders", GREETER, webhook=True, secret_env=SECRET_ENV)

    body = b'{"order": "A-1"}'
    hook = "/v1/hooks/orders"
    now = int(time.time())
    with serving(
        ApiConfig(open_access=True, store=url)
    ) as base:  # the default window: 5 minutes either way
        async with httpx.AsyncClient(base_url=base, timeout=60) as http:
            for offset, said in ((-3600, "s ago;"), (+3600, "s ahead of this server's clock")):
                stale = signed(body, "d-1", timestamp=now + offset)
                refused = await http.post(hook, content=body, headers=stale)
                error = error_of(refused, 401, "signature_expired")
                assert said in str(error["message"]) and "within 300s" in str(error["message"])
                # How far off, as a size: an hour (give or take the seconds this test took).
                skew = re.search(r"(\S+)s (?:ago;|ahead of)", str(error["message"]))
                assert skew is not None and int(skew.group(1)) >= 3000
            # A body-only signature (no timestamp) is no signature at all.
            body_only = "sha256=" + sign("shh", body).partition("v1=")[2]
            refused = await http.post(
                hook, content=body, headers={**signed(body, "d-1"), SIGNATURE_HEADER: body_only}
            )
            error_of(refused, 401, "bad_signature")
            # The timestamp is signed: moving it breaks the signature.
            moved = sign("shh", body, timestamp=now).replace(f"t={now}", f"t={now - 1}")
            refused = await http.post(
                hook, content=body, headers={**signed(body, "d-1"), SIGNATURE_HEADER: moved}
            )
            error_of(refused, 401, "bad_signature")

    with serving(ApiConfig(open_access=True, store=url, webhook_tolerance_s=30)) as base:
        async with httpx.AsyncClient(base_url=base, timeout=60) as http:
            late = signed(body, "d-1", timestamp=now - 120)
            error_of(await http.post(hook, content=body, headers=late), 401, "signature_expired")
            timely = signed(body, "d-1", timestamp=int(time.time()) - 10)
            accepted = await http.post(hook, content=body, headers=timely)
            assert accepted.status_code == 202, accepted.text

    async with Runtime(url) as rt:
        assert [r.run_id for r in await rt.runs()] == [accepted.json()["run_id"]]


async def test_a_tenants_webhook_starts_a_run_that_tenant_sees_and_no_other(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path}/runs.db"
    async with Runtime(url) as rt:
        q = queue_of(rt.store)
        assert q is not None
        await add_trigger(q, "acme-orders", GREETER, webhook=True, tenant="acme")
    acme = await token_for(url, tenant="acme", user="bob")
    other = await token_for(url, tenant="default", user="carol")
    body = b'{"order": "A-1"}'
    with serving(ApiConfig(store=url, agents=(GREETER,))) as base:
        async with httpx.AsyncClient(base_url=base, timeout=60) as http:
            hook = "/v1/hooks/acme-orders"
            started = await http.post(hook, content=body, headers={DELIVERY_HEADER: "d-1"})
            assert started.status_code == 202, started.text
            run_id = started.json()["run_id"]
            listed = (await http.get("/v1/runs", headers=acme)).json()["runs"]
            assert [r["run_id"] for r in listed] == [run_id]
            mine = await http.get(f"/v1/runs/{run_id}", headers=acme)
            assert mine.status_code == 200, mine.text
            error_of(await http.get(f"/v1/runs/{run_id}", headers=other), 404, "run_not_found")
            assert (await http.get("/v1/runs", headers=other)).json()["runs"] == []


async def test_a_webhook_starts_a_workflow_its_body_the_typed_input(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/runs.db"
    async with Runtime(url) as rt:
        q = queue_of(rt.store)
        assert q is not None
        await add_trigger(q, "greet", GREETINGS, webhook=True)
    with serving(ApiConfig(open_access=True, store=url, worker=True)) as base:
        async with httpx.AsyncClient(base_url=base, timeout=60) as http:
            body = b'{"names": ["ada"]}'
            started = await http.post(
                "/v1/hooks/greet", content=body, headers={DELIVERY_HEADER: "d-1"}
            )
            assert started.status_code == 202, started.text
            run_id = started.json()["run_id"]

            async def ended() -> bool:
                run = (await http.get(f"/v1/runs/{run_id}")).json()
                return bool(run["status"] in ("completed", "failed"))

            await wait_until(ended, what="the workflow run to end")
            run = (await http.get(f"/v1/runs/{run_id}")).json()
            assert (run["status"], run["structured_output"]) == ("completed", ["hello ada"])

            wrong = b'{"names": "ada"}'
            refused = await http.post(
                "/v1/hooks/greet", content=wrong, headers={DELIVERY_HEADER: "d-2"}
            )
            assert "is not a valid Greetings" in str(
                error_of(refused, 400, "config_error")["message"]
            )

    async with Runtime(url) as rt:
        assert [r.run_id for r in await rt.runs()] == [run_id]  # the refused one left nothing
