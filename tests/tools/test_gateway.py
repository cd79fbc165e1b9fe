"""Contracts, the manifest and the gateway path: validation, policy, timeouts, truncation."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from pathlib import Path

import pytest

from contextos import Agent, Budget, FailureReason, Principal, RunStatus, Runtime
from contextos import events as ev
from contextos.ledger import EffectState
from contextos.policy import Decision, PolicyDecision, ProposedCall
from contextos.policy.containment import Containment
from contextos.policy.identity import RunContext
from contextos.testing import ScriptedModel, call_tool, reply
from contextos.tools import BaseTool, EffectKind, Gateway, Risk, ToolContext, as_tool, tool
from support.blocks import block_body
from support.stores import Crash, CrashAfter

calls: list[tuple[str, object]] = []


def add(a: int, b: int) -> int:
    """Add two integers."""
    calls.append(("add", (a, b)))
    return a + b


@pytest.fixture(autouse=True)
def _reset() -> None:
    calls.clear()


def types(events: list[ev.Event]) -> list[str]:
    return [e.type for e in events]


# -- contracts -------------------------------------------------------------------------------


def test_a_plain_function_is_a_read_only_tool() -> None:
    t = as_tool(add)
    assert (t.name, t.effect, t.risk, t.has_effect) == ("add", EffectKind.READ, "low", False)
    assert t.parameters["required"] == ["a", "b"]
    assert t.description == "Add two integers."
    assert t.output_schema == {"type": "integer"}


def test_class_form_declares_the_same_contract() -> None:
    class Transfer(BaseTool):
        """Move money between accounts."""

        effect = EffectKind.IRREVERSIBLE
        risk = "high"
        idempotency_arg = "request_key"
        scopes = ("payments:write",)

        def run(self, source: str, target: str, cents: int, request_key: str) -> str:
            return f"{cents} from {source} to {target} ({request_key})"

        def reconcile(self, idempotency_key: str) -> None:
            return None

    t = as_tool(Transfer)
    assert t.name == "transfer" and t.description == "Move money between accounts."
    assert t.effect is EffectKind.IRREVERSIBLE and t.scopes == ("payments:write",)
    assert t.reconcile is not None
    # the key argument is filled by the runtime, never shown to (or taken from) the model
    assert set(t.parameters["properties"]) == {"source", "target", "cents"}
    assert t.contract()["reconcile"] is True


def test_manifest_hash_covers_every_contract_field() -> None:
    base = as_tool(add)
    gw = Gateway([base])
    assert Gateway([base]).manifest_hash == gw.manifest_hash
    for change in (
        {"effect": EffectKind.WRITE},
        {"timeout_s": 1.0},
        {"idempotent": True},
        {"description": "Adds."},
        {"version": "2"},
    ):
        changed = dataclasses.replace(base, **change)  # type: ignore[arg-type]
        assert Gateway([changed]).manifest_hash != gw.manifest_hash, change


def test_compensation_must_be_among_the_tools() -> None:
    @tool(effect="reversible_write", compensation="undo")
    def do(x: int) -> int:
        """Do."""
        return x

    with pytest.raises(ValueError, match="compensation 'undo'"):
        Gateway([do])


# -- the model gets correctable errors -------------------------------------------------------


async def test_invalid_arguments_are_corrected_on_the_next_turn(runtime: Runtime) -> None:
    model = ScriptedModel(
        [
            call_tool("add", {"a": "two", "b": 3}),
            call_tool("add", '{"a": 2, '),
            call_tool("add", {"a": 2, "b": 3}),
            reply("5"),
        ]
    )
    result = await runtime.run(Agent(name="calc", model=model, tools=[add]), "2+3")
    assert result.status is RunStatus.COMPLETED
    assert calls == [("add", (2, 3))]  # the tool never saw the bad calls
    state = await runtime.state(result.run_id)
    assert state.tool_errors == 2 and state.consecutive_tool_errors == 0
    first, second = (
        e
        for e in await runtime.events(result.run_id)
        if isinstance(e, ev.ToolCompleted) and e.is_error
    )
    assert first.error_code == "invalid_arguments" and "a: Input should be a valid integer" in (
        first.output
    )
    assert second.error_code == "invalid_arguments" and "not valid JSON" in second.output
    # what the model saw on the turn after each error is that error
    assert block_body(model.requests[1].messages[-1].content) == first.output
    assert block_body(model.requests[2].messages[-1].content) == second.output


async def test_unknown_tool_is_an_error_the_model_can_read(runtime: Runtime) -> None:
    model = ScriptedModel([call_tool("subtract", {"a": 1}), reply("sorry")])
    result = await runtime.run(Agent(name="calc", model=model, tools=[add]), "1-1")
    assert result.status is RunStatus.COMPLETED
    (done,) = [e for e in await runtime.events(result.run_id) if isinstance(e, ev.ToolCompleted)]
    assert done.is_error and done.error_code == "unknown_tool"
    assert "Available tools: add" in done.output


async def test_sync_tool_timeout(runtime: Runtime) -> None:
    release = threading.Event()

    @tool(timeout_s=0.2)
    def slow_lookup(key: str) -> str:
        """A lookup that hangs."""
        release.wait(10)
        return "late"

    model = ScriptedModel([call_tool("slow_lookup", {"key": "k"}), reply("gave up")])
    try:
        result = await runtime.run(Agent(name="s", model=model, tools=[slow_lookup]), "go")
    finally:
        release.set()
    (done,) = [e for e in await runtime.events(result.run_id) if isinstance(e, ev.ToolCompleted)]
    assert done.is_error and done.error_code == "tool_timeout"
    assert result.status is RunStatus.COMPLETED


async def test_async_tool_timeout_cancels_the_tool(runtime: Runtime) -> None:
    cancelled = asyncio.Event()

    @tool(timeout_s=0.2)
    async def slow_search(query: str) -> str:
        """A search that hangs."""
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return "late"

    model = ScriptedModel([call_tool("slow_search", {"query": "q"}), reply("gave up")])
    result = await runtime.run(Agent(name="s", model=model, tools=[slow_search]), "go")
    (done,) = [e for e in await runtime.events(result.run_id) if isinstance(e, ev.ToolCompleted)]
    assert done.is_error and done.error_code == "tool_timeout"
    assert cancelled.is_set()


async def test_write_tool_timeout_is_an_unknown_outcome_not_a_failure(runtime: Runtime) -> None:
    @tool(effect="write", timeout_s=0.2)
    async def post_message(text: str) -> str:
        """Post a message (hangs after sending)."""
        await asyncio.sleep(30)
        return "posted"

    model = ScriptedModel([call_tool("post_message", {"text": "hi"}), reply("?")])
    result = await runtime.run(Agent(name="s", model=model, tools=[post_message]), "go")
    assert result.status is RunStatus.INPUT_REQUIRED  # no reconcile, not idempotent: ask
    state = await runtime.state(result.run_id)
    (effect,) = state.effects.values()
    assert effect.state == "outcome_unknown" and effect.attempts == 1
    events = await runtime.events(result.run_id)
    unknown = next(
        e for e in events if isinstance(e, ev.EffectChanged) and e.state == "outcome_unknown"
    )
    assert unknown.error_code == "outcome_unknown"
    assert (
        unknown.note
        == "post_message did not finish within its time limit (0.2s); it may have acted"
    )


async def test_a_read_whose_own_client_timed_out_is_a_timeout(runtime: Runtime) -> None:
    @tool(timeout_s=30)
    def lookup(q: str) -> str:
        """Look something up; the HTTP client gives up waiting."""
        raise TimeoutError("read timed out")

    model = ScriptedModel([call_tool("lookup", {"q": "x"}), reply("?")])
    result = await runtime.run(Agent(name="s", model=model, tools=[lookup]), "go")
    assert result.status is RunStatus.COMPLETED
    (done,) = [e for e in await runtime.events(result.run_id) if isinstance(e, ev.ToolCompleted)]
    assert (done.is_error, done.error_code) == (True, "tool_timeout")
    assert done.output == "lookup did not finish within its time limit (30s)."


async def test_a_write_whose_own_client_timed_out_has_an_unknown_outcome(
    runtime: Runtime,
) -> None:
    @tool(effect="write", timeout_s=30)
    def post_message(text: str) -> str:
        """Post a message; the HTTP client gives up waiting for the answer."""
        raise TimeoutError("read timed out")

    model = ScriptedModel([call_tool("post_message", {"text": "hi"}), reply("?")])
    result = await runtime.run(Agent(name="s", model=model, tools=[post_message]), "go")
    assert result.status is RunStatus.INPUT_REQUIRED
    events = await runtime.events(result.run_id)
    unknown = next(
        e for e in events if isinstance(e, ev.EffectChanged) and e.state == "outcome_unknown"
    )
    assert unknown.error_code == "outcome_unknown"
    assert (
        unknown.note == "post_message did not finish within its time limit (30s); it may have acted"
    )


async def test_huge_output_is_truncated_and_marked_untrusted(runtime: Runtime) -> None:
    def dump() -> str:
        """Return a lot."""
        return "x" * 50_000

    model = ScriptedModel([call_tool("dump", {}), reply("ok")])
    result = await runtime.run(Agent(name="d", model=model, tools=[dump]), "go")
    (done,) = [e for e in await runtime.events(result.run_id) if isinstance(e, ev.ToolCompleted)]
    assert done.truncated and done.untrusted
    assert done.output.endswith("[output truncated: showing 16000 of 50000 characters]")
    assert len(done.output) < 16_100


# -- policy ----------------------------------------------------------------------------------


class Rules:
    def __init__(self, decision: PolicyDecision | Exception) -> None:
        self.decision = decision
        self.seen: list[ProposedCall] = []

    async def evaluate(self, call: ProposedCall) -> PolicyDecision:
        self.seen.append(call)
        if isinstance(self.decision, Exception):
            raise self.decision
        return self.decision


@tool(effect="irreversible", risk="high", scopes=("payments:write",))
def pay(amount: int) -> str:
    """Pay."""
    calls.append(("pay", amount))
    return "paid"


async def run_with_policy(
    tmp_path: Path,
    decision: PolicyDecision | Exception,
    name: str = "pay",
    args: dict[str, object] | None = None,
) -> tuple[list[ev.Event], Rules, ScriptedModel]:
    rules = Rules(decision)
    model = ScriptedModel([call_tool(name, args or {"amount": 5}), reply("ok")])
    async with Runtime(str(tmp_path / "p.db"), policy=rules) as rt:
        result = await rt.run(Agent(name="p", model=model, tools=[pay, add]), "go")
        return await rt.events(result.run_id), rules, model


async def test_policy_decision_is_recorded_before_dispatch(tmp_path: Path) -> None:
    events, rules, _ = await run_with_policy(
        tmp_path, PolicyDecision.allow(rule_ids=("r1",), snapshot_hash="abc")
    )
    (proposal,) = rules.seen
    assert (proposal.tool, proposal.effect, proposal.risk, proposal.scopes) == (
        "pay",
        "irreversible",
        "high",
        ("payments:write",),
    )
    assert proposal.arguments == {"amount": 5}
    decided = next(e for e in events if isinstance(e, ev.PolicyDecided))
    assert (decided.decision, decided.rule_ids, decided.snapshot_hash) == ("allow", ("r1",), "abc")
    dispatched = next(
        e for e in events if isinstance(e, ev.EffectChanged) and e.state == "dispatched"
    )
    assert decided.seq < dispatched.seq and calls == [("pay", 5)]


async def test_read_tools_are_decided_too(tmp_path: Path) -> None:
    events, rules, _ = await run_with_policy(
        tmp_path, PolicyDecision.allow(), name="add", args={"a": 1, "b": 2}
    )
    assert [e.type for e in events if e.type in ("policy_decided", "tool_completed")] == [
        "policy_decided",
        "tool_completed",
    ]
    assert rules.seen[0].effect == "read"


async def test_deny_goes_back_to_the_model_and_nothing_runs(tmp_path: Path) -> None:
    deny = PolicyDecision(
        decision=Decision.DENY, rule_ids=("limits",), reasons=("amount over the daily limit",)
    )
    events, _, model = await run_with_policy(tmp_path, deny)
    assert calls == []
    states = [e.state for e in events if isinstance(e, ev.EffectChanged)]
    assert states == ["validated", "denied"]
    done = next(e for e in events if isinstance(e, ev.ToolCompleted))
    assert done.error_code == "policy_denied" and "daily limit" in done.output
    assert block_body(model.requests[1].messages[-1].content) == done.output


async def test_require_approval_makes_the_run_wait_on_an_interrupt(tmp_path: Path) -> None:
    ask = PolicyDecision(
        decision=Decision.REQUIRE_APPROVAL, reasons=("high risk",), approver_role="finance"
    )
    events, _, _ = await run_with_policy(tmp_path, ask)
    assert calls == []
    assert not any(isinstance(e, ev.ToolCompleted) for e in events)
    raised = events[-1]
    assert isinstance(raised, ev.InterruptRaised) and raised.kind == "approval_required"
    assert raised.payload["approver_roles"] == ["finance"]


async def test_a_broken_policy_fails_closed(tmp_path: Path) -> None:
    events, _, _ = await run_with_policy(tmp_path, RuntimeError("rules file unreadable"))
    assert calls == []
    decided = next(e for e in events if isinstance(e, ev.PolicyDecided))
    assert decided.decision == "deny" and decided.rule_ids == ("policy_error",)


# -- the manifest ----------------------------------------------------------------------------


async def test_a_changed_tool_contract_stops_the_run_on_resume(tmp_path: Path) -> None:
    db = str(tmp_path / "m.db")
    model = ScriptedModel([call_tool("pay", {"amount": 5}), reply("ok")], by_turn=True)
    async with Runtime(db) as rt:
        rid = await rt.start(Agent(name="p", model=model, tools=[pay]), "go")
    # the same agent, but `pay` now claims to be a harmless read
    changed = dataclasses.replace(pay, effect=EffectKind.READ)
    async with Runtime(db) as rt:
        result = await rt.resume(
            rid, Agent(name="p", model=model, tools=[changed]), allow_changed_agent=True
        )
        assert result.status is RunStatus.FAILED
        assert result.failure_reason is FailureReason.TOOL_FAILED
        assert "tools changed while it was in flight" in (result.failure_message or "")
        events = await rt.events(rid)
    assert calls == []
    failed = events[-1]
    assert isinstance(failed, ev.RunFailed) and failed.error["code"] == "tool_manifest_changed"


async def test_a_changed_manifest_is_recorded_with_both_hashes(tmp_path: Path) -> None:
    db = str(tmp_path / "m.db")
    model = ScriptedModel([call_tool("pay", {"amount": 5}), reply("ok")], by_turn=True)
    async with Runtime(db) as rt:
        rid = await rt.start(Agent(name="p", model=model, tools=[pay]), "go")
        created = (await rt.events(rid))[0]
    assert isinstance(created, ev.RunCreated)
    recorded = created.tool_manifest_hash
    changed = dataclasses.replace(pay, risk=Risk.LOW)
    current = Gateway([changed]).manifest_hash
    async with Runtime(db) as rt:
        agent = Agent(name="p", model=model, tools=[changed])
        await rt.resume(rid, agent, allow_changed_agent=True)
        failed = (await rt.events(rid))[-1]
    assert calls == []
    assert isinstance(failed, ev.RunFailed)
    assert failed.error == {
        "code": "tool_manifest_changed",
        "message": "the run's tools changed while it was in flight: it started with tool "
        f"manifest {recorded[:12]}, this process has {current[:12]}; the run will not call a "
        "capability other than the one it was started with",
        "run_id": rid,
        "recorded": recorded,
        "current": current,
    }
    assert failed.message == failed.error["message"]


def dispatched(e: ev.Event) -> bool:
    return isinstance(e, ev.EffectChanged) and e.state == "dispatched"


async def fork_of_a_write_in_flight(db: str) -> tuple[Runtime, str, str]:
    """A run that died once `pay` was recorded as dispatched (its outcome unknown), and the
    runtime to fork it with."""
    model = ScriptedModel([call_tool("pay", {"amount": 5}), reply("ok")], by_turn=True)
    crashing = Runtime(CrashAfter(db, dispatched))
    try:
        with pytest.raises(Crash):
            await crashing.run(Agent(name="p", model=model, tools=[pay]), "go")
    finally:
        await crashing.close()
    rt = Runtime(db)
    (source,) = await rt.runs()
    (effect,) = (await rt.state(source.run_id)).effects.values()
    return rt, source.run_id, effect.effect_id


async def test_a_fork_whose_tool_changed_since_its_write_was_sent_stops_before_settling_it(
    tmp_path: Path,
) -> None:
    rt, source, effect_id = await fork_of_a_write_in_flight(str(tmp_path / "m.db"))
    changed = dataclasses.replace(pay, risk=Risk.LOW)
    model = ScriptedModel([reply("ok")], by_turn=True)
    agent = Agent(name="p", model=model, tools=[changed])
    try:
        last = (await rt.events(source))[-1].seq
        fork_id = await rt.fork(source, at=last, agent=agent)
        result = await rt.resume(fork_id, agent)
        events = await rt.events(fork_id)
    finally:
        await rt.close()
    assert result.status is RunStatus.FAILED and result.failure_reason is FailureReason.TOOL_FAILED
    failed = events[-1]
    assert isinstance(failed, ev.RunFailed)
    assert failed.error == {
        "code": "tool_manifest_changed",
        "message": f"tool pay changed since effect {effect_id} was dispatched",
        "run_id": fork_id,
        "tool": "pay",
    }
    assert calls == []  # the source died before the call; the fork did not send it either
    assert [e.state for e in events if isinstance(e, ev.EffectChanged)][-1] == "dispatched"


async def test_a_fork_without_the_tool_of_its_write_in_flight_stops_before_settling_it(
    tmp_path: Path,
) -> None:
    rt, source, _ = await fork_of_a_write_in_flight(str(tmp_path / "m.db"))
    agent = Agent(name="p", model=ScriptedModel([reply("ok")], by_turn=True), tools=[add])
    try:
        last = (await rt.events(source))[-1].seq
        fork_id = await rt.fork(source, at=last, agent=agent)
        result = await rt.resume(fork_id, agent)
        events = await rt.events(fork_id)
    finally:
        await rt.close()
    assert result.status is RunStatus.FAILED and result.failure_reason is FailureReason.TOOL_FAILED
    failed = events[-1]
    assert isinstance(failed, ev.RunFailed)
    assert failed.error == {
        "code": "tool_manifest_changed",
        "message": "tool pay is no longer available",
    }
    assert calls == []
    assert [e.state for e in events if isinstance(e, ev.EffectChanged)][-1] == "dispatched"


async def test_a_fork_whose_tool_no_longer_takes_an_authorised_writes_arguments_stops(
    tmp_path: Path,
) -> None:
    db = str(tmp_path / "m.db")
    model = ScriptedModel([call_tool("pay", {"amount": 5}), reply("ok")], by_turn=True)
    crashing = Runtime(CrashAfter(db, lambda e: getattr(e, "state", None) == "authorised"))
    try:
        with pytest.raises(Crash):
            await crashing.run(Agent(name="p", model=model, tools=[pay]), "go")
    finally:
        await crashing.close()

    @tool(name="pay", effect="irreversible", risk="high", scopes=("payments:write",))
    def pay_in_cents(cents: int) -> str:
        """Pay, in cents."""
        calls.append(("pay", cents))
        return "paid"

    agent = Agent(name="p", model=ScriptedModel([reply("ok")], by_turn=True), tools=[pay_in_cents])
    async with Runtime(db) as rt:
        (source,) = await rt.runs()
        last = (await rt.events(source.run_id))[-1].seq
        fork_id = await rt.fork(source.run_id, at=last, agent=agent)
        result = await rt.resume(fork_id, agent)
        events = await rt.events(fork_id)
    assert result.status is RunStatus.FAILED and calls == []
    failed = events[-1]
    assert isinstance(failed, ev.RunFailed) and failed.error["code"] == "tool_manifest_changed"
    assert failed.message.startswith(
        "the recorded arguments of call_1_0 no longer validate against pay: "
    )
    assert "cents" in failed.message  # what the tool now wants
    assert [e.state for e in events if isinstance(e, ev.EffectChanged)][-1] == "authorised"


async def test_context_carries_the_stable_key(runtime: Runtime) -> None:
    seen: list[tuple[str | None, str | None, int]] = []

    @tool(effect="write")
    def note(text: str, ctx: ToolContext) -> str:
        """Write a note."""
        seen.append((ctx.idempotency_key, ctx.effect_id, ctx.attempt))
        return "ok"

    model = ScriptedModel([call_tool("note", {"text": "a"}), reply("ok")])
    result = await runtime.run(Agent(name="n", model=model, tools=[note]), "go")
    (effect,) = (await runtime.state(result.run_id)).effects.values()
    assert seen == [(f"{result.run_id}/call_1_0", effect.effect_id, 1)]


async def test_every_call_is_told_its_run_call_key_and_containment(tmp_path: Path) -> None:
    seen: dict[str, ToolContext] = {}

    def look(q: str, ctx: ToolContext) -> str:
        """Read."""
        seen["look"] = ctx
        return q

    @tool(effect="write")
    def note(text: str, ctx: ToolContext) -> str:
        """Write a note."""
        seen["note"] = ctx
        return "ok"

    model = ScriptedModel(
        [call_tool("look", {"q": "a"}), call_tool("note", {"text": "a"}), reply("ok")]
    )
    inside = Containment(roots=(str(tmp_path),))
    context = RunContext(principal=Principal.user("bob", scopes=("*",)), containment=inside)
    async with Runtime(str(tmp_path / "runs.db")) as rt:
        result = await rt.run(
            Agent(name="n", model=model, tools=[tool(look), note]), "go", context=context
        )
        (effect,) = (await rt.state(result.run_id)).effects.values()
    rid = result.run_id
    read, write = seen["look"], seen["note"]
    assert (read.run_id, read.call_id, read.idempotency_key, read.effect_id) == (
        rid,
        "call_1_0",
        f"{rid}/call_1_0",
        None,
    )
    assert (write.run_id, write.call_id, write.idempotency_key, write.effect_id) == (
        rid,
        "call_2_0",
        f"{rid}/call_2_0",
        effect.effect_id,
    )
    assert read.containment == write.containment == inside
    assert read.compensates is None and write.compensates is None


async def test_a_compensation_is_told_the_effect_it_undoes(runtime: Runtime) -> None:
    seen: list[ToolContext] = []

    @tool(effect="reversible_write", compensation="cancel_booking")
    def book(slot: str) -> str:
        """Book a slot."""
        return f"booked {slot}"

    @tool(effect="write")
    def cancel_booking(slot: str, ctx: ToolContext) -> str:
        """Cancel a booking."""
        seen.append(ctx)
        return f"cancelled {slot}"

    model = ScriptedModel([call_tool("book", {"slot": "9:00"}), reply("never reached")])
    agent = Agent(name="b", model=model, tools=[book, cancel_booking], budget=Budget(max_turns=1))
    result = await runtime.run(agent, "book")
    original, compensation = (await runtime.state(result.run_id)).effects.values()
    assert original.state is EffectState.COMPENSATED
    (ctx,) = seen
    assert ctx.compensates == original.effect_id
    assert ctx.effect_id == compensation.effect_id
    assert ctx.idempotency_key == f"{original.idempotency_key}/compensate"


def test_gateway_call_without_a_run() -> None:
    async def go() -> str:
        gw = Gateway([as_tool(add)])
        from contextos.messages import ToolCall

        out = await gw.call(
            ToolCall(id="c", name="add", arguments='{"a":1,"b":2}'),
            ToolContext(run_id="r", call_id="c"),
        )
        return out.output

    assert asyncio.run(go()) == "3"
