"""The middleware protocol, its input objects, and the chain that composes a stack.

A stack composes as an onion: the first layer is outermost. For one model call each layer runs
`before_model`, then `wrap_model_call(call, call_next)` around everything inside it, then
`after_model`, so "before" work happens in list order and "after" work unwinds in reverse; a
layer short-circuits by returning a result instead of calling `call_next`. Tool calls go through
`wrap_tool_call` the same way, and `after_run` unwinds once when a run ends.

Every hook takes one input object (adding a field never breaks a layer). A layer changes what
the model sees for this call only by passing a changed `ModelCall` inward (transient), or
changes what is saved by adding a record to the result (persistent: the loop appends it as an
event in the same transaction as the model's answer).

The platform layers have a fixed order (budget gate, PII redaction, untrusted-output sanitizer,
compaction, skills, profile) and domain layers may only follow them: the chain refuses any
other order, and the content guards (redaction, spotlighting) run once more just before the
model for anything an inner layer added, so nothing inside can step outside them.
"""

from __future__ import annotations

import copy
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import date, datetime
from typing import Any, ClassVar, Protocol, runtime_checkable

from pydantic import BaseModel

from contextos import events as ev
from contextos.context.compiled import CompiledContext, Entry, MappedHistory
from contextos.context.memory import Subject
from contextos.errors import ConfigError
from contextos.messages import Usage
from contextos.models.base import ModelAdapter, ModelRequest, ModelResponse, check_response
from contextos.runs import Budget, FailureReason, RunStatus
from contextos.tools.contract import Tool, ToolContext


def principal_of(metadata: Mapping[str, Any]) -> str:
    """The key a run's usage is counted under: `metadata["principal"]`, else
    `<tenant_id>/<user_id>` (`-` if unset).

    The store's daily usage counters derive the same key in SQL (see the usage migration); the
    two must stay identical. The runtime writes `principal` itself, from the bound principal
    (`kind:id@tenant`), so only a bound run's usage lands under a principal's key.
    """
    principal = metadata.get("principal")
    if principal:
        return str(principal)
    return f"{metadata.get('tenant_id') or '-'}/{metadata.get('user_id') or '-'}"


@dataclass(frozen=True, kw_only=True, slots=True)
class RunView:
    """What a layer may know about the run a call belongs to."""

    run_id: str
    """The run."""
    turn: int
    """Which model call of the run this is, from 1."""
    turns: int = 0
    """Model calls already answered."""
    usage: Usage = field(default_factory=Usage)
    """Tokens and cost spent by the run so far."""
    budget: Budget = field(default_factory=Budget)
    """The run's limits."""
    metadata: Mapping[str, Any] = field(default_factory=dict)
    """Labels given at start (`tenant_id`, `user_id`, `principal`, …)."""
    deadline_at: datetime | None = None
    """The run's deadline (UTC), when it has one."""
    bound: Mapping[str, Any] | None = None
    """The RunContext bound at start, as recorded; None for a run bound to no one."""

    @property
    def principal(self) -> str | None:
        """Who the run acts for and pays as (`kind:id@tenant`), from the bound context only."""
        if self.bound is None:
            return None
        p = self.bound["principal"]
        return f"{p['kind']}:{p['id']}@{p['tenant']}"

    @property
    def subject(self) -> Subject | None:
        """Whose memory: the bound principal's tenant and id, never labels a caller passed."""
        if self.bound is None:
            return None
        p = self.bound["principal"]
        return Subject(tenant_id=str(p["tenant"]), user_id=str(p["id"]))


def needs_principal(layers: Sequence[Middleware]) -> str | None:
    """The first layer that keys on the run's principal (memory, daily caps), if any."""
    return next((m.name for m in layers if getattr(m, "needs_principal", False)), None)


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelCall:
    """Input of the model-call hooks: the compiled context plus request options."""

    run: RunView
    """The run making the call."""
    context: CompiledContext
    """What the model will see, with lineage."""
    temperature: float | None = None
    """Sampling temperature."""
    max_output_tokens: int | None = None
    """Cap on generated tokens."""

    def with_context(self, context: CompiledContext) -> ModelCall:
        return replace(self, context=context)


