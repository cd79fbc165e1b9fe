"""Request bodies (Pydantic, unknown fields refused) and the JSON views of runs and events."""

from __future__ import annotations

import dataclasses
import math
from datetime import datetime
from enum import Enum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from contextos import PRIORITIES, RunState, RunSummary
from contextos.workers import started_by

MAX_DEPTH = 32
"""How deep objects and arrays may nest in a request body."""

_NOT_TEXT = "it holds a NUL character or a lone surrogate, which no store keeps as text"


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _keepable(cls, data: Any) -> Any:
        problem = _unkeepable(data)
        if problem is not None:
            raise ValueError(problem)
        return data


def _unkeepable(value: Any) -> str | None:
    """Why a parsed JSON body cannot be kept as it is, or None: NaN and infinities (which
    Python's JSON reader lets through), NUL characters and lone surrogates, nesting past
    MAX_DEPTH."""
    todo: list[tuple[Any, str, int]] = [(value, "", 0)]  # no recursion: depth is the attack
    while todo:
        item, where, depth = todo.pop()
        at = where or "the body"
        if depth > MAX_DEPTH:
            return f"{at.split('.')[0].split('[')[0]} nests deeper than {MAX_DEPTH} levels"
        if isinstance(item, float) and not math.isfinite(item):
            return f"{at} is {item}, which is not a JSON number; send a finite number"
        if isinstance(item, str) and not _is_text(item):
            return f"{at} is not text: {_NOT_TEXT}"
        if isinstance(item, dict):
            for key, inner in item.items():
                if not _is_text(str(key)):
                    return f"a key in {at} is not text: {_NOT_TEXT}"
                todo.append((inner, f"{where}.{key}" if where else str(key), depth + 1))
        elif isinstance(item, list):
            todo.extend((inner, f"{where}[{i}]", depth + 1) for i, inner in enumerate(item))
    return None


def _is_text(s: str) -> bool:
    if "\x00" in s:
        return False
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


class StartRun(_Body):
    """`POST /v1/runs`."""

    agent: str = Field(min_length=1, description="An agent reference (or name) the server serves.")
    input: str | dict[str, Any] = Field(
        description="The task for the agent; a workflow's input as a JSON object (or as JSON text)."
    )
    metadata: dict[str, Any] = Field(default_factory=dict, description="Labels kept on the run.")
    priority: int = Field(
        default=0,
        ge=PRIORITIES.start,
        le=PRIORITIES.stop - 1,
        description="Higher is claimed first (a 32-bit integer).",
    )
    tenant: str | None = Field(
        default=None, description="The token's tenant, if given: runs start in the token's tenant."
    )


class CancelRun(_Body):
    """`POST /v1/runs/{id}/cancel` (the body is optional)."""

    reason: str = ""


class PauseRun(_Body):
    """`POST /v1/runs/{id}/pause` (the body is optional)."""

    reason: str = Field(default="", description="Why (recorded on the run).")


class SendMessage(_Body):
    """`POST /v1/runs/{id}/messages`."""

    message: str = Field(description="The person's next message to the agent.")

    @field_validator("message")
    @classmethod
    def _has_text(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("a follow-up message needs some text")
        return value


class Approve(_Body):
    """`POST /v1/interrupts/{id}/approve`."""

    approver: str | None = Field(
        default=None,
        description="Ignored: the approver is the authenticated principal (kept so that older "
        "clients still parse).",
    )
    expires_in: float | None = Field(default=None, gt=0, description="Seconds it stays valid.")
    conditions: dict[str, Any] | None = Field(
        default=None, description="What the action must still meet, e.g. max_amount."
    )
    action_hash: str | None = Field(
        default=None, description="Approve only if the frozen action has this hash."
    )


class Deny(_Body):
    """`POST /v1/interrupts/{id}/deny`."""

    approver: str | None = Field(default=None, description="Ignored, as in Approve.")
    reason: str = ""


class Answer(_Body):
    """`POST /v1/interrupts/{id}/answer`."""

    value: Any = Field(description="A word, or an object matching the answer_schema.")
    answered_by: str | None = Field(default=None, description="Ignored, as in Approve.")


def jsonable(value: Any) -> Any:
    """Dataclasses, enums and datetimes as plain JSON values."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, datetime):
        return value.isoformat()
    return value


def run_view(state: RunState) -> dict[str, Any]:
    """A run as `GET /v1/runs/{id}` shows it."""
    failure = None
    if state.failure_reason is not None or state.failure_message:
        failure = {
            "reason": state.failure_reason.value if state.failure_reason else None,
            "message": state.failure_message,
        }
    return {
        "run_id": state.run_id,
        "status": state.status.value,
        "agent": {"name": state.agent_name, "version": state.agent_version, "ref": state.agent_ref},
        "input": state.input,
        "output": state.output,
        "structured_output": jsonable(state.structured_output),
        "failure": failure,
        "turns": state.turns,
        "usage": jsonable(state.usage),
        "metadata": jsonable(state.metadata),
        "started_by": started_by(state.metadata),
        "waiting_on": sorted(state.pending_interrupts),
        "last_seq": state.seq,
        "created_at": jsonable(state.created_at),
        "updated_at": jsonable(state.updated_at),
    }


def summary_view(summary: RunSummary) -> dict[str, Any]:
    """A run as `GET /v1/runs` lists it."""
    view: dict[str, Any] = jsonable(summary)
    return view


__all__ = [
    "Answer",
    "Approve",
    "CancelRun",
    "Deny",
    "StartRun",
    "jsonable",
    "run_view",
    "summary_view",
]
