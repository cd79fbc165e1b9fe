"""Tool contracts: what a tool is, what it may touch, and how it may be retried.

A plain type-hinted function is already a valid read-only, low-risk tool; `@tool(...)` declares
the rest, and a `BaseTool` subclass declares the same contract as class attributes. The argument
schema comes from the type hints through Pydantic.
"""

from __future__ import annotations

import hashlib
import inspect
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from enum import StrEnum
from functools import cached_property
from typing import Any, get_type_hints, overload

from pydantic import BaseModel, ConfigDict, create_model

from contextos.messages import ToolSpec
from contextos.policy.containment import Containment
from contextos.policy.hook import ProposedCall
from contextos.tools.arguments import MAX_BYTES, MAX_DEPTH

DEFAULT_MAX_OUTPUT_CHARS = 16_000
"""Characters of a tool's rendered output kept by default; the rest is cut with a note."""


class EffectKind(StrEnum):
    """What calling the tool does to the world."""

    READ = "read"
    WRITE = "write"
    REVERSIBLE_WRITE = "reversible_write"
    IRREVERSIBLE = "irreversible"


class Risk(StrEnum):
    LOW = "low"
    MEDIUM = "medium"
    HIGH = "high"


@dataclass(frozen=True, kw_only=True, slots=True)
class RetryPolicy:
    """When a failed call may be tried again. By default it never is."""

    attempts: int = 1
    """Total attempts including the first."""
    safe_on: tuple[type[BaseException], ...] = ()
    """Error classes after which another attempt is safe (the call had no effect)."""
    unsafe_on: tuple[type[BaseException], ...] = ()
    """Error classes after which retrying is never safe, even if also listed in safe_on."""
    backoff_s: float = 0.2
    """Delay before the second attempt; doubles each time."""
    max_backoff_s: float = 5.0
    """Upper bound of the delay."""

    def identity(self) -> dict[str, Any]:
        """What the retry changes about a call, as JSON data (part of a contract's hash)."""
        return {
            "attempts": self.attempts,
            "safe_on": [e.__name__ for e in self.safe_on],
            "unsafe_on": [e.__name__ for e in self.unsafe_on],
        }

    def allows(self, error: BaseException, attempt: int) -> bool:
        if attempt >= self.attempts or isinstance(error, self.unsafe_on):
            return False
        return isinstance(error, self.safe_on)

    def delay(self, attempt: int) -> float:
        return float(min(self.backoff_s * (2 ** (attempt - 1)), self.max_backoff_s))


@dataclass(frozen=True, kw_only=True, slots=True)
class ToolContext:
    """What a tool may learn about the call it serves (declare a parameter of this type)."""

    run_id: str
    """The run making the call."""
    call_id: str
    """The model's tool call id."""
    idempotency_key: str | None = None
    """Stable across retries and resumes of this call, for tools with effects."""
    attempt: int = 1
    """Which attempt this is."""
    effect_id: str | None = None
    """The ledger entry of this call, for tools whose effect is not `read`."""
    compensates: str | None = None
    """For a compensation call: the effect being undone."""
    receipts: dict[str, str] = field(default_factory=dict)
    """A tool may put receipts here (provider request id, confirmation id); they are stored
    on the effect even when the call then fails."""
    containment: Containment | None = None
    """The run's containment, when it acts under one: the built-in file and HTTP tools stay
    within it as well as within their own."""
    answer: dict[str, Any] | None = None
    """For a tool that asks a person: the answer given to this call's question, as the run's
    log records it (None: nobody has answered)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ToolResult:
    """A tool's return value with receipts attached (return it instead of the bare value)."""

    output: Any
    """What the model sees (rendered to text by the gateway)."""
    receipts: dict[str, str] = field(default_factory=dict)
    """Provider request id, confirmation id, …: stored on the effect."""


