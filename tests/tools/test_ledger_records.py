"""What the effect ledger records on each path, field by field: a write verified through its
reconcile, a write policy denies, and the ledger's own rules (what is compensable, what keeps a
run from ending, which calls count as the same action). Operators and the fold read these fields,
so each is pinned here rather than left to the tests of the happy path."""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from contextos import Agent, RunStatus, Runtime, ToolContext, tool
from contextos import events as ev
from contextos.errors import ToolOutcomeUnknown
from contextos.ledger import (
    Effect,
    EffectState,
    action_key,
    compensable,
    effect_id_for,
    idempotency_key,
    unsettled,
)
from contextos.policy import Decision, Policy, Rule
from contextos.records.interrupts import interrupt_id_for
from contextos.testing import ScriptedModel, call_tool, reply
from contextos.tools import Tool, ToolResult
from support.stores import Crash, CrashAfter


def poster(db: Path, *, keeps: bool) -> Tool:
    """A write whose provider can be asked afterwards whether it has the post (by its key);
    with `keeps=False` the provider answers but loses the post."""

    def find_post(key: str) -> ToolResult | None:
        conn = sqlite3.connect(db)
        try:
            row = conn.execute("SELECT text FROM posts WHERE key = ?", (key,)).fetchone()
        finally:
            conn.close()
        return None if row is None else ToolResult(output=row[0], receipts={"post_key": key})

    @tool(effect="write", reconcile=find_post, verify=True)
    def post(text: str, ctx: ToolContext) -> ToolResult:
        """Post a text."""
        if keeps:
            conn = sqlite3.connect(db, isolation_level=None)
            try:
                conn.execute("INSERT INTO posts VALUES (?, ?)", (ctx.idempotency_key, text))
            finally:
                conn.close()
        return ToolResult(output=f"posted {text}", receipts={"post_id": "p-1"})

    return post


def changes(events: list[ev.Event]) -> list[ev.EffectChanged]:
    return [e for e in events if isinstance(e, ev.EffectChanged)]


def completed(events: list[ev.Event]) -> ev.ToolCompleted:
    (done,) = [e for e in events if isinstance(e, ev.ToolCompleted)]
    return done


async def run_post(tmp_path: Path, *, schema: bool, keeps: bool) -> tuple[list[ev.Event], str]:
    db = tmp_path / "posts.db"
    if schema:
        with sqlite3.connect(db) as conn:
            conn.execute("CREATE TABLE posts (key TEXT PRIMARY KEY, text TEXT)")
    model = ScriptedModel([call_tool("post", {"text": "hello"}), reply("ok")])
    agent = Agent(name="poster", model=model, tools=[poster(db, keeps=keeps)])
    async with Runtime(str(tmp_path / "runs.db")) as rt:
        result = await rt.run(agent, "post it")
        assert result.status is RunStatus.COMPLETED
        events = await rt.events(result.run_id)
    (proposed,) = [e for e in events if isinstance(e, ev.EffectProposed)]
    return events, proposed.idempotency_key


async def test_a_verified_write_is_confirmed_through_its_reconcile(tmp_path: Path) -> None:
    events, key = await run_post(tmp_path, schema=True, keeps=True)
    committed, verified = changes(events)[-2:]
    assert committed.state is EffectState.COMMITTED and committed.note == ""
    assert committed.receipts == {"post_id": "p-1"} and committed.output == "posted hello"
    assert verified.state is EffectState.VERIFIED
    assert verified.receipts == {"post_key": key}
    assert verified.note == "confirmed through reconcile"
    done = completed(events)
    assert done.output == "posted hello" and not done.is_error
    assert done.effect_id == verified.effect_id


@pytest.mark.parametrize(
    ("schema", "warning"),
    [
        (True, "verification found no record of the call"),
        (False, "verification could not run: OperationalError: no such table: posts"),
    ],
    ids=["no record", "lookup failed"],
)
async def test_a_write_that_cannot_be_verified_stays_committed_with_a_warning(
    tmp_path: Path, schema: bool, warning: str
) -> None:
    events, _ = await run_post(tmp_path, schema=schema, keeps=False)
    assert [c.state for c in changes(events)][-1] is EffectState.COMMITTED
    done = completed(events)
    assert done.output == f"posted hello\n[warning: {warning}]"
    assert not done.is_error


