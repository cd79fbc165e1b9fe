"""Interrupts over real HTTP, through the same runtime calls as the CLI: the inbox, approve
(bound to the frozen action's hash and the approver's role), deny, answer; a worker in the
server resumes the run once a person has answered. Bob starts the runs; each person acts
through a token of their own."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest
from api_agents import PAYMENTS_ENV, POLICY
from api_server import ASKER, PAYER, serving, token_for

from contextos.api import ApiConfig


@pytest.fixture
def payments(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "payments.log"
    path.touch()
    monkeypatch.setenv(PAYMENTS_ENV, str(path))
    return path


def paid(payments: Path) -> str:
    return payments.read_text()


def store_of(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/runs.db"


def config(tmp_path: Path) -> ApiConfig:
    (tmp_path / "policy.toml").write_text(POLICY)
    return ApiConfig(
        store=store_of(tmp_path),
        agents=(PAYER, ASKER),
        worker=True,
        policy=str(tmp_path / "policy.toml"),
    )


async def waiting_run(http: httpx.AsyncClient, agent: str) -> tuple[str, dict[str, Any]]:
    """A run Bob started (the client acts as Bob) that waits for a person."""
    started = await http.post(
        "/v1/runs", params={"wait": "true", "timeout": "60"}, json={"agent": agent, "input": "go"}
    )
    assert started.status_code == 201, started.text
    run = started.json()
    assert run["status"] == "input_required"
    inbox = (await http.get("/v1/interrupts")).json()["interrupts"]
    (pending,) = [i for i in inbox if i["run_id"] == run["run_id"]]
    assert run["waiting_on"] == [pending["interrupt_id"]]
    return str(run["run_id"]), pending


async def finished(http: httpx.AsyncClient, run_id: str) -> dict[str, Any]:
    """The run once the server's worker has driven it to its end (polled; a hang fails)."""
    for _ in range(1200):
        run: dict[str, Any] = (await http.get(f"/v1/runs/{run_id}")).json()
        if run["status"] in ("completed", "failed", "cancelled"):
            return run
        await asyncio.sleep(0.05)
    raise AssertionError(f"run {run_id} never finished")


async def test_approve_over_http(tmp_path: Path, payments: Path) -> None:
    with serving(config(tmp_path)) as base:
        bob = await token_for(store_of(tmp_path), user="bob")
        async with httpx.AsyncClient(base_url=base, timeout=60, headers=bob) as http:
            run_id, pending = await waiting_run(http, "payer")
            assert pending["kind"] == "approval_required"
            assert pending["prompt"] == "Pay 900.0 EUR to acme"
            assert pending["approver_roles"] == ["finance"]
            iid, action = pending["interrupt_id"], pending["action"]
            approve = f"/v1/interrupts/{iid}/approve"
            dave = await token_for(store_of(tmp_path), user="dave", roles=("finance",))
            alice = await token_for(store_of(tmp_path), user="alice", roles=("finance",))

            no_role = await http.post(approve, json={}, headers=dave)
            assert no_role.status_code == 409
            assert no_role.json()["error"]["code"] == "approval_refused"
            assert "dave does not hold finance" in no_role.json()["error"]["message"]
            forged = await http.post(approve, json={"action_hash": "0" * 64}, headers=alice)
            assert forged.status_code == 409
            assert "not the hash of the action" in forged.json()["error"]["message"]
            assert paid(payments) == ""

            approved = await http.post(
                approve,
                json={
                    "action_hash": action["hash"],
                    "expires_in": 600,
                    "conditions": {"max_amount": 1000},
                },
                headers=alice,
            )
            assert approved.status_code == 200, approved.text
            approval = approved.json()
            assert (approval["approver"], approval["run_id"]) == ("alice", run_id)
            assert approval["conditions"] == {"max_amount": 1000}

            done = await finished(http, run_id)
            assert (done["status"], done["output"]) == ("completed", "Done.")
            assert paid(payments) == f"{run_id} acme 900.0\n"
            assert (await http.get("/v1/interrupts")).json() == {"interrupts": []}


async def test_deny_over_http(tmp_path: Path, payments: Path) -> None:
    with serving(config(tmp_path)) as base:
        bob = await token_for(store_of(tmp_path), user="bob")
        async with httpx.AsyncClient(base_url=base, timeout=60, headers=bob) as http:
            run_id, pending = await waiting_run(http, "payer")
            alice = await token_for(store_of(tmp_path), user="alice", roles=("finance",))
            denied = await http.post(
                f"/v1/interrupts/{pending['interrupt_id']}/deny",
                json={"reason": "not this supplier"},
                headers=alice,
            )
            assert denied.status_code == 200 and denied.json()["denied"] is True
            done = await finished(http, run_id)
            assert done["status"] == "completed"
            assert paid(payments) == ""  # the payment never happened
            events = (await http.get(f"/v1/runs/{run_id}/events", params={"limit": 1000})).json()
            assert any(
                e["type"] == "approval_denied" and e["reason"] == "not this supplier"
                for e in events["events"]
            )


async def test_answer_over_http(tmp_path: Path, payments: Path) -> None:
    with serving(config(tmp_path)) as base:
        bob = await token_for(store_of(tmp_path), user="bob")
        async with httpx.AsyncClient(base_url=base, timeout=60, headers=bob) as http:
            run_id, pending = await waiting_run(http, "asker")
            assert (pending["kind"], pending["prompt"]) == (
                "missing_information",
                "Which warehouse?",
            )
            answer = f"/v1/interrupts/{pending['interrupt_id']}/answer"
            invalid = await http.post(answer, json={"value": {"colour": 1}})
            assert invalid.status_code == 422
            assert invalid.json()["error"]["code"] == "answer_invalid"
            missing = await http.post(answer, json={})
            assert missing.status_code == 422
            assert missing.json()["error"]["problems"] == [
                {"where": "body.value", "problem": "Field required"}
            ]

            answered = await http.post(answer, json={"value": "north", "answered_by": "eve"})
            assert answered.status_code == 200, answered.text
            assert answered.json()["answer"] == {"value": "north"}
            done = await finished(http, run_id)
            assert (done["status"], done["output"]) == ("completed", "thanks")
            events = (await http.get(f"/v1/runs/{run_id}/events", params={"limit": 1000})).json()
            (answered_event,) = [e for e in events["events"] if e["type"] == "interrupt_answered"]
            assert answered_event["answered_by"] == "bob"  # the token's user, not the body's
