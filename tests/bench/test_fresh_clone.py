"""`python -m bench --quick` works on a fresh clone: it builds bench/.venv from the pins in
bench/requirements.txt (pip's cache makes a rebuild cheap) and writes every section.

No figure is checked here (timing claims live in the benchmark, not in tests): only that
each workload ran and reported.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

SECTIONS = (
    "## 1. Per-turn overhead with durable state",
    "## 5. Concurrency on one worker",
    "## Governed turn: the whole platform stack against LangGraph's middleware",
    "## Scale-out on PostgreSQL",
    "## Long-run memory",
    "## Where ContextOS spends its time",
)


def clone(to: Path) -> Path:
    """The checkout's files as a fresh clone has them: tracked or new, nothing ignored."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        source = ROOT / name
        if source.is_file():
            target = to / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    return to


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_quick_benchmark_runs_from_a_fresh_clone(tmp_path: Path, postgres_server: str) -> None:
    checkout = clone(tmp_path / "clone")
    assert not (checkout / "bench" / ".venv").exists()
    out = tmp_path / "benchmarks.md"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["CONTEXTOS_TEST_POSTGRES"] = postgres_server
    # Imports write no bytecode: the command must write ContextOS's itself, as pip wrote the
    # peers', or every fresh process it times would compile ContextOS from source.
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "--quick", "--out", str(out)],
        cwd=checkout,
        env=env,
        capture_output=True,
        text=True,
        timeout=1100,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert list((checkout / "src" / "contextos" / "__pycache__").glob("runtime.*.pyc"))
    report = out.read_text()
    for section in SECTIONS:
        assert section in report, section
    # The peers ran from the environment the command built for itself.
    for peer in ("langgraph", "dbos"):
        assert f"| {peer} |" in report, peer
    assert "Not run: no PostgreSQL server" not in report
    # The scale-out table has a row for each system at each worker count.
    for system in ("ContextOS", "DBOS"):
        for workers in (1, 2, 4):
            assert f"| {system} | {workers} |" in report, (system, workers)
