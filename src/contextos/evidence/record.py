"""The DecisionRecord: a projection of a run's log, never written by a model.

`build_record(events)` reads the log once and says who asked what, under which principal and
policy snapshot, what each model call was given (its context manifest and the tools it could
see), what each tool call was, how policy decided on it, who approved it (the frozen action's
hash, the approver, the expiry), what effect it had and with which receipts, what the
evaluators found, which artifacts came out, what it cost, and why the run stopped. Every part
names the seqs of the events it comes from; the record's hash is of its canonical JSON, so the
same log gives the same hash on any machine.

The runtime materialises the record (stores it as a `decision_record` artifact) whenever a run
stops at a terminal state or waits on a person; `receipts` checks each stored one against the
log it was made from.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from contextos import events as ev
from contextos.errors import ArtifactCorrupt, RecordInvalid, RunNotFound
from contextos.evidence.canonical import DecisionRecord, canonical_hash, sealed
from contextos.policy.identity import classification_rank
from contextos.runs import Budget, RunId, RunStatus
from contextos.state import RunState, fold
from contextos.store.artifacts import JSON, Artifact, artifacts_of, make_artifact
from contextos.store.base import EventStore
from contextos.telemetry import trace_id_for

RECORD_TYPE = "decision_record"
"""The artifact type a materialised DecisionRecord is stored as."""

RECORD_VERSION = DecisionRecord.model_fields["record_type"].default

_APPROVAL_DEFAULTS: dict[str, Any] = {
    "approval_id": None,
    "approver": None,
    "expires_at": None,
    "reason": "",
}
"""What an approval part holds before anyone answers (its roles are added as a new list)."""


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def trace_hex(correlation_id: str) -> str:
    """The trace id of a run tree, as OpenTelemetry prints it."""
    return f"{trace_id_for(correlation_id):032x}"


def build_record(events: Sequence[ev.Event], state: RunState | None = None) -> DecisionRecord:
    """The DecisionRecord of a run's log (or of a prefix of it); `state` is that log folded,
    when the caller has folded it already."""
    return DecisionRecord.model_validate(record_data(events, state))


def record_data(events: Sequence[ev.Event], state: RunState | None = None) -> dict[str, Any]:
    """The DecisionRecord of a log as JSON data, its hash included: what `build_record` gives
    dumped to JSON, made without building a model per part (a long run has thousands of parts,
    and the runtime stores its record every time it stops)."""
    record = _unsealed(events, state)
    record["record_hash"] = canonical_hash(record)
    return record


def _unsealed(events: Sequence[ev.Event], state: RunState | None) -> dict[str, Any]:
    """The record's data without its hash."""
    if not events or not isinstance(events[0], ev.RunCreated):
        raise RecordInvalid(
            "a decision record is built from a run's log, which starts with run_created"
        )
    if state is None:
        state = fold(list(events))
    created = events[0]
    b = _Builder()
    for e in events:
        b.add(e)
    b.finish()
    correlation = created.correlation_id or created.run_id
    forked = b.forked
    return {
        "record_type": RECORD_VERSION,
        "run_id": created.run_id,
        "trace_id": trace_hex(correlation),
        "correlation_id": correlation,
        "at_seq": state.seq,
        "ask": {
            "input": created.input,
            "agent_name": state.agent_name,
            "agent_version": state.agent_version,
            "agent_hash": state.agent_hash,
            "agent_ref": state.agent_ref,
            "tool_manifest_hash": state.tool_manifest_hash,
            "budget": budget_of(created),
            "caused_by": created.caused_by,
            "forked_from": f"{forked.source_run_id}#{forked.at_seq}" if forked else None,
            "seqs": [created.seq, *([forked.seq] if forked else [])],
        },
        "principal": b.principal,
        "policy": b.policy,
        "model_calls": b.model_calls,
        "actions": list(b.actions.values()),
        "evaluations": b.evaluations,
        "artifacts": b.artifacts,
        **({"delegations": list(b.delegations.values())} if b.delegations else {}),
        "costs": {
            "model_calls": state.turns,
            "input_tokens": state.usage.input_tokens,
            "output_tokens": state.usage.output_tokens,
            "cost_usd": float(round(state.usage.cost_usd, 10)),
            "seqs": b.cost_seqs,
        },
        "outcome": _outcome(state, b.end),
    }


def budget_of(created: ev.RunCreated) -> dict[str, Any]:
    return _budget(created.budget)


