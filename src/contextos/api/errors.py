"""Every error the HTTP API answers is one JSON shape: what went wrong and what to do.

    {"error": {"code": "run_not_found", "message": "no run with id 'run_x'",
               "hint": "List runs with GET /v1/runs.", ...fields}}

Request problems are 4xx and change nothing; a 5xx is the server's own fault.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from contextos import ContextOSError

log = logging.getLogger("contextos.api")


class ApiError(Exception):
    """A request the API refuses, with its HTTP status, stable code and a hint."""

    def __init__(
        self, status: int, code: str, message: str, *, hint: str = "", **fields: Any
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.hint = hint
        self.fields = fields


def error_body(code: str, message: str, hint: str = "", **fields: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"code": code, "message": message}
    if hint:
        body["hint"] = hint
    body.update(fields)
    return {"error": body}


def _respond(status: int, code: str, message: str, hint: str = "", **fields: Any) -> JSONResponse:
    return JSONResponse(error_body(code, message, hint, **fields), status_code=status)


# The runtime's errors, as HTTP: (status, hint), looked up by the error's code and then by
# the codes of the classes it derives from, so a new error in the tree answers as its family.
_RUNTIME: dict[str, tuple[int, str]] = {
    "run_not_found": (404, "List runs with GET /v1/runs."),
    "interrupt_not_found": (404, "List pending interrupts with GET /v1/interrupts."),
    "approval_refused": (
        409,
        "Read the interrupt with GET /v1/interrupts: who may approve, its action hash, "
        "and whether it is still pending.",
    ),
    "answer_invalid": (422, "Answers must match the interrupt's answer_schema."),
    "interrupt_expired": (409, "It expired unanswered; GET /v1/runs/{run_id}/events shows how."),
    "run_is_terminal": (409, "The run has ended; start a new one."),
    "concurrency_conflict": (409, "Someone changed the run at the same moment; read it and retry."),
    "agent_changed": (409, "Deploy the agent definition the run was started with."),
    "unauthenticated": (
        401,
        "Send Authorization: Bearer TOKEN with a token from `contextos token create` that "
        "has not been revoked.",
    ),
    "authority_widened": (403, "A run cannot get more authority than its parent has."),
    "containment_violation": (403, "The request reaches outside the run's containment."),
    "policy_error": (403, "See the policy the server runs under."),
    "config_error": (400, "See docs/api.md."),
    "bad_signature": (
        401,
        "Send X-ContextOS-Signature: t=UNIX_SECONDS,v1=HEX, HEX the HMAC-SHA256 of "
        '"{t}.{body}" under the shared secret (docs/api.md shows how).',
    ),
    "signature_expired": (
        401,
        "Sign each delivery, and each retry, when you send it; check the sender's clock.",
    ),
    "migration_error": (503, "Run `contextos doctor` against the store."),
    "event_decode_error": (500, "A stored event cannot be read; run `contextos doctor`."),
    "store_error": (503, "The store failed; retry, and see the server's log if it goes on."),
    "contextos_error": (400, "See docs/api.md."),
}


def _runtime_status(exc: ContextOSError) -> tuple[int, str]:
    """The HTTP status and hint of a runtime error: the nearest entry up its class tree."""
    for cls in type(exc).__mro__:
        found = _RUNTIME.get(getattr(cls, "code", ""))
        if found is not None:
            return found
    return _RUNTIME["contextos_error"]


def _problems(errors: Sequence[Any]) -> list[dict[str, str]]:
    out = []
    for e in errors:
        where = ".".join(str(part) for part in e.get("loc", ()))
        out.append({"where": where, "problem": str(e.get("msg", "invalid"))})
    return out


def install(app: FastAPI) -> None:
    """Make every error the app answers a JSON error body."""

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
        return _respond(exc.status, exc.code, exc.message, exc.hint, **exc.fields)

    @app.exception_handler(ContextOSError)
    async def _runtime_error(request: Request, exc: ContextOSError) -> JSONResponse:
        status, hint = _runtime_status(exc)
        return _respond(status, exc.code, exc.message, hint, **_plain(exc.fields))

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        for e in errors:
            if e.get("type") == "json_invalid":
                detail = (e.get("ctx") or {}).get("error", "invalid JSON")
                loc = e.get("loc", ())
                at = f" at character {loc[1]}" if len(loc) > 1 else ""
                return _respond(
                    400,
                    "malformed_json",
                    f"the request body is not valid JSON: {detail}{at}",
                    "Send a JSON object with Content-Type: application/json.",
                )
        content_type = request.headers.get("content-type", "")
        body_errors = [e for e in errors if tuple(e.get("loc", ()))[:1] == ("body",)]
        if body_errors and content_type and "json" not in content_type:
            return _respond(
                415,
                "not_json",
                f"the request body is {content_type.split(';')[0]}, not JSON",
                "Send a JSON object with Content-Type: application/json.",
            )
        problems = _problems(errors)
        listed = "; ".join(f"{p['where']}: {p['problem']}" for p in problems)
        return _respond(
            422,
            "invalid_request",
            f"the request has missing or wrong fields: {listed}",
            "See docs/api.md for each endpoint's fields.",
            problems=problems,
        )

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 404:
            return _respond(
                404,
                "not_found",
                f"no such endpoint: {request.method} {request.url.path}",
                "Endpoints live under /v1; see docs/api.md.",
            )
        if exc.status_code == 405:
            return _respond(
                405,
                "method_not_allowed",
                f"{request.method} is not allowed on {request.url.path}",
                "See docs/api.md for the methods each endpoint takes.",
            )
        return _respond(
            exc.status_code, "http_error", str(exc.detail), "See docs/api.md for each endpoint."
        )

    @app.exception_handler(Exception)
    async def _crash(request: Request, exc: Exception) -> JSONResponse:
        log.exception("%s %s failed", request.method, request.url.path)
        return _respond(
            500,
            "internal_error",
            f"the server failed: {type(exc).__name__}",
            "This is a server error; see its log.",
        )


def _plain(fields: dict[str, Any]) -> dict[str, Any]:
    """Structured error fields that JSON can carry as they are."""
    return {
        k: v
        for k, v in fields.items()
        if isinstance(v, str | int | float | bool | list | dict) or v is None
    }


__all__ = ["ApiError", "error_body", "install"]
