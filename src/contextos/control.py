"""A person's hand on a run between its steps: pausing it, sending it a follow-up, finishing
a conversation.

Both are events appended under the fence. This module says whether a run can take them now,
in one sentence a person can act on when it cannot; the runtime appends and drives.
"""

from __future__ import annotations

from typing import NoReturn

from contextos.errors import ControlRefused
from contextos.loop import budget_exceeded
from contextos.runs import RunStatus
from contextos.state import RunState


def check_pausable(state: RunState) -> None:
    """ControlRefused unless the run is queued or running."""
    s = state
    if s.is_terminal:
        _refuse(s, f"has already {s.status.value}; there is nothing to pause")
    if s.status is RunStatus.INPUT_REQUIRED:
        if s.pending_interrupts:
            _refuse(s, "is waiting for a person and holds no driver; nothing to pause")
        _refuse(s, f"answered and waits for a message; continue with `contextos send {s.run_id}`")


def check_unpausable(state: RunState) -> None:
    """ControlRefused unless the run is paused."""
    if state.status is not RunStatus.PAUSED:
        _refuse(state, f"is {state.status.value}, not paused; there is nothing to let go on")


def check_sendable(state: RunState) -> None:
    """ControlRefused unless the run can take a person's next message now: a paused run whose
    next step is a model call, or a conversation that answered; and it has budget left."""
    s, rid = state, state.run_id
    if s.status is RunStatus.COMPLETED:
        _refuse(
            s,
            "has completed and is final: only the runs of an agent declared with "
            "conversation=True wait for a follow-up; start a new run",
        )
    if s.is_terminal:
        _refuse(s, f"has {s.status.value}; it takes no more messages: start a new run")
    if s.workflow is not None:
        _refuse(s, "is a workflow run; only agent runs take follow-up messages")
    if s.status in (RunStatus.RUNNING, RunStatus.QUEUED):
        _refuse(
            s,
            f"is {s.status} and has not answered yet: send once it answers, or pause it "
            f"first (`contextos pause {rid}`)",
        )
    pending = s.pending_interrupts
    if pending:
        first = next(iter(pending.values()))
        _refuse(
            s,
            f"waits for a person to answer {first.id} ({first.kind}); answer it first "
            "(`contextos inbox`)",
        )
    if s.ending is not None:
        _refuse(s, "is being ended (cancelled or failed once its effects settle)")
    if s.pending_tool_calls:
        _refuse(
            s,
            f"paused with tool calls still to run; resume it (`contextos resume {rid}`) and "
            "send once it answers",
        )
    exhausted = budget_exceeded(s)
    if exhausted:
        _refuse(s, f"has no budget left for another answer: {exhausted}")


def check_finishable(state: RunState) -> None:
    """ControlRefused unless the run is a conversation waiting with an answer: finishing it
    makes that answer the run's output."""
    s = state
    if s.is_terminal:
        _refuse(s, f"has already {s.status.value}; there is nothing to finish")
    if s.answered is None:
        if s.status in (RunStatus.RUNNING, RunStatus.QUEUED):
            _refuse(s, f"is {s.status} and has not answered yet: finish it once it answers")
        _refuse(
            s,
            "is not a conversation waiting with an answer; only those are finished "
            f"(`contextos cancel {s.run_id}` ends any run)",
        )


def _refuse(state: RunState, reason: str) -> NoReturn:
    raise ControlRefused(state.run_id, state.status.value, reason)
