"""The fold, event by event: what each event type changes in a run's state, and every log it
refuses. Pure: the events are written by hand and folded, with no store and no runtime."""

from __future__ import annotations

import copy
import dataclasses
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import pytest

from contextos import events as ev
from contextos.delegation import ChildRun, ChildStatus, DelegationContract, NodeRun, NodeStatus
from contextos.errors import EventDecodeError
from contextos.event_base import BaseEvent
from contextos.ledger import Effect
from contextos.ledger import EffectState as S
from contextos.messages import FinishReason, Message, ToolCall, Usage
from contextos.records.interrupts import Approval, Interrupt, InterruptKind
from contextos.runs import Budget, FailureReason, RunId, RunStatus
from contextos.state import RunState, apply, fold, threads

RID = RunId("run_f")
T0 = datetime(2026, 1, 1, tzinfo=UTC)
E = TypeVar("E", bound=BaseEvent)
CALL = ToolCall(id="c1", name="refund", arguments='{"amount": 5}')
OTHER = ToolCall(id="c2", name="lookup", arguments="{}")


def at(seq: int) -> datetime:
    """When the event of this seq happened: each event of a log has a time of its own."""
    return T0 + timedelta(seconds=seq)


class Log:
    """A run's log written by hand: each event takes the next seq and its own time."""

    def __init__(self) -> None:
        self.events: list[Any] = []

    def __call__(self, cls: type[E], **fields: Any) -> E:
        seq = len(self.events) + 1
        event = cls(run_id=RID, seq=seq, occurred_at=at(seq), **fields)
        self.events.append(event)
        return event

    def state(self) -> RunState:
        return fold(self.events)


def created(log: Log, **fields: Any) -> ev.RunCreated:
    return log(
        ev.RunCreated,
        **{"agent_name": "a", "agent_version": "1", "agent_hash": "h", "input": "hi", **fields},
    )


def running() -> Log:
    """A run created (#1) and started by worker w1 (#2)."""
    log = Log()
    created(log)
    log(ev.RunStarted, worker_id="w1")
    return log


def responded(log: Log, *calls: ToolCall, content: str = "", **fields: Any) -> ev.ModelResponded:
    return log(
        ev.ModelResponded,
        message=Message(role="assistant", content=content, tool_calls=calls),
        finish_reason=FinishReason.TOOL_CALLS if calls else FinishReason.STOP,
        **{"usage": Usage(), "model": "m", **fields},
    )


def grant(log: Log, approval_id: str, interrupt_id: str, **fields: Any) -> ev.ApprovalGranted:
    """alice approves the question `interrupt_id` for an hour."""
    return log(
        ev.ApprovalGranted,
        **{
            "approval_id": approval_id,
            "interrupt_id": interrupt_id,
            "action_hash": "ah",
            "approver": "alice",
            "expires_at": at(3600),
            **fields,
        },
    )


def changed(state: RunState, event: Any) -> dict[str, Any]:
    """Fold `event` into `state` and return every field it changed, with its new value."""
    before = copy.deepcopy(state)
    assert apply(state, event) is state  # in place
    return {
        f.name: getattr(state, f.name)
        for f in dataclasses.fields(RunState)
        if getattr(state, f.name) != getattr(before, f.name)
    }


def moved(seq: int, status: RunStatus | None = None, **fields: Any) -> dict[str, Any]:
    """What every event changes (its seq, the time of the last update), and the rest."""
    status_field = {} if status is None else {"status": status}
    return {"seq": seq, "updated_at": at(seq), **status_field, **fields}


def refused(state: RunState, event: Any) -> EventDecodeError:
    """Fold an event the fold must refuse (a log it cannot read: the state is dropped)."""
    with pytest.raises(EventDecodeError) as info:
        apply(state, event)
    assert (info.value.run_id, info.value.seq) == (RID, event.seq)
    return info.value


# --- the log: its first event, its order, the statuses it may move through -------------------


def test_a_run_created_event_sets_up_the_run_with_its_input_as_first_message() -> None:
    log = Log()
    event = created(
        log,
        agent_name="support",
        agent_version="2",
        agent_hash="h2",
        agent_ref="pkg.agents:support",
        input="refund A-1",
        budget=Budget(max_turns=7),
        deadline_at=at(100),
        tool_manifest_hash="tools",
        metadata={"team": "billing"},
        correlation_id="run_root",
    )
    state = log.state()
    assert state == RunState(
        run_id=RID,
        status=RunStatus.QUEUED,
        seq=1,
        agent_name="support",
        agent_version="2",
        agent_hash="h2",
        agent_ref="pkg.agents:support",
        input="refund A-1",
        budget=Budget(max_turns=7),
        created_at=at(1),
        updated_at=at(1),
        deadline_at=at(100),
        tool_manifest_hash="tools",
        metadata={"team": "billing"},
        messages=[Message(role="user", content="refund A-1")],
        message_seqs=[1],
        correlation_id="run_root",
    )
    assert state.metadata is not event.metadata  # the state's own copy


def test_a_run_started_by_nothing_else_is_the_root_of_its_own_tree() -> None:
    log = Log()
    created(log)
    assert log.state().correlation_id == RID


def test_fold_of_no_events_needs_the_run_id_and_gives_a_fresh_state() -> None:
    with pytest.raises(ValueError, match=r"^fold\(\) of no events needs a run_id$"):
        fold([])
    assert fold([], run_id="run_e") == RunState(run_id=RunId("run_e"))
    assert fold((), run_id="run_e").run_id == "run_e"


def test_fold_names_the_state_after_the_run_of_its_events() -> None:
    state = running().state()
    assert (state.run_id, state.seq, state.status) == (RID, 2, RunStatus.RUNNING)


def test_a_run_started_records_the_worker_that_drives_it() -> None:
    log = running()
    state = log.state()
    assert changed(state, log(ev.RunStarted, worker_id="w2", recovered=True)) == moved(
        3, worker_id="w2"
    )


@pytest.mark.parametrize("seq", [1, 2, 4, 9])
def test_an_event_out_of_order_is_a_gap_or_a_repeat_and_is_refused(seq: int) -> None:
    state = running().state()
    error = refused(state, ev.RunStarted(run_id=RID, seq=seq, worker_id="w2"))
    assert str(error) == (f"run {RID} event #{seq}: log has a gap or repeat: expected seq 3")


