"""Reduce and report: the split against the last run, and counts no prose can change."""

from __future__ import annotations

import json

from contextos.jobs.kb import Finding, FindingKind, Report, dedupe, reduce

DEAD = Finding(
    kind=FindingKind.DEAD_LINK, path="docs/a.md", line=12, target="b.md", detail="no file"
)
JUMP = Finding(kind=FindingKind.HEADING_JUMP, path="docs/a.md", line=30, target="Deep")
ORPHAN = Finding(kind=FindingKind.ORPHAN_PAGE, path="runbooks/old.md")


def test_a_finding_that_moved_down_the_page_is_the_same_finding() -> None:
    moved = DEAD.model_copy(update={"line": 20})
    assert moved.fingerprint == DEAD.fingerprint
    delta = reduce([moved, ORPHAN], previous=[DEAD, JUMP])
    assert delta.new == (ORPHAN,)
    assert delta.open == (moved,)  # as found now, at its new line
    assert delta.fixed == (JUMP,)


def test_findings_are_normalised_then_deduplicated() -> None:
    spelled = [
        DEAD.model_copy(update={"path": "./docs//a.md", "line": 40}),
        DEAD.model_copy(update={"target": " b.md ", "detail": "no\n  file"}),
        Finding(kind=FindingKind.DEAD_EXTERNAL_LINK, path="a.md", target="HTTP://X.test/p#f"),
        Finding(kind=FindingKind.DEAD_EXTERNAL_LINK, path="a.md", target="http://x.test/p"),
    ]
    kept = dedupe(spelled)
    assert [(f.kind, f.path, f.line, f.target, f.detail) for f in kept] == [
        (FindingKind.DEAD_LINK, "docs/a.md", 12, "b.md", "no file"),
        (FindingKind.DEAD_EXTERNAL_LINK, "a.md", None, "http://x.test/p", ""),
    ]


def test_a_finding_is_unsure_only_if_every_copy_is() -> None:
    unsure = DEAD.model_copy(update={"unsure": True})
    assert [f.unsure for f in dedupe([unsure, DEAD.model_copy(update={"line": 99})])] == [False]
    assert [f.unsure for f in dedupe([unsure, unsure])] == [True]


def test_counts_are_computed_and_prose_cannot_change_them() -> None:
    report = Report.of(reduce([DEAD, ORPHAN], previous=[DEAD, JUMP]), pages=3, reread=1)
    counts = report.counts
    assert (counts.new, counts.open, counts.fixed, counts.unsure) == (1, 1, 1, 0)
    assert counts.by_kind[FindingKind.DEAD_LINK].open == 1
    written = report.with_summary("Great news: 0 new issues and nothing is broken!")
    assert written.counts == counts
    markdown = written.markdown()
    assert "**1 new**, 1 still open, 1 fixed" in markdown
    assert "| **all** | 1 | 1 | 1 |" in markdown
    assert "> Great news: 0 new issues and nothing is broken!" in markdown


def test_counts_in_loaded_json_are_recomputed() -> None:
    data = json.loads(Report.of(reduce([DEAD], previous=[])).model_dump_json())
    assert data["counts"]["new"] == 1
    data["counts"] = {"new": 0, "open": 0, "fixed": 0, "unsure": 0, "by_kind": {}}
    loaded = Report.model_validate(data)
    assert loaded.counts.new == 1 and loaded.new == (DEAD,)


def test_the_next_run_compares_against_what_is_still_there() -> None:
    report = Report.of(reduce([DEAD, ORPHAN], previous=[DEAD, JUMP]))
    again = reduce([DEAD, ORPHAN], previous=report.current())
    assert (again.new, again.fixed) == ((), ())


def test_markdown_lists_findings_by_kind_and_marks_those_to_judge() -> None:
    soft = Finding(
        kind=FindingKind.DEAD_EXTERNAL_LINK,
        path="docs/faq.md",
        line=3,
        target="http://x.test/faq",
        detail="answered 200 but the page says 'not found'",
        unsure=True,
    )
    tricky = DEAD.model_copy(update={"target": "a`b.md"})
    markdown = Report.of(reduce([soft, tricky])).markdown()
    assert "(1 to judge)" in markdown
    assert "### Dead external link" in markdown
    assert "- `docs/faq.md:3` `http://x.test/faq`: **to judge:** answered 200" in markdown
    assert "``a`b.md``" in markdown  # a backtick in a target cannot end its code span
