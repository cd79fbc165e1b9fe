"""`GET /v1/runs/{id}/events/stream`: a run's events as Server-Sent Events, live.

Each event goes out once, as `id: SEQ`, `event: TYPE`, `data: {the event as stored}` plus
its readable line; a client that reconnects sends `Last-Event-ID` (what EventSource does by
itself) and gets only what came after. When the run has ended and every event was sent, an
`end` event carries its status and the stream closes.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import StreamingResponse

from contextos import RunId, Runtime
from contextos.api.auth import PrincipalDep, run_of
from contextos.api.config import MAX_SEQ, Api
from contextos.api.errors import ApiError

router = APIRouter()

POLL_S = 0.2
"""How often an open stream looks for new events."""
KEEP_ALIVE_S = 15.0
"""A comment line this often keeps proxies from closing a quiet stream."""


@router.get(
    "/v1/runs/{run_id}/events/stream",
    response_class=StreamingResponse,
    responses={200: {"content": {"text/event-stream": {}}, "description": "Server-Sent Events."}},
)
async def stream_events(
    request: Request,
    principal: PrincipalDep,
    run_id: str,
    after: Annotated[
        int, Query(ge=0, le=MAX_SEQ, description="Start after this seq (Last-Event-ID wins).")
    ] = 0,
    last_event_id: Annotated[
        str | None, Header(alias="Last-Event-ID", description="The last seq received.")
    ] = None,
) -> StreamingResponse:
    api: Api = request.app.state.api
    await run_of(api, principal, run_id)  # 404 before the stream opens
    start = after
    if last_event_id is not None:
        text = last_event_id.strip()
        if not (text.isascii() and text.isdigit() and int(text) <= MAX_SEQ):
            raise ApiError(
                422,
                "invalid_request",
                f"Last-Event-ID {last_event_id[:40]!r} is not a seq",
                hint="Send the id of the last event received (a whole number), or none.",
            )
        start = int(text)
    return StreamingResponse(
        _events(api.runtime, request, run_id, start),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


async def _events(rt: Runtime, request: Request, run_id: str, seq: int) -> AsyncIterator[str]:
    yield "retry: 1000\n\n"
    quiet = 0.0
    while not await request.is_disconnected():
        entries = await rt.timeline(run_id, after_seq=seq)
        for entry in entries:
            data = json.dumps({**entry.data, "line": entry.line}, separators=(",", ":"))
            yield f"id: {entry.seq}\nevent: {entry.type}\ndata: {data}\n\n"
            seq = entry.seq
        if entries:
            quiet = 0.0
            continue
        summary = await rt.store.get_run(RunId(run_id))
        if summary.status.is_terminal and summary.last_seq <= seq:
            end = json.dumps(
                {"run_id": run_id, "status": summary.status.value, "last_seq": seq},
                separators=(",", ":"),
            )
            yield f"event: end\ndata: {end}\n\n"
            return
        if quiet >= KEEP_ALIVE_S:
            yield ": keep-alive\n\n"
            quiet = 0.0
        await asyncio.sleep(POLL_S)
        quiet += POLL_S


__all__ = ["router"]
