"""Tenant policy: rules, limits and approver roles, written in Python or loaded from TOML/YAML.

A `Policy` is immutable; its `snapshot_hash` covers every rule (Python predicates by their
source), every limit and every role assignment, so a decision names exactly the policy that
made it and a run can tell when the policy changed under it.
"""

from __future__ import annotations

import fnmatch
import hashlib
import inspect
import json
import os
import re
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from contextos.deadlines import on_expiry
from contextos.errors import PolicyLoadError
from contextos.policy.decision import Decision, ProposedCall

if TYPE_CHECKING:
    from contextos.policy.identity import RunContext

Op = Literal["eq", "ne", "gt", "ge", "lt", "le", "in", "not_in", "glob", "regex", "exists"]
OPS: tuple[str, ...] = (
    "eq",
    "ne",
    "gt",
    "ge",
    "lt",
    "le",
    "in",
    "not_in",
    "glob",
    "regex",
    "exists",
)

_MISSING = object()


def lookup(arguments: Mapping[str, Any], path: str) -> Any:
    """`a.b.0` into nested arguments; a missing step gives a sentinel, never an error."""
    value: Any = arguments
    for step in path.split("."):
        if isinstance(value, Mapping) and step in value:
            value = value[step]
        elif isinstance(value, list | tuple) and step.isdigit() and int(step) < len(value):
            value = value[int(step)]
        else:
            return _MISSING
    return value


@dataclass(frozen=True, kw_only=True, slots=True)
class Condition:
    """One test on an argument of the proposed call."""

    arg: str
    """Argument name, dotted for nested values (`customer.country`)."""
    op: Op
    """Comparison."""
    value: Any = None
    """What to compare with (a list for `in` / `not_in`, a bool for `exists`)."""

    def holds(self, arguments: Mapping[str, Any]) -> bool:
        actual = lookup(arguments, self.arg)
        if self.op == "exists":
            return (actual is not _MISSING) == bool(self.value if self.value is not None else True)
        if actual is _MISSING:
            return False
        try:
            match self.op:
                case "eq":
                    return bool(actual == self.value)
                case "ne":
                    return bool(actual != self.value)
                case "gt":
                    return bool(actual > self.value)
                case "ge":
                    return bool(actual >= self.value)
                case "lt":
                    return bool(actual < self.value)
                case "le":
                    return bool(actual <= self.value)
                case "in":
                    return actual in self.value
                case "not_in":
                    return actual not in self.value
                case "glob":
                    return fnmatch.fnmatchcase(str(actual), str(self.value))
                case "regex":
                    return re.search(str(self.value), str(actual)) is not None
        except TypeError:
            # Comparing unlike types (a string amount against a number) must not crash the
            # gateway; for a rule that restricts, failing to compare means the rule applies.
            return self.op in ("ne", "not_in")
        return False

    def describe(self) -> str:
        return f"{self.arg} {self.op} {self.value!r}"


Predicate = Callable[[ProposedCall, "RunContext"], bool]


