"""The README's first command, `make demo`: the scan on the sample with the embedded local
model writing the summary, no key and no network; the counts are the code's."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from kbsample import planted

from support.models import local_model_path

ROOT = Path(__file__).resolve().parents[2]


def demo_commands() -> list[str]:
    """The commands `make demo` runs."""
    makefile = (ROOT / "Makefile").read_text()
    recipe = re.search(r"^demo:.*\n((?:\t.*\n)+)", makefile, re.M)
    assert recipe is not None
    return [line.strip() for line in recipe.group(1).splitlines()]


def test_the_readme_starts_with_make_demo_and_make_demo_runs_the_scan() -> None:
    readme = (ROOT / "README.md").read_text()
    first = re.search(r"```bash\n(.*?)\n", readme)
    assert first is not None and first.group(1).startswith("make demo ")
    assert demo_commands() == ["$(BIN)/contextos kb scan examples/kb --sample-site"]


@pytest.mark.local_model
@pytest.mark.timeout(900)  # the embedded model on a busy machine
def test_make_demo_scans_the_sample_on_the_local_model(tmp_path: Path) -> None:
    local_model_path()
    (command,) = demo_commands()
    args = command.removeprefix("$(BIN)/contextos ").split()
    (tmp_path / "examples").symlink_to(ROOT / "examples")  # its state goes to tmp's .contextos
    env = {k: v for k, v in os.environ.items() if k not in ("CONTEXTOS_MODEL", "CONTEXTOS_STORE")}
    done = subprocess.run(
        [sys.executable, "-m", "contextos", *args],
        cwd=tmp_path,
        env={**env, "NO_COLOR": "1"},
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr
    report = done.stdout
    assert f"**{len(planted())} new**, 0 still open, 0 fixed (1 to judge) · 61 pages" in report
    assert "## Summary" in report  # the model's prose, whatever it says
    assert "| **all** | 29 | 0 | 0 |" in report
    assert (tmp_path / ".contextos" / "contextos.db").exists()