@dataclass(frozen=True, kw_only=True, slots=True)
class Compacted:
    """Persistent change: older turns were summarized (becomes a ContextCompacted event)."""

    summary: str
    """The summary that replaces the turns."""
    through_seq: int
    """Seq of the last event the summary covers: the new cursor."""
    usage: Usage = field(default_factory=Usage)
    """What the summarizing call cost."""
    model: str = ""
    """Which model summarized."""
    messages: int = 0
    """How many messages were folded into the summary."""
    tokens_before: int = 0
    """Estimated tokens of what was summarized (previous summary included)."""


Record = Compacted
"""Persistent changes a layer may ask for; each becomes one event."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Stop:
    """A terminal result: the run ends here, and the model is not called."""

    reason: FailureReason
    """Why, as the run's failure reason."""
    message: str
    """Human-readable detail."""
    layer: str
    """The layer that stopped the run."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelResult:
    """Output of a model call through the stack (input of `after_model`)."""

    call: ModelCall
    """The call as the innermost handler (or the short-circuiting layer) saw it."""
    request: ModelRequest | None = None
    """The exact request the model received; None when no model was called."""
    response: ModelResponse | None = None
    """The model's answer; None when a layer answered or stopped instead."""
    stop: Stop | None = None
    """Set when a layer ended the run instead of calling the model."""
    records: tuple[Record, ...] = ()
    """Persistent changes to record with the answer."""
    manifest: tuple[dict[str, Any], ...] = ()
    """Lineage of every block the model saw."""
    context_hash: str | None = None
    """Hash of the manifest."""
    latency_ms: float = 0.0
    """Wall time of the model call itself."""
    telemetry: Mapping[str, int] = field(default_factory=dict)
    """Counts only (never content), by `layer.metric`."""

    def with_records(self, *records: Record) -> ModelResult:
        return replace(self, records=(*self.records, *records))

    def with_telemetry(self, **counts: int) -> ModelResult:
        return replace(self, telemetry={**self.telemetry, **counts})


@dataclass(frozen=True, kw_only=True, slots=True)
class ToolCallInput:
    """Input of `wrap_tool_call`: one attempt of a validated, authorised tool call."""

    run: RunView
    """The run making the call."""
    tool: Tool
    """The tool."""
    arguments: BaseModel
    """Validated arguments."""
    ctx: ToolContext
    """What the tool is told about the call (run, call id, idempotency key, attempt)."""
    timeout_s: float | None = None
    """Time left before the run's deadline, when that is shorter than the tool's own limit."""


@dataclass(frozen=True, kw_only=True, slots=True)
class RunEnd:
    """Input of `after_run`: a run stopped being driven."""

    run: RunView
    """The run."""
    status: RunStatus
    """Where it ended (completed, failed, waiting, …)."""
    events: tuple[ev.Event, ...]
    """Its whole log."""
    redact: Callable[[str], str] = str
    """The stack's PII redaction, for anything a layer persists outside the run."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Spend:
    """What one principal spent on one UTC day."""

    tokens: int = 0
    """Input plus output tokens."""
    calls: int = 0
    """Model calls (summaries included)."""
    cost_usd: float = 0.0
    """Money."""


@runtime_checkable
class DailySpend(Protocol):
    """Per-principal daily spend, kept in the store."""

    async def spent(self, principal: str, day: date) -> Spend: ...


@dataclass(frozen=True, kw_only=True, slots=True)
class Services:
    """What the runtime lends platform layers when a stack is bound to a run."""

    model: ModelAdapter
    """The agent's model (compaction summarizes with it unless given another)."""
    spend: DailySpend | None = None
    """Daily spend per principal, when the store keeps it."""


ModelHandler = Callable[[ModelCall], Awaitable[ModelResult]]
ToolHandler = Callable[[ToolCallInput], Awaitable[Any]]
"""Returns the tool's raw result (the gateway renders it); raising reports a failed attempt."""


