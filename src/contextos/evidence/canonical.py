"""The canonical records ContextOS emits and accepts as JSON, as Pydantic models.

`RunContext`, `CompiledContext`, `ToolEnvelope`, `DecisionRecord` and `ReplayPacket` are the
public contract between ContextOS and what surrounds it (an audit store, an evaluation job,
another runtime). Their JSON Schemas are generated from these models and kept in
`contextos/evidence/schemas/` (`python -m contextos.evidence.schemas` rewrites them; a test fails
when they drift). Every record is validated whole when it is accepted: unknown fields, missing
ones and wrong types are refused (`RecordInvalid`), never guessed.

The runtime's own records (runs, events, effects, interrupts, artifacts, policy decisions) are
where these are projected from; none of these records is ever written by a model.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from contextos.errors import RecordInvalid

ApprovalMode = Literal["read_only", "local_write", "network", "delegated", "destructive"]
"""How much a tool call may do, from least to most."""

APPROVAL_MODES: tuple[ApprovalMode, ...] = (
    "read_only",
    "local_write",
    "network",
    "delegated",
    "destructive",
)

R = TypeVar("R", bound="Record")

_VERSION_FIELDS = ("record_type", "envelope_version")
"""The fields that name a record's version: an unknown one is refused as a version."""


class Record(BaseModel):
    """A canonical record: strict on the way in, canonical JSON on the way out."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    def to_json(self) -> str:
        """The record as JSON (keys in declaration order, indented for people)."""
        return self.model_dump_json(indent=2)

    @classmethod
    def from_json(cls: type[R], text: str | bytes) -> R:
        """Accept a record given as JSON; RecordInvalid says what is wrong with it."""
        try:
            return cls.model_validate_json(text)
        except ValidationError as exc:
            for e in exc.errors(include_url=False):
                if e["type"] == "literal_error" and e["loc"][-1] in _VERSION_FIELDS:
                    raise RecordInvalid(
                        f"{cls.__name__} version {e['input']!r} is not one this ContextOS reads "
                        f"({e['ctx']['expected']}): upgrade ContextOS to read it",
                        record=cls.__name__,
                    ) from None
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or '(root)'}: {e['msg']}"
                for e in exc.errors(include_url=False)[:5]
            )
            raise RecordInvalid(
                f"not a valid {cls.__name__}: {problems}", record=cls.__name__
            ) from None


def canonical_json(data: Any) -> str:
    """data as canonical JSON (sorted keys, no spaces): the same text on every machine."""
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def canonical_hash(data: Any) -> str:
    """sha256 of data as canonical JSON."""
    return hashlib.sha256(canonical_json(data).encode()).hexdigest()


def sealed(data: dict[str, Any], field: str) -> tuple[str, str]:
    """The canonical hash of `data` (which lacks `field`), and the canonical JSON of `data` with
    that hash under `field`, from one encoding where hashing then storing takes two (a long
    run's decision record is megabytes). Sorted keys put `field` between the same neighbours
    in both texts, so each is the members before it and after it, joined."""
    before = canonical_json({k: v for k, v in data.items() if k < field})[1:-1]
    after = canonical_json({k: v for k, v in data.items() if k > field})[1:-1]
    digest = hashlib.sha256(("{" + _members(before, after) + "}").encode()).hexdigest()
    stamp = f"{json.dumps(field)}:{json.dumps(digest)}"
    return digest, "{" + _members(before, stamp, after) + "}"


def _members(*parts: str) -> str:
    return ",".join(part for part in parts if part)


# -- RunContext ------------------------------------------------------------------------------


class Delegation(Record):
    auth_type: str = Field(
        description="How the principal was established (`asserted`: by the caller)."
    )
    scopes: list[str] = Field(description="Scopes delegated to the run.")
    subject: str = Field(description="The principal's ref, `kind:id@tenant`.")
    token_ref: str | None = Field(default=None, description="Reference to a credential, never one.")


class User(Record):
    user_id: str
    delegation: Delegation
    role: str | None = None


class AgentIdentity(Record):
    agent_id: str = Field(description="The agent's identity hash.")
    agent_urn: str = Field(description="`urn:contextos:agent:NAME:VERSION`.")
    workload_identity: str = Field(description="Where the agent is loaded from, or its name.")
    role: str
    lifecycle: str
    principal_chain: list[str] = Field(description="Refs the authority passed through.")


class RunContext(Record):
    """Who a run acts for, as which agent, under what limits."""

    record_type: Literal["contextos.run_context.v1"] = "contextos.run_context.v1"
    run_id: str
    trace_id: str
    tenant_id: str
    user: User
    agent: AgentIdentity
    safety_mode: str
    run_budget: dict[str, Any]
    session_id: str | None = None


# -- CompiledContext -------------------------------------------------------------------------

Bucket = Literal["business", "policy", "tool", "evidence", "memory", "session"]


class ContextBlock(Record):
    block_id: str
    bucket: Bucket
    content: str | None = Field(
        description="The text; None when rebuilt from the log, which keeps its hash only."
    )
    priority: int = Field(description="0 is kept first; higher numbers are cut first.")
    provenance_refs: list[str] = Field(description="Source, version, trust and content hash.")
    truncated: bool = False


class CompiledPrompt(Record):
    system: str | None = Field(description="The system text (None: only its hash is kept).")
    developer: str | None = None
    task: str = Field(description="What the run was asked.")
    context_blocks: list[ContextBlock]


class BudgetReport(Record):
    allocations: dict[str, int]
    used_at_compile: int
    bucket_truncations: dict[str, int]
    dropped_block_ids: list[str]


class ContextLedger(Record):
    entries: list[dict[str, Any]] = Field(description="The recorded manifest, one row per item.")
    hash: str = Field(description="The context hash the model call recorded.")


class CompiledContext(Record):
    """What one model call was given, with the lineage of every block."""

    record_type: Literal["contextos.compiled_context.v1"] = "contextos.compiled_context.v1"
    run_id: str
    trace_id: str
    model_call_seq: int = Field(description="Seq of the model call that saw it.")
    compiled_prompt: CompiledPrompt
    manifests: dict[str, Any] = Field(description="`policy`, `tool` and `evidence` manifests.")
    runtime_controls: dict[str, Any]
    budget_report: BudgetReport
    context_ledger: ContextLedger


# -- ToolEnvelope ----------------------------------------------------------------------------


class ToolCallEnvelope(Record):
    envelope_version: Literal["contextos.tool_call.v1"] = "contextos.tool_call.v1"
    tool_call_id: str
    run_id: str
    trace_id: str
    capability_id: str
    args: dict[str, Any] | None = Field(
        description="The arguments (fields the contract redacts as `[redacted]`); None when "
        "only their hash is kept."
    )
    args_sha256: str
    principal_chain: list[str]
    approval_mode_requested: ApprovalMode
    approval_mode_effective: ApprovalMode
    approval_mode_highest: ApprovalMode
    evidence_refs: list[str] = Field(description="`RUN_ID#SEQ` of the events behind it.")
    policy_decision_id: str | None = None
    idempotency_key: str | None = None


class ToolResultEnvelope(Record):
    envelope_version: Literal["contextos.tool_result.v1"] = "contextos.tool_result.v1"
    tool_call_id: str
    run_id: str
    status: Literal["ok", "error", "refused", "pending"]
    output_sha256: str | None = None
    error_code: str | None = None
    effect_id: str | None = None
    effect_state: str | None = None
    receipts: dict[str, str] = Field(default_factory=dict)
    evidence_refs: list[str]


class ToolEnvelope(Record):
    """One tool call and, once it has one, its result."""

    call: ToolCallEnvelope
    result: ToolResultEnvelope | None = None


# -- DecisionRecord --------------------------------------------------------------------------


class Traced(Record):
    seqs: list[int] = Field(description="The events this part is projected from.")


class Ask(Traced):
    input: str
    agent_name: str
    agent_version: str
    agent_hash: str
    agent_ref: str | None
    tool_manifest_hash: str
    budget: dict[str, Any]
    caused_by: str | None = None
    forked_from: str | None = Field(
        default=None, description="`RUN_ID#SEQ` this run's history was copied from."
    )


class PrincipalPart(Traced):
    principal: str
    tenant: str
    scopes: list[str]
    roles: list[str]
    clearance: str
    safety_mode: str
    principal_chain: list[str]
    context_hash: str


class PolicyPart(Traced):
    name: str
    version: str
    snapshot_hash: str


class ToolCallPart(Record):
    call_id: str
    tool: str
    arguments_sha256: str


class ModelCallPart(Traced):
    turn: int
    model: str
    context_hash: str | None
    manifest: list[dict[str, Any]]
    stack: list[str]
    tools_visible: list[str]
    finish_reason: str
    tool_calls: list[ToolCallPart]
    answer_sha256: str | None
    input_tokens: int
    output_tokens: int
    cost_usd: float
    latency_ms: float


class DecisionPart(Traced):
    decision: str
    rule_ids: list[str]
    reasons: list[str]
    snapshot_hash: str
    action_hash: str
    approval_id: str | None
    checks: list[dict[str, str]]


class ApprovalPart(Traced):
    interrupt_id: str
    kind: str
    outcome: Literal["pending", "approved", "denied", "answered", "expired", "revoked"]
    approval_id: str | None = None
    approver: str | None = None
    approver_roles: list[str] = Field(default_factory=list)
    frozen_hash: str = Field(description="Hash of the frozen action decided on.")
    expires_at: str | None = None
    reason: str = ""


class EffectPart(Traced):
    effect_id: str
    kind: str
    idempotency_key: str
    arguments: dict[str, Any]
    states: list[str]
    state: str
    receipts: dict[str, str]


class ResultPart(Traced):
    is_error: bool
    error_code: str | None
    output_sha256: str


class ActionPart(Traced):
    call_id: str
    tool: str
    proposed_seq: int
    arguments_sha256: str
    decisions: list[DecisionPart]
    approvals: list[ApprovalPart]
    effect: EffectPart | None
    result: ResultPart | None


class EvaluationPart(Traced):
    evaluator: str
    evaluator_kind: str
    evaluator_version: str
    subject_seq: int
    passed: bool
    gaps: list[str]


class ArtifactPart(Traced):
    artifact_id: str
    type: str
    schema_version: str
    content_hash: str
    classification: str
    source_events: list[int]
    input_artifacts: list[str]


class DelegationPart(Traced):
    delegation_id: str
    child_run_id: str
    agent_name: str
    node: str | None = Field(description="The workflow node it ran for, if any.")
    call_id: str | None = Field(description="The tool call that delegated it, if any.")
    objective: str
    allowed_tools: list[str]
    forbidden_effects: list[str]
    budget: dict[str, Any]
    status: str = Field(description="How it ended, as its parent took it in; or `running`.")
    reason: str | None
    result_sha256: str | None
    model_calls: int = Field(description="Its model calls, its own children's included.")
    input_tokens: int
    output_tokens: int
    cost_usd: float
    record_hash: str | None = Field(
        description="The hash of its own DecisionRecord, which this record vouches for."
    )


class CostPart(Traced):
    model_calls: int
    input_tokens: int
    output_tokens: int
    cost_usd: float


class OutcomePart(Traced):
    status: str
    checkpoint: Literal["terminal", "governed_checkpoint", "in_progress"]
    reason: str | None
    message: str | None
    output_sha256: str | None


class DecisionRecord(Record):
    """Who asked what, under which authority, what was decided and why, what happened, what
    came out: a projection of the run's log, every part naming the events it comes from."""

    record_type: Literal["contextos.decision_record.v1"] = "contextos.decision_record.v1"
    run_id: str
    trace_id: str
    correlation_id: str
    at_seq: int = Field(description="The record covers the log up to this seq.")
    ask: Ask
    principal: PrincipalPart | None
    policy: PolicyPart | None
    model_calls: list[ModelCallPart]
    actions: list[ActionPart]
    evaluations: list[EvaluationPart]
    artifacts: list[ArtifactPart]
    delegations: list[DelegationPart] | None = Field(
        default=None,
        # absent, not null, when the run started no child: such a record keeps the JSON and
        # the hash it had before child runs were part of the record
        exclude_if=lambda parts: parts is None,
        description="The child runs it started (absent when none): what each was given, how "
        "it ended, what it spent (not in `costs`, which are the run's own) and its record.",
    )
    costs: CostPart
    outcome: OutcomePart
    record_hash: str = Field(description="sha256 of the canonical JSON of everything else.")

    def content_hash(self) -> str:
        """The hash the record must carry: of every field but `record_hash`."""
        return canonical_hash(self.model_dump(mode="json", exclude={"record_hash"}))

    def verify(self) -> DecisionRecord:
        """The record, when its hash matches its content; RecordInvalid otherwise."""
        if self.content_hash() != self.record_hash:
            raise RecordInvalid(
                f"decision record of run {self.run_id}: its hash does not match its content "
                "(it was changed after it was made)",
                run_id=self.run_id,
            )
        return self


# -- ReplayPacket ----------------------------------------------------------------------------

SideEffectPolicy = Literal["transcript_only", "sandbox", "live_disallowed"]
ReplayStatus = Literal["not_run", "replay_equal", "replay_mismatch", "replay_error"]


class LoggedEvent(Record):
    schema_version: int
    event: dict[str, Any]


class Expected(Record):
    status: str
    failure_reason: str | None = None
    output_sha256: str | None = None
    decisions_sha256: str = Field(description="Hash of the recorded decisions a replay compares.")
    record_hash: str = Field(description="The recorded run's DecisionRecord hash.")


class LatestResult(Record):
    status: ReplayStatus = "not_run"
    agent_hash: str | None = None
    differences: list[str] = Field(default_factory=list)


class ReplayPacket(Record):
    """Everything a replay of a recorded run needs, pinned: the run's log (its ask, context,
    tool results and people's answers), the agent it ran, and what it decided."""

    record_type: Literal["contextos.replay_packet.v1"] = "contextos.replay_packet.v1"
    replay_packet_id: str
    trace_id: str
    source_kind: Literal["run"] = "run"
    source_ref: str = Field(description="The recorded run's id.")
    agent_ref: str | None = Field(description="The agent the run was recorded with.")
    context_pack_ref: str | None = Field(description="`RUN_ID#SEQ` of the first model call.")
    compiled_context_hash: str | None
    side_effect_policy: SideEffectPolicy = "transcript_only"
    tool_transcript_chain_hash: str
    expected: Expected
    latest_result: LatestResult = Field(default_factory=LatestResult)
    events: list[LoggedEvent]


RECORDS: dict[str, type[Record]] = {
    "RunContext": RunContext,
    "CompiledContext": CompiledContext,
    "ToolEnvelope": ToolEnvelope,
    "DecisionRecord": DecisionRecord,
    "ReplayPacket": ReplayPacket,
}
"""The five canonical records, by name: each has a schema `schemas/<name>.schema.json`."""


__all__ = [
    "APPROVAL_MODES",
    "RECORDS",
    "ApprovalMode",
    "CompiledContext",
    "DecisionRecord",
    "Record",
    "ReplayPacket",
    "RunContext",
    "ToolEnvelope",
    "canonical_hash",
    "canonical_json",
    "sealed",
]
