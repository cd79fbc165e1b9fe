"""The deterministic scan on the sample knowledge base, checked against its manifest of faults:
every planted fault found, nothing else; and a second run after three edits reads only what
changed (and what links to it) and reports only what the edits introduced or fixed."""

from __future__ import annotations

import os
import shutil
import sqlite3
from collections import Counter
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from kbsample import SAMPLE, key, planted, verifier_for

from contextos.errors import ConfigError
from contextos.jobs.kb import Finding, FindingKind, Fixture, scan_kb


async def test_every_planted_fault_is_found_and_nothing_else(tmp_path: Path, site: Fixture) -> None:
    outcome = await scan_kb(
        SAMPLE, index=tmp_path / "index.db", verifier=verifier_for(SAMPLE, site)
    )
    report = outcome.report
    assert {key(f) for f in report.new} == planted()
    assert len(report.new) == len(planted())  # no fault reported twice
    assert (report.open, report.fixed) == ((), ())
    assert outcome.plan.full and outcome.plan.read == report.pages == 61
    # every distinct URL was fetched once, however many pages use it; the page that fails
    # once (503) was asked again
    assert site.hits["GET /community/forum"] == 1
    assert site.hits["GET /status"] == 1
    assert site.hits["GET /releases"] == 2


async def test_the_second_run_reports_only_what_three_edits_changed(
    kb: Path, tmp_path: Path, site: Fixture
) -> None:
    index = tmp_path / "index.db"
    first = (await scan_kb(kb, index=index, verifier=verifier_for(kb, site))).report
    edit(kb / "docs/getting-started.md", "(ingest/http.md)", "(ingest/http-api.md)")
    edit(kb / "runbooks/alert-storm.md", "## Check the alertmanager queue", "## Check the queue")
    edit(
        kb / "decisions/0011-single-region-first.md",
        "## Consequences\n",
        "## Consequences\n\nMoving a tenant to another region is an export and an import.\n\n"
        "#### Latency budget\n\nDashboards across regions add about 80 ms per query.\n",
    )

    second = await scan_kb(
        kb, index=index, verifier=verifier_for(kb, site), previous=first.current()
    )

    plan = second.plan
    assert not plan.full
    assert plan.changed == (
        "decisions/0011-single-region-first.md",
        "docs/getting-started.md",
        "runbooks/alert-storm.md",
    )
    # the pages that link to an edited one (found with grep over the sample): their links are
    # checked again from the index, and they are not read
    assert plan.linking == (
        "decisions/index.md",
        "docs/alerts.md",
        "docs/index.md",
        "docs/security.md",
        "runbooks/index.md",
        "runbooks/on-call.md",
    )
    assert plan.read == 3 and (plan.added, plan.removed) == ((), ())
    report = second.report
    assert {key(f) for f in report.new} == {
        (
            "dead_anchor",
            "runbooks/on-call.md",
            line_of(kb / "runbooks/on-call.md", "#check-the-alertmanager-queue"),
            "alert-storm.md#check-the-alertmanager-queue",
            False,
        ),
        (
            "heading_jump",
            "decisions/0011-single-region-first.md",
            line_of(kb / "decisions/0011-single-region-first.md", "#### Latency budget"),
            "Latency budget",
            False,
        ),
    }
    assert {key(f) for f in report.fixed} == {
        fault
        for fault in planted()
        if (fault[0], fault[1], fault[3])
        in {
            ("dead_link", "docs/getting-started.md", "ingest/http.md"),
            ("empty_section", "decisions/0011-single-region-first.md", "Consequences"),
        }
    }
    assert {key(f) for f in report.open} == planted() - {key(f) for f in report.fixed}
    counts = report.counts
    assert (counts.new, counts.open, counts.fixed) == (2, len(planted()) - 2, 2)


