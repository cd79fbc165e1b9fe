"""A code node that declares an effect runs at most once: a real process is SIGKILLed while the
node's code runs (or right after any append to the workflow's log) and the workflow resumed in
a fresh process. An intent found without an outcome fails the workflow `outcome_unknown`; the
code is never run a second time. A code node that declares nothing is run again (the contrast)."""

from __future__ import annotations

import json
import signal
from collections import Counter
from pathlib import Path

import pytest
from pydantic import BaseModel

from contextos import ConfigError, Runtime, Workflow
from contextos import events as ev
from contextos.runs import FailureReason, RunStatus
from contextos.store import SqliteStore
from support import crashes
from support.crashes import lines, resume, states

PAYMENTS = "tests/graph/crash_targets.py:payments"
CARELESS = "tests/graph/crash_targets.py:careless"
INPUT = '{"order": "A-1", "amount": 12.5}'
APPENDS_IN_A_CLEAN_RUN = 7
"""The run's creation and start, each node's start and completion, the run's completion."""
OUTPUT = {"charged": "A-1: 12.50"}


def charged(log_dir: Path) -> Counter[int]:
    """How many times the charge ran, by process."""
    return Counter(
        int(str(r["pid"])) for r in lines(log_dir / "code.jsonl") if r["node"] == "charge"
    )


async def node_events(db: Path) -> list[ev.Event]:
    store = SqliteStore(db)
    try:
        return [e for e in await store.read("run_c") if e.type.startswith("node_")]  # type: ignore[arg-type]
    finally:
        await store.close()


async def test_a_code_node_with_an_effect_killed_while_it_runs_is_not_run_again(
    tmp_path: Path,
) -> None:
    db = tmp_path / "runs.db"
    killed = crashes.kill_after(
        db, "run_c", 0, PAYMENTS, INPUT, tmp_path, count="own", CRASH_KILL_AT="charge:1"
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert sum(charged(tmp_path).values()) == 1  # it ran, and its output was never recorded

    resumed = resume(db, "run_c", tmp_path)
    result = json.loads(resumed.stdout)
    assert result["status"] == "failed", resumed.stderr
    assert result["failure_reason"] == "outcome_unknown"
    assert "node charge (write)" in result["failure_message"]
    assert "is not run again" in result["failure_message"]

    assert sum(charged(tmp_path).values()) == 1  # never run a second time
    assert [r["node"] for r in lines(tmp_path / "code.jsonl")] == ["charge"]  # nor after it
    started, failed = await node_events(db)
    assert isinstance(started, ev.NodeStarted) and started.effect == "write"
    assert isinstance(failed, ev.NodeFailed) and failed.reason is FailureReason.OUTCOME_UNKNOWN


def test_a_code_node_without_a_declared_effect_runs_again(tmp_path: Path) -> None:
    """What the declaration prevents: without it the node runs again on resume."""
    db = tmp_path / "runs.db"
    killed = crashes.kill_after(
        db, "run_c", 0, CARELESS, INPUT, tmp_path, count="own", CRASH_KILL_AT="charge:1"
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    resumed = resume(db, "run_c", tmp_path)
    assert json.loads(resumed.stdout)["status"] == "completed", resumed.stderr
    assert sorted(charged(tmp_path).values()) == [1, 1]  # once in each process


@pytest.mark.parametrize("n", range(1, APPENDS_IN_A_CLEAN_RUN + 1))
def test_killed_after_any_append_the_charge_runs_at_most_once(tmp_path: Path, n: int) -> None:
    db = tmp_path / "runs.db"
    killed = crashes.kill_after(db, "run_c", n, PAYMENTS, INPUT, tmp_path, count="own")
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    before = states(db)["run_c"]
    intent = "charge" in before.nodes
    recorded = intent and before.nodes["charge"].status == "completed"

    resumed = resume(db, "run_c", tmp_path)
    after = states(db)["run_c"]
    times = sum(charged(tmp_path).values())
    assert times <= 1, resumed.stderr
    if intent and not recorded:
        # Killed between the intent and the outcome: unknown, so not run again.
        assert after.status is RunStatus.FAILED
        assert after.failure_reason is FailureReason.OUTCOME_UNKNOWN
        assert "file" not in after.nodes
    else:
        assert after.status is RunStatus.COMPLETED, resumed.stderr
        assert after.structured_output == OUTPUT
        assert times == 1


def test_a_clean_run_charges_once(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    done = crashes.kill_after(db, "run_c", 0, PAYMENTS, INPUT, tmp_path, count="own")
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) == APPENDS_IN_A_CLEAN_RUN
    state = states(db)["run_c"]
    assert state.status is RunStatus.COMPLETED and state.structured_output == OUTPUT
    assert sum(charged(tmp_path).values()) == 1


class Order(BaseModel):
    id: str


def test_the_declared_effect_is_checked_and_part_of_the_identity() -> None:
    def send(o: Order) -> str:
        return o.id

    def build(effect: str | None) -> Workflow:
        flow = Workflow("effects", input=Order)
        flow.code("send", send, effect=effect)
        return flow

    assert build(None).nodes[0].effect is None
    assert build("read").identity_hash() == build(None).identity_hash()  # reading is no effect
    assert build("write").nodes[0].effect == "write"
    assert build("write").identity_hash() != build(None).identity_hash()
    assert build("irreversible").identity_hash() != build("write").identity_hash()
    with pytest.raises(ConfigError, match="effect is one of read, write"):
        build("delete")


async def test_show_marks_a_node_that_declares_an_effect(tmp_path: Path) -> None:
    def send(o: Order) -> str:
        return f"sent {o.id}"

    flow = Workflow("effects", input=Order)
    flow.code("send", send, effect="irreversible")
    async with Runtime(str(tmp_path / "runs.db")) as rt:
        result = await rt.run(flow, Order(id="A-1"))
        assert result.structured_output == "sent A-1"
        (drawn,) = (await rt.tree(result.run_id)).children
    assert drawn.detail == "effect irreversible"
