"""The improvement loop end to end: a misleading tool description found in the log, a
proposal on the tool-description rung, a candidate that fixes it shown by replay, and a
release that needs a person's approval; a regressing candidate is refused."""

from __future__ import annotations

from pathlib import Path

import pytest
from orders import ORDERS, desk

from contextos import RunStatus, Runtime
from contextos.errors import ReleaseRefused
from contextos.improve import Change, FindingKind, Improvements, Layer, RootCause

HERE = Path(__file__).resolve().parent
REF = f"{HERE / 'orders.py'}:agent"


async def seed(rt: Runtime) -> tuple[list[str], str]:
    """Three order questions (each a failing call, then a corrected one) and a golden run."""
    runs: list[str] = []
    for number in ("1234", "77", "5"):
        done = await rt.run(desk(), f"Where is order {number}?", agent_ref=REF)
        assert done.status is RunStatus.COMPLETED
        runs.append(done.run_id)
    golden = await rt.run(desk(), "What are your opening hours?", agent_ref=REF)
    return runs, str(golden.run_id)


async def test_a_misleading_description_is_found_fixed_replayed_and_released(
    backend_url: str,
) -> None:
    async with Runtime(backend_url) as rt:
        runs, golden = await seed(rt)
        loop = Improvements(rt)
        review = await loop.scan()

        [finding] = review.findings
        assert (finding.kind, finding.root_cause) == (
            FindingKind.TOOL_ERROR,
            RootCause.TOOL_DESCRIPTION,
        )
        assert (finding.subject, finding.count, finding.recovered) == ("lookup_order", 3, 3)
        assert finding.runs == tuple(runs)
        assert [e.seq for e in finding.evidence] == [5, 5, 5]
        assert finding.first_seen <= finding.last_seen
        assert finding.signature == "ValueError: no order N: order ids look like ORD-N"

        [proposal] = review.proposals
        assert proposal.layer is Layer.TOOL_DESCRIPTION
        assert proposal.scope == "agent order-desk, tool lookup_order"
        assert proposal.trace_refs == tuple(f"{r}#5" for r in runs)
        assert '{"order_id":"ORD-1234"}' in proposal.change
        assert (proposal.impact.baseline, proposal.impact.target) == (1.0, 0.0)

        candidate = await loop.candidate(proposal.proposal_id)
        assert candidate.base_hash == desk().identity_hash() != candidate.candidate_hash
        assert await loop.candidates() == [candidate]
        assert (await loop.released(desk())).identity_hash() == candidate.base_hash

        packet = await rt.packet(golden)
        report = await loop.check(candidate.candidate_id, golden=[packet])
        assert [(c.source, c.golden, c.outcome) for c in report.cases] == [
            (golden, True, "unchanged"),
            *((r, False, "fixed") for r in runs),
        ]
        assert '- lookup_order {"order_id":"1234"}' in report.cases[1].diff
        assert await loop.report(report.report_id) == report

        asked = await loop.request_release(
            candidate.candidate_id, report.report_id, releasers=("alice",)
        )
        assert asked.action is not None
        assert asked.action.arguments["candidate_hash"] == candidate.candidate_hash
        assert asked.action.arguments["report_hash"] == report.content_hash()
        assert await loop.current("order-desk") is None  # asking is not releasing

        done = await loop.approve(asked.id, approver="alice")
        assert done.decision.action == "release"
        assert done.decision.candidate_hash == candidate.candidate_hash
        assert done.decision.decided_by == "alice"
        assert await loop.current("order-desk") == done.decision

        released = await loop.released(desk())
        assert released.identity_hash() == candidate.candidate_hash
        run = await rt.run(desk(), "Where is order 42?")  # the runtime runs the release
        calls = [e for e in await rt.events(run.run_id) if e.type == "tool_completed"]
        assert [c.is_error for c in calls] == [False]  # right the first time

        back = await loop.rollback("order-desk", by="bob", reason="canary alarms")
        assert (back.decision.action, back.decision.candidate_id) == ("rollback", None)
        assert (await loop.released(desk())).identity_hash() == desk().identity_hash()
        assert [d.decision.action for d in await loop.history("order-desk")] == [
            "release",
            "rollback",
        ]
    assert ORDERS["ORD-1234"] == "shipped"


async def test_a_candidate_that_regresses_a_golden_run_is_refused(tmp_path: Path) -> None:
    async with Runtime(str(tmp_path / "c.db")) as rt:
        _, golden = await seed(rt)
        loop = Improvements(rt)
        wider = "Look an order (ORD-1234) or the shop's opening hours up."
        bad = await loop.change(
            REF, Change(kind="tool_description", target="lookup_order", text=wider)
        )
        report = await loop.check(bad.candidate_id, golden=[golden])
        [case] = report.cases
        assert (case.source, case.outcome) == (golden, "regressed")
        assert '+ lookup_order {"order_id":"hours"}' in case.diff
        with pytest.raises(ReleaseRefused, match="regresses 1 golden run"):
            await loop.request_release(bad.candidate_id, report.report_id, releasers=("alice",))
        assert await rt.inbox() == []
        assert await loop.current("order-desk") is None
