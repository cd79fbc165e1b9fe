"""A run's final output is a content-addressed artifact with its lineage, beside the log."""

from __future__ import annotations

import hashlib
import json
import sqlite3
from dataclasses import replace
from pathlib import Path

import pytest
from evidence_cli import cli_for
from pydantic import BaseModel
from support_agents import POLICY, lookup, support

from contextos import Agent, Principal, Runtime, codec, tool
from contextos import events as ev
from contextos.errors import ArtifactCorrupt, ArtifactNotFound
from contextos.store.artifacts import artifacts_of, record_artifact
from contextos.testing import ScriptedModel, call_tool, reply

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def ledger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "ledger.jsonl"
    monkeypatch.setenv("EVIDENCE_LEDGER", str(path))
    return path


async def test_the_final_output_is_an_artifact_with_its_lineage(backend_url: str) -> None:
    async with Runtime(backend_url) as rt:
        done = await rt.run(support(), "Refund order A-1")
        events = await rt.events(done.run_id)
        [found] = await rt.artifacts(done.run_id)
        stored, content = await rt.artifact(found.artifact_id)

    assert done.ok and content == b"Refunded 250 EUR on A-1."
    # the store's row and the log's event say the same (apart from when each was written)
    assert replace(stored, created_at=None) == replace(found, created_at=None)
    assert stored.type == "run_output"
    assert stored.content_hash == hashlib.sha256(content).hexdigest()
    assert stored.media_type.startswith("text/plain") and stored.schema_version == "text"
    answer = next(e for e in reversed(events) if isinstance(e, ev.ModelResponded))
    results = [e.seq for e in events if isinstance(e, ev.ToolCompleted)]
    assert stored.source_events == tuple(sorted([answer.seq, *results]))
    assert stored.run_id == done.run_id and stored.classification == "internal"
    # The log names the artifact and its hash; the content stays out of the event row.
    recorded = next(e for e in events if isinstance(e, ev.ArtifactRecorded))
    assert recorded.artifact_id == found.artifact_id and recorded.seq == events[-1].seq - 1
    assert b"Refunded" not in codec.encode(recorded)


async def test_a_structured_output_is_json_with_its_schema_version(tmp_path: Path) -> None:
    class Refund(BaseModel):
        order_id: str
        amount: float

    agent = Agent(
        name="structured",
        model=ScriptedModel([reply('{"order_id": "A-1", "amount": 250}')]),
        output_type=Refund,
    )
    async with Runtime(str(tmp_path / "c.db")) as rt:
        done = await rt.run(agent, "Refund A-1")
        [found] = await rt.artifacts(done.run_id)
        _, content = await rt.artifact(found.artifact_id)
    assert json.loads(content) == {"order_id": "A-1", "amount": 250.0}
    assert found.media_type == "application/json"
    assert found.schema_version.startswith("Refund@")


async def test_the_output_is_as_sensitive_as_the_most_sensitive_tool_it_saw(
    tmp_path: Path,
) -> None:
    @tool(data_classification="internal", output_classification="restricted")
    def salary(name: str) -> str:
        """A person's salary."""
        return f"{name}: 90000"

    agent = Agent(
        name="hr",
        model=ScriptedModel([call_tool("salary", {"name": "Jo"}), reply("Jo earns 90000.")]),
        tools=[salary, lookup],
    )
    async with Runtime(str(tmp_path / "c.db")) as rt:
        done = await rt.run(agent, "What does Jo earn?")
        [found] = await rt.artifacts(done.run_id)
    assert found.classification == "restricted"


async def test_a_governed_runs_artifact_names_its_policy_snapshot(tmp_path: Path) -> None:
    async with Runtime(str(tmp_path / "c.db"), policy=POLICY) as rt:
        done = await rt.run(
            support(), "Look A-1 up", principal=Principal.user("bob", scopes=("orders:*",))
        )
        state = await rt.state(done.run_id)
        [found] = await rt.artifacts(done.run_id)
    # bob may not refund: the refund is denied, the run still answers
    assert state.context is not None and found.policy_snapshot == state.context.snapshot_hash
    assert found.policy_snapshot == POLICY.snapshot_hash


