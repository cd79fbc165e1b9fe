"""The canonical RunContext, CompiledContext and ToolEnvelope of a run, from its log; and a
canonical RunContext accepted back as the authority a new run acts under.

A compiled context rebuilt from the log carries each block's lineage and content hash, not its
text: the log keeps manifests, not rendered prompts.
"""

from __future__ import annotations

from collections.abc import Sequence

from contextos import events as ev
from contextos.errors import RecordInvalid
from contextos.evidence import canonical as c
from contextos.evidence.record import build_record, sha, trace_hex
from contextos.policy.identity import Principal, PrincipalKind
from contextos.policy.identity import RunContext as Authority

_BUCKETS: dict[str, tuple[c.Bucket, int]] = {
    "instruction": ("business", 0),
    "skill_catalog": ("business", 1),
    "tool_schema": ("tool", 1),
    "memory_fact": ("memory", 2),
    "retrieved_passage": ("evidence", 3),
    "history_summary": ("session", 4),
    "history": ("session", 5),
}
"""Item type -> (bucket, priority): what is cut first has the higher number."""

_MODES: dict[str, c.ApprovalMode] = {
    "read": "read_only",
    "write": "local_write",
    "reversible_write": "local_write",
    "irreversible": "destructive",
}


def _created(events: Sequence[ev.Event]) -> ev.RunCreated:
    if not events or not isinstance(events[0], ev.RunCreated):
        raise RecordInvalid("canonical records are built from a run's log (from its run_created)")
    return events[0]


def _trace(created: ev.RunCreated) -> str:
    return trace_hex(created.correlation_id or created.run_id)


def run_context(events: Sequence[ev.Event]) -> c.RunContext:
    """Who the run acts for, as which agent, under what limits."""
    created = _created(events)
    bound = next((e for e in events if isinstance(e, ev.ContextBound)), None)
    ctx = bound.context if bound is not None else {}
    principal = ctx.get("principal") or {"kind": "user", "id": "", "tenant": "", "roles": []}
    scopes = ctx.get("scopes")
    roles = list(principal.get("roles") or ())
    ref = f"{principal.get('kind')}:{principal.get('id')}@{principal.get('tenant')}"
    return c.RunContext(
        run_id=created.run_id,
        trace_id=_trace(created),
        tenant_id=str(principal.get("tenant", "")),
        user=c.User(
            user_id=str(principal.get("id", "")),
            delegation=c.Delegation(
                auth_type="asserted" if bound is not None else "none",
                scopes=list(scopes if scopes is not None else principal.get("scopes") or ()),
                subject=ref if bound is not None else "",
            ),
            role=roles[0] if roles else None,
        ),
        agent=c.AgentIdentity(
            agent_id=created.agent_hash,
            agent_urn=f"urn:contextos:agent:{created.agent_name}:{created.agent_version}",
            workload_identity=created.agent_ref or created.agent_name,
            role=str(principal.get("kind", "user")),
            lifecycle=str(created.metadata.get("lifecycle", "unspecified")),
            principal_chain=list(ctx.get("principal_chain") or ()),
        ),
        safety_mode=str(ctx.get("safety_mode", "standard")),
        run_budget={
            k: getattr(created.budget, k) for k in type(created.budget).__dataclass_fields__
        },
        session_id=created.metadata.get("session_id"),
    )


def authority_of(record: c.RunContext) -> Authority:
    """The authority a canonical RunContext describes, to start a run under (`context=`)."""
    user = record.user
    kinds = {k.value for k in PrincipalKind}
    return Authority(
        principal=Principal(
            kind=PrincipalKind(record.agent.role if record.agent.role in kinds else "user"),
            id=user.user_id,
            tenant=record.tenant_id,
            scopes=tuple(user.delegation.scopes),
            roles=(user.role,) if user.role else (),
        ),
        safety_mode=record.safety_mode,
        principal_chain=tuple(record.agent.principal_chain),
    )


