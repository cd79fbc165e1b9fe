"""The physical floor: the same durable appends with nothing but `sqlite3`.

Same settings as the ContextOS store (WAL, synchronous=FULL, autocommit off, explicit
transactions); each append writes one row of the size ContextOS writes per event.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from bench.common import MESSAGE, cpu, disk_bytes, now

PAYLOAD = (MESSAGE * 3).encode()[:480]
"""About the size of one encoded ContextOS turn event."""


def turns(db: str, n: int, per_commit: int = 1, warmup: bool = True) -> dict[str, Any]:
    """`n` turns of 2 appends; `per_commit` appends per transaction (1 or 2)."""
    conn = sqlite3.connect(Path(db), isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute(
        "CREATE TABLE events (run_id TEXT NOT NULL, seq INTEGER NOT NULL, payload BLOB NOT NULL,"
        " PRIMARY KEY (run_id, seq)) WITHOUT ROWID"
    )
    seq = 0

    def append(k: int) -> None:
        nonlocal seq
        conn.execute("BEGIN IMMEDIATE")
        for _ in range(k):
            seq += 1
            conn.execute("INSERT INTO events VALUES (?, ?, ?)", ("run", seq, PAYLOAD))
        conn.execute("COMMIT")

    if warmup:
        for _ in range(5):
            append(1)
    started, cpu_started = now(), cpu()
    for _ in range(n):
        if per_commit == 2:
            append(2)
        else:
            append(1)
            append(1)
    elapsed, used = now() - started, cpu() - cpu_started
    conn.close()
    return {
        "elapsed_s": elapsed,
        "per_turn_us": elapsed / n * 1e6,
        "cpu_per_turn_us": used / n * 1e6,
        "bytes": disk_bytes(Path(db)),
    }
