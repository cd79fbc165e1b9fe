"""SIGKILL a real process at every append of an agent run that delegates (the parent's and its
child's), resume the parent in a fresh process: the child is resumed, never started again, and
nothing recorded is requested or executed twice."""

from __future__ import annotations

import json
import signal
import subprocess
from collections import Counter
from pathlib import Path

import pytest

from contextos.state import RunState
from support import crashes
from support.crashes import lines, resume, states

PLANNER = "tests/graph/crash_targets.py:planner"
APPENDS_IN_A_CLEAN_RUN = 14
"""The parent's and the child's, together."""


def kill_after(db: Path, n: int, log_dir: Path) -> subprocess.CompletedProcess[str]:
    return crashes.kill_after(db, "run_p", n, PLANNER, "Are they shipped?", log_dir, timeout_s=60)


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory) -> RunState:
    base = tmp_path_factory.mktemp("clean")
    done = kill_after(base / "runs.db", 0, base)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) == APPENDS_IN_A_CLEAN_RUN
    return states(base / "runs.db")["run_p"]


@pytest.mark.parametrize("n", range(1, APPENDS_IN_A_CLEAN_RUN + 1))
def test_a_parent_killed_at_any_append_resumes_its_child_and_never_restarts_it(
    tmp_path: Path, clean: RunState, n: int
) -> None:
    db = tmp_path / "runs.db"
    killed = kill_after(db, n, tmp_path)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    resumed = resume(db, "run_p", tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout)["status"] == "completed"

    runs = states(db)
    assert sorted(runs) == ["run_p", "run_p.call_1_0"]  # one child, whatever the crash
    state = runs["run_p"]
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