@dataclass(frozen=True, kw_only=True)
class Rule:
    """If a proposed call matches, policy says `decision` about it."""

    id: str
    """Stable id, recorded in every decision this rule takes part in."""
    decision: Decision
    """allow, deny, constrain or require_approval."""
    tools: tuple[str, ...] = ("*",)
    """Tool names (globs) the rule covers."""
    effects: tuple[str, ...] = ()
    """Tool effects it covers (`write`, `irreversible`, …); empty covers all."""
    risks: tuple[str, ...] = ()
    """Tool risks it covers; empty covers all."""
    classifications: tuple[str, ...] = ()
    """Data classifications it covers; empty covers all."""
    tenants: tuple[str, ...] = ()
    """Tenants it applies to; empty applies to all."""
    principals: tuple[str, ...] = ()
    """`kind:id` globs of principals it applies to (`service:*`); empty applies to all."""
    when: tuple[Condition, ...] = ()
    """Conditions on the arguments; all must hold."""
    check: Predicate | None = None
    """A Python predicate over the call and the run context; must also hold."""
    reason: str = ""
    """Why, shown to the approver and the model."""
    approver_role: str | None = None
    """Role an approver must hold, for require_approval."""
    constraints: dict[str, Any] = field(default_factory=dict)
    """For constrain: `max_<arg>`, `min_<arg>`, `<arg>_in` limits the arguments must respect."""
    absolute: bool = False
    """For deny: no approval or policy exception can lift it."""
    exception_role: str | None = None
    """For a non-absolute deny: a holder of this role may grant a policy exception."""
    preview: str | None = None
    """Template of the approval preview, formatted with the arguments (`Refund {amount}`)."""
    blast_radius: str | None = None
    """Template describing what the action can affect."""
    expires_in: float | None = None
    """Seconds the interrupt this rule raises waits for a person (None: the policy's default)."""
    on_expiry: str | None = None
    """What happens when nobody answers in time: `deny` or `fail` (None: the policy's)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "decision", Decision(self.decision))
        if self.expires_in is not None and not self.expires_in > 0:
            raise PolicyLoadError(f"rule {self.id}: expires_in must be positive")
        if self.on_expiry is not None:
            on_expiry(self.on_expiry, where=f"rule {self.id}", allow_default=False)
        if self.decision is Decision.REQUIRE_APPROVAL and not self.approver_role:
            raise PolicyLoadError(f"rule {self.id}: require_approval needs an approver_role")
        if self.absolute and self.exception_role:
            raise PolicyLoadError(f"rule {self.id}: an absolute deny cannot have exceptions")

    def matches(self, call: ProposedCall, context: RunContext) -> bool:
        if not any(fnmatch.fnmatchcase(call.tool, t) for t in self.tools):
            return False
        if self.effects and call.effect not in self.effects:
            return False
        if self.risks and call.risk not in self.risks:
            return False
        if self.classifications and call.data_classification not in self.classifications:
            return False
        if self.tenants and context.tenant not in self.tenants:
            return False
        p = context.principal
        if self.principals and not any(
            fnmatch.fnmatchcase(f"{p.kind.value}:{p.id}", pat) for pat in self.principals
        ):
            return False
        if not all(c.holds(call.arguments) for c in self.when):
            return False
        return self.check is None or bool(self.check(call, context))

    def fingerprint(self) -> dict[str, Any]:
        """Everything that decides what the rule does, as JSON data."""
        return {
            "id": self.id,
            "decision": self.decision.value,
            "tools": list(self.tools),
            "effects": list(self.effects),
            "risks": list(self.risks),
            "classifications": list(self.classifications),
            "tenants": list(self.tenants),
            "principals": list(self.principals),
            "when": [[c.arg, c.op, c.value] for c in self.when],
            "check": _source_of(self.check) if self.check is not None else None,
            "reason": self.reason,
            "approver_role": self.approver_role,
            "constraints": self.constraints,
            "absolute": self.absolute,
            "exception_role": self.exception_role,
            "preview": self.preview,
            "blast_radius": self.blast_radius,
            # only when set, so policies without deadlines keep their snapshot hashes
            **({"expires_in": float(self.expires_in)} if self.expires_in is not None else {}),
            **({"on_expiry": self.on_expiry} if self.on_expiry is not None else {}),
        }


@dataclass(frozen=True, kw_only=True, slots=True)
class Limit:
    """A rate or budget limit over the calls a run has already made."""

    id: str
    """Stable id, recorded in decisions."""
    tools: tuple[str, ...] = ("*",)
    """Tool names (globs) it counts."""
    max_calls: int | None = None
    """Successful calls of the matching tools per run."""
    sum_of: str | None = None
    """Argument summed over the run's successful calls (with this one) …"""
    max_total: float | None = None
    """… which must not exceed this."""
    reason: str = ""
    """Shown when the limit is reached."""

    def covers(self, tool: str) -> bool:
        return any(fnmatch.fnmatchcase(tool, t) for t in self.tools)

    def fingerprint(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "tools": list(self.tools),
            "max_calls": self.max_calls,
            "sum_of": self.sum_of,
            "max_total": self.max_total,
            "reason": self.reason,
        }


