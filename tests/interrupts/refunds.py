"""A refund tool over a real SQLite ledger that honours idempotency keys, and the policy used by
the approval tests (also imported by the child processes of the crash test).

The ledger path comes from REFUND_LEDGER, read per call. With REFUND_HANG_AFTER_COMMIT set to a
path, the tool writes that file after its refund is committed and then hangs, so a test can
SIGKILL the process between the effect and its record.
"""

from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path
from typing import Any

from contextos import Agent, ToolContext, tool
from contextos.policy import Decision, Policy, Rule
from contextos.policy.rules import conditions
from contextos.testing import ScriptedModel, call_tool, reply

SCHEMA = (
    "CREATE TABLE IF NOT EXISTS refunds (key TEXT PRIMARY KEY, order_id TEXT, amount REAL);"
    "CREATE TABLE IF NOT EXISTS attempts (n INTEGER PRIMARY KEY AUTOINCREMENT, key TEXT);"
)


def _db() -> sqlite3.Connection:
    conn = sqlite3.connect(os.environ["REFUND_LEDGER"], timeout=30, isolation_level=None)
    conn.executescript(SCHEMA)
    return conn


def ledger(path: Path) -> tuple[list[tuple[str, str, float]], int]:
    """(refunds made, times the tool body ran)."""
    conn = sqlite3.connect(path)
    conn.executescript(SCHEMA)
    try:
        rows = conn.execute("SELECT key, order_id, amount FROM refunds ORDER BY key").fetchall()
        attempts = conn.execute("SELECT COUNT(*) FROM attempts").fetchone()[0]
        return [(str(k), str(o), float(a)) for k, o, a in rows], int(attempts)
    finally:
        conn.close()


def find_refund(key: str) -> dict[str, Any] | None:
    conn = _db()
    try:
        row = conn.execute("SELECT order_id, amount FROM refunds WHERE key = ?", (key,)).fetchone()
    finally:
        conn.close()
    return None if row is None else {"refunded": row[1], "order_id": row[0], "key": key}


@tool(
    effect="irreversible",
    risk="high",
    scopes=("payments:refund",),
    reconcile=find_refund,
    description="Refund an amount in EUR on an order.",
)
def refund(order_id: str, amount: float, ctx: ToolContext) -> dict[str, Any]:
    key = ctx.idempotency_key or ""
    conn = _db()
    try:
        conn.execute("INSERT INTO attempts (key) VALUES (?)", (key,))
        conn.execute(
            "INSERT OR IGNORE INTO refunds (key, order_id, amount) VALUES (?, ?, ?)",
            (key, order_id, amount),
        )
    finally:
        conn.close()
    hang = os.environ.get("REFUND_HANG_AFTER_COMMIT")
    if hang:
        Path(hang).write_text("committed")
        time.sleep(3600)
    return {"refunded": amount, "order_id": order_id}


POLICY = Policy(
    name="refunds",
    version="1",
    rules=(
        Rule(
            id="refund-over-100",
            tools=("refund",),
            decision=Decision.REQUIRE_APPROVAL,
            approver_role="finance",
            when=conditions({"amount": {"gt": 100}}),
            reason="refunds over 100 EUR need a finance approver",
            preview="Refund {amount} EUR on order {order_id}",
            blast_radius="irreversible: 1 payment of {amount} EUR leaves the company",
        ),
        Rule(
            id="refund-ceiling",
            tools=("refund",),
            decision=Decision.DENY,
            absolute=True,
            when=conditions({"amount": {"gt": 10_000}}),
            reason="no refund above 10000 EUR, whoever approves",
        ),
    ),
    roles={"finance": ("alice",), "cfo": ("carol",)},
)


def refund_agent(*amounts: float, name: str = "refunder") -> Agent:
    """An agent that asks for one refund per amount, one turn each, then answers."""
    steps = [
        call_tool("refund", {"order_id": f"A-{i}", "amount": a}) for i, a in enumerate(amounts)
    ]
    return Agent(
        name=name,
        model=ScriptedModel([*steps, reply("Done.")], by_turn=True),
        tools=[refund],
        instructions="Refund what the customer asks for.",
    )


agent = refund_agent(500)
"""For the crash test's child processes: one refund over the threshold."""
