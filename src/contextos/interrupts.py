"""Typed human interrupts, frozen actions, and approvals bound to an action's hash.

A run that needs a person records an `InterruptRaised` event of one of six kinds, each with an
answer schema. For approvals the interrupt carries a `FrozenAction`: the exact tool, arguments
and contract, a preview and a blast radius, under one hash. An approval names that hash, the
approver, an expiry and optional conditions; `check_approval` says whether it still holds when
the run resumes. `Book` folds a run's events into its interrupts, approvals and history.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from contextos import events as ev
from contextos.deadlines import Deadline
from contextos.errors import AnswerInvalid
from contextos.policy.identity import RunContext
from contextos.policy.rules import check_constraints, lookup
from contextos.runs import RunId

if TYPE_CHECKING:
    from contextos.store.base import EventStore


class InterruptKind(StrEnum):
    APPROVAL_REQUIRED = "approval_required"
    MISSING_INFORMATION = "missing_information"
    CHOICE_REQUIRED = "choice_required"
    POLICY_EXCEPTION_REQUESTED = "policy_exception_requested"
    EXTERNAL_CONFIRMATION_REQUIRED = "external_confirmation_required"
    REVIEW_REQUIRED = "review_required"

    @property
    def is_approval(self) -> bool:
        """Answered by approve/deny over a frozen action, not by a free value."""
        return self in (InterruptKind.APPROVAL_REQUIRED, InterruptKind.POLICY_EXCEPTION_REQUESTED)


# --- answer schemas ---------------------------------------------------------------------------


class _Answer(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)  # "nan" is no answer


class ApprovalAnswer(_Answer):
    """approval_required and policy_exception_requested: approve or deny the frozen action."""

    decision: Literal["approve", "deny"]
    reason: str = ""
    expires_in_s: float | None = None
    conditions: dict[str, Any] = {}


class MissingInformationAnswer(_Answer):
    """missing_information: the value that was asked for."""

    value: Any


class ChoiceAnswer(_Answer):
    """choice_required: one of the offered options."""

    choice: str


class ExternalConfirmationAnswer(_Answer):
    """external_confirmation_required: what a person saw happen outside (did it take effect?)."""

    outcome: Literal["committed", "failed"]
    receipt: str = ""
    note: str = ""


class ReviewAnswer(_Answer):
    """review_required: accept, reject or send back with comments."""

    verdict: Literal["accept", "reject", "revise"]
    comments: str = ""


ANSWER_SCHEMAS: dict[InterruptKind, type[_Answer]] = {
    InterruptKind.APPROVAL_REQUIRED: ApprovalAnswer,
    InterruptKind.POLICY_EXCEPTION_REQUESTED: ApprovalAnswer,
    InterruptKind.MISSING_INFORMATION: MissingInformationAnswer,
    InterruptKind.CHOICE_REQUIRED: ChoiceAnswer,
    InterruptKind.EXTERNAL_CONFIRMATION_REQUIRED: ExternalConfirmationAnswer,
    InterruptKind.REVIEW_REQUIRED: ReviewAnswer,
}

_PRIMARY = {
    ApprovalAnswer: "decision",
    MissingInformationAnswer: "value",
    ChoiceAnswer: "choice",
    ExternalConfirmationAnswer: "outcome",
    ReviewAnswer: "verdict",
}


def answer_schema(kind: InterruptKind | str) -> dict[str, Any]:
    """The JSON schema an answer to this kind of interrupt must match."""
    return ANSWER_SCHEMAS[InterruptKind(kind)].model_json_schema()


def parse_answer(
    kind: InterruptKind | str, value: Any, payload: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """Validate an answer. A bare string fills the kind's main field (`choice`, `verdict`…);
    a string holding a JSON object is read as the whole answer."""
    model = ANSWER_SCHEMAS[InterruptKind(kind)]
    if isinstance(value, str):
        stripped = value.strip()
        if stripped.startswith("{"):
            try:
                value = json.loads(stripped)
            except json.JSONDecodeError as exc:
                raise AnswerInvalid(f"the answer is not valid JSON: {exc}") from exc
        else:
            value = {_PRIMARY[model]: value}
    elif not isinstance(value, Mapping):
        value = {_PRIMARY[model]: value}
    try:
        answer = model.model_validate(dict(value))
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or '(root)'}: {e['msg']}" for e in exc.errors()
        )
        raise AnswerInvalid(f"an answer to {kind} must match its schema: {problems}") from exc
    options = (payload or {}).get("options")
    if isinstance(answer, ChoiceAnswer) and options and answer.choice not in options:
        raise AnswerInvalid(
            f"{answer.choice!r} is not one of the options: {', '.join(map(str, options))}"
        )
    return answer.model_dump(mode="json")


# --- frozen actions ---------------------------------------------------------------------------


def canonical_json(data: Any) -> str:
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


@dataclass(frozen=True, kw_only=True, slots=True)
class FrozenAction:
    """Exactly what would run if approved. The hash covers what the action does; the preview
    and blast radius are what a person reads."""

    run_id: str
    """The run proposing it."""
    call_id: str
    """The tool call: an approval covers this one call, not a later identical one."""
    tool: str
    """Tool name."""
    arguments: dict[str, Any]
    """Validated arguments."""
    contract_hash: str
    """Hash of the tool's contract: a changed tool is a different action."""
    effect: str = "read"
    """The tool's declared effect."""
    risk: str = "low"
    """The tool's declared risk."""
    preview: str = ""
    """One line a person can judge: `Refund 250.00 EUR to order A-17`."""
    blast_radius: str = ""
    """What it can affect: `irreversible; 1 payment of 250.00 EUR`."""
    digest: str | None = None
    """The hash over the full arguments, when `arguments` here has redacted fields."""

    @property
    def hash(self) -> str:
        if self.digest is not None:
            return self.digest
        return hashlib.sha256(
            canonical_json(
                {
                    "run_id": self.run_id,
                    "call_id": self.call_id,
                    "tool": self.tool,
                    "arguments": self.arguments,
                    "contract_hash": self.contract_hash,
                }
            ).encode()
        ).hexdigest()

    def to_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "call_id": self.call_id,
            "tool": self.tool,
            "arguments": self.arguments,
            "contract_hash": self.contract_hash,
            "effect": self.effect,
            "risk": self.risk,
            "preview": self.preview,
            "blast_radius": self.blast_radius,
            "hash": self.hash,
            "redacted": self.digest is not None,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> FrozenAction:
        return cls(
            run_id=str(data["run_id"]),
            call_id=str(data["call_id"]),
            tool=str(data["tool"]),
            arguments=dict(data.get("arguments") or {}),
            contract_hash=str(data.get("contract_hash", "")),
            effect=str(data.get("effect", "read")),
            risk=str(data.get("risk", "low")),
            preview=str(data.get("preview", "")),
            blast_radius=str(data.get("blast_radius", "")),
            digest=str(data["hash"]) if data.get("redacted") else None,
        )


