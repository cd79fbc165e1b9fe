"""Interrupts expiring under real worker processes: two workers sweep the same store at once,
the deadline passes (a short real one), and exactly one expiry is recorded; then the run goes on
(deny: the refund never runs) or ends expired (fail). SQLite file and PostgreSQL."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from refunds import agent, ledger

from contextos import RunStatus, Runtime
from contextos import events as ev
from contextos.policy import Policy, Principal
from contextos.policy.authority import Authority
from support.processes import ended, spawn_worker

AGENT = "tests/interrupts/refunds.py:agent"
BOB = Principal.user("bob", scopes=("payments:*",))

POLICY = """
name = "refunds"
[roles]
finance = ["alice"]

[[rules]]
id = "refund-over-100"
tools = ["refund"]
decision = "require_approval"
approver_role = "finance"
preview = "Refund {{amount}} EUR on order {{order_id}}"
when = {{ amount = {{ gt = 100 }} }}
expires_in = 1
on_expiry = "{on_expiry}"
"""


@pytest.mark.parametrize("on_expiry", ["deny", "fail"])
async def test_two_workers_record_one_expiry_and_the_declared_outcome_follows(
    backend_url: str, tmp_path: Path, on_expiry: str
) -> None:
    policy_file = tmp_path / "policy.toml"
    policy_file.write_text(POLICY.format(on_expiry=on_expiry))
    refunds = tmp_path / "refunds.db"
    env = {"CONTEXTOS_POLICY": str(policy_file), "REFUND_LEDGER": str(refunds)}
    os.environ["REFUND_LEDGER"] = str(refunds)  # for this process's reads of the ledger
    logs = [tmp_path / f"worker{i}.log" for i in range(2)]
    workers = [
        spawn_worker(
            backend_url,
            log,
            "--expiry-poll",
            "0.05",
            "--no-schedules",
            "--no-triggers",
            env=env,
            lease_s=5.0,
            concurrency=2,
        )
        for log in logs
    ]
    try:
        async with Runtime(backend_url, policy=Authority(Policy.load(policy_file))) as rt:
            run_id = await rt.start(agent, "refund order A-0", agent_ref=AGENT, principal=BOB)
            status = await ended(rt, run_id)
            events = await rt.events(run_id)
    finally:
        for w in workers:
            w.terminate()
        for w in workers:
            w.wait(timeout=60)
        os.environ.pop("REFUND_LEDGER", None)
    expired = [e for e in events if isinstance(e, ev.InterruptExpired)]
    assert len(expired) == 1, [e.type for e in events]
    assert expired[0].actor.startswith("worker:")
    raised = next(e for e in events if isinstance(e, ev.InterruptRaised))
    assert raised.payload["expiry"]["on_expiry"] == on_expiry
    if on_expiry == "deny":
        assert status is RunStatus.COMPLETED
        (done,) = [e for e in events if isinstance(e, ev.ToolCompleted)]
        assert done.is_error and "in time" in done.output
    else:
        assert status is RunStatus.EXPIRED
        (end,) = [e for e in events if isinstance(e, ev.RunExpired)]
        assert expired[0].interrupt_id in end.reason
    assert ledger(refunds) == ([], 0)  # the refund never ran
    for log in logs:
        assert "Traceback" not in log.read_text(), log.read_text()
