"""The one door every tool call goes through: look-up, validation, policy, dispatch, rendering.

Anything the model got wrong (unknown tool, malformed or invalid arguments) comes back as a
`ToolOutcome` the model can read and correct, never as a crash. The durable sequence around
these steps (recording the decision, the effect ledger, retries, reconciliation) is driven by
`contextos.tools.effects.ToolRunner`; `Gateway.call` is the same path without a journal.
"""

from __future__ import annotations

import json
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ValidationError

from contextos.errors import (
    ContentBlocked,
    ToolArgumentsInvalid,
    ToolCrashed,
    ToolOutcomeUnknown,
    ToolOutputInvalid,
)
from contextos.messages import ToolCall, ToolSpec
from contextos.policy.hook import PolicyHook, ProposedCall
from contextos.records.decisions import Decision, PolicyDecision
from contextos.tools._invoke import CallTimedOut, error_text, invoke, safe_text
from contextos.tools.arguments import check_finite, decode
from contextos.tools.contract import Tool, ToolContext, ToolResult, manifest_hash


@dataclass(frozen=True, kw_only=True, slots=True)
class ToolOutcome:
    """What came of one tool call, ready to be recorded and shown to the model."""

    output: str
    """Text the model sees (truncated with a note when huge)."""
    is_error: bool = False
    """True when `output` explains an error."""
    error_code: str | None = None
    """Stable code: unknown_tool, invalid_arguments, tool_timeout, tool_error, tool_crashed,
    tool_output_invalid, policy_denied, approval_required, outcome_unknown, not_committed."""
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
        shown: Collection[str] | None = None,
    ) -> None:
        """`shown` names the tools the model is told about (None: all of them); the others
        stay in the manifest, so a call to one is still decided (and refused) by policy."""
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
        self.manifest_hash = manifest_hash(list(self.tools.values()))
        self._specs = tuple(
            t.spec() for t in self.tools.values() if shown is None or t.name in shown
        )

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
        return tool.proposal(run_id, call.id, args.model_dump(mode="json"))

    def validated(self, name: str, arguments: Mapping[str, Any]) -> Mapping[str, Any]:
        """A recorded call's arguments as its tool validates them (as given, when they do not
        validate or the tool is gone): what the policy gate compares a new call with."""
        tool = self.tools.get(name)
        if tool is None:
            return arguments
        try:
            validated: Mapping[str, Any] = tool.args_model.model_validate(arguments).model_dump(
                mode="json"
            )
        except ValidationError:
            return arguments
        return validated

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
        """Run the tool once within its time limit; its exceptions propagate to the caller.

        Whatever the tool ends with that is not an `Exception` (SystemExit, KeyboardInterrupt,
        a CancelledError the runtime did not cause) comes out as `ToolCrashed`. A call past its
        limit raises TimeoutError and is let go: a sync tool's thread is left to finish on its
        own, an async tool that ignores its cancellation is abandoned after `CANCEL_GRACE_S`,
        and an async tool that held the event loop past its limit counts as timed out although
        it returned. Neither can be stopped for sure, which is why a timed-out call to a tool
        with effects counts as an unknown outcome rather than a failure.
        """
        kwargs = {name: getattr(args, name) for name in type(args).model_fields}
        if args.model_extra:  # tools described by a JSON schema only (MCP) keep every argument
            kwargs.update(args.model_extra)
        if tool.context_param:
            kwargs[tool.context_param] = ctx
        if tool.idempotency_arg:
            kwargs[tool.idempotency_arg] = ctx.idempotency_key
        limit = tool.timeout_s if timeout_s is None else min(tool.timeout_s, timeout_s)
        return await invoke(tool.name, tool.fn, (), kwargs, max(limit, 0))

    async def reconcile(self, tool: Tool, idempotency_key: str) -> Any:
        """Ask the tool what became of the call with this key (None: it never took effect)."""
        if tool.reconcile is None:
            raise ValueError(f"tool {tool.name} has no reconcile")
        return await invoke(
            f"{tool.name}.reconcile", tool.reconcile, (idempotency_key,), {}, tool.timeout_s
        )

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
            r = self.render(await self.dispatch(found, args, ctx), found)
        except TimeoutError as exc:
            return error_outcome("tool_timeout", timeout_message(found, exc), started=started)
        except ToolOutcomeUnknown as exc:
            return error_outcome(
                "outcome_unknown", f"{found.name}: {safe_text(exc)}", started=started
            )
        except Exception as exc:  # the tool's failure goes back to the model
            return failure_outcome(found, exc, started=started)
        return ToolOutcome(
            output=r.text,
            truncated=r.truncated,
            receipts={**safe_receipts(ctx.receipts), **r.receipts},
            duration_ms=(time.perf_counter() - started) * 1000,
        )

    def render(self, result: Any, tool: Tool) -> Rendered:
        """The model-visible text of a tool's result, cut to the tool's `max_output_chars`.

        Raises ToolOutputInvalid when the result has no text that can be recorded.
        """
        receipts: dict[str, str] = {}
        if isinstance(result, ToolResult):
            receipts = safe_receipts(result.receipts)
            result = result.output
        text = render_output(result)
        limit = tool.max_output_chars
        truncated = len(text) > limit
        if truncated:
            text = text[:limit] + f"\n[output truncated: showing {limit} of {len(text)} characters]"
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ToolOutputInvalid(
                f"its output is not valid Unicode text ({exc.reason} at character "
                f"{exc.start}); it was not recorded",
                tool=tool.name,
            ) from None
        return Rendered(text=text, truncated=truncated, receipts=receipts)