_FIELD = re.compile(r"\{([A-Za-z_][A-Za-z0-9_.]*)\}")


def render_template(template: str, arguments: Mapping[str, Any]) -> str:
    """`Refund {amount} on {order_id}` filled from the arguments; unknown fields stay as is.

    Only plain (dotted) names are substituted, never attribute access or format specs, so a
    template cannot reach into Python objects.
    """

    def fill(m: re.Match[str]) -> str:
        value = lookup(arguments, m.group(1))
        return m.group(0) if value is lookup({}, "x") else str(value)

    return _FIELD.sub(fill, template)


def default_preview(tool: str, arguments: Mapping[str, Any], *, limit: int = 200) -> str:
    args = ", ".join(
        f"{k}={json.dumps(v, ensure_ascii=False, default=str)}" for k, v in arguments.items()
    )
    text = f"{tool}({args})"
    return text if len(text) <= limit else text[: limit - 1] + "…"


def default_blast_radius(effect: str, risk: str, compensation: str | None = None) -> str:
    what = {
        "read": "reads only",
        "write": "changes data outside the run",
        "reversible_write": "changes data outside the run; can be undone"
        + (f" by {compensation}" if compensation else ""),
        "irreversible": "irreversible: cannot be undone",
    }.get(effect, effect)
    return f"{what} (risk {risk})"


