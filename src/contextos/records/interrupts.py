"""Typed human interrupts, frozen actions and approvals: the records, as a run's log holds them.

A run that needs a person records an `InterruptRaised` event of one of six kinds, each with an
answer schema. For approvals the interrupt carries a `FrozenAction`: the exact tool, arguments
and contract, a preview and a blast radius, under one hash. An `Approval` names that hash, the
approver, an expiry and optional conditions. The fold (`contextos.state`) builds `Interrupt`
and `Approval` records from the events; deciding with them is `contextos.policy`'s work.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from contextos import events as ev
from contextos.errors import AnswerInvalid
from contextos.records.deadlines import Deadline


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

    @classmethod
    def of(cls, value: str) -> InterruptKind:
        """The kind a recorded interrupt names; an unknown one still shows up in the inbox."""
        try:
            return cls(value)
        except ValueError:
            return cls.MISSING_INFORMATION


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
    output: Any = None
    """What the action gave when it took effect, where the run needs it: a workflow code
    node's output (checked against the node's type when the workflow goes on)."""


Verdict = Literal["accept", "reject", "revise"]


class ItemReview(_Answer):
    """The verdict on one item of a review that covers several (a workflow map's results)."""

    verdict: Verdict
    comments: str = ""
    """Left empty: the review's own comments."""


class ReviewAnswer(_Answer):
    """review_required: accept, reject or send back with comments; for a review of several
    items, `verdict` and `comments` hold for each item that `items` (keyed by the item's
    number) does not give a verdict of its own."""

    verdict: Verdict
    comments: str = ""
    items: dict[str, ItemReview] = {}

    def given(self, item: str) -> tuple[Verdict, str]:
        """The verdict and comments this answer gives `item`: its own, where `items` names
        it, else the answer's."""
        own = self.items.get(item)
        if own is None:
            return self.verdict, self.comments
        return own.verdict, own.comments or self.comments


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
    if isinstance(answer, ReviewAnswer):
        _check_review(answer, payload or {})
        if not answer.items:  # a review of one result reads as it always did
            return answer.model_dump(mode="json", exclude={"items"})
    return answer.model_dump(mode="json")


def _check_review(answer: ReviewAnswer, payload: Mapping[str, Any]) -> None:
    """Every verdict the answer gives is one its item takes (revise only while it has
    revisions left), and every item it names is one the review covers."""
    items = payload.get("items")
    if not isinstance(items, list):  # one result under review
        verdicts = payload.get("verdicts")
        if answer.items:
            raise AnswerInvalid("this review is of one result: give a verdict, not items")
        if verdicts and answer.verdict not in verdicts:
            raise AnswerInvalid(
                f"{answer.verdict!r} is not a verdict this review takes: {', '.join(verdicts)}"
            )
        return
    covered = {str(entry.get("item")): entry for entry in items if isinstance(entry, Mapping)}
    unknown = sorted(set(answer.items) - set(covered))
    if unknown:
        raise AnswerInvalid(
            f"this review covers no item {', '.join(unknown)}; it covers items "
            + ", ".join(covered)
        )
    for item, entry in covered.items():
        verdict, _ = answer.given(item)
        takes = entry.get("verdicts") or []
        if takes and verdict not in takes:
            raise AnswerInvalid(
                f"{verdict!r} is not a verdict item {item} takes: {', '.join(takes)}"
                + ("" if item in answer.items else "; give it its own under items")
            )


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


# --- interrupts -----------------------------------------------------------------------------

InterruptStatus = Literal["pending", "approved", "denied", "answered", "superseded", "expired"]


@dataclass(kw_only=True, slots=True)
class Interrupt:
    """One interrupt of a run, with how (and whether) it was resolved."""

    id: str
    """`RUN_ID.iSEQ` (see `interrupt_id_for`)."""
    run_id: str
    """The run that asks."""
    kind: InterruptKind
    """What is asked."""
    payload: dict[str, Any]
    """What a person needs to answer it (the frozen action, the question, the deadline)."""
    raised_seq: int
    """Seq of the InterruptRaised event."""
    raised_at: datetime
    """When it was raised."""
    call_id: str | None = None
    """The tool call it is about, if any."""
    effect_id: str | None = None
    """The effect it is about, if any."""
    status: InterruptStatus = "pending"
    """pending; approved, denied, answered or expired; superseded when a later interrupt
    asks about the same call, or the effect it asks about settled, before anyone answered."""
    approval: Approval | None = None
    """The approval that answered it (revoked or not)."""
    denied_by: str | None = None
    """Who refused its action."""
    deny_reason: str = ""
    """Why."""
    answer: dict[str, Any] | None = None
    """The validated answer (for an expiry: the declared default, if that was the outcome)."""
    answered_by: str | None = None
    """Who answered (`default` for a declared default)."""
    resolved_at: datetime | None = None
    """When it stopped being pending because of an answer or an expiry."""
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


def approval_id_for(run_id: str, seq: int) -> str:
    """Approval ids are `apr.RUN_ID.SEQ`: the run, and the seq of the ApprovalGranted event."""
    return f"apr.{run_id}.{seq}"


def run_of_approval(approval_id: str) -> str | None:
    """The run an approval id names (see `approval_id_for`), or None for any other text."""
    head, dot, seq = approval_id.rpartition(".")
    if not (head.startswith("apr.") and dot and seq.isascii() and seq.isdigit()):
        return None
    run_id = head[4:]
    return run_id if run_id and "\x00" not in run_id else None


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
