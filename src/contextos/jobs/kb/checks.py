"""The deterministic checks: pure functions from what pages hold to findings, no model.

Checks of one page look at that page alone; checks across pages (links, titles, orphans) take
rows streamed from the index, so no check holds the whole knowledge base.
"""

from __future__ import annotations

import itertools
import posixpath
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from contextos.jobs.kb.findings import Finding, FindingKind
from contextos.jobs.kb.markdown import Page, TargetKind


class Rules(BaseModel):
    """What the scan checks for; the same rules go to every scan node."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    required_keys: tuple[str, ...] = ("title",)
    """Frontmatter keys every page must have, with a non-empty value."""
    max_bytes: int = Field(default=65_536, gt=0)
    """A file larger than this is reported."""
    entry_pages: tuple[str, ...] = ("index.md", "README.md")
    """File names that are entry points, never reported as orphans."""
    extensions: tuple[str, ...] = (".md", ".markdown")
    """Which files are pages; other files are only link targets."""

    def is_page(self, path: str) -> bool:
        return path.lower().endswith(tuple(e.lower() for e in self.extensions))


def check_page(path: str, page: Page, *, size: int, rules: Rules) -> list[Finding]:
    """Everything wrong with one page that the page alone shows."""
    found = [*_frontmatter(path, page, rules), *_structure(path, page)]
    if size > rules.max_bytes:
        found.append(
            Finding(
                kind=FindingKind.OVERSIZE_FILE,
                path=path,
                detail=f"{size:,} bytes, over the {rules.max_bytes:,}-byte limit",
            )
        )
    return found


def _frontmatter(path: str, page: Page, rules: Rules) -> Iterator[Finding]:
    front = page.frontmatter
    if not front.present:
        yield Finding(
            kind=FindingKind.MISSING_FRONTMATTER,
            path=path,
            detail="the page does not open with a `---` YAML block",
        )
        return
    if front.error is not None:
        yield Finding(
            kind=FindingKind.INVALID_FRONTMATTER,
            path=path,
            line=front.error_line,
            detail=front.error,
        )
        return
    data = front.data or {}
    for key in rules.required_keys:
        if data.get(key) in (None, "", [], {}):
            yield Finding(
                kind=FindingKind.MISSING_FRONTMATTER_KEY,
                path=path,
                line=(front.key_lines or {}).get(key, 1),
                target=key,
                detail=f"required key {key!r} is {'empty' if key in data else 'missing'}",
            )


def _structure(path: str, page: Page) -> Iterator[Finding]:
    headings = page.headings
    for before, heading in itertools.pairwise(headings):
        if heading.level > before.level + 1:
            yield Finding(
                kind=FindingKind.HEADING_JUMP,
                path=path,
                line=heading.line,
                target=heading.text,
                detail=f"an h{heading.level} directly under an h{before.level} "
                f"(line {before.line})",
            )
    for i, heading in enumerate(headings):
        after = headings[i + 1] if i + 1 < len(headings) else None
        if not heading.has_body and (after is None or after.level <= heading.level):
            yield Finding(
                kind=FindingKind.EMPTY_SECTION,
                path=path,
                line=heading.line,
                target=heading.text,
                detail="the section has no content"
                + ("" if after is None else f" before the next heading (line {after.line})"),
            )


@dataclass(frozen=True, kw_only=True, slots=True)
class LinkRow:
    """An internal link joined with what the index knows of its target."""

    path: str
    """The page holding the link."""
    line: int
    target: str
    """The link as written."""
    kind: TargetKind
    """INTERNAL or OUTSIDE."""
    resolved: str | None
    """The target file, relative to the root."""
    anchor: str | None
    """The `#fragment`, if any."""
    target_kind: str | None
    """`page`, `file` or `dir` when the target exists; None when it does not."""
    has_anchor: bool
    """Whether the target page has that anchor."""


def check_links(rows: Iterable[LinkRow]) -> Iterator[Finding]:
    """Internal links to files that do not exist, or to sections their page does not have."""
    for row in rows:
        if row.kind is TargetKind.OUTSIDE:
            yield _dead(row, "the path climbs out of the knowledge base")
        elif row.target_kind is None:
            yield _dead(row, f"no file {row.resolved or '.'} in the knowledge base")
        elif row.anchor and row.target_kind == "page" and not row.has_anchor:
            where = "this page" if row.resolved == row.path else row.resolved
            yield Finding(
                kind=FindingKind.DEAD_ANCHOR,
                path=row.path,
                line=row.line,
                target=row.target,
                detail=f"{where} has no heading or anchor #{row.anchor}",
            )


def _dead(row: LinkRow, why: str) -> Finding:
    return Finding(
        kind=FindingKind.DEAD_LINK, path=row.path, line=row.line, target=row.target, detail=why
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class TitleRow:
    """A page's title, with the key pages sharing a title share."""

    key: str
    """The title case-folded, whitespace collapsed."""
    path: str
    title: str
    line: int | None


def title_key(title: str) -> str:
    return " ".join(title.split()).casefold()


def duplicate_titles(rows: Iterable[TitleRow]) -> Iterator[Finding]:
    """Every page whose title another page has too; `rows` come sorted by key."""
    for _, group in itertools.groupby(rows, key=lambda r: r.key):
        same = list(group)
        if len(same) < 2:
            continue
        for row in same:
            others = ", ".join(o.path for o in same if o is not row)
            yield Finding(
                kind=FindingKind.DUPLICATE_TITLE,
                path=row.path,
                line=row.line,
                target=row.title,
                detail=f"also the title of {others}",
            )


def orphans(unlinked: Iterable[str], rules: Rules) -> Iterator[Finding]:
    """The pages no other page links to, entry pages excepted."""
    for path in unlinked:
        if posixpath.basename(path) not in rules.entry_pages:
            yield Finding(
                kind=FindingKind.ORPHAN_PAGE,
                path=path,
                detail="no other page links to it",
            )