@runtime_checkable
class Middleware(Protocol):
    """One layer of the stack. Subclass `BaseMiddleware` for pass-through defaults."""

    name: str

    def fingerprint(self) -> dict[str, Any]:
        """The configuration that changes behaviour, as JSON data (part of the agent identity)."""
        ...

    def tools(self) -> tuple[Tool, ...]:
        """Tools the layer adds to the agent (e.g. reading a skill's body)."""
        ...

    def bind(self, services: Services) -> Middleware:
        """The layer ready for one run (may return a copy holding `services`)."""
        ...

    async def before_model(self, call: ModelCall) -> ModelCall | ModelResult: ...

    async def wrap_model_call(self, call: ModelCall, call_next: ModelHandler) -> ModelResult: ...

    async def after_model(self, result: ModelResult) -> ModelResult: ...

    async def wrap_tool_call(self, call: ToolCallInput, call_next: ToolHandler) -> Any: ...

    async def after_run(self, end: RunEnd) -> None: ...


class BaseMiddleware:
    """Pass-through defaults for every hook; override the ones you need."""

    name: str = "middleware"
    platform_slot: ClassVar[int | None] = None
    """Position in the platform stack; None for domain layers."""

    def fingerprint(self) -> dict[str, Any]:
        return {}

    def tools(self) -> tuple[Tool, ...]:
        return ()

    def bind(self, services: Services) -> Middleware:
        return self

    async def before_model(self, call: ModelCall) -> ModelCall | ModelResult:
        return call

    async def wrap_model_call(self, call: ModelCall, call_next: ModelHandler) -> ModelResult:
        return await call_next(call)

    async def after_model(self, result: ModelResult) -> ModelResult:
        return result

    async def wrap_tool_call(self, call: ToolCallInput, call_next: ToolHandler) -> Any:
        return await call_next(call)

    async def after_run(self, end: RunEnd) -> None:
        return None


class ContentGuard(BaseMiddleware):
    """A platform layer that rewrites content (redaction, spotlighting).

    Besides its own hooks, the chain applies `guard` once more right before the model, so
    whatever an inner layer added passes through it too.
    """

    _mapped: dict[bool, MappedHistory] | None = None

    def bind(self, services: Services) -> Middleware:
        bound = copy.copy(self)
        bound._mapped = {}  # per run: what this guard made of the history, call and seal apart
        return bound

    def guard(self, context: CompiledContext) -> CompiledContext:
        return context

    def redact_text(self, text: str) -> str:
        return text

    def guard_history(
        self,
        context: CompiledContext,
        counts: Counter[str],
        fn: Callable[[Entry, Counter[str]], Entry],
        *,
        remember: bool = True,
    ) -> CompiledContext:
        """`context.map_history(fn)`, with each entry rewritten once per run rather than once
        per call: a run's history only grows, so a long run costs what a short one does per
        turn. `fn` counts what it found into its counter, and those counts are replayed for an
        entry seen before. The final seal before the model passes `remember=False`: it sees this
        guard's own output, which is kept apart from what the next call starts from."""
        if self._mapped is not None:
            mapped = self._mapped.get(remember)
            if mapped is None:
                mapped = self._mapped[remember] = MappedHistory(fn)
            history = mapped.map(context.history, counts)
            if history is not None:
                return replace(context, history=history)

        def once(e: Entry) -> Entry:
            found: Counter[str] = Counter()
            out = fn(e, found)
            counts.update(found)
            return out

        return context.map_history(once)


PLATFORM_LAYERS: tuple[str, ...] = (
    "budget",
    "pii",
    "sanitize",
    "compaction",
    "skills",
    "profile",
)
"""The platform stack, outermost first. Domain layers may only follow it."""


def slot_of(layer: object) -> int | None:
    slot = getattr(type(layer), "platform_slot", None)
    return slot if isinstance(slot, int) else None


def validate_stack(layers: Sequence[object]) -> None:
    """Refuse a stack whose platform layers are out of order or follow a domain layer."""
    last_slot = 0
    first_domain: str | None = None
    for layer in layers:
        if not isinstance(layer, Middleware):
            raise ConfigError(
                f"{type(layer).__name__} is not middleware (subclass BaseMiddleware)",
                layer=type(layer).__name__,
            )
        slot = slot_of(layer)
        if slot is None:
            first_domain = first_domain or layer.name
            continue
        if first_domain is not None:
            raise ConfigError(
                f"platform layer {layer.name!r} comes after domain layer {first_domain!r}; "
                "domain middleware runs inside the platform stack, so it goes at the tail",
                layer=layer.name,
            )
        if slot <= last_slot:
            raise ConfigError(
                f"platform layer {layer.name!r} is out of order or repeated; the order is "
                + " → ".join(PLATFORM_LAYERS),
                layer=layer.name,
            )
        last_slot = slot


