"""The gate: a candidate dead link is reported only when the verifier fails to disprove it.

Internal candidates come from the scan's checks; external links are all candidates until
fetched, each distinct URL once however many pages use it, and only the pages using a URL that
is not alive are looked up.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Iterable

from pydantic import BaseModel, ConfigDict

from contextos.jobs.kb.findings import Finding, FindingKind
from contextos.jobs.kb.index import Occurrence
from contextos.jobs.kb.verify import LinkStatus, LinkVerdict, LinkVerifier


class Gated(BaseModel):
    """The findings that passed the gate, and how many links it verified."""

    model_config = ConfigDict(frozen=True)

    findings: tuple[Finding, ...]
    """Every finding to report: non-link findings as they were, links the verifier confirmed."""
    verified: dict[LinkStatus, int]
    """Links verified (internal candidates and distinct URLs), by verdict."""


async def gate(
    candidates: Iterable[Finding],
    urls: Iterable[str],
    verifier: LinkVerifier,
    *,
    uses: Callable[[str], Iterable[Occurrence]],
    concurrency: int = 8,
) -> Gated:
    """Keep the candidates the verifier confirms, and report the `urls` it cannot show alive
    at every place `uses(url)` names."""
    kept: list[Finding] = []
    verified = dict.fromkeys(LinkStatus, 0)
    for finding in candidates:
        if finding.kind not in (FindingKind.DEAD_LINK, FindingKind.DEAD_ANCHOR):
            kept.append(finding)
            continue
        verdict = verifier.verify_internal(finding.path, finding.target or "")
        verified[verdict.status] += 1
        if verdict.status is not LinkStatus.ALIVE:
            kept.append(finding)
    pending = iter(urls)
    while batch := list(itertools.islice(pending, max(1, concurrency))):
        verdicts = await asyncio.gather(*(verifier.verify_url(url) for url in batch))
        for url, verdict in zip(batch, verdicts, strict=True):
            verified[verdict.status] += 1
            if verdict.status is not LinkStatus.ALIVE:
                kept.extend(_findings(url, verdict, uses(url)))
    return Gated(findings=tuple(kept), verified=verified)


def _findings(url: str, verdict: LinkVerdict, uses: Iterable[Occurrence]) -> list[Finding]:
    return [
        Finding(
            kind=FindingKind.DEAD_EXTERNAL_LINK,
            path=use.path,
            line=use.line,
            target=url,
            detail=verdict.detail,
            unsure=verdict.status is LinkStatus.UNSURE,
        )
        for use in uses
    ]
