"""The scripted model: a real ModelAdapter that replays a script, for tests and demos.

It records every request it receives, fails loudly when asked for more steps than it has, and
`assert_complete()` fails when steps were left unused. With `log_path`, each request is also
appended to a JSON-lines file so tests that kill processes can count requests across them.
"""

from __future__ import annotations

import inspect
import json
import os
from collections.abc import Awaitable, Callable, Sequence
from itertools import count
from pathlib import Path
from typing import Any

from contextos.errors import ScriptExhausted
from contextos.messages import FinishReason, Message, ToolCall, Usage
from contextos.models.base import ModelRequest, ModelResponse

Step = (
    ModelResponse
    | Callable[[ModelRequest], ModelResponse]
    | Callable[[ModelRequest], Awaitable[ModelResponse]]
)
"""A response, or a function of the request giving one (a coroutine function to model a slow
provider)."""

_ids = count(1)


def reply(text: str, *, input_tokens: int = 10, output_tokens: int = 5) -> ModelResponse:
    """A step that answers with text and ends the turn."""
    return ModelResponse(
        message=Message(role="assistant", content=text),
        finish_reason=FinishReason.STOP,
        usage=Usage(input_tokens=input_tokens, output_tokens=output_tokens, requests=1),
        model="scripted",
    )


def call_tool(
    name: str,
    arguments: dict[str, Any] | str | None = None,
    *,
    call_id: str | None = None,
    input_tokens: int = 10,
    output_tokens: int = 5,
) -> ModelResponse:
    """A step that calls one tool. A string `arguments` is sent verbatim (even if not JSON)."""
    raw = arguments if isinstance(arguments, str) else json.dumps(arguments or {})
    return call_tools(
        [(name, raw, call_id)], input_tokens=input_tokens, output_tokens=output_tokens
    )


def call_tools(
    calls: Sequence[tuple[str, str, str | None]],
    *,
    input_tokens: int = 10,
    output_tokens: int = 5,
) -> ModelResponse:
    """A step that calls several tools at once: (name, raw JSON arguments, call id or None)."""
    tool_calls = tuple(
        ToolCall(id=cid or f"call_{next(_ids)}", name=name, arguments=raw)
        for name, raw, cid in calls
    )
    return ModelResponse(
        message=Message(role="assistant", tool_calls=tool_calls),
        finish_reason=FinishReason.TOOL_CALLS,
        usage=Usage(input_tokens=input_tokens, output_tokens=output_tokens, requests=1),
        model="scripted",
    )


class ScriptedModel:
    """Replays `steps` in order, one per call.

    With `by_turn=True` the step is chosen by the request's turn number instead of by call
    order, so a process that resumes a run mid-way gets the step for the turn it is on.
    """

    def __init__(
        self,
        steps: Sequence[Step],
        *,
        name: str = "scripted",
        by_turn: bool = False,
        log_path: str | Path | None = None,
    ) -> None:
        self.name = name
        self.steps = list(steps)
        self.by_turn = by_turn
        self.log_path = Path(log_path) if log_path else None
        self.requests: list[ModelRequest] = []

    async def complete(self, request: ModelRequest) -> ModelResponse:
        index = request.turn - 1 if self.by_turn else len(self.requests)
        self.requests.append(request)
        if self.log_path is not None:
            line = json.dumps({"run_id": request.run_id, "turn": request.turn, "pid": os.getpid()})
            with self.log_path.open("a") as f:
                f.write(line + "\n")
                f.flush()
                os.fsync(f.fileno())
        if not 0 <= index < len(self.steps):
            raise ScriptExhausted(
                f"scripted model has {len(self.steps)} steps but was asked for step {index + 1}",
                requests=len(self.requests),
            )
        step = self.steps[index]
        response = step(request) if callable(step) else step
        if inspect.isawaitable(response):
            response = await response
        if not response.model:
            return ModelResponse(
                message=response.message,
                finish_reason=response.finish_reason,
                usage=response.usage,
                model=self.name,
                request_id=response.request_id,
            )
        return response

    def assert_complete(self) -> None:
        """Fail if some steps were never used."""
        used = len(self.requests)
        if used < len(self.steps):
            raise AssertionError(f"scripted model used {used} of {len(self.steps)} steps")
