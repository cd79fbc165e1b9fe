"""The report, in Markdown and JSON, from the gated findings only.

Every number in it is computed from the lists of findings when it is rendered; the prose
summary a model may write is a separate field that nothing reads back, so it can make the
report's wording worse but never its counts.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, computed_field

from contextos.jobs.kb.doubts import Suspect
from contextos.jobs.kb.findings import Finding, FindingKind
from contextos.jobs.kb.reduce import Delta
from contextos.jobs.kb.verify import LinkStatus


class KindCounts(BaseModel):
    model_config = ConfigDict(frozen=True)

    new: int
    open: int
    fixed: int


class Counts(BaseModel):
    """The report's numbers, always recomputed from its findings."""

    model_config = ConfigDict(frozen=True)

    new: int
    open: int
    fixed: int
    unsure: int
    """Findings (new or still open) the verifier could not settle: to be judged."""
    by_kind: dict[FindingKind, KindCounts]
    """Only the kinds that occur."""


class Report(BaseModel):
    """One scan's report. `counts` is computed; a `counts` in loaded JSON is ignored."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    version: Literal[1] = 1
    pages: int = 0
    """Pages in the knowledge base."""
    reread: int = 0
    """Pages this scan read and checked again."""
    verified: dict[LinkStatus, int] = {}
    """Links the gate verified, by verdict."""
    new: tuple[Finding, ...] = ()
    open: tuple[Finding, ...] = ()
    fixed: tuple[Finding, ...] = ()
    summary: str | None = None
    """Prose written by a model from the findings; never read by code."""
    suspects: tuple[Suspect, ...] = ()
    """Links that work but that a model judged possibly moved or a soft 404, for a person to
    check: never findings, never counted."""

    @classmethod
    def of(cls, delta: Delta, **fields: object) -> Report:
        return cls.model_validate(
            {"new": delta.new, "open": delta.open, "fixed": delta.fixed, **fields}
        )

    @computed_field  # type: ignore[prop-decorator]
    @property
    def counts(self) -> Counts:
        kinds = sorted({f.kind for f in (*self.new, *self.open, *self.fixed)}, key=_order)
        return Counts(
            new=len(self.new),
            open=len(self.open),
            fixed=len(self.fixed),
            unsure=sum(f.unsure for f in (*self.new, *self.open)),
            by_kind={
                kind: KindCounts(
                    new=sum(f.kind is kind for f in self.new),
                    open=sum(f.kind is kind for f in self.open),
                    fixed=sum(f.kind is kind for f in self.fixed),
                )
                for kind in kinds
            },
        )

    def current(self) -> tuple[Finding, ...]:
        """The findings still there after this run: the next run compares against these."""
        return (*self.new, *self.open)

    def with_summary(self, text: str) -> Report:
        return self.model_copy(update={"summary": text.strip() or None})

    def markdown(self) -> str:
        counts = self.counts
        verified = ", ".join(f"{n} {status}" for status, n in self.verified.items() if n)
        out = [
            "# Knowledge-base scan",
            "",
            f"**{counts.new} new**, {counts.open} still open, {counts.fixed} fixed"
            + (f" ({counts.unsure} to judge)" if counts.unsure else "")
            + f" · {self.pages} pages, {self.reread} read this run"
            + (f" · links verified: {verified}" if verified else ""),
            "",
        ]
        if counts.by_kind:
            out += ["| kind | new | still open | fixed |", "|---|--:|--:|--:|"]
            out += [
                f"| {kind.label} | {c.new} | {c.open} | {c.fixed} |"
                for kind, c in counts.by_kind.items()
            ]
            out += [f"| **all** | {counts.new} | {counts.open} | {counts.fixed} |", ""]
        if self.summary:
            out += ["## Summary", ""]
            out += [f"> {line}".rstrip() for line in self.summary.splitlines()]
            out += ["", "*Written by a model from the findings below; the counts are the scan's.*"]
            out.append("")
        for title, findings in (
            ("New", self.new),
            ("Fixed", self.fixed),
            ("Still open", self.open),
        ):
            if findings:
                out += [f"## {title} ({len(findings)})", "", *_listing(findings)]
        if self.suspects:
            out += [
                f"## Possibly moved or soft 404, for a person to check ({len(self.suspects)})",
                "",
                "*These links work; a model read each page's opening and doubts it is the page "
                "meant. They are not findings and not in the counts above.*",
                "",
            ]
            for suspect in self.suspects:
                pages = ", ".join(_code(page) for page in suspect.pages)
                out.append(f"- {_code(suspect.url)} (linked from {pages}): {suspect.reason}")
        return "\n".join(out).rstrip() + "\n"


def _order(kind: FindingKind) -> int:
    return list(FindingKind).index(kind)


def _listing(findings: tuple[Finding, ...]) -> list[str]:
    out: list[str] = []
    for kind in sorted({f.kind for f in findings}, key=_order):
        out += [f"### {kind.label}", ""]
        for f in sorted((f for f in findings if f.kind is kind), key=Finding.sort_key):
            where = f"{f.path}:{f.line}" if f.line else f.path
            target = f" {_code(f.target)}" if f.target else ""
            judge = "**to judge:** " if f.unsure else ""
            out.append(f"- {_code(where)}{target}: {judge}{' '.join(f.detail.split())}")
        out.append("")
    return out


def _code(text: str) -> str:
    """`text` as a code span that its own backticks cannot end."""
    ticks = "`"
    while ticks in text:
        ticks += "`"
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{ticks}{pad}{text}{pad}{ticks}"
