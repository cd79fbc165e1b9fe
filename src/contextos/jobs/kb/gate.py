"""The gate: a candidate dead link is reported only when the verifier fails to disprove it.

Internal candidates come from the scan's checks; external links are all candidates until
fetched, each distinct URL once however many pages use it.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterable

from pydantic import BaseModel, ConfigDict

from contextos.jobs.kb.findings import Finding, FindingKind
from contextos.jobs.kb.index import ExternalLink
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
    external: Iterable[ExternalLink],
    verifier: LinkVerifier,
    *,
    concurrency: int = 8,
) -> Gated:
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
    links = iter(external)
    while batch := list(itertools.islice(links, max(1, concurrency))):
        verdicts = await asyncio.gather(*(verifier.verify_url(link.url) for link in batch))
        for link, verdict in zip(batch, verdicts, strict=True):
            verified[verdict.status] += 1
            kept.extend(_findings(link, verdict))
    return Gated(findings=tuple(kept), verified=verified)


def _findings(link: ExternalLink, verdict: LinkVerdict) -> list[Finding]:
    if verdict.status is LinkStatus.ALIVE:
        return []
    return [
        Finding(
            kind=FindingKind.DEAD_EXTERNAL_LINK,
            path=use.path,
            line=use.line,
            target=link.url,
            detail=verdict.detail,
            unsure=verdict.status is LinkStatus.UNSURE,
        )
        for use in link.occurrences
    ]