async def test_a_write_settled_before_a_crash_is_reported_once_resumed(tmp_path: Path) -> None:
    """The process dies once the write is recorded as committed, before the model was told
    (a verified write records its commit first, then looks it up): on resume the model is told
    from the ledger, and the call is neither sent nor looked up again."""
    sent: list[str] = []
    looked_up: list[str] = []

    def find(key: str) -> ToolResult | None:
        looked_up.append(key)
        return ToolResult(output="", receipts={"post_key": key})

    @tool(effect="write", reconcile=find, verify=True)
    def post(text: str) -> ToolResult:
        """Post a text; the service answers with an empty body."""
        sent.append(text)
        return ToolResult(output="", receipts={"post_id": "p-1"})

    def committed(e: ev.Event) -> bool:
        return isinstance(e, ev.EffectChanged) and e.state is EffectState.COMMITTED

    db = str(tmp_path / "runs.db")
    model = ScriptedModel([call_tool("post", {"text": "hello"}), reply("ok")], by_turn=True)
    agent = Agent(name="poster", model=model, tools=[post])
    crashing = Runtime(CrashAfter(db, committed))
    try:
        with pytest.raises(Crash):
            await crashing.run(agent, "post it")
    finally:
        await crashing.close()
    async with Runtime(db) as rt:
        (summary,) = await rt.runs()
        result = await rt.resume(summary.run_id, agent)
        events = await rt.events(summary.run_id)
    assert result.status is RunStatus.COMPLETED
    assert sent == ["hello"] and looked_up == []
    assert [c.state for c in changes(events)][-1] is EffectState.COMMITTED
    done = completed(events)
    assert (done.output, done.is_error, done.error_code) == ("post done", False, None)
    assert done.effect_id == changes(events)[-1].effect_id


async def test_a_writes_output_is_cut_at_the_contracts_limit(tmp_path: Path) -> None:
    @tool(effect="write", max_output_chars=100)
    def post(text: str) -> str:
        """Post a text; the service echoes a long page."""
        return "x" * 500

    model = ScriptedModel([call_tool("post", {"text": "hello"}), reply("ok")])
    async with Runtime(str(tmp_path / "runs.db")) as rt:
        result = await rt.run(Agent(name="poster", model=model, tools=[post]), "post it")
        events = await rt.events(result.run_id)
    cut = "x" * 100 + "\n[output truncated: showing 100 of 500 characters]"
    committed = changes(events)[-1]
    assert committed.state is EffectState.COMMITTED and committed.output == cut
    done = completed(events)
    assert done.truncated and done.output == cut


async def test_a_record_found_by_reconcile_is_cut_at_the_contracts_limit(tmp_path: Path) -> None:
    def find(key: str) -> ToolResult:
        return ToolResult(output="x" * 500, receipts={"post_key": key})

    @tool(effect="write", reconcile=find, max_output_chars=100)
    def post(text: str) -> str:
        """Post a text; the connection drops before the answer."""
        raise ToolOutcomeUnknown("the connection dropped after the request was sent")

    model = ScriptedModel([call_tool("post", {"text": "hello"}), reply("ok")])
    async with Runtime(str(tmp_path / "runs.db")) as rt:
        result = await rt.run(Agent(name="poster", model=model, tools=[post]), "post it")
        events = await rt.events(result.run_id)
    assert result.status is RunStatus.COMPLETED
    assert [c.state for c in changes(events)][-2:] == [
        EffectState.RECONCILING,
        EffectState.COMMITTED,
    ]
    done = completed(events)
    assert done.truncated and not done.is_error
    assert done.output == "x" * 100 + "\n[output truncated: showing 100 of 500 characters]"


async def test_a_denied_write_records_the_refusal_on_its_effect(tmp_path: Path) -> None:
    sent: list[int] = []

    @tool(effect="irreversible")
    def pay(amount: int) -> str:
        """Pay."""
        sent.append(amount)
        return "paid"

    policy = Policy(
        rules=(
            Rule(id="frozen", decision=Decision.DENY, tools=("pay",), reason="payments frozen"),
            Rule(id="audit", decision=Decision.DENY, tools=("pay",), reason="audit under way"),
        )
    )
    model = ScriptedModel([call_tool("pay", {"amount": 5}), reply("ok")])
    async with Runtime(str(tmp_path / "runs.db"), policy=policy) as rt:
        result = await rt.run(Agent(name="payer", model=model, tools=[pay]), "pay")
        events = await rt.events(result.run_id)
    assert sent == []
    denied = changes(events)[-1]
    done = completed(events)
    assert denied.state is EffectState.DENIED
    assert denied.note == "payments frozen; audit under way"
    assert (denied.output, denied.error_code) == (done.output, done.error_code)
    assert done.error_code == "policy_denied" and done.is_error
    assert done.output == (
        "Policy does not allow this call to pay: payments frozen; audit under way."
    )
    assert done.effect_id == denied.effect_id


# -- the ledger's rules --------------------------------------------------------------------


def effect(state: EffectState, **fields: Any) -> Effect:
    base: dict[str, Any] = {
        "effect_id": "eff_1",
        "call_id": "c1",
        "tool": "book",
        "kind": "reversible_write",
        "idempotency_key": "run/c1",
        "contract_hash": "h",
        "compensation": "cancel_booking",
    }
    return Effect(**{**base, **fields}, state=state)


