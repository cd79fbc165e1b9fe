"""Ordered schema migrations per backend: the list index (from 1) is the schema version.

Never edit a released entry; append a new one.
"""

from __future__ import annotations

_TERMINAL = "('completed', 'failed', 'cancelled', 'expired')"

SQLITE_MIGRATIONS: list[str] = [
    # 1: runs and their append-only event logs; terminal runs are frozen by the database itself.
    f"""
CREATE TABLE runs (
    run_id TEXT PRIMARY KEY,
    agent_name TEXT NOT NULL,
    agent_version TEXT NOT NULL,
    status TEXT NOT NULL,
    last_seq INTEGER NOT NULL,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    turns INTEGER NOT NULL DEFAULT 0,
    input_tokens INTEGER NOT NULL DEFAULT 0,
    output_tokens INTEGER NOT NULL DEFAULT 0,
    cost_usd REAL NOT NULL DEFAULT 0
);
CREATE INDEX runs_by_status ON runs (status, updated_at);
CREATE INDEX runs_by_update ON runs (updated_at);
CREATE TABLE events (
    run_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    type TEXT NOT NULL,
    schema_version INTEGER NOT NULL,
    occurred_at TEXT NOT NULL,
    payload BLOB NOT NULL,
    PRIMARY KEY (run_id, seq)
) WITHOUT ROWID;
CREATE TRIGGER events_are_append_only_u BEFORE UPDATE ON events
BEGIN SELECT RAISE(ABORT, 'events are append-only'); END;
CREATE TRIGGER events_are_append_only_d BEFORE DELETE ON events
BEGIN SELECT RAISE(ABORT, 'events are append-only'); END;
CREATE TRIGGER terminal_run_takes_no_events BEFORE INSERT ON events
WHEN (SELECT status FROM runs WHERE run_id = NEW.run_id) IN {_TERMINAL}
BEGIN SELECT RAISE(ABORT, 'run is terminal'); END;
CREATE TRIGGER terminal_run_status_is_final BEFORE UPDATE OF status ON runs
WHEN OLD.status IN {_TERMINAL}
BEGIN SELECT RAISE(ABORT, 'run is terminal'); END;
""",
]
