"""Approve, SIGKILL the worker between the refund and its record, resume in a new process:
the refund happens exactly once, and the approval is neither lost nor asked for again."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from refunds import POLICY, ledger

from contextos import RunStatus, Runtime
from contextos import events as ev
from contextos.ledger import EffectState
from contextos.policy.authority import Authority

CHILD = Path(__file__).resolve().parent / "approval_child.py"
ROOT = Path(__file__).resolve().parents[2]


def spawn(db: Path, mode: str, run_id: str, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(CHILD), str(db), mode, run_id],
        cwd=ROOT,
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(proc: subprocess.Popen[str]) -> str:
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    return out.strip()


def test_approve_kill_resume_runs_the_refund_exactly_once(tmp_path: Path) -> None:
    db, refunds = tmp_path / "runs.db", tmp_path / "refunds.db"
    env = {"REFUND_LEDGER": str(refunds)}
    run_id = "run_crash_approval"

    # 1. a worker runs until the refund needs approval, then exits: nothing holds the run
    assert finish(spawn(db, "start", run_id, env)) == "input_required"
    assert ledger(refunds) == ([], 0)

    # 2. a person approves, from another process (this one)
    async def approve() -> str:
        async with Runtime(str(db), policy=Authority(POLICY)) as rt:
            (pending,) = await rt.inbox()
            approval = await rt.approve(pending.id, approver="alice")
            return approval.id

    approval_id = asyncio.run(approve())

    # 3. a worker resumes, the refund commits, and the worker is SIGKILLed before recording it
    marker = tmp_path / "committed"
    proc = spawn(db, "resume", run_id, {**env, "REFUND_HANG_AFTER_COMMIT": str(marker)})
    deadline = time.monotonic() + 120
    while not marker.exists():
        assert proc.poll() is None, proc.communicate()[1]
        assert time.monotonic() < deadline, "the resumed worker never reached the refund"
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    assert ledger(refunds) == ([(f"{run_id}/call_1_0", "A-0", 500.0)], 1)

    # 4. a new worker resumes: the effect is reconciled, not sent again; no new interrupt
    assert finish(spawn(db, "resume", run_id, env)) == "completed"
    assert ledger(refunds) == ([(f"{run_id}/call_1_0", "A-0", 500.0)], 1)

    async def inspect() -> list[ev.Event]:
        async with Runtime(str(db), policy=Authority(POLICY)) as rt:
            assert (await rt.state(run_id)).status is RunStatus.COMPLETED
            return await rt.events(run_id)

    events = asyncio.run(inspect())
    assert sum(isinstance(e, ev.InterruptRaised) for e in events) == 1
    assert sum(isinstance(e, ev.ToolCompleted) for e in events) == 1
    assert any(isinstance(e, ev.RuntimeCrashDetected) for e in events)
    allowed = [e for e in events if isinstance(e, ev.PolicyDecided) and e.approval_id]
    assert [e.approval_id for e in allowed] == [approval_id]
    states = [e.state for e in events if isinstance(e, ev.EffectChanged)]
    assert states.count(EffectState.DISPATCHED) == 1
    assert EffectState.OUTCOME_UNKNOWN in states and states[-1] is EffectState.COMMITTED
