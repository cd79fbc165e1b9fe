"""Links that work but may not lead where they should: a page that answers 200 but says "not
found" or "has moved" (a soft 404), or a redirect that lands on a site's home page.

HTTP decides whether a link is dead; this never does. A cheap pre-filter (`doubt_of`) picks
the few alive pages worth a second look from what the verifier already fetched; a model is
asked yes or no about each, given the page's excerpt; a "yes" is listed in the report apart
from the findings, for a person to check, and never counted as a dead link. A model that
answers nonsense gives no judgement, and nothing else changes.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field

MAX_DOUBTS = 5
"""At most this many pages are put to the model per scan (the first by URL): a knowledge base
whose every link looks moved needs a person, not a thousand model calls."""

_MISSING_WORDS = re.compile(
    r"\b(?:(?:page|file|article|document|resource)\s+(?:was\s+|is\s+)?not\s+found"
    r"|not\s+found|404|no\s+longer\s+(?:exists|available)|does\s*n[o']t\s+exist"
    r"|(?:has|have)\s+(?:been\s+)?(?:moved|removed|deleted))\b",
    re.I,
)
_TITLE = re.compile(r"<title[^>]*>(.*?)</title>", re.I | re.S)
_H1 = re.compile(r"<h1[^>]*>(.*?)</h1>", re.I | re.S)
_TAG = re.compile(r"<[^>]+>")
_HIDDEN = re.compile(r"(?is)<(script|style|head)\b.*?</\1>")
EXCERPT_CHARS = 400
"""How much of a page's text the model is shown."""


def reads_missing(body: str) -> str | None:
    """The words by which a page says it is missing, if it does.

    Only the title, the first heading and the opening of the text are read: a page about 404
    errors further down is not a missing page.
    """
    parts = [m.group(1) for pattern in (_TITLE, _H1) for m in pattern.finditer(body[:20_000])]
    parts.append(_text(body)[:300])
    for part in parts:
        found = _MISSING_WORDS.search(_TAG.sub(" ", part))
        if found:
            return " ".join(found.group(0).split())
    return None


def doubt_of(url: str, final_url: str | None, body: str) -> str | None:
    """Why a page that answered 2xx is worth asking about, or None for an ordinary page."""
    words = reads_missing(body)
    if words:
        return f"the page says {words!r}"
    if final_url is not None and _path(final_url) == "/" and _path(url) != "/":
        return f"redirected to the site's home page, {final_url}"
    return None


def excerpt(body: str) -> str:
    """What the model is shown of a page: its title, its first heading, its opening text."""
    title = next((" ".join(_TAG.sub(" ", m.group(1)).split()) for m in _TITLE.finditer(body)), "")
    head = next((" ".join(_TAG.sub(" ", m.group(1)).split()) for m in _H1.finditer(body)), "")
    lines = [f"title: {title}" if title else "", f"heading: {head}" if head else ""]
    lines.append(f"text: {_text(body)[:EXCERPT_CHARS]}")
    return "\n".join(line for line in lines if line)


class Doubt(BaseModel):
    """An alive link worth a second look: what the judge is given."""

    model_config = ConfigDict(frozen=True)

    url: str
    """The link, as the knowledge base's pages write it (normalised)."""
    why: str
    """What the pre-filter saw."""
    excerpt: str
    """The page's title, first heading and opening text."""


class Judgement(BaseModel):
    """Your answer about one web page that a knowledge base links to."""

    # The judge's answer (its schema's descriptions are what the model is shown).

    soft_404: bool = Field(
        description="true if the page is an error page, or says the content is missing or has "
        "moved, or is a generic home page instead of the linked content; false otherwise"
    )
    # bounded, so that a small local model (its answer constrained by this schema) cannot
    # ramble for its whole output budget
    reason: str = Field(max_length=120, description="One short sentence: why.")


class Suspect(BaseModel):
    """A link the model judged possibly moved or a soft 404: for a person to check."""

    model_config = ConfigDict(frozen=True)

    url: str
    pages: tuple[str, ...]
    """The pages that link to it."""
    reason: str
    """The model's one line."""


JUDGE_INSTRUCTIONS = (
    "You check links in a knowledge base. You are shown the start of a web page that a link "
    "points to; the server answered it as a working page. Say whether the page is really an "
    "error page, says its content is missing or has moved, or is a site's generic home page "
    "instead of the linked content (soft_404 true), or is a real page (soft_404 false), and "
    "give one short sentence why."
)


def one_line(text: str) -> str:
    """A model's reason (at most 120 characters, by its schema) as one line."""
    return " ".join(text.split())


def _text(body: str) -> str:
    return " ".join(_TAG.sub(" ", _HIDDEN.sub(" ", body)).split())


def _path(url: str) -> str:
    try:
        return urlsplit(url).path or "/"
    except ValueError:
        return ""
