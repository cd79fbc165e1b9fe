"""`POST /v1/hooks/NAME`: a webhook trigger starts a run with the request body as its input.

Checked in this order, before anything is written: the trigger exists and is a webhook, the
body is small enough and UTF-8, the delivery id is there, and (when the trigger has a secret)
the HMAC-SHA256 signature matches. A delivery id seen before returns the run it started.
"""

from __future__ import annotations

import os
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from contextos.api.errors import ApiError
from contextos.store.queue import TriggerKind, queue_of
from contextos.triggers import DELIVERY_HEADER, SIGNATURE_HEADER, fire_webhook, signature_matches

router = APIRouter()

_MAX_DELIVERY_ID = 200


@router.post("/v1/hooks/{name}", status_code=202)
async def webhook(name: str, request: Request) -> JSONResponse:
    api = request.app.state.api
    runtime = api.runtime
    queue = queue_of(runtime.store)
    trigger = None
    if queue is not None:
        trigger = next((t for t in await queue.list_triggers() if t.name == name), None)
    if trigger is None or trigger.kind is not TriggerKind.WEBHOOK:
        raise ApiError(
            404,
            "unknown_webhook",
            f"no webhook trigger named {name!r}",
            hint="Add one with `contextos trigger add NAME AGENT_REF --webhook`.",
            trigger=name,
        )
    body = await _body(request, api.config.max_body_bytes)
    delivery = request.headers.get(DELIVERY_HEADER, "").strip()
    if not delivery or len(delivery) > _MAX_DELIVERY_ID or not delivery.isprintable():
        raise ApiError(
            400,
            "missing_delivery_id",
            f"the {DELIVERY_HEADER} header must carry this delivery's unique id "
            f"(1 to {_MAX_DELIVERY_ID} printable characters)",
            hint="Send the same id when you retry a delivery: it starts one run, once.",
        )
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
        if not signature_matches(secret, body, request.headers.get(SIGNATURE_HEADER)):
            raise ApiError(
                401,
                "bad_signature",
                f"the {SIGNATURE_HEADER} header is missing or does not match the body",
                hint="Send sha256=HEX, the HMAC-SHA256 of the exact body bytes under the "
                "shared secret.",
            )
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ApiError(
            400,
            "body_not_text",
            f"the body is not UTF-8 text (byte {exc.start})",
            hint="Webhook bodies become the run's input: send JSON or other UTF-8 text.",
        ) from exc
    run_id, created = await fire_webhook(
        runtime, trigger, text, delivery=delivery, agents=api.agents
    )
    payload: dict[str, Any] = {
        "run_id": run_id,
        "trigger": name,
        "delivery": delivery,
        "duplicate": not created,
    }
    return JSONResponse(payload, status_code=202 if created else 200)


async def _body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _too_large(limit)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise _too_large(limit)
        chunks.append(chunk)
    return b"".join(chunks)


def _too_large(limit: int) -> ApiError:
    return ApiError(
        413,
        "body_too_large",
        f"the body is larger than {limit} bytes",
        hint="Send a reference to large data instead of the data.",
    )


__all__ = ["router"]
