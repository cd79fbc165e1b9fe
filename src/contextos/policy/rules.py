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
from decimal import Decimal
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from contextos.errors import PolicyLoadError
from contextos.numbers import exact, finite, is_count, is_number, seconds
from contextos.policy.hook import ProposedCall
from contextos.records.deadlines import on_expiry
from contextos.records.decisions import Decision
from contextos.store.base import DEFAULT_TENANT

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

MISSING = object()

REPEAT_WRITES = 2
"""By default the third identical write call of a run needs a person's approval."""

_ORDER = {"gt": (1,), "ge": (0, 1), "lt": (-1,), "le": (-1, 0)}
"""Ordering ops -> the results of comparing the argument with the value that make them hold."""


def lookup(arguments: Mapping[str, Any], path: str) -> Any:
    """`a.b.0` into nested arguments; a missing step gives a sentinel, never an error."""
    value: Any = arguments
    for step in path.split("."):
        if isinstance(value, Mapping) and step in value:
            value = value[step]
        elif isinstance(value, list | tuple) and step.isdigit() and int(step) < len(value):
            value = value[int(step)]
        else:
            return MISSING
    return value


@dataclass(frozen=True, kw_only=True, slots=True)
class Condition:
    """One test on an argument of the proposed call.

    A number in `value` makes the test numeric: the argument is read as an exact decimal (see
    `contextos.numbers.exact`), never through its JSON text or a float. A string `value` tests
    a string argument; `in` / `not_in` test each listed value the same way. An argument of a
    kind the test cannot compare with (a word where a number is expected, null, NaN) leaves the
    test undecided (`holds` gives None), and the rule around it fails closed (`Rule.matches`).
    """

    arg: str
    """Argument name, dotted for nested values (`customer.country`)."""
    op: Op
    """Comparison."""
    value: Any = None
    """What to compare with (a list for `in` / `not_in`, a bool for `exists`)."""

    def __post_init__(self) -> None:
        if self.op not in OPS:
            raise PolicyLoadError(
                f"unknown operator {self.op!r} on {self.arg} (use one of {', '.join(OPS)})"
            )
        problem = _value_problem(self.op, self.value)
        if problem:
            raise PolicyLoadError(f"condition `{self.describe()}`: {problem}")

    def holds(self, arguments: Mapping[str, Any]) -> bool | None:
        """True or False; None when the argument cannot be compared with the value."""
        actual = lookup(arguments, self.arg)
        if self.op == "exists":
            return (actual is not MISSING) == (self.value is None or bool(self.value))
        if actual is MISSING:
            return False  # the call has no such argument: use `exists` to require one
        match self.op:
            case "eq":
                return _equal(actual, self.value)
            case "ne":
                return _negate(_equal(actual, self.value))
            case "gt" | "ge" | "lt" | "le":
                order = _compare(actual, self.value)
                return None if order is None else order in _ORDER[self.op]
            case "in":
                return _member(actual, self.value)
            case "not_in":
                return _negate(_member(actual, self.value))
            case "glob":
                return fnmatch.fnmatchcase(actual, self.value) if isinstance(actual, str) else None
            case "regex":
                if not isinstance(actual, str):
                    return None
                return re.search(self.value, actual) is not None
        return None

    def describe(self) -> str:
        return f"{self.arg} {self.op} {self.value!r}"


def _value_problem(op: str, value: Any) -> str:
    """Why a condition's value cannot be used with its op ("" when it can)."""
    if is_number(value) and not finite(value):
        return "the value is not a finite number"
    if op in _ORDER and not (is_number(value) or isinstance(value, str)):
        return f"{op} compares with a number or a string, not {type(value).__name__}"
    if op in ("in", "not_in"):
        if not isinstance(value, list | tuple):
            return f"{op} needs a list of values, not {type(value).__name__}"
        if any(is_number(v) and not finite(v) for v in value):
            return "the list holds a number that is not finite"
    if op in ("glob", "regex") and not isinstance(value, str):
        return f"{op} needs a string pattern, not {type(value).__name__}"
    if op == "regex":
        try:
            re.compile(value)
        except re.error as exc:
            return f"the pattern is not a valid regular expression ({exc})"
    if op == "exists" and value is not None and not isinstance(value, bool):
        return f"exists takes true or false, not {value!r}"
    return ""