# --- approvals --------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class Approval:
    """A person's yes to one frozen action, as recorded."""

    id: str
    """Approval id (`apr_…`)."""
    interrupt_id: str
    """The interrupt it answers."""
    run_id: str
    """The run."""
    action_hash: str
    """The frozen action's hash the approver saw."""
    approver: str
    """Who approved."""
    approver_roles: tuple[str, ...]
    """Roles the approver held when approving."""
    granted_at: datetime
    """When."""
    expires_at: datetime
    """After this the approval no longer counts."""
    conditions: dict[str, Any] = field(default_factory=dict)
    """`max_<arg>`, `min_<arg>`, `<arg>_in` the action must still meet."""
    snapshot_hash: str = ""
    """The policy snapshot it was granted under."""
    revoked_at: datetime | None = None
    """When it was revoked, if it was."""
    revoked_by: str | None = None
    """Who revoked it."""
    revoke_reason: str = ""
    """Why."""

    @property
    def revoked(self) -> bool:
        return self.revoked_at is not None


@dataclass(frozen=True, kw_only=True, slots=True)
class Problem:
    """Why an approval does not hold."""

    code: Literal[
        "hash_mismatch", "expired", "revoked", "role_missing", "condition_failed", "self_approval"
    ]
    """Stable code."""
    reason: str
    """In words."""


def check_approval(
    approval: Approval,
    *,
    action_hash: str,
    arguments: Mapping[str, Any],
    now: datetime,
    approver_roles: frozenset[str],
    required_roles: Sequence[str],
    run_principal: str | None = None,
    allow_self_approval: bool = False,
) -> list[Problem]:
    """Everything wrong with an approval at the moment it would be used (empty: it holds).

    Whether policy still permits the action and whether the budget still has room are asked
    of the engine, which re-evaluates the call before an approval is even considered.
    """
    problems: list[Problem] = []
    if approval.action_hash != action_hash:
        problems.append(
            Problem(
                code="hash_mismatch",
                reason=f"approval {approval.id} is for action {approval.action_hash[:12]}, "
                f"not {action_hash[:12]}",
            )
        )
    if approval.revoked:
        by = f" by {approval.revoked_by}" if approval.revoked_by else ""
        problems.append(Problem(code="revoked", reason=f"approval {approval.id} was revoked{by}"))
    if now >= approval.expires_at:
        problems.append(
            Problem(
                code="expired",
                reason=f"approval {approval.id} expired at {approval.expires_at.isoformat()}",
            )
        )
    missing = [r for r in required_roles if r not in approver_roles]
    if missing:
        problems.append(
            Problem(
                code="role_missing",
                reason=f"{approval.approver} does not (or no longer) hold role "
                f"{', '.join(missing)}",
            )
        )
    if not allow_self_approval and run_principal is not None and approval.approver == run_principal:
        problems.append(
            Problem(
                code="self_approval",
                reason=f"{approval.approver} cannot approve an action of their own run",
            )
        )
    broken = check_constraints(approval.conditions, arguments)
    if broken:
        problems.append(
            Problem(
                code="condition_failed",
                reason=f"approval {approval.id} conditions not met: " + "; ".join(broken),
            )
        )
    return problems


# --- the fold -----------------------------------------------------------------------------------

InterruptStatus = Literal["pending", "approved", "denied", "answered", "superseded", "expired"]


