"""The improvement loop over real HTTP, for the default tenant's releasers: reading the loop,
approving a release as a releaser the request named, rolling back; refusals are JSON errors
that change nothing."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
from api_server import error_of, serving, token_for
from test_improvement_loop import seed

from contextos import Runtime
from contextos.api import ApiConfig
from contextos.improve import Improvements
from contextos.models.base import ModelRequest, ModelResponse
from contextos.testing import ScriptedModel, reply


def reworded(request: ModelRequest) -> ModelResponse:
    """A model's draft of the order desk's proposal, citing the finding's first evidence."""
    finding = json.loads(request.messages[-1].content or "")["finding"]
    first = finding["evidence"][0]
    draft = {
        "layer": "tool_description",
        "scope": "agent order-desk, tool lookup_order",
        "change": "Order ids start with ORD- (ORD-1234).",
        "rationale": "bare numbers fail",
        "impact": {"metric": "tool_error per run", "baseline": 1.0, "target": 0.0},
        "trace_refs": [f"{first['run_id']}#{first['seq']}"],
    }
    return reply(json.dumps(draft))


async def test_the_loop_over_http(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path}/runs.db"
    async with Runtime(store) as rt:
        _, golden = await seed(rt)
        loop = Improvements(rt)
        [proposal] = (await loop.scan()).proposals
        drafted = await loop.draft(proposal.finding_id, ScriptedModel([reworded]))
        candidate = await loop.candidate(proposal.proposal_id)
        report = await loop.check(candidate.candidate_id, golden=[golden])
        asked = await loop.request_release(
            candidate.candidate_id, report.report_id, releasers=("alice",)
        )
    alice = await token_for(store, user="alice", roles=("releaser",))
    bob = await token_for(store, user="bob", roles=("releaser",))  # named by no request
    carol = await token_for(store, user="carol")
    dave = await token_for(store, tenant="acme", user="dave", roles=("releaser",))
    with serving(ApiConfig(store=store)) as base:
        async with httpx.AsyncClient(base_url=base, timeout=60) as http:
            found = (await http.get("/v1/findings", headers=bob)).json()
            assert [f["subject"] for f in found["findings"]] == ["lookup_order"]
            listed = (await http.get("/v1/proposals", headers=bob)).json()["proposals"]
            assert [p["proposal_id"] for p in listed] == [
                proposal.proposal_id,
                drafted.proposal_id,  # a model's draft, listed beside the rules'
            ]
            kept = (await http.get("/v1/candidates", headers=bob)).json()["candidates"]
            assert [c["candidate_id"] for c in kept] == [candidate.candidate_id]

            refused = await http.post(f"/v1/releases/{asked.id}/approve", headers=bob)
            error_of(refused, 409, "approval_refused")  # bob is not a releaser it named
            assert (await http.get("/v1/releases", headers=bob)).json()["decisions"] == []

            done = await http.post(f"/v1/releases/{asked.id}/approve", headers=alice)
            assert done.status_code == 200, done.text
            assert done.json()["candidate_hash"] == candidate.candidate_hash

            for stranger in (carol, dave):  # no releaser role; another tenant's releaser
                for path in ("/v1/findings", "/v1/candidates", "/v1/releases"):
                    error_of(await http.get(path, headers=stranger), 403, "not_a_releaser")
                error_of(
                    await http.post("/v1/agents/order-desk/rollback", headers=stranger, json={}),
                    403,
                    "not_a_releaser",
                )
            back = await http.post(
                "/v1/agents/order-desk/rollback", headers=alice, json={"reason": "alarms"}
            )
            assert back.status_code == 200, back.text
            line = (await http.get("/v1/releases?agent=order-desk", headers=bob)).json()
            assert [d["action"] for d in line["decisions"]] == ["release", "rollback"]
            error_of(
                await http.post("/v1/releases/int_nope/approve", headers=alice),
                404,
                "interrupt_not_found",
            )