def _equal(actual: Any, value: Any) -> bool | None:
    """Equality of the argument with one value; None when their kinds cannot be compared."""
    if is_number(value):
        number = exact(actual)
        return None if number is None else number == exact(value)
    if isinstance(value, str | bool):
        return actual == value if type(actual) is type(value) else None
    return bool(actual == value)


def _compare(actual: Any, value: Any) -> int | None:
    """-1, 0 or 1 as the argument is below, equal to or above the value; None: incomparable."""
    if is_number(value):
        number = exact(actual)
        return None if number is None else _order(number, exact(value))
    return _order(actual, value) if isinstance(actual, str) else None


def _order(a: Any, b: Any) -> int:
    return int(a > b) - int(a < b)


def _member(actual: Any, values: Any) -> bool | None:
    results = [_equal(actual, v) for v in values]
    if True in results:
        return True
    return None if None in results else False


def _negate(result: bool | None) -> bool | None:
    return None if result is None else not result


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
        if self.expires_in is not None:
            seconds(self.expires_in, what=f"rule {self.id}: expires_in", error=PolicyLoadError)
        problem = constraints_problem(self.constraints)
        if problem:
            raise PolicyLoadError(f"rule {self.id}: {problem}")
        if self.on_expiry is not None:
            on_expiry(self.on_expiry, where=f"rule {self.id}", allow_default=False)
        if self.decision is Decision.REQUIRE_APPROVAL and not self.approver_role:
            raise PolicyLoadError(f"rule {self.id}: require_approval needs an approver_role")
        if self.absolute and self.exception_role:
            raise PolicyLoadError(f"rule {self.id}: an absolute deny cannot have exceptions")

    def matches(self, call: ProposedCall, context: RunContext) -> bool:
        """Whether the rule applies to the call, failing closed: a rule whose conditions cannot
        be decided on these arguments applies when it restricts (deny, require_approval,
        constrain) and does not when it allows."""
        verdict = self.verdict(call, context)
        return verdict is True or (verdict is None and self.decision is not Decision.ALLOW)

    def undecided(self, call: ProposedCall) -> tuple[Condition, ...]:
        """The conditions that cannot be decided on the call's arguments."""
        return tuple(c for c in self.when if c.holds(call.arguments) is None)

    def verdict(self, call: ProposedCall, context: RunContext) -> bool | None:
        """True: the rule matches; False: it does not; None: a condition cannot be decided
        (and none is known to be false)."""
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
        results = [c.holds(call.arguments) for c in self.when]
        if False in results:
            return False
        if self.check is not None and not self.check(call, context):
            return False
        return None if None in results else True

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
    max_total: float | Decimal | None = None
    """… which must not exceed this (compared as exact decimals)."""
    reason: str = ""
    """Shown when the limit is reached."""

    def __post_init__(self) -> None:
        calls = self.max_calls
        if calls is not None and not is_count(calls):
            raise PolicyLoadError(
                f"limit {self.id}: max_calls must be a whole number, 0 or more, not {calls!r}"
            )
        total = self.max_total
        if total is not None and (not is_number(total) or exact(total) is None):
            raise PolicyLoadError(
                f"limit {self.id}: max_total must be a finite number, not {total!r}"
            )
        if calls is None and (self.sum_of is None or total is None):
            raise PolicyLoadError(f"limit {self.id} needs max_calls, or sum_of with max_total")

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
    repeat_writes: int = REPEAT_WRITES
    """How many times one run may make the same write call (same tool, same validated
    arguments) before each further one needs a person's approval; 0 turns the guard off."""
    repeat_approver_role: str | None = None
    """Role that may approve a repeated write (None: any approver but the run's principal)."""
    allow_opt_out: tuple[str, ...] = ()
    """The default guards (`budget`, `pii`, `sanitize`) an agent may leave out under this
    policy with `Agent(opt_out=...)`; a run of an agent leaving out any other is refused at
    start. Part of the snapshot every run binds."""

    def __post_init__(self) -> None:
        on_expiry(self.on_expiry, where=f"policy {self.name}", allow_default=False)
        where = f"policy {self.name}"
        seconds(self.approval_ttl_s, what=f"{where}: approval_ttl_s", error=PolicyLoadError)
        seconds(self.max_approval_ttl_s, what=f"{where}: max_approval_ttl_s", error=PolicyLoadError)
        if self.interrupt_ttl_s is not None:
            seconds(self.interrupt_ttl_s, what=f"{where}: interrupt_ttl_s", error=PolicyLoadError)
        if not is_count(self.repeat_writes):
            raise PolicyLoadError(
                f"{where}: repeat_writes must be a whole number, 0 or more (0: off), "
                f"not {self.repeat_writes!r}"
            )
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
        object.__setattr__(self, "allow_opt_out", tuple(sorted(set(self.allow_opt_out))))

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
            # only when changed, so policies that keep the default keep their snapshot hashes
            **(
                {"repeat_writes": self.repeat_writes} if self.repeat_writes != REPEAT_WRITES else {}
            ),
            **(
                {"repeat_approver_role": self.repeat_approver_role}
                if self.repeat_approver_role is not None
                else {}
            ),
            **({"allow_opt_out": list(self.allow_opt_out)} if self.allow_opt_out else {}),
        }

    @cached_property
    def snapshot_hash(self) -> str:
        """Hash of everything in the policy; decisions and approvals carry it."""
        blob = json.dumps(self.fingerprint(), sort_keys=True, separators=(",", ":"), default=str)
        return hashlib.sha256(blob.encode()).hexdigest()

    def roles_of(self, principal_id: str, *, tenant: str = DEFAULT_TENANT) -> frozenset[str]:
        """The roles `[roles]` gives a principal in a tenant: `alice@acme` holds a role in
        tenant acme only, a bare `alice` in the default tenant only."""
        held = {f"{principal_id}@{tenant}"}
        if tenant == DEFAULT_TENANT:
            held.add(principal_id)
        return frozenset(role for role, ids in self.roles.items() if not held.isdisjoint(ids))

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
    repeat_writes: int = REPEAT_WRITES
    repeat_approver_role: str | None = None
    allow_opt_out: list[str] = []
    roles: dict[str, list[str]] = {}
    rules: list[_RuleSpec] = []
    limits: list[_LimitSpec] = []

    def build(self, source: str) -> Policy:
        try:
            return self._build()
        except PolicyLoadError as exc:
            raise PolicyLoadError(f"policy {source}: {exc.message}") from exc

    def _build(self) -> Policy:
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
            repeat_writes=self.repeat_writes,
            repeat_approver_role=self.repeat_approver_role,
            allow_opt_out=tuple(self.allow_opt_out),
        )


