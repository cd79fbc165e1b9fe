"""How authority is computed: every layer is asked, the most restrictive answer wins.

    manifest ∩ containment ∩ agent tool allowlist ∩ principal scopes ∩ data classification
      ∩ tenant policy rules ∩ rate and budget limits            -> PolicyDecision
    (an approval over the frozen action can then lift require_approval, or a deny that the
     policy marks as open to exceptions; never an absolute deny)

The engine is pure: no I/O, no clock. The gate (`policy/gate.py`) feeds it the run's recorded
context and history and applies approvals.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Context, Decimal, DecimalException, Inexact, localcontext
from typing import Any

from contextos.errors import ContainmentViolation
from contextos.numbers import exact
from contextos.policy.hook import ProposedCall
from contextos.policy.identity import RunContext
from contextos.policy.rules import MISSING, Limit, Policy, Rule, check_constraints, lookup
from contextos.records.decisions import Check, Decision, PolicyDecision

_EXACT = Context(prec=200, traps=[Inexact])
"""Budget sums: 200 significant digits, and an error rather than a rounded total."""

_RANK = {Decision.ALLOW: 0, Decision.CONSTRAIN: 1, Decision.REQUIRE_APPROVAL: 2, Decision.DENY: 3}


class CallHistory:
    """What the run has already done, for rate and budget limits: (tool, arguments) of every
    call that completed without error.

    Kept by tool as it grows (`add`), so a limit counts the calls of the tools it covers, not
    every call of the run again: a decision late in a long run costs what an early one does.
    """

    __slots__ = ("_by_tool", "_same", "_size")

    def __init__(self, succeeded: Iterable[tuple[str, Mapping[str, Any]]] = ()) -> None:
        self._by_tool: dict[str, list[Mapping[str, Any]]] = {}
        """Tool -> the arguments of its calls, in order."""
        self._same: dict[str, Counter[str]] = {}
        """Tool -> its calls by canonical arguments, for the repeat guard; made when first
        asked about the tool (for writes only), then kept up as calls are added."""
        self._size = 0
        for tool, arguments in succeeded:
            self.add(tool, arguments)

    def __len__(self) -> int:
        return self._size

    def add(self, tool: str, arguments: Mapping[str, Any]) -> None:
        self._by_tool.setdefault(tool, []).append(arguments)
        self._size += 1
        same = self._same.get(tool)
        if same is not None:
            same[_canonical(arguments)] += 1

    def count(self, covers: Callable[[str], bool]) -> int:
        """The calls of the tools `covers` holds for."""
        return sum(len(calls) for tool, calls in self._by_tool.items() if covers(tool))

    def arguments(self, covers: Callable[[str], bool]) -> list[Mapping[str, Any]]:
        """The arguments of the calls of the tools `covers` holds for (each tool's in order)."""
        return [a for tool, calls in self._by_tool.items() if covers(tool) for a in calls]

    def repeats(self, tool: str, arguments: Mapping[str, Any]) -> int:
        """The calls of `tool` with these very arguments."""
        same = self._same.get(tool)
        if same is None:
            same = self._same[tool] = Counter(map(_canonical, self._by_tool.get(tool, ())))
        return same[_canonical(arguments)]


@dataclass(frozen=True, kw_only=True, slots=True)
class _Finding:
    check: Check
    absolute: bool = False
    approver_role: str | None = None
    exception_role: str | None = None
    constraints: Mapping[str, Any] = field(default_factory=dict)


class Engine:
    """Evaluates proposed calls against a policy; one engine serves many runs."""

    def __init__(self, policy: Policy | None = None) -> None:
        self.policy = policy or Policy()

    @property
    def snapshot_hash(self) -> str:
        return self.policy.snapshot_hash

    def evaluate(
        self,
        call: ProposedCall,
        context: RunContext,
        *,
        in_manifest: bool = True,
        history: CallHistory | None = None,
    ) -> PolicyDecision:
        """The decision before any approval is considered (`in_manifest`: the call names one of
        the run's tools, as every call the gateway proposes does)."""
        findings = [
            *self._manifest(call, in_manifest),
            *self._containment(call, context),
            *self._allowlist(call, context),
            *self._scopes(call, context),
            *self._classification(call, context),
            *self._rules(call, context),
            *self._limits(call, history or CallHistory()),
        ]
        return self._combine(call, findings)

    # -- layers -----------------------------------------------------------------------------

    def _manifest(self, call: ProposedCall, in_manifest: bool) -> list[_Finding]:
        if not in_manifest:
            return [_deny("manifest", "manifest", f"{call.tool} is not in the run's manifest")]
        return [_ok("manifest", "manifest")]

    def _containment(self, call: ProposedCall, context: RunContext) -> list[_Finding]:
        if not call.confine:
            return []
        layers = [c for c in (context.containment, call.containment) if c is not None]
        if not layers:
            return [_deny("containment", "containment", f"{call.tool}: no containment configured")]
        out: list[_Finding] = []
        for arg, kind in call.confine:
            value = lookup(call.arguments, arg)
            if not isinstance(value, str):
                continue  # argument validation already ran; a missing optional path is fine
            try:
                if kind == "url":
                    for c in layers:
                        c.check_url(value)
                else:
                    real = layers[0].resolve(value, kind)
                    for c in layers[1:]:
                        c.resolve(real, kind)
            except ContainmentViolation as exc:
                out.append(_deny("containment", f"containment:{arg}", exc.message))
        return out or [_ok("containment", "containment")]

    def _allowlist(self, call: ProposedCall, context: RunContext) -> list[_Finding]:
        if context.allows_tool(call.tool):
            return [_ok("allowlist", "allowlist")]
        return [
            _deny(
                "allowlist",
                "allowlist",
                f"{call.tool} is not on this run's tool allowlist "
                f"({', '.join(context.tools or ())})",
            )
        ]

    def _scopes(self, call: ProposedCall, context: RunContext) -> list[_Finding]:
        missing = [s for s in call.scopes if not context.has_scope(s)]
        if missing:
            return [
                _deny(
                    "scopes",
                    f"scope:{s}",
                    f"{context.principal.ref} has not delegated scope {s} to this run",
                )
                for s in missing
            ]
        return [_ok("scopes", "scopes")]

    def _classification(self, call: ProposedCall, context: RunContext) -> list[_Finding]:
        if context.clears(call.data_classification):
            return [_ok("classification", "classification")]
        return [
            _deny(
                "classification",
                "classification",
                f"{call.tool} handles {call.data_classification} data; this run is cleared "
                f"up to {context.clearance}",
            )
        ]

    def _rules(self, call: ProposedCall, context: RunContext) -> list[_Finding]:
        matched = [r for r in self.policy.rules if r.matches(call, context)]
        if not matched:
            default = self.policy.default
            reason = "" if default is Decision.ALLOW else "no rule allows this call"
            check = Check(layer="policy", decision=default, rule_id="policy:default", reason=reason)
            return [_Finding(check=check)]
        return [_rule_finding(r, call) for r in matched]

    def _limits(self, call: ProposedCall, history: CallHistory) -> list[_Finding]:
        out: list[_Finding] = []
        for lim in self.policy.limits:
            if not lim.covers(call.tool):
                continue
            used = history.count(lim.covers) if lim.max_calls is not None else 0
            if lim.max_calls is not None and used >= lim.max_calls:
                why = lim.reason or f"rate limit: {used} of {lim.max_calls} calls used"
                out.append(_deny("limits", lim.id, why))
                continue
            if lim.sum_of is not None and lim.max_total is not None:
                why = _over_budget(lim, call.arguments, history.arguments(lim.covers))
                if why:
                    out.append(_deny("limits", lim.id, why))
                    continue
            out.append(_ok("limits", lim.id))
        return [*out, *self._repeats(call, history)]

    def _repeats(self, call: ProposedCall, history: CallHistory) -> list[_Finding]:
        """The same write call again: after `repeat_writes` successes, each needs a person."""
        allowed = self.policy.repeat_writes
        if not allowed or call.effect == "read":
            return []
        done = history.repeats(call.tool, call.arguments)
        if done < allowed:
            return []
        why = (
            f"the same call to {call.tool} (same arguments) already succeeded {done} times in "
            "this run; a person must approve another"
        )
        check = Check(
            layer="limits", decision=Decision.REQUIRE_APPROVAL, rule_id="repeat_writes", reason=why
        )
        return [_Finding(check=check, approver_role=self.policy.repeat_approver_role)]

    # -- combining --------------------------------------------------------------------------

    def _combine(self, call: ProposedCall, findings: list[_Finding]) -> PolicyDecision:
        worst = max((f.check.decision for f in findings), key=_RANK.__getitem__)
        constraints = _merge_constraints([f.constraints for f in findings if f.constraints])
        broken = check_constraints(constraints, call.arguments) if constraints else []
        if broken:  # even under a deny: an exception to that deny must not lift the constraint
            findings.append(
                _deny(
                    "policy", "constraints", "the arguments break constraints: " + "; ".join(broken)
                )
            )
            worst = Decision.DENY
        deciding = [f for f in findings if f.check.decision is worst]
        absolute = worst is Decision.DENY and any(f.absolute for f in deciding)
        exception_roles: list[str] = []
        if worst is Decision.DENY and not absolute and all(f.exception_role for f in deciding):
            exception_roles = _unique(f.exception_role for f in deciding)
        approval_roles = _unique(f.approver_role for f in findings)
        roles: list[str] = []
        if worst is Decision.REQUIRE_APPROVAL:
            roles = approval_roles
        elif exception_roles:
            roles = _unique([*exception_roles, *approval_roles])
        return PolicyDecision(
            decision=worst,
            rule_ids=tuple(_unique(f.check.rule_id for f in deciding)),
            reasons=tuple(_unique(f.check.reason for f in deciding if f.check.reason)),
            constraints=dict(constraints),
            approver_role=roles[0] if roles else None,
            approver_roles=tuple(roles),
            exception_role=exception_roles[0] if exception_roles else None,
            snapshot_hash=self.snapshot_hash,
            absolute=absolute,
            checks=tuple(f.check for f in findings),
        )


def _ok(layer: str, rule_id: str) -> _Finding:
    return _Finding(check=Check(layer=layer, decision=Decision.ALLOW, rule_id=rule_id))


def _deny(layer: str, rule_id: str, reason: str) -> _Finding:
    # Built-in layers deny absolutely: no approval may widen containment, scopes, the allowlist,
    # the manifest or the data clearance. Limits and constraints deny this action only.
    absolute = layer not in ("limits", "policy")
    return _Finding(
        check=Check(layer=layer, decision=Decision.DENY, rule_id=rule_id, reason=reason),
        absolute=absolute,
    )


def _rule_finding(rule: Rule, call: ProposedCall) -> _Finding:
    reason = rule.reason or f"rule {rule.id}"
    unclear = [
        f"{c.describe()} for {c.arg}={lookup(call.arguments, c.arg)!r}"
        for c in rule.undecided(call)
    ]
    if unclear:  # it applies because it fails closed: say so to the approver and the model
        reason += f" (applied: cannot tell whether {'; '.join(unclear)})"
    return _Finding(
        check=Check(layer="policy", decision=rule.decision, rule_id=rule.id, reason=reason),
        absolute=rule.absolute,
        approver_role=rule.approver_role if rule.decision is Decision.REQUIRE_APPROVAL else None,
        exception_role=rule.exception_role if rule.decision is Decision.DENY else None,
        constraints=rule.constraints if rule.decision is Decision.CONSTRAIN else {},
    )


def _merge_constraints(items: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Several constrain rules: the tightest of each limit wins."""
    out: dict[str, Any] = {}
    for item in items:
        for key, value in item.items():
            if key not in out:
                out[key] = value
            elif key.startswith("max_"):
                out[key] = min(out[key], value)
            elif key.startswith("min_"):
                out[key] = max(out[key], value)
            elif key.endswith("_in"):
                out[key] = [v for v in out[key] if v in value]
            elif out[key] != value:
                out[key] = value  # an unknown constraint: the later rule's word stands
    return out


def _over_budget(
    lim: Limit, arguments: Mapping[str, Any], done: Sequence[Mapping[str, Any]]
) -> str:
    """Why this call would pass a budget or cannot be counted against it ("" when it fits).

    Amounts add up as exact decimals; one that is not a finite number, or a sum that cannot be
    held exactly, denies the call (fail closed). A call without the argument spends nothing.
    """
    arg, ceiling = lim.sum_of or "", exact(lim.max_total)
    assert ceiling is not None  # a Limit refuses a max_total that is not a finite number
    *earlier, this = [_amount(a, arg) for a in (*done, arguments)]
    if this is None:
        return (
            f"budget {lim.id}: {arg}={lookup(arguments, arg)!r} is not a finite number, so it "
            "cannot be counted against the limit"
        )
    counted = [a for a in earlier if a is not None]
    if len(counted) < len(earlier):
        return f"budget {lim.id}: an earlier {arg} is not a finite number; no more can be counted"
    try:
        with localcontext(_EXACT):
            spent = sum(counted, Decimal(0))
            if spent + this <= ceiling:
                return ""
    except DecimalException:
        return f"budget {lim.id}: the amounts of {arg} cannot be added up exactly"
    return lim.reason or (
        f"budget: {arg} {spent:g} already used, {this:g} more would pass the limit of {ceiling:g}"
    )


def _canonical(arguments: Mapping[str, Any]) -> str:
    return json.dumps(arguments, sort_keys=True, separators=(",", ":"), default=str)


def _amount(arguments: Mapping[str, Any], arg: str) -> Decimal | None:
    value = lookup(arguments, arg)
    return Decimal(0) if value is MISSING else exact(value)


def _unique(items: Any) -> list[str]:
    seen: list[str] = []
    for item in items:
        if item and item not in seen:
            seen.append(item)
    return seen
