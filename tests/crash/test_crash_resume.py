"""SIGKILL a real worker process at every step of a multi-turn run with tools, resume in a
fresh process, and check nothing recorded was requested or executed again."""

from __future__ import annotations

import json
import random
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from contextos.events import RunStarted, RuntimeCrashDetected
from contextos.state import RunState, fold
from contextos.store import SqliteStore
from support.crashes import crash_env, kill_after, lines, resume
from support.processes import ROOT

AGENT = "tests/crash/crash_agent.py:agent"
APPENDS_IN_A_CLEAN_RUN = 10
"""The two reads of turn 2 run together: their results are recorded in one append."""
EVENTS_IN_A_CLEAN_RUN = 14
"""The appends plus what shares an append with another event: the second read's result, two
verdicts (evaluations, in the appends of the answers' verification) and the output artifact
(with the completion)."""
EXPECTED_TOOL_CALLS = Counter({("lookup", "A-1"): 1, ("stock", "SKU-9"): 1, ("lookup", "B-2"): 1})


def child(
    db: Path, run_id: str, kill_after_n: int, log_dir: Path
) -> subprocess.CompletedProcess[str]:
    return kill_after(db, run_id, kill_after_n, AGENT, "Where are A-1 and B-2?", log_dir)


def run_exists(db: Path) -> bool:
    if not db.exists():
        return False
    conn = sqlite3.connect(db)
    try:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
        if "runs" not in tables:
            return False
        return conn.execute("SELECT 1 FROM runs WHERE run_id = 'run_r'").fetchone() is not None
    finally:
        conn.close()


def load(db: Path, run_id: str) -> tuple[RunState, list[object]]:
    import asyncio

    async def _read() -> list[object]:
        store = SqliteStore(db)
        try:
            return list(await store.read(run_id))  # type: ignore[arg-type]
        finally:
            await store.close()

    events = asyncio.run(_read())
    return fold(events), events  # type: ignore[arg-type]


def transcript(state: RunState) -> list[tuple[str, str, tuple[tuple[str, str], ...]]]:
    return [
        (m.role, m.content, tuple((c.name, c.arguments) for c in m.tool_calls))
        for m in state.messages
    ]


@pytest.fixture(scope="module")
def clean_run(tmp_path_factory: pytest.TempPathFactory) -> RunState:
    base = tmp_path_factory.mktemp("clean")
    done = child(base / "runs.db", "run_clean", 0, base)
    assert done.returncode == 0, done.stderr
    state, events = load(base / "runs.db", "run_clean")
    assert len(events) == EVENTS_IN_A_CLEAN_RUN
    return state


@pytest.mark.parametrize("kill_after", range(1, APPENDS_IN_A_CLEAN_RUN + 1))
def test_kill_after_each_append_then_resume(
    tmp_path: Path, clean_run: RunState, kill_after: int
) -> None:
    db = tmp_path / "runs.db"
    killed = child(db, "run_k", kill_after, tmp_path)
    assert killed.returncode == -signal.SIGKILL, killed.stderr

    resumed = resume(db, "run_k", tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout)["status"] == "completed"

    state, events = load(db, "run_k")
    assert state.status == clean_run.status
    assert state.output == clean_run.output
    assert transcript(state) == transcript(clean_run)
    assert state.usage == clean_run.usage

    # Every model turn was requested exactly once across both processes.
    turns = Counter(r["turn"] for r in lines(tmp_path / "model.jsonl"))
    assert turns == Counter({1: 1, 2: 1, 3: 1, 4: 1})
    # Every tool call ran exactly once.
    calls = Counter((r["tool"], r["arg"]) for r in lines(tmp_path / "tools.jsonl"))
    assert calls == EXPECTED_TOOL_CALLS

    crash_noticed = any(isinstance(e, RuntimeCrashDetected) for e in events)
    assert crash_noticed == (2 <= kill_after < APPENDS_IN_A_CLEAN_RUN)
    if crash_noticed:
        assert any(isinstance(e, RunStarted) and e.recovered for e in events)


@pytest.mark.slow
def test_random_sigkills_from_outside(tmp_path: Path, clean_run: RunState) -> None:
    """Kill the real CLI at random moments (tools and model are slowed to widen the windows)."""
    rng = random.Random(7)
    slow = {"CRASH_DELAY_S": "0.2"}
    total_kills = 0
    for i in range(8):
        kills = 0
        log_dir = tmp_path / f"r{i}"
        log_dir.mkdir()
        db = log_dir / "runs.db"
        cmd = [
            sys.executable,
            "-m",
            "contextos",
            "run",
            "tests/crash/crash_agent.py:agent",
            "Where are A-1 and B-2?",
            "--run-id",
            "run_r",
            "--store",
            str(db),
            "--json",
        ]
        resume_cmd = [
            sys.executable,
            "-m",
            "contextos",
            "resume",
            "run_r",
            "--store",
            str(db),
            "--json",
        ]
        for _ in range(4):
            proc = subprocess.Popen(
                resume_cmd if run_exists(db) else cmd,
                cwd=ROOT,
                env=crash_env(log_dir, **slow),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
            time.sleep(rng.uniform(0.3, 1.5))
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
                kills += 1
            proc.wait()
        final = subprocess.run(
            resume_cmd if run_exists(db) else cmd,
            cwd=ROOT,
            env=crash_env(log_dir),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert final.returncode == 0, final.stderr
        state, _ = load(db, "run_r")
        assert transcript(state) == transcript(clean_run)
        # A request is repeated only when its process died before the answer was recorded:
        # never more than once per kill, and never for a turn answered in a live process.
        turns = Counter(r["turn"] for r in lines(log_dir / "model.jsonl"))
        assert set(turns) == {1, 2, 3, 4}
        assert sum(turns.values()) - 4 <= kills
        total_kills += kills
    assert total_kills >= 8, total_kills
