"""A second scan the same day reuses the verdicts on external links it made, but the unsure
ones; a verdict older than `recheck_links_after_s` is fetched again."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from urllib.parse import urlsplit

from kb_targets import flow
from kbsample import SAMPLE

from contextos import RunStatus, Runtime
from contextos.jobs.kb import SCANNER, Fixture, LinkStatus, Report, ScanRequest


async def scan(db: Path, request: ScanRequest) -> Report:
    async with Runtime(str(db)) as rt:
        result = await rt.run(flow, request, principal=SCANNER)
        assert result.status is RunStatus.COMPLETED, result.failure_message
        return Report.model_validate(result.structured_output)


async def test_a_same_day_rescan_fetches_only_the_unsure_links_again(
    tmp_path: Path, site: Fixture
) -> None:
    request = ScanRequest(root=str(SAMPLE), index=str(tmp_path / "i.db"), sample_site=site.port)
    first = await scan(tmp_path / "runs.db", request)
    before = Counter(site.hits)
    second = await scan(tmp_path / "runs.db", request)
    again = Counter(site.hits) - before
    unsure = {urlsplit(f.target or "").path for f in first.new if f.unsure}
    assert len(unsure) == first.verified[LinkStatus.UNSURE] == 1
    assert {hit.split()[1] for hit in again} == unsure
    assert (second.counts.open, second.verified) == (first.counts.new, first.verified)

    before = Counter(site.hits)
    stale = request.model_copy(update={"recheck_links_after_s": 0.0})
    third = await scan(tmp_path / "runs.db", stale)
    fetched = {hit.split()[1] for hit in Counter(site.hits) - before}
    assert fetched >= {hit.split()[1] for hit in before}  # every link fetched again
    assert third.verified == first.verified
