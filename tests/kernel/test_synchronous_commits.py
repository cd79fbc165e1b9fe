"""A model's answer is committed without waiting for the disk; the next step's commit flushes it.

Nothing leaves the process between the two (a write's effect is recorded before dispatch, a
read's result after it), so one fsync per turn gives the same guarantee as two.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from itertools import pairwise
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


@tool(effect="write")
def refund(order: str) -> str:
    """Refund an order."""
    return f"refunded {order}"


class RecordingStore(SqliteStore):
    """A SQLite store that notes, per append, its event types and whether it was synchronous."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.appends: list[tuple[list[str], bool]] = []

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


async def test_answers_skip_the_fsync_and_the_next_commit_flushes_them(tmp_path: Path) -> None:
    store = RecordingStore(tmp_path / "runs.db")
    model = ScriptedModel(
        [
            call_tool("lookup", {"order": "A-1"}),
            call_tool("refund", {"order": "A-1"}),
            reply("A-1 was refunded."),
        ]
    )
    async with Runtime(store) as rt:
        result = await rt.run(Agent(name="a", model=model, tools=[lookup, refund]), "Refund A-1")
    assert result.status is RunStatus.COMPLETED
    answers = [sync for types, sync in store.appends if "model_responded" in types]
    assert answers == [False, False, False]
    # Every unsynchronous commit is followed by a synchronous one, and the run ends on one.
    flags = [sync for _, sync in store.appends]
    assert flags[-1] is True
    assert all(a or b for a, b in pairwise(flags))


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
