"""SQLite store: the statements every append runs, with the guard triggers they fire, build no
temporary b-tree (SQLite makes one for each IN list of more than two constants, at every
execution, and on the append path that cost more than the rest of the statement)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from contextos.store.sqlite import _MOVE_SUMMARY, migrate

INSERT_EVENT = (
    "INSERT INTO events (run_id, seq, type, schema_version, occurred_at, payload)"
    " VALUES ('r1', 2, 'model_responded', 1, '2026-01-01T00:00:00+00:00', x'7b7d')"
)
END_RUN = "UPDATE runs SET status = 'completed' WHERE run_id = 'r1'"


def temporary_btrees(conn: sqlite3.Connection, sql: str, parameters: tuple[object, ...]) -> int:
    """How many ephemeral tables the statement's program (its triggers' included) opens."""
    return sum(1 for op in conn.execute(f"EXPLAIN {sql}", parameters) if op[1] == "OpenEphemeral")


def test_an_append_and_a_run_ending_build_no_temporary_btree(tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / "s.db", isolation_level=None)
    migrate(conn)
    move = (2, "2026-01-01T00:00:00+00:00", None, 1, 10, 2, 0.0, "r1", 1)
    assert temporary_btrees(conn, INSERT_EVENT, ()) == 0  # terminal_run_takes_no_events, usage
    assert temporary_btrees(conn, _MOVE_SUMMARY, move) == 0  # the fence, terminal_run_is_final
    assert temporary_btrees(conn, END_RUN, ()) == 0  # trigger_firings_on_end
    conn.close()


def test_the_rewritten_guards_still_hold(tmp_path: Path) -> None:
    """The guards keep their meaning: an ended run takes no event and no change, and its
    ending owes the firing of a trigger watching its agent, once."""
    conn = sqlite3.connect(tmp_path / "s.db", isolation_level=None)
    migrate(conn)
    conn.execute(
        "INSERT INTO runs (run_id, agent_name, agent_version, status, last_seq, created_at,"
        " updated_at) VALUES ('r1', 'writer', '1', 'running', 1, 'x', 'x')"
    )
    conn.execute(
        "INSERT INTO triggers (name, kind, agent_ref, agent_name, source_agent, on_status,"
        " created_at) VALUES ('review', 'run', 'm:a', 'reviewer', 'writer', 'completed', 0)"
    )
    conn.execute(INSERT_EVENT)
    moved = conn.execute(_MOVE_SUMMARY, (2, "y", "completed", 0, 0, 0, 0.0, "r1", 1)).rowcount
    assert moved == 1
    assert conn.execute("SELECT trigger_name, status FROM trigger_firings").fetchall() == [
        ("review", "completed")
    ]
    for refused in (
        INSERT_EVENT.replace("2, 'model_responded'", "3, 'note_added'"),
        "UPDATE runs SET updated_at = 'z' WHERE run_id = 'r1'",
    ):
        with pytest.raises(sqlite3.IntegrityError, match="run is terminal"):
            conn.execute(refused)
    # The fence refuses to move an ended run's row: nothing moves, nothing is raised.
    assert conn.execute(_MOVE_SUMMARY, (3, "y", None, 0, 0, 0, 0.0, "r1", 2)).rowcount == 0
    conn.close()