def test_a_log_that_leaves_an_ended_run_is_refused() -> None:
    log = running()
    log(ev.RunFailed, reason=FailureReason.TOOL_FAILED, message="x")
    state = log.state()
    error = refused(state, ev.RunStarted(run_id=RID, seq=4, worker_id="w2"))
    assert str(error) == (
        f"run {RID} event #4: run_started moves a failed run to running, which is not allowed"
    )


def test_a_status_change_is_checked_from_the_second_event_on() -> None:
    """A queued run cannot wait for a person: only a running one asks."""
    log = Log()
    created(log)
    state = log.state()
    question = ev.InterruptRaised(
        run_id=RID, seq=2, interrupt_id="i2", kind="missing_information", call_id="c1"
    )
    error = refused(state, question)
    assert str(error) == (
        f"run {RID} event #2: interrupt_raised moves a queued run to input_required, "
        "which is not allowed"
    )


def test_an_event_that_sets_no_status_leaves_it() -> None:
    log = running()
    state = log.state()
    assert changed(state, log(ev.RuntimeCrashDetected, previous_worker_id="w1", last_seq=2)) == (
        moved(3)
    )
    assert state.status is RunStatus.RUNNING


def test_a_release_changes_only_the_status_and_an_evaluation_nothing() -> None:
    log = running()
    state = log.state()
    assert changed(state, log(ev.RunReleased, worker_id="w1", reason="drain")) == moved(
        3, RunStatus.QUEUED
    )
    verdict = log(ev.EvaluationRecorded, evaluator="v", subject_seq=2, passed=True)
    assert changed(state, verdict) == moved(4)


def test_each_message_remembers_the_event_that_added_it() -> None:
    log = running()
    responded(log, CALL)  # 3
    log(ev.ToolCompleted, call_id=CALL.id, name=CALL.name, output="ok")  # 4
    log(ev.PolicyDecided, call_id="c9", tool="t", decision="allow")  # 5: no message
    responded(log, content="done")  # 6
    log(ev.VerificationFailed, verifier="v", gaps=("g",), feedback="say more")  # 7
    state = log.state()
    assert [m.role for m in state.messages] == ["user", "assistant", "tool", "assistant", "user"]
    assert state.message_seqs == [1, 3, 4, 6, 7]


# --- the loop: the model's answers, tool results, the verifier, people's messages -------------


def test_a_model_response_adds_its_message_its_calls_and_its_spend() -> None:
    log = running()
    state = log.state()
    first = responded(
        log,
        CALL,
        OTHER,
        usage=Usage(input_tokens=5, output_tokens=2, cost_usd=0.5, requests=1),
        context={"rendered": {"keep": 3, "add": ["k4", "k5"], "digest": "d1"}},
    )
    assert changed(state, first) == moved(
        3,
        messages=[Message(role="user", content="hi"), first.message],
        message_seqs=[1, 3],
        pending_tool_calls=[CALL, OTHER],
        call_at={"c1": 1, "c2": 1},
        turns=1,
        usage=Usage(input_tokens=5, output_tokens=2, cost_usd=0.5, requests=1),
        prompt=(5, "d1"),
        causes={"call:c1": 3, "call:c2": 3},
    )
    second = responded(log, content="done", usage=Usage(input_tokens=9, output_tokens=1))
    assert changed(state, second) == moved(
        4,
        messages=[Message(role="user", content="hi"), first.message, second.message],
        message_seqs=[1, 3, 4],
        pending_tool_calls=[],  # the new message's calls, none
        turns=2,
        usage=Usage(input_tokens=14, output_tokens=3, cost_usd=0.5, requests=1),
    )  # a call whose request was not recorded leaves the prompt as it was
    assert state.prompt == (5, "d1")


@pytest.mark.parametrize(
    ("rendered", "prompt"),
    [
        ({"keep": 3, "add": ["k4", "k5"], "digest": "d2"}, (5, "d2")),
        ({"keep": 0, "add": [], "digest": "d2"}, (0, "d2")),
        ({"add": ["k1"], "digest": "d2"}, None),  # no keep
        ({"keep": 1, "digest": "d2"}, None),  # no add
        ({"keep": 1, "add": []}, None),  # no digest: written before digests
        ({"keep": 1, "add": [], "digest": 7}, None),
        ({"keep": 1.0, "add": [], "digest": "d2"}, None),
        ({"keep": None, "add": [], "digest": "d2"}, None),
        ("not a delta", None),
        (["keep", "add", "digest"], None),
    ],
)
def test_a_recorded_prompt_is_kept_as_its_message_count_and_digest(
    rendered: Any, prompt: tuple[int, str] | None
) -> None:
    log = running()
    responded(log, context={"rendered": {"keep": 0, "add": ["k1"], "digest": "d1"}})
    state = log.state()
    assert state.prompt == (1, "d1")
    apply(state, responded(log, context={"rendered": rendered}))
    assert state.prompt == prompt


def test_tool_results_count_errors_in_a_row_and_over_the_run() -> None:
    log = running()
    responded(log, CALL, OTHER, ToolCall(id="c3", name="t", arguments="{}"))
    state = log.state()
    failed = log(
        ev.ToolCompleted,
        call_id="c2",
        name="lookup",
        output="bad input",
        is_error=True,
        error_code="invalid_arguments",
    )
    result = Message(role="tool", content="bad input", tool_call_id="c2", name="lookup")
    messages = [*state.messages, result]
    assert changed(state, failed) == moved(
        4,
        messages=messages,
        message_seqs=[1, 3, 4],
        pending_tool_calls=[CALL, ToolCall(id="c3", name="t", arguments="{}")],
        consecutive_tool_errors=1,
        tool_errors=1,
        last_tool_error="invalid_arguments",
        causes={**state.causes, "call:c2": 4},
    )
    log(ev.ToolCompleted, call_id="c3", name="t", output="boom", is_error=True, error_code="x")
    apply(state, log.events[-1])
    assert (state.consecutive_tool_errors, state.tool_errors, state.last_tool_error) == (2, 2, "x")
    ok = log(ev.ToolCompleted, call_id="c1", name="refund", output="done", effect_id="eff_1")
    change = changed(state, ok)
    assert change.pop("messages")[-1] == Message(
        role="tool", content="done", tool_call_id="c1", name="refund"
    )
    assert change == moved(
        6,
        message_seqs=[1, 3, 4, 5, 6],
        pending_tool_calls=[],
        consecutive_tool_errors=0,
        last_tool_error=None,
        succeeded=["c1"],
        causes={**state.causes, "call:c1": 6, "effect:eff_1": 6},
    )
    assert state.tool_errors == 2  # over the whole run
    log(ev.ToolCompleted, call_id="c9", name="t", output="?", is_error=True, error_code="y")
    apply(state, log.events[-1])
    assert (state.consecutive_tool_errors, state.tool_errors, state.succeeded) == (1, 3, ["c1"])