async def test_blobs_are_stored_once_per_content_and_link_their_inputs(backend_url: str) -> None:
    async with Runtime(backend_url) as rt:
        first = await rt.run(support(), "Refund order A-1")
        second = await rt.run(support(), "Refund order A-1 again")
        [a] = await rt.artifacts(first.run_id)
        [b] = await rt.artifacts(second.run_id)
        assert a.artifact_id != b.artifact_id and a.content_hash == b.content_hash
        # a parent receiving a child's result records it with the child's output as input
        parent = await rt.state(second.run_id)
        fields = await record_artifact(
            rt.store,
            parent,
            {"child": first.run_id, "result": "refunded"},
            type="child_result",
            source_events=[parent.seq],
            input_artifacts=[a.artifact_id],
        )
        assert fields is not None
        store = artifacts_of(rt.store)
        assert store is not None
        linked = await store.get_artifact(fields["artifact_id"])
        again = await record_artifact(
            rt.store,
            parent,
            {"child": first.run_id, "result": "refunded"},
            type="child_result",
            source_events=[parent.seq],
            input_artifacts=[a.artifact_id],
        )
    assert linked.input_artifacts == (a.artifact_id,) and linked.type == "child_result"
    assert again == fields  # the same artifact: same id, nothing written twice


async def test_a_changed_blob_is_refused_and_an_unknown_id_is_named(tmp_path: Path) -> None:
    db = tmp_path / "c.db"
    async with Runtime(str(db)) as rt:
        done = await rt.run(support(), "Refund order A-1")
        [found] = await rt.artifacts(done.run_id)
        with pytest.raises(ArtifactNotFound, match="art_nope"):
            await rt.artifact("art_nope")
    conn = sqlite3.connect(db)
    conn.execute("DROP TRIGGER blobs_are_append_only_u")  # simulate tampering on disk
    conn.execute("UPDATE blobs SET content = ?", (b"Refunded 9999 EUR",))
    conn.commit()
    conn.close()
    async with Runtime(str(db)) as rt:
        with pytest.raises(ArtifactCorrupt, match="does not match its hash"):
            await rt.artifact(found.artifact_id)


async def test_a_blob_is_stored_compressed_and_one_stored_whole_still_reads(
    tmp_path: Path,
) -> None:
    db = tmp_path / "c.db"
    report = {"findings": [{"order": f"A-{i}", "verdict": "refunded in full"} for i in range(40)]}
    async with Runtime(str(db)) as rt:
        done = await rt.run(support(), "Refund order A-1")
        fields = await record_artifact(rt.store, await rt.state(done.run_id), report, type="report")
        assert fields is not None
        _, content = await rt.artifact(fields["artifact_id"])
    assert json.loads(content) == report
    conn = sqlite3.connect(db)
    digest = fields["content_hash"]
    size, stored = conn.execute(
        "SELECT size, content FROM blobs WHERE sha256 = ?", (digest,)
    ).fetchone()
    assert size == len(content) and len(stored) < size / 4  # compressed, the size of the bytes
    conn.execute("DROP TRIGGER blobs_are_append_only_u")
    conn.execute("UPDATE blobs SET content = ? WHERE sha256 = ?", (content, digest))  # as before
    conn.commit()
    async with Runtime(str(db)) as rt:
        assert (await rt.artifact(fields["artifact_id"]))[1] == content
    conn.execute("UPDATE blobs SET content = ? WHERE sha256 = ?", (stored[:-3], digest))
    conn.commit()
    conn.close()
    async with Runtime(str(db)) as rt:  # a cut compressed row is refused, never half-read
        with pytest.raises(ArtifactCorrupt, match="does not match its hash"):
            await rt.artifact(fields["artifact_id"])


def test_artifacts_and_artifact_commands(tmp_path: Path) -> None:
    cli = cli_for(tmp_path)

    ran = cli("run", "tests/evidence/support_agents.py:agent", "Refund A-1", "--json")
    assert ran.returncode == 0, ran.stderr
    run_id = json.loads(ran.stdout)["run_id"]
    listed = json.loads(cli("artifacts", run_id, "--json").stdout)
    assert [a["type"] for a in listed] == ["run_output"]
    artifact_id = listed[0]["artifact_id"]
    assert artifact_id in cli("artifacts", run_id).stdout
    assert cli("artifact", artifact_id, "--content").stdout == "Refunded 250 EUR on A-1."
    shown = cli("artifact", artifact_id)
    assert "run_output" in shown.stdout and listed[0]["content_hash"] in shown.stdout
    missing = cli("artifact", "art_nope")
    assert missing.returncode == 1 and "no artifact with id 'art_nope'" in missing.stderr
    assert "Traceback" not in missing.stderr