@dataclass(frozen=True, kw_only=True)
class Policy:
    """A tenant's policy: rules, limits and who holds which approver role."""

    name: str = "default"
    """Name, shown in decisions."""
    version: str = "1"
    """Version label the owner gives it."""
    default: Decision = Decision.ALLOW
    """What happens to a call no rule matches (the other layers still apply)."""
    rules: tuple[Rule, ...] = ()
    """Rules; every matching one counts, the most restrictive outcome wins."""
    limits: tuple[Limit, ...] = ()
    """Rate and budget limits."""
    roles: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """Approver role -> principal ids holding it."""
    approval_ttl_s: float = 24 * 3600
    """How long an approval stays valid when the approver gives no expiry."""
    max_approval_ttl_s: float = 7 * 24 * 3600
    """The longest expiry an approver may give."""
    allow_self_approval: bool = False
    """Whether the principal a run acts for may approve that run's actions."""
    interrupt_ttl_s: float | None = None
    """How long an interrupt waits for a person when nothing more specific says (None: until
    answered)."""
    on_expiry: str = "deny"
    """What happens to an interrupt nobody answered in time, when its rule does not say:
    `deny` (the action is refused, the run goes on) or `fail` (the run ends expired)."""

    def __post_init__(self) -> None:
        on_expiry(self.on_expiry, where=f"policy {self.name}", allow_default=False)
        if self.interrupt_ttl_s is not None and not self.interrupt_ttl_s > 0:
            raise PolicyLoadError(f"policy {self.name}: interrupt_ttl_s must be positive")
        object.__setattr__(self, "default", Decision(self.default))
        if self.default is Decision.REQUIRE_APPROVAL:
            raise PolicyLoadError("the default decision cannot be require_approval (no role)")
        ids = [r.id for r in self.rules] + [lim.id for lim in self.limits]
        dupes = sorted({i for i in ids if ids.count(i) > 1})
        if dupes:
            raise PolicyLoadError(f"policy {self.name}: duplicate rule ids {', '.join(dupes)}")
        object.__setattr__(
            self, "roles", {role: tuple(ids_) for role, ids_ in dict(self.roles).items()}
        )

    def fingerprint(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "version": self.version,
            "default": self.default.value,
            "rules": [r.fingerprint() for r in self.rules],
            "limits": [lim.fingerprint() for lim in self.limits],
            "roles": {k: sorted(v) for k, v in sorted(self.roles.items())},
            "approval_ttl_s": float(self.approval_ttl_s),
            "max_approval_ttl_s": float(self.max_approval_ttl_s),
            "allow_self_approval": self.allow_self_approval,
            **(
                {"interrupt_ttl_s": self.interrupt_ttl_s, "on_expiry": self.on_expiry}
                if self.interrupt_ttl_s is not None or self.on_expiry != "deny"
                else {}
            ),
        }

    @cached_property
    def snapshot_hash(self) -> str:
        """Hash of everything in the policy; decisions and approvals carry it."""
        blob = json.dumps(self.fingerprint(), sort_keys=True, separators=(",", ":"), default=str)
        return hashlib.sha256(blob.encode()).hexdigest()

    def roles_of(self, principal_id: str) -> frozenset[str]:
        return frozenset(role for role, ids in self.roles.items() if principal_id in ids)

    # -- loading ----------------------------------------------------------------------------

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, source: str = "<dict>") -> Policy:
        try:
            spec = _PolicySpec.model_validate(dict(data))
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or '(root)'}: {e['msg']}"
                for e in exc.errors()
            )
            raise PolicyLoadError(f"policy {source} is malformed: {problems}") from exc
        return spec.build(source)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Policy:
        """Load a policy from a `.toml`, `.yaml` or `.yml` file."""
        p = Path(path)
        try:
            text = p.read_text()
        except OSError as exc:
            raise PolicyLoadError(f"cannot read policy {p}: {exc}") from exc
        suffix = p.suffix.lower()
        try:
            if suffix == ".toml":
                data: Any = tomllib.loads(text)
            elif suffix in (".yaml", ".yml"):
                import yaml

                data = yaml.safe_load(text) or {}
            else:
                raise PolicyLoadError(f"policy {p}: use a .toml, .yaml or .yml file")
        except (tomllib.TOMLDecodeError, ValueError) as exc:
            raise PolicyLoadError(f"policy {p} is not valid {suffix[1:].upper()}: {exc}") from exc
        except Exception as exc:  # yaml.YAMLError without importing yaml at module level
            if type(exc).__module__.startswith("yaml"):
                raise PolicyLoadError(f"policy {p} is not valid YAML: {exc}") from exc
            raise
        if not isinstance(data, dict):
            raise PolicyLoadError(f"policy {p}: the top level must be a table/mapping")
        return cls.from_dict(data, source=str(p))


def _source_of(fn: Callable[..., Any]) -> str:
    try:
        return f"{fn.__module__}.{fn.__qualname__}:{inspect.getsource(fn)}"
    except (OSError, TypeError):
        code = getattr(fn, "__code__", None)
        if code is None:
            return repr(fn)
        return f"{fn.__module__}.{fn.__qualname__}:{code.co_code.hex()}:{code.co_consts!r}"