def _budget(budget: Budget) -> dict[str, Any]:
    return {k: getattr(budget, k) for k in type(budget).__dataclass_fields__}


def _outcome(state: RunState, end: ev.Event | None) -> dict[str, Any]:
    if state.is_terminal:
        checkpoint = "terminal"
    elif state.status is RunStatus.INPUT_REQUIRED:
        checkpoint = "governed_checkpoint"
    else:
        checkpoint = "in_progress"
    return {
        "status": state.status.value,
        "checkpoint": checkpoint,
        "reason": state.failure_reason.value if state.failure_reason else None,
        "message": state.failure_message,
        "output_sha256": sha(state.output) if state.output is not None else None,
        "seqs": [end.seq if end is not None else state.seq],
    }


class _Builder:
    """Walks a log once, gathering each part (as the JSON its model dumps to) with the seqs it
    comes from."""

    def __init__(self) -> None:
        self.principal: dict[str, Any] | None = None
        self.policy: dict[str, Any] | None = None
        self.model_calls: list[dict[str, Any]] = []
        self.actions: dict[str, dict[str, Any]] = {}
        self.effect_calls: dict[str, str] = {}
        self.asked: dict[str, dict[str, Any]] = {}
        self.approvals: dict[str, dict[str, Any]] = {}
        self.evaluations: list[dict[str, Any]] = []
        self.artifacts: list[dict[str, Any]] = []
        self.delegations: dict[str, dict[str, Any]] = {}
        self.cost_seqs: list[int] = []
        self.end: ev.Event | None = None
        self.forked: ev.RunForked | None = None

    def add(self, e: ev.Event) -> None:
        match e:
            case ev.ContextBound():
                self._bound(e)
            case ev.ModelResponded():
                self._model_call(e)
            case ev.ContextCompacted():
                self.cost_seqs.append(e.seq)
            case ev.PolicyDecided():
                self._decided(e)
            case ev.EffectProposed():
                self._proposed(e)
            case ev.EffectChanged():
                self._effect_changed(e)
            case ev.InterruptRaised():
                self._raised(e)
            case ev.ApprovalGranted() | ev.ApprovalDenied() | ev.InterruptAnswered():
                self._answered(e)
            case ev.InterruptExpired():
                self._answered(e)
            case ev.ApprovalRevoked():
                self._revoked(e)
            case ev.ToolCompleted():
                self._completed(e)
            case ev.EvaluationRecorded():
                self.evaluations.append(
                    {
                        "evaluator": e.evaluator,
                        "evaluator_kind": e.evaluator_kind,
                        "evaluator_version": e.evaluator_version,
                        "subject_seq": e.subject_seq,
                        "passed": e.passed,
                        "gaps": list(e.gaps),
                        "seqs": [e.seq],
                    }
                )
            case ev.ArtifactRecorded():
                self.artifacts.append(
                    {
                        "artifact_id": e.artifact_id,
                        "type": e.artifact_type,
                        "schema_version": e.schema_version,
                        "content_hash": e.content_hash,
                        "classification": e.classification,
                        "source_events": list(e.source_events),
                        "input_artifacts": list(e.input_artifacts),
                        "seqs": [e.seq],
                    }
                )
            case ev.ChildRunStarted():
                self._delegated(e)
            case ev.ChildRunFinished():
                self._child_finished(e)
            case ev.RunCompleted() | ev.RunFailed() | ev.RunCancelled() | ev.RunExpired():
                self.end = e
            case ev.RunForked():
                self.forked = e
            case _:
                pass

    def _delegated(self, e: ev.ChildRunStarted) -> None:
        c = e.contract
        self.delegations[c.delegation_id] = {
            "delegation_id": c.delegation_id,
            "child_run_id": c.child_run_id,
            "agent_name": c.agent_name,
            "node": c.node,
            "call_id": c.call_id,
            "objective": c.objective,
            "allowed_tools": list(c.allowed_tools),
            "forbidden_effects": list(c.forbidden_effects),
            "budget": _budget(c.budget),
            "status": "running",
            "reason": None,
            "result_sha256": None,
            "model_calls": 0,
            "input_tokens": 0,
            "output_tokens": 0,
            "cost_usd": 0.0,
            "record_hash": None,
            "seqs": [e.seq],
        }

    def _child_finished(self, e: ev.ChildRunFinished) -> None:
        part = self.delegations.get(e.delegation_id)
        if part is None:  # not in a log the runtime wrote: a child finishes after it starts
            return
        part.update(
            status=e.status.value,
            reason=e.reason,
            result_sha256=canonical_hash(e.result) if e.result is not None else None,
            model_calls=e.turns,
            input_tokens=e.usage.input_tokens,
            output_tokens=e.usage.output_tokens,
            cost_usd=float(round(e.usage.cost_usd, 10)),
            record_hash=e.record_hash,
        )
        part["seqs"].append(e.seq)

    def _bound(self, e: ev.ContextBound) -> None:
        ctx = e.context
        principal = ctx.get("principal", {})
        scopes = ctx.get("scopes")
        self.principal = {
            "principal": f"{principal.get('kind')}:{principal.get('id')}@{principal.get('tenant')}",
            "tenant": str(principal.get("tenant", "")),
            "scopes": [
                str(s) for s in (scopes if scopes is not None else principal.get("scopes", ()))
            ],
            "roles": [str(r) for r in principal.get("roles", ())],
            "clearance": str(ctx.get("clearance", "")),
            "safety_mode": str(ctx.get("safety_mode", "")),
            "principal_chain": [str(p) for p in ctx.get("principal_chain", ())],
            "context_hash": e.context_hash,
            "seqs": [e.seq],
        }
        if e.snapshot_hash:
            self.policy = {
                "name": e.policy_name,
                "version": e.policy_version,
                "snapshot_hash": e.snapshot_hash,
                "seqs": [e.seq],
            }

    def _model_call(self, e: ev.ModelResponded) -> None:
        self.cost_seqs.append(e.seq)
        manifest = [dict(row) for row in e.context.get("manifest", ())]
        self.model_calls.append(
            {
                "turn": len(self.model_calls) + 1,
                "model": e.model,
                "context_hash": e.context_hash,
                "manifest": manifest,
                "stack": [str(layer) for layer in e.context.get("stack", ())],
                "tools_visible": [
                    str(row.get("id", "")).removeprefix("tool:")
                    for row in manifest
                    if row.get("type") == "tool_schema"
                ],
                "finish_reason": str(e.finish_reason),
                "tool_calls": [
                    {"call_id": c.id, "tool": c.name, "arguments_sha256": sha(c.arguments)}
                    for c in e.message.tool_calls
                ],
                "answer_sha256": sha(e.message.content) if e.message.content else None,
                "input_tokens": int(e.usage.input_tokens),
                "output_tokens": int(e.usage.output_tokens),
                "cost_usd": float(e.usage.cost_usd),
                "latency_ms": float(e.latency_ms),
                "seqs": [e.seq],
            }
        )
        for c in e.message.tool_calls:
            self.actions[c.id] = {
                "call_id": c.id,
                "tool": c.name,
                "proposed_seq": e.seq,
                "arguments_sha256": sha(c.arguments),
                "decisions": [],
                "approvals": [],
                "effect": None,
                "result": None,
                "seqs": [e.seq],
            }

    def _action(self, call_id: str | None, seq: int) -> dict[str, Any] | None:
        action = self.actions.get(call_id) if call_id is not None else None
        if action is not None:
            action["seqs"].append(seq)
        return action

    def _decided(self, e: ev.PolicyDecided) -> None:
        action = self._action(e.call_id, e.seq)
        if action is None:
            return
        action["decisions"].append(
            {
                "decision": str(e.decision),
                "rule_ids": [str(r) for r in e.rule_ids],
                "reasons": [str(r) for r in e.reasons],
                "snapshot_hash": e.snapshot_hash,
                "action_hash": e.action_hash,
                "approval_id": e.approval_id,
                "checks": [{str(k): str(v) for k, v in c.items()} for c in e.checks],
                "seqs": [e.seq],
            }
        )

    def _proposed(self, e: ev.EffectProposed) -> None:
        self.effect_calls[e.effect_id] = e.call_id
        action = self._action(e.call_id, e.seq)
        if action is not None:
            action["effect"] = {
                "effect_id": e.effect_id,
                "kind": e.kind,
                "idempotency_key": e.idempotency_key,
                "arguments": dict(e.arguments),
                "states": ["proposed"],
                "receipts": {},
                "seqs": [e.seq],
            }

    def _effect_changed(self, e: ev.EffectChanged) -> None:
        action = self._action(self.effect_calls.get(e.effect_id), e.seq)
        if action is None or action["effect"] is None:
            return
        effect = action["effect"]
        effect["states"].append(str(e.state))
        effect["receipts"].update(e.receipts)
        effect["seqs"].append(e.seq)

    def _raised(self, e: ev.InterruptRaised) -> None:
        call_id = e.call_id or self.effect_calls.get(e.effect_id or "")
        entry: dict[str, Any] = {
            "interrupt_id": e.interrupt_id,
            "kind": e.kind,
            "outcome": "pending",
            "frozen_hash": str(e.payload.get("action_hash", "")),
            "seqs": [e.seq],
        }
        self.asked[e.interrupt_id] = entry
        action = self._action(call_id, e.seq)
        if action is not None:
            if action["decisions"]:  # the decision that asked froze the action
                entry["frozen_hash"] = (
                    action["decisions"][-1]["action_hash"] or entry["frozen_hash"]
                )
            action["approvals"].append(entry)

    def _answered(
        self,
        e: ev.ApprovalGranted | ev.ApprovalDenied | ev.InterruptAnswered | ev.InterruptExpired,
    ) -> None:
        entry = self.asked.get(e.interrupt_id)
        if entry is None:
            return
        entry["seqs"].append(e.seq)
        for action in self.actions.values():
            if entry in action["approvals"]:
                action["seqs"].append(e.seq)
        match e:
            case ev.ApprovalGranted():
                entry.update(
                    outcome="approved",
                    approval_id=e.approval_id,
                    approver=e.approver,
                    approver_roles=list(e.approver_roles),
                    frozen_hash=e.action_hash or entry["frozen_hash"],
                    expires_at=e.expires_at.isoformat(),
                )
                self.approvals[e.approval_id] = entry
            case ev.ApprovalDenied():
                entry.update(outcome="denied", approver=e.approver, reason=e.reason)
                entry["frozen_hash"] = e.action_hash or entry["frozen_hash"]
            case ev.InterruptAnswered():
                entry.update(outcome="answered", approver=e.answered_by)
            case ev.InterruptExpired():
                entry.update(outcome="expired", reason=e.reason)

    def _revoked(self, e: ev.ApprovalRevoked) -> None:
        entry = self.approvals.get(e.approval_id)
        if entry is not None:
            entry.update(outcome="revoked", reason=e.reason or f"revoked by {e.revoked_by}")
            entry["seqs"].append(e.seq)

    def _completed(self, e: ev.ToolCompleted) -> None:
        action = self._action(e.call_id, e.seq)
        if action is None:
            return
        action["result"] = {
            "is_error": e.is_error,
            "error_code": e.error_code,
            "output_sha256": sha(e.output),
            "seqs": [e.seq],
        }

    def finish(self) -> None:
        for action in self.actions.values():
            action["approvals"] = [
                {**_APPROVAL_DEFAULTS, "approver_roles": [], **a} for a in action["approvals"]
            ]
            effect = action["effect"]
            if effect is not None:
                effect["state"] = effect["states"][-1]


