"""`POST /v1/hooks/NAME`: a webhook trigger starts a run with the request body as its input.

Checked in this order, before anything is written: the trigger exists and is a webhook, the
delivery id is there, (when the trigger has a secret) the signature matches the body and was
made within the tolerance window, and the body is text. (The server refused an oversized body
before any of this.) A delivery whose id or signature was seen before returns the run it
started: a replayed capture starts nothing.
"""

from __future__ import annotations

import os
from typing import Annotated, Any

from fastapi import APIRouter, Header, Request
from fastapi.responses import JSONResponse

from contextos.api.errors import ApiError
from contextos.workers import (
    DELIVERY_HEADER,
    SIGNATURE_HEADER,
    TriggerKind,
    fire_webhook,
    list_triggers,
    verify_signature,
)

router = APIRouter()

_MAX_DELIVERY_ID = 200


@router.post(
    "/v1/hooks/{name}",
    status_code=202,
    openapi_extra={
        "requestBody": {
            "description": "Any UTF-8 text (usually JSON): the input of the run it starts.",
            "content": {"application/json": {"schema": {}}, "text/plain": {"schema": {}}},
        }
    },
)
async def webhook(
    name: str,
    request: Request,
    delivery_header: Annotated[
        str, Header(alias=DELIVERY_HEADER, description="This delivery's unique id.")
    ] = "",
    signature_header: Annotated[
        str | None,
        Header(alias=SIGNATURE_HEADER, description="t=UNIX_SECONDS,v1=HEX; see docs/api.md."),
    ] = None,
) -> JSONResponse:
    api = request.app.state.api
    runtime = api.runtime
    trigger = next((t for t in await list_triggers(runtime.store) if t.name == name), None)
    if trigger is None or trigger.kind is not TriggerKind.WEBHOOK:
        raise ApiError(
            404,
            "unknown_webhook",
            f"no webhook trigger named {name!r}",
            hint="Add one with `contextos trigger add NAME AGENT_REF --webhook`.",
            trigger=name,
        )
    body = await request.body()
    delivery = delivery_header.strip()
    if not delivery or len(delivery) > _MAX_DELIVERY_ID or not delivery.isprintable():
        raise ApiError(
            400,
            "missing_delivery_id",
            f"the {DELIVERY_HEADER} header must carry this delivery's unique id "
            f"(1 to {_MAX_DELIVERY_ID} printable characters)",
            hint="Send the same id when you retry a delivery: it starts one run, once.",
        )
    signature = None
    if trigger.secret_env is not None:
        secret = os.environ.get(trigger.secret_env)
        if not secret:
            raise ApiError(
                503,
                "webhook_secret_missing",
                f"webhook {name!r} is signed with ${trigger.secret_env}, which is not set "
                "on this server",
                hint=f"Set {trigger.secret_env} in the environment of `contextos serve`.",
            )
        signature = verify_signature(
            secret,
            body,
            signature_header,
            tolerance_s=api.config.webhook_tolerance_s,
        )
    text = _text(body)
    run_id, created = await fire_webhook(
        runtime, trigger, text, delivery=delivery, signature=signature, agents=api.agents
    )
    payload: dict[str, Any] = {
        "run_id": run_id,
        "trigger": name,
        "delivery": delivery,
        "duplicate": not created,
    }
    return JSONResponse(payload, status_code=202 if created else 200)


def _text(body: bytes) -> str:
    """The body as a run's input: UTF-8 text without NUL (which no store keeps in text)."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        problem = f"is not UTF-8 text (byte {exc.start})"
    else:
        if "\x00" not in text:
            return text
        problem = f"holds a NUL character (byte {body.index(0)})"
    raise ApiError(
        400,
        "body_not_text",
        f"the body {problem}",
        hint="Webhook bodies become the run's input: send JSON or other UTF-8 text.",
    )


__all__ = ["router"]
