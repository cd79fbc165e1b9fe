"""The one door every tool call goes through: look-up, validation, policy, dispatch, rendering.

Anything the model got wrong (unknown tool, malformed or invalid arguments) comes back as a
`ToolOutcome` the model can read and correct, never as a crash. The durable sequence around
these steps (recording the decision, the effect ledger, retries, reconciliation) is driven by
`contextos.tools.effects.ToolRunner`; `Gateway.call` is the same path without a journal.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ValidationError

from contextos.errors import ToolArgumentsInvalid, ToolOutcomeUnknown
from contextos.messages import ToolCall, ToolSpec
from contextos.policy.decision import Decision, PolicyDecision, PolicyHook, ProposedCall
from contextos.tools.arguments import check_finite, decode
from contextos.tools.contract import Tool, ToolContext, ToolResult, manifest_hash

DEFAULT_MAX_OUTPUT_CHARS = 16_000


@dataclass(frozen=True, kw_only=True, slots=True)
class ToolOutcome:
    """What came of one tool call, ready to be recorded and shown to the model."""

    output: str
    """Text the model sees (truncated with a note when huge)."""
    is_error: bool = False
    """True when `output` explains an error."""
    error_code: str | None = None
    """Stable code: unknown_tool, invalid_arguments, tool_timeout, tool_error, policy_denied,
    approval_required, outcome_unknown, not_committed."""
    truncated: bool = False
    """True when the output was cut."""
    duration_ms: float = 0.0
    """Wall time."""
    receipts: dict[str, str] = field(default_factory=dict)
    """Receipts the tool returned or put on its context."""
    untrusted: bool = True
    """Tool output is outside data: the context layer must never treat it as instructions."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Rendered:
    """A tool's return value turned into model-visible text."""

    text: str
    """The text (cut to the limit, with a note, when huge)."""
    truncated: bool
    """True when it was cut."""
    receipts: dict[str, str]
    """Receipts from a returned ToolResult."""


