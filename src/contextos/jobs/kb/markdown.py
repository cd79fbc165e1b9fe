"""One Markdown page read into what the checks need: frontmatter, headings, anchors and links.

Pure functions over text, no I/O. Headings and links inside fenced code blocks and inline code
spans are not headings or links, as a renderer would have it; anchors are GitHub's slugs.
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass
from enum import StrEnum
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

import yaml


@dataclass(frozen=True, kw_only=True, slots=True)
class Heading:
    """An ATX (`## Title`) or setext (underlined) heading."""

    level: int
    """1 to 6."""
    text: str
    """The heading as plain text (inline markup removed)."""
    line: int
    """1-based line number."""
    slug: str
    """Its anchor, GitHub-style and unique within the page."""
    has_body: bool
    """Whether anything but blank lines comes before the next heading."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Link:
    """A link as written: inline, image, reference definition, autolink, bare URL or HTML."""

    target: str
    """The destination exactly as written (without angle brackets)."""
    line: int
    """1-based line number."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Frontmatter:
    """The YAML block between `---` lines at the top of a page."""

    present: bool
    """Whether the page opens with a `---` line."""
    data: dict[str, Any] | None = None
    """The parsed mapping, when it parsed into one."""
    error: str | None = None
    """Why the block is invalid, when it is."""
    error_line: int | None = None
    """Where the problem is (1-based line of the page)."""
    key_lines: dict[str, int] | None = None
    """The line of each top-level key."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Page:
    """What one page holds, as the checks see it."""

    frontmatter: Frontmatter
    """Its frontmatter (absent, invalid or parsed)."""
    headings: tuple[Heading, ...]
    """Its headings in order."""
    anchors: frozenset[str]
    """Every anchor a link may name: heading slugs and HTML `id`/`name` attributes."""
    links: tuple[Link, ...]
    """Its links in order."""
    title: str | None
    """The frontmatter `title`, else the first level-1 heading."""
    title_line: int | None
    """Where the title is."""


class TargetKind(StrEnum):
    INTERNAL = "internal"
    """A file in the knowledge base (maybe with an anchor), or an anchor of the page itself."""
    EXTERNAL = "external"
    """An http(s) URL."""
    OUTSIDE = "outside"
    """A relative path that climbs out of the knowledge base."""
    OTHER = "other"
    """Anything not checked: mailto:, tel:, ftp:, …"""


@dataclass(frozen=True, kw_only=True, slots=True)
class Target:
    """Where a link points, resolved against the page that holds it."""

    kind: TargetKind
    path: str | None = None
    """For internal links: the file, relative to the knowledge base's root (posix)."""
    anchor: str | None = None
    """For internal links: the `#fragment`, decoded, if any."""
    url: str | None = None
    """For external links: the URL normalised for comparison (no fragment)."""


_YAML = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
"""libyaml's safe loader when PyYAML was built with it (several times faster), else Python's."""
_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
_ATX = re.compile(r"^ {0,3}(#{1,6})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$")
_SETEXT = re.compile(r"^ {0,3}(=+|-+)[ \t]*$")
_NOT_PARAGRAPH = re.compile(r"^ {0,3}(?:[-*+>|]|\d+[.)]\s|#|<|$)|^ {4}")
_CODE_SPAN = re.compile(r"(`+)(?!`).*?(?<!`)\1(?!`)")
_INLINE = re.compile(
    r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*(<[^>\n]*>|[^)\s]+)"
    r"(?:\s+\"[^\"]*\"|\s+'[^']*'|\s+\([^)]*\))?\s*\)"
)
_REFERENCE = re.compile(r"^ {0,3}\[[^\]]+\]:\s*(<[^>]*>|\S+)")
_AUTOLINK = re.compile(r"<((?:https?|mailto):[^>\s]+)>", re.I)
_HTML_HREF = re.compile(r"<a\s[^>]*?\bhref\s*=\s*[\"']([^\"']+)[\"']", re.I)
_HTML_ID = re.compile(r"<[a-z][^>]*?\b(?:id|name)\s*=\s*[\"']([^\"']+)[\"']", re.I)
_BARE_URL = re.compile(r"\bhttps?://[^\s<>\[\]()\"'`]+", re.I)
_URL_TRAILER = ".,:;!?*_~'\""
_SCHEME = re.compile(r"^[a-z][a-z0-9+.-]*:", re.I)
_SLUG_DROP = re.compile(r"[^\w\- ]")
_MARKUP = (
    (re.compile(r"!\[([^\]]*)\]\([^)]*\)"), r"\1"),  # images: their alt text
    (re.compile(r"\[([^\]]*)\]\([^)]*\)"), r"\1"),  # links: their text
    (re.compile(r"\[([^\]]*)\]\[[^\]]*\]"), r"\1"),  # reference links
    (re.compile(r"<[^>]+>"), ""),  # inline HTML
    (re.compile(r"`+"), ""),  # code spans keep their text
    (re.compile(r"\*+|~~|(?<!\w)_+|_+(?!\w)"), ""),  # emphasis and strike-through
)


