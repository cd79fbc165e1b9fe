"""The README's samples, taken from the Markdown as they stand (never copied here), run."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"


def blocks(language: str, doc: Path = README) -> list[str]:
    return [m.group(1) for m in re.finditer(rf"```{language}\n(.*?)```", doc.read_text(), re.S)]


def run_python(source: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    script = cwd / "sample.py"
    script.write_text(source)
    env = {k: v for k, v in os.environ.items() if k not in ("CONTEXTOS_STORE", "CONTEXTOS_MODEL")}
    return subprocess.run(
        [sys.executable, str(script)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )


@pytest.mark.local_model
def test_the_first_agent_runs_as_written_on_the_local_model(
    model_path: Path, tmp_path: Path
) -> None:
    first = blocks("python")[0]
    done = run_python(first, tmp_path)
    assert done.returncode == 0, done.stderr
    status, _, said = done.stdout.strip().partition(" ")
    assert status == "completed", done.stdout
    assert "shipped" in said
    assert (tmp_path / ".contextos" / "contextos.db").exists()


def test_the_first_agent_says_why_when_it_fails(tmp_path: Path) -> None:
    """The same sample with a model that never answers the question: it prints the reason."""
    first = blocks("python")[0]
    assert 'model="local",' in first
    wrong = "ScriptedModel([reply('It is on its way.')] * 6)"
    source = "from contextos.testing import ScriptedModel, reply\n" + first.replace(
        'model="local",', f"model={wrong},"
    )
    done = run_python(source, tmp_path)
    assert done.returncode == 0, done.stderr
    status, _, reason = done.stdout.strip().partition(" ")
    assert status == "failed"
    assert "rejected the answer" in reason  # the reason, not None


def test_the_demo_verifier_checks_the_answer_against_the_lookup() -> None:
    sys.path.insert(0, str(ROOT / "examples"))
    try:
        from quickstart import ORDERS, answers_from_the_lookup, lookup_order
    finally:
        sys.path.remove(str(ROOT / "examples"))
    assert answers_from_the_lookup(lookup_order("A-1001")) == []  # what the tool said passes
    assert answers_from_the_lookup("Your order A-1001 has shipped.") == []
    for nonsense in (
        "1002 orders processed in 5 days",
        "It arrives in 2 days.",  # no status
        "Order A-1002 is shipped.",  # a status that is not that order's
        "Everything is fine.",
    ):
        assert answers_from_the_lookup(nonsense) != [], nonsense
    assert set(ORDERS) == {"A-1001", "A-1002"}
