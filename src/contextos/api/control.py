"""`POST /v1/runs/{id}/pause`, `…/resume`, `…/messages` and `…/finish`: a person's hand on a
run.

Pausing stops the run at its next step boundary (its driver, wherever it runs, takes the
request in there); resuming queues a paused run for the workers; a message continues a paused
run or a conversation that answered, as the same run, queued for the workers. Each answers the
run as it stands.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Request

from contextos import Agent
from contextos.api.auth import PrincipalDep, run_of
from contextos.api.config import Api
from contextos.api.schemas import PauseRun, SendMessage, run_view

router = APIRouter()


@router.post("/v1/runs/{run_id}/pause")
async def pause_run(
    request: Request,
    principal: PrincipalDep,
    run_id: str,
    body: Annotated[PauseRun | None, Body()] = None,
) -> dict[str, Any]:
    """Pause the run at its next step boundary; `status` says `running` until its driver
    has taken the request in, then `paused`."""
    api: Api = request.app.state.api
    state = await run_of(api, principal, run_id)
    await api.runtime.pause(state.run_id, reason=body.reason if body else "", actor=principal.ref)
    return run_view(await api.runtime.state(state.run_id))


@router.post("/v1/runs/{run_id}/resume", status_code=202)
async def resume_run(request: Request, principal: PrincipalDep, run_id: str) -> dict[str, Any]:
    """Let a paused run go on: it is queued for a worker, which drives it on from where it
    paused (a workflow, its paused children with it). 409 `control_refused` unless it is
    paused."""
    api: Api = request.app.state.api
    state = await run_of(api, principal, run_id)
    await api.runtime.unpause(state.run_id, actor=principal.ref)
    return run_view(await api.runtime.state(state.run_id))


@router.post("/v1/runs/{run_id}/messages", status_code=202)
async def send_message(
    request: Request, principal: PrincipalDep, run_id: str, body: SendMessage
) -> dict[str, Any]:
    """Add the person's next message and queue the run for a worker to answer it; follow
    it on `GET /v1/runs/{id}/events/stream`, or poll the run until it is `input_required`
    (answered) again."""
    api: Api = request.app.state.api
    state = await run_of(api, principal, run_id)
    await api.runtime.send(state.run_id, body.message, actor=principal.ref, drive=False)
    return run_view(await api.runtime.state(state.run_id))


@router.post("/v1/runs/{run_id}/finish")
async def finish_run(request: Request, principal: PrincipalDep, run_id: str) -> dict[str, Any]:
    """Close a conversation that answered as completed: its last answer becomes the run's
    output. 409 `control_refused` for any other run."""
    api: Api = request.app.state.api
    state = await run_of(api, principal, run_id)
    agent = api.agents.get(state.agent_ref or "")
    conversing = agent if isinstance(agent, Agent) else None  # a workflow does not converse
    await api.runtime.finish(state.run_id, actor=principal.ref, agent=conversing)
    return run_view(await api.runtime.state(state.run_id))


__all__ = ["router"]