@dataclass(kw_only=True, slots=True)
class Interrupt:
    """One interrupt of a run, with how (and whether) it was resolved."""

    id: str
    run_id: str
    kind: InterruptKind
    payload: dict[str, Any]
    raised_seq: int
    raised_at: datetime
    call_id: str | None = None
    effect_id: str | None = None
    status: InterruptStatus = "pending"
    approval: Approval | None = None
    denied_by: str | None = None
    deny_reason: str = ""
    answer: dict[str, Any] | None = None
    answered_by: str | None = None
    resolved_at: datetime | None = None
    expiry: ev.InterruptExpired | None = None
    """How it expired, when nobody answered by its deadline."""

    @property
    def deadline(self) -> Deadline | None:
        """When it stops waiting and what happens then (None: it waits until answered)."""
        return Deadline.of(self.payload)

    @property
    def expires_at(self) -> datetime | None:
        deadline = self.deadline
        return deadline.expires_at if deadline is not None else None

    @property
    def action(self) -> FrozenAction | None:
        data = self.payload.get("action")
        return FrozenAction.from_dict(data) if isinstance(data, Mapping) else None

    @property
    def action_hash(self) -> str:
        action = self.action
        return action.hash if action is not None else str(self.payload.get("action_hash", ""))

    @property
    def approver_roles(self) -> tuple[str, ...]:
        return tuple(self.payload.get("approver_roles") or ())

    @property
    def prompt(self) -> str:
        """What a person is asked, in one line."""
        action = self.action
        if action is not None and action.preview:
            return action.preview
        for key in ("question", "prompt", "summary", "message"):
            if self.payload.get(key):
                return str(self.payload[key])
        return self.kind.value.replace("_", " ")

    def to_dict(self) -> dict[str, Any]:
        action = self.action
        return {
            "interrupt_id": self.id,
            "run_id": self.run_id,
            "kind": self.kind.value,
            "status": self.status,
            "prompt": self.prompt,
            "call_id": self.call_id,
            "raised_at": self.raised_at.isoformat(),
            "action": action.to_dict() if action else None,
            "approver_roles": list(self.approver_roles),
            "reasons": list(self.payload.get("reasons") or ()),
            "answer_schema": answer_schema(self.kind),
            "approval_id": self.approval.id if self.approval else None,
            "expires_at": self.expires_at.isoformat() if self.expires_at else None,
            "on_expiry": self.deadline.on_expiry if self.deadline else None,
            "expiry": self.deadline.to_dict() if self.deadline else None,
        }


@dataclass(kw_only=True, slots=True)
class Book:
    """A run's authority record folded from its events: context, interrupts, approvals and the
    calls that succeeded (for rate and budget limits)."""

    run_id: str
    seq: int = 0
    status: str = "queued"
    context: RunContext | None = None
    snapshot_hash: str = ""
    interrupts: dict[str, Interrupt] = field(default_factory=dict)
    approvals: dict[str, Approval] = field(default_factory=dict)
    by_call: dict[str, list[str]] = field(default_factory=dict)
    """Call id -> its interrupts, oldest first."""
    call_args: dict[str, tuple[str, str]] = field(default_factory=dict)
    """Call id -> (tool, argument text); parsed only once the call succeeded (and so passed
    the gateway's size and depth limits)."""
    succeeded: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    decisions: list[ev.PolicyDecided] = field(default_factory=list)

    @classmethod
    def of(cls, run_id: str, events: Sequence[ev.Event]) -> Book:
        book = cls(run_id=run_id)
        for e in events:
            book.apply(e)
        return book

    @property
    def pending(self) -> list[Interrupt]:
        return [i for i in self.interrupts.values() if i.status == "pending"]

    def latest_for_call(self, call_id: str) -> Interrupt | None:
        ids = self.by_call.get(call_id)
        return self.interrupts[ids[-1]] if ids else None

    def apply(self, e: ev.Event) -> None:
        self.seq = e.seq
        status = ev.status_after(e)
        if status is not None:
            self.status = status.value
        match e:
            case ev.ContextBound():
                self.context = RunContext.from_dict(e.context)
                self.snapshot_hash = e.snapshot_hash
            case ev.ModelResponded():
                for c in e.message.tool_calls:
                    self.call_args[c.id] = (c.name, c.arguments)
            case ev.ToolCompleted():
                if not e.is_error and e.call_id in self.call_args:
                    name, text = self.call_args[e.call_id]
                    self.succeeded.append((name, _arguments(text)))
            case ev.PolicyDecided():
                self.decisions.append(e)
            case ev.InterruptRaised():
                if e.call_id is not None:
                    for old in self.by_call.get(e.call_id, []):
                        if self.interrupts[old].status == "pending":
                            self.interrupts[old].status = "superseded"
                    self.by_call.setdefault(e.call_id, []).append(e.interrupt_id)
                self.interrupts[e.interrupt_id] = Interrupt(
                    id=e.interrupt_id,
                    run_id=self.run_id,
                    kind=_kind(e.kind),
                    payload=dict(e.payload),
                    raised_seq=e.seq,
                    raised_at=e.occurred_at,
                    call_id=e.call_id,
                    effect_id=e.effect_id,
                )
            case ev.ApprovalGranted():
                approval = Approval(
                    id=e.approval_id,
                    interrupt_id=e.interrupt_id,
                    run_id=self.run_id,
                    action_hash=e.action_hash,
                    approver=e.approver,
                    approver_roles=tuple(e.approver_roles),
                    granted_at=e.occurred_at,
                    expires_at=e.expires_at,
                    conditions=dict(e.conditions),
                    snapshot_hash=e.snapshot_hash,
                )
                self.approvals[approval.id] = approval
                found = self.interrupts.get(e.interrupt_id)
                if found is not None:
                    found.status, found.approval, found.resolved_at = (
                        "approved",
                        approval,
                        e.occurred_at,
                    )
            case ev.ApprovalDenied():
                found = self.interrupts.get(e.interrupt_id)
                if found is not None:
                    found.status, found.resolved_at = "denied", e.occurred_at
                    found.denied_by, found.deny_reason = e.approver, e.reason
            case ev.ApprovalRevoked():
                old_approval = self.approvals.get(e.approval_id)
                if old_approval is not None:
                    revoked = _revoked(old_approval, e)
                    self.approvals[e.approval_id] = revoked
                    found = self.interrupts.get(revoked.interrupt_id)
                    if found is not None:
                        found.approval = revoked
            case ev.InterruptAnswered():
                found = self.interrupts.get(e.interrupt_id)
                if found is not None:
                    found.status, found.resolved_at = "answered", e.occurred_at
                    found.answer, found.answered_by = dict(e.value), e.answered_by
            case ev.InterruptExpired():
                found = self.interrupts.get(e.interrupt_id)
                if found is not None:
                    found.status, found.resolved_at, found.expiry = "expired", e.occurred_at, e
                    if e.on_expiry == "default":
                        found.answer, found.answered_by = dict(e.value), "default"
            case _:
                pass


