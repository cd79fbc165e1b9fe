"""The loop from the command line: each step's command, and users' mistakes as one line."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from test_improvement_loop import REF

ROOT = Path(__file__).resolve().parents[2]


def cli_for(tmp_path: Path) -> Callable[..., subprocess.CompletedProcess[str]]:
    db = str(tmp_path / "c.db")
    env = {**os.environ, "NO_COLOR": "1", "COLUMNS": "200"}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "contextos", *args, "--store", db],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )

    return cli


def test_the_loop_from_the_command_line(tmp_path: Path) -> None:
    cli = cli_for(tmp_path)
    for number in ("1234", "77"):
        assert cli("run", REF, f"Where is order {number}?").returncode == 0
    assert cli("run", REF, "Opening hours?", "--run-id", "run_hours").returncode == 0

    missing = cli("findings")
    assert missing.returncode == 1
    assert missing.stderr.count("\n") == 1 and "contextos findings --scan" in missing.stderr

    assert cli("findings", "--scan").returncode == 0
    [proposal] = json.loads(cli("proposals", "--json").stdout)
    made = cli("candidate", "create", proposal["proposal_id"], "--json")
    candidate = json.loads(made.stdout)
    assert candidate["change"]["target"] == "lookup_order"

    checked = cli("release", "check", candidate["candidate_id"], "--golden", "run_hours", "--json")
    assert checked.returncode == 0, checked.stderr
    report = json.loads(checked.stdout)
    assert [c["outcome"] for c in report["cases"]] == ["unchanged", "fixed", "fixed"]

    asked = cli(
        "release", "request", candidate["candidate_id"], report["report_id"], "--releaser", "alice"
    )
    assert asked.returncode == 0, asked.stderr
    interrupt = re.search(r"approval: (\S+)", asked.stdout)
    assert interrupt is not None
    assert candidate["candidate_hash"] in asked.stdout  # the person sees what they approve

    wrong = cli("release", "approve", interrupt.group(1), "--as", "mallory")
    assert wrong.returncode == 1 and "Traceback" not in wrong.stderr
    done = cli("release", "approve", interrupt.group(1), "--as", "alice", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["candidate_id"] == candidate["candidate_id"]
    assert "release -> " + candidate["candidate_id"] in cli("release", "status").stdout


def test_mistakes_get_one_line_and_change_nothing(tmp_path: Path) -> None:
    cli = cli_for(tmp_path)
    assert cli("run", REF, "Opening hours?", "--run-id", "run_hours").returncode == 0
    assert cli("findings", "--scan").returncode == 0
    for args, says in [
        (("candidate", "create", "prp_nope"), "no proposal prp_nope"),
        (("rollback", "order-desk", "--as", "bob"), "nothing to roll back"),
        (("release", "check", "cnd_nope", "--golden", "run_hours"), "no candidate cnd_nope"),
    ]:
        done = cli(*args)
        assert done.returncode == 1, args
        assert says in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert "no release decisions" in cli("release", "status").stdout