# -- materialised records ---------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class Receipt:
    """A DecisionRecord the runtime stored, checked against the log it was made from."""

    artifact_id: str
    """Where it is stored ("" for a child run's record, which its parent's log vouches for)."""
    at_seq: int
    """The log prefix it covers."""
    record_hash: str
    """Its hash."""
    matches: bool
    """True when the log up to `at_seq` still gives exactly this record."""
    problem: str = ""
    """Why it does not match, in one line ("" when it does)."""
    anchor: str = ""
    """For a child run: the parent's event that holds the hash (`run_id#seq`)."""


OFF_LOOP = 256
"""Logs at least this long have their record built in a thread: it takes tens of milliseconds
at a thousand turns, during which the event loop (a worker's other runs, a lease to renew, the
caller waiting for the run's result) would otherwise stand still."""


async def materialise(
    store: object, events: Sequence[ev.Event], state: RunState | None = None
) -> Artifact | None:
    """Store the run's DecisionRecord as a `decision_record` artifact (once per log prefix);
    None when the store keeps no artifacts. `state` is the log folded, when the caller has
    folded it already (neither may change meanwhile: a long log's record is built in a
    thread)."""
    artifacts = artifacts_of(store)
    if artifacts is None:
        return None
    if len(events) >= OFF_LOOP:
        artifact, blob = await asyncio.to_thread(_as_artifact, events, state)
    else:
        artifact, blob = _as_artifact(events, state)
    await artifacts.put_artifact(artifact, blob)
    return artifact