def stack_identity(layers: Sequence[Middleware]) -> list[dict[str, Any]]:
    """The stack as JSON data, in order: what the agent identity hash covers."""
    return [
        {"layer": m.name, "platform": slot_of(m) is not None, **m.fingerprint()} for m in layers
    ]


def stack_tools(layers: Sequence[Middleware]) -> tuple[Tool, ...]:
    return tuple(t for m in layers for t in m.tools())


class Chain:
    """A stack bound to one run, composed once, outermost first."""

    def __init__(
        self,
        layers: Sequence[Middleware],
        *,
        model: ModelAdapter,
        dispatch: ToolHandler | None = None,
        services: Services | None = None,
    ) -> None:
        validate_stack(layers)
        self.model = model
        bound = [m.bind(services or Services(model=model)) for m in layers]
        self.layers: tuple[Middleware, ...] = tuple(bound)
        self.guards: tuple[ContentGuard, ...] = tuple(
            m for m in bound if isinstance(m, ContentGuard) and slot_of(m) is not None
        )
        handler: ModelHandler = self._call_model
        for layer in reversed(bound):
            handler = _model_layer(layer, handler)
        self._model_handler = handler
        tool_handler = dispatch or _no_dispatch
        for layer in reversed(bound):
            tool_handler = _tool_layer(layer, tool_handler)
        self._tool_handler = tool_handler

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(m.name for m in self.layers)

    @property
    def trusted_tools(self) -> frozenset[str]:
        """Tools whose results platform layers vouch for (a skill's body is the author's text)."""
        out: frozenset[str] = frozenset()
        for m in self.layers:
            if slot_of(m) is not None:
                out |= getattr(m, "trusted_tools", frozenset())
        return out

    async def model_call(self, call: ModelCall) -> ModelResult:
        return await self._model_handler(call)

    async def tool_call(self, call: ToolCallInput) -> Any:
        return await self._tool_handler(call)

    @property
    def acts_after_run(self) -> bool:
        """True when a layer has an `after_run` of its own (the platform guards have none)."""
        return any(
            getattr(type(m), "after_run", None) is not BaseMiddleware.after_run for m in self.layers
        )

    async def after_run(self, end: RunEnd) -> None:
        end = replace(end, redact=self.redact)
        for layer in reversed(self.layers):
            await layer.after_run(end)

    def redact(self, text: str) -> str:
        for g in self.guards:
            text = g.redact_text(text)
        return text

    async def _call_model(self, call: ModelCall) -> ModelResult:
        context = call.context
        for g in self.guards:  # seal whatever inner layers added, in platform order
            context = g.guard(context)
        if context is not call.context:
            call = call.with_context(context)
        request = ModelRequest(
            messages=context.render(),
            tools=context.tools,
            output_schema=context.output_schema,
            temperature=call.temperature,
            max_output_tokens=call.max_output_tokens,
            run_id=call.run.run_id,
            turn=call.run.turn,
            deadline_at=call.run.deadline_at,
        )
        manifest = context.manifest()
        started = time.perf_counter()
        # Checked before any layer reads it: a guard rewriting the answer must not be the
        # first to trip over what no event could hold.
        response = check_response(await self.model.complete(request), model=self.model.name)
        return ModelResult(
            call=call,
            request=request,
            response=response,
            manifest=tuple(manifest),
            context_hash=context.context_hash(manifest),
            latency_ms=(time.perf_counter() - started) * 1000,
        )


def _model_layer(layer: Middleware, inner: ModelHandler) -> ModelHandler:
    async def handle(call: ModelCall) -> ModelResult:
        first = await layer.before_model(call)
        if isinstance(first, ModelResult):
            result = first
        else:
            result = await layer.wrap_model_call(first, inner)
        return await layer.after_model(result)

    return handle


def _tool_layer(layer: Middleware, inner: ToolHandler) -> ToolHandler:
    async def handle(call: ToolCallInput) -> Any:
        return await layer.wrap_tool_call(call, inner)

    return handle


async def _no_dispatch(call: ToolCallInput) -> Any:
    raise RuntimeError("this chain was built without a tool dispatcher")