def render_output(result: Any) -> str:
    """A tool's result as text: strings as they are, anything else as JSON.

    Raises ToolOutputInvalid when it cannot be (a cyclic structure, a `__str__` that raises).
    """
    try:
        if isinstance(result, str):
            return result
        if isinstance(result, BaseModel):
            return result.model_dump_json()
        return json.dumps(result, default=str, ensure_ascii=False)
    except BaseException as exc:  # user code runs here (__str__, serializers): no await, so
        # not even a CancelledError can be the runtime's
        raise ToolOutputInvalid(
            f"its output could not be turned into text: {error_text(exc)}"
        ) from exc


def safe_receipts(receipts: Mapping[Any, Any]) -> dict[str, str]:
    """Receipts a tool gave, as text fit to be recorded."""
    return {safe_text(k): safe_text(v) for k, v in receipts.items()}


def timeout_message(tool: Tool, exc: TimeoutError) -> str:
    if isinstance(exc, CallTimedOut):
        return f"{exc}."
    return f"{tool.name} did not finish within its time limit ({tool.timeout_s:g}s)."


def unshowable_outcome(
    tool: Tool, exc: ToolOutputInvalid, receipts: Mapping[Any, Any], duration_ms: float = 0.0
) -> ToolOutcome:
    """A call that returned, so took effect, but whose result cannot be shown."""
    return ToolOutcome(
        output=f"The call to {tool.name} went through, but its result cannot be shown: "
        f"{safe_text(exc)}",
        is_error=True,
        error_code=exc.code,
        receipts=safe_receipts(receipts),
        duration_ms=duration_ms,
    )


def failure_outcome(tool: Tool, exc: Exception, *, started: float | None = None) -> ToolOutcome:
    """What the model is told about a call that raised (or whose output cannot be shown)."""
    if isinstance(exc, ToolCrashed | ToolOutputInvalid | ContentBlocked):
        code = exc.code
        message = f"{tool.name} failed: {safe_text(exc)}"
    elif isinstance(exc, ValidationError):
        code, message = "tool_error", f"{tool.name} returned data that failed validation."
    else:
        code, message = "tool_error", f"{tool.name} failed: {error_text(exc)}"
    return error_outcome(code, message, started=started)


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