def test_a_result_that_is_no_error_leaves_no_error_code_whatever_it_carries() -> None:
    log = running()
    responded(log, CALL, OTHER)
    log(ev.ToolCompleted, call_id="c1", name="refund", output="no", is_error=True, error_code="x")
    assert log.state().last_tool_error == "x"
    state = log.state()
    ok = log(ev.ToolCompleted, call_id="c2", name="lookup", output="ok", error_code="stale")
    apply(state, ok)
    assert (state.last_tool_error, state.consecutive_tool_errors, state.succeeded) == (
        None,
        0,
        ["c2"],
    )


def test_a_failed_verification_sends_its_feedback_as_the_next_user_message() -> None:
    log = running()
    state = log.state()
    event = log(ev.VerificationFailed, verifier="v", gaps=("g",), feedback="say more")
    first = changed(state, event)
    assert first == moved(
        3,
        verification_attempts=1,
        messages=[Message(role="user", content="hi"), Message(role="user", content="say more")],
        message_seqs=[1, 3],
    )
    apply(state, log(ev.VerificationFailed, verifier="v", gaps=(), feedback="again"))
    assert state.verification_attempts == 2


def test_an_answer_waits_for_the_persons_next_message_which_starts_a_new_answer() -> None:
    log = running()
    responded(log, content="first draft")  # 3
    responded(log, content="It is 18 degrees.")  # 4
    state = log.state()
    answered = log(ev.RunAnswered, answer_seq=4, structured_output={"temp": 18})
    assert changed(state, answered) == moved(
        5,
        RunStatus.INPUT_REQUIRED,
        answered=answered,
        output="It is 18 degrees.",
        structured_output={"temp": 18},
    )
    follow_up = log(ev.UserMessageAdded, content="and tomorrow?")
    change = changed(state, follow_up)
    assert change.pop("messages")[-1] == Message(role="user", content="and tomorrow?")
    assert change == moved(
        6,
        RunStatus.QUEUED,
        message_seqs=[1, 3, 4, 6],
        output=None,
        structured_output=None,
        answered=None,
    )


def test_a_run_completed_with_its_output_or_the_answer_it_names() -> None:
    log = running()
    responded(log, content="the answer")  # 3
    responded(log, CALL)  # 4: the last assistant message, not the answer
    log(ev.ToolCompleted, call_id=CALL.id, name=CALL.name, output="ok")  # 5
    state = log.state()
    named = copy.deepcopy(state)
    done = log(ev.RunCompleted, output="typed out", structured_output=[1])
    assert changed(state, done) == moved(
        6, RunStatus.COMPLETED, output="typed out", structured_output=[1]
    )
    naming = ev.RunCompleted(run_id=RID, seq=6, occurred_at=at(6), answer_seq=3, output="x")
    assert changed(named, naming) == moved(6, RunStatus.COMPLETED, output="the answer")


@pytest.mark.parametrize("answer_seq", [1, 2, 5, 7])
def test_an_answer_that_names_no_model_message_of_the_log_is_refused(answer_seq: int) -> None:
    """#1 is the user's input, #5 a tool result, #2 and #7 add no message."""
    log = running()
    responded(log, content="the answer")  # 3
    responded(log, CALL)  # 4
    log(ev.ToolCompleted, call_id=CALL.id, name=CALL.name, output="ok")  # 5
    state = log.state()
    for cls in (ev.RunCompleted, ev.RunAnswered):
        event = cls(run_id=RID, seq=6, answer_seq=answer_seq)
        error = refused(copy.deepcopy(state), event)
        assert str(error) == (
            f"run {RID} event #6: the answer it names (#{answer_seq}) is not in the log"
        )


def test_a_run_failed_records_its_reason_and_message() -> None:
    log = running()
    state = log.state()
    failed = log(ev.RunFailed, reason=FailureReason.BUDGET_EXHAUSTED, message="out of turns")
    assert changed(state, failed) == moved(
        3,
        RunStatus.FAILED,
        failure_reason=FailureReason.BUDGET_EXHAUSTED,
        failure_message="out of turns",
    )
    assert state.is_terminal


@pytest.mark.parametrize(("reason", "message"), [("by ops", "by ops"), ("", "cancelled")])
def test_a_cancelled_run_fails_as_cancelled_with_its_reason(reason: str, message: str) -> None:
    log = running()
    state = log.state()
    assert changed(state, log(ev.RunCancelled, reason=reason)) == moved(
        3,
        RunStatus.CANCELLED,
        failure_reason=FailureReason.CANCELLED,
        failure_message=message,
    )


@pytest.mark.parametrize(("reason", "message"), [("nobody came", "nobody came"), ("", "expired")])
def test_an_expired_run_says_what_expired(reason: str, message: str) -> None:
    log = running()
    state = log.state()
    assert changed(state, log(ev.RunExpired, reason=reason)) == moved(
        3, RunStatus.EXPIRED, failure_message=message
    )


def test_a_pause_asked_for_stands_until_the_run_pauses() -> None:
    log = running()
    state = log.state()
    asked = log(ev.RunPauseRequested, reason="lunch")
    assert changed(state, asked) == moved(3, pause_requested=asked)
    assert changed(state, log(ev.RunPaused, reason="lunch")) == moved(
        4, RunStatus.PAUSED, pause_requested=None
    )


def test_the_runs_context_and_its_ending_are_kept_as_recorded() -> None:
    log = running()
    state = log.state()
    bound = log(ev.ContextBound, context={"principal": "u1"}, context_hash="ch")
    assert changed(state, bound) == moved(3, context=bound)
    ending = log(ev.RunEnding, outcome="failed", reason="tool_failed", message="m")
    assert changed(state, ending) == moved(4, ending=ending)


