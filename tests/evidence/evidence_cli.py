"""The `contextos` command on a test's own store, with the write tools' ledger in its folder."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

Cli = Callable[..., subprocess.CompletedProcess[str]]


def cli_for(tmp_path: Path, *, columns: int = 200) -> Cli:
    """`cli("run", …)` runs `contextos … --store tmp_path/c.db`; writes land in tmp_path/l."""
    db = tmp_path / "c.db"
    env = {
        **os.environ,
        "NO_COLOR": "1",
        "COLUMNS": str(columns),
        "EVIDENCE_LEDGER": str(tmp_path / "l"),
    }

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "contextos", *args, "--store", str(db)],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )

    return cli
