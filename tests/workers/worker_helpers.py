"""Helpers for the worker tests: the chaos tool's tables, and reading event logs."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from contextos import events as ev

AGENTS = "tests/workers/agents.py"


def create_effect_tables(conn: Any) -> None:
    """`effect_attempts`: every execution of the chaos tool; `effects`: what the provider did.

    `effects` has no unique key on purpose: a call executed twice would leave two rows.
    """
    conn.execute(
        "CREATE TABLE effect_attempts (key TEXT NOT NULL, run_id TEXT NOT NULL,"
        " call_id TEXT NOT NULL, pid INTEGER NOT NULL)"
    )
    conn.execute(
        "CREATE TABLE effects (key TEXT NOT NULL, run_id TEXT NOT NULL, call_id TEXT NOT NULL,"
        " step INTEGER NOT NULL, pid INTEGER NOT NULL)"
    )


def overlapping_writers(events: Sequence[ev.Event]) -> list[str]:
    """Events a worker wrote after another worker had started the run: two at once.

    After `RunStarted(worker=W)`, every event written by a worker must be W's until the next
    RunStarted; anything else means two workers drove the run at the same time.
    """
    problems: list[str] = []
    owner: str | None = None
    for e in events:
        if isinstance(e, ev.RunStarted):
            owner = e.worker_id
        if e.actor.startswith("worker:") and isinstance(e, ev.RuntimeCrashDetected):
            continue  # written by the new worker just before its RunStarted
        if e.actor.startswith("worker:") and e.actor != f"worker:{owner}":
            problems.append(f"{e.run_id} #{e.seq} {e.type} by {e.actor}, but {owner} had it")
    return problems