def test_a_compaction_keeps_its_summary_and_cursor_and_adds_its_cost() -> None:
    log = running()
    responded(log, usage=Usage(input_tokens=10, output_tokens=4))
    state = log.state()
    compacted = log(
        ev.ContextCompacted, summary="so far", through_seq=3, usage=Usage(input_tokens=7)
    )
    assert changed(state, compacted) == moved(
        4,
        context_summary="so far",
        context_cursor=3,
        usage=Usage(input_tokens=17, output_tokens=4),
    )


def test_artifacts_are_kept_in_the_order_recorded() -> None:
    log = running()
    state = log.state()
    for artifact_id in ("art_1", "art_2"):
        log(
            ev.ArtifactRecorded,
            artifact_id=artifact_id,
            artifact_type="report",
            content_hash="x",
            media_type="text/plain",
            size=1,
        )
    assert changed(state, log.events[2]) == moved(3, artifacts=["art_1"])
    apply(state, log.events[3])
    assert state.artifacts == ["art_1", "art_2"]


def test_a_fork_goes_on_with_its_agent_and_the_effects_it_inherited() -> None:
    log = running()
    state = log.state()
    forked = log(
        ev.RunForked,
        source_run_id="run_src",
        at_seq=2,
        agent_name="b",
        agent_version="2",
        agent_hash="h2",
        agent_ref="pkg:b",
        tool_manifest_hash="tools2",
        inherited_actions=(("eff_1", "key1", "ch1"), ("eff_2", "key2", "ch2")),
    )
    assert changed(state, forked) == moved(
        3,
        RunStatus.QUEUED,
        agent_name="b",
        agent_version="2",
        agent_hash="h2",
        agent_ref="pkg:b",
        tool_manifest_hash="tools2",
        worker_id=None,
        forked_from="run_src",
        inherited={"eff_1": ("key1", "ch1"), "eff_2": ("key2", "ch2")},
    )
    apply(state, log(ev.RunStarted, worker_id="w2"))
    responded(log, CALL)
    apply(state, log.events[-1])
    proposal = log(
        ev.EffectProposed,
        effect_id="eff_2",
        call_id=CALL.id,
        tool="refund",
        kind="write",
        idempotency_key="k",
        contract_hash="ch2",
    )
    apply(state, proposal)  # a call of this run took it: no longer inherited
    assert state.inherited == {"eff_1": ("key1", "ch1")}


# --- the effect ledger --------------------------------------------------------------------------


def proposed(log: Log, effect_id: str = "eff_1", call: ToolCall = CALL) -> ev.EffectProposed:
    return log(
        ev.EffectProposed,
        effect_id=effect_id,
        call_id=call.id,
        tool=call.name,
        kind="reversible_write",
        idempotency_key=f"{RID}/{call.id}",
        contract_hash="ch",
        arguments={"amount": 5},
        compensation="undo_refund",
    )


def ledger() -> tuple[Log, RunState]:
    """A run whose model made two calls (#3) and the first proposed eff_1 (#4)."""
    log = running()
    responded(log, CALL, OTHER)
    proposed(log)
    return log, log.state()


def move(log: Log, state: RunState, to: S, effect_id: str = "eff_1", **fields: Any) -> None:
    apply(state, log(ev.EffectChanged, effect_id=effect_id, state=to, **fields))


def test_a_proposed_effect_enters_the_ledger_under_its_call() -> None:
    log = running()
    responded(log, CALL)
    state = log.state()
    event = proposed(log)
    assert changed(state, event) == moved(
        4,
        effects={
            "eff_1": Effect(
                effect_id="eff_1",
                call_id="c1",
                tool="refund",
                kind="reversible_write",
                idempotency_key=f"{RID}/c1",
                contract_hash="ch",
                arguments={"amount": 5},
                compensation="undo_refund",
                history=[(4, S.PROPOSED)],
            )
        },
        effect_by_call={"c1": "eff_1"},
        causes={"call:c1": 4, "effect:eff_1": 4},
    )
    assert state.effects["eff_1"].arguments is not event.arguments
    assert state.needs_settling
    compensation = log(
        ev.EffectProposed,
        effect_id="eff_2",
        call_id="c2",
        tool="undo_refund",
        kind="write",
        idempotency_key="k2",
        contract_hash="ch",
        compensates="eff_1",
    )
    apply(state, compensation)
    assert state.effects["eff_2"].compensates == "eff_1"
    assert state.effects["eff_2"].compensation is None


def test_an_effect_proposed_twice_is_refused() -> None:
    _, state = ledger()
    again = proposed(Log(), "eff_1", OTHER)
    error = refused(state, dataclasses.replace(again, seq=5))
    assert str(error) == f"run {RID} event #5: effect eff_1 proposed twice"


def test_a_move_of_an_effect_never_proposed_is_refused() -> None:
    _, state = ledger()
    error = refused(state, ev.EffectChanged(run_id=RID, seq=5, effect_id="eff_9", state=S.FAILED))
    assert str(error) == f"run {RID} event #5: unknown effect eff_9"


def test_a_move_the_ledger_does_not_allow_is_refused() -> None:
    _, state = ledger()
    skip = ev.EffectChanged(run_id=RID, seq=5, effect_id="eff_1", state=S.COMMITTED)
    error = refused(state, skip)
    assert str(error) == (
        f"run {RID} event #5: effect eff_1 cannot move from proposed to committed"
    )


def test_an_effect_moves_and_remembers_each_step() -> None:
    log, state = ledger()
    validated = log(ev.EffectChanged, effect_id="eff_1", state=S.VALIDATED, note="ok")
    effect = copy.deepcopy(state.effects["eff_1"])
    effect.state = S.VALIDATED
    effect.history.append((5, S.VALIDATED))
    assert changed(state, validated) == moved(
        5, effects={"eff_1": effect}, causes={**state.causes, "effect:eff_1": 5}
    )
    move(log, state, S.AUTHORISED)
    assert state.effects["eff_1"].attempts == 0  # not sent yet


