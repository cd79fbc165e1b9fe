"""A code node that declares an effect runs at most once: a real process is SIGKILLed while the
node's code runs (or right after any append to the workflow's log) and the workflow resumed in
a fresh process. An intent found without an outcome asks a person whether the effect happened
(and, if it did, for the node's output); the code is never run a second time unless the person
says it did not act. A code node that declares nothing is run again (the contrast)."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from collections import Counter
from pathlib import Path

import pytest
from pydantic import BaseModel

from contextos import ConfigError, Runtime, Workflow
from contextos import events as ev
from contextos.records.interrupts import InterruptKind
from contextos.runs import RunStatus
from contextos.store import SqliteStore
from support import crashes
from support.crashes import lines, resume, states

PAYMENTS = "tests/graph/crash_targets.py:payments"
CLI = [sys.executable, "-m", "contextos"]
CARELESS = "tests/graph/crash_targets.py:careless"
PAIR = "tests/graph/crash_targets.py:pair"
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


def killed_while_charging(tmp_path: Path) -> Path:
    """A process SIGKILLed while the charge runs, and the workflow resumed in a new one: the
    charge ran once, and the resume asks a person whether it took effect."""
    db = tmp_path / "runs.db"
    killed = crashes.kill_after(
        db, "run_c", 0, PAYMENTS, INPUT, tmp_path, count="own", CRASH_KILL_AT="charge:1"
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert sum(charged(tmp_path).values()) == 1  # it ran, and its output was never recorded
    resumed = resume(db, "run_c", tmp_path)
    assert json.loads(resumed.stdout)["status"] == "input_required", resumed.stderr
    return db


async def answer(db: Path, value: dict[str, object]) -> str:
    """Answer the workflow's pending question as a person would; its id."""
    async with Runtime(str(db)) as rt:
        (asked,) = (await rt.state("run_c")).pending_interrupts.values()
        await rt.answer(asked.id, value, answered_by="alice")
    return asked.id


def test_a_code_node_with_an_effect_killed_while_it_runs_asks_a_person_and_is_not_run_again(
    tmp_path: Path,
) -> None:
    db = killed_while_charging(tmp_path)
    waiting = states(db)["run_c"]
    (asked,) = waiting.pending_interrupts.values()
    assert asked.kind is InterruptKind.EXTERNAL_CONFIRMATION_REQUIRED
    assert asked.payload["node"] == "charge" and asked.payload["effect"] == "write"
    assert "did its effect happen?" in asked.payload["question"]
    assert asked.payload["output_schema"]["title"] == "Receipt"

    # It did: the person gives what the charge gave (as docs/graph.md shows, on the command
    # line), and the workflow goes on from there.
    store = ["--store", str(db)]
    inbox = crashes.run([*CLI, "inbox", *store], tmp_path)
    assert asked.id in inbox.stdout and asked.id == "run_c.i7"  # as in docs/graph.md, inbox.stdout
    answer = json.dumps({"outcome": "committed", "output": OUTPUT})
    answered = crashes.run([*CLI, "answer", asked.id, answer, *store, "--as", "alice"], tmp_path)
    assert answered.returncode == 0, answered.stderr
    resumed = resume(db, "run_c", tmp_path)
    result = json.loads(resumed.stdout)
    assert result["status"] == "completed", resumed.stderr
    assert result["structured_output"] == OUTPUT

    assert sum(charged(tmp_path).values()) == 1  # never run a second time
    assert [r["node"] for r in lines(tmp_path / "code.jsonl")] == ["charge", "file"]
    started, completed, *_ = asyncio.run(node_events(db))  # the answer, not the code
    assert isinstance(started, ev.NodeStarted) and started.effect == "write"
    assert isinstance(completed, ev.NodeCompleted) and completed.output == OUTPUT


def test_a_person_who_says_the_effect_did_not_happen_has_the_node_run_again(
    tmp_path: Path,
) -> None:
    db = killed_while_charging(tmp_path)
    asyncio.run(answer(db, {"outcome": "failed", "note": "nothing at the bank"}))
    resumed = resume(db, "run_c", tmp_path)
    result = json.loads(resumed.stdout)
    assert result["status"] == "completed", resumed.stderr
    assert result["structured_output"] == OUTPUT
    assert sorted(charged(tmp_path).values()) == [1, 1]  # again, on the person's word
    intents = [e for e in asyncio.run(node_events(db)) if isinstance(e, ev.NodeStarted)]
    assert [e.node for e in intents] == ["charge", "charge", "file"]  # a new intent first


