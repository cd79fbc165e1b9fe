"""Which definition a new run of an agent runs: its code, or the candidate its release serves.

The improvement loop records each release and rollback as a run of its own; the release line
of an agent is read from those runs' logs (a release counts only when a person approved
exactly its call). When a run is created, `route` picks what it runs (during a canary, by a
hash of the new run's id) and the run's first event records it under `BOUND`, so a worker
resuming the run from its agent reference runs the same definition, and a canary's two arms
can be told apart from the log.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from contextos import events as ev
from contextos.agents import Agent
from contextos.errors import ConfigError, ReleaseRefused
from contextos.runs import RunStatus
from contextos.state import RunState
from contextos.store import EventStore
from contextos.tools.contract import Tool

RELEASE_AGENT = "contextos-improve-release"
ROLLBACK_AGENT = "contextos-improve-rollback"
RELEASE_TOOL = "release_candidate"
ROLLBACK_TOOL = "roll_back_release"
BOUND = "contextos.release"
"""The key of a run's metadata that records the release it runs under."""
DECISION_RUNS = "run_release_"
"""The id prefix of release and rollback runs (then a hash of the agent's name)."""
SCAN_LIMIT = 10_000


class Change(BaseModel):
    """An exact change to an agent definition."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["tool_description", "instructions"]
    target: str = ""
    """The tool whose description changes (empty for instructions)."""
    text: str
    """The new description, or the instruction appended to the agent's."""


class Decision(BaseModel):
    """A release or a rollback: which candidate the agent runs now (None: its code as is)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    action: Literal["release", "rollback"]
    agent: str
    candidate_id: str | None
    candidate_hash: str | None
    report_id: str | None
    report_hash: str | None
    decided_by: str
    """Who approved the release, or who rolled back."""
    reason: str = ""
    fraction: float = 1.0
    """The share of new runs a release serves: below 1 it is a canary (the other runs stay
    on the release before it)."""
    base_hash: str | None = None
    """The identity hash of the agent code the candidate changes."""
    change: Change | None = None
    """The candidate's change (None: the agent's code as it is)."""
    criteria: tuple[str, ...] = ()
    """What a canary is judged on (`tool_error_rate <= 0.1`, …), as its releaser approved."""


class Binding(BaseModel):
    """What a run was bound to at its start, recorded in its metadata under `BOUND`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    decision: str
    """The release or rollback run whose decision was in force."""
    candidate_id: str | None
    """The candidate the run runs (None: the agent's code as it is)."""
    canary: bool | None = None
    """During a canary: whether this run is one of the canary's (None: no canary)."""
    change: Change | None = None


def apply(agent: Agent, change: Change) -> Agent:
    """The agent with `change` made."""
    if change.kind == "instructions":
        joined = f"{agent.instructions.rstrip()}\n{change.text}".strip()
        return dataclasses.replace(agent, instructions=joined)
    names = [t.name for t in agent.tools if isinstance(t, Tool)]
    if change.target not in names:
        raise ConfigError(
            f"agent {agent.name} has no tool {change.target!r} to describe: it has "
            f"{', '.join(names) or 'none'}",
            tool=change.target,
        )
    tools = tuple(
        dataclasses.replace(t, description=change.text)
        if isinstance(t, Tool) and t.name == change.target
        else t
        for t in agent.tools
    )
    return dataclasses.replace(agent, tools=tools)


BUCKETS = 16**8


def in_canary(key: str | None, fraction: float, *, salt: str) -> bool:
    """Whether the run `key` names is one of the canary's (no key: never)."""
    if key is None:
        return False
    bucket = int(hashlib.sha256(f"{salt}/{key}".encode()).hexdigest()[:8], 16)
    return bucket < fraction * BUCKETS


# -- the release line ------------------------------------------------------------------------


def decision_run_id(agent: str) -> str:
    """A new id for a release or rollback run of `agent` (found again by its prefix)."""
    return f"{_prefix(agent)}{uuid.uuid4().hex[:16]}"


def _prefix(agent: str | None) -> str:
    if agent is None:
        return DECISION_RUNS
    return f"{DECISION_RUNS}{hashlib.sha256(agent.encode()).hexdigest()[:12]}_"


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Decided:
    """A decision, where its run recorded it."""

    decision: Decision
    run_id: str
    seq: int
    """The `tool_completed` event that is the decision."""
    at: datetime


def decided(events: Sequence[ev.Event]) -> Decided | None:
    """The decision a release or rollback run's log records, or None: a release counts only
    when its call completed under an approval a person granted for it."""
    created = events[0]
    assert isinstance(created, ev.RunCreated)
    calls: dict[str, dict[str, Any]] = {}
    approvers: dict[str, str] = {}  # interrupt id -> approver
    allowed_by: dict[str, str] = {}  # call id -> approver, from the decision that let it run
    for e in events:
        match e:
            case ev.ModelResponded():
                for c in e.message.tool_calls:
                    calls[c.id] = json.loads(c.arguments)
            case ev.ApprovalGranted():
                approvers[e.approval_id] = e.approver
            case ev.PolicyDecided(decision="allow") if e.approval_id in approvers:
                allowed_by[e.call_id] = approvers[e.approval_id]
            case ev.ToolCompleted(is_error=False) if e.call_id in calls:
                args = calls[e.call_id]
                if e.name == RELEASE_TOOL and created.agent_name == RELEASE_AGENT:
                    approver = allowed_by.get(e.call_id)
                    if approver is None:
                        return None
                    candidate = _candidate_of(created)
                    if candidate is None or candidate["candidate_hash"] != args["candidate_hash"]:
                        return None
                    decision = Decision(
                        action="release",
                        agent=args["agent"],
                        candidate_id=args["candidate_id"],
                        candidate_hash=args["candidate_hash"],
                        report_id=args["report_id"],
                        report_hash=args["report_hash"],
                        decided_by=approver,
                        fraction=args.get("fraction", 1.0),
                        base_hash=candidate["base_hash"],
                        change=Change.model_validate(candidate["change"]),
                        criteria=tuple(args.get("criteria", ())),
                    )
                elif e.name == ROLLBACK_TOOL and created.agent_name == ROLLBACK_AGENT:
                    decision = Decision(
                        action="rollback",
                        agent=args["agent"],
                        candidate_id=args["to_candidate"],
                        candidate_hash=None,
                        report_id=None,
                        report_hash=None,
                        decided_by=args["by"],
                        reason=args.get("reason", ""),
                    )
                else:
                    continue
                return Decided(decision=decision, run_id=e.run_id, seq=e.seq, at=e.occurred_at)
            case _:
                pass
    return None