def test_attempts_count_dispatches_and_take_a_higher_recorded_attempt() -> None:
    log, state = ledger()
    move(log, state, S.VALIDATED)
    move(log, state, S.AUTHORISED)
    move(log, state, S.DISPATCHED, attempt=1)
    assert state.effects["eff_1"].attempts == 1
    move(log, state, S.DISPATCHED)  # an attempt recorded without its number
    assert state.effects["eff_1"].attempts == 2
    move(log, state, S.OUTCOME_UNKNOWN)
    assert state.effects["eff_1"].attempts == 2
    move(log, state, S.DISPATCHED, attempt=5)
    assert state.effects["eff_1"].attempts == 5
    move(log, state, S.DISPATCHED, attempt=5)
    assert state.effects["eff_1"].attempts == 6


def test_an_effect_gathers_its_receipts_and_keeps_its_last_output_and_error() -> None:
    log, state = ledger()
    move(log, state, S.VALIDATED)
    move(log, state, S.AUTHORISED)
    move(log, state, S.DISPATCHED, attempt=1, receipts={"request_id": "r1"})
    move(
        log,
        state,
        S.OUTCOME_UNKNOWN,
        receipts={"request_id": "r2", "trace": "t"},
        output="maybe",
        error_code="timeout",
    )
    move(log, state, S.RECONCILING)
    move(log, state, S.COMMITTED, receipts={"confirmation": "c9"})
    effect = state.effects["eff_1"]
    assert effect.receipts == {"request_id": "r2", "trace": "t", "confirmation": "c9"}
    assert (effect.output, effect.error_code) == ("maybe", "timeout")
    move(log, state, S.COMPENSATING, output="undoing", error_code="undo")
    assert (effect.output, effect.error_code) == ("undoing", "undo")
    assert effect.history == [
        (4, S.PROPOSED),
        (5, S.VALIDATED),
        (6, S.AUTHORISED),
        (7, S.DISPATCHED),
        (8, S.OUTCOME_UNKNOWN),
        (9, S.RECONCILING),
        (10, S.COMMITTED),
        (11, S.COMPENSATING),
    ]
    assert state.needs_settling
    move(log, state, S.COMPENSATED)
    assert not state.needs_settling


def test_a_question_about_an_effect_stands_until_the_effect_settles() -> None:
    log, state = ledger()
    proposed(log, "eff_2", OTHER)
    apply(state, log.events[-1])
    for effect_id in ("eff_1", "eff_2"):
        move(log, state, S.VALIDATED, effect_id)
        move(log, state, S.AUTHORISED, effect_id)
        move(log, state, S.DISPATCHED, effect_id, attempt=1)
        move(log, state, S.OUTCOME_UNKNOWN, effect_id)
    kind = "external_confirmation_required"
    for i, (call, effect_id) in enumerate([(CALL, "eff_1"), (OTHER, "eff_2")]):
        log(
            ev.InterruptRaised,
            interrupt_id=f"i{i}",
            kind=kind,
            call_id=call.id,
            effect_id=effect_id,
        )
        apply(state, log.events[-1])
        apply(state, log(ev.RunStarted, worker_id="w2"))
    apply(state, log(ev.InterruptRaised, interrupt_id="i_free", kind="missing_information"))
    apply(state, log(ev.RunStarted, worker_id="w3"))
    move(log, state, S.RECONCILING)  # not settled yet
    assert list(state.pending_interrupts) == ["i0", "i1", "i_free"]
    move(log, state, S.COMMITTED)
    assert state.interrupts["i0"].status == "superseded"
    assert list(state.pending_interrupts) == ["i1", "i_free"]


def test_an_answered_question_stays_answered_when_its_effect_settles() -> None:
    log, state = ledger()
    move(log, state, S.VALIDATED)
    move(log, state, S.AUTHORISED)
    move(log, state, S.DISPATCHED, attempt=1)
    move(log, state, S.OUTCOME_UNKNOWN)
    kind = "external_confirmation_required"
    apply(state, log(ev.InterruptRaised, interrupt_id="i1", kind=kind, effect_id="eff_1"))
    answer = log(
        ev.InterruptAnswered,
        interrupt_id="i1",
        kind=kind,
        value={"outcome": "committed"},
        answered_by="alice",
    )
    apply(state, answer)
    apply(state, log(ev.RunStarted, worker_id="w2"))
    move(log, state, S.COMMITTED)
    assert state.interrupts["i1"].status == "answered"


def test_a_failed_attempt_changes_nothing_but_what_the_call_follows_from() -> None:
    log, state = ledger()
    attempt = log(
        ev.ToolAttemptFailed,
        call_id="c1",
        tool="refund",
        attempt=1,
        error_type="TimeoutError",
        error="slow",
        will_retry=True,
        effect_id="eff_1",
    )
    assert changed(state, attempt) == moved(
        5, causes={"call:c1": 5, "call:c2": 3, "effect:eff_1": 5}
    )


def test_a_policy_decision_is_kept_for_its_call() -> None:
    log = running()
    responded(log, CALL)
    state = log.state()
    decision = log(ev.PolicyDecided, call_id="c1", tool="refund", decision="allow")
    assert changed(state, decision) == moved(
        4, policy_by_call={"c1": decision}, causes={"call:c1": 4}
    )


# --- people: interrupts and approvals --------------------------------------------------------


def asked(kind: str = "approval_required") -> tuple[Log, RunState]:
    """A run whose model called c1 (#3) with effect eff_1 (#4), and a question about both (#5)."""
    log, _ = ledger()
    log(
        ev.InterruptRaised,
        interrupt_id="i5",
        kind=kind,
        payload={"action_hash": "ah"},
        call_id="c1",
        effect_id="eff_1",
    )
    return log, log.state()


def test_a_question_is_kept_with_what_it_is_about() -> None:
    log, state = ledger()
    payload = {"question": "which account?"}
    event = log(
        ev.InterruptRaised,
        interrupt_id="i5",
        kind="review_required",
        payload=payload,
        call_id="c1",
        effect_id="eff_1",
    )
    question = Interrupt(
        id="i5",
        run_id=RID,
        kind=InterruptKind.REVIEW_REQUIRED,
        payload={"question": "which account?"},
        raised_seq=5,
        raised_at=at(5),
        call_id="c1",
        effect_id="eff_1",
    )
    assert changed(state, event) == moved(
        5,
        RunStatus.INPUT_REQUIRED,
        interrupts={"i5": question},
        interrupt_of_call={"c1": "i5"},
        causes={**state.causes, "interrupt:i5": 5, "call:c1": 5, "effect:eff_1": 5},
    )
    assert state.interrupts["i5"].payload is not event.payload
    assert state.latest_interrupt("c1") == question
    assert state.latest_interrupt("c2") is None