class Gateway:
    """Validates, authorises and dispatches tool calls against a fixed manifest of tools."""

    def __init__(
        self,
        tools: Sequence[Tool],
        *,
        policy: PolicyHook | None = None,
        max_output_chars: int = DEFAULT_MAX_OUTPUT_CHARS,
    ) -> None:
        self.tools: dict[str, Tool] = {}
        for t in tools:
            if t.name in self.tools:
                raise ValueError(f"two tools are named {t.name!r}")
            self.tools[t.name] = t
        for t in self.tools.values():
            if t.compensation is not None and t.compensation not in self.tools:
                raise ValueError(
                    f"tool {t.name!r} names compensation {t.compensation!r}, which is not among "
                    "the run's tools"
                )
        self.policy = policy
        self.max_output_chars = max_output_chars
        self.manifest_hash = manifest_hash(list(self.tools.values()))
        self._specs = tuple(t.spec() for t in self.tools.values())

    def specs(self) -> tuple[ToolSpec, ...]:
        return self._specs

    def manifest(self) -> dict[str, str]:
        """Tool name -> contract hash: what the manifest hash covers."""
        return {name: t.contract_hash() for name, t in sorted(self.tools.items())}

    # -- look-up and validation -----------------------------------------------------------

    def parse(self, call: ToolCall) -> tuple[Tool, BaseModel] | ToolOutcome:
        """Find the tool and validate the arguments, or explain what is wrong."""
        found = self.tools.get(call.name)
        if found is None:
            names = ", ".join(sorted(self.tools)) or "none"
            return error_outcome(
                "unknown_tool", f"There is no tool named {call.name!r}. Available tools: {names}."
            )
        try:
            raw = decode(
                call.arguments,
                tool=call.name,
                max_depth=found.max_arg_depth,
                max_bytes=found.max_arg_bytes,
            )
        except ToolArgumentsInvalid as exc:
            return error_outcome("invalid_arguments", exc.message)
        if not isinstance(raw, dict):
            return error_outcome(
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
            return error_outcome(
                "invalid_arguments",
                f"The arguments for {call.name} do not match its schema: {problems}. "
                "Correct them and call the tool again.",
            )
        try:
            check_finite(args.model_dump(), tool=call.name)
        except ToolArgumentsInvalid as exc:
            return error_outcome("invalid_arguments", exc.message)
        return found, args

    # -- policy ---------------------------------------------------------------------------

    def propose(self, run_id: str, call: ToolCall, tool: Tool, args: BaseModel) -> ProposedCall:
        return ProposedCall(
            run_id=run_id,
            call_id=call.id,
            tool=tool.name,
            arguments=args.model_dump(mode="json"),
            effect=tool.effect.value,
            risk=tool.risk.value,
            scopes=tool.scopes,
            data_classification=tool.data_classification,
        )

    async def decide(self, proposal: ProposedCall) -> PolicyDecision:
        """Ask the policy hook; without one every call is allowed (and says so)."""
        if self.policy is None:
            return PolicyDecision.allow(rule_ids=("no_policy",))
        try:
            return await self.policy.evaluate(proposal)
        except Exception as exc:  # a broken policy must fail closed, never open
            return PolicyDecision(
                decision=Decision.DENY,
                rule_ids=("policy_error",),
                reasons=(f"the policy could not decide: {type(exc).__name__}: {exc}",),
            )

    # -- dispatch -------------------------------------------------------------------------

    async def dispatch(
        self, tool: Tool, args: BaseModel, ctx: ToolContext, *, timeout_s: float | None = None
    ) -> Any:
        """Run the tool once within its timeout; exceptions propagate to the caller.

        A sync tool runs in a worker thread; on timeout the thread is abandoned (Python cannot
        kill it), which is why a timed-out call to a tool with effects counts as an unknown
        outcome rather than a failure.
        """
        kwargs = {name: getattr(args, name) for name in type(args).model_fields}
        if args.model_extra:  # tools described by a JSON schema only (MCP) keep every argument
            kwargs.update(args.model_extra)
        if tool.context_param:
            kwargs[tool.context_param] = ctx
        if tool.idempotency_arg:
            kwargs[tool.idempotency_arg] = ctx.idempotency_key
        limit = tool.timeout_s if timeout_s is None else min(tool.timeout_s, timeout_s)
        # A timeout scope, not wait_for: the tool runs in the caller's task, with no task of
        # its own to create and schedule on every call.
        async with asyncio.timeout(max(limit, 0)):
            if tool.is_async:
                return await tool.fn(**kwargs)
            return await asyncio.to_thread(tool.fn, **kwargs)

    async def reconcile(self, tool: Tool, idempotency_key: str) -> Any:
        """Ask the tool what became of the call with this key (None: it never took effect)."""
        if tool.reconcile is None:
            raise ValueError(f"tool {tool.name} has no reconcile")
        result = tool.reconcile(idempotency_key)
        if inspect.isawaitable(result):
            result = await asyncio.wait_for(result, timeout=tool.timeout_s)
        return result

    async def call(self, call: ToolCall, ctx: ToolContext) -> ToolOutcome:
        """Parse, authorise, dispatch once and render one call, recording nothing.

        Runs use the journaled path (`ToolRunner`); this is for scripts and tests that want a
        tool's answer without a run.
        """
        started = time.perf_counter()
        parsed = self.parse(call)
        if isinstance(parsed, ToolOutcome):
            return parsed
        found, args = parsed
        decision = await self.decide(self.propose(ctx.run_id, call, found, args))
        if decision.decision in (Decision.DENY, Decision.REQUIRE_APPROVAL):
            return refusal_outcome(found.name, decision)
        try:
            result = await self.dispatch(found, args, ctx)
        except TimeoutError:
            return error_outcome(
                "tool_timeout",
                f"{found.name} did not finish within {found.timeout_s:g}s.",
                started=started,
            )
        except ToolOutcomeUnknown as exc:
            return error_outcome("outcome_unknown", f"{found.name}: {exc}", started=started)
        except Exception as exc:  # the tool's failure goes back to the model
            return error_outcome(
                "tool_error", f"{found.name} failed: {type(exc).__name__}: {exc}", started=started
            )
        r = self.render(result)
        return ToolOutcome(
            output=r.text,
            truncated=r.truncated,
            receipts={**ctx.receipts, **r.receipts},
            duration_ms=(time.perf_counter() - started) * 1000,
        )

    def render(self, result: Any) -> Rendered:
        receipts: dict[str, str] = {}
        if isinstance(result, ToolResult):
            receipts = {str(k): str(v) for k, v in result.receipts.items()}
            result = result.output
        text = render_output(result)
        truncated = len(text) > self.max_output_chars
        if truncated:
            kept = self.max_output_chars
            text = text[:kept] + f"\n[output truncated: showing {kept} of {len(text)} characters]"
        return Rendered(text=text, truncated=truncated, receipts=receipts)


def render_output(result: Any) -> str:
    if isinstance(result, str):
        return result
    if isinstance(result, BaseModel):
        return result.model_dump_json()
    return json.dumps(result, default=str, ensure_ascii=False)


def refusal_outcome(tool: str, decision: PolicyDecision) -> ToolOutcome:
    why = "; ".join(decision.reasons) or "no reason given"
    if decision.decision is Decision.REQUIRE_APPROVAL:
        return error_outcome(
            "approval_required",
            f"The call to {tool} needs a person's approval, and none can be collected here "
            f"({why}). It was not made.",
        )
    return error_outcome("policy_denied", f"Policy does not allow this call to {tool}: {why}.")


def error_outcome(code: str, message: str, *, started: float | None = None) -> ToolOutcome:
    duration = (time.perf_counter() - started) * 1000 if started is not None else 0.0
    return ToolOutcome(output=message, is_error=True, error_code=code, duration_ms=duration)
