"""The events evidence is made of: forks of a run, evaluators' verdicts, artifacts.

Part of the one event union that `contextos.events` gathers (and re-exports); the codec knows
these types through it.
"""

from dataclasses import dataclass
from typing import Literal

from contextos.event_base import BaseEvent
from contextos.runs import RunStatus


@dataclass(frozen=True, kw_only=True, slots=True)
class RunForked(BaseEvent):
    """This run's history up to here is a copy of another run's first `at_seq` events; it goes
    on from there (with the agent named here). Effects the source run dispatched for calls in
    that history follow this event as the source recorded them, so none is sent again."""

    SETS_STATUS = RunStatus.QUEUED
    type: Literal["run_forked"] = "run_forked"
    source_run_id: str
    """The run forked."""
    at_seq: int
    """The last event of the source's history this run copies."""
    agent_name: str
    """The agent that goes on (the source's, or another)."""
    agent_version: str
    """Its version."""
    agent_hash: str
    """Its identity hash."""
    agent_ref: str | None = None
    """Where to import it from."""
    tool_manifest_hash: str = ""
    """Hash of its tools."""
    inherited_effects: tuple[str, ...] = ()
    """Effects whose later history in the source run follows this event."""
    inherited_actions: tuple[tuple[str, str, str], ...] = ()
    """(effect id, action key, contract hash) of each effect the source sent for a call made
    after `at_seq`: a call of this run asking the same of the same tool takes that effect's
    outcome instead of being sent (see `contextos.ledger.action_key`)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class EvaluationRecorded(BaseEvent):
    """An evaluator judged the run's answer (a pass as well as a failure)."""

    type: Literal["evaluation_recorded"] = "evaluation_recorded"
    evaluator: str
    """The evaluator's name (a verifier's `name`)."""
    evaluator_kind: str = ""
    """What it is: `function`, `output_type`, or the class of a custom verifier."""
    evaluator_version: str = ""
    """Which version judged: its declared `version`, or a hash of its code."""
    subject_seq: int
    """Seq of the answer it judged."""
    passed: bool
    """Its verdict."""
    gaps: tuple[str, ...] = ()
    """What it found missing or wrong."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ArtifactRecorded(BaseEvent):
    """The run produced an artifact; its content is a blob in the artifact store, by hash."""

    type: Literal["artifact_recorded"] = "artifact_recorded"
    artifact_id: str
    """Stable id of the artifact."""
    artifact_type: str
    """What it is: `run_output`, `child_result`, `report`, …"""
    schema_version: str = "1"
    """Version of its content's shape."""
    content_hash: str
    """sha256 of its content (hex)."""
    media_type: str
    """Media type of the content."""
    size: int
    """Bytes of content."""
    source_events: tuple[int, ...] = ()
    """Seqs of this run's events it was made from."""
    input_artifacts: tuple[str, ...] = ()
    """Artifacts it was made from."""
    policy_snapshot: str = ""
    """The policy snapshot the run was bound to."""
    classification: str = "internal"
    """Most sensitive data classification of what went into it."""


__all__ = ["ArtifactRecorded", "EvaluationRecorded", "RunForked"]