def parse(text: str) -> Page:
    """Read a page's text (pure)."""
    lines = text.splitlines()
    frontmatter, start = _frontmatter(lines)
    headings: list[tuple[int, str, int]] = []  # level, plain text, line
    bodies: list[bool] = []  # per heading: anything but blank lines before the next one
    links: list[Link] = []
    html_ids: set[str] = set()
    fence: str | None = None
    previous = ""  # the last paragraph line, which an underline turns into a heading
    before_previous = False  # whether the heading above had a body before that line
    for number, line in enumerate(lines[start:], start + 1):
        if fence is not None:
            if set(line.strip()) == {fence[0]} and len(line.strip()) >= len(fence):
                fence = None
            _mark_body(bodies)
            continue
        opened = _FENCE.match(line)
        atx = _ATX.match(line)
        underline = _SETEXT.match(line)
        if opened:
            fence = opened.group(1)
            _mark_body(bodies)
            previous = ""
            continue
        if underline and previous:
            # the paragraph line above was a heading, not body of the heading before it
            if bodies:
                bodies[-1] = before_previous
            level = 1 if underline.group(1)[0] == "=" else 2
            headings.append((level, plain(previous), number - 1))
            bodies.append(False)
            previous = ""
            continue
        if atx:
            headings.append((len(atx.group(1)), plain(atx.group(2) or ""), number))
            bodies.append(False)
            previous = ""
        elif line.strip():
            paragraph = not _NOT_PARAGRAPH.match(line)
            before_previous = bool(bodies) and bodies[-1]
            previous = line if paragraph else ""
            _mark_body(bodies)
        else:
            previous = ""
        links.extend(Link(target=t, line=number) for t in _links_in(line))
        html_ids.update(m.group(1) for m in _HTML_ID.finditer(line))
    slugs = _unique_slugs([text for _, text, _ in headings])
    made = tuple(
        Heading(level=level, text=text, line=line, slug=slug, has_body=body)
        for (level, text, line), slug, body in zip(headings, slugs, bodies, strict=True)
    )
    title, title_line = _title(frontmatter, made)
    return Page(
        frontmatter=frontmatter,
        headings=made,
        anchors=frozenset(slugs) | frozenset(html_ids),
        links=tuple(links),
        title=title,
        title_line=title_line,
    )


def _mark_body(bodies: list[bool]) -> None:
    if bodies:
        bodies[-1] = True


def _frontmatter(lines: list[str]) -> tuple[Frontmatter, int]:
    """The frontmatter and the index of the first content line."""
    if not lines or lines[0].rstrip() != "---":
        return Frontmatter(present=False), 0
    end = next((i for i in range(1, len(lines)) if lines[i].rstrip() in ("---", "...")), None)
    if end is None:
        return Frontmatter(
            present=True, error="the block opened on line 1 is never closed", error_line=1
        ), 1
    block = "\n".join(lines[1:end])
    try:
        data = yaml.load(block, Loader=_YAML)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = mark.line + 2 if mark is not None else 1
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        invalid = Frontmatter(present=True, error=f"invalid YAML: {problem}", error_line=where)
        return invalid, end + 1
    if data is None:
        data = {}
    if not isinstance(data, dict):
        return Frontmatter(
            present=True,
            error=f"the block is a YAML {type(data).__name__}, not a mapping of keys",
            error_line=2,
        ), end + 1
    key_lines: dict[str, int] = {}
    for i in range(1, end):
        key = re.match(r"([^\s:#][^:]*?)\s*:", lines[i])
        if key and not lines[i][0].isspace():
            key_lines.setdefault(key.group(1).strip("'\""), i + 1)
    return Frontmatter(present=True, data=data, key_lines=key_lines), end + 1


