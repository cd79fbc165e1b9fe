"""The knowledge-base scan from end to end, deterministic: scan, gate, reduce, report.

No model and no graph: this is what the workflow's nodes do in code, in one call. A model can
only add the report's prose (`Report.with_summary`) and judge the links left `unsure`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from dataclasses import dataclass

from contextos.jobs.kb.checks import Rules
from contextos.jobs.kb.findings import Finding
from contextos.jobs.kb.gate import RECHECK_LINKS_AFTER_S, carry_links, gate
from contextos.jobs.kb.index import Index
from contextos.jobs.kb.reduce import reduce
from contextos.jobs.kb.report import Report
from contextos.jobs.kb.scan import Plan, Scanner
from contextos.jobs.kb.verify import LinkVerifier


@dataclass(frozen=True, kw_only=True, slots=True)
class Outcome:
    """A scan's plan (what it read) and its report."""

    plan: Plan
    report: Report


async def scan_kb(
    root: str | os.PathLike[str],
    *,
    index: str | os.PathLike[str],
    verifier: LinkVerifier | None = None,
    rules: Rules | None = None,
    previous: Iterable[Finding] = (),
    full: bool = False,
    concurrency: int = 8,
    recheck_links_after_s: float = RECHECK_LINKS_AFTER_S,
) -> Outcome:
    """Scan the knowledge base at `root` and report against `previous` (the last report's
    `current()` findings).

    `index` is a file kept between runs (the last run's summaries and hashes); without the
    previous index, or with `full`, every page is read. Without a `verifier`, no URL is
    reachable and every external link is reported as unsure. A verdict on an external link
    that an earlier scan with this index made (alive or dead) is kept for
    `recheck_links_after_s` (20 hours by default; 0 fetches every link again).
    """
    rules = rules or Rules()
    verifier = verifier or LinkVerifier(root)
    with Index(index, root) as kept:
        scan = Scanner(root, index=kept, rules=rules).scan(full=full)
        carry_links(kept, older_than=time.time() - recheck_links_after_s)
        kept.forget_before("report")
        gated = await gate(
            scan.findings,
            kept.external_urls(),
            verifier,
            uses=kept.uses_of,
            concurrency=concurrency,
            journal=kept,
        )
        kept.commit()
    report = Report.of(
        reduce(gated.findings, previous),
        pages=scan.plan.pages,
        reread=scan.plan.read,
        verified=gated.verified,
    )
    return Outcome(plan=scan.plan, report=report)
