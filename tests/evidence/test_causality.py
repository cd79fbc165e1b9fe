"""Every event says what caused it and which run tree it belongs to, set by the runtime."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from support_agents import POLICY, support

from contextos import Principal, RunStatus, Runtime
from contextos import events as ev
from contextos.policy import RunContext

ROOT = Path(__file__).resolve().parents[2]
BOB = Principal.user("bob", scopes=("payments:*",))


@pytest.fixture(autouse=True)
def ledger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "ledger.jsonl"
    monkeypatch.setenv("EVIDENCE_LEDGER", str(path))
    return path


async def approved_run(rt: Runtime) -> list[ev.Event]:
    """A governed run: a read, a write that waits for an approval, the approval, the end."""
    agent = support()
    waiting = await rt.run(agent, "Refund order A-1", principal=BOB)
    assert waiting.status is RunStatus.INPUT_REQUIRED
    [asked] = await rt.inbox()
    await rt.approve(asked.id, approver="alice")
    done = await rt.resume(waiting.run_id, agent)
    assert done.status is RunStatus.COMPLETED
    return await rt.events(waiting.run_id)


def one(events: list[ev.Event], kind: type[ev.Event], **fields: object) -> ev.Event:
    [found] = [
        e
        for e in events
        if isinstance(e, kind) and all(getattr(e, k) == v for k, v in fields.items())
    ]
    return found


async def test_each_step_of_an_approved_write_names_the_step_it_follows(tmp_path: Path) -> None:
    async with Runtime(str(tmp_path / "c.db"), policy=POLICY) as rt:
        events = await approved_run(rt)
    run_id = events[0].run_id
    assert events[0].causation_id is None
    assert all(e.correlation_id == run_id for e in events)
    for e in events[1:]:
        assert e.causation_id is not None and 0 < e.causation_id < e.seq, e

    proposed = next(
        e
        for e in events
        if isinstance(e, ev.ModelResponded)
        and e.message.tool_calls[:1]
        and e.message.tool_calls[0].name == "refund"
    )
    call = proposed.message.tool_calls[0].id
    effect = one(events, ev.EffectProposed, call_id=call)
    assert effect.causation_id == proposed.seq
    ask = one(events, ev.PolicyDecided, call_id=call, decision="require_approval")
    raised = one(events, ev.InterruptRaised, call_id=call)
    assert raised.causation_id == ask.seq
    granted = one(events, ev.ApprovalGranted)
    assert granted.causation_id == raised.seq
    allowed = one(events, ev.PolicyDecided, call_id=call, decision="allow")
    assert allowed.causation_id == granted.seq
    dispatched = one(events, ev.EffectChanged, state="dispatched")
    authorised = one(events, ev.EffectChanged, state="authorised")
    assert dispatched.causation_id == authorised.seq
    committed = one(events, ev.EffectChanged, state="committed")
    assert committed.causation_id == dispatched.seq
    result = one(events, ev.ToolCompleted, call_id=call)
    assert result.causation_id == committed.seq
    answer = next(e for e in events if isinstance(e, ev.ModelResponded) and e.seq > result.seq)
    assert answer.causation_id == result.seq
    completed = one(events, ev.RunCompleted)
    assert completed.causation_id == answer.seq == completed.answer_seq


async def test_a_run_started_by_another_joins_its_tree(tmp_path: Path) -> None:
    pytest.importorskip("opentelemetry.sdk")
    from contextos.telemetry import spans_for, trace_id_for
    from contextos.telemetry._ids import span_id_for

    async with Runtime(str(tmp_path / "c.db")) as rt:
        source = await rt.run(support(), "Refund order A-1")
        source_state = await rt.state(source.run_id)
        cause = f"{source.run_id}#{source_state.seq}"
        triggered = await rt.start(support(), "Follow up on A-1", caused_by=cause, principal=BOB)
        child = await rt.start(
            support(), "Check A-1", context=RunContext(principal=BOB, parent_run_id=triggered)
        )
        logs = {rid: await rt.events(rid) for rid in (triggered, child)}

    created = logs[triggered][0]
    assert isinstance(created, ev.RunCreated)
    assert created.caused_by == cause and created.correlation_id == source.run_id
    assert {e.correlation_id for e in logs[triggered]} == {source.run_id}
    child_created = logs[child][0]
    assert isinstance(child_created, ev.RunCreated)
    assert child_created.caused_by == f"{triggered}#2"  # after its context was bound
    assert {e.correlation_id for e in logs[child]} == {source.run_id}

    root = spans_for(logs[child])[-1]
    assert root.trace_id == trace_id_for(source.run_id)
    assert root.parent_id == span_id_for(triggered, "invoke_agent")
    assert root.attributes["contextos.run.caused_by"] == f"{triggered}#2"


async def test_show_prints_each_events_cause(tmp_path: Path) -> None:
    db = tmp_path / "c.db"
    async with Runtime(str(db)) as rt:
        done = await rt.run(support(), "Refund order A-1")
        events = await rt.events(done.run_id)
    out = subprocess.run(
        [sys.executable, "-m", "contextos", "show", done.run_id, "--store", str(db)],
        cwd=ROOT,
        env={**os.environ, "NO_COLOR": "1", "COLUMNS": "200"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    completed = events[-1]
    [row] = [line for line in out.stdout.splitlines() if "run_completed" in line]
    cells = [c.strip() for c in row.strip("│ ").split("│")]
    assert cells[:2] == [str(completed.seq), f"#{completed.causation_id}"]
    assert "correlation_id=" not in out.stdout  # the run tree is said once, not on every line
