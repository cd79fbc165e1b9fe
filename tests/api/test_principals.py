"""Principals come from authentication, never from the request body, over real HTTP.

Every route acts as the token's principal: a started run records it, an approval is made by
it with at most the roles it carries and the policy gives it in the run's tenant, and another
tenant's runs and interrupts answer 404 on every route, as ids that do not exist.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import httpx
import pytest
from api_agents import PAYMENTS_ENV, POLICY
from api_server import GREETER, PAYER, error_of, serving, token_for

from contextos import Runtime, list_tokens, revoke_token
from contextos.api import ApiConfig


@pytest.fixture
def setup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, ApiConfig]:
    monkeypatch.setenv(PAYMENTS_ENV, str(tmp_path / "payments.log"))
    (tmp_path / "policy.toml").write_text(POLICY)
    url = f"sqlite:///{tmp_path}/runs.db"
    config = ApiConfig(
        store=url, agents=(PAYER, GREETER), worker=True, policy=str(tmp_path / "policy.toml")
    )
    return url, config


async def waiting_payment(http: httpx.AsyncClient, headers: dict[str, str]) -> dict[str, Any]:
    started = await http.post(
        "/v1/runs",
        params={"wait": "true", "timeout": "60"},
        json={"agent": "payer", "input": "pay"},
        headers=headers,
    )
    assert started.status_code == 201, started.text
    run: dict[str, Any] = started.json()
    assert run["status"] == "input_required"
    return run


async def test_a_run_acts_as_the_token_and_an_approval_is_made_by_it(
    setup: tuple[str, ApiConfig],
) -> None:
    url, config = setup
    bob = await token_for(url, tenant="acme", user="bob")
    alice = await token_for(url, tenant="acme", user="alice", roles=("finance",))
    alice_no_roles = await token_for(url, tenant="acme", user="alice")
    with serving(config) as base:
        async with httpx.AsyncClient(base_url=base, timeout=60) as http:
            run = await waiting_payment(http, bob)
            events = (await http.get(f"/v1/runs/{run['run_id']}/events", headers=bob)).json()
            (bound,) = [e for e in events["events"] if e["type"] == "context_bound"]
            assert bound["context"]["principal"] | {"scopes": [], "roles": []} == {
                "kind": "user",
                "id": "bob",
                "tenant": "acme",
                "scopes": [],
                "roles": [],
            }
            (iid,) = run["waiting_on"]
            approve = f"/v1/interrupts/{iid}/approve"

            # The policy gives alice finance in acme, but this token of hers carries no role.
            narrow = await http.post(approve, json={}, headers=alice_no_roles)
            assert "alice does not hold finance" in str(
                error_of(narrow, 409, "approval_refused")["message"]
            )
            # Bob names alice in the body: the approval is still Bob's, and Bob may not.
            forged = await http.post(approve, json={"approver": "alice"}, headers=bob)
            assert "bob" in str(error_of(forged, 409, "approval_refused")["message"])

            approved = await http.post(approve, json={"approver": "mallory"}, headers=alice)
            assert approved.status_code == 200, approved.text
            assert approved.json()["approver"] == "alice"
            assert approved.json()["approver_roles"] == ["finance"]


async def test_a_role_holder_of_another_tenant_cannot_see_or_approve(
    setup: tuple[str, ApiConfig],
) -> None:
    """carol holds finance in globex (policy and token): acme's runs do not exist for her."""
    url, config = setup
    bob = await token_for(url, tenant="acme", user="bob")
    carol = await token_for(url, tenant="globex", user="carol", roles=("finance",))
    with serving(config) as base:
        async with httpx.AsyncClient(base_url=base, timeout=60) as http:
            run = await waiting_payment(http, bob)
            (iid,) = run["waiting_on"]
            refused = await http.post(f"/v1/interrupts/{iid}/approve", json={}, headers=carol)
            error_of(refused, 404, "interrupt_not_found")
            assert (await http.get("/v1/interrupts", headers=carol)).json() == {"interrupts": []}
            assert (await http.get("/v1/runs", headers=carol)).json() == {"runs": []}
            mine = (await http.get("/v1/runs", headers=bob)).json()["runs"]
            assert [r["run_id"] for r in mine] == [run["run_id"]]
            inbox = (await http.get("/v1/interrupts", headers=bob)).json()["interrupts"]
            assert [i["interrupt_id"] for i in inbox] == [iid]