def _candidate_of(created: ev.RunCreated) -> dict[str, Any] | None:
    """The candidate a release run's input names (None: not a release request)."""
    try:
        candidate = json.loads(created.input)["candidate"]
    except (ValueError, KeyError, TypeError):
        return None
    return candidate if isinstance(candidate, dict) else None


async def release_line(store: EventStore, agent: str | None = None) -> list[Decided]:
    """Every release and rollback decision, oldest first (of one agent, when named).

    A rollback counts only when it goes back to a release made before it (or to the code):
    rolling back needs no approval, so it can never reach what nobody approved. A rollback
    to a release serves that release's candidate."""
    found: list[Decided] = []
    runs = await store.list_runs(
        status=RunStatus.COMPLETED, limit=SCAN_LIMIT, prefix=_prefix(agent)
    )
    for summary in runs:
        if summary.agent_name in (RELEASE_AGENT, ROLLBACK_AGENT):
            one = decided(await store.read(summary.run_id))
            if one is not None and (agent is None or one.decision.agent == agent):
                found.append(one)
    found.sort(key=lambda d: (d.at, d.run_id))
    approved: dict[tuple[str, str | None], Decision] = {}
    out: list[Decided] = []
    for d in found:
        x = d.decision
        if x.action == "release":
            approved[(x.agent, x.candidate_id)] = x
        elif x.candidate_id is not None:
            to = approved.get((x.agent, x.candidate_id))
            if to is None:
                continue
            served = {"candidate_hash": to.candidate_hash, "base_hash": to.base_hash}
            x = x.model_copy(update={**served, "change": to.change})
            d = dataclasses.replace(d, decision=x)
        out.append(d)
    return out


# -- routing new runs --------------------------------------------------------------------------


async def route(store: EventStore, agent: Agent, key: str | None) -> tuple[Agent, Binding | None]:
    """The definition a new run of `agent` runs, and what to record of it (None: the agent
    was never released). During a canary, `key` (the new run's id) picks the side."""
    line = await release_line(store, agent.name)
    if not line:
        return agent, None
    last = line[-1]
    serving: Decision | None = last.decision
    canary: bool | None = None
    if last.decision.action == "release" and last.decision.fraction < 1:
        canary = in_canary(key, last.decision.fraction, salt=last.run_id)
        if not canary:
            serving = line[-2].decision if len(line) > 1 else None
    binding = Binding(
        decision=last.run_id,
        candidate_id=serving.candidate_id if serving else None,
        canary=canary,
        change=serving.change if serving else None,
    )
    if serving is None or serving.change is None:
        return agent, binding
    if agent.identity_hash() != serving.base_hash:
        raise ReleaseRefused(
            f"agent {agent.name} is released as candidate {serving.candidate_id}, made for its "
            f"code {str(serving.base_hash)[:12]}, but this code is {agent.identity_hash()[:12]}: "
            f"release a candidate made from the current code, or `contextos rollback "
            f"{agent.name}`",
            candidate=serving.candidate_id,
        )
    changed = apply(agent, serving.change)
    if changed.identity_hash() != serving.candidate_hash:  # pragma: no cover - deterministic
        raise ReleaseRefused(f"candidate {serving.candidate_id} no longer gives its hash")
    return changed, binding


def bound(agent: Agent, state: RunState | ev.RunCreated) -> Agent:
    """`agent` as the run (its state or first event) was bound to at its start: with its
    release's change when the run recorded one and `agent` is the code it was made to."""
    if agent.identity_hash() == state.agent_hash:
        return agent
    binding = binding_of(state.metadata)
    if binding is None or binding.change is None:
        return agent
    changed = apply(agent, binding.change)
    return changed if changed.identity_hash() == state.agent_hash else agent


def binding_of(metadata: dict[str, Any]) -> Binding | None:
    """What a run's metadata says it was bound to at its start (None: no release)."""
    try:
        return Binding.model_validate(metadata[BOUND])
    except (KeyError, ValidationError):
        return None


__all__ = [
    "BOUND",
    "RELEASE_AGENT",
    "RELEASE_TOOL",
    "ROLLBACK_AGENT",
    "ROLLBACK_TOOL",
    "Binding",
    "Change",
    "Decided",
    "Decision",
    "apply",
    "binding_of",
    "bound",
    "decided",
    "decision_run_id",
    "in_canary",
    "release_line",
    "route",
]
