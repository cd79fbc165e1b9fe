"""Authority in live runs: containment and the manifest hold even against a valid approval,
policy exceptions, typed answers, child contexts, policy files from the environment."""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from contextos import Agent, FrozenAction, RunStatus, Runtime, codec, tool
from contextos import events as ev
from contextos.errors import AnswerInvalid, ApprovalRefused, AuthorityWidened
from contextos.messages import FinishReason, Message, ToolCall, Usage
from contextos.policy import (
    Containment,
    Decision,
    Policy,
    Principal,
    Rule,
    RunContext,
)
from contextos.policy.authority import Authority
from contextos.policy.rules import conditions
from contextos.runs import RunId
from contextos.testing import ScriptedModel, call_tool, reply
from contextos.tools import file_tools

transfers: list[tuple[str, float]] = []


@tool(effect="write", risk="high", scopes=("payments:transfer",))
def transfer(account: str, amount: float) -> str:
    """Move money to an account."""
    transfers.append((account, amount))
    return f"sent {amount} to {account}"


READ_FILE, WRITE_FILE, LIST_FILES = file_tools()

POLICY = Policy(
    name="ops",
    rules=(
        Rule(
            id="writes-need-ops",
            tools=("write_file",),
            decision=Decision.REQUIRE_APPROVAL,
            approver_role="ops",
            reason="file writes need an operator",
        ),
        Rule(
            id="frozen-accounts",
            tools=("transfer",),
            decision=Decision.DENY,
            exception_role="cfo",
            when=conditions({"account": {"glob": "FROZEN-*"}}),
            reason="the account is frozen",
        ),
    ),
    roles={"ops": ("olga",), "cfo": ("carol",)},
)

BOB = Principal.user("bob", scopes=("*",))


@pytest.fixture
def work(tmp_path: Path) -> Path:
    root = tmp_path / "work"
    root.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("secret")
    os.symlink(outside, root / "escape")
    transfers.clear()
    return root


@pytest.fixture
async def rt(tmp_path: Path) -> AsyncIterator[Runtime]:
    runtime = Runtime(str(tmp_path / "runs.db"), policy=Authority(POLICY))
    yield runtime
    await runtime.close()


def agent(*steps: object, tools: tuple[object, ...] = (READ_FILE, WRITE_FILE, LIST_FILES)) -> Agent:
    return Agent(
        name="ops",
        model=ScriptedModel(list(steps), by_turn=True),  # type: ignore[arg-type]
        tools=list(tools),  # type: ignore[arg-type]
    )


def completed(events: list[ev.Event]) -> list[ev.ToolCompleted]:
    return [e for e in events if isinstance(e, ev.ToolCompleted)]


async def test_containment_in_a_live_run(rt: Runtime, work: Path, tmp_path: Path) -> None:
    a = agent(
        call_tool("write_file", {"path": "../outside/new.txt", "content": "x"}),
        call_tool("read_file", {"path": "escape/secret.txt"}),
        call_tool("read_file", {"path": str(tmp_path / "outside" / "secret.txt")}),
        call_tool("write_file", {"path": "notes/inside.txt", "content": "hello"}),
        reply("done"),
    )
    ctx = RunContext(principal=BOB, containment=Containment(roots=(str(work),)))
    result = await rt.run(a, "go", context=ctx)
    assert result.status is RunStatus.INPUT_REQUIRED
    events = await rt.events(result.run_id)
    refused = completed(events)
    assert [c.error_code for c in refused] == ["policy_denied"] * 3
    assert "climbs out of the run's roots" in refused[0].output
    assert "symlink" in refused[1].output
    assert "absolute path is outside the run's roots" in refused[2].output
    decided = [e for e in events if isinstance(e, ev.PolicyDecided)]
    assert [d.decision for d in decided[:3]] == ["deny"] * 3
    assert all(d.absolute and d.rule_ids == ("containment:path",) for d in decided[:3])
    assert not (tmp_path / "outside" / "new.txt").exists()
    (pending,) = await rt.inbox()
    assert pending.action is not None and pending.action.arguments["path"] == "notes/inside.txt"
    await rt.approve(pending.id, approver="olga")
    assert (await rt.resume(result.run_id, a)).status is RunStatus.COMPLETED
    assert (work / "notes" / "inside.txt").read_text() == "hello"
    assert (tmp_path / "outside" / "secret.txt").read_text() == "secret"


