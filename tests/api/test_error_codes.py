"""Every error of the runtime's tree answers with its own code and the status of its family:
an error added to the tree later is a 4xx from the start, never a 500."""

from __future__ import annotations

import json
from pathlib import Path

from fastapi import FastAPI
from starlette.requests import Request

from contextos.api import ApiConfig, create_app
from contextos.errors import (
    AnswerTooLate,
    ApprovalRefused,
    ConcurrencyConflict,
    ContainmentViolation,
    ContextOSError,
    InterruptNotFound,
    MigrationError,
    PolicyError,
    RunNotFound,
    SignatureExpired,
    SignatureInvalid,
)


class ExpiryRefused(ApprovalRefused):
    """An error the tree does not have yet, under ApprovalRefused."""

    code = "approval_expiry_refused"


class SomethingNew(ContextOSError):
    code = "something_new"


async def answer(app: FastAPI, exc: ContextOSError) -> tuple[int, dict[str, object]]:
    handler = app.exception_handlers[ContextOSError]
    request = Request({"type": "http", "method": "POST", "path": "/v1/x", "headers": []})
    response = await handler(request, exc)
    error: dict[str, object] = json.loads(bytes(response.body))["error"]
    assert error["code"] == exc.code and error["message"] == exc.message and error["hint"]
    return response.status_code, error


async def test_runtime_errors_answer_as_their_family(tmp_path: Path) -> None:
    app = create_app(ApiConfig(open_access=True, store=f"sqlite:///{tmp_path}/runs.db"))
    expected = [
        (ExpiryRefused("expires_in must be a finite number of seconds"), 409),
        (ApprovalRefused("no"), 409),
        (AnswerTooLate("late"), 409),
        (InterruptNotFound("no interrupt"), 404),
        (RunNotFound("run_x"), 404),
        (ConcurrencyConflict("run_x", 3, 4), 409),
        (ContainmentViolation("outside"), 403),
        (PolicyError("policy"), 403),
        (SignatureInvalid("bad"), 401),
        (SignatureExpired("stale"), 401),
        (SomethingNew("new"), 400),
        (MigrationError("ahead"), 503),
    ]
    for exc, status in expected:
        assert (await answer(app, exc))[0] == status, exc.code
    status, error = await answer(app, ExpiryRefused("bad expiry", interrupt_id="run_x.i3"))
    assert error["interrupt_id"] == "run_x.i3"
    assert error["hint"] == (await answer(app, ApprovalRefused("x")))[1]["hint"]
