"""Events: one codec for the union; corrupt or unknown rows stop loudly."""

from __future__ import annotations

import dataclasses
import json
import sqlite3
from datetime import timedelta, timezone
from pathlib import Path
from typing import get_args

import pytest

from contextos import EventDecodeError, RunStatus, Runtime, codec, evidence_events, graph_events
from contextos import events as ev
from contextos.event_base import BaseEvent
from contextos.messages import FinishReason, Message, ToolCall, Usage
from contextos.runs import Budget, FailureReason, RunId
from contextos.state import fold

RID = RunId("run_x")


def sample_events() -> list[ev.Event]:
    return [
        ev.RunCreated(
            run_id=RID,
            seq=1,
            agent_name="a",
            agent_version="1",
            agent_hash="h",
            input="hi",
            budget=Budget(max_turns=3),
        ),
        ev.RunStarted(run_id=RID, seq=2, worker_id="w1"),
        ev.ModelResponded(
            run_id=RID,
            seq=3,
            message=Message(
                role="assistant", tool_calls=(ToolCall(id="c1", name="t", arguments="{}"),)
            ),
            finish_reason=FinishReason.TOOL_CALLS,
            usage=Usage(input_tokens=5, output_tokens=2),
            model="m",
        ),
        ev.ToolCompleted(run_id=RID, seq=4, call_id="c1", name="t", output="ok"),
        ev.ModelResponded(
            run_id=RID,
            seq=5,
            message=Message(role="assistant", content="done"),
            finish_reason=FinishReason.STOP,
            usage=Usage(input_tokens=9, output_tokens=1),
            model="m",
        ),
        ev.VerificationFailed(run_id=RID, seq=6, verifier="v", gaps=("g",), feedback="fix g"),
        ev.UserMessageAdded(run_id=RID, seq=7, content="also this"),
        ev.RuntimeCrashDetected(run_id=RID, seq=8, previous_worker_id="w1", last_seq=7),
        ev.RunReleased(run_id=RID, seq=9, worker_id="w1", reason="drain"),
        ev.RunStarted(run_id=RID, seq=10, worker_id="w2", recovered=True),
        ev.RunFailed(run_id=RID, seq=11, reason=FailureReason.TOOL_FAILED, message="x"),
    ]


def test_a_stored_row_leaves_out_what_holds_its_default() -> None:
    started = ev.RunStarted(run_id=RID, seq=2, worker_id="w1")
    packed = json.loads(codec.pack(started))
    # the row's own columns hold the run, the seq, the time and the type; the actor, the null
    # causes and `recovered` are defaults
    assert set(packed) == {"worker_id"}
    assert len(codec.pack(started)) < len(codec.encode(started)) / 5
    at = started.occurred_at.isoformat()
    assert codec.decode(RID, 2, "run_started", 1, codec.pack(started), at) == started
    # a packed row under another type's column does not read as that type
    with pytest.raises(EventDecodeError, match="corrupt run_created payload"):
        codec.decode(RID, 2, "run_created", 1, codec.pack(started), at)
    # nor without the time its row holds (never the time of reading)
    with pytest.raises(EventDecodeError, match="the row gives no time for its event"):
        codec.decode(RID, 2, "run_started", 1, codec.pack(started))


def test_a_row_reads_its_run_seq_and_time_from_its_columns() -> None:
    """PostgreSQL hands the time back as a datetime in the session's zone: the same instant."""
    completed = ev.RunCompleted(run_id=RID, seq=3, output="o")
    packed = codec.pack(completed)
    elsewhere = completed.occurred_at.astimezone(timezone(timedelta(hours=-5)))
    read = codec.decode(RID, 3, "run_completed", 2, packed, elsewhere)
    assert read == completed
    assert read.occurred_at.utcoffset() == timedelta(0)
    assert codec.decode("other", 4, "run_completed", 2, packed, elsewhere).run_id == "other"
    # an event with nothing but defaults besides what the row holds
    paused = ev.RunPaused(run_id=RID, seq=5)
    assert codec.pack(paused) == b"{}"
    assert codec.decode(RID, 5, paused.type, 1, b"{}", paused.occurred_at.isoformat()) == paused
    # a row written whole before still reads, and still must match its row
    whole = codec.encode(completed)
    assert codec.decode(RID, 3, "run_completed", 2, whole) == completed
    with pytest.raises(EventDecodeError, match="does not match its row"):
        codec.decode(RID, 4, "run_completed", 2, whole)