async def forged_interrupt(rt: Runtime, a: Agent, ctx: RunContext, call: ToolCall) -> RunId:
    """A run whose log claims the model proposed `call` and a person was asked about it (a
    forged interrupt, with the real hash of that action); then a valid approval through the
    API by a holder of the role."""
    rid = await rt.start(a, "go", context=ctx)
    found = next((t for t in a.tool_list if t.name == call.name), None)
    action = FrozenAction(
        run_id=rid,
        call_id=call.id,
        tool=call.name,
        arguments=json.loads(call.arguments),
        contract_hash=found.contract_hash() if found else "",
    )
    seq = (await rt.state(rid)).seq
    forged: list[ev.Event] = [
        ev.RunStarted(run_id=rid, seq=seq + 1, worker_id="forger"),
        ev.ModelResponded(
            run_id=rid,
            seq=seq + 2,
            message=Message(role="assistant", tool_calls=(call,)),
            finish_reason=FinishReason.TOOL_CALLS,
            usage=Usage(),
            model="scripted",
        ),
        ev.InterruptRaised(
            run_id=rid,
            seq=seq + 3,
            interrupt_id=f"{rid}.i{seq + 3}",
            kind="approval_required",
            payload={"action": action.to_dict(), "approver_roles": ["ops"]},
            call_id=call.id,
        ),
    ]
    await rt.store.append(rid, forged, expected_seq=seq)
    approval = await rt.approve(f"{rid}.i{seq + 3}", approver="olga", action_hash=action.hash)
    assert approval.action_hash == action.hash
    return rid


async def test_an_approval_cannot_widen_containment(
    rt: Runtime, work: Path, tmp_path: Path
) -> None:
    a = agent(reply("(turn 1 is in the log already)"), reply("ok"))
    ctx = RunContext(principal=BOB, containment=Containment(roots=(str(work),)))
    call = ToolCall(
        id="call_1_0",
        name="write_file",
        arguments=json.dumps({"path": "../outside/pwned.txt", "content": "x"}),
    )
    rid = await forged_interrupt(rt, a, ctx, call)
    result = await rt.resume(rid, a)
    assert result.status is RunStatus.COMPLETED
    events = await rt.events(rid)
    (decided,) = [e for e in events if isinstance(e, ev.PolicyDecided)]
    assert decided.decision == "deny" and decided.absolute and decided.approval_id is None
    (done,) = completed(events)
    assert done.error_code == "policy_denied" and "climbs out" in done.output
    assert not (tmp_path / "outside" / "pwned.txt").exists()


async def test_an_approval_cannot_expose_a_tool_outside_the_manifest(
    rt: Runtime, work: Path
) -> None:
    a = agent(reply("-"), reply("ok"))
    ctx = RunContext(principal=BOB, containment=Containment(roots=(str(work),)))
    call = ToolCall(id="call_1_0", name="drop_database", arguments="{}")
    rid = await forged_interrupt(rt, a, ctx, call)
    assert (await rt.resume(rid, a)).status is RunStatus.COMPLETED
    events = await rt.events(rid)
    (done,) = completed(events)
    assert done.error_code == "unknown_tool"
    assert not any(isinstance(e, ev.PolicyDecided) for e in events)