def _arguments(text: str) -> dict[str, Any]:
    try:
        args = json.loads(text) if text.strip() else {}
    except (ValueError, RecursionError):
        return {}
    return args if isinstance(args, dict) else {}


def _kind(value: str) -> InterruptKind:
    try:
        return InterruptKind(value)
    except ValueError:
        return InterruptKind.MISSING_INFORMATION  # an unknown kind still shows up in the inbox


def _revoked(approval: Approval, e: ev.ApprovalRevoked) -> Approval:
    from dataclasses import replace

    return replace(
        approval, revoked_at=e.occurred_at, revoked_by=e.revoked_by, revoke_reason=e.reason
    )


def fmt_roles(roles: Sequence[str]) -> str:
    return " + ".join(roles) if roles else "(any)"


def interrupt_id_for(run_id: str, seq: int) -> str:
    """Interrupt ids are `RUN_ID.iSEQ`, so an id alone names the one run to read."""
    return f"{run_id}.i{seq}"


def run_of_interrupt(interrupt_id: str) -> str | None:
    """The run an interrupt id names (see `interrupt_id_for`), or None for any other text."""
    run_id, dot, tail = interrupt_id.rpartition(".")
    seq = tail[1:]
    if not (dot and run_id and tail[:1] == "i" and seq.isascii() and seq.isdigit()):
        return None
    return None if "\x00" in run_id else run_id


def approval_interrupt(run_id: str, seq: int, decided: ev.PolicyDecided) -> dict[str, Any]:
    """The fields of the InterruptRaised (numbered `seq`) that asks a person about a decided
    call: the frozen action and roles the policy gate put in the decision, or, from a policy
    hook that gives none, what the recorded decision says."""
    payload = dict(decided.interrupt_payload) or {
        "tool": decided.tool,
        "action_hash": decided.action_hash,
        "approver_roles": list(decided.approver_roles)
        or ([decided.approver_role] if decided.approver_role else []),
        "rule_ids": list(decided.rule_ids),
        "reasons": list(decided.reasons),
        "snapshot_hash": decided.snapshot_hash,
    }
    payload["decided_seq"] = decided.seq
    return {
        "interrupt_id": interrupt_id_for(run_id, seq),
        "kind": decided.interrupt_kind or InterruptKind.APPROVAL_REQUIRED.value,
        "payload": payload,
        "call_id": decided.call_id,
        "effect_id": decided.effect_id,
    }


