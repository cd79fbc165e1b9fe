"""The README's samples, taken from the Markdown as they stand (never copied here), run.

The first agent on the embedded model runs in tests/models/test_quickstart_example.py.
"""

from __future__ import annotations

import sys
from pathlib import Path

from support.markdown import ROOT, code_blocks, run_python


def test_the_first_agent_says_why_when_it_fails(tmp_path: Path) -> None:
    """The same sample with a model that never answers the question: it prints the reason."""
    first = code_blocks("python")[0]
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