@dataclass(frozen=True, kw_only=True)
class Tool:
    """A tool with its contract."""

    name: str
    """Name the model calls it by."""
    description: str
    """What it does, for the model."""
    fn: Callable[..., Any] | Callable[..., Awaitable[Any]]
    """The implementation (sync functions run in a worker thread)."""
    args_model: type[BaseModel]
    """Pydantic model of the arguments."""
    version: str = "1"
    """Bumped when behaviour changes."""
    effect: EffectKind = EffectKind.READ
    """What a call does to the world."""
    risk: Risk = Risk.LOW
    """How bad a wrong call is."""
    scopes: tuple[str, ...] = ()
    """Scopes a principal needs to call it."""
    data_classification: str = "internal"
    """Classification of its input data."""
    output_classification: str | None = None
    """Classification of its output data, when it differs from the input's."""
    source: str = "local"
    """Where the capability comes from: `local`, or `mcp:<server>` for MCP tools."""
    output_schema: dict[str, Any] | None = None
    """JSON schema of the result, when declared by the return type."""
    timeout_s: float = 30.0
    """Per-attempt time limit."""
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    """When failed calls may be retried."""
    idempotency_arg: str | None = None
    """Argument filled with the idempotency key by the runtime (hidden from the model)."""
    idempotent: bool = False
    """Calls with the same idempotency key take effect at most once (the provider honours the
    key), so re-sending one whose outcome is unknown is safe."""
    reconcile: Callable[[str], Any] | None = None
    """`reconcile(idempotency_key)` (sync or async) looks up what happened to a call: None when
    it never took effect, else its result (a ToolResult to add receipts)."""
    verify: bool = False
    """After a commit, confirm it through `reconcile` (committed -> verified)."""
    compensation: str | None = None
    """Name of the tool that undoes a committed call (saga)."""
    approval_policy: str | None = None
    """Reference to the approval policy that governs it."""
    redact_fields: tuple[str, ...] = ()
    """Argument fields never written to traces."""
    owner: str | None = None
    """Team or person responsible."""
    context_param: str | None = None
    """Name of the parameter that receives the ToolContext, if any."""
    max_arg_depth: int = MAX_DEPTH
    """Deepest nesting of objects and arrays the model may send as arguments."""
    max_arg_bytes: int = MAX_BYTES
    """Largest argument text the model may send, in bytes of JSON."""
    max_output_chars: int = DEFAULT_MAX_OUTPUT_CHARS
    """Characters of rendered output recorded and shown to the model; longer output is cut
    there, with a note saying how much was left out."""

    @property
    def is_async(self) -> bool:
        return inspect.iscoroutinefunction(self.fn)

    def spec(self) -> ToolSpec:
        return self._spec

    @cached_property
    def _spec(self) -> ToolSpec:
        # The same object for every run: the context compiler keys what it derives from a
        # schema on it, so a worker driving many runs derives it once.
        return ToolSpec(
            name=self.name,
            description=self.description,
            parameters=self.parameters,
            untrusted=self.source != "local",
        )

    @cached_property
    def parameters(self) -> dict[str, Any]:
        # Building a JSON schema is costly and the contract is frozen: compute it once.
        return self.args_model.model_json_schema()

    def contract(self) -> dict[str, Any]:
        """The declared contract as JSON data (what the manifest hash covers)."""
        return {
            "name": self.name,
            "version": self.version,
            "description": self.description,
            "parameters": self.parameters,
            "output_schema": self.output_schema,
            "effect": self.effect.value,
            "risk": self.risk.value,
            "scopes": list(self.scopes),
            "data_classification": self.data_classification,
            "timeout_s": self.timeout_s,
            "retry": self.retry.identity(),
            "idempotency_arg": self.idempotency_arg,
            "idempotent": self.idempotent,
            "reconcile": self.reconcile is not None,
            "verify": self.verify,
            "output_classification": self.output_classification,
            "source": self.source,
            "redact_fields": list(self.redact_fields),
            "compensation": self.compensation,
            "approval_policy": self.approval_policy,
            # only when changed, so contracts that keep the defaults keep their hashes
            **({"max_arg_depth": self.max_arg_depth} if self.max_arg_depth != MAX_DEPTH else {}),
            **({"max_arg_bytes": self.max_arg_bytes} if self.max_arg_bytes != MAX_BYTES else {}),
            # Added only when set, so that contracts which leave it alone keep their hash.
            **(
                {"max_output_chars": self.max_output_chars}
                if self.max_output_chars != DEFAULT_MAX_OUTPUT_CHARS
                else {}
            ),
        }

    def contract_hash(self) -> str:
        return self._contract_hash

    @cached_property
    def _contract_hash(self) -> str:
        return _hash(self.contract())

    @property
    def has_effect(self) -> bool:
        """True for every tool whose calls go through the effect ledger."""
        return self.effect is not EffectKind.READ

    def redacted(self, arguments: dict[str, Any]) -> dict[str, Any]:
        """Arguments as they may be written to logs and traces."""
        return {k: "[redacted]" if k in self.redact_fields else v for k, v in arguments.items()}

    def proposal(self, run_id: str, call_id: str, arguments: dict[str, Any]) -> ProposedCall:
        """What policy is asked about a call of this tool with these validated arguments: the
        call, and what the contract says that policy weighs."""
        return ProposedCall(
            run_id=run_id,
            call_id=call_id,
            tool=self.name,
            arguments=arguments,
            effect=self.effect.value,
            risk=self.risk.value,
            scopes=self.scopes,
            data_classification=self.data_classification,
            contract_hash=self.contract_hash(),
            redact_fields=self.redact_fields,
            compensation=self.compensation,
        )