async def record_hash(events: Sequence[ev.Event], state: RunState | None = None) -> str:
    """The hash of the log's DecisionRecord (built in a thread for a long log, like a stored
    one)."""
    if len(events) >= OFF_LOOP:
        data = await asyncio.to_thread(record_data, events, state)
    else:
        data = record_data(events, state)
    return str(data["record_hash"])


def _as_artifact(events: Sequence[ev.Event], state: RunState | None) -> tuple[Artifact, bytes]:
    if state is None:
        state = fold(list(events))
    record = _unsealed(events, state)
    record["record_hash"], text = sealed(record, "record_hash")
    parts = record["artifacts"]
    levels = ["internal", *(a["classification"] for a in parts)]
    return make_artifact(
        state,
        text,
        media_type=JSON,
        type=RECORD_TYPE,
        source_events=[record["at_seq"]],
        input_artifacts=[a["artifact_id"] for a in parts],
        schema_version=record["record_type"],
        classification=max(levels, key=classification_rank),
    )


async def receipts(store: EventStore, events: Sequence[ev.Event]) -> list[Receipt]:
    """Every stored DecisionRecord of the run, oldest first, each checked against its log;
    for a child run that ended, the hash its parent recorded as it took the child's result in."""
    if not events:
        return []
    out = await _stored(store, events)
    anchor = await _anchor(store, events)
    if anchor is not None:
        out.append(anchor)
    return sorted(out, key=lambda r: r.at_seq)


