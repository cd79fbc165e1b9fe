"""SIGKILL a real process after each append to any log of a routed workflow (the workflow's
and its children's: a fan-out of 2 agent nodes, a code reduce, a route to an agent node or a
code node, a join), resume it in a fresh process: every code node, route predicate and child
model turn ran exactly once across both processes, the branch not taken never ran, and the
output equals a clean run's.

The fan-out runs one child at a time here, so that no model call is in flight when the process
dies: each kill point falls between a recorded step and the next one.
"""

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

FLOW = "tests/graph/crash_targets.py:orders"
INPUT = '{"items": ["chair", "desk"]}'
APPENDS_IN_A_CLEAN_RUN = 26
"""To every log: the workflow's 12 appends and each of its 3 child runs' own."""
CHILDREN = ["run_w.price.0", "run_w.price.1", "run_w.review"]


def kill_after(db: Path, n: int, log_dir: Path) -> subprocess.CompletedProcess[str]:
    return crashes.kill_after(db, "run_w", n, FLOW, INPUT, log_dir)


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory) -> RunState:
    base = tmp_path_factory.mktemp("clean")
    done = kill_after(base / "runs.db", 0, base)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) == APPENDS_IN_A_CLEAN_RUN
    runs = states(base / "runs.db")
    assert sorted(runs) == sorted(["run_w", *CHILDREN])
    assert runs["run_w"].nodes["total"].route == "review"
    return runs["run_w"]


@pytest.mark.parametrize("n", range(1, APPENDS_IN_A_CLEAN_RUN + 1))
def test_a_routed_workflow_killed_after_any_append_runs_every_step_once(
    tmp_path: Path, clean: RunState, n: int
) -> None:
    db = tmp_path / "runs.db"
    killed = kill_after(db, n, tmp_path)
    assert killed.returncode == -signal.SIGKILL, killed.stderr

    resumed = resume(db, "run_w", tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout)["status"] == "completed"

    after = states(db)
    assert sorted(after) == sorted(["run_w", *CHILDREN])  # no child twice, none off the route
    flow = after["run_w"]
    assert flow.status is RunStatus.COMPLETED
    assert flow.structured_output == clean.structured_output == {"approved": True, "by": "reviewer"}
    assert {k: (v.output, v.route) for k, v in flow.nodes.items()} == {
        k: (v.output, v.route) for k, v in clean.nodes.items()
    }
    assert "approve" not in flow.nodes  # the branch not taken never started
    # Across both processes: each child's model was asked once, the reduce ran once, the route
    # was decided once, and the code node off the route never ran.
    asked = Counter(str(r["run_id"]) for r in lines(tmp_path / "model.jsonl"))
    assert asked == Counter(CHILDREN)
    assert all(after[c].turns == 1 for c in CHILDREN)
    assert Counter(str(r["node"]) for r in lines(tmp_path / "code.jsonl")) == {"total": 1}
    assert len(lines(tmp_path / "route.jsonl")) == 1
