"""Findings: failures and near misses read from many runs' logs, clustered into patterns.

Each run's log is read for what went wrong (a failed tool call, arguments off the schema, an
outcome nobody can tell, a denial, a rejected answer, an exhausted budget, a run that kept
stopping for people); occurrences with the same agent, kind, subject and signature are one
pattern, and a pattern seen in at least `min_runs` runs is a finding. Code, no model: the same
logs always give the same findings.
"""

from __future__ import annotations

import dataclasses
import re
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from contextos import events as ev
from contextos.evidence.decisions import arguments
from contextos.improve.records import Evidence, Finding, FindingKind, RootCause, digest
from contextos.ledger import EffectState
from contextos.runs import FailureReason

_REFUSED = frozenset({"policy_denied", "approval_required", "unknown_tool", "invalid_arguments"})
_NUMBER = re.compile(r"\d+")
_QUOTED = re.compile(r"'[^']*'|\"[^\"]*\"")
INTERRUPTS_PER_RUN = 3
"""A run that stops for people this often shows a pattern of its own."""


def fold_values(text: str) -> str:
    """The text with numbers and quoted values folded, so occurrences cluster."""
    return _NUMBER.sub("N", _QUOTED.sub("'…'", text)).strip()[:200]


@dataclass(frozen=True, kw_only=True, slots=True)
class Observation:
    """One thing that went wrong in one run."""

    kind: FindingKind
    root_cause: RootCause
    subject: str
    signature: str
    evidence: Evidence


@dataclass(frozen=True, kw_only=True, slots=True)
class RunLog:
    """What the clustering needs to know about one run."""

    agent: str
    agent_hash: str
    agent_ref: str | None
    observations: tuple[Observation, ...]


def observe(events: Sequence[ev.Event]) -> RunLog:
    """What went wrong in one run's log."""
    created = events[0]
    assert isinstance(created, ev.RunCreated)
    calls = {  # call id -> (tool, canonical arguments)
        c.id: (c.name, arguments(c.arguments))
        for e in events
        if isinstance(e, ev.ModelResponded)
        for c in e.message.tool_calls
    }
    failed: dict[str, ev.ToolAttemptFailed] = {}
    out: list[Observation] = []
    interrupts: list[ev.InterruptRaised] = []
    effects: dict[str, str] = {}  # effect id -> call id
    for e in events:
        match e:
            case ev.ToolAttemptFailed():
                failed[e.call_id] = e
            case ev.EffectProposed():
                effects[e.effect_id] = e.call_id
            case ev.ToolCompleted(is_error=True) if e.error_code == "invalid_arguments":
                out.append(_call(FindingKind.INVALID_ARGUMENTS, e, calls, e.output, events))
            case ev.ToolCompleted(is_error=True) if e.error_code not in _REFUSED:
                attempt = failed.get(e.call_id)
                why = f"{attempt.error_type}: {attempt.error}" if attempt else e.output
                out.append(_call(FindingKind.TOOL_ERROR, e, calls, why, events))
            case ev.EffectChanged(state=EffectState.OUTCOME_UNKNOWN):
                tool = calls.get(effects.get(e.effect_id, ""), ("?", ""))[0]
                out.append(
                    _one(FindingKind.OUTCOME_UNKNOWN, RootCause.TOOL_CONTRACT, tool, e.note, e)
                )
            case ev.PolicyDecided(decision="deny"):
                rules = ", ".join(e.rule_ids) or "no rule"
                out.append(
                    _one(FindingKind.POLICY_DENIED, RootCause.INSTRUCTIONS, e.tool, rules, e)
                )
            case ev.EvaluationRecorded(passed=False):
                out.append(_rejected(e, events))
            case ev.RunFailed(reason=FailureReason.BUDGET_EXHAUSTED):
                out.append(
                    _one(
                        FindingKind.BUDGET_EXHAUSTED,
                        RootCause.RUN_CONSTRAINT,
                        "budget",
                        e.message,
                        e,
                    )
                )
            case ev.InterruptRaised():
                interrupts.append(e)
            case _:
                pass
    if len(interrupts) >= INTERRUPTS_PER_RUN:
        last = interrupts[-1]
        kinds = sorted({i.kind for i in interrupts})
        out.append(
            _one(
                FindingKind.REPEATED_INTERRUPTS,
                RootCause.POLICY,
                ", ".join(kinds),
                f"{len(interrupts)} questions in one run",
                last,
            )
        )
    return RunLog(
        agent=created.agent_name,
        agent_hash=created.agent_hash,
        agent_ref=created.agent_ref,
        observations=tuple(out),
    )


