"""The effect ledger's vocabulary: effect states, the moves between them, the folded record.

Events carry these states and the fold builds `Effect` records from them; the code that moves
effects along (the tool runner) lives in `contextos.tools.effects`. This module sits beside
`runs.py` in the core so that events and the fold can use it without importing the tools.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class EffectState(StrEnum):
    """Where one side-effecting tool call stands."""

    PROPOSED = "proposed"
    VALIDATED = "validated"
    AUTHORISED = "authorised"
    DISPATCHED = "dispatched"
    COMMITTED = "committed"
    VERIFIED = "verified"
    OUTCOME_UNKNOWN = "outcome_unknown"
    RECONCILING = "reconciling"
    FAILED = "failed"
    DENIED = "denied"
    COMPENSATING = "compensating"
    COMPENSATED = "compensated"

    @property
    def is_final(self) -> bool:
        """No further move is expected without a compensation."""
        return self in _FINAL

    @property
    def in_flight(self) -> bool:
        """The call may be happening (or may have happened) without its outcome recorded."""
        return self in _IN_FLIGHT

    @property
    def took_effect(self) -> bool:
        return self in (EffectState.COMMITTED, EffectState.VERIFIED)


_FINAL = frozenset(
    {
        EffectState.COMMITTED,
        EffectState.VERIFIED,
        EffectState.FAILED,
        EffectState.DENIED,
        EffectState.COMPENSATED,
    }
)
_IN_FLIGHT = frozenset(
    {EffectState.DISPATCHED, EffectState.OUTCOME_UNKNOWN, EffectState.RECONCILING}
)

S = EffectState
EFFECT_TRANSITIONS: dict[EffectState, frozenset[EffectState]] = {
    S.PROPOSED: frozenset({S.VALIDATED, S.FAILED}),
    S.VALIDATED: frozenset({S.AUTHORISED, S.DENIED, S.FAILED}),
    S.AUTHORISED: frozenset({S.DISPATCHED, S.FAILED}),
    # dispatched -> dispatched is the next attempt of a retry with the same key.
    S.DISPATCHED: frozenset({S.DISPATCHED, S.COMMITTED, S.FAILED, S.OUTCOME_UNKNOWN}),
    S.OUTCOME_UNKNOWN: frozenset({S.RECONCILING, S.DISPATCHED, S.COMMITTED, S.FAILED}),
    S.RECONCILING: frozenset({S.RECONCILING, S.COMMITTED, S.FAILED, S.OUTCOME_UNKNOWN}),
    S.COMMITTED: frozenset({S.VERIFIED, S.COMPENSATING}),
    S.VERIFIED: frozenset({S.COMPENSATING}),
    S.COMPENSATING: frozenset({S.COMPENSATED, S.FAILED, S.COMPENSATING}),
    S.FAILED: frozenset(),
    S.DENIED: frozenset(),
    S.COMPENSATED: frozenset(),
}
"""Allowed moves. Anything else in a log is corruption and stops the fold."""
del S


MAX_DISPATCHES = 5
"""An idempotent call whose outcome stays unknown is sent at most this many times in all;
after that a person decides."""


def can_move(current: EffectState, new: EffectState) -> bool:
    return new in EFFECT_TRANSITIONS[current]


@dataclass(kw_only=True, slots=True)
class Effect:
    """One side-effecting call as the fold sees it (owned and updated by the fold)."""

    effect_id: str
    """Stable id: derived from the run and the call."""
    call_id: str
    """The tool call that proposed it."""
    tool: str
    """Tool name."""
    kind: str
    """The tool's declared effect: write, reversible_write or irreversible."""
    idempotency_key: str
    """Sent to the provider on every attempt; the same across retries and resumes."""
    contract_hash: str
    """Hash of the tool contract the effect was proposed under."""
    arguments: dict[str, Any] = field(default_factory=dict)
    """Validated arguments (redacted fields replaced)."""
    compensation: str | None = None
    """Tool that undoes it, when the contract declares one."""
    compensates: str | None = None
    """For a compensation call: the effect it undoes."""
    state: EffectState = EffectState.PROPOSED
    """Current state."""
    attempts: int = 0
    """Dispatches so far."""
    receipts: dict[str, str] = field(default_factory=dict)
    """Provider request id, confirmation id, … gathered over its life."""
    output: str | None = None
    """What the model was (or will be) shown when it settled."""
    error_code: str | None = None
    """Stable code when it failed."""
    history: list[tuple[int, EffectState]] = field(default_factory=list)
    """(seq, state) for every move, oldest first."""


def compensable(effect: Effect) -> bool:
    """A committed reversible write whose contract names a compensation."""
    return (
        effect.state.took_effect
        and effect.compensation is not None
        and effect.kind == "reversible_write"
    )


def never_sent(effect: Effect) -> bool:
    """A call (not a compensation) still short of being sent, e.g. waiting for an approval:
    ending its run settles it as not sent, with no word from its tool."""
    return effect.compensates is None and effect.state in (
        EffectState.PROPOSED,
        EffectState.VALIDATED,
        EffectState.AUTHORISED,
    )


def abandoned(effect: Effect, why: str) -> dict[str, Any]:
    """The `effect_changed` fields that settle a call never sent as failed, `why` shown to
    the model."""
    return {
        "effect_id": effect.effect_id,
        "state": EffectState.FAILED,
        "error_code": "not_sent",
        "output": why,
        "note": why,
    }


def unsettled(effect: Effect) -> bool:
    """Must this effect be resolved or compensated before its run may end?"""
    if effect.compensates is not None:
        return not effect.state.is_final
    return (
        effect.state in (EffectState.PROPOSED, EffectState.VALIDATED, EffectState.AUTHORISED)
        or effect.state.in_flight
        or effect.state is EffectState.COMPENSATING
        or compensable(effect)
    )


def idempotency_key(run_id: str, call_id: str) -> str:
    return f"{run_id}/{call_id}"


def effect_id_for(key: str) -> str:
    """Effect ids are derived from the idempotency key: unique across runs, stable on resume."""
    return "eff_" + hashlib.sha256(key.encode()).hexdigest()[:24]


def action_key(tool: str, arguments: str) -> str:
    """What a call asks a tool to do, as a hash: the tool and its arguments as the model wrote
    them, key order and spacing aside (a forked run matches its calls against its source's)."""
    try:
        canonical = json.dumps(json.loads(arguments), sort_keys=True, separators=(",", ":"))
    except ValueError:
        canonical = arguments
    return hashlib.sha256(f"{tool}\0{canonical}".encode()).hexdigest()
