"""Interrupts expire on their own: a deadline set by a rule, an asking tool or the policy, and
what was declared for nobody answering (deny, fail, default) recorded once, on SQLite files
and PostgreSQL, with an injected clock (outcomes are asserted, never durations)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from refunds import POLICY, ledger, refund_agent

from contextos import Agent, RunStatus, Runtime
from contextos import events as ev
from contextos.errors import AnswerTooLate, ApprovalRefused, PolicyLoadError
from contextos.ledger import EffectState
from contextos.policy import Expiry, Policy, Principal, Rule
from contextos.policy.authority import Authority
from contextos.policy.expiry import expire_overdue
from contextos.runs import RunId
from contextos.telemetry.timeline import describe
from contextos.testing import ScriptedModel, call_tool, reply
from contextos.tools import ask_tools
from contextos.workers.sweeper import Sweeper

BOB = Principal.user("bob", scopes=("*",))
HOUR = timedelta(hours=1)
ROOT = Path(__file__).resolve().parents[2]


class Clock:
    def __init__(self) -> None:
        self.now = datetime(2026, 11, 30, 9, 0, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now


def timed(on_expiry: str = "deny", expires_in: float = 3600.0) -> Policy:
    """The refund policy with a deadline on the approval rule."""
    first, *rest = POLICY.rules
    return replace(
        POLICY, rules=(replace(first, expires_in=expires_in, on_expiry=on_expiry), *rest)
    )


@pytest.fixture
def refunds_db(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "refunds.db"
    monkeypatch.setenv("REFUND_LEDGER", str(path))
    return path


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
async def deny_rt(backend_url: str, refunds_db: Path, clock: Clock) -> AsyncIterator[Runtime]:
    async with Runtime(backend_url, policy=Authority(timed("deny"), clock=clock)) as rt:
        yield rt


async def waiting(rt: Runtime, agent: Agent | None = None) -> tuple[RunId, str]:
    result = await rt.run(agent or refund_agent(500), "refund please", principal=BOB)
    assert result.status is RunStatus.INPUT_REQUIRED
    (pending,) = [i for i in await rt.inbox() if i.run_id == result.run_id]
    return result.run_id, pending.id


def of(events: list[ev.Event], cls: type[ev.Event]) -> list[ev.Event]:
    return [e for e in events if isinstance(e, cls)]


# --- deny: the action is refused, the run goes on, the tool never runs --------------------


async def test_deny_on_expiry_refuses_the_action_and_the_run_goes_on(
    deny_rt: Runtime, clock: Clock, refunds_db: Path
) -> None:
    rt = deny_rt
    run_id, iid = await waiting(rt)
    pending = await rt.interrupt(iid)
    assert pending.expires_at == clock.now + HOUR
    assert pending.to_dict()["on_expiry"] == "deny"
    assert pending.to_dict()["expiry"]["set_by"] == "rule:refund-over-100"

    sweeper = Sweeper(rt.store, clock=clock)
    assert await sweeper.sweep() == []  # not due yet
    clock.now += 2 * HOUR
    (expired,) = await sweeper.sweep()
    assert expired.interrupt_id == iid and expired.on_expiry == "deny"
    assert (await rt.state(run_id)).status is RunStatus.QUEUED
    assert await rt.inbox() == []

    done = await rt.resume(run_id, refund_agent(500))
    assert done.status is RunStatus.COMPLETED
    events = await rt.events(run_id)
    (completed,) = of(events, ev.ToolCompleted)
    assert isinstance(completed, ev.ToolCompleted)
    assert completed.is_error and "in time" in completed.output and iid in completed.output
    decided = [e for e in of(events, ev.PolicyDecided) if isinstance(e, ev.PolicyDecided)]
    assert [d.decision for d in decided] == ["require_approval", "deny"]
    assert f"expired:{iid}" in decided[-1].rule_ids
    effect = (await rt.state(run_id)).effects
    assert [e.state for e in effect.values()] == [EffectState.DENIED]
    assert ledger(refunds_db) == ([], 0)  # the refund never ran


# --- fail: the run ends expired, saying which interrupt --------------------------------------


async def test_fail_on_expiry_ends_the_run_expired(
    backend_url: str, refunds_db: Path, clock: Clock
) -> None:
    async with Runtime(backend_url, policy=Authority(timed("fail"), clock=clock)) as rt:
        run_id, iid = await waiting(rt)
        clock.now += 2 * HOUR
        (expired,) = await Sweeper(rt.store, clock=clock).sweep()
        assert expired.on_expiry == "fail"
        state = await rt.state(run_id)
        assert state.status is RunStatus.EXPIRED
        assert state.failure_message is not None and iid in state.failure_message
        assert [e.state for e in state.effects.values()] == [EffectState.FAILED]
        lines = [describe(e) for e in await rt.events(run_id)]  # what `contextos show` prints
        assert any(f"{iid} (approval_required) expired unanswered" in line for line in lines)
        assert any(line.startswith("expired: interrupt " + iid) for line in lines)
        again = await rt.resume(run_id, refund_agent(500))
        assert again.status is RunStatus.EXPIRED
        with pytest.raises(AnswerTooLate) as info:
            await rt.approve(iid, approver="alice")
        assert "the run ended expired" in info.value.message
    assert ledger(refunds_db) == ([], 0)


# --- an answer after expiry is refused ---------------------------------------------------------


async def test_an_approval_after_the_deadline_is_refused_and_the_expiry_recorded_once(
    deny_rt: Runtime, clock: Clock, refunds_db: Path
) -> None:
    rt = deny_rt
    run_id, iid = await waiting(rt)
    clock.now += 2 * HOUR  # no sweep has run: the late approval notices the deadline itself
    with pytest.raises(AnswerTooLate) as info:
        await rt.approve(iid, approver="alice")
    assert info.value.code == "interrupt_expired"
    assert "expired unanswered" in info.value.message and "refused" in info.value.message
    with pytest.raises(AnswerTooLate):
        await rt.deny(iid, approver="alice", reason="too late anyway")
    events = await rt.events(run_id)
    assert len(of(events, ev.InterruptExpired)) == 1
    assert of(events, ev.ApprovalGranted) == [] and of(events, ev.ApprovalDenied) == []
    done = await rt.resume(run_id, refund_agent(500))
    assert done.status is RunStatus.COMPLETED
    assert ledger(refunds_db) == ([], 0)


async def test_an_answer_before_the_deadline_wins_over_a_later_sweep(
    deny_rt: Runtime, clock: Clock, refunds_db: Path
) -> None:
    rt = deny_rt
    run_id, iid = await waiting(rt)
    await rt.approve(iid, approver="alice")
    clock.now += 2 * HOUR
    assert await Sweeper(rt.store, clock=clock).sweep() == []
    assert of(await rt.events(run_id), ev.InterruptExpired) == []
    # the approval itself still lasts (policy default 24h), so the refund runs
    assert (await rt.resume(run_id, refund_agent(500))).status is RunStatus.COMPLETED
    assert len(ledger(refunds_db)[0]) == 1


async def test_resuming_a_run_past_its_deadline_expires_the_interrupt_first(
    deny_rt: Runtime, clock: Clock, refunds_db: Path
) -> None:
    rt = deny_rt
    run_id, iid = await waiting(rt)
    clock.now += 2 * HOUR
    done = await rt.resume(run_id, refund_agent(500))
    assert done.status is RunStatus.COMPLETED
    (expired,) = of(await rt.events(run_id), ev.InterruptExpired)
    assert isinstance(expired, ev.InterruptExpired) and expired.interrupt_id == iid
    assert ledger(refunds_db) == ([], 0)


# --- exactly once across sweepers ---------------------------------------------------------------


async def test_two_sweepers_at_once_record_one_expiry(
    backend_url: str, refunds_db: Path, clock: Clock
) -> None:
    authority = Authority(timed("deny"), clock=clock)
    async with Runtime(backend_url, policy=authority) as a, Runtime(backend_url) as b:
        run_ids = [(await waiting(a))[0] for _ in range(3)]
        clock.now += 2 * HOUR
        sweepers = [Sweeper(a.store, clock=clock), Sweeper(b.store, clock=clock)]
        results = await asyncio.gather(*(s.sweep() for s in sweepers for _ in range(2)))
        recorded = [e.run_id for r in results for e in r]
        assert sorted(recorded) == sorted(run_ids)  # each once, by whichever got there first
        for rid in run_ids:
            assert len(of(await a.events(rid), ev.InterruptExpired)) == 1
        # and one more racer that arrives late finds nothing to do
        assert await expire_overdue(b.store, run_ids[0], now=clock.now) == []


# --- no deadline, no expiry -------------------------------------------------------------------


async def test_an_interrupt_without_a_deadline_never_expires(
    backend_url: str, refunds_db: Path, clock: Clock
) -> None:
    async with Runtime(backend_url, policy=Authority(POLICY, clock=clock)) as rt:
        run_id, iid = await waiting(rt)
        pending = await rt.interrupt(iid)
        assert pending.expires_at is None and pending.to_dict()["expires_at"] is None
        clock.now += timedelta(days=3650)
        assert await Sweeper(rt.store, clock=clock).sweep() == []
        assert await rt.resume(run_id, refund_agent(500)) is not None
        assert (await rt.state(run_id)).status is RunStatus.INPUT_REQUIRED
        await rt.approve(iid, approver="alice")
        assert of(await rt.events(run_id), ev.InterruptExpired) == []


# --- where a deadline comes from ----------------------------------------------------------------


async def test_the_policy_default_and_the_runtime_default_set_deadlines(
    tmp_path: Path, refunds_db: Path, clock: Clock
) -> None:
    url = str(tmp_path / "runs.db")
    by_policy = replace(POLICY, interrupt_ttl_s=600.0, on_expiry="fail")
    async with Runtime(url, policy=Authority(by_policy, clock=clock)) as rt:
        _, iid = await waiting(rt)
        d = (await rt.interrupt(iid)).deadline
        assert d is not None and d.expires_at == clock.now + timedelta(seconds=600)
        assert d.on_expiry == "fail" and d.set_by == "policy:refunds"
    fallback = Expiry(after_s=60.0, on_expiry="deny")
    async with Runtime(url, policy=Authority(POLICY, clock=clock, expiry=fallback)) as rt:
        _, iid = await waiting(rt)
        d = (await rt.interrupt(iid)).deadline
        assert d is not None and d.expires_at == clock.now + timedelta(seconds=60)
        assert d.set_by == "runtime"


def test_a_policy_file_declares_deadlines_and_refuses_a_default_for_approvals(
    tmp_path: Path,
) -> None:
    base = (
        'name = "p"\n[roles]\nfinance = ["alice"]\n[[rules]]\nid = "r"\ntools = ["refund"]\n'
        'decision = "require_approval"\napprover_role = "finance"\nexpires_in = 900\n'
    )
    good = tmp_path / "good.toml"
    good.write_text(base + 'on_expiry = "fail"\n')
    rule = Policy.load(good).rules[0]
    assert (rule.expires_in, rule.on_expiry) == (900.0, "fail")
    assert Policy.load(good).snapshot_hash != replace(Policy.load(good), rules=()).snapshot_hash
    bad = tmp_path / "bad.toml"
    bad.write_text(base + 'on_expiry = "default"\n')
    with pytest.raises(PolicyLoadError, match="on_expiry must be one of deny, fail"):
        Policy.load(bad)
    with pytest.raises(PolicyLoadError, match="needs the default answer"):
        Expiry(after_s=5, on_expiry="default")
    # a rule without a deadline keeps the snapshot hash it had before deadlines existed
    assert "expires_in" not in Rule(id="x", decision="allow").fingerprint()  # type: ignore[arg-type]


# --- questions: a declared default answers; deny tells the model ------------------------------


def asker(expiry: Expiry) -> Agent:
    ask, review = ask_tools(expiry=expiry)
    step = call_tool("ask_human", {"question": "Which warehouse?", "options": ["north", "south"]})
    return Agent(
        name="asker",
        model=ScriptedModel([step, reply("thanks")], by_turn=True),
        tools=[ask, review],
    )


async def test_a_choice_with_a_declared_default_gets_it_on_expiry(
    backend_url: str, clock: Clock
) -> None:
    agent = asker(Expiry(after_s=300, on_expiry="default", default="north"))
    async with Runtime(backend_url, policy=Authority(Policy(), clock=clock)) as rt:
        run_id, iid = await waiting(rt, agent)
        d = (await rt.interrupt(iid)).deadline
        assert d is not None and d.on_expiry == "default" and d.default == {"choice": "north"}
        clock.now += HOUR
        (expired,) = await Sweeper(rt.store, clock=clock).sweep()
        assert expired.value == {"choice": "north"}
        with pytest.raises(AnswerTooLate, match="default answer"):
            await rt.answer(iid, "south", answered_by="bob")
        done = await rt.resume(
            run_id, asker(Expiry(after_s=300, on_expiry="default", default="north"))
        )
        assert done.status is RunStatus.COMPLETED
        (completed,) = of(await rt.events(run_id), ev.ToolCompleted)
        assert isinstance(completed, ev.ToolCompleted)
        assert not completed.is_error and completed.output == '{"choice": "north"}'


async def test_a_default_that_is_not_an_option_is_declared_a_denial_when_raised(
    tmp_path: Path, clock: Clock
) -> None:
    agent = asker(Expiry(after_s=300, on_expiry="default", default="west"))
    async with Runtime(str(tmp_path / "runs.db"), policy=Authority(Policy(), clock=clock)) as rt:
        run_id, iid = await waiting(rt, agent)
        d = (await rt.interrupt(iid)).deadline
        assert d is not None and d.on_expiry == "deny" and "not one of the options" in d.note
        clock.now += HOUR
        await Sweeper(rt.store, clock=clock).sweep()
        done = await rt.resume(
            run_id, asker(Expiry(after_s=300, on_expiry="default", default="west"))
        )
        assert done.status is RunStatus.COMPLETED
        (completed,) = of(await rt.events(run_id), ev.ToolCompleted)
        assert isinstance(completed, ev.ToolCompleted)
        assert completed.is_error and "in time" in completed.output


async def test_an_answer_to_an_expired_question_is_refused(tmp_path: Path, clock: Clock) -> None:
    agent = asker(Expiry(after_s=300, on_expiry="fail"))
    async with Runtime(str(tmp_path / "runs.db"), policy=Authority(Policy(), clock=clock)) as rt:
        run_id, iid = await waiting(rt, agent)
        clock.now += HOUR
        with pytest.raises(ApprovalRefused, match="expired unanswered"):
            await rt.answer(iid, "south", answered_by="bob")
        assert (await rt.state(run_id)).status is RunStatus.EXPIRED


# --- the surfaces: inbox and show ------------------------------------------------------------


def test_inbox_shows_when_each_interrupt_expires(tmp_path: Path) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text(
        'name = "refunds"\n[roles]\nfinance = ["alice"]\n[[rules]]\nid = "refund-over-100"\n'
        'tools = ["refund"]\ndecision = "require_approval"\napprover_role = "finance"\n'
        "when = { amount = { gt = 100 } }\nexpires_in = 10800\n"
    )
    env = {
        **os.environ,
        "NO_COLOR": "1",
        "COLUMNS": "250",
        "CONTEXTOS_POLICY": str(policy),
        "REFUND_LEDGER": str(tmp_path / "refunds.db"),
        "CONTEXTOS_USER": "bob",
    }

    def cli(*args: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "contextos", *args, "--store", str(tmp_path / "runs.db")],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    cli("run", "tests/interrupts/refunds.py:agent", "refund order A-0")
    listed = cli("inbox")
    assert "expires" in listed and ("in 2h (deny)" in listed or "in 3h (deny)" in listed)
    (pending,) = json.loads(cli("inbox", "--json"))
    assert pending["on_expiry"] == "deny" and pending["expires_at"] is not None