# --- the file format (validated with Pydantic, then turned into the records above) -----------


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _RuleSpec(_Spec):
    id: str
    decision: Decision
    tools: list[str] = ["*"]
    effects: list[str] = []
    risks: list[str] = []
    classifications: list[str] = []
    tenants: list[str] = []
    principals: list[str] = []
    when: dict[str, Any] = {}
    reason: str = ""
    approver_role: str | None = None
    constraints: dict[str, Any] = {}
    absolute: bool = False
    exception_role: str | None = None
    preview: str | None = None
    blast_radius: str | None = None
    expires_in: float | None = None
    on_expiry: str | None = None

    def build(self) -> Rule:
        return Rule(
            id=self.id,
            decision=self.decision,
            tools=tuple(self.tools),
            effects=tuple(self.effects),
            risks=tuple(self.risks),
            classifications=tuple(self.classifications),
            tenants=tuple(self.tenants),
            principals=tuple(self.principals),
            when=conditions(self.when, rule_id=self.id),
            reason=self.reason,
            approver_role=self.approver_role,
            constraints=dict(self.constraints),
            absolute=self.absolute,
            exception_role=self.exception_role,
            preview=self.preview,
            blast_radius=self.blast_radius,
            expires_in=self.expires_in,
            on_expiry=self.on_expiry,
        )


class _LimitSpec(_Spec):
    id: str
    tools: list[str] = ["*"]
    max_calls: int | None = None
    sum_of: str | None = None
    max_total: float | None = None
    reason: str = ""


class _PolicySpec(_Spec):
    name: str = "default"
    version: str = "1"
    default: Decision = Decision.ALLOW
    approval_ttl_s: float = 24 * 3600
    max_approval_ttl_s: float = 7 * 24 * 3600
    allow_self_approval: bool = False
    interrupt_ttl_s: float | None = None
    on_expiry: str = "deny"
    roles: dict[str, list[str]] = {}
    rules: list[_RuleSpec] = []
    limits: list[_LimitSpec] = []

    def build(self, source: str) -> Policy:
        for lim in self.limits:
            if lim.max_calls is None and (lim.sum_of is None or lim.max_total is None):
                raise PolicyLoadError(
                    f"policy {source}: limit {lim.id} needs max_calls, or sum_of with max_total"
                )
        return Policy(
            name=self.name,
            version=self.version,
            default=self.default,
            rules=tuple(r.build() for r in self.rules),
            limits=tuple(
                Limit(
                    id=lim.id,
                    tools=tuple(lim.tools),
                    max_calls=lim.max_calls,
                    sum_of=lim.sum_of,
                    max_total=lim.max_total,
                    reason=lim.reason,
                )
                for lim in self.limits
            ),
            roles={k: tuple(v) for k, v in self.roles.items()},
            approval_ttl_s=self.approval_ttl_s,
            max_approval_ttl_s=self.max_approval_ttl_s,
            allow_self_approval=self.allow_self_approval,
            interrupt_ttl_s=self.interrupt_ttl_s,
            on_expiry=self.on_expiry,
        )


def conditions(when: Mapping[str, Any], *, rule_id: str = "?") -> tuple[Condition, ...]:
    """`{"amount": {"gt": 100}, "currency": "EUR"}` -> conditions (a bare value means eq)."""
    out: list[Condition] = []
    for arg, test in when.items():
        if isinstance(test, Mapping):
            for op, value in test.items():
                if op not in OPS:
                    raise PolicyLoadError(
                        f"rule {rule_id}: unknown operator {op!r} on {arg} "
                        f"(use one of {', '.join(OPS)})"
                    )
                out.append(Condition(arg=arg, op=op, value=value))
        else:
            out.append(Condition(arg=arg, op="eq", value=test))
    return tuple(out)


def check_constraints(constraints: Mapping[str, Any], arguments: Mapping[str, Any]) -> list[str]:
    """Which of `max_<arg>`, `min_<arg>`, `<arg>_in` the arguments break, in words."""
    broken: list[str] = []
    for key, limit in constraints.items():
        if key.startswith("max_"):
            arg, test = key[4:], "le"
        elif key.startswith("min_"):
            arg, test = key[4:], "ge"
        elif key.endswith("_in"):
            arg, test = key[:-3], "in"
        else:
            continue  # other constraints are for the tool to honour, not checkable here
        actual = lookup(arguments, arg)
        if actual is _MISSING:
            continue
        if not Condition(arg=arg, op=test, value=limit).holds(arguments):  # type: ignore[arg-type]
            broken.append(f"{arg}={actual!r} breaks {key}={limit!r}")
    return broken