def test_an_output_that_is_not_the_nodes_type_is_refused_when_it_is_given(
    tmp_path: Path,
) -> None:
    db = killed_while_charging(tmp_path)
    (asked,) = states(db)["run_c"].pending_interrupts.values()
    wrong = json.dumps({"outcome": "committed", "output": {"charged": 12}})
    store = ["--store", str(db)]
    refused = crashes.run([*CLI, "answer", asked.id, wrong, *store, "--as", "alice"], tmp_path)
    assert refused.returncode != 0
    assert "the output is not a valid Receipt (node charge): charged:" in refused.stderr
    assert "Traceback" not in refused.stderr
    assert states(db)["run_c"].pending_interrupts == {asked.id: asked}  # nothing recorded

    asyncio.run(answer(db, {"outcome": "committed", "output": OUTPUT}))
    resumed = resume(db, "run_c", tmp_path)
    assert json.loads(resumed.stdout)["structured_output"] == OUTPUT, resumed.stderr
    assert sum(charged(tmp_path).values()) == 1


def test_an_output_that_is_not_the_nodes_type_given_where_the_code_is_not_is_asked_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = killed_while_charging(tmp_path)
    with monkeypatch.context() as elsewhere:  # the workflow's file is not found from here
        elsewhere.chdir(tmp_path)
        first = asyncio.run(answer(db, {"outcome": "committed", "output": {"charged": 12}}))
    resumed = resume(db, "run_c", tmp_path)
    assert json.loads(resumed.stdout)["status"] == "input_required", resumed.stderr
    (again,) = states(db)["run_c"].pending_interrupts.values()
    assert again.id != first
    assert "The output given before was refused: charged:" in again.payload["question"]
    assert sum(charged(tmp_path).values()) == 1

    asyncio.run(answer(db, {"outcome": "committed", "output": OUTPUT}))
    resumed = resume(db, "run_c", tmp_path)
    assert json.loads(resumed.stdout)["structured_output"] == OUTPUT, resumed.stderr
    assert sum(charged(tmp_path).values()) == 1


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
        # Killed between the intent and the outcome: unknown, so not run again; a person is
        # asked whether it acted.
        assert after.status is RunStatus.INPUT_REQUIRED, resumed.stderr
        assert [i.payload["node"] for i in after.pending_interrupts.values()] == ["charge"]
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