@pytest.mark.parametrize(
    ("state", "fields", "expected"),
    [
        (EffectState.COMMITTED, {}, True),
        (EffectState.VERIFIED, {}, True),
        (EffectState.FAILED, {}, False),
        (EffectState.DISPATCHED, {}, False),
        (EffectState.COMMITTED, {"compensation": None}, False),
        (EffectState.COMMITTED, {"kind": "irreversible"}, False),
        (EffectState.COMMITTED, {"kind": "write"}, False),
    ],
)
def test_only_a_reversible_write_that_took_effect_and_names_its_undo_is_compensable(
    state: EffectState, fields: dict[str, Any], expected: bool
) -> None:
    assert compensable(effect(state, **fields)) is expected


@pytest.mark.parametrize(
    ("state", "fields", "expected"),
    [
        # not yet sent: it must be sent, refused or abandoned first
        (EffectState.PROPOSED, {}, True),
        (EffectState.VALIDATED, {}, True),
        (EffectState.AUTHORISED, {}, True),
        # may have acted without its outcome known
        (EffectState.DISPATCHED, {}, True),
        (EffectState.OUTCOME_UNKNOWN, {}, True),
        (EffectState.RECONCILING, {}, True),
        (EffectState.COMPENSATING, {}, True),
        # a reversible write that took effect is undone before a failed run ends
        (EffectState.COMMITTED, {}, True),
        (EffectState.COMMITTED, {"kind": "irreversible"}, False),
        (EffectState.FAILED, {}, False),
        (EffectState.DENIED, {}, False),
        (EffectState.COMPENSATED, {}, False),
        # a compensation call is settled once it reaches a final state, whatever it is
        (EffectState.COMMITTED, {"compensates": "eff_0"}, False),
        (EffectState.FAILED, {"compensates": "eff_0"}, False),
        (EffectState.DISPATCHED, {"compensates": "eff_0"}, True),
        (EffectState.AUTHORISED, {"compensates": "eff_0"}, True),
    ],
)
def test_what_keeps_a_run_from_ending(
    state: EffectState, fields: dict[str, Any], expected: bool
) -> None:
    assert unsettled(effect(state, **fields)) is expected


def test_an_effect_id_has_the_documented_form_and_is_one_per_run_and_call() -> None:
    """`eff_` and 24 hex digits (as in docs/authority.md), derived from the idempotency key:
    the same on every resume, another for another run or call."""
    eid = effect_id_for(idempotency_key("run_1", "call_1_0"))
    assert re.fullmatch(r"eff_[0-9a-f]{24}", eid)
    assert effect_id_for(idempotency_key("run_1", "call_1_0")) == eid
    assert effect_id_for(idempotency_key("run_2", "call_1_0")) != eid
    assert effect_id_for(idempotency_key("run_1", "call_1_1")) != eid


def test_the_same_action_is_the_same_tool_and_arguments_whatever_their_order_and_spacing() -> None:
    same = action_key("pay", '{"to": "bob", "amount": 5}')
    assert action_key("pay", '{ "amount":5,"to":"bob" }') == same
    assert action_key("pay", '{"to": "bob", "amount": 6}') != same
    assert action_key("refund", '{"to": "bob", "amount": 5}') != same
    # arguments that are no JSON are compared as written
    assert action_key("pay", "to bob") != action_key("pay", "to carol")
    assert action_key("pay", "to bob") == action_key("pay", "to bob")


async def test_an_approved_read_runs_once_policy_allows_it_again(tmp_path: Path) -> None:
    looked_up: list[str] = []

    @tool
    def lookup(customer: str) -> str:
        """Read a customer's record."""
        looked_up.append(customer)
        return f"record of {customer}"

    policy = Policy(
        rules=(
            Rule(
                id="personal-data",
                decision=Decision.REQUIRE_APPROVAL,
                tools=("lookup",),
                reason="personal data",
                approver_role="privacy",
            ),
        ),
        roles={"privacy": ("alice",)},
    )
    model = ScriptedModel([call_tool("lookup", {"customer": "cus_1"}), reply("ok")], by_turn=True)
    agent = Agent(name="reader", model=model, tools=[lookup])
    async with Runtime(str(tmp_path / "runs.db"), policy=policy) as rt:
        waiting = await rt.run(agent, "look")
        assert waiting.status is RunStatus.INPUT_REQUIRED and looked_up == []
        (pending,) = await rt.inbox()
        (raised,) = [
            e for e in await rt.events(waiting.run_id) if isinstance(e, ev.InterruptRaised)
        ]
        assert pending.id == interrupt_id_for(waiting.run_id, raised.seq)
        approval = await rt.approve(pending.id, approver="alice")
        result = await rt.resume(waiting.run_id, agent)
        events = await rt.events(waiting.run_id)
    assert result.status is RunStatus.COMPLETED and looked_up == ["cus_1"]
    first, again = [e for e in events if isinstance(e, ev.PolicyDecided)]
    assert first.decision == "require_approval" and first.effect_id is None
    assert (first.call_id, first.tool) == (again.call_id, again.tool) == ("call_1_0", "lookup")
    assert again.decision == "allow" and again.approval_id == approval.id
    assert not any(isinstance(e, ev.EffectProposed | ev.EffectChanged) for e in events)
    done = completed(events)
    assert done.output == "record of cus_1" and done.effect_id is None
