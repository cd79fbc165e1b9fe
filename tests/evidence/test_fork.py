"""Fork: a new run from the first SEQ events of another; an effect already sent is never sent
again (the fork sees its receipt)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from evidence_cli import cli_for
from support_agents import POLICY, credit_agent, support, writes

from contextos import Principal, RunStatus, Runtime
from contextos import events as ev
from contextos.errors import ForkRefused
from contextos.testing import ScriptedModel, call_tool, reply

ROOT = Path(__file__).resolve().parents[2]
BOB = Principal.user("bob", scopes=("payments:*",))


@pytest.fixture(autouse=True)
def ledger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "ledger.jsonl"
    monkeypatch.setenv("EVIDENCE_LEDGER", str(path))
    return path


async def approved_run(rt: Runtime) -> list[ev.Event]:
    agent = support()
    waiting = await rt.run(agent, "Refund order A-1", principal=BOB)
    [asked] = await rt.inbox()
    await rt.approve(asked.id, approver="alice")
    done = await rt.resume(waiting.run_id, agent)
    assert done.status is RunStatus.COMPLETED
    return await rt.events(done.run_id)


def seq_of(events: list[ev.Event], kind: type[ev.Event], **fields: object) -> int:
    return next(
        e.seq
        for e in events
        if isinstance(e, kind) and all(getattr(e, k) == v for k, v in fields.items())
    )


async def test_a_fork_before_an_approved_write_does_not_repeat_it(
    tmp_path: Path, ledger: Path
) -> None:
    async with Runtime(str(tmp_path / "c.db"), policy=POLICY) as rt:
        events = await approved_run(rt)
        assert len(writes(ledger)) == 1
        # the decision that asked for the approval: before the approval and the write
        at = seq_of(events, ev.PolicyDecided, tool="refund", decision="require_approval")
        fork_id = await rt.fork(events[0].run_id, at=at)
        done = await rt.resume(fork_id, support())
        forked = await rt.events(fork_id)
    assert done.status is RunStatus.COMPLETED and done.output == "Refunded 250 EUR on A-1."
    assert len(writes(ledger)) == 1  # the refund was sent once, by the source run
    assert [e.type for e in forked[:at]] == [e.type for e in events[:at]]
    marker = forked[at]
    assert isinstance(marker, ev.RunForked) and marker.at_seq == at
    assert marker.source_run_id == events[0].run_id and len(marker.inherited_effects) == 1
    # no approval was asked again, nothing was dispatched by the fork
    assert not any(isinstance(e, ev.InterruptRaised) for e in forked[at:])
    dispatched = [e for e in forked if isinstance(e, ev.EffectChanged) and e.state == "dispatched"]
    assert [e.seq for e in dispatched] == [e.seq for e in dispatched if e.seq > at]  # inherited
    result = next(e for e in forked[at:] if isinstance(e, ev.ToolCompleted))
    assert json.loads(result.output) == {"refunded": 250.0}
    state_effect = next(e for e in forked[at:] if isinstance(e, ev.EffectChanged))
    assert state_effect.causation_id == at + 1  # brought in by the fork
    async with Runtime(str(tmp_path / "c.db")) as rt:
        record = await rt.record(fork_id)
    assert record.ask.forked_from == f"{events[0].run_id}#{at}"
    [_, refund] = record.actions
    assert refund.effect is not None and refund.effect.receipts["refund_id"] == "rf_A-1"


async def test_a_fork_before_the_model_chose_the_write_takes_the_sources_effect(
    tmp_path: Path, ledger: Path
) -> None:
    async with Runtime(str(tmp_path / "c.db"), policy=POLICY) as rt:
        events = await approved_run(rt)
        looked_up = seq_of(events, ev.ToolCompleted, name="lookup")  # the model has not chosen
        fork_id = await rt.fork(events[0].run_id, at=looked_up)
        done = await rt.resume(fork_id, support())
        forked = await rt.events(fork_id)
    assert done.status is RunStatus.COMPLETED
    assert len(writes(ledger)) == 1  # the model asked for the same refund: it was not sent again
    proposed = next(e for e in forked[looked_up:] if isinstance(e, ev.EffectProposed))
    source = next(e for e in events if isinstance(e, ev.EffectProposed))
    assert proposed.idempotency_key == source.idempotency_key  # the source's effect, taken over
    assert not any(isinstance(e, ev.InterruptRaised) for e in forked[looked_up:])


async def test_a_fork_asking_for_the_same_write_at_another_turn_takes_the_sources_effect(
    tmp_path: Path, ledger: Path
) -> None:
    """Calls are named by turn and position, so here the fork's call has another id than the
    source's: the effect it takes over is recorded under the fork's call."""
    refund_again = call_tool("refund", {"order_id": "A-1", "amount": 250.0})
    model = ScriptedModel(
        [
            call_tool("lookup", {"order_id": "A-1"}),
            call_tool("lookup", {"order_id": "A-1"}),  # looks again before refunding
            refund_again,
            reply("Refunded 250 EUR on A-1."),
        ],
        by_turn=True,
    )
    checks_twice = dataclasses.replace(support(), model=model)
    async with Runtime(str(tmp_path / "c.db"), policy=POLICY) as rt:
        events = await approved_run(rt)
        looked_up = seq_of(events, ev.ToolCompleted, name="lookup")
        fork_id = await rt.fork(events[0].run_id, at=looked_up, agent=checks_twice)
        done = await rt.resume(fork_id, checks_twice)
        forked = await rt.events(fork_id)
    assert done.status is RunStatus.COMPLETED
    assert len(writes(ledger)) == 1
    source = next(e for e in events if isinstance(e, ev.EffectProposed))
    proposed = next(e for e in forked[looked_up:] if isinstance(e, ev.EffectProposed))
    assert source.call_id == "call_2_0" and proposed.call_id == "call_3_0"
    assert proposed.effect_id == source.effect_id
    result = next(
        e for e in forked[looked_up:] if isinstance(e, ev.ToolCompleted) and e.name == "refund"
    )
    assert result.call_id == "call_3_0" and result.effect_id == source.effect_id
    assert json.loads(result.output) == {"refunded": 250.0}
    assert not any(isinstance(e, ev.InterruptRaised) for e in forked[looked_up:])


async def test_a_fork_with_another_agent_makes_its_own_decisions_after_the_cut(
    tmp_path: Path, ledger: Path
) -> None:
    async with Runtime(str(tmp_path / "c.db"), policy=POLICY) as rt:
        events = await approved_run(rt)
        looked_up = seq_of(events, ev.ToolCompleted, name="lookup")
        fork_id = await rt.fork(events[0].run_id, at=looked_up, agent=credit_agent)
        done = await rt.resume(fork_id, credit_agent)
    assert done.status is RunStatus.COMPLETED and done.output == "Credited 250 EUR."
    assert [w["tool"] for w in writes(ledger)] == ["refund", "credit"]


async def test_a_fork_point_the_loop_cannot_go_on_from_is_refused(tmp_path: Path) -> None:
    async with Runtime(str(tmp_path / "c.db"), policy=POLICY) as rt:
        events = await approved_run(rt)
        run_id = events[0].run_id
        asked = seq_of(events, ev.InterruptRaised)
        proposed = seq_of(events, ev.EffectProposed)
        cases = {
            0: "fork at a seq in that range",
            len(events) + 1: "fork at a seq in that range",
            1: "a fork keeps it: fork at #2 or later",
            len(events): "has ended",
            asked: f"waits on a person (the question of #{asked}); fork before it",
            proposed: "inside the step that proposes effect",
        }
        for at, why in cases.items():
            with pytest.raises(ForkRefused, match=why.replace("(", r"\(").replace(")", r"\)")):
                await rt.fork(run_id, at=at)
        assert len(await rt.runs()) == 1  # nothing was created


def test_fork_command(tmp_path: Path) -> None:
    cli = cli_for(tmp_path)

    ran = cli("run", "tests/evidence/support_agents.py:agent", "Refund A-1", "--json")
    run_id = json.loads(ran.stdout)["run_id"]
    forked = cli("fork", run_id, "--at", "4", "--json")
    assert forked.returncode == 0, forked.stderr
    result = json.loads(forked.stdout)
    assert result["status"] == "completed" and result["run_id"].startswith("fork_")
    assert len(writes(tmp_path / "l")) == 1
    refused = cli("fork", run_id, "--at", "99")
    assert refused.returncode == 1 and "fork at a seq in that range" in refused.stderr
    assert "Traceback" not in refused.stderr