async def test_an_approval_cannot_pass_the_tool_allowlist(rt: Runtime, work: Path) -> None:
    a = agent(reply("-"), reply("ok"))
    ctx = RunContext(
        principal=BOB,
        tools=("read_file", "list_files"),
        containment=Containment(roots=(str(work),)),
    )
    call = ToolCall(
        id="call_1_0", name="write_file", arguments=json.dumps({"path": "a.txt", "content": "x"})
    )
    rid = await forged_interrupt(rt, a, ctx, call)
    assert (await rt.resume(rid, a)).status is RunStatus.COMPLETED
    (decided,) = [e for e in await rt.events(rid) if isinstance(e, ev.PolicyDecided)]
    assert decided.decision == "deny" and decided.absolute and decided.rule_ids == ("allowlist",)
    assert not (work / "a.txt").exists()


async def test_a_policy_exception_needs_its_role(rt: Runtime) -> None:
    a = agent(
        call_tool("transfer", {"account": "FROZEN-7", "amount": 20}), reply("ok"), tools=(transfer,)
    )
    result = await rt.run(a, "pay", principal=BOB)
    assert result.status is RunStatus.INPUT_REQUIRED
    (pending,) = await rt.inbox()
    assert pending.kind == "policy_exception_requested"
    assert pending.approver_roles == ("cfo",)
    (decided,) = [e for e in await rt.events(result.run_id) if isinstance(e, ev.PolicyDecided)]
    assert decided.exception_role == "cfo" and "frozen-accounts" in decided.rule_ids
    with pytest.raises(ApprovalRefused, match="cfo"):
        await rt.approve(pending.id, approver="olga")
    await rt.approve(pending.id, approver="carol")
    assert (await rt.resume(result.run_id, a)).status is RunStatus.COMPLETED
    assert transfers == [("FROZEN-7", 20.0)]


async def test_typed_answers_are_validated_durable_and_idempotent(tmp_path: Path) -> None:
    db = str(tmp_path / "runs.db")
    a = agent(reply("-"))
    async with Runtime(db, policy=Authority(POLICY)) as rt:
        rid = await rt.start(a, "go", principal=BOB)
        seq = (await rt.state(rid)).seq
        await rt.store.append(
            rid,
            [
                ev.RunStarted(run_id=rid, seq=seq + 1, worker_id="w"),
                ev.InterruptRaised(
                    run_id=rid,
                    seq=seq + 2,
                    interrupt_id=f"{rid}.i{seq + 2}",
                    kind="choice_required",
                    payload={"question": "Which warehouse?", "options": ["north", "south"]},
                ),
            ],
            expected_seq=seq,
        )
    async with Runtime(db, policy=Authority(POLICY)) as rt:  # a new process, the same inbox
        (pending,) = await rt.inbox()
        assert pending.prompt == "Which warehouse?" and pending.kind == "choice_required"
        assert pending.to_dict()["answer_schema"]["required"] == ["choice"]
        with pytest.raises(AnswerInvalid, match="not one of the options"):
            await rt.answer(pending.id, "east", answered_by="bob")
        assert await rt.answer(pending.id, "south", answered_by="bob") == {"choice": "south"}
        assert await rt.answer(pending.id, "south", answered_by="bob") == {"choice": "south"}
        with pytest.raises(ApprovalRefused, match="already answered"):
            await rt.answer(pending.id, "north", answered_by="bob")
        state = await rt.state(rid)
        assert state.status is RunStatus.QUEUED and state.pending_interrupts == {}
        assert await rt.inbox() == []
        answered = [e for e in await rt.events(rid) if isinstance(e, ev.InterruptAnswered)]
        assert [(e.value, e.answered_by) for e in answered] == [({"choice": "south"}, "bob")]


