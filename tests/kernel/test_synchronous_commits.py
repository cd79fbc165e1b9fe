"""Commits that nothing with an effect depends on do not wait for the disk; a later one flushes
them.

A model's answer, a read's policy decision and a write's proposal are each followed by a
synchronous commit before anything with an effect leaves the process (a write's dispatch is
recorded before it is sent), so a power loss in between only means asking or deciding again.
Each is still committed before what follows it: a crash of the process loses none of them.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from contextos import Agent, RunStatus, Runtime, tool
from contextos import events as ev
from contextos.runs import RunId
from contextos.store import SqliteStore
from contextos.testing import ScriptedModel, call_tool, reply


@tool
def lookup(order: str) -> str:
    """Look an order up."""
    return f"{order}: shipped"


SENT: list[bool] = []
"""For each refund sent: whether every commit before it had reached the disk."""


@tool(effect="write")
def refund(order: str) -> str:
    """Refund an order."""
    SENT.append(STORES[-1].appends[-1][1])
    return f"refunded {order}"


POLICY = """\
name = "shop"
version = "1"
default = "deny"

[[rules]]
id = "lookups-and-refunds"
tools = ["lookup", "refund"]
decision = "allow"
"""


STORES: list[RecordingStore] = []


class RecordingStore(SqliteStore):
    """A SQLite store that notes, per append, its event types and whether it was synchronous."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.appends: list[tuple[list[str], bool]] = []
        STORES.append(self)

    async def append(
        self,
        run_id: RunId,
        events: Sequence[ev.Event],
        *,
        expected_seq: int,
        synchronous: bool = True,
        **options: Any,
    ) -> int:
        seq = await super().append(
            run_id, events, expected_seq=expected_seq, synchronous=synchronous, **options
        )
        self.appends.append(([e.type for e in events], synchronous))
        return seq


async def refund_run(tmp_path: Path, policy: Path | None = None) -> RecordingStore:
    store = RecordingStore(tmp_path / "runs.db")
    model = ScriptedModel(
        [
            call_tool("lookup", {"order": "A-1"}),
            call_tool("refund", {"order": "A-1"}),
            reply("A-1 was refunded."),
        ]
    )
    SENT.clear()
    async with Runtime(store, policy=policy) as rt:
        result = await rt.run(Agent(name="a", model=model, tools=[lookup, refund]), "Refund A-1")
    assert result.status is RunStatus.COMPLETED
    return store


async def test_answers_skip_the_fsync_and_the_next_commit_flushes_them(tmp_path: Path) -> None:
    store = await refund_run(tmp_path)
    answers = [sync for types, sync in store.appends if "model_responded" in types]
    assert answers == [False, False, False]
    assert SENT == [True]  # the refund left only once all before it was on disk
    assert store.appends[-1][1] is True


async def test_a_reads_decision_and_a_writes_proposal_skip_the_fsync_before_the_call(
    tmp_path: Path,
) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text(POLICY)
    store = await refund_run(tmp_path, policy)
    decided = [i for i, (types, _) in enumerate(store.appends) if "policy_decided" in types]
    read, proposal = (store.appends[i] for i in decided)
    assert read == (["policy_decided"], False)
    assert store.appends[decided[0] + 1] == (["tool_completed"], True)  # the read's result
    assert proposal[0][0] == "effect_proposed" and proposal[1] is False
    assert store.appends[decided[1] + 1] == (["effect_changed"], True)  # the dispatch
    assert SENT == [True]
    assert store.appends[-1][1] is True


async def test_the_store_goes_back_to_full_sync_after_an_unsynchronous_commit(
    tmp_path: Path,
) -> None:
    db = tmp_path / "runs.db"
    store = RecordingStore(db)
    model = ScriptedModel([call_tool("lookup", {"order": "A-1"}), reply("shipped")])
    async with Runtime(store) as rt:
        result = await rt.run(Agent(name="a", model=model, tools=[lookup]), "Where is A-1?")
        assert any(not sync for _, sync in store.appends)  # the connection did skip an fsync
        conn = rt.store._conn  # type: ignore[attr-defined]
        assert conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    # Committed and readable by anyone, like any other commit.
    other = sqlite3.connect(db)
    types = [r[0] for r in other.execute("SELECT type FROM events ORDER BY seq")]
    other.close()
    assert result.status is RunStatus.COMPLETED
    assert types.count("model_responded") == 2