def describe(event: ev.Event) -> str | None:
    """One readable line for the authority events (for timelines); None for other events."""
    match event:
        case ev.ContextBound():
            c = event.context
            p = c.get("principal") or {}
            scopes = c.get("scopes")
            parts = [
                f"acts for {p.get('kind')}:{p.get('id')}@{p.get('tenant')}",
                "scopes " + ", ".join(scopes if scopes is not None else p.get("scopes") or ["-"]),
                f"clearance {c.get('clearance')}",
            ]
            if c.get("tools") is not None:
                parts.append("tools " + ", ".join(c["tools"]))
            box = c.get("containment")
            if box:
                parts.append("roots " + (", ".join(box.get("roots") or []) or "-"))
                allow = (box.get("network") or {}).get("allow") or []
                parts.append("network " + (", ".join(allow) or "none"))
            parts.append(
                f"policy {event.policy_name} v{event.policy_version} "
                f"(snapshot {event.snapshot_hash[:12]})"
            )
            return " · ".join(parts)
        case ev.PolicyDecided():
            text = f"{event.tool} [{event.call_id}] {event.decision}"
            if event.rule_ids:
                text += " by " + ", ".join(event.rule_ids)
            roles = event.approver_roles or ((event.approver_role,) if event.approver_role else ())
            if roles and event.decision == "require_approval":
                text += f" (role {fmt_roles(roles)})"
            if event.absolute:
                text += " [absolute]"
            if event.reasons:
                text += ": " + "; ".join(event.reasons)
            if event.action_hash:
                text += f" · action {event.action_hash[:12]}"
            if event.snapshot_hash:
                text += f" · policy {event.snapshot_hash[:12]}"
            return text
        case ev.InterruptRaised():
            action = event.payload.get("action")
            what = (
                str(action.get("preview"))
                if isinstance(action, Mapping)
                else str(event.payload.get("question") or "")
            )
            text = f"{event.kind} {event.interrupt_id}: {what}"
            if isinstance(action, Mapping) and action.get("blast_radius"):
                text += f" · {action['blast_radius']}"
            wanted = event.payload.get("approver_roles")
            if wanted:
                text += f" · needs {fmt_roles(wanted)}"
            return text
        case ev.ApprovalGranted():
            return (
                f"{event.approval_id} approves {event.interrupt_id} by {event.approver} "
                f"({fmt_roles(event.approver_roles)}) until {event.expires_at.isoformat()} · "
                f"action {event.action_hash[:12]}"
                + (f" · conditions {canonical_json(event.conditions)}" if event.conditions else "")
            )
        case ev.ApprovalDenied():
            why = f": {event.reason}" if event.reason else ""
            return f"{event.interrupt_id} denied by {event.approver}{why}"
        case ev.ApprovalRevoked():
            why = f": {event.reason}" if event.reason else ""
            return f"{event.approval_id} revoked by {event.revoked_by}{why}"
        case ev.InterruptAnswered():
            return (
                f"{event.interrupt_id} ({event.kind}) answered by {event.answered_by}: "
                f"{canonical_json(event.value)}"
            )
        case ev.InterruptExpired():
            return (
                f"{event.interrupt_id} ({event.kind}) expired unanswered at "
                f"{event.expires_at.isoformat()} · on_expiry {event.on_expiry}"
                + (f" · answer {canonical_json(event.value)}" if event.value else "")
                + (f": {event.reason}" if event.reason else "")
            )
        case _:
            return None


# --- answers for tools that asked a person ---------------------------------------------------

_STORE: ContextVar[EventStore | None] = ContextVar("contextos_run_store", default=None)


def bind_store(store: EventStore) -> None:
    """Make the run's store readable to the tool calls that follow in this task."""
    _STORE.set(store)


async def recorded_answer(run_id: str, call_id: str) -> dict[str, Any] | None:
    """The answer a person gave to the latest interrupt about this tool call, from the log."""
    store = _STORE.get()
    if store is None:
        return None
    book = Book.of(run_id, await store.read(RunId(run_id)))
    found = book.latest_for_call(call_id)
    if found is None or found.status not in ("answered", "expired"):
        return None
    return found.answer  # for an expiry: the declared default, if that was the outcome