async def test_a_child_run_can_only_narrow_its_parent(rt: Runtime, work: Path) -> None:
    parent_ctx = RunContext(
        principal=Principal.user("bob", scopes=("payments:*", "files:read")),
        containment=Containment(roots=(str(work),)),
    )
    parent = await rt.start(agent(reply("-")), "parent", context=parent_ctx)
    child_ctx = parent_ctx.delegate(run_id=parent, scopes=("files:read",))
    child = await rt.start(agent(reply("-")), "child", context=child_ctx)
    bound = next(e for e in await rt.events(child) if isinstance(e, ev.ContextBound))
    assert bound.context["principal_chain"] == [f"run:{parent}"]
    assert bound.context["scopes"] == ["files:read"]
    wider = RunContext(
        principal=parent_ctx.principal,
        scopes=("files:read",),
        containment=Containment(roots=(str(work.parent),)),
        parent_run_id=parent,
    )
    before = len(await rt.runs())
    with pytest.raises(AuthorityWidened, match="containment wider"):
        await rt.start(agent(reply("-")), "child", context=wider)
    assert len(await rt.runs()) == before


async def test_policy_file_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(
        "name: from-env\nrules:\n  - {id: no-transfers, tools: [transfer], decision: deny}\n"
    )
    monkeypatch.setenv("CONTEXTOS_POLICY", str(path))
    transfers.clear()
    async with Runtime(str(tmp_path / "runs.db")) as rt:
        a = agent(
            call_tool("transfer", {"account": "x", "amount": 1}), reply("ok"), tools=(transfer,)
        )
        result = await rt.run(a, "pay")
        events = await rt.events(result.run_id)
    bound = events[1]
    assert isinstance(bound, ev.ContextBound) and bound.policy_name == "from-env"
    assert bound.snapshot_hash == Policy.load(path).snapshot_hash
    (decided,) = [e for e in events if isinstance(e, ev.PolicyDecided)]
    assert decided.decision == "deny" and decided.rule_ids == ("no-transfers",)
    assert transfers == []


async def test_an_ungoverned_run_is_unchanged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CONTEXTOS_POLICY", raising=False)
    async with Runtime(str(tmp_path / "runs.db")) as rt:
        a = agent(
            call_tool("transfer", {"account": "x", "amount": 1}), reply("ok"), tools=(transfer,)
        )
        result = await rt.run(a, "pay")
        events = await rt.events(result.run_id)
    assert not any(isinstance(e, ev.ContextBound) for e in events)
    (decided,) = [e for e in events if isinstance(e, ev.PolicyDecided)]
    assert decided.rule_ids == ("no_policy",) and decided.checks == ()


@tool(effect="write", risk="high", redact_fields=("card",))
def charge(card: str, amount: float) -> str:
    """Charge a card."""
    transfers.append((card[-4:], amount))
    return "charged"


async def test_redacted_arguments_stay_out_of_the_approval_record(tmp_path: Path) -> None:
    transfers.clear()
    policy = Policy(
        rules=(
            Rule(
                id="charges",
                tools=("charge",),
                decision=Decision.REQUIRE_APPROVAL,
                approver_role="ops",
                preview="Charge {amount} to card {card}",
            ),
        ),
        roles={"ops": ("olga",)},
    )
    secret = "4111111111111111"
    a = agent(call_tool("charge", {"card": secret, "amount": 9}), reply("ok"), tools=(charge,))
    async with Runtime(str(tmp_path / "runs.db"), policy=Authority(policy)) as rt:
        started = await rt.run(a, "charge", principal=BOB)
        (pending,) = await rt.inbox()
        assert pending.prompt == "Charge 9.0 to card [redacted]"
        assert pending.action is not None and pending.action.arguments["card"] == "[redacted]"
        await rt.approve(pending.id, approver="olga", action_hash=pending.action_hash)
        assert (await rt.resume(started.run_id, a)).status is RunStatus.COMPLETED
        events = await rt.events(started.run_id)
    assert transfers == [("1111", 9.0)]
    authority_events = [
        e
        for e in events
        if isinstance(e, ev.PolicyDecided | ev.InterruptRaised | ev.ApprovalGranted)
    ]
    assert authority_events and all(
        secret not in codec.encode(e).decode() for e in authority_events
    )
