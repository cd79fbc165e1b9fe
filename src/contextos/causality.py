"""Why each event happened: the runtime fills in causation and correlation before an append.

The causation id is the seq of the event, in the same run, that this one follows from:

- a step about a tool call, an effect or an interrupt follows the latest event about the same
  call, effect or interrupt (a decision follows the model's proposal or a person's approval, a
  dispatch its authorisation, a result its commit, an approval the question it answers);
- a model answer, a verdict and a compaction follow the message they answer (the last one);
- an artifact follows the events it was made from;
- the completion follows the answer it names, and an end after `run_ending` that request;
- a run's first event, a person's message and a person's request to end a run have no cause
  in the run (their actor says who);
- anything else (a worker taking the run, a budget running out) follows the event before it.

The correlation id names the run tree: the root run's id, shared by every run a trigger or a
parent started from it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from contextos import events as ev
from contextos.state import RunState, threads

_ANSWERING = (ev.ModelResponded, ev.ContextCompacted, ev.VerificationFailed, ev.EvaluationRecorded)
_EXTERNAL = (ev.UserMessageAdded, ev.RunEnding, ev.RunCancelled)


def stamp(state: RunState, events: Sequence[ev.Event]) -> list[ev.Event]:
    """`events`, about to be appended after `state`, with their causation and correlation ids
    filled in where the code that made them left them unset."""
    out: list[ev.Event] = []
    latest: dict[str, int] = {}  # what this batch adds to `state.causes`
    correlation = state.correlation_id
    for event in events:
        if isinstance(event, ev.RunCreated):
            correlation = event.correlation_id or event.run_id
        keys = threads(state, event)
        cause = event.causation_id
        if cause is None:
            cause = _cause(state, event, [latest.get(k) or state.causes.get(k) for k in keys])
        corr = event.correlation_id or correlation or event.run_id
        if cause != event.causation_id or corr != event.correlation_id:
            event = dataclasses.replace(event, causation_id=cause, correlation_id=corr)
        for key in keys:
            latest[key] = event.seq
        out.append(event)
    return out


def _cause(state: RunState, event: ev.Event, about: list[int | None]) -> int | None:
    if isinstance(event, ev.RunCreated):
        return None
    if isinstance(event, ev.RunCompleted) and event.answer_seq is not None:
        return event.answer_seq
    if isinstance(event, ev.ArtifactRecorded) and event.source_events:
        return max(event.source_events)
    if isinstance(event, _ANSWERING):
        return state.message_seqs[-1] if state.message_seqs else None
    if isinstance(event, ev.RunFailed | ev.RunCancelled) and state.ending is not None:
        return state.ending.seq
    known = [seq for seq in about if seq is not None]
    if known:
        return max(known)
    if isinstance(event, _EXTERNAL) and not _by_runtime(event.actor):
        return None
    return event.seq - 1 if event.seq > 1 else None


def _by_runtime(actor: str) -> bool:
    return actor == "runtime" or actor.startswith("worker:")


__all__ = ["stamp"]
