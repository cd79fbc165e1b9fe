"""SIGKILL a real process after each append to a workflow's log (a fan-out of 3 agent nodes, a
code reduce, a gate over 10 items run by a verifier agent, a synthesis agent), resume it in a
fresh process: no child run is started twice, nothing recorded is requested or run again, and
the output equals a clean run's."""

from __future__ import annotations

import json
import signal
import subprocess
from collections import Counter
from pathlib import Path

import pytest

from contextos.runs import RunStatus
from contextos.state import RunState
from support import crashes
from support.crashes import lines, resume, states

FLOW = "tests/graph/crash_targets.py:scan"
INPUT = '{"folders": ["docs", "blog", "wiki"]}'
APPENDS_IN_A_CLEAN_RUN = 21
"""To the workflow's own log: its nodes, and its 14 child runs started and finished (what
siblings record at the same moment goes into one append)."""
CHILDREN = [
    *(f"run_w.scan.{i}" for i in range(3)),
    *(f"run_w.recheck.{i}" for i in range(10)),
    "run_w.report",
]


def kill_after(db: Path, n: int, log_dir: Path) -> subprocess.CompletedProcess[str]:
    return crashes.kill_after(db, "run_w", n, FLOW, INPUT, log_dir, count="own")


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory) -> RunState:
    base = tmp_path_factory.mktemp("clean")
    done = kill_after(base / "runs.db", 0, base)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) == APPENDS_IN_A_CLEAN_RUN
    runs = states(base / "runs.db")
    assert sorted(runs) == sorted(["run_w", *CHILDREN])
    return runs["run_w"]


@pytest.mark.parametrize("n", range(1, APPENDS_IN_A_CLEAN_RUN + 1))
def test_a_workflow_killed_after_any_node_level_append_resumes_without_rerunning_anything(
    tmp_path: Path, clean: RunState, n: int
) -> None:
    db = tmp_path / "runs.db"
    killed = kill_after(db, n, tmp_path)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    before = states(db)
    recorded = {rid: s.turns for rid, s in before.items()}
    finished_nodes = {
        name for name, node in before["run_w"].nodes.items() if node.status == "completed"
    }
    first_pid = {r["pid"] for r in lines(tmp_path / "model.jsonl")}

    resumed = resume(db, "run_w", tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout)["status"] == "completed"

    after = states(db)
    assert sorted(after) == sorted(["run_w", *CHILDREN])  # no child run started twice
    flow = after["run_w"]
    assert flow.status is RunStatus.COMPLETED
    assert flow.structured_output == clean.structured_output
    assert {n: node.output for n, node in flow.nodes.items()} == {
        n: node.output for n, node in clean.nodes.items()
    }
    # A model turn recorded before the kill is never requested again; every child made its
    # one turn; the resumed process asked only for what was not recorded.
    requests = lines(tmp_path / "model.jsonl")
    again = Counter(r["run_id"] for r in requests if r["pid"] not in first_pid)
    for run_id in CHILDREN:
        assert after[run_id].turns == 1, run_id
        assert again[run_id] == (0 if recorded.get(run_id, 0) >= 1 else 1), run_id
    # The code node ran once, and never again once its output was recorded.
    dedup = Counter(r["pid"] for r in lines(tmp_path / "code.jsonl"))
    assert sum(dedup.values()) == 1
    if "dedup" in finished_nodes:
        assert set(dedup) <= first_pid
