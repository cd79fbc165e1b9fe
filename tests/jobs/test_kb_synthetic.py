"""The synthetic knowledge base the benchmark scans: what it plants is what the scan finds."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from kbsample import verifier_for

from contextos.jobs.kb import Fixture, scan_kb
from contextos.jobs.kb.synthetic import PLANTED, generate


async def test_the_scan_finds_what_the_generator_planted(tmp_path: Path, site: Fixture) -> None:
    root = tmp_path / "kb"
    expected = generate(root, pages=400, rate=0.15, seed=3)
    assert set(expected) == set(PLANTED)  # every kind is planted at this size
    outcome = await scan_kb(root, index=tmp_path / "i.db", verifier=verifier_for(root, site))
    assert Counter(f.kind for f in outcome.report.new) == expected
    assert outcome.report.pages == 400
