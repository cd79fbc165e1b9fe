"""The DecisionRecord: a projection of the log, every part traced to event seqs, the same hash
wherever it is rebuilt."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import sqlite3
import subprocess
import sys
import zlib
from pathlib import Path
from typing import Any

import pytest
from evidence_cli import cli_for
from pydantic import BaseModel
from support_agents import POLICY, planner, support

from contextos import Agent, Budget, Principal, RunStatus, Runtime
from contextos import events as ev
from contextos.errors import RecordInvalid
from contextos.evidence import DecisionRecord, build_record, record_data
from contextos.evidence.canonical import (
    ActionPart,
    ApprovalPart,
    ArtifactPart,
    Ask,
    CostPart,
    DecisionPart,
    EffectPart,
    EvaluationPart,
    ModelCallPart,
    OutcomePart,
    PolicyPart,
    PrincipalPart,
    ResultPart,
    Traced,
    canonical_hash,
    canonical_json,
    sealed,
)
from contextos.evidence.record import OFF_LOOP
from contextos.store import SqliteStore
from contextos.store.artifacts import Artifact, artifacts_of, make_artifact
from contextos.testing import ScriptedModel, call_tool, reply

ROOT = Path(__file__).resolve().parents[2]
BOB = Principal.user("bob", scopes=("payments:*",))

# Which events each part of a record may be projected from.
SOURCES: dict[type[Traced], set[str]] = {
    Ask: {"run_created", "run_forked"},
    PrincipalPart: {"context_bound"},
    PolicyPart: {"context_bound"},
    ModelCallPart: {"model_responded"},
    ActionPart: {
        "model_responded",
        "policy_decided",
        "effect_proposed",
        "effect_changed",
        "interrupt_raised",
        "approval_granted",
        "approval_denied",
        "tool_completed",
    },
    DecisionPart: {"policy_decided"},
    ApprovalPart: {"interrupt_raised", "approval_granted", "approval_denied"},
    EffectPart: {"effect_proposed", "effect_changed"},
    ResultPart: {"tool_completed"},
    EvaluationPart: {"evaluation_recorded"},
    ArtifactPart: {"artifact_recorded"},
    CostPart: {"model_responded", "context_compacted"},
    OutcomePart: {"run_completed", "run_failed", "run_cancelled", "run_expired"},
}


@pytest.fixture(autouse=True)
def ledger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "ledger.jsonl"
    monkeypatch.setenv("EVIDENCE_LEDGER", str(path))
    return path


async def approved_run(db: Path) -> tuple[str, list[ev.Event]]:
    async with Runtime(str(db), policy=POLICY) as rt:
        agent = support()
        waiting = await rt.run(agent, "Refund order A-1", principal=BOB)
        assert waiting.status is RunStatus.INPUT_REQUIRED
        [asked] = await rt.inbox()
        await rt.approve(asked.id, approver="alice")
        done = await rt.resume(waiting.run_id, agent)
        assert done.status is RunStatus.COMPLETED
        return done.run_id, await rt.events(done.run_id)


def traced_parts(model: BaseModel) -> list[Traced]:
    """Every traced part of a record, however deep."""
    found: list[Traced] = [model] if isinstance(model, Traced) else []
    for name in type(model).model_fields:
        value = getattr(model, name)
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, BaseModel):
                found.extend(traced_parts(item))
    return found


async def test_every_part_of_the_record_is_traced_to_the_events_it_comes_from(
    tmp_path: Path,
) -> None:
    run_id, events = await approved_run(tmp_path / "c.db")
    record = build_record(events)
    by_seq = {e.seq: e for e in events}

    parts = traced_parts(record)
    assert {type(p) for p in parts} == set(SOURCES)  # a run with every kind of part
    for part in parts:
        assert part.seqs, part
        for seq in part.seqs:
            assert by_seq[seq].type in SOURCES[type(part)], (type(part).__name__, seq)

    assert record.run_id == run_id and record.at_seq == events[-1].seq
    assert record.principal is not None and record.principal.principal == "user:bob@default"
    assert record.policy is not None and record.policy.snapshot_hash == POLICY.snapshot_hash
    assert record.model_calls[0].tools_visible == ["lookup", "refund", "credit"]
    assert all(m.context_hash and m.manifest for m in record.model_calls)
    [_, refund] = record.actions
    assert refund.tool == "refund"
    assert [d.decision for d in refund.decisions] == ["require_approval", "allow"]
    [approval] = refund.approvals
    granted = next(e for e in events if isinstance(e, ev.ApprovalGranted))
    assert approval.outcome == "approved" and approval.approver == "alice"
    assert approval.frozen_hash == granted.action_hash == refund.decisions[0].action_hash
    assert approval.expires_at == granted.expires_at.isoformat()
    assert refund.effect is not None and refund.effect.state == "committed"
    assert refund.effect.receipts == {"refund_id": "rf_A-1"}
    assert refund.result is not None and not refund.result.is_error
    [evaluation] = record.evaluations
    assert (evaluation.evaluator, evaluation.evaluator_kind, evaluation.passed) == (
        "confirmed",
        "function",
        True,
    )
    assert [a.type for a in record.artifacts] == ["run_output"]
    assert record.costs.model_calls == 3 and record.costs.input_tokens == 30
    assert record.outcome.status == "completed" and record.outcome.checkpoint == "terminal"
    assert record.verify() is record
    with pytest.raises(RecordInvalid, match="does not match its content"):
        record.model_copy(update={"at_seq": 3}).verify()


async def test_the_record_hash_is_the_same_rebuilt_in_another_process(tmp_path: Path) -> None:
    db = tmp_path / "c.db"
    run_id, events = await approved_run(db)
    here = build_record(events).record_hash
    script = (
        "import asyncio, sys\n"
        "from contextos import Runtime\n"
        "async def main():\n"
        "    async with Runtime(sys.argv[1]) as rt:\n"
        "        print((await rt.record(sys.argv[2])).record_hash)\n"
        "asyncio.run(main())\n"
    )
    elsewhere = subprocess.run(
        [sys.executable, "-c", script, str(db), run_id],
        env={**os.environ, "PYTHONHASHSEED": "4242", "TZ": "Asia/Tokyo"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert elsewhere.returncode == 0, elsewhere.stderr
    assert elsewhere.stdout.strip() == here

    # The runtime stored a record when the run waited on a person and when it ended.
    async with Runtime(str(db)) as rt:
        stored = await rt.receipts(run_id)
    waiting = next(e.seq for e in events if isinstance(e, ev.InterruptRaised))
    assert [(r.at_seq, r.matches) for r in stored] == [(waiting, True), (events[-1].seq, True)]
    assert stored[-1].record_hash == here


async def test_the_stored_record_is_the_models_dump_whatever_a_person_decided(
    tmp_path: Path,
) -> None:
    """The runtime stores a record made without the models: the same JSON, so the same hash,
    for approved, denied and revoked approvals and a forked run."""
    db = tmp_path / "c.db"
    approved, _ = await approved_run(db)
    async with Runtime(str(db), policy=POLICY) as rt:
        agent = support()
        denied = await rt.run(agent, "Refund order A-2", principal=BOB)
        [asked] = await rt.inbox()
        await rt.deny(asked.id, approver="alice", reason="not this one")
        await rt.resume(denied.run_id, agent)
        revoked = await rt.run(agent, "Refund order A-3", principal=BOB)
        [asked] = await rt.inbox()
        approval = await rt.approve(asked.id, approver="alice")
        await rt.revoke(approval.id, revoked_by="alice", reason="changed my mind")
        await rt.resume(revoked.run_id, agent)
        forked = await rt.fork(approved, at=4)
        await rt.resume(forked, agent)
        for run_id in (approved, denied.run_id, revoked.run_id, forked):
            events = await rt.events(run_id)
            data = record_data(events)
            dumped = DecisionRecord.model_validate(data).model_dump(mode="json")
            assert json.dumps(data, sort_keys=True) == json.dumps(dumped, sort_keys=True)
            receipts = await rt.receipts(run_id)
            assert receipts and all(r.matches for r in receipts), run_id
            # Stored as the canonical JSON of the record, its hash included.
            _, stored = await rt.artifact(receipts[-1].artifact_id)
            at = receipts[-1].at_seq
            assert stored == canonical_json(record_data(events[:at])).encode(), run_id
        outcomes = {
            a["outcome"]
            for run_id in (denied.run_id, revoked.run_id)
            for action in record_data(await rt.events(run_id))["actions"]
            for a in action["approvals"]
        }
        assert {"denied", "revoked"} <= outcomes
        assert record_data(await rt.events(forked))["ask"]["forked_from"] == f"{approved}#4"


@pytest.mark.parametrize(
    "data",
    [
        {"a": 1, "z": [2, "é"]},  # members before and after the hash
        {"a": {"nested": "x"}},  # only before
        {"zz": None, "zzz": 1.5},  # only after
        {},
    ],
)
def test_a_sealed_text_is_the_canonical_json_of_the_data_with_its_hash(
    data: dict[str, Any],
) -> None:
    digest, text = sealed(data, "record_hash")
    assert digest == canonical_hash(data)
    assert text == canonical_json({**data, "record_hash": digest})
    assert json.loads(text) == {**data, "record_hash": digest}


async def test_a_log_changed_after_its_record_was_stored_no_longer_matches(
    tmp_path: Path,
) -> None:
    db = tmp_path / "c.db"
    run_id, events = await approved_run(db)
    granted = next(e for e in events if isinstance(e, ev.ApprovalGranted))
    conn = sqlite3.connect(db)
    conn.execute("DROP TRIGGER events_are_append_only_u")  # someone with the file rewrites it
    payload = json.loads(
        conn.execute(
            "SELECT payload FROM events WHERE run_id = ? AND seq = ?", (run_id, granted.seq)
        ).fetchone()[0]
    )
    payload["approver"] = "mallory"
    conn.execute(
        "UPDATE events SET payload = ? WHERE run_id = ? AND seq = ?",
        (json.dumps(payload).encode(), run_id, granted.seq),
    )
    conn.execute("DELETE FROM snapshots")
    conn.commit()
    conn.close()
    async with Runtime(str(db)) as rt:
        stored = await rt.receipts(run_id)
    # the record stored before the approval still matches; the one after it no longer does
    assert [r.matches for r in stored] == [True, False]


async def test_passes_and_failures_of_verification_are_both_evaluations(tmp_path: Path) -> None:
    def cites(answer: str) -> list[str]:
        return [] if "[1]" in answer else ["cite a source as [1]"]

    agent = Agent(
        name="writer",
        model=ScriptedModel([reply("Paris."), reply("Paris [1].")]),
        verifier=cites,
    )
    async with Runtime(str(tmp_path / "c.db")) as rt:
        done = await rt.run(agent, "Capital of France?")
        record = await rt.record(done.run_id)
    verdicts = [(e.evaluator, e.passed, e.gaps) for e in record.evaluations]
    assert verdicts == [("cites", False, ["cite a source as [1]"]), ("cites", True, [])]
    answers = [m.seqs[0] for m in record.model_calls]
    assert [e.subject_seq for e in record.evaluations] == answers


def test_record_command(tmp_path: Path) -> None:
    cli = cli_for(tmp_path)

    ran = cli("run", "tests/evidence/support_agents.py:agent", "Refund A-1", "--json")
    run_id = json.loads(ran.stdout)["run_id"]
    shown = cli("record", run_id)
    assert shown.returncode == 0, shown.stderr
    data: dict[str, Any] = json.loads(cli("record", run_id, "--json").stdout)
    record = DecisionRecord.from_json(json.dumps(data)).verify()
    assert f"hash {record.record_hash[:16]}" in shown.stdout
    assert "identical to the log" in shown.stdout
    assert "evaluated by confirmed" in shown.stdout and "passed" in shown.stdout
    missing = cli("record", "run_nope")
    assert missing.returncode == 1 and "no run with id" in missing.stderr


def test_a_stored_record_that_is_corrupt_or_of_an_unknown_version_fails_loudly(
    tmp_path: Path,
) -> None:
    db = tmp_path / "c.db"
    cli = cli_for(tmp_path, columns=300)

    ran = cli("run", "tests/evidence/support_agents.py:agent", "Refund A-1", "--json")
    run_id = json.loads(ran.stdout)["run_id"]
    assert cli("record", run_id).returncode == 0
    conn = sqlite3.connect(db)
    artifact_id, digest = conn.execute(
        "SELECT artifact_id, content_hash FROM artifacts WHERE type = 'decision_record'"
    ).fetchone()
    [content] = conn.execute("SELECT content FROM blobs WHERE sha256 = ?", (digest,)).fetchone()
    conn.execute("DROP TRIGGER blobs_are_append_only_u")  # someone with the file rewrites it
    conn.execute("DROP TRIGGER artifacts_are_append_only_u")
    conn.execute("UPDATE blobs SET content = ? WHERE sha256 = ?", (content + b" ", digest))
    conn.commit()
    corrupt = cli("record", run_id)
    assert corrupt.returncode == 1 and "Traceback" not in corrupt.stderr
    assert f"DIFFERS from the log: artifact {artifact_id}: its stored content" in corrupt.stdout

    newer = json.loads(zlib.decompress(content))  # stored compressed
    newer["record_type"] = "contextos.decision_record.v2"
    blob = json.dumps(newer).encode()
    digest = hashlib.sha256(blob).hexdigest()
    conn.execute("INSERT INTO blobs VALUES (?, ?, ?)", (digest, len(blob), blob))
    conn.execute(
        "UPDATE artifacts SET content_hash = ? WHERE artifact_id = ?", (digest, artifact_id)
    )
    conn.commit()
    conn.close()
    unknown = cli("record", run_id)
    assert unknown.returncode == 1
    newer_version = "version 'contextos.decision_record.v2' is not one this ContextOS reads"
    assert newer_version in unknown.stdout


async def test_a_child_runs_record_is_vouched_for_by_its_parents_log(tmp_path: Path) -> None:
    """A child run stores no record of its own: its parent's child_run_finished holds the hash
    of the child's record, which `receipts` checks against the child's log."""
    db = tmp_path / "c.db"
    async with Runtime(str(db)) as rt:
        parent = (await rt.run(planner, "Check order A-1")).run_id
        [finished] = [e for e in await rt.events(parent) if isinstance(e, ev.ChildRunFinished)]
        child = finished.child_run_id
        assert finished.record_hash == (await rt.record(child)).record_hash
        [vouched] = await rt.receipts(child)
        assert (vouched.anchor, vouched.matches, vouched.artifact_id) == (
            f"{parent}#{finished.seq}",
            True,
            "",
        )
        assert vouched.at_seq == (await rt.events(child))[-1].seq
        assert [r.anchor for r in await rt.receipts(parent)] == [""]  # the parent stores its own
    conn = sqlite3.connect(db)
    stored = conn.execute("SELECT run_id FROM artifacts WHERE type = 'decision_record'").fetchall()
    assert stored == [(parent,)]

    # Someone with the file rewrites the child's answer: the parent's hash no longer matches.
    conn.execute("DROP TRIGGER events_are_append_only_u")
    seq, payload = conn.execute(
        "SELECT seq, payload FROM events WHERE run_id = ? AND type = 'model_responded'", (child,)
    ).fetchone()
    changed = json.loads(payload)
    changed["message"]["content"] = "A-1 is not paid."
    conn.execute(
        "UPDATE events SET payload = ? WHERE run_id = ? AND seq = ?",
        (json.dumps(changed).encode(), child, seq),
    )
    conn.execute("DELETE FROM snapshots")
    conn.commit()
    conn.close()
    async with Runtime(str(db)) as rt:
        [vouched] = await rt.receipts(child)
    assert not vouched.matches
    assert f"the one {parent}#{finished.seq} vouches for" in vouched.problem

    cli = cli_for(tmp_path)
    shown = cli("record", child)
    assert shown.returncode == 1, shown.stderr  # a record the log no longer gives is a finding
    assert f"vouched for by {parent}#{finished.seq}: DIFFERS" in shown.stdout


async def test_a_parents_record_holds_its_child_runs_and_vouches_for_their_records(
    tmp_path: Path,
) -> None:
    db = tmp_path / "c.db"
    async with Runtime(str(db)) as rt:
        parent = (await rt.run(planner, "Check order A-1")).run_id
        events = await rt.events(parent)
        [started] = [e for e in events if isinstance(e, ev.ChildRunStarted)]
        [finished] = [e for e in events if isinstance(e, ev.ChildRunFinished)]
        child = finished.child_run_id
        record = await rt.record(parent)
        child_record = await rt.record(child)
        child_events = await rt.events(child)
        [stored] = await rt.receipts(parent)

    [part] = record.delegations or []
    assert part.seqs == [started.seq, finished.seq]
    assert (part.child_run_id, part.agent_name, part.call_id) == (
        child,
        "checker",
        started.contract.call_id,
    )
    assert part.objective == started.contract.objective
    assert part.allowed_tools == list(started.contract.allowed_tools)
    assert part.budget["max_turns"] == started.contract.budget.max_turns
    assert (part.status, part.model_calls) == ("completed", child_record.costs.model_calls)
    assert part.input_tokens == child_record.costs.input_tokens > 0
    assert part.result_sha256 == canonical_hash(finished.result)
    assert part.record_hash == child_record.record_hash  # the parent's record vouches for it
    assert record.costs.model_calls == 2  # the parent's own; the child's are in its part
    assert stored.matches  # the stored record holds the part too
    assert child_record.delegations is None  # a run that started none has no such field
    assert "delegations" not in record_data(child_events)

    shown = cli_for(tmp_path)("record", parent)
    assert shown.returncode == 0, shown.stderr
    assert f"child {child} (checker) completed: 1 model call," in shown.stdout
    assert "cost: 2 model calls of its own, " in shown.stdout
    assert "; its child runs: 1 model call, " in shown.stdout


async def test_a_record_stored_before_it_held_child_runs_still_matches_its_log(
    tmp_path: Path,
) -> None:
    async with Runtime(str(tmp_path / "c.db")) as rt:
        parent = (await rt.run(planner, "Check order A-1")).run_id
        events = await rt.events(parent)
        data = record_data(events)
        del data["delegations"], data["record_hash"]  # the record as it was made before
        data["record_hash"], text = sealed(data, "record_hash")
        old, blob = make_artifact(
            await rt.state(parent),
            text,
            media_type="application/json",
            type="decision_record",
            source_events=[data["at_seq"]],
            schema_version=data["record_type"],
        )
        stored = artifacts_of(rt.store)
        assert stored is not None
        await stored.put_artifact(old, blob)
        found = {r.artifact_id: r for r in await rt.receipts(parent)}

    assert found[old.artifact_id].matches, found[old.artifact_id].problem
    assert len(found) == 2 and all(r.matches for r in found.values())


async def test_a_run_that_ended_is_handed_back_before_its_record_is_stored(
    tmp_path: Path,
) -> None:
    """The record of an ended run is stored in the background; `receipts` and `close` wait."""
    held = asyncio.Event()

    class SlowArtifacts(SqliteStore):
        async def put_artifact(self, artifact: Artifact, content: bytes) -> None:
            if artifact.type == "decision_record":
                await held.wait()
            await super().put_artifact(artifact, content)

    db = tmp_path / "c.db"
    writer = Agent(name="writer", model=ScriptedModel([reply("Paris.")], by_turn=True))
    async with Runtime(SlowArtifacts(db)) as rt:
        # handed back while its record is held (the limit only keeps a failure from hanging)
        done = await asyncio.wait_for(rt.run(writer, "Capital of France?"), timeout=60)
        assert done.status is RunStatus.COMPLETED
        receipts = asyncio.ensure_future(rt.receipts(done.run_id))
        await asyncio.sleep(0.05)
        assert not receipts.done()  # waits for the record being stored
        held.set()
        [stored] = await receipts
        assert stored.matches and stored.at_seq == (await rt.events(done.run_id))[-1].seq
        held.clear()
        again = await asyncio.wait_for(rt.run(writer, "Capital of Italy?"), timeout=60)
        asyncio.get_running_loop().call_later(0.2, held.set)
    # closing the runtime waited for the second run's record, held until after it began
    conn = sqlite3.connect(db)
    ids = conn.execute("SELECT run_id FROM artifacts WHERE type = 'decision_record'").fetchall()
    assert sorted(ids) == sorted([(done.run_id,), (again.run_id,)])


async def test_an_ended_runs_record_is_begun_only_once_its_lease_is_given_back(
    tmp_path: Path,
) -> None:
    """Reading and building the record of an ended run would hold the loop while its lease is
    given back and its result waits: it begins after."""
    order: list[str] = []

    class Watched(SqliteStore):
        async def read(self, run_id: Any, *, after_seq: int = 0) -> list[ev.Event]:
            order.append(f"read after {after_seq}")
            return await super().read(run_id, after_seq=after_seq)

        async def release(self, lease: Any, **kwargs: Any) -> Any:
            released = await super().release(lease, **kwargs)
            order.append("lease given back")
            return released

    writer = Agent(name="writer", model=ScriptedModel([reply("Paris.")], by_turn=True))
    async with Runtime(Watched(tmp_path / "c.db")) as rt:
        done = await rt.run(writer, "Capital of France?")
        given_back = order.index("lease given back")
        [stored] = await rt.receipts(done.run_id)
    assert stored.matches
    assert "read after 0" in order[given_back:]  # the record's read of the whole log
    assert "read after 0" not in order[:given_back]


async def test_a_long_runs_record_is_built_off_the_loop_and_matches_its_log(
    tmp_path: Path,
) -> None:
    """A log of OFF_LOOP events or more has its record built in a thread: the same record."""

    def echo(text: str) -> str:
        """Say it back."""
        return text

    turns = OFF_LOOP // 2 + 1
    steps = [call_tool("echo", {"text": f"turn {i}"}) for i in range(turns)]
    agent = Agent(
        name="echoer",
        model=ScriptedModel([*steps, reply("done")], by_turn=True),
        tools=[echo],
        budget=Budget(max_turns=turns + 1),
    )
    async with Runtime(str(tmp_path / "c.db")) as rt:
        done = await rt.run(agent, "Echo.")
        events = await rt.events(done.run_id)
        [stored] = await rt.receipts(done.run_id)
        _, content = await rt.artifact(stored.artifact_id)
    assert len(events) >= OFF_LOOP
    assert stored.matches and stored.at_seq == events[-1].seq
    assert content == canonical_json(record_data(events)).encode()