def compiled_contexts(events: Sequence[ev.Event]) -> list[c.CompiledContext]:
    """What each model call of the run was given, with every block's lineage."""
    created = _created(events)
    bound = next((e for e in events if isinstance(e, ev.ContextBound)), None)
    policy = (
        {
            "name": bound.policy_name,
            "version": bound.policy_version,
            "snapshot": bound.snapshot_hash,
        }
        if bound is not None
        else {}
    )
    out: list[c.CompiledContext] = []
    for e in events:
        if not isinstance(e, ev.ModelResponded):
            continue
        rows = [dict(r) for r in e.context.get("manifest", ())]
        blocks = []
        for row in rows:
            bucket, priority = _BUCKETS.get(str(row.get("type")), ("business", 3))
            blocks.append(
                c.ContextBlock(
                    block_id=str(row.get("id", "")),
                    bucket=bucket,
                    content=None,
                    priority=priority,
                    provenance_refs=[
                        str(row.get("source", "")),
                        f"version:{row.get('version', '')}",
                        f"trust:{row.get('trust', '')}",
                        f"sha256:{row.get('sha256', '')}",
                    ],
                )
            )
        tools = [b.block_id.removeprefix("tool:") for b in blocks if b.bucket == "tool"]
        out.append(
            c.CompiledContext(
                run_id=created.run_id,
                trace_id=_trace(created),
                model_call_seq=e.seq,
                compiled_prompt=c.CompiledPrompt(
                    system=None, task=created.input, context_blocks=blocks
                ),
                manifests={
                    "policy": policy,
                    "tool": {"manifest_hash": created.tool_manifest_hash, "tools": tools},
                    "evidence": [b.block_id for b in blocks if b.bucket == "evidence"],
                },
                runtime_controls={
                    "stack": [str(layer) for layer in e.context.get("stack", ())],
                    "model": e.model,
                },
                budget_report=c.BudgetReport(
                    allocations={},
                    used_at_compile=sum(int(r.get("tokens", 0)) for r in rows),
                    bucket_truncations={},
                    dropped_block_ids=[],
                ),
                context_ledger=c.ContextLedger(entries=rows, hash=e.context_hash or ""),
            )
        )
    return out


def tool_envelopes(events: Sequence[ev.Event]) -> list[c.ToolEnvelope]:
    """Every tool call of the run and its result, as call and result envelopes."""
    created = _created(events)
    record = build_record(events)
    chain = record.principal.principal_chain if record.principal is not None else []
    calls = {
        call.id: call
        for e in events
        if isinstance(e, ev.ModelResponded)
        for call in e.message.tool_calls
    }
    out: list[c.ToolEnvelope] = []
    for a in record.actions:
        refs = [f"{created.run_id}#{s}" for s in a.seqs]
        requested = _MODES.get(a.effect.kind if a.effect is not None else "read", "read_only")
        approved = any(ap.outcome == "approved" for ap in a.approvals)
        refused = bool(a.decisions) and a.decisions[-1].decision in ("deny", "require_approval")
        effective: c.ApprovalMode = "delegated" if approved else requested
        if refused or (a.result is not None and a.result.error_code == "policy_denied"):
            effective = "read_only"
        highest = max(requested, effective, key=c.APPROVAL_MODES.index)
        call = c.ToolCallEnvelope(
            tool_call_id=a.call_id,
            run_id=created.run_id,
            trace_id=_trace(created),
            capability_id=f"tool:{a.tool}",
            args=dict(a.effect.arguments) if a.effect is not None else None,
            args_sha256=sha(calls[a.call_id].arguments) if a.call_id in calls else "",
            principal_chain=list(chain),
            approval_mode_requested=requested,
            approval_mode_effective=effective,
            approval_mode_highest=highest,
            evidence_refs=refs,
            policy_decision_id=(
                f"{created.run_id}#{a.decisions[-1].seqs[0]}" if a.decisions else None
            ),
            idempotency_key=a.effect.idempotency_key if a.effect is not None else None,
        )
        result = None
        if a.result is not None:
            code = a.result.error_code
            status = "ok"
            if a.result.is_error:
                status = "refused" if code in ("policy_denied", "approval_required") else "error"
            result = c.ToolResultEnvelope(
                tool_call_id=a.call_id,
                run_id=created.run_id,
                status=status,
                output_sha256=a.result.output_sha256,
                error_code=code,
                effect_id=a.effect.effect_id if a.effect is not None else None,
                effect_state=a.effect.state if a.effect is not None else None,
                receipts=dict(a.effect.receipts) if a.effect is not None else {},
                evidence_refs=[f"{created.run_id}#{s}" for s in a.result.seqs],
            )
        elif a.approvals and a.approvals[-1].outcome == "pending":
            result = c.ToolResultEnvelope(
                tool_call_id=a.call_id, run_id=created.run_id, status="pending", evidence_refs=refs
            )
        out.append(c.ToolEnvelope(call=call, result=result))
    return out


__all__ = ["authority_of", "compiled_contexts", "run_context", "tool_envelopes"]