async def test_nothing_changed_nothing_read_nothing_new(
    kb: Path, tmp_path: Path, site: Fixture
) -> None:
    age(kb)  # files written long before they are indexed, as in a real knowledge base
    first = (await scan_kb(kb, index=tmp_path / "i.db", verifier=verifier_for(kb, site))).report
    before = Counter(site.hits)
    again = await scan_kb(
        kb, index=tmp_path / "i.db", verifier=verifier_for(kb, site), previous=first.current()
    )
    assert again.plan.read == 0 and not again.plan.full
    # the same day, a link found alive or dead is not fetched again; an unsure one is
    unsure = {urlsplit(f.target or "").path for f in first.new if f.unsure}
    assert {hit.split()[1] for hit in Counter(site.hits) - before} == unsure
    assert (again.report.counts.new, again.report.counts.fixed) == (0, 0)
    assert len(again.report.open) == len(planted())


async def test_full_reads_every_page_again(kb: Path, tmp_path: Path, site: Fixture) -> None:
    await scan_kb(kb, index=tmp_path / "i.db", verifier=verifier_for(kb, site))
    again = await scan_kb(kb, index=tmp_path / "i.db", verifier=verifier_for(kb, site), full=True)
    assert again.plan.full and again.plan.read == 61


async def test_a_removed_page_makes_the_links_to_it_dead(
    kb: Path, tmp_path: Path, site: Fixture
) -> None:
    first = (await scan_kb(kb, index=tmp_path / "i.db", verifier=verifier_for(kb, site))).report
    (kb / "runbooks/disk-full.md").unlink()
    second = await scan_kb(
        kb, index=tmp_path / "i.db", verifier=verifier_for(kb, site), previous=first.current()
    )
    assert second.plan.removed == ("runbooks/disk-full.md",)
    assert second.plan.linking == ("runbooks/index.md",)
    assert {(f.kind, f.path, f.target) for f in second.report.new} == {
        (FindingKind.DEAD_LINK, "runbooks/index.md", "disk-full.md")
    }
    # its own fault went with it
    assert [f.target for f in second.report.fixed] == ["../docs/concepts/storage.md"]


async def test_an_incremental_scan_reports_what_a_full_scan_of_the_same_tree_reports(
    kb: Path, tmp_path: Path, site: Fixture
) -> None:
    """Unchanged pages are not read again: their links, anchors and titles come from the
    index. Edits that change what unchanged pages' findings are (an anchor they point to
    removed, a file they point to added or removed, a title they share) must still show."""
    age(kb)  # so that unchanged pages are trusted on their size and time
    index = tmp_path / "i.db"
    first = (await scan_kb(kb, index=index, verifier=verifier_for(kb, site))).report
    edit(kb / "runbooks/alert-storm.md", "## Check the alertmanager queue", "## Check it")
    (kb / "runbooks/disk-full.md").unlink()
    (kb / "docs/img").mkdir(exist_ok=True)
    (kb / "docs/img/tiers.png").write_bytes(b"\x89PNG\r\n")
    (kb / "docs/new.md").write_text(
        "---\ntitle: Glossary\n---\n\n# Glossary\n\nSee [the FAQ](faq.md#nowhere).\n"
    )

    incremental = await scan_kb(
        kb, index=index, verifier=verifier_for(kb, site), previous=first.current()
    )
    full = await scan_kb(kb, index=tmp_path / "fresh.db", verifier=verifier_for(kb, site))

    assert incremental.plan.read == 2 and not incremental.plan.full
    assert sorted(incremental.report.current(), key=Finding.sort_key) == list(full.report.new)
    assert incremental.report.verified == full.report.verified
    kinds = {(f.kind, f.path) for f in incremental.report.new}
    assert (FindingKind.DEAD_ANCHOR, "runbooks/on-call.md") in kinds  # an unchanged page
    assert (FindingKind.DEAD_LINK, "runbooks/index.md") in kinds  # an unchanged page
    assert (FindingKind.DUPLICATE_TITLE, "docs/glossary.md") in kinds  # an unchanged page
    fixed = {(f.kind, f.path, f.target) for f in incremental.report.fixed}
    assert (FindingKind.DEAD_LINK, *TIERS) in fixed  # an unchanged page's link, alive now


