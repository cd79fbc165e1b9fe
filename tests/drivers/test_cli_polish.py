"""Small promises of the command: a version, and no false success on a run that had ended."""

from __future__ import annotations

import os
import pty
import select
import subprocess
import sys
import time
from pathlib import Path

from typer.testing import CliRunner, Result

import contextos
from contextos.cli import app

ROOT = Path(__file__).resolve().parents[2]
AGENT = str(ROOT / "tests" / "kernel" / "cli_agent.py") + ":agent"


def cli(*args: str) -> Result:
    return CliRunner().invoke(app, list(args), env={"NO_COLOR": "1", "COLUMNS": "80"})


def test_version() -> None:
    done = cli("--version")
    assert done.exit_code == 0 and done.stdout.strip() == f"contextos {contextos.__version__}"


def test_cancelling_a_run_that_ended_says_so_and_fails(tmp_path: Path) -> None:
    db = str(tmp_path / "runs.db")
    assert cli("run", AGENT, "Greet Ada", "--run-id", "run_done", "--store", db).exit_code == 0
    done = cli("cancel", "run_done", "--store", db)
    assert done.exit_code == 1
    assert done.stderr.splitlines() == [
        "error: run run_done had already ended (completed): nothing to cancel"
    ]
    shown = cli("show", "run_done", "--store", db, "--json")
    assert '"status": "completed"' in shown.stdout


def test_the_runs_table_fits_80_columns_without_cutting_an_id(tmp_path: Path) -> None:
    db = str(tmp_path / "runs.db")
    rid = "run_0123456789abcdef0123"
    assert cli("run", AGENT, "Greet Ada", "--run-id", rid, "--store", db).exit_code == 0
    listed = subprocess.run(
        [sys.executable, "-m", "contextos", "runs", "--store", db],
        env={**os.environ, "NO_COLOR": "1", "COLUMNS": "80"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    lines = listed.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80
    assert "…" not in listed.stdout
    assert any(rid in line and "greeter v1" in line and "completed" in line for line in lines)
    assert "tokens" in lines[1] and "cost" in lines[1]  # what the run spent stays


def test_show_on_80_columns_gives_each_event_a_line_and_its_detail_the_width(
    tmp_path: Path,
) -> None:
    db = str(tmp_path / "runs.db")
    assert cli("run", AGENT, "Greet Ada", "--run-id", "run_narrow", "--store", db).exit_code == 0
    shown = cli("show", "run_narrow", "--store", db)
    assert shown.exit_code == 0
    lines = shown.stdout.splitlines()
    assert max(len(line.rstrip()) for line in lines) <= 80
    created = next(i for i, line in enumerate(lines) if " run_created runtime" in line)
    assert lines[created].split()[0] == "1"  # the seq, the time, the whole event type, the actor
    assert lines[created + 1].startswith("  greeter v1 started on: Greet Ada")  # then its detail
    assert any(" run_completed worker:" in line and "(after #" in line for line in lines)


def test_serve_without_a_worker_says_runs_will_wait(tmp_path: Path) -> None:
    serving = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "contextos",
            "serve",
            "--port",
            "0",
            "--store",
            str(tmp_path / "r.db"),
        ],
        env={**os.environ, "NO_COLOR": "1"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert serving.stderr is not None
        first = serving.stderr.readline()
    finally:
        serving.terminate()
        serving.wait(timeout=30)
    assert first.startswith("no worker in this process:") and "--worker" in first


def test_a_run_driven_on_a_terminal_shows_where_it_stands_live(tmp_path: Path) -> None:
    """On a terminal, `contextos run` keeps a live line on stderr while the run is driven
    (status, turns, time); piped, as in every other test here, it prints no such line."""
    controller, terminal = pty.openpty()
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT / "src"),
        "CONTEXTOS_TEST_DIR": str(tmp_path),
        "TERM": "xterm-256color",
        "COLUMNS": "80",
    }
    env.pop("NO_COLOR", None)
    argv = ["run", "tests/drivers/slow_agent.py:agent", "x", "--run-id", "r1"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "contextos", *argv, "--store", str(tmp_path / "runs.db")],
        cwd=ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=terminal,
    )
    os.close(terminal)
    seen = b""
    try:
        deadline = time.monotonic() + 60
        while b"run r1: running, 1 turn" not in seen:  # the model asked for step 1's tool
            assert time.monotonic() < deadline and proc.poll() is None, seen
            ready, _, _ = select.select([controller], [], [], 0.5)
            if ready:
                seen += os.read(controller, 4096)
        (tmp_path / "go").touch()
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(controller)
    assert proc.returncode == 0
    assert b"completed" in out and b"run r1:" not in out  # stdout carries only the result
