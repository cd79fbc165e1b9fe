"""The improvement loop over HTTP: read findings, proposals, candidates and the release line;
approve a release (as a releaser the request named); roll an agent back.

The loop reads every tenant's runs, so it is for operators: tokens of the default tenant with
the `releaser` role. Anyone else gets 403, and an interrupt of another tenant does not exist.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, ConfigDict

from contextos import Principal
from contextos.api.auth import PrincipalDep, interrupt_of
from contextos.api.errors import ApiError
from contextos.improve import RELEASER, Decided, Improvements

router = APIRouter()

DEFAULT_TENANT = "default"
"""The operators' tenant: the one a principal has unless its token names another."""


class Rollback(BaseModel):
    model_config = ConfigDict(extra="forbid")

    reason: str = ""


def _operator(principal: PrincipalDep) -> Principal:
    if RELEASER not in principal.roles or principal.tenant != DEFAULT_TENANT:
        raise ApiError(
            403,
            "not_a_releaser",
            f"{principal.id} of tenant {principal.tenant} may not use the improvement loop",
            hint=f"Use a token of the default tenant with the role {RELEASER}: "
            f"`contextos token create --tenant default --user NAME --role {RELEASER}`.",
        )
    return principal


Operator = Annotated[Principal, Depends(_operator)]


def _loop(request: Request) -> Improvements:
    return Improvements(request.app.state.api.runtime)


def _decided(d: Decided) -> dict[str, Any]:
    return {**d.decision.model_dump(mode="json"), "run_id": d.run_id, "seq": d.seq, "at": d.at}


@router.get("/v1/findings")
async def findings(request: Request, principal: Operator) -> dict[str, Any]:
    review = await _loop(request).review()
    return {
        "runs_read": review.runs_read,
        "findings": [f.model_dump(mode="json") for f in review.findings],
    }


@router.get("/v1/proposals")
async def proposals(request: Request, principal: Operator) -> dict[str, Any]:
    listed = await _loop(request).proposals()
    return {"proposals": [p.model_dump(mode="json") for p in listed]}


@router.get("/v1/candidates")
async def candidates(request: Request, principal: Operator) -> dict[str, Any]:
    found = await _loop(request).candidates()
    return {"candidates": [c.model_dump(mode="json") for c in found]}


@router.get("/v1/releases")
async def releases(
    request: Request, principal: Operator, agent: str | None = None
) -> dict[str, Any]:
    return {"decisions": [_decided(d) for d in await _loop(request).history(agent)]}


@router.post("/v1/releases/{interrupt_id}/approve")
async def approve_release(
    request: Request, principal: PrincipalDep, interrupt_id: str
) -> dict[str, Any]:
    """Approve a release as the token's user (a releaser the request named) and carry it out."""
    await interrupt_of(request.app.state.api, principal, interrupt_id)  # another tenant's: 404
    _operator(principal)
    return _decided(await _loop(request).approve(interrupt_id, approver=principal.id))


@router.post("/v1/agents/{agent}/rollback")
async def rollback(
    request: Request, principal: Operator, agent: str, body: Rollback
) -> dict[str, Any]:
    """Go back to the agent's release before the current one."""
    done = await _loop(request).rollback(agent, by=principal.id, reason=body.reason)
    return _decided(done)
