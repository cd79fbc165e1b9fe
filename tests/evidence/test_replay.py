"""Replay: a recorded run against a changed agent, recorded tool results served from the log,
no live tool ever called, and a readable diff of decisions."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from evidence_cli import cli_for
from support_agents import CREDIT_INSTRUCTIONS, POLICY, credit, lookup, refund, support, writes

from contextos import Principal, RunStatus, Runtime, Tool
from contextos.errors import LiveDispatchRefused, RecordInvalid
from contextos.evidence import ReplayPacket
from contextos.evidence.replay import seal
from contextos.policy import Decision, Policy, Rule
from contextos.tools.contract import ToolContext, as_tool

ROOT = Path(__file__).resolve().parents[2]
BOB = Principal.user("bob", scopes=("payments:*",))


@pytest.fixture(autouse=True)
def ledger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "ledger.jsonl"
    monkeypatch.setenv("EVIDENCE_LEDGER", str(path))
    return path


async def approved_run(rt: Runtime) -> str:
    agent = support()
    waiting = await rt.run(agent, "Refund order A-1", principal=BOB)
    [asked] = await rt.inbox()
    await rt.approve(asked.id, approver="alice")
    done = await rt.resume(waiting.run_id, agent)
    assert done.status is RunStatus.COMPLETED
    return done.run_id


def exploding(fn: Any) -> Tool:
    """The same contract, an implementation that fails the test if anything calls it."""
    t = as_tool(fn)

    def boom(**kwargs: Any) -> Any:
        pytest.fail(f"a replay called the live tool {t.name}")

    return dataclasses.replace(t, fn=boom)


async def test_an_unchanged_agent_replays_equal_without_calling_a_tool(
    tmp_path: Path, ledger: Path
) -> None:
    async with Runtime(str(tmp_path / "c.db"), policy=POLICY) as rt:
        run_id = await approved_run(rt)
        assert len(writes(ledger)) == 1
        agent = support(tools=(exploding(lookup), exploding(refund), exploding(credit)))
        assert agent.identity_hash() == support().identity_hash()  # the same contracts
        report = await rt.replay(run_id, agent)
    assert report.status == "replay_equal" and report.differences == ()
    assert report.replay_status is RunStatus.COMPLETED
    assert (report.served, report.answers_served) == (2, 1)  # lookup, refund; alice's approval
    assert report.replayed.approvals == ("refund: approved by alice",)
    assert report.recorded.policy == report.replayed.policy
    assert len(writes(ledger)) == 1  # the refund was never made again


async def test_instructions_that_make_the_model_pick_another_tool_are_a_mismatch(
    tmp_path: Path, ledger: Path
) -> None:
    async with Runtime(str(tmp_path / "c.db"), policy=POLICY) as rt:
        run_id = await approved_run(rt)
        report = await rt.replay(run_id, support(CREDIT_INSTRUCTIONS))
    assert report.status == "replay_mismatch"
    # another tool: no approval asked (credit needs none), and so no approval given
    assert [d.kind for d in report.differences] == ["tool_calls", "policy", "approvals"]
    text = report.text()
    assert "tool calls chosen:\n" in text
    assert '  = lookup {"order_id":"A-1"}' in text
    assert '  - refund {"amount":250.0,"order_id":"A-1"}' in text
    assert '  + credit {"amount":250.0,"order_id":"A-1"}' in text
    # the credit was never made: the log has no result for it, and the replay sent nothing
    assert report.not_recorded == ('credit {"amount":250.0,"order_id":"A-1"}',)
    assert [w["tool"] for w in writes(ledger)] == ["refund"]


async def test_a_changed_policy_shows_in_the_policy_decisions(tmp_path: Path) -> None:
    stricter = Policy(
        name="refunds",
        version="2",
        rules=(Rule(id="no-refunds", tools=("refund",), decision=Decision.DENY, reason="frozen"),),
        roles=POLICY.roles,
    )
    async with Runtime(str(tmp_path / "c.db"), policy=POLICY) as rt:
        run_id = await approved_run(rt)
        report = await rt.replay(run_id, support(), policy=stricter)
    [policy] = [d for d in report.differences if d.kind == "policy"]
    rendered = policy.render()
    assert '  - refund {"amount":250.0,"order_id":"A-1"}: require_approval [refund-over-100]' in (
        rendered
    )
    assert '  + refund {"amount":250.0,"order_id":"A-1"}: deny [no-refunds]' in rendered


async def test_a_sealed_tool_refuses_whoever_calls_it(tmp_path: Path) -> None:
    sealed = seal(refund)
    assert sealed.contract_hash() == refund.contract_hash()
    with pytest.raises(LiveDispatchRefused, match="live tool refund"):
        sealed.fn(order_id="A-1", amount=1.0, ctx=ToolContext(run_id="r", call_id="c"))


async def test_packets_replay_where_the_run_never_was_and_refuse_edits(tmp_path: Path) -> None:
    async with Runtime(str(tmp_path / "c.db"), policy=POLICY) as rt:
        run_id = await approved_run(rt)
        packet = await rt.packet(run_id, agent_ref="tests/evidence/support_agents.py:agent")
    text = packet.to_json()
    accepted = ReplayPacket.from_json(text)
    assert accepted.side_effect_policy == "transcript_only"
    async with Runtime(str(tmp_path / "elsewhere.db"), policy=POLICY) as other:
        report = await other.replay(accepted, support())
    assert report.equal and report.source_run_id == run_id

    data = json.loads(text)
    refunded = next(e for e in data["events"] if e["event"]["type"] == "tool_completed")
    refunded["event"]["output"] = '{"refunded": 9999}'
    async with Runtime(str(tmp_path / "elsewhere.db"), policy=POLICY) as other:
        with pytest.raises(RecordInvalid, match="events were changed"):
            await other.replay(ReplayPacket.from_json(json.dumps(data)), support())


def test_replay_and_packet_commands(tmp_path: Path) -> None:
    cli = cli_for(tmp_path)

    ran = cli("run", "tests/evidence/support_agents.py:agent", "Refund A-1", "--json")
    run_id = json.loads(ran.stdout)["run_id"]
    same = cli("replay", run_id)
    assert same.returncode == 0, same.stderr
    assert same.stdout.startswith("replay_equal")
    changed = cli("replay", run_id, "--agent", "tests/evidence/support_agents.py:credit_agent")
    assert changed.returncode == 1
    assert "replay_mismatch" in changed.stdout and "+ credit" in changed.stdout
    as_json = json.loads(
        cli(
            "replay", run_id, "--agent", "tests/evidence/support_agents.py:credit_agent", "--json"
        ).stdout
    )
    assert as_json["status"] == "replay_mismatch"

    packet = tmp_path / "p.json"
    packet.write_text(cli("packet", run_id).stdout)
    from_packet = cli("replay", "--packet", str(packet))
    assert from_packet.returncode == 0 and from_packet.stdout.startswith("replay_equal")
    packet.write_text("{}")
    broken = cli("replay", "--packet", str(packet))
    assert broken.returncode == 1 and "not a valid ReplayPacket" in broken.stderr
    assert "Traceback" not in broken.stderr
    neither = cli("replay")
    assert neither.returncode == 1 and "give a run id or --packet" in neither.stderr