async def test_every_route_hides_another_tenants_ids(setup: tuple[str, ApiConfig]) -> None:
    """Each operation of the OpenAPI schema that names a run or an interrupt, called by a
    token of another tenant with the ids of a real waiting run: 404, as for no such id."""
    url, config = setup
    bob = await token_for(url, tenant="acme", user="bob")
    stranger = await token_for(url, tenant="globex", user="carol", roles=("finance",))
    with serving(config) as base:
        async with httpx.AsyncClient(base_url=base, timeout=60) as http:
            run = await waiting_payment(http, bob)
            ids = {"run_id": run["run_id"], "interrupt_id": run["waiting_on"][0]}
            schema = (await http.get("/v1/openapi.json")).json()
            tried = []
            for path, operations in schema["paths"].items():
                names = re.findall(r"\{(\w+)\}", path)
                if not names or not set(names) <= set(ids):
                    continue
                for method in operations:
                    target = path.format(**ids)
                    body = {"value": "north"} if target.endswith("/answer") else {}
                    if target.endswith("/messages"):
                        body = {"message": "hello"}
                    kwargs: dict[str, Any] = {"headers": stranger}
                    if method != "get":
                        kwargs["json"] = body
                    response = await http.request(method.upper(), target, **kwargs)
                    assert response.status_code == 404, (method, target, response.text)
                    assert response.json()["error"]["code"].endswith("not_found")
                    tried.append(f"{method} {path}")
            assert len(tried) >= 7, tried
            # Nothing was done to the run by all that.
            after = (await http.get(f"/v1/runs/{run['run_id']}", headers=bob)).json()
            assert (after["status"], after["last_seq"]) == ("input_required", run["last_seq"])


async def test_missing_unknown_and_revoked_tokens_are_refused(
    setup: tuple[str, ApiConfig],
) -> None:
    url, config = setup
    bob = await token_for(url, tenant="acme", user="bob")
    with serving(config) as base:
        async with httpx.AsyncClient(base_url=base, timeout=60) as http:
            error_of(await http.get("/v1/runs"), 401, "unauthorized")
            error_of(
                await http.get("/v1/runs", headers={"Authorization": "Bearer ctx_nope"}),
                401,
                "unauthenticated",
            )
            forged = bob["Authorization"][:-4] + "AAAA"
            error_of(
                await http.get("/v1/runs", headers={"Authorization": forged}),
                401,
                "unauthenticated",
            )
            assert (await http.get("/v1/runs", headers=bob)).status_code == 200
            async with Runtime(url) as rt:
                (record,) = await list_tokens(rt.store, tenant="acme")
                assert await revoke_token(rt.store, record.token_id)
                assert not await revoke_token(rt.store, record.token_id)
            refused = error_of(await http.get("/v1/runs", headers=bob), 401, "unauthenticated")
            assert "revoked" in str(refused["message"])
            assert (await http.get("/v1/health")).status_code == 200  # needs no token


async def test_a_token_starts_runs_only_in_its_own_tenant(setup: tuple[str, ApiConfig]) -> None:
    url, config = setup
    bob = await token_for(url, tenant="acme", user="bob")
    with serving(config) as base:
        async with httpx.AsyncClient(base_url=base, timeout=60) as http:
            other = await http.post(
                "/v1/runs",
                json={"agent": "greeter", "input": "hi", "tenant": "globex"},
                headers=bob,
            )
            error_of(other, 403, "tenant_forbidden")
            # The same Idempotency-Key in two tenants starts two runs: keys do not cross.
            carol = await token_for(url, tenant="globex", user="carol")
            key = {"Idempotency-Key": "k1"}
            first = await http.post(
                "/v1/runs", json={"agent": "greeter", "input": "hi"}, headers=bob | key
            )
            second = await http.post(
                "/v1/runs", json={"agent": "greeter", "input": "hi"}, headers=carol | key
            )
            assert (first.status_code, second.status_code) == (201, 201)
            assert first.json()["run_id"] != second.json()["run_id"]
            await asyncio.sleep(0)


async def test_an_inbox_limit_counts_the_tenants_own_interrupts(
    setup: tuple[str, ApiConfig],
) -> None:
    """Another tenant's newer waiting runs do not crowd a tenant's own out of its inbox."""
    url, config = setup
    bob = await token_for(url, tenant="acme", user="bob")
    carol = await token_for(url, tenant="globex", user="carol")
    with serving(config) as base:
        async with httpx.AsyncClient(base_url=base, timeout=60) as http:
            mine = await waiting_payment(http, bob)
            for _ in range(2):
                await waiting_payment(http, carol)
            inbox = await http.get("/v1/interrupts", params={"limit": 1}, headers=bob)
            assert [i["interrupt_id"] for i in inbox.json()["interrupts"]] == mine["waiting_on"]