def test_a_question_about_no_call_is_no_calls_latest() -> None:
    log = running()
    state = log.state()
    event = log(ev.InterruptRaised, interrupt_id="i3", kind="choice_required")
    change = changed(state, event)
    assert change["interrupts"]["i3"].call_id is None
    assert set(change) == {"seq", "updated_at", "status", "interrupts", "causes"}
    assert change["causes"] == {"interrupt:i3": 3}
    assert state.interrupt_of_call == {}


def test_a_call_asked_about_again_supersedes_only_a_question_still_pending() -> None:
    log, state = asked()
    apply(state, log(ev.RunStarted, worker_id="w2"))
    apply(state, log(ev.InterruptRaised, interrupt_id="i7", kind="approval_required", call_id="c1"))
    assert (state.interrupts["i5"].status, state.interrupts["i7"].status) == (
        "superseded",
        "pending",
    )
    assert state.interrupt_of_call == {"c1": "i7"}
    denied = log(ev.ApprovalDenied, interrupt_id="i7", approver="bob", reason="no")
    apply(state, denied)
    apply(state, log(ev.RunStarted, worker_id="w3"))
    apply(
        state, log(ev.InterruptRaised, interrupt_id="i10", kind="approval_required", call_id="c1")
    )
    assert state.interrupts["i7"].status == "denied"  # answered: it stays so
    assert list(state.pending_interrupts) == ["i10"]


def test_an_approval_resolves_its_question_and_what_it_was_about_follows_from_it() -> None:
    log, state = asked()
    granted = log(
        ev.ApprovalGranted,
        approval_id="apr_6",
        interrupt_id="i5",
        action_hash="ah",
        approver="alice",
        approver_roles=["finance"],
        expires_at=at(3600),
        conditions={"max_amount": 10},
        snapshot_hash="snap",
    )
    approval = Approval(
        id="apr_6",
        interrupt_id="i5",
        run_id=RID,
        action_hash="ah",
        approver="alice",
        approver_roles=("finance",),
        granted_at=at(6),
        expires_at=at(3600),
        conditions={"max_amount": 10},
        snapshot_hash="snap",
    )
    question = copy.deepcopy(state.interrupts["i5"])
    question.status, question.resolved_at, question.approval = "approved", at(6), approval
    assert changed(state, granted) == moved(
        6,
        RunStatus.QUEUED,
        approvals={"apr_6": approval},
        interrupts={"i5": question},
        causes={"call:c1": 6, "call:c2": 3, "effect:eff_1": 6, "interrupt:i5": 6},
    )
    assert state.approvals["apr_6"].conditions is not granted.conditions
    assert state.pending_interrupts == {}


def test_an_approval_of_a_question_not_in_the_log_is_still_kept() -> None:
    log = running()
    state = log.state()
    granted = grant(log, "apr_3", "i_gone")
    change = changed(state, granted)
    assert change == moved(
        3,
        RunStatus.QUEUED,
        approvals={"apr_3": change["approvals"]["apr_3"]},
        causes={"interrupt:i_gone": 3},
    )
    assert change["approvals"]["apr_3"].interrupt_id == "i_gone"


def test_a_refusal_resolves_its_question_with_who_refused_and_why() -> None:
    log, state = asked()
    denied = log(ev.ApprovalDenied, interrupt_id="i5", approver="bob", reason="too much")
    question = copy.deepcopy(state.interrupts["i5"])
    question.status, question.resolved_at = "denied", at(6)
    question.denied_by, question.deny_reason = "bob", "too much"
    assert changed(state, denied) == moved(
        6,
        RunStatus.QUEUED,
        interrupts={"i5": question},
        causes={"call:c1": 6, "call:c2": 3, "effect:eff_1": 6, "interrupt:i5": 6},
    )


def test_an_answer_to_a_question_not_pending_follows_from_that_question_alone() -> None:
    log, state = asked()
    apply(state, log(ev.ApprovalDenied, interrupt_id="i5", approver="bob"))
    apply(state, log(ev.RunStarted, worker_id="w2"))
    apply(state, log(ev.InterruptRaised, interrupt_id="i8", kind="missing_information"))
    late = log(ev.ApprovalDenied, interrupt_id="i5", approver="carol", reason="late")
    change = changed(state, late)
    assert change["causes"] == {**state.causes, "interrupt:i5": 9}
    assert state.causes["call:c1"] == 6
    assert threads(state, late) == ["interrupt:i5"]
    unknown = log(ev.ApprovalDenied, interrupt_id="i_gone", approver="carol")
    assert changed(state, unknown) == moved(10, causes={**state.causes, "interrupt:i_gone": 10})


def test_the_threads_of_an_event_are_its_question_then_its_call_then_its_effect() -> None:
    _, state = asked()
    answer = ev.InterruptAnswered(
        run_id=RID, seq=6, interrupt_id="i5", kind="approval_required", answered_by="a"
    )
    assert threads(state, answer) == ["interrupt:i5", "call:c1", "effect:eff_1"]
    again = ev.InterruptRaised(
        run_id=RID, seq=6, interrupt_id="i5", kind="approval_required", call_id="c2"
    )
    assert threads(state, again) == ["interrupt:i5", "call:c2"]  # a new question's own
    tool = ev.ToolCompleted(run_id=RID, seq=6, call_id="c2", name="t", output="", effect_id="e")
    assert threads(state, tool) == ["call:c2", "effect:e"]
    started = ev.RunStarted(run_id=RID, seq=6, worker_id="w")
    assert threads(state, started) == []


def test_a_revoked_approval_is_kept_revoked_on_its_question() -> None:
    log, state = asked()
    apply(state, grant(log, "apr_6", "i5"))
    apply(state, log(ev.RunStarted, worker_id="w2"))
    revoked = log(ev.ApprovalRevoked, approval_id="apr_6", revoked_by="bob", reason="wrong order")
    approval = dataclasses.replace(
        state.approvals["apr_6"], revoked_at=at(8), revoked_by="bob", revoke_reason="wrong order"
    )
    question = copy.deepcopy(state.interrupts["i5"])
    question.approval = approval
    assert changed(state, revoked) == moved(
        8, approvals={"apr_6": approval}, interrupts={"i5": question}
    )
    assert state.interrupts["i5"].status == "approved"


