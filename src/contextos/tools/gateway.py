"""The one door every tool call goes through: look-up, validation, dispatch, result.

Anything the model got wrong (unknown tool, malformed or invalid arguments) and anything a tool
raised comes back as a `ToolOutcome` the model can read and correct, never as a crash.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError

from contextos.messages import ToolCall, ToolSpec
from contextos.tools.contract import Tool, ToolContext, manifest_hash

DEFAULT_MAX_OUTPUT_CHARS = 16_000


@dataclass(frozen=True, kw_only=True, slots=True)
class ToolOutcome:
    """What came of one tool call, ready to be recorded and shown to the model."""

    output: str
    """Text the model sees (truncated with a note when huge)."""
    is_error: bool = False
    """True when `output` explains an error."""
    error_code: str | None = None
    """Stable code: unknown_tool, invalid_arguments, tool_timeout, tool_error."""
    truncated: bool = False
    """True when the output was cut."""
    duration_ms: float = 0.0
    """Wall time."""


class Gateway:
    """Validates and dispatches tool calls against a fixed manifest of tools."""

    def __init__(
        self, tools: Sequence[Tool], *, max_output_chars: int = DEFAULT_MAX_OUTPUT_CHARS
    ) -> None:
        self.tools: dict[str, Tool] = {}
        for t in tools:
            if t.name in self.tools:
                raise ValueError(f"two tools are named {t.name!r}")
            self.tools[t.name] = t
        self.max_output_chars = max_output_chars
        self.manifest_hash = manifest_hash(list(self.tools.values()))
        self._specs = tuple(t.spec() for t in self.tools.values())

    def specs(self) -> tuple[ToolSpec, ...]:
        return self._specs

    def parse(self, call: ToolCall) -> tuple[Tool, BaseModel] | ToolOutcome:
        """Find the tool and validate the arguments, or explain what is wrong."""
        found = self.tools.get(call.name)
        if found is None:
            names = ", ".join(sorted(self.tools)) or "none"
            return _error(
                "unknown_tool", f"There is no tool named {call.name!r}. Available tools: {names}."
            )
        try:
            raw = json.loads(call.arguments) if call.arguments.strip() else {}
        except json.JSONDecodeError as exc:
            return _error(
                "invalid_arguments",
                f"The arguments for {call.name} are not valid JSON ({exc.msg} at position "
                f"{exc.pos}). Send a JSON object matching the tool's schema.",
            )
        if not isinstance(raw, dict):
            return _error(
                "invalid_arguments",
                f"The arguments for {call.name} must be a JSON object, not {type(raw).__name__}.",
            )
        try:
            args = found.args_model.model_validate(raw)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or '(root)'}: {e['msg']}"
                for e in exc.errors()
            )
            return _error(
                "invalid_arguments",
                f"The arguments for {call.name} do not match its schema: {problems}. "
                "Correct them and call the tool again.",
            )
        return found, args

    async def dispatch(self, tool: Tool, args: BaseModel, ctx: ToolContext) -> Any:
        """Run the tool once within its timeout; exceptions propagate to the caller."""
        kwargs = {name: getattr(args, name) for name in type(args).model_fields}
        if tool.context_param:
            kwargs[tool.context_param] = ctx
        if tool.is_async:
            return await asyncio.wait_for(tool.fn(**kwargs), timeout=tool.timeout_s)
        # A sync tool runs in a worker thread; on timeout the thread is abandoned (Python cannot
        # kill it) and the call is reported as timed out.
        return await asyncio.wait_for(asyncio.to_thread(tool.fn, **kwargs), timeout=tool.timeout_s)

    async def call(self, call: ToolCall, ctx: ToolContext) -> ToolOutcome:
        """Parse, dispatch and render one call."""
        started = time.perf_counter()
        parsed = self.parse(call)
        if isinstance(parsed, ToolOutcome):
            return parsed
        found, args = parsed
        try:
            result = await self.dispatch(found, args, ctx)
        except TimeoutError:
            return _error(
                "tool_timeout",
                f"{found.name} did not finish within {found.timeout_s:g}s.",
                started=started,
            )
        except Exception as exc:  # the tool's failure goes back to the model
            return _error(
                "tool_error", f"{found.name} failed: {type(exc).__name__}: {exc}", started=started
            )
        return self.render(result, started=started)

    def render(self, result: Any, *, started: float) -> ToolOutcome:
        text = render_output(result)
        truncated = len(text) > self.max_output_chars
        if truncated:
            kept = self.max_output_chars
            text = text[:kept] + f"\n[output truncated: showing {kept} of {len(text)} characters]"
        return ToolOutcome(
            output=text, truncated=truncated, duration_ms=(time.perf_counter() - started) * 1000
        )


def render_output(result: Any) -> str:
    if isinstance(result, str):
        return result
    if isinstance(result, BaseModel):
        return result.model_dump_json()
    return json.dumps(result, default=str, ensure_ascii=False)


def _error(code: str, message: str, *, started: float | None = None) -> ToolOutcome:
    duration = (time.perf_counter() - started) * 1000 if started is not None else 0.0
    return ToolOutcome(output=message, is_error=True, error_code=code, duration_ms=duration)
