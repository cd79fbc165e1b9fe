"""Interrupts expiring under real worker processes: two workers sweep the same store at once,
the deadline passes (a short real one), and exactly one expiry is recorded; then the run goes on
(deny: the refund never runs) or ends expired (fail). SQLite file and PostgreSQL."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest
from refunds import agent, ledger

from contextos import RunStatus, Runtime
from contextos import events as ev
from contextos.policy import Policy, Principal
from contextos.policy.authority import Authority

ROOT = Path(__file__).resolve().parents[2]
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


def spawn(url: str, log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "contextos.workers",
                "--store",
                url,
                "--concurrency",
                "2",
                "--lease",
                "5",
                "--poll",
                "0.1",
                "--heartbeat",
                "0.5",
                "--expiry-poll",
                "0.05",
                "--no-schedules",
                "--no-triggers",
            ],
            cwd=ROOT,
            env={**os.environ, **env},
            stdout=subprocess.DEVNULL,
            stderr=out,
        )


async def settled(rt: Runtime, run_id: str, *, timeout_s: float = 120.0) -> RunStatus:
    """Wait until the run has ended (a hang fails the test; no timing is asserted)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        status = (await rt.state(run_id)).status
        if status.is_terminal:
            return status
        assert loop.time() < deadline, f"run {run_id} stuck in {status}"
        await asyncio.sleep(0.1)


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
    workers = [spawn(backend_url, log, env) for log in logs]
    try:
        async with Runtime(backend_url, policy=Authority(Policy.load(policy_file))) as rt:
            run_id = await rt.start(agent, "refund order A-0", agent_ref=AGENT, principal=BOB)
            status = await settled(rt, run_id)
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
