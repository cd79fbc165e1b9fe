"""The link judge: HTTP decides dead or alive; a pre-filter picks the few alive pages worth a
second look, a model says yes or no about each, and a yes is listed apart in the report, for a
person to check. A model that answers nonsense changes nothing in the counts."""

from __future__ import annotations

import json
import re
from pathlib import Path

from kb_targets import SOFT_404, answers, is_judge
from kbsample import SAMPLE, key, planted, soft_404s

from contextos import RunStatus, Runtime
from contextos.jobs.kb import SCANNER, Fixture, Report, ScanRequest, kb_scan_workflow
from contextos.testing import ScriptedModel

SECTION = "## Possibly moved or soft 404, for a person to check (2)"


async def scan(tmp: Path, name: str, model: ScriptedModel, site: Fixture) -> Report:
    request = ScanRequest(root=str(SAMPLE), index=str(tmp / f"{name}.db"), sample_site=site.port)
    async with Runtime(str(tmp / "runs.db")) as rt:
        result = await rt.run(kb_scan_workflow(model, judge=model), request, principal=SCANNER)
    assert result.status is RunStatus.COMPLETED, result.failure_message
    return Report.model_validate(result.structured_output)


async def test_a_judge_that_says_yes_lists_the_soft_404s_apart_from_the_counts(
    tmp_path: Path, site: Fixture
) -> None:
    report = await scan(tmp_path, "yes", answers("A scan.", SOFT_404), site)
    assert {s.url: s.pages for s in report.suspects} == soft_404s()
    assert {s.reason for s in report.suspects} == {"The page reads 'Page not found'."}
    # not findings, not counted: the findings are exactly the planted faults
    assert {key(f) for f in report.new} == planted() and report.counts.new == len(planted())
    assert not {f.target for f in report.new} & set(soft_404s())
    markdown = report.markdown()
    assert markdown.index(SECTION) > markdown.index("## New")  # after every finding
    assert markdown.endswith(documented())  # as docs/kb-scan.md shows it


def documented() -> str:
    """The judged section as docs/kb-scan.md shows it."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "kb-scan.md").read_text()
    found = re.search(r"```markdown\n(## Possibly moved.*?)```", text, re.S)
    assert found is not None
    return found.group(1)


async def test_a_judge_that_says_no_or_nonsense_changes_nothing_in_the_counts(
    tmp_path: Path, site: Fixture
) -> None:
    yes = await scan(tmp_path, "yes", answers("A scan.", SOFT_404), site)
    no = json.dumps({"soft_404": False, "reason": "A real page."})
    for name, judgement in (
        ("no", no),
        ("words", "Yes! Definitely a 404, both of them."),
        ("wrong", json.dumps({"soft_404": "maybe", "reason": 42})),
        ("dead", json.dumps({"dead_links": 0, "soft_404": True})),
    ):
        other = await scan(tmp_path, name, answers("A scan.", judgement), site)
        assert other.suspects == (), name
        assert (other.counts, other.new, other.verified) == (yes.counts, yes.new, yes.verified)
        assert "soft 404" not in other.markdown()


async def test_the_pre_filter_asks_about_the_doubted_pages_only(
    tmp_path: Path, site: Fixture
) -> None:
    model = answers("A scan.", SOFT_404)
    report = await scan(tmp_path, "asked", model, site)
    asked = [r for r in model.requests if is_judge(r)]
    # one question per doubted page, each shown that page's excerpt and no other link
    assert len(asked) == len(soft_404s()) == 2
    shown = [" ".join(str(m.content) for m in r.messages) for r in asked]
    assert sorted(url for url in soft_404s() for text in shown if url in text) == sorted(
        soft_404s()
    )
    assert any("title: Page not found" in text for text in shown)
    alive = report.verified["alive"]
    assert alive == 12 and all("/status" not in text for text in shown)
