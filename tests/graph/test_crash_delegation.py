"""SIGKILL a real process at every append of an agent run that delegates (the parent's and its
child's), resume the parent in a fresh process: the child is resumed, never started again, and
nothing recorded is requested or executed twice."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from contextos.state import RunState, fold
from contextos.store import SqliteStore

ROOT = Path(__file__).resolve().parents[2]
KILLER = ROOT / "tests" / "graph" / "kill_after.py"
PLANNER = "tests/graph/crash_targets.py:planner"
APPENDS_IN_A_CLEAN_RUN = 14
"""The parent's and the child's, together."""


def env(log_dir: Path) -> dict[str, str]:
    return {**os.environ, "CRASH_LOG_DIR": str(log_dir), "NO_COLOR": "1"}


def kill_after(db: Path, n: int, log_dir: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(KILLER), str(db), "run_p", str(n), PLANNER, "Are they shipped?"],
        cwd=ROOT,
        env=env(log_dir),
        capture_output=True,
        text=True,
        timeout=60,
    )


def resume(db: Path, log_dir: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "contextos", "resume", "run_p", "--store", str(db), "--json"],
        cwd=ROOT,
        env=env(log_dir),
        capture_output=True,
        text=True,
        timeout=60,
    )


def load(db: Path) -> tuple[RunState, list[str]]:
    async def read() -> tuple[RunState, list[str]]:
        store = SqliteStore(db)
        try:
            runs = [r.run_id for r in await store.list_runs(limit=100)]
            return fold(await store.read("run_p")), sorted(runs)  # type: ignore[arg-type]
        finally:
            await store.close()

    return asyncio.run(read())


def lines(path: Path) -> list[dict[str, object]]:
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory) -> RunState:
    base = tmp_path_factory.mktemp("clean")
    done = kill_after(base / "runs.db", 0, base)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) == APPENDS_IN_A_CLEAN_RUN
    state, _ = load(base / "runs.db")
    return state


@pytest.mark.parametrize("n", range(1, APPENDS_IN_A_CLEAN_RUN + 1))
def test_a_parent_killed_at_any_append_resumes_its_child_and_never_restarts_it(
    tmp_path: Path, clean: RunState, n: int
) -> None:
    db = tmp_path / "runs.db"
    killed = kill_after(db, n, tmp_path)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    resumed = resume(db, tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout)["status"] == "completed"

    state, runs = load(db)
    assert runs == ["run_p", "run_p.call_1_0"]  # one child, whatever the crash
    assert state.output == clean.output
    (child,) = state.children.values()
    (clean_child,) = clean.children.values()
    assert (child.status, child.result, child.turns) == (
        clean_child.status,
        clean_child.result,
        clean_child.turns,
    )
    # every model turn of either run was requested once, across both processes
    turns = Counter((r["run_id"], r["turn"]) for r in lines(tmp_path / "model.jsonl"))
    assert turns == Counter(
        {("run_p", 1): 1, ("run_p", 2): 1, **{("run_p.call_1_0", t): 1 for t in (1, 2, 3)}}
    )
    calls = Counter((r["tool"], r["arg"]) for r in lines(tmp_path / "tools.jsonl"))
    assert calls == Counter({("lookup", "A-1"): 1, ("lookup", "B-2"): 1})