async def _anchor(store: EventStore, events: Sequence[ev.Event]) -> Receipt | None:
    """The receipt of a child run's record in its parent's log, once the parent took it in."""
    bound = next((e for e in events if isinstance(e, ev.DelegationBound)), None)
    if bound is None:
        return None
    run_id = events[0].run_id
    try:
        parent = await store.read(RunId(bound.contract.parent_run_id))
    except RunNotFound:
        return None
    for e in reversed(parent):
        if isinstance(e, ev.ChildRunFinished) and e.child_run_id == run_id and e.record_hash:
            # A run that ended takes no more events: its whole log is the one the hash was of.
            matches = await record_hash(events) == e.record_hash
            return Receipt(
                artifact_id="",
                at_seq=events[-1].seq,
                record_hash=e.record_hash,
                matches=matches,
                problem=""
                if matches
                else f"its log gives another record than the one {e.run_id}#{e.seq} vouches "
                "for (the log was changed after the child ended)",
                anchor=f"{e.run_id}#{e.seq}",
            )
    return None


async def _stored(store: object, events: Sequence[ev.Event]) -> list[Receipt]:
    artifacts = artifacts_of(store)
    if artifacts is None:
        return []
    out: list[Receipt] = []
    for artifact in await artifacts.run_artifacts(events[0].run_id):
        if artifact.type != RECORD_TYPE:
            continue
        at = artifact.source_events[0] if artifact.source_events else -1
        try:
            content = await artifacts.artifact_content(artifact.artifact_id)
            stored = DecisionRecord.from_json(content).verify()
        except (ArtifactCorrupt, RecordInvalid) as exc:
            out.append(
                Receipt(
                    artifact_id=artifact.artifact_id,
                    at_seq=at,
                    record_hash="",
                    matches=False,
                    problem=str(exc),
                )
            )
            continue
        rebuilt = build_record(events[: stored.at_seq]) if stored.at_seq <= len(events) else None
        expected = rebuilt.record_hash if rebuilt is not None else None
        if rebuilt is not None and stored.delegations is None and rebuilt.delegations:
            # stored before the record held the child runs: compared as it was made then
            expected = rebuilt.model_copy(update={"delegations": None}).content_hash()
        matches = expected == stored.record_hash
        out.append(
            Receipt(
                artifact_id=artifact.artifact_id,
                at_seq=stored.at_seq,
                record_hash=stored.record_hash,
                matches=matches,
                problem=""
                if matches
                else f"the log up to #{stored.at_seq} gives another record "
                "(the log was changed after it was stored)",
            )
        )
    return out


__all__ = [
    "RECORD_TYPE",
    "Receipt",
    "build_record",
    "materialise",
    "receipts",
    "record_data",
    "record_hash",
]