def conditions(when: Mapping[str, Any], *, rule_id: str = "?") -> tuple[Condition, ...]:
    """`{"amount": {"gt": 100}, "currency": "EUR"}` -> conditions (a bare value means eq)."""
    tests = [
        (arg, op, value)
        for arg, test in when.items()
        for op, value in (test.items() if isinstance(test, Mapping) else [("eq", test)])
    ]
    try:
        return tuple(Condition(arg=arg, op=op, value=value) for arg, op, value in tests)  # type: ignore[arg-type]
    except PolicyLoadError as exc:
        raise PolicyLoadError(f"rule {rule_id}: {exc.message}") from exc


def check_constraints(constraints: Mapping[str, Any], arguments: Mapping[str, Any]) -> list[str]:
    """Which of `max_<arg>`, `min_<arg>`, `<arg>_in` the arguments break, in words; an argument
    that cannot be checked against its constraint breaks it (fail closed)."""
    broken: list[str] = []
    for key, limit in constraints.items():
        target = _constraint(key)
        if target is None:
            continue  # other constraints are for the tool to honour, not checkable here
        arg, op = target
        actual = lookup(arguments, arg)
        if actual is MISSING:
            continue
        held = Condition(arg=arg, op=op, value=limit).holds(arguments)
        if held is None:
            broken.append(f"{arg}={actual!r} cannot be checked against {key}={limit!r}")
        elif not held:
            broken.append(f"{arg}={actual!r} breaks {key}={limit!r}")
    return broken


def constraints_problem(constraints: Mapping[str, Any]) -> str:
    """Why constraints cannot be checked as written ("" when they can)."""
    for key, limit in constraints.items():
        target = _constraint(key)
        if target is None:
            continue
        op = target[1]
        if op != "in" and not is_number(limit):
            problem = f"needs a number, not {type(limit).__name__}"
        else:
            problem = _value_problem(op, limit)
        if problem:
            return f"constraint {key}={limit!r}: {problem}"
    return ""


def _constraint(key: str) -> tuple[str, Op] | None:
    """`max_amount` -> (amount, le); `min_x` -> (x, ge); `x_in` -> (x, in); else None."""
    if key.startswith("max_"):
        return key[4:], "le"
    if key.startswith("min_"):
        return key[4:], "ge"
    if key.endswith("_in"):
        return key[:-3], "in"
    return None
