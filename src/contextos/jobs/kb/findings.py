"""What a knowledge-base scan reports: typed findings with a fingerprint that survives edits.

A finding's fingerprint is its kind, page and target, not its line: a fault that moves down a
page when text is added above it is the same fault, still open, not a new one.
"""

from __future__ import annotations

import hashlib
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field, computed_field


class FindingKind(StrEnum):
    """What is wrong; the order here is the order of a report's sections."""

    DEAD_LINK = "dead_link"
    """An internal link to a file that does not exist (or lies outside the knowledge base)."""
    DEAD_ANCHOR = "dead_anchor"
    """An internal link to a `#section` the target page does not have."""
    DEAD_EXTERNAL_LINK = "dead_external_link"
    """An http(s) link the verifier could not show to be alive."""
    MISSING_FRONTMATTER = "missing_frontmatter"
    """The page has no YAML frontmatter."""
    INVALID_FRONTMATTER = "invalid_frontmatter"
    """The frontmatter is not valid YAML, not a mapping, or never closed."""
    MISSING_FRONTMATTER_KEY = "missing_frontmatter_key"
    """A required frontmatter key is absent or empty."""
    HEADING_JUMP = "heading_jump"
    """A heading more than one level deeper than the one before it (h1 then h3)."""
    DUPLICATE_TITLE = "duplicate_title"
    """Another page has the same title."""
    EMPTY_SECTION = "empty_section"
    """A heading followed directly by one of the same or a higher level, or by the end."""
    ORPHAN_PAGE = "orphan_page"
    """No other page links to this one."""
    OVERSIZE_FILE = "oversize_file"
    """The file is larger than the size limit."""
    UNREADABLE_FILE = "unreadable_file"
    """The scan could not read the file (a symlink out of its directory, permissions)."""

    @property
    def label(self) -> str:
        return self.value.replace("_", " ").capitalize()


class Finding(BaseModel):
    """One problem at one place in the knowledge base."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    kind: FindingKind
    """What is wrong."""
    path: str = Field(min_length=1)
    """The page, relative to the knowledge base's root, with `/` separators."""
    line: int | None = Field(default=None, ge=1)
    """1-based line, when the problem has one."""
    target: str | None = None
    """What the problem is about: the link as written, the heading, the key, the title."""
    detail: str = ""
    """Why it is a problem, in one sentence for a person."""
    unsure: bool = False
    """The verifier could neither prove nor disprove it (a timeout, a login page, a host the
    policy does not allow): a person judges it."""

    @computed_field  # type: ignore[prop-decorator]
    @property
    def fingerprint(self) -> str:
        """Stable across runs and line moves: kind, page and target."""
        key = "\0".join((self.kind.value, self.path, self.target or ""))
        return hashlib.sha256(key.encode()).hexdigest()[:16]

    def sort_key(self) -> tuple[int, str, int, str]:
        return (list(FindingKind).index(self.kind), self.path, self.line or 0, self.target or "")
