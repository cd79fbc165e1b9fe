"""Reduce, in code: normalise and deduplicate findings, and split them against the last run.

No model takes part: the same findings always give the same split.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable

from pydantic import BaseModel, ConfigDict

from contextos.jobs.kb.findings import Finding, FindingKind
from contextos.jobs.kb.markdown import normalise_url


class Delta(BaseModel):
    """Findings as they compare with the previous run's."""

    model_config = ConfigDict(frozen=True)

    new: tuple[Finding, ...] = ()
    """Not reported by the previous run."""
    open: tuple[Finding, ...] = ()
    """Reported before and still there (as found now: lines may have moved)."""
    fixed: tuple[Finding, ...] = ()
    """Reported before and gone now (as reported then)."""


def normalise(finding: Finding) -> Finding:
    """The one spelling of a finding: `/` paths without `./`, trimmed text, external URLs in
    the form `normalise_url` gives."""
    path = posixpath.normpath(finding.path.replace("\\", "/")).lstrip("/")
    target = finding.target.strip() if finding.target is not None else None
    if target and finding.kind is FindingKind.DEAD_EXTERNAL_LINK:
        target = normalise_url(target)
    detail = " ".join(finding.detail.split())
    if (path, target, detail) == (finding.path, finding.target, finding.detail):
        return finding
    return finding.model_copy(update={"path": path, "target": target, "detail": detail})


def dedupe(findings: Iterable[Finding]) -> list[Finding]:
    """One finding per fingerprint, the first by line; it is unsure only if every copy is."""
    kept: dict[str, Finding] = {}
    for finding in map(normalise, findings):
        other = kept.get(finding.fingerprint)
        if other is None:
            kept[finding.fingerprint] = finding
            continue
        first = min(other, finding, key=lambda f: f.line or 0)
        if first.unsure and not (other.unsure and finding.unsure):
            first = first.model_copy(update={"unsure": False})
        kept[finding.fingerprint] = first
    return sorted(kept.values(), key=Finding.sort_key)


def reduce(current: Iterable[Finding], previous: Iterable[Finding] = ()) -> Delta:
    """Split this run's findings into new and still open, and the last run's into fixed."""
    now = dedupe(current)
    before = {f.fingerprint: f for f in dedupe(previous)}
    still = {f.fingerprint for f in now}
    return Delta(
        new=tuple(f for f in now if f.fingerprint not in before),
        open=tuple(f for f in now if f.fingerprint in before),
        fixed=tuple(f for f in before.values() if f.fingerprint not in still),
    )