def test_every_event_type_round_trips_through_the_codec() -> None:
    seen = set()
    for event in [
        *sample_events(),
        ev.RunCompleted(run_id=RID, seq=1, output="o", structured_output={"a": 1}),
        ev.RunCancelled(run_id=RID, seq=1, reason="r"),
        ev.RunExpired(run_id=RID, seq=1, reason="r"),
    ]:
        at = event.occurred_at.isoformat()
        for payload in (codec.encode(event), codec.pack(event)):  # whole, as once stored; packed
            assert codec.decode(RID, event.seq, event.type, 1, payload, at) == event
        seen.add(event.type)
    kernel_types = {
        "run_created",
        "run_started",
        "runtime_crash_detected",
        "run_released",
        "run_completed",
        "run_failed",
        "run_cancelled",
        "run_expired",
        "model_responded",
        "tool_completed",
        "verification_failed",
        "user_message_added",
    }
    assert kernel_types <= seen


def test_the_records_several_event_types_hold_are_not_rebuilt_for_each_type(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A fresh process builds the reader of each event type it meets: the schemas of the
    records inside (a message, its tool calls, a usage) come ready, and are not made again."""
    from pydantic import TypeAdapter
    from pydantic._internal import _generate_schema

    collected: list[type] = []
    collect = _generate_schema.collect_dataclass_fields

    def spy(cls: type, *args: object, **kwargs: object) -> object:
        collected.append(cls)
        return collect(cls, *args, **kwargs)

    monkeypatch.setattr(_generate_schema, "collect_dataclass_fields", spy)
    adapter = TypeAdapter(ev.ModelResponded)
    assert ev.ModelResponded in collected
    assert not {Message, ToolCall, Usage} & set(collected)
    event = ev.ModelResponded(
        run_id=RID,
        seq=3,
        message=Message(role="assistant", tool_calls=(ToolCall(id="c", name="t", arguments="{}"),)),
        finish_reason=FinishReason.TOOL_CALLS,
        usage=Usage(input_tokens=5, cost_usd=0.25),
        model="scripted:x",
    )
    assert adapter.validate_json(adapter.dump_json(event)) == event


def test_every_event_type_is_a_frozen_kw_only_dataclass_with_a_version() -> None:
    for name, cls in ev.EVENT_TYPES.items():
        assert cls.__dataclass_params__.frozen, name  # type: ignore[attr-defined]
        assert all(f.kw_only for f in dataclasses.fields(cls)), name
        assert cls.SCHEMA_VERSION >= 1


def test_every_event_type_wherever_defined_is_in_the_union_and_exported_by_events() -> None:
    """The graph's and evidence's events live beside events.py: each must still be a member of
    the union the codec decodes with, known by its type, and importable from contextos.events."""
    defined = {
        cls
        for module in (ev, graph_events, evidence_events)
        for cls in vars(module).values()
        if isinstance(cls, type) and issubclass(cls, BaseEvent) and cls is not BaseEvent
    }
    assert set(get_args(get_args(ev.Event)[0])) == defined == set(ev.EVENT_TYPES.values())
    assert {cls.__name__ for cls in defined} <= set(ev.__all__)
    node = graph_events.NodeCompleted(run_id=RID, seq=3, node="n", output={"a": 1})
    payload = codec.encode(node)
    assert codec.decode(RID, 3, "node_completed", 1, payload) == node
    with pytest.raises(EventDecodeError, match="schema version 2"):
        codec.decode(RID, 3, "node_completed", 2, payload)
    with pytest.raises(EventDecodeError, match="corrupt node_completed"):
        codec.decode(RID, 3, "node_completed", 1, payload[:-5])


def test_fold_builds_the_state() -> None:
    state = fold(sample_events())
    assert state.status is RunStatus.FAILED
    assert state.turns == 2
    assert state.usage.input_tokens == 14
    assert [m.role for m in state.messages] == [
        "user",
        "assistant",
        "tool",
        "assistant",
        "user",
        "user",
    ]
    assert state.pending_tool_calls == []
    assert state.failure_reason is FailureReason.TOOL_FAILED
    assert state.worker_id == "w2"


def test_fold_refuses_to_leave_a_terminal_state() -> None:
    events = sample_events()
    after_end = ev.RunStarted(run_id=RID, seq=12, worker_id="late")
    with pytest.raises(EventDecodeError) as info:
        fold([*events, after_end])
    assert info.value.seq == 12 and "not allowed" in str(info.value)


def test_fold_refuses_gaps() -> None:
    events = sample_events()
    with pytest.raises(EventDecodeError, match="gap"):
        fold([events[0], events[2]])


def test_unknown_version_and_type_and_corruption_fail_loudly() -> None:
    created = sample_events()[0]
    payload = codec.encode(created)
    with pytest.raises(EventDecodeError) as info:
        codec.decode(RID, 1, "run_created", 99, payload)
    assert (info.value.run_id, info.value.seq) == (RID, 1)
    assert "schema version 99" in str(info.value)
    with pytest.raises(EventDecodeError, match="unknown event type"):
        codec.decode(RID, 1, "run_teleported", 1, payload)
    with pytest.raises(EventDecodeError, match="corrupt run_created"):
        codec.decode(RID, 1, "run_created", 1, payload[:-10])
    with pytest.raises(EventDecodeError, match="does not match its row"):
        codec.decode(RID, 2, "run_created", 1, payload)


async def test_a_corrupt_row_in_the_store_stops_reading_with_run_and_seq(tmp_path: Path) -> None:
    from contextos import Agent
    from contextos.testing import ScriptedModel, reply

    db = tmp_path / "runs.db"
    async with Runtime(str(db)) as rt:
        result = await rt.run(Agent(name="a", model=ScriptedModel([reply("hi")])), "x")
    conn = sqlite3.connect(db)
    conn.execute("DROP TRIGGER events_are_append_only_u")  # simulate disk-level corruption
    conn.execute(
        "UPDATE events SET payload = ? WHERE run_id = ? AND seq = 3",
        (b'{"not": "an event"}', result.run_id),
    )
    conn.commit()
    conn.close()
    async with Runtime(str(db)) as rt:
        with pytest.raises(EventDecodeError) as info:
            await rt.state(result.run_id)
    assert info.value.seq == 3 and info.value.run_id == result.run_id


def test_events_are_immutable() -> None:
    event = sample_events()[0]
    with pytest.raises(dataclasses.FrozenInstanceError):
        event.input = "changed"  # type: ignore[misc]


FIXTURES = Path(__file__).parents[1] / "fixtures" / "events"


def test_a_v1_run_completed_still_reads_with_its_output() -> None:
    payload = (FIXTURES / "run_completed.v1.json").read_bytes()
    event = codec.decode(RID, 6, "run_completed", 1, payload)
    assert isinstance(event, ev.RunCompleted)
    assert (event.output, event.answer_seq) == ("It is 18 degrees.", None)
    assert event.structured_output == {"temp_c": 18}


def test_a_run_completed_that_names_its_answer_folds_that_answers_text() -> None:
    events = sample_events()[:5]  # ... the model's final answer "done" at #5
    state = fold([*events, ev.RunCompleted(run_id=RID, seq=6, answer_seq=5)])
    assert state.status is RunStatus.COMPLETED
    assert state.output == "done"
    with pytest.raises(EventDecodeError, match="not in the log"):
        fold([*events, ev.RunCompleted(run_id=RID, seq=6, answer_seq=4)])