def _hash(data: Any) -> str:
    blob = json.dumps(data, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def manifest_hash(tools: list[Tool] | tuple[Tool, ...]) -> str:
    """Hash of a set of tools' contracts, independent of their order."""
    return _hash(sorted((t.name, t.contract_hash()) for t in tools))


@overload
def tool(fn: Callable[..., Any], /) -> Tool: ...


@overload
def tool(
    *,
    name: str | None = None,
    description: str | None = None,
    version: str = "1",
    effect: EffectKind | str = EffectKind.READ,
    risk: Risk | str = Risk.LOW,
    scopes: tuple[str, ...] = (),
    data_classification: str = "internal",
    timeout_s: float = 30.0,
    retry: RetryPolicy | None = None,
    idempotency_arg: str | None = None,
    idempotent: bool = False,
    reconcile: Callable[[str], Any] | None = None,
    verify: bool = False,
    compensation: str | None = None,
    approval_policy: str | None = None,
    redact_fields: tuple[str, ...] = (),
    owner: str | None = None,
    output_classification: str | None = None,
    max_arg_depth: int = MAX_DEPTH,
    max_arg_bytes: int = MAX_BYTES,
    max_output_chars: int = DEFAULT_MAX_OUTPUT_CHARS,
) -> Callable[[Callable[..., Any]], Tool]: ...


def tool(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    version: str = "1",
    effect: EffectKind | str = EffectKind.READ,
    risk: Risk | str = Risk.LOW,
    scopes: tuple[str, ...] = (),
    data_classification: str = "internal",
    timeout_s: float = 30.0,
    retry: RetryPolicy | None = None,
    idempotency_arg: str | None = None,
    idempotent: bool = False,
    reconcile: Callable[[str], Any] | None = None,
    verify: bool = False,
    compensation: str | None = None,
    approval_policy: str | None = None,
    redact_fields: tuple[str, ...] = (),
    owner: str | None = None,
    output_classification: str | None = None,
    max_arg_depth: int = MAX_DEPTH,
    max_arg_bytes: int = MAX_BYTES,
    max_output_chars: int = DEFAULT_MAX_OUTPUT_CHARS,
) -> Tool | Callable[[Callable[..., Any]], Tool]:
    """Declare a tool: `@tool` on a typed function, or `@tool(effect="write", ...)`."""

    def build(f: Callable[..., Any]) -> Tool:
        args_model, context_param = _args_model(f, hidden=idempotency_arg)
        return Tool(
            name=name or f.__name__,
            description=description or inspect.getdoc(f) or f.__name__,
            fn=f,
            args_model=args_model,
            version=version,
            effect=EffectKind(effect),
            risk=Risk(risk),
            scopes=tuple(scopes),
            data_classification=data_classification,
            output_schema=_output_schema(f),
            timeout_s=timeout_s,
            retry=retry or RetryPolicy(),
            idempotency_arg=idempotency_arg,
            idempotent=idempotent,
            reconcile=reconcile,
            verify=verify,
            output_classification=output_classification,
            compensation=compensation,
            approval_policy=approval_policy,
            redact_fields=tuple(redact_fields),
            owner=owner,
            context_param=context_param,
            max_arg_depth=max_arg_depth,
            max_arg_bytes=max_arg_bytes,
            max_output_chars=max_output_chars,
        )

    return build(fn) if fn is not None else build


class BaseTool:
    """The class form of a contract: subclass, set attributes, implement `run`.

    `run` takes typed keyword arguments like a `@tool` function (sync or async, optionally a
    ToolContext parameter); define `reconcile(self, idempotency_key)` to let the runtime look up
    a call whose outcome is unknown. Instances are turned into `Tool`s wherever tools are taken.
    """

    name: str = ""
    description: str = ""
    version: str = "1"
    effect: EffectKind | str = EffectKind.READ
    risk: Risk | str = Risk.LOW
    scopes: tuple[str, ...] = ()
    data_classification: str = "internal"
    output_classification: str | None = None
    timeout_s: float = 30.0
    retry: RetryPolicy | None = None
    idempotency_arg: str | None = None
    idempotent: bool = False
    verify: bool = False
    compensation: str | None = None
    approval_policy: str | None = None
    redact_fields: tuple[str, ...] = ()
    owner: str | None = None
    max_arg_depth: int = MAX_DEPTH
    max_arg_bytes: int = MAX_BYTES
    max_output_chars: int = DEFAULT_MAX_OUTPUT_CHARS

    run: Callable[..., Any]

    def to_tool(self) -> Tool:
        cls = type(self)
        reconcile = getattr(self, "reconcile", None)
        return tool(
            name=self.name or _snake(cls.__name__),
            description=self.description or inspect.getdoc(cls) or cls.__name__,
            version=self.version,
            effect=self.effect,
            risk=self.risk,
            scopes=tuple(self.scopes),
            data_classification=self.data_classification,
            output_classification=self.output_classification,
            timeout_s=self.timeout_s,
            retry=self.retry,
            idempotency_arg=self.idempotency_arg,
            idempotent=self.idempotent,
            reconcile=reconcile if callable(reconcile) else None,
            verify=self.verify,
            compensation=self.compensation,
            approval_policy=self.approval_policy,
            redact_fields=tuple(self.redact_fields),
            owner=self.owner,
            max_arg_depth=self.max_arg_depth,
            max_arg_bytes=self.max_arg_bytes,
            max_output_chars=self.max_output_chars,
        )(self.run)


def _snake(name: str) -> str:
    return "".join(f"_{c.lower()}" if c.isupper() and i else c.lower() for i, c in enumerate(name))


def as_tool(obj: Tool | BaseTool | type[BaseTool] | Callable[..., Any]) -> Tool:
    """A Tool as is, a BaseTool (instance or class) built, a plain function made read-only."""
    if isinstance(obj, Tool):
        return obj
    if isinstance(obj, type) and issubclass(obj, BaseTool):
        return obj().to_tool()
    if isinstance(obj, BaseTool):
        return obj.to_tool()
    return tool(obj)


def _args_model(
    f: Callable[..., Any], *, hidden: str | None = None
) -> tuple[type[BaseModel], str | None]:
    hints = get_type_hints(f)
    fields: dict[str, Any] = {}
    context_param = None
    for pname, param in inspect.signature(f).parameters.items():
        annotation = hints.get(pname, Any)
        if annotation is ToolContext:
            context_param = pname
            continue
        if pname == hidden:
            continue  # the runtime fills it with the idempotency key; the model never sees it
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise TypeError(f"tool {f.__name__}: *args and **kwargs cannot be described to a model")
        default = ... if param.default is inspect.Parameter.empty else param.default
        fields[pname] = (annotation, default)
    model = create_model(  # type: ignore[call-overload,unused-ignore]
        f"{f.__name__}_args",
        __config__=ConfigDict(extra="forbid"),
        **fields,
    )
    return model, context_param


def _output_schema(f: Callable[..., Any]) -> dict[str, Any] | None:
    ret = get_type_hints(f).get("return")
    if ret is None or ret is type(None):
        return None
    try:
        from pydantic import TypeAdapter

        schema: dict[str, Any] = TypeAdapter(ret).json_schema()
        return schema
    except Exception:  # an unschemable return type only loses documentation
        return None
