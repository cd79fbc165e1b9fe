"""The scan's token budget per day: a scan that would pass what its principal may spend in a
day stops before the model is called, with that reason recorded; another principal's scans
have a budget of their own."""

from __future__ import annotations

from pathlib import Path

from kb_targets import answers, is_judge
from kbsample import SAMPLE

from contextos import FailureReason, Principal, RunStatus, Runtime
from contextos.jobs.kb import SCANNER, Fixture, ScanRequest, kb_scan_workflow


async def test_a_scan_past_the_days_tokens_stops_with_the_reason_recorded(
    tmp_path: Path, site: Fixture
) -> None:
    model = answers("A scan.", input_tokens=5_000)
    flow = kb_scan_workflow(model, judge=model, daily_tokens=6_000)

    def request(name: str) -> ScanRequest:
        index = str(tmp_path / f"{name}.db")
        return ScanRequest(root=str(SAMPLE), index=index, sample_site=site.port)

    async with Runtime(str(tmp_path / "runs.db")) as rt:
        first = await rt.run(flow, request("a"), principal=SCANNER)
        second = await rt.run(flow, request("b"), principal=SCANNER)
        other = await rt.run(flow, request("c"), principal=Principal.service("docs-team"))
        kept = (await rt.state(second.run_id)).failure_message

    assert first.status is RunStatus.COMPLETED
    assert second.status is RunStatus.FAILED
    assert second.failure_reason is FailureReason.CHILD_FAILED
    assert kept is not None and "budget_exhausted" in kept
    assert "would take service:kb-scan@default past the daily cap of 6000 tokens" in kept
    assert other.status is RunStatus.COMPLETED  # its own day's budget
    # the refused call never reached the model
    assert sum(not is_judge(r) for r in model.requests) == 2