TIERS = ("decisions/0009-object-storage-for-cold-tier.md", "../docs/img/tiers.png")


async def test_an_edit_that_keeps_size_and_time_is_still_seen(
    kb: Path, tmp_path: Path, site: Fixture
) -> None:
    """File-system clocks are coarse: an edit in the same tick as the scan keeps the time, and
    one that keeps the length keeps the size. A page changed so soon after it was indexed is
    hashed, not trusted."""
    page = kb / "docs/alerts.md"
    os.utime(page)  # written just now
    before = page.stat()
    await scan_kb(kb, index=tmp_path / "i.db", verifier=verifier_for(kb, site))
    # the anchor now exists, and the page keeps its length
    edit(
        page,
        "[last resort](../runbooks/alert-storm.md#silence-everything)",
        "[lastresort](../runbooks/alert-storm.md#silence-noisy-rules)",
    )
    os.utime(page, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert page.stat().st_size == before.st_size
    second = await scan_kb(kb, index=tmp_path / "i.db", verifier=verifier_for(kb, site))
    assert second.plan.changed == ("docs/alerts.md",)
    assert all(f.path != "docs/alerts.md" for f in second.report.new)


async def test_an_index_of_another_folder_is_not_trusted(
    kb: Path, tmp_path: Path, site: Fixture
) -> None:
    await scan_kb(kb, index=tmp_path / "i.db", verifier=verifier_for(kb, site))
    other = Path(shutil.copytree(kb, tmp_path / "other"))
    again = await scan_kb(other, index=tmp_path / "i.db", verifier=verifier_for(other, site))
    assert again.plan.full
    assert {key(f) for f in again.report.new} == planted()


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"{old!r} is not in {path}"
    path.write_text(text.replace(old, new, 1))


def line_of(path: Path, marker: str) -> int:
    return next(n for n, line in enumerate(path.read_text().splitlines(), 1) if marker in line)


def age(root: Path) -> None:
    for path in root.rglob("*"):
        os.utime(path, ns=(10**18, 10**18))  # 2001


async def test_a_path_that_is_not_a_folder_says_so_and_writes_nothing(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="is not a directory: give a knowledge base's path"):
        await scan_kb(tmp_path / "nowhere", index=tmp_path / "i.db")
    assert not (tmp_path / "i.db").exists()


async def test_an_index_path_holding_something_else_is_refused_untouched(tmp_path: Path) -> None:
    notes = tmp_path / "notes.txt"
    notes.write_text("not a database, but somebody's notes\n" * 100)
    with pytest.raises(ConfigError, match="is not a scan index"):
        await scan_kb(SAMPLE, index=notes)
    assert notes.read_text().startswith("not a database")
    other = tmp_path / "other.db"
    with sqlite3.connect(other) as db:
        db.execute("CREATE TABLE orders (id TEXT)")
        db.execute("INSERT INTO orders VALUES ('A-1001')")
    db.close()
    with pytest.raises(ConfigError, match="holds other data, not a scan index"):
        await scan_kb(SAMPLE, index=other)
    with sqlite3.connect(other) as db:
        assert db.execute("SELECT id FROM orders").fetchall() == [("A-1001",)]
    db.close()


async def test_a_malformed_url_in_a_page_is_reported_not_a_crash(
    kb: Path, tmp_path: Path, site: Fixture
) -> None:
    edit(kb / "docs/faq.md", "Yes: [status]", "Yes: [old status](http://[::1/status), [status]")
    outcome = await scan_kb(kb, index=tmp_path / "i.db", verifier=verifier_for(kb, site))
    (malformed,) = [f for f in outcome.report.new if f.target == "http://[::1/status"]
    assert (malformed.kind, malformed.path, malformed.unsure) == (
        FindingKind.DEAD_EXTERNAL_LINK,
        "docs/faq.md",
        False,
    )
    assert "does not parse" in malformed.detail
