"""The gate: a candidate dead link is reported only when the verifier fails to disprove it.

Internal candidates come from the scan's checks; external links are all candidates until
fetched, each distinct URL once however many pages use it, and only the pages using a URL that
is not alive are looked up.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable, Iterable

from pydantic import BaseModel, ConfigDict

from contextos.jobs.kb.findings import Finding, FindingKind
from contextos.jobs.kb.index import Index, Occurrence
from contextos.jobs.kb.verify import LinkStatus, LinkVerdict, LinkVerifier


class Gated(BaseModel):
    """The findings that passed the gate, and how many links it verified."""

    model_config = ConfigDict(frozen=True)

    findings: tuple[Finding, ...]
    """Every finding to report: non-link findings as they were, links the verifier confirmed."""
    verified: dict[LinkStatus, int]
    """Links verified (internal candidates and distinct URLs), by verdict."""


RECHECK_LINKS_AFTER_S = 72_000.0
"""How old a verdict on an external link may be and still be kept: 20 hours, so a daily scan
fetches every link again and a second scan the same day does not."""

URL_KEY = "link:http"
"""How the journal's keys of verdicts on external links start."""


def url_key(url: str) -> str:
    """The journal's key of the verdict on `url` (`url` is normalised: http or https)."""
    return f"link:{url}"


def carry_links(index: Index, *, older_than: float) -> None:
    """Keep for this scan the verdicts on external links an earlier one made since
    `older_than` (but unsure ones): the gate finds them in the journal, and fetches only the
    rest."""
    for key, value in list(index.earlier(URL_KEY)):
        verdict = LinkVerdict.model_validate_json(value)
        fresh = verdict.checked_s is not None and verdict.checked_s >= older_than
        if fresh and verdict.status is not LinkStatus.UNSURE:
            index.note(key, value)


async def gate(
    candidates: Iterable[Finding],
    urls: Iterable[str],
    verifier: LinkVerifier,
    *,
    uses: Callable[[str], Iterable[Occurrence]],
    concurrency: int = 8,
    journal: Index | None = None,
) -> Gated:
    """Keep the candidates the verifier confirms, and report the `urls` it cannot show alive
    at every place `uses(url)` names. With a `journal`, a URL whose verdict this scan keeps
    (`carry_links`) is not fetched, and each new verdict is kept there."""
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
        verdicts = await asyncio.gather(*(_verify(verifier, url, journal) for url in batch))
        for url, verdict in zip(batch, verdicts, strict=True):
            verified[verdict.status] += 1
            if verdict.status is not LinkStatus.ALIVE:
                kept.extend(_findings(url, verdict, uses(url)))
    return Gated(findings=tuple(kept), verified=verified)


async def _verify(verifier: LinkVerifier, url: str, journal: Index | None) -> LinkVerdict:
    kept = None if journal is None else journal.recall(url_key(url))
    if kept is not None:
        return LinkVerdict.model_validate_json(kept)
    verdict = await verifier.verify_url(url)
    if journal is not None:
        verdict = verdict.model_copy(update={"checked_s": time.time()})
        journal.note(url_key(url), verdict.model_dump_json())
    return verdict


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