def test_two_nodes_stopped_mid_call_are_each_put_to_a_person_in_turn(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    killed = crashes.kill_after(
        db, "run_c", 0, PAIR, INPUT, tmp_path, count="own", CRASH_KILL_AT="pair-b:1"
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    asked: list[str] = []
    for _ in range(2):  # one question at a time: answering one queues the workflow again
        resumed = resume(db, "run_c", tmp_path)
        assert json.loads(resumed.stdout)["status"] == "input_required", resumed.stderr
        (question,) = states(db)["run_c"].pending_interrupts.values()
        node = str(question.payload["node"])
        asked.append(node)
        side = node.removeprefix("charge_")
        given = {"outcome": "committed", "output": {"charged": f"A-1 ({side})"}}
        asyncio.run(answer(db, given))
    resumed = resume(db, "run_c", tmp_path)
    result = json.loads(resumed.stdout)
    assert result["status"] == "completed", resumed.stderr
    assert result["structured_output"] == {"charged": "A-1 (a), A-1 (b)"}
    assert sorted(asked) == ["charge_a", "charge_b"]
    assert len(lines(tmp_path / "pair.jsonl")) == 2  # neither ran again


# -- a reconcile says what became of the call: nobody is asked --------------------------------

RECONCILED = "tests/graph/crash_targets.py:reconciled"


def bank(log_dir: Path) -> list[dict[str, object]]:
    """The charges the bank took."""
    return lines(log_dir / "bank.jsonl")


def killed_in_the_charge(tmp_path: Path, at: str) -> Path:
    db = tmp_path / "runs.db"
    killed = crashes.kill_after(
        db, "run_c", 0, RECONCILED, INPUT, tmp_path, count="own", CRASH_KILL_AT=f"{at}:1"
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    return db


def test_a_reconcile_that_finds_the_charge_completes_the_node_without_running_it_again(
    tmp_path: Path,
) -> None:
    db = killed_in_the_charge(tmp_path, "charge")  # after the bank took it
    resumed = resume(db, "run_c", tmp_path)
    result = json.loads(resumed.stdout)
    assert result["status"] == "completed", resumed.stderr
    assert result["structured_output"] == OUTPUT
    assert sum(charged(tmp_path).values()) == 1 and len(bank(tmp_path)) == 1
    # The function got its intent's key, the one the reconcile looked up.
    (sent,) = [r["key"] for r in lines(tmp_path / "code.jsonl") if r["node"] == "charge"]
    started, found, completed, *_ = asyncio.run(node_events(db))
    assert isinstance(found, ev.NodeReconciled)
    assert (found.acted, found.output) == (True, OUTPUT)
    assert found.idempotency_key == sent == f"run_c/charge#{started.seq}"
    assert isinstance(completed, ev.NodeCompleted) and completed.output == OUTPUT
    assert states(db)["run_c"].interrupts == {}  # nobody was asked

    shown = crashes.run([*CLI, "show", "run_c", "--store", str(db)], tmp_path)
    assert "effect write, reconciled: it had acted" in shown.stdout, shown.stdout
    assert "charge reconciled (run_c/charge#4): it had acted" in shown.stdout


def test_a_reconcile_that_finds_nothing_runs_the_node_again_under_a_new_key(
    tmp_path: Path,
) -> None:
    db = killed_in_the_charge(tmp_path, "send")  # before the bank took it
    assert bank(tmp_path) == []
    resumed = resume(db, "run_c", tmp_path)
    assert json.loads(resumed.stdout)["structured_output"] == OUTPUT, resumed.stderr
    assert sorted(charged(tmp_path).values()) == [1, 1]  # once in each process
    first, second = [r["key"] for r in lines(tmp_path / "code.jsonl") if r["node"] == "charge"]
    assert first != second and [r["key"] for r in bank(tmp_path)] == [second]
    kinds = [e.type for e in asyncio.run(node_events(db))]
    assert kinds[:4] == ["node_started", "node_reconciled", "node_started", "node_completed"]


def test_a_reconcile_that_fails_puts_the_question_to_a_person(tmp_path: Path) -> None:
    db = killed_in_the_charge(tmp_path, "charge")
    resumed = resume(db, "run_c", tmp_path, CRASH_BANK_DOWN="1")
    assert json.loads(resumed.stdout)["status"] == "input_required", resumed.stderr
    (asked,) = states(db)["run_c"].pending_interrupts.values()
    assert asked.payload["question"].endswith(
        "Its reconcile raised ConnectionError: the bank does not answer."
    )
    assert sum(charged(tmp_path).values()) == 1


@pytest.mark.parametrize("n", range(1, APPENDS_IN_A_CLEAN_RUN + 1))
def test_killed_after_any_append_a_reconciled_charge_completes_once(tmp_path: Path, n: int) -> None:
    db = tmp_path / "runs.db"
    killed = crashes.kill_after(db, "run_c", n, RECONCILED, INPUT, tmp_path, count="own")
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    resumed = resume(db, "run_c", tmp_path)
    after = states(db)["run_c"]
    assert after.status is RunStatus.COMPLETED, resumed.stderr  # no person needed
    assert after.structured_output == OUTPUT
    assert len(bank(tmp_path)) == 1


def test_a_reconcile_or_a_key_needs_a_declared_effect_and_is_part_of_the_identity() -> None:
    def send(o: Order, *, idempotency_key: str) -> str:
        return f"{o.id} under {idempotency_key}"

    def sent(idempotency_key: str) -> str | None:
        return None

    def build(**how: object) -> Workflow:
        flow = Workflow("effects", input=Order)
        flow.code("send", send, **how)  # type: ignore[arg-type]
        return flow

    with pytest.raises(ConfigError, match="reconcile is for a function that acts on the world"):
        build(reconcile=sent)
    with pytest.raises(ConfigError, match="idempotency_key is for a function that acts"):
        build()
    assert build(effect="write", reconcile=sent).nodes[0].reconcile is sent
    assert (
        build(effect="write", reconcile=sent).identity_hash()
        != build(effect="write").identity_hash()
    )