def test_revoking_an_approval_not_in_the_log_changes_nothing() -> None:
    log = running()
    state = log.state()
    revoked = log(ev.ApprovalRevoked, approval_id="apr_9", revoked_by="bob")
    assert changed(state, revoked) == moved(3)


def test_revoking_an_approval_of_a_question_not_in_the_log_revokes_it() -> None:
    log = running()
    state = log.state()
    apply(state, grant(log, "apr_3", "i_gone"))
    apply(state, log(ev.RunStarted, worker_id="w2"))
    apply(state, log(ev.ApprovalRevoked, approval_id="apr_3", revoked_by="bob"))
    assert state.approvals["apr_3"].revoked_by == "bob"
    assert state.interrupts == {}


def test_an_answer_is_kept_with_who_gave_it() -> None:
    log, state = asked("missing_information")
    value = {"value": "ACC-9"}
    answer = log(
        ev.InterruptAnswered,
        interrupt_id="i5",
        kind="missing_information",
        value=value,
        answered_by="alice",
    )
    question = copy.deepcopy(state.interrupts["i5"])
    question.status, question.resolved_at = "answered", at(6)
    question.answer, question.answered_by = {"value": "ACC-9"}, "alice"
    assert changed(state, answer) == moved(
        6,
        RunStatus.QUEUED,
        interrupts={"i5": question},
        causes={"call:c1": 6, "call:c2": 3, "effect:eff_1": 6, "interrupt:i5": 6},
    )
    assert state.interrupts["i5"].answer is not value


@pytest.mark.parametrize(
    ("on_expiry", "answer", "answered_by"),
    [("default", {"value": "none"}, "default"), ("deny", None, None), ("fail", None, None)],
)
def test_an_expired_question_keeps_how_it_expired_and_a_declared_default(
    on_expiry: Any, answer: dict[str, Any] | None, answered_by: str | None
) -> None:
    log, state = asked("missing_information")
    value = {"value": "none"}
    expired = log(
        ev.InterruptExpired,
        interrupt_id="i5",
        kind="missing_information",
        expires_at=at(6),
        on_expiry=on_expiry,
        value=value,
    )
    question = copy.deepcopy(state.interrupts["i5"])
    question.status, question.resolved_at, question.expiry = "expired", at(6), expired
    question.answer, question.answered_by = answer, answered_by
    assert changed(state, expired) == moved(
        6,
        RunStatus.QUEUED,
        interrupts={"i5": question},
        causes={"call:c1": 6, "call:c2": 3, "effect:eff_1": 6, "interrupt:i5": 6},
    )
    assert state.interrupts["i5"].answer is not value


def test_answers_to_questions_not_in_the_log_change_nothing_else() -> None:
    log = running()
    apply(state := log.state(), log(ev.InterruptRaised, interrupt_id="i3", kind="choice_required"))
    answers: list[tuple[type[BaseEvent], dict[str, Any]]] = [
        (ev.InterruptAnswered, {"kind": "choice_required", "answered_by": "a"}),
        (
            ev.InterruptExpired,
            {"kind": "choice_required", "expires_at": at(0), "on_expiry": "default"},
        ),
    ]
    for cls, fields in answers:
        event = log(cls, interrupt_id="i_gone", **fields)
        assert changed(state, event) == moved(
            event.seq, RunStatus.QUEUED, causes={**state.causes, "interrupt:i_gone": event.seq}
        )
        apply(state, log(ev.RunStarted, worker_id="w"))
        apply(
            state, log(ev.InterruptRaised, interrupt_id=f"i{event.seq + 2}", kind="choice_required")
        )


# --- the graph: child runs and workflow nodes -----------------------------------------------


def contract(delegation_id: str, **fields: Any) -> DelegationContract:
    return DelegationContract(
        delegation_id=delegation_id,
        parent_run_id=RID,
        child_run_id=RunId(f"{RID}.{delegation_id}"),
        agent_name="helper",
        objective="look it up",
        **fields,
    )


def test_a_child_run_bound_to_its_contract_keeps_it() -> None:
    log = running()
    state = log.state()
    bound = log(ev.DelegationBound, contract=contract("d1"))
    assert changed(state, bound) == moved(3, delegation=contract("d1"))


def test_a_child_run_started_is_kept_with_its_call() -> None:
    log = running()
    state = log.state()
    started = log(ev.ChildRunStarted, contract=contract("d1", call_id="c1"))
    child = ChildRun(contract=contract("d1", call_id="c1"), started_seq=3, started_at=at(3))
    assert changed(state, started) == moved(
        3, children={"d1": child}, child_by_call={"c1": "d1"}, running_children={"d1": None}
    )
    other = log(ev.ChildRunStarted, contract=contract("d2"))  # no call: a workflow's
    change = changed(state, other)
    assert set(change) == {"seq", "updated_at", "children", "running_children"}
    assert list(state.children) == list(state.running_children) == ["d1", "d2"]


def test_a_delegation_started_twice_is_refused() -> None:
    log = running()
    log(ev.ChildRunStarted, contract=contract("d1"))
    state = log.state()
    error = refused(state, ev.ChildRunStarted(run_id=RID, seq=4, contract=contract("d1")))
    assert str(error) == f"run {RID} event #4: delegation d1 started twice"


def finished(log: Log, delegation_id: str, **fields: Any) -> ev.ChildRunFinished:
    return log(
        ev.ChildRunFinished,
        delegation_id=delegation_id,
        child_run_id=RunId(f"{RID}.{delegation_id}"),
        **{"status": ChildStatus.COMPLETED, **fields},
    )