def _one(kind: FindingKind, cause: RootCause, subject: str, what: str, e: ev.Event) -> Observation:
    return Observation(
        kind=kind,
        root_cause=cause,
        subject=subject,
        signature=fold_values(what),
        evidence=Evidence(run_id=e.run_id, seq=e.seq, at=e.occurred_at, detail=what[:300]),
    )


def _call(
    kind: FindingKind,
    e: ev.ToolCompleted,
    calls: dict[str, tuple[str, str]],
    why: str,
    events: Sequence[ev.Event],
) -> Observation:
    """A failed call; a near miss when a later call of the same tool in the run worked (the
    model found out how to call it: what it was not told)."""
    tool, args = calls.get(e.call_id, (e.name, "{}"))
    later = next(
        (
            calls[d.call_id][1]
            for d in events
            if isinstance(d, ev.ToolCompleted)
            and d.seq > e.seq
            and not d.is_error
            and calls.get(d.call_id, ("", ""))[0] == tool
        ),
        None,
    )
    if later is not None:
        cause = RootCause.TOOL_DESCRIPTION
    elif kind is FindingKind.INVALID_ARGUMENTS:
        cause = RootCause.TOOL_CONTRACT
    else:
        cause = RootCause.TOOL_FAILURE
    return Observation(
        kind=kind,
        root_cause=cause,
        subject=tool,
        signature=fold_values(why),
        evidence=Evidence(
            run_id=e.run_id,
            seq=e.seq,
            at=e.occurred_at,
            detail=f"{tool} {args} -> {why}"[:300],
            call=f"{tool} {args}",
            recovered=later is not None,
            fix_hint=later or "",
        ),
    )


def _rejected(e: ev.EvaluationRecorded, events: Sequence[ev.Event]) -> Observation:
    """A rejected answer; a near miss when a later answer passed the same check (the model
    met it once its gaps were written back: the instructions never said it)."""
    gaps = "; ".join(e.gaps)
    met = any(
        isinstance(d, ev.EvaluationRecorded)
        and d.seq > e.seq
        and d.passed
        and d.evaluator == e.evaluator
        for d in events
    )
    seen = _one(
        FindingKind.VERIFICATION_FAILED,
        RootCause.INSTRUCTIONS if met else RootCause.VERIFIER,
        e.evaluator,
        gaps,
        e,
    )
    if not met:
        return seen
    evidence = seen.evidence.model_copy(update={"recovered": True, "fix_hint": gaps})
    return dataclasses.replace(seen, evidence=evidence)


def cluster(logs: Iterable[RunLog], *, min_runs: int = 2) -> list[Finding]:
    """The patterns seen in at least `min_runs` runs, most frequent first."""
    groups: dict[tuple[str, str, str, str], list[tuple[RunLog, Observation]]] = defaultdict(list)
    for log in logs:
        for o in log.observations:
            groups[(log.agent, o.kind, o.subject, o.signature)].append((log, o))
    found: list[Finding] = []
    for (agent, kind, subject, signature), seen in groups.items():
        seen.sort(key=lambda lo: (lo[1].evidence.at, lo[1].evidence.run_id, lo[1].evidence.seq))
        runs = tuple(dict.fromkeys(o.evidence.run_id for _, o in seen))
        if len(runs) < min_runs:
            continue
        latest, _ = seen[-1]
        causes = [o.root_cause for _, o in seen]
        found.append(
            Finding(
                finding_id="fnd_" + digest([agent, kind, subject, signature])[:16],
                kind=FindingKind(kind),
                root_cause=max(set(causes), key=causes.count),
                agent=agent,
                agent_hash=latest.agent_hash,
                agent_ref=latest.agent_ref,
                subject=subject,
                signature=signature,
                count=len(seen),
                runs=runs,
                recovered=sum(1 for _, o in seen if o.evidence.recovered),
                first_seen=seen[0][1].evidence.at,
                last_seen=seen[-1][1].evidence.at,
                evidence=tuple(o.evidence for _, o in seen),
            )
        )
    found.sort(key=lambda f: (-f.count, f.finding_id))
    return found


def example_calls(finding: Finding) -> tuple[str, str] | None:
    """The arguments of a failing call and of the call that then worked, from a near miss."""
    for e in finding.evidence:
        if e.recovered and e.fix_hint:
            return e.call.split(" ", 1)[-1], e.fix_hint
    return None


__all__ = ["Observation", "RunLog", "cluster", "example_calls", "fold_values", "observe"]
