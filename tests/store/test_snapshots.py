"""Snapshots of a run's folded state, on every backend: a load from a snapshot equals the fold
of the whole log, and a snapshot that cannot be trusted is never used.

The runs here go through every part of the state: tool calls, policy decisions, effects with
retries and reconciliation, interrupts answered, approved and denied, compaction, verification,
crashes and releases.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import tracemalloc
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, cast

import pytest

from contextos import Agent, Runtime, codec
from contextos import events as ev
from contextos.errors import EventDecodeError, RunIsTerminal
from contextos.ledger import EffectState
from contextos.messages import FinishReason, Message, ToolCall, Usage
from contextos.runs import Budget, FailureReason, RunId, RunStatus
from contextos.state import RunState, apply, fold
from contextos.store import EventStore, open_store, snapshots
from contextos.store.base import StateStore, load_state
from contextos.testing import ScriptedModel, call_tool, reply

T0 = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)
S = EffectState


class Log:
    """Builds a valid run log scene by scene; each scene is one append, as the loop makes."""

    def __init__(self, run_id: str) -> None:
        self.run_id = RunId(run_id)
        self.seq = 0
        self.calls = 0

    def _at(self) -> datetime:
        return T0 + timedelta(seconds=self.seq)

    def make(self, cls: type[Any], **fields: Any) -> Any:
        self.seq += 1
        return cls(run_id=self.run_id, seq=self.seq, occurred_at=self._at(), **fields)

    def start(self) -> list[ev.Event]:
        return [
            self.make(
                ev.RunCreated,
                agent_name="clerk",
                agent_version="7",
                agent_hash="h",
                agent_ref="agents.py:clerk",
                input="settle the invoices",
                budget=Budget(max_turns=500, max_cost_usd=12.5, deadline_s=3600.0),
                deadline_at=T0 + timedelta(hours=1),
                tool_manifest_hash="tm",
                metadata={"tenant_id": "acme", "labels": ["a", "b"], "n": 1.5},
            ),
            self.make(
                ev.ContextBound,
                context={"principal": {"id": "ann", "scopes": ["pay"]}},
                context_hash="ch",
                policy_name="finance",
                policy_version="3",
                snapshot_hash="ps",
            ),
            self.make(ev.RunStarted, worker_id="w1"),
        ]

    def _call(self, tool: str, args: str = '{"id": 1}') -> tuple[str, ev.ModelResponded]:
        self.calls += 1
        call_id = f"call_{self.calls}"
        message = Message(
            role="assistant",
            content=f"calling {tool}",
            tool_calls=(ToolCall(id=call_id, name=tool, arguments=args),),
        )
        responded = self.make(
            ev.ModelResponded,
            message=message,
            finish_reason=FinishReason.TOOL_CALLS,
            usage=Usage(input_tokens=100 + self.calls, output_tokens=7, cost_usd=0.01, requests=1),
            model="scripted",
            latency_ms=1.25,
            context_hash="ctx",
            context={"manifest": [{"id": "history", "tokens": self.calls}], "stack": ["budget"]},
        )
        return call_id, responded

    def _decide(self, call_id: str, tool: str, decision: str, **more: Any) -> ev.PolicyDecided:
        return self.make(
            ev.PolicyDecided,
            call_id=call_id,
            tool=tool,
            decision=decision,
            rule_ids=("r1",),
            reasons=("because",),
            snapshot_hash="ps",
            action_hash=f"act-{call_id}",
            checks=({"layer": "tenant", "decision": decision, "rule_id": "r1", "reason": "ok"},),
            **more,
        )

    def _propose(self, call_id: str, effect_id: str) -> ev.EffectProposed:
        return self.make(
            ev.EffectProposed,
            effect_id=effect_id,
            call_id=call_id,
            tool="pay",
            kind="irreversible",
            idempotency_key=f"{self.run_id}/{call_id}",
            contract_hash="cc",
            arguments={"amount": 12.5, "to": "acme"},
            compensation="refund",
        )

    def _move(self, effect_id: str, state: EffectState, **more: Any) -> ev.EffectChanged:
        return self.make(ev.EffectChanged, effect_id=effect_id, state=state, **more)

    def read_tool(self) -> list[ev.Event]:
        call_id, responded = self._call("lookup")
        return [
            responded,
            self._decide(call_id, "lookup", "allow"),
            self.make(ev.ToolCompleted, call_id=call_id, name="lookup", output="found it"),
        ]

    def effect_with_retry(self) -> list[ev.Event]:
        call_id, responded = self._call("pay")
        eid = f"eff-{call_id}"
        return [
            responded,
            self._decide(call_id, "pay", "allow", effect_id=eid),
            self._propose(call_id, eid),
            self._move(eid, S.VALIDATED),
            self._move(eid, S.AUTHORISED),
            self._move(eid, S.DISPATCHED, attempt=1),
            self.make(
                ev.ToolAttemptFailed,
                call_id=call_id,
                tool="pay",
                attempt=1,
                error_type="TimeoutError",
                error="slow",
                will_retry=True,
                delay_s=0.5,
                effect_id=eid,
            ),
            self._move(eid, S.DISPATCHED, attempt=2),
            self._move(eid, S.COMMITTED, receipts={"confirmation": "c-9"}, output="paid"),
            self.make(ev.ToolCompleted, call_id=call_id, name="pay", output="paid", effect_id=eid),
        ]

    def approved_and_reconciled(self) -> list[list[ev.Event]]:
        call_id, responded = self._call("pay")
        eid = f"eff-{call_id}"
        iid = f"int-{call_id}"
        asked = [
            responded,
            self._decide(
                call_id,
                "pay",
                "require_approval",
                effect_id=eid,
                approver_role="cfo",
                interrupt_kind="approval_required",
                interrupt_payload={"amount": 12.5},
            ),
            self._propose(call_id, eid),
            self._move(eid, S.VALIDATED),
            self.make(
                ev.InterruptRaised,
                interrupt_id=iid,
                kind="approval_required",
                payload={"action": {"amount": 12.5}},
                call_id=call_id,
                effect_id=eid,
            ),
        ]
        granted = [
            self.make(
                ev.ApprovalGranted,
                approval_id=f"ap-{call_id}",
                interrupt_id=iid,
                action_hash=f"act-{call_id}",
                approver="user:bob",
                approver_roles=("cfo",),
                expires_at=T0 + timedelta(days=1),
                conditions={"max": 20},
            )
        ]
        resumed = [
            self.make(ev.RunStarted, worker_id="w2"),
            self._move(eid, S.AUTHORISED),
            self._move(eid, S.DISPATCHED, attempt=1),
            self._move(eid, S.OUTCOME_UNKNOWN, error_code="timeout", note="no answer"),
            self._move(eid, S.RECONCILING),
            self._move(eid, S.COMMITTED, receipts={"request": "r-1"}, output="paid late"),
            self.make(
                ev.ToolCompleted, call_id=call_id, name="pay", output="paid late", effect_id=eid
            ),
        ]
        return [asked, granted, resumed]

    def denied(self) -> list[list[ev.Event]]:
        call_id, responded = self._call("pay")
        eid = f"eff-{call_id}"
        iid = f"int-{call_id}"
        asked = [
            responded,
            self._decide(call_id, "pay", "require_approval", effect_id=eid),
            self._propose(call_id, eid),
            self._move(eid, S.VALIDATED),
            self.make(
                ev.InterruptRaised,
                interrupt_id=iid,
                kind="approval_required",
                call_id=call_id,
                effect_id=eid,
            ),
        ]
        refused = [
            self.make(
                ev.ApprovalDenied,
                interrupt_id=iid,
                action_hash=f"act-{call_id}",
                approver="user:bob",
                reason="too much",
            ),
            self.make(ev.RunStarted, worker_id="w3"),
            self._move(eid, S.DENIED, error_code="approval_denied"),
            self.make(
                ev.ToolCompleted,
                call_id=call_id,
                name="pay",
                output="denied: too much",
                is_error=True,
                error_code="approval_denied",
                effect_id=eid,
            ),
        ]
        return [asked, refused]

    def question(self) -> list[list[ev.Event]]:
        iid = f"q-{self.seq}"
        return [
            [
                self.make(
                    ev.InterruptRaised,
                    interrupt_id=iid,
                    kind="missing_information",
                    payload={"question": "which account?"},
                )
            ],
            [
                self.make(
                    ev.InterruptAnswered,
                    interrupt_id=iid,
                    kind="missing_information",
                    value={"account": "ops"},
                    answered_by="user:ann",
                ),
                self.make(ev.RunStarted, worker_id="w1"),
                self.make(ev.UserMessageAdded, content="use the ops account"),
            ],
        ]

    def chatter(self) -> list[ev.Event]:
        return [
            self.make(
                ev.ModelResponded,
                message=Message(role="assistant", content="all settled"),
                finish_reason=FinishReason.STOP,
                usage=Usage(input_tokens=50, output_tokens=9, cost_usd=0.002, requests=1),
                model="scripted",
            ),
            self.make(
                ev.VerificationFailed,
                verifier="receipts",
                gaps=("one receipt missing",),
                feedback="attach the receipt",
            ),
            self.make(ev.ApprovalRevoked, approval_id="ap-none", revoked_by="user:bob"),
            self.make(
                ev.ContextCompacted,
                summary=f"up to #{self.seq}",
                through_seq=self.seq - 1,
                usage=Usage(input_tokens=300, output_tokens=40, cost_usd=0.003, requests=1),
                model="scripted",
                messages=12,
                tokens_before=900,
            ),
        ]

    def crash_and_release(self) -> list[list[ev.Event]]:
        return [
            [
                self.make(ev.RuntimeCrashDetected, previous_worker_id="w1", last_seq=self.seq),
                self.make(ev.RunStarted, worker_id="w4", recovered=True),
            ],
            [self.make(ev.RunReleased, worker_id="w4", reason="drain")],
            [self.make(ev.RunStarted, worker_id="w5")],
        ]

    def batches(self, rounds: int) -> Iterator[list[ev.Event]]:
        """`rounds` rounds of every scene: about 50 events each."""
        yield self.start()
        for _ in range(rounds):
            yield self.read_tool()
            yield self.effect_with_retry()
            yield from self.approved_and_reconciled()
            yield from self.denied()
            yield from self.question()
            yield self.chatter()
            yield from self.crash_and_release()

    def busy(self, rounds: int) -> Iterator[list[ev.Event]]:
        """A run that only works (no parks): 17 events a round."""
        yield self.start()
        for _ in range(rounds):
            yield self.read_tool()
            yield self.effect_with_retry()
            yield self.chatter()

    def left_waiting(self) -> list[ev.Event]:
        """An approval still pending at the end, with its effect validated."""
        return self.approved_and_reconciled()[0]

    def ending(self) -> list[ev.Event]:
        return [
            self.make(
                ev.RunEnding, outcome="failed", reason="tool_failed", message="x", error={"c": 1}
            ),
            self.make(ev.RunFailed, reason=FailureReason.TOOL_FAILED, message="x"),
        ]


# -- plain SQL around the store -------------------------------------------------------------


class Raw:
    """The store's database through a connection of its own (`?` placeholders everywhere)."""

    def __init__(self, url: str) -> None:
        self.postgres = url.startswith("postgresql://")
        if self.postgres:
            import psycopg

            self.conn: Any = psycopg.connect(url, autocommit=True)
        else:
            self.conn = sqlite3.connect(url.removeprefix("sqlite:///"), isolation_level=None)

    def execute(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        if self.postgres:
            sql = sql.replace("?", "%s")
        cur = self.conn.execute(sql, params)
        return list(cur.fetchall()) if cur.description else []

    def snapshot(self, run_id: str) -> tuple[int, str, bytes] | None:
        rows = self.execute("SELECT seq, format, state FROM snapshots WHERE run_id = ?", (run_id,))
        return None if not rows else (int(rows[0][0]), str(rows[0][1]), bytes(rows[0][2]))

    def put_snapshot(self, run_id: str, seq: int, fmt: str, blob: bytes) -> None:
        self.execute("DELETE FROM snapshots WHERE run_id = ?", (run_id,))
        self.execute(
            "INSERT INTO snapshots (run_id, seq, format, state) VALUES (?, ?, ?, ?)",
            (run_id, seq, fmt, blob),
        )

    def corrupt_event(self, run_id: str, seq: int) -> None:
        """Overwrite an event behind every guard, as a disk fault or an operator might."""
        if self.postgres:
            self.execute("ALTER TABLE events DISABLE TRIGGER events_are_append_only")
        else:
            self.execute("DROP TRIGGER events_are_append_only_u")
        self.execute(
            "UPDATE events SET payload = ? WHERE run_id = ? AND seq = ?",
            (b'{"not": "an event"}', run_id, seq),
        )

    def close(self) -> None:
        self.conn.close()


@pytest.fixture
def raw(backend_url: str) -> Iterator[Raw]:
    r = Raw(backend_url)
    try:
        yield r
    finally:
        r.close()


@pytest.fixture
async def store(backend_url: str) -> AsyncIterator[EventStore]:
    s = open_store(backend_url)
    try:
        yield s
    finally:
        await s.close()


async def write(store: EventStore, batches: Iterator[list[ev.Event]] | list[list[ev.Event]]) -> int:
    seq = 0
    for batch in batches:
        run_id = batch[0].run_id
        seq = await store.append(run_id, batch, expected_seq=batch[0].seq - 1)
    return seq


async def truth(store: EventStore, run_id: str, upto: int | None = None) -> RunState:
    """The fold of the whole log (or of its first `upto` events)."""
    events = await store.read(RunId(run_id))
    return fold(events if upto is None else events[:upto], run_id)


async def eventually(check: Callable[[], Awaitable[bool]]) -> None:
    """Wait for a background write (snapshots are written after the append returns)."""
    for _ in range(500):
        if await check():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("never happened")


async def assert_snapshot_is_the_fold(store: EventStore, raw: Raw, run_id: str) -> int:
    """The stored snapshot decodes to exactly the fold of the log up to its seq."""
    snap = raw.snapshot(run_id)
    assert snap is not None
    seq, fmt, blob = snap
    assert fmt == snapshots.FORMAT
    assert zlib.decompress(blob).startswith(b"{")  # stored compressed
    restored = snapshots.restore(RunId(run_id), seq, fmt, blob)
    assert restored == await truth(store, run_id, seq)
    return seq


# -- a load equals the fold -------------------------------------------------------------------


async def test_every_store_loads_state_from_snapshots(store: EventStore) -> None:
    assert isinstance(store, StateStore)


async def test_a_loaded_state_equals_the_fold_of_the_log_at_every_step(
    store: EventStore, raw: Raw
) -> None:
    log = Log("r1")
    snapshotted = 0
    for batch in log.batches(rounds=9):
        await write(store, [batch])
        loaded = await load_state(store, log.run_id)
        assert loaded == await truth(store, "r1")
        if raw.snapshot("r1") is not None:
            snapshotted += 1
    assert log.seq > 3 * snapshots.EVERY
    assert snapshotted, "a run this long has a snapshot"
    await write(store, [log.left_waiting()])
    state = await load_state(store, log.run_id)
    assert state == await truth(store, "r1")
    # the run's state holds every kind of record
    assert state.status is RunStatus.INPUT_REQUIRED and len(state.pending_interrupts) == 1
    assert state.effects and state.policy_by_call and state.context
    assert {i.status for i in state.interrupts.values()} > {"pending"}
    assert {e.state for e in state.effects.values()} >= {S.COMMITTED, S.DENIED, S.VALIDATED}
    assert state.context_cursor > 0 and state.verification_attempts > 0 and state.tool_errors
    assert state.pending_tool_calls and state.interrupt_of_call


async def test_snapshots_are_written_as_the_log_grows_and_equal_its_fold(
    store: EventStore, raw: Raw
) -> None:
    log = Log("r1")
    await write(store, log.batches(rounds=4))
    assert log.seq > snapshots.EVERY

    async def written() -> bool:
        snap = raw.snapshot("r1")
        return snap is not None and snap[0] >= snapshots.EVERY

    await eventually(written)
    seq = await assert_snapshot_is_the_fold(store, raw, "r1")
    assert log.seq - seq <= snapshots.EVERY + 20  # the last one is at most a gap (+a batch) back


async def test_a_snapshot_is_taken_of_the_appenders_fold_without_reading_the_log_back(
    store: EventStore, raw: Raw, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def no_read_back(*args: Any) -> Any:
        raise AssertionError("the log was read back for a snapshot")

    monkeypatch.setattr(store, "_read_rows", no_read_back)
    monkeypatch.setattr(store, "_read_snapshot", no_read_back)
    log = Log("r1")
    mine = RunState(run_id=log.run_id)  # the appender's fold, as a driver keeps it
    for batch in log.batches(rounds=4):
        await store.append(log.run_id, batch, expected_seq=mine.seq, folded=mine)
        for event in batch:  # after the append returns, as a driver folds its commit in
            apply(mine, event)
    assert log.seq > snapshots.EVERY

    async def written() -> bool:
        return raw.snapshot("r1") is not None

    await eventually(written)
    monkeypatch.undo()
    seq = await assert_snapshot_is_the_fold(store, raw, "r1")
    assert seq >= snapshots.EVERY - 20  # taken just before the batch that made it due


async def test_a_store_that_closes_snapshots_the_runs_it_drove(backend_url: str, raw: Raw) -> None:
    log = Log("r1")
    first = open_store(backend_url)
    await write(first, log.busy(rounds=12))

    async def written() -> bool:
        return raw.snapshot("r1") is not None

    await eventually(written)
    snap = raw.snapshot("r1")
    assert snap is not None and log.seq - snap[0] >= snapshots.AT_REST
    await first.close()
    assert await assert_snapshot_is_the_fold_in(backend_url, raw, "r1") == log.seq


async def assert_snapshot_is_the_fold_in(url: str, raw: Raw, run_id: str) -> int:
    s = open_store(url)
    try:
        return await assert_snapshot_is_the_fold(s, raw, run_id)
    finally:
        await s.close()


async def test_short_runs_get_no_snapshot(backend_url: str, raw: Raw) -> None:
    s = open_store(backend_url)
    log = Log("r1")
    await write(s, [log.start(), log.read_tool(), log.ending()])
    await s.close()
    assert raw.execute("SELECT count(*) FROM snapshots") == [(0,)]


async def test_a_long_run_that_ends_is_snapshotted_whole_and_stays_frozen(
    store: EventStore, raw: Raw
) -> None:
    log = Log("r1")
    await write(store, log.batches(rounds=3))
    assert log.seq > snapshots.EVERY
    await write(store, [log.ending()])

    async def final() -> bool:
        snap = raw.snapshot("r1")
        return snap is not None and snap[0] == log.seq

    await eventually(final)
    state = await load_state(store, log.run_id)
    assert state.status is RunStatus.FAILED and state == await truth(store, "r1")
    await assert_snapshot_is_the_fold(store, raw, "r1")
    late = log.make(ev.UserMessageAdded, content="late")
    with pytest.raises(RunIsTerminal):
        await store.append(log.run_id, [late], expected_seq=late.seq - 1)
    assert (await store.get_run(log.run_id)).last_seq == late.seq - 1


def test_the_message_memo_packs_new_messages_onto_the_old_and_starts_over_on_a_rewrite() -> None:
    memo = snapshots.MessageMemo()
    state = RunState(run_id=RunId("r1"), agent_name="a")
    state.messages = [Message(role="user", content="a"), Message(role="assistant", content="b")]
    assert unpacked(memo, state) == ["a", "b"]
    state.messages.append(Message(role="user", content="c"))
    assert unpacked(memo, state) == ["a", "b", "c"]
    state.messages[1] = Message(role="assistant", content="B")  # not a growth: pack all again
    assert unpacked(memo, state) == ["a", "B", "c"]
    state.messages = state.messages[:1]
    assert unpacked(memo, state) == ["a"]
    state.messages = []
    assert unpacked(memo, state) == []


def unpacked(memo: snapshots.MessageMemo, state: RunState) -> list[str]:
    """The contents of the messages in what `memo` packs `state` into; its other fields too."""
    blob = memo.pack(state)()
    packed, plain = json.loads(zlib.decompress(blob)), json.loads(snapshots.encode(state))
    assert packed.pop("messages") == plain.pop("messages", []) and packed == plain
    restored = snapshots.restore(state.run_id, state.seq, snapshots.FORMAT, blob)
    assert restored is not None and restored.messages == state.messages
    return [m.content for m in restored.messages]


def test_the_message_memo_holds_a_long_run_s_messages_compressed() -> None:
    state = RunState(run_id=RunId("r1"))
    memo = snapshots.MessageMemo()
    tracemalloc.start()
    for turn in range(40):  # a snapshot every 50 messages, as a long run's store takes them
        state.messages += [
            Message(role="tool", content=f"result {turn}.{i}: " + "the same line. " * 14)
            for i in range(50)
        ]
        before = tracemalloc.get_traced_memory()[0]
        memo.pack(state)
        held = tracemalloc.get_traced_memory()[0] - before
        text = sum(len(m.content) for m in state.messages[-50:])
        assert held < text / 4, (turn, held, text)  # kept as JSON, it would hold more than all
    tracemalloc.stop()


# -- a snapshot is never trusted blindly -------------------------------------------------------


async def prepared(store: EventStore, raw: Raw) -> tuple[Log, int, RunState]:
    """A run with a snapshot, and more events after it."""
    log = Log("r1")
    await write(store, log.batches(rounds=4))

    async def written() -> bool:
        return raw.snapshot("r1") is not None

    await eventually(written)
    # A later snapshot still being written would move the seq from under the caller.
    while pending := cast(Any, store)._tasks:
        await asyncio.gather(*pending)
    seq = await assert_snapshot_is_the_fold(store, raw, "r1")
    if seq == log.seq:  # a busy machine let the snapshot catch the end: more events after it
        await write(store, [log.read_tool()])
        while pending := cast(Any, store)._tasks:
            await asyncio.gather(*pending)
        seq = await assert_snapshot_is_the_fold(store, raw, "r1")
    assert seq < log.seq
    return log, seq, await truth(store, "r1")


async def test_a_valid_snapshot_is_what_a_load_starts_from(store: EventStore, raw: Raw) -> None:
    log, seq, full = await prepared(store, raw)
    # A doctored snapshot in the right format, at the right seq, is believed: the load starts
    # from it and folds only the events after it. Stored as plain JSON, as snapshots were
    # before they were compressed.
    state = await truth(store, "r1", seq)
    state.agent_name = "doctored"
    raw.put_snapshot("r1", seq, snapshots.FORMAT, snapshots.encode(state))
    loaded = await load_state(store, log.run_id)
    assert loaded.agent_name == "doctored"
    assert loaded.seq == full.seq and loaded.messages == full.messages


@pytest.mark.parametrize("flaw", ["format", "seq", "run", "garbage", "cut", "shape", "ahead"])
async def test_a_snapshot_that_does_not_match_is_ignored(
    store: EventStore, raw: Raw, flaw: str
) -> None:
    log, seq, full = await prepared(store, raw)
    state = await truth(store, "r1", seq)
    state.agent_name = "doctored"
    blob = snapshots.encode(state)
    fmt = snapshots.FORMAT
    if flaw == "format":
        fmt = "0.older-code"
    elif flaw == "seq":
        seq -= 1  # the row says one seq, the state another
    elif flaw == "run":
        state.run_id = RunId("r2")
        blob = snapshots.encode(state)
    elif flaw == "ahead":  # a snapshot past the end of the log
        seq = state.seq = full.seq + 5
        blob = snapshots.encode(state)
    elif flaw == "garbage":
        blob = b'{"run_id": "r1", "seq": '
    elif flaw == "cut":  # a compressed snapshot that lost its end
        blob = zlib.compress(blob)[:-4]
    else:
        blob = blob.replace(b'"messages":[', b'"messages":[7,')
    raw.put_snapshot("r1", seq, fmt, blob)
    assert await load_state(store, log.run_id) == full


async def test_a_corrupt_event_after_the_snapshot_stops_the_load_with_run_and_seq(
    store: EventStore, raw: Raw
) -> None:
    log, seq, _ = await prepared(store, raw)
    raw.corrupt_event("r1", seq + 1)
    with pytest.raises(EventDecodeError) as caught:
        await load_state(store, log.run_id)
    assert (caught.value.run_id, caught.value.seq) == ("r1", seq + 1)


async def test_an_unknown_event_version_after_the_snapshot_stops_the_load(
    store: EventStore, raw: Raw
) -> None:
    log, _, _ = await prepared(store, raw)
    newer = log.make(ev.UserMessageAdded, content="from the future")
    raw.execute(
        "INSERT INTO events (run_id, seq, type, schema_version, occurred_at, payload)"
        " VALUES (?, ?, ?, ?, ?, ?)",
        (
            "r1",
            newer.seq,
            newer.type,
            99,
            T0 if raw.postgres else T0.isoformat(),
            codec.encode(newer),
        ),
    )
    with pytest.raises(EventDecodeError, match="schema version 99") as caught:
        await load_state(store, log.run_id)
    assert (caught.value.run_id, caught.value.seq) == ("r1", newer.seq)


# -- other writers --------------------------------------------------------------------------


async def test_a_run_resumed_by_another_store_is_snapshotted_from_the_log(
    backend_url: str, raw: Raw
) -> None:
    log = Log("r1")
    batches = list(log.batches(rounds=10))
    half = len(batches) // 3
    first = open_store(backend_url)
    await write(first, batches[:half])  # it dies: never closed, so nothing more is written
    second = open_store(backend_url)
    try:
        await write(second, batches[half:])

        async def caught_up() -> bool:
            snap = raw.snapshot("r1")
            return snap is not None and snap[0] > log.seq - snapshots.EVERY - 60

        await eventually(caught_up)
        await assert_snapshot_is_the_fold(second, raw, "r1")
        assert await load_state(second, log.run_id) == await truth(second, "r1")
    finally:
        await second.close()
        await first.close()


async def test_two_stores_writing_one_run_in_turns_snapshot_only_the_truth(
    backend_url: str, raw: Raw
) -> None:
    log = Log("r1")
    stores = [open_store(backend_url), open_store(backend_url)]
    try:
        for i, batch in enumerate(log.batches(rounds=8)):
            await write(stores[(i // 3) % 2], [batch])
        for s in stores:
            assert await load_state(s, log.run_id) == await truth(s, "r1")
    finally:
        for s in stores:
            await s.close()
    await assert_snapshot_is_the_fold_in(backend_url, raw, "r1")


# -- through the runtime --------------------------------------------------------------------


async def echo(text: str) -> str:
    """Return the text unchanged."""
    return text


async def test_the_runtime_loads_a_long_run_from_its_snapshot(tmp_path: Path) -> None:
    turns = 150
    steps: list[Any] = [call_tool("echo", {"text": f"turn {i}"}) for i in range(turns)]
    agent = Agent(
        name="echoer",
        model=ScriptedModel([*steps, reply("done")]),
        tools=[echo],
        budget=Budget(max_turns=turns + 1),
    )
    db = tmp_path / "runs.db"
    async with Runtime(str(db)) as rt:
        result = await rt.run(agent, "go")
    assert result.ok
    conn = sqlite3.connect(db)
    (seq,) = conn.execute("SELECT seq FROM snapshots WHERE run_id = ?", (result.run_id,)).fetchone()
    conn.close()
    async with Runtime(str(db)) as rt:
        events = await rt.events(result.run_id)
        # The run ended: its snapshot is the driver's fold just before its last commit
        # (its output and its end), not the log read back.
        assert [e.type for e in events[seq:]] == ["artifact_recorded", "run_completed"]
        state = await rt.state(result.run_id)
        assert state == fold(events, result.run_id)
        assert state.turns == turns + 1 and state.status is RunStatus.COMPLETED
