"""The canonical records: emitted and accepted as JSON, validated by the JSON Schemas kept in
the repository (generated from the models: a drift fails here), with golden fixtures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError
from support_agents import POLICY, support

from contextos import Principal, RunStatus, Runtime
from contextos import events as ev
from contextos.errors import RecordInvalid
from contextos.evidence import (
    authority_of,
    build_record,
    compiled_contexts,
    run_context,
    schemas,
    tool_envelopes,
)
from contextos.evidence import canonical as c

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "canonical"
BOB = Principal.user("bob", tenant="acme", scopes=("payments:*",))


@pytest.fixture(autouse=True)
def ledger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "ledger.jsonl"
    monkeypatch.setenv("EVIDENCE_LEDGER", str(path))
    return path


def validator(name: str) -> Draft202012Validator:
    schema = schemas.load(name)
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema)


@pytest.mark.parametrize("name", sorted(c.RECORDS))
def test_the_kept_schema_is_what_the_model_generates(name: str) -> None:
    kept = schemas.path(name).read_text()
    assert kept == schemas.render(schemas.generate()[name]), (
        f"{schemas.path(name)} differs from the {name} model: if the change is meant, run "
        "`python -m contextos.evidence.schemas` and commit the schema with it"
    )


@pytest.mark.parametrize("name", sorted(c.RECORDS))
def test_golden_fixtures_validate_and_round_trip(name: str) -> None:
    text = (FIXTURES / f"{name}.json").read_text()
    validator(name).validate(json.loads(text))
    record = c.RECORDS[name].from_json(text)
    assert json.loads(record.to_json()) == json.loads(text)
    if isinstance(record, c.DecisionRecord):
        record.verify()


@pytest.mark.parametrize("name", sorted(c.RECORDS))
def test_a_record_with_an_unknown_field_is_refused_by_schema_and_model(name: str) -> None:
    data = json.loads((FIXTURES / f"{name}.json").read_text())
    data["surprise"] = 1
    with pytest.raises(ValidationError):
        validator(name).validate(data)
    with pytest.raises(RecordInvalid, match=f"not a valid {name}: surprise"):
        c.RECORDS[name].from_json(json.dumps(data))


@pytest.mark.parametrize("name", sorted(c.RECORDS))
def test_a_record_of_an_unknown_version_is_refused_as_such(name: str) -> None:
    data = json.loads((FIXTURES / f"{name}.json").read_text())
    versioned = data["call"] if name == "ToolEnvelope" else data
    field = "envelope_version" if name == "ToolEnvelope" else "record_type"
    versioned[field] = versioned[field].replace(".v1", ".v2")
    with pytest.raises(RecordInvalid, match=r"version '.*\.v2' is not one this ContextOS reads"):
        c.RECORDS[name].from_json(json.dumps(data))


async def test_a_runs_records_validate_against_the_kept_schemas(tmp_path: Path) -> None:
    async with Runtime(str(tmp_path / "c.db"), policy=POLICY) as rt:
        agent = support()
        waiting = await rt.run(agent, "Refund order A-1", principal=BOB)
        [asked] = await rt.inbox()
        await rt.approve(asked.id, approver="alice")
        done = await rt.resume(waiting.run_id, agent)
        assert done.status is RunStatus.COMPLETED
        events = await rt.events(done.run_id)

    emitted: list[tuple[str, c.Record]] = [
        ("RunContext", run_context(events)),
        ("DecisionRecord", build_record(events)),
        *(("CompiledContext", x) for x in compiled_contexts(events)),
        *(("ToolEnvelope", x) for x in tool_envelopes(events)),
    ]
    for name, record in emitted:
        validator(name).validate(json.loads(record.to_json()))

    context = run_context(events)
    assert context.tenant_id == "acme" and context.user.user_id == "bob"
    assert context.user.delegation.scopes == ["payments:*"]
    [lookup, refund] = tool_envelopes(events)
    assert (lookup.call.approval_mode_requested, lookup.call.args) == ("read_only", None)
    assert refund.call.approval_mode_effective == "delegated"  # a person approved it
    assert refund.result is not None and refund.result.receipts == {"refund_id": "rf_A-1"}
    calls = [e for e in events if isinstance(e, ev.ModelResponded)]
    contexts = compiled_contexts(events)
    assert [x.context_ledger.hash for x in contexts] == [e.context_hash for e in calls]
    assert {b.bucket for b in contexts[0].compiled_prompt.context_blocks} >= {"business", "tool"}


async def test_an_accepted_run_context_is_the_authority_of_a_new_run(tmp_path: Path) -> None:
    text = (FIXTURES / "RunContext.json").read_text()
    accepted = c.RunContext.from_json(text)
    async with Runtime(str(tmp_path / "c.db"), policy=POLICY) as rt:
        run_id = await rt.start(support(), "Look A-1 up", context=authority_of(accepted))
        events = await rt.events(run_id)
    again = run_context(events)
    assert (again.tenant_id, again.user.user_id) == (accepted.tenant_id, accepted.user.user_id)
    assert again.user.delegation.scopes == accepted.user.delegation.scopes
    with pytest.raises(RecordInvalid, match="tenant_id: Field required"):
        c.RunContext.from_json(
            json.dumps({k: v for k, v in json.loads(text).items() if k != "tenant_id"})
        )
    with pytest.raises(RecordInvalid, match="not a valid RunContext"):
        c.RunContext.from_json("{not json")