def test_a_child_run_finished_gives_back_its_result_and_what_it_spent() -> None:
    log = running()
    log(ev.ChildRunStarted, contract=contract("d1"))
    log(ev.ChildRunStarted, contract=contract("d2"))
    state = log.state()
    evidence = {"tools": ["lookup"]}
    done = finished(
        log,
        "d1",
        status=ChildStatus.REJECTED,
        result={"a": 1},
        evidence=evidence,
        usage=Usage(input_tokens=3, output_tokens=1),
        turns=2,
        reason="output_invalid",
        message="bad shape",
    )
    child = copy.deepcopy(state.children["d1"])
    child.status, child.result, child.evidence = ChildStatus.REJECTED, {"a": 1}, evidence
    child.usage, child.turns, child.finished_at = Usage(input_tokens=3, output_tokens=1), 2, at(5)
    child.reason, child.message = "output_invalid", "bad shape"
    assert changed(state, done) == moved(
        5,
        children={"d1": child, "d2": state.children["d2"]},
        running_children={"d2": None},  # what still holds part of the budget
        child_usage=Usage(input_tokens=3, output_tokens=1),
        child_turns=2,
    )
    assert state.children["d1"].evidence is not evidence
    apply(state, finished(log, "d2", usage=Usage(input_tokens=10), turns=3))
    assert (state.child_usage, state.child_turns) == (Usage(input_tokens=13, output_tokens=1), 5)
    assert state.running_children == {}


def test_a_child_run_that_finishes_without_running_is_refused() -> None:
    log = running()
    log(ev.ChildRunStarted, contract=contract("d1"))
    finished(log, "d1")
    state = log.state()
    for delegation_id in ("d1", "d9"):  # finished already; never started
        event = ev.ChildRunFinished(
            run_id=RID,
            seq=5,
            delegation_id=delegation_id,
            child_run_id=RunId("x"),
            status=ChildStatus.FAILED,
        )
        error = refused(state, event)
        assert (
            str(error) == f"run {RID} event #5: delegation {delegation_id} finished without running"
        )


def test_a_workflow_keeps_its_graph_and_each_node_it_started() -> None:
    log = running()
    state = log.state()
    graph = log(
        ev.WorkflowBound,
        workflow="wf",
        nodes=({"name": "fan", "kind": "map", "after": [], "output": "list"},),
        output_node="fan",
    )
    assert changed(state, graph) == moved(3, workflow=graph)
    items = [1, 2]
    fan = log(ev.NodeStarted, node="fan", kind="map", items=items)
    node = NodeRun(node="fan", kind="map", started_seq=4, started_at=at(4), items=[1, 2])
    assert changed(state, fan) == moved(4, nodes={"fan": node})
    assert state.nodes["fan"].items is not items
    gate = log(ev.NodeStarted, node="step", kind="code")
    apply(state, gate)
    assert state.nodes["step"].items is None
    assert list(state.nodes) == ["fan", "step"]


def test_a_nodes_children_are_kept_in_start_order() -> None:
    log = running()
    log(ev.NodeStarted, node="fan", kind="map", items=[1, 2])
    state = log.state()
    for i in (1, 2):
        apply(state, log(ev.ChildRunStarted, contract=contract(f"d{i}", node="fan", index=i)))
    assert state.nodes["fan"].children == ["d1", "d2"]
    elsewhere = log(ev.ChildRunStarted, contract=contract("d3", node="not_started"))
    assert set(changed(state, elsewhere)) == {"seq", "updated_at", "children", "running_children"}


def test_a_loop_node_keeps_each_round_then_its_outcome() -> None:
    log = running()
    log(ev.NodeStarted, node="loop", kind="loop")
    state = log.state()
    for i, draft in enumerate(["d1", "d2"], start=1):
        apply(state, log(ev.NodeRoundCompleted, node="loop", round=i, output={"draft": draft}))
    assert state.nodes["loop"].rounds == [{"draft": "d1"}, {"draft": "d2"}]
    done = log(ev.NodeCompleted, node="loop", output={"draft": "d2"}, converged=True, route="next")
    node = copy.deepcopy(state.nodes["loop"])
    node.status, node.completed_seq, node.output = NodeStatus.COMPLETED, 6, {"draft": "d2"}
    node.converged, node.route, node.finished_at = True, "next", at(6)
    assert changed(state, done) == moved(6, nodes={"loop": node})


def test_a_failed_node_keeps_its_reason_and_message() -> None:
    log = running()
    log(ev.NodeStarted, node="step", kind="code")
    state = log.state()
    failed = log(ev.NodeFailed, node="step", reason=FailureReason.NODE_FAILED, message="raised")
    node = copy.deepcopy(state.nodes["step"])
    node.status, node.reason, node.message = NodeStatus.FAILED, "node_failed", "raised"
    node.finished_at = at(4)
    assert changed(state, failed) == moved(4, nodes={"step": node})


@pytest.mark.parametrize("node", ["done", "failed", "never"])
def test_a_node_that_is_not_running_takes_no_round_and_no_outcome(node: str) -> None:
    log = running()
    log(ev.NodeStarted, node="done", kind="code")
    log(ev.NodeCompleted, node="done", output=1)
    log(ev.NodeStarted, node="failed", kind="code")
    log(ev.NodeFailed, node="failed", reason=FailureReason.NODE_FAILED, message="x")
    state = log.state()
    for event in (
        ev.NodeRoundCompleted(run_id=RID, seq=7, node=node, round=1),
        ev.NodeCompleted(run_id=RID, seq=7, node=node),
        ev.NodeFailed(run_id=RID, seq=7, node=node, reason=FailureReason.NODE_FAILED, message="y"),
    ):
        error = refused(state, event)
        assert str(error) == f"run {RID} event #7: node {node} is not running"


# --- what the state answers -------------------------------------------------------------------


def test_the_last_message_and_a_call_as_the_model_made_it() -> None:
    assert fold([], run_id="r").last_message is None
    log = running()
    responded(log, CALL, OTHER)
    log(ev.ToolCompleted, call_id="c1", name="refund", output="ok")
    state = log.state()
    assert state.last_message == Message(
        role="tool", content="ok", tool_call_id="c1", name="refund"
    )
    assert (state.tool_call("c1"), state.tool_call("c2")) == (CALL, OTHER)
    assert state.tool_call("c9") is None
    state.call_at["c9"] = 1  # a call the message at that index never made
    assert state.tool_call("c9") is None


def test_a_run_is_terminal_once_it_ended() -> None:
    log = running()
    assert not log.state().is_terminal
    log(ev.RunCompleted, output="x")
    assert log.state().is_terminal


def test_the_event_types_know_their_version_and_the_status_they_set() -> None:
    assert ev.schema_version("run_completed") == 2
    assert ev.schema_version("run_created") == 1
    assert ev.status_after(ev.RunStarted(run_id=RID, seq=2, worker_id="w")) is RunStatus.RUNNING
    assert ev.status_after(ev.RunPauseRequested(run_id=RID, seq=2)) is None
