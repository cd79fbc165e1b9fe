"""`contextos trace --otlp` says at once, in one line, when the collector is not there."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
AGENT = str(ROOT / "tests" / "kernel" / "cli_agent.py") + ":agent"


def contextos(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NO_COLOR": "1", "COLUMNS": "80"}
    return subprocess.run(
        [sys.executable, "-m", "contextos", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture
def recorded(tmp_path: Path) -> str:
    db = str(tmp_path / "runs.db")
    ran = contextos("run", AGENT, "Greet Ada", "--run-id", "run_t", "--store", db)
    assert ran.returncode == 0, ran.stderr
    return db


@pytest.fixture
def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # nothing listens there once closed


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port that takes connections (the kernel's backlog) and never answers."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        yield int(s.getsockname()[1])


def test_a_refused_collector_is_one_line_and_a_failure(recorded: str, closed_port: int) -> None:
    url = f"http://127.0.0.1:{closed_port}"
    sent = contextos("trace", "run_t", "--store", recorded, "--otlp", url)
    assert sent.returncode == 1
    assert sent.stderr.splitlines() == [
        f"error: could not send the trace to {url}/v1/traces: connection refused; check "
        "that an OTLP/HTTP collector listens there"
    ]
    assert "sent" not in sent.stdout


def test_a_collector_that_never_answers_is_one_line_and_a_failure(
    recorded: str, silent_port: int
) -> None:
    url = f"http://127.0.0.1:{silent_port}/v1/traces"
    sent = contextos("trace", "run_t", "--store", recorded, "--otlp", url)
    assert sent.returncode == 1
    [line] = sent.stderr.splitlines()
    assert line.startswith(f"error: could not send the trace to {url}: no answer within ")
    assert "sent" not in sent.stdout