def _links_in(line: str) -> list[str]:
    line = _CODE_SPAN.sub(lambda m: " " * len(m.group(0)), line)
    found: list[tuple[int, str]] = []
    for pattern in (_INLINE, _AUTOLINK, _HTML_HREF):
        for m in pattern.finditer(line):
            found.append((m.start(), m.group(1).strip("<>")))
        line = pattern.sub(lambda m: " " * len(m.group(0)), line)
    reference = _REFERENCE.match(line)
    if reference:
        found.append((reference.start(1), reference.group(1).strip("<>")))
        line = " " * reference.end()
    for m in _BARE_URL.finditer(line):
        found.append((m.start(), m.group(0).rstrip(_URL_TRAILER)))
    return [target for _, target in sorted(found)]


def plain(text: str) -> str:
    """A heading's text without inline markup, as it renders."""
    for pattern, replacement in _MARKUP:
        text = pattern.sub(replacement, text)
    return " ".join(text.split())


def slug(text: str) -> str:
    """GitHub's anchor for a heading's plain text: lowercase, punctuation dropped, spaces to
    hyphens (not collapsed)."""
    return _SLUG_DROP.sub("", text.strip().lower()).replace(" ", "-")


def _unique_slugs(texts: list[str]) -> list[str]:
    """Slugs in order; a repeated one gets `-1`, `-2`, … as GitHub numbers them."""
    seen: set[str] = set()
    out: list[str] = []
    for text in texts:
        base = candidate = slug(text)
        n = 0
        while candidate in seen:
            n += 1
            candidate = f"{base}-{n}"
        seen.add(candidate)
        out.append(candidate)
    return out


def _title(
    frontmatter: Frontmatter, headings: tuple[Heading, ...]
) -> tuple[str | None, int | None]:
    data = frontmatter.data or {}
    title = data.get("title")
    if isinstance(title, str) and title.strip():
        return " ".join(title.split()), (frontmatter.key_lines or {}).get("title")
    first = next((h for h in headings if h.level == 1 and h.text), None)
    return (first.text, first.line) if first else (None, None)


def resolve(page: str, target: str) -> Target:
    """Where `target`, written in the page at `page` (posix, relative to the root), points."""
    target = target.strip()
    if target.startswith("//"):
        target = "https:" + target
    if _SCHEME.match(target):
        if target.partition(":")[0].lower() not in ("http", "https"):
            return Target(kind=TargetKind.OTHER)
        return Target(kind=TargetKind.EXTERNAL, url=normalise_url(target))
    path_part, _, fragment = target.partition("#")
    path_part = path_part.partition("?")[0]
    anchor = unquote(fragment) if fragment else None
    if not path_part:
        return Target(kind=TargetKind.INTERNAL, path=page, anchor=anchor)
    path_part = unquote(path_part)
    if path_part.startswith("/"):
        joined = path_part.lstrip("/")
    else:
        joined = posixpath.join(posixpath.dirname(page), path_part)
    resolved = posixpath.normpath(joined)
    if resolved == ".." or resolved.startswith("../"):
        return Target(kind=TargetKind.OUTSIDE)
    return Target(kind=TargetKind.INTERNAL, path="" if resolved == "." else resolved, anchor=anchor)


def normalise_url(url: str) -> str:
    """A URL in the form two links to the same resource share: lowercase scheme and host, no
    default port, no fragment. A URL that does not parse comes back as written, less its
    fragment (the verifier reports it)."""
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError:
        return url.strip().partition("#")[0]
    scheme = parts.scheme.lower()
    host = (parts.hostname or "").lower()
    if ":" in host:
        host = f"[{host}]"
    if port is not None and (scheme, port) not in (("http", 80), ("https", 443)):
        host = f"{host}:{port}"
    userinfo = parts.netloc.rpartition("@")[0]
    netloc = f"{userinfo}@{host}" if userinfo else host
    return urlunsplit((scheme, netloc, parts.path or "/", parts.query, ""))
