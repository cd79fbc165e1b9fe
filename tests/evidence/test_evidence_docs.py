"""docs/evidence.md runs as written: its files are saved, its Python runs and prints what the
page says, its shell lines exit as the page says, in one directory, in order."""

from __future__ import annotations

import re
from pathlib import Path

from support.markdown import ROOT, run_page

DOC = ROOT / "docs" / "evidence.md"


def test_the_evidence_page_runs_as_written(tmp_path: Path) -> None:
    shell = dict(run_page(DOC, tmp_path, timeout=120))

    def out(start: str) -> str:
        [found] = [done.stdout for line, done in shell.items() if line.startswith(start)]
        return found

    assert "#" in out("contextos show run_refund")
    assert out("contextos replay run_refund --store").startswith("replay_equal")
    mismatch = out("contextos replay run_refund --agent")
    assert mismatch.startswith("replay_mismatch")
    diff = re.search(r"```\n(tool calls chosen:\n.*?)```", DOC.read_text(), re.S)
    assert diff is not None and diff.group(1) in mismatch
    assert out("contextos replay --packet").startswith("replay_equal")
    assert "completed" in out("contextos fork run_refund --at 10")
    assert "Credited 250 EUR." in out("contextos fork run_refund --at 6")
    assert (
        "fork at a seq in that range"
        in shell["contextos fork run_refund --at 99 --store evidence.db  # exits 1"].stderr
    )
    # one refund, by the recorded run; one credit, by the fork with the credit agent
    assert (tmp_path / "writes.log").read_text().splitlines() == [
        "refund A-1 250.0",
        "credit A-1 250.0",
    ]
