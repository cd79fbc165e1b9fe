"""The `contextos` command, run as a real process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
AGENT = "tests/kernel/cli_agent.py:agent"


def cli(*args: str, store: Path | None = None) -> subprocess.CompletedProcess[str]:
    extra = ["--store", str(store)] if store else []
    return subprocess.run(
        [sys.executable, "-m", "contextos", *args, *extra],
        cwd=ROOT,
        env={**os.environ, "NO_COLOR": "1", "COLUMNS": "200"},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_run_list_and_show(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    done = cli("run", AGENT, "Greet Ada", "--json", store=db)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["status"] == "completed" and result["output"] == "I greeted Ada."
    run_id = result["run_id"]

    listed = cli("runs", "--json", store=db)
    rows = json.loads(listed.stdout)
    assert [(r["run_id"], r["agent_name"], r["status"], r["turns"]) for r in rows] == [
        (run_id, "greeter", "completed", 2)
    ]
    table = cli("runs", store=db)
    assert run_id in table.stdout and "greeter v1" in table.stdout

    only_failed = cli("runs", "--status", "failed", "--json", store=db)
    assert json.loads(only_failed.stdout) == []

    shown = cli("show", run_id, store=db)
    assert shown.returncode == 0, shown.stderr
    for expected in (
        "run_created",
        "model_responded",
        "greet(",
        "greet [call_1_0] Hello, Ada!",
        "run_completed",
    ):
        assert expected in shown.stdout

    with_context = cli("show", run_id, "--context", store=db)
    assert "turn 2 (event #5) context" in with_context.stdout
    assert "tool:greet" in with_context.stdout and "3 messages of the run" in with_context.stdout

    # The prompt of each call exactly as sent, with its lineage, in 80 columns.
    as_text = cli("show", run_id, "--context", "--text", store=db)
    assert as_text.returncode == 0, as_text.stderr
    lines = as_text.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80
    second = as_text.stdout[as_text.stdout.index("turn 2 · event #5") :]
    assert "middleware: budget, pii, sanitize" in second and "tools shown: greet" in second
    assert "·· tool greet [call_1_0] " in second
    assert '<<untrusted-data source="tool:greet"' in second and "  Hello, Ada!" in second
    assert "+ history (history · mixed · " in second

    as_json = json.loads(cli("show", run_id, "--json", store=db).stdout)
    assert [e["type"] for e in as_json["events"]][-1] == "run_completed"
    assert [e["seq"] for e in as_json["events"]] == list(range(1, 8))


def test_store_from_the_environment(tmp_path: Path) -> None:
    db = tmp_path / "env.db"
    done = subprocess.run(
        [sys.executable, "-m", "contextos", "run", AGENT, "hi", "--json"],
        cwd=ROOT,
        env={**os.environ, "CONTEXTOS_STORE": f"sqlite:///{db}"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert db.exists()


def test_clear_errors(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    assert cli("run", AGENT, "Greet Ada", store=db).returncode == 0  # the store exists
    unknown = cli("show", "run_nope", store=db)
    assert unknown.returncode == 1
    assert "no run with id 'run_nope'" in unknown.stderr and "contextos runs" in unknown.stderr
    assert "Traceback" not in unknown.stderr

    bad_ref = cli("run", "tests/kernel/missing.py:agent", "hi", store=db)
    assert bad_ref.returncode == 1 and "bad agent reference" in bad_ref.stderr

    bad_attr = cli("run", "tests/kernel/cli_agent.py:nobody", "hi", store=db)
    assert bad_attr.returncode == 1 and "has no attribute 'nobody'" in bad_attr.stderr

    bad_store = cli("runs", "--store", "mysql://localhost/x")
    assert bad_store.returncode == 1 and "unknown store URL" in bad_store.stderr
    assert "Traceback" not in bad_store.stderr


def test_help_reads_well() -> None:
    out = cli("--help").stdout
    for command in ("run", "resume", "cancel", "runs", "show"):
        assert command in out
