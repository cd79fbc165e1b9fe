"""The page checks and the Markdown reading under them, case by case."""

from __future__ import annotations

import pytest

from contextos.jobs.kb import FindingKind, Rules
from contextos.jobs.kb.checks import check_page
from contextos.jobs.kb.markdown import TargetKind, parse, resolve, slug


@pytest.mark.parametrize(
    ("heading", "anchor"),
    [
        ("What's new in v2.0?", "whats-new-in-v20"),
        ("Foo  bar -- baz_qux", "foo--bar----baz_qux"),
        ("Ünïcode Überschrift", "ünïcode-überschrift"),
        ("C++ & Rust: a comparison", "c--rust-a-comparison"),
    ],
)
def test_anchors_are_githubs_slugs(heading: str, anchor: str) -> None:
    assert slug(heading) == anchor


def test_repeated_headings_are_numbered_and_markup_is_not_part_of_the_slug() -> None:
    page = parse("# Setup\n\nt\n\n## Steps\n\nx\n\n## Steps\n\ny\n\n## The `tier` *function*\n\nz")
    assert [h.slug for h in page.headings] == ["setup", "steps", "steps-1", "the-tier-function"]


Found = list[tuple[FindingKind, int | None]]


def kinds(text: str, rules: Rules | None = None, size: int = 10) -> Found:
    page = parse(text)
    return [(f.kind, f.line) for f in check_page("p.md", page, size=size, rules=rules or Rules())]


FRONT = "---\ntitle: A page\n---\n"


def test_code_is_neither_headings_nor_links() -> None:
    text = FRONT + "# A\n\n```bash\n# a comment\n[x](missing.md)\n```\n\n~~~\n## no\n~~~\n"
    text += "\n`[y](z.md)` text\n"
    page = parse(text)
    assert [h.text for h in page.headings] == ["A"]
    assert page.links == ()
    assert kinds(text) == []  # the code block is the section's body: not empty


def test_setext_headings_count_as_headings() -> None:
    page = parse(FRONT + "Title\n=====\n\nIntro.\n\nPart\n----\n\nBody.\n")
    assert [(h.level, h.text, h.line) for h in page.headings] == [(1, "Title", 4), (2, "Part", 9)]


def test_heading_jumps_and_empty_sections() -> None:
    text = FRONT + "# A\n\nx\n\n### Too deep\n\ny\n\n## Empty\n## Next\n\nz\n\n## Last\n"
    assert kinds(text) == [
        (FindingKind.HEADING_JUMP, 8),
        (FindingKind.EMPTY_SECTION, 12),
        (FindingKind.EMPTY_SECTION, 17),
    ]
    # a heading followed by a deeper one is a section with subsections, not an empty one
    assert kinds(FRONT + "# A\n## B\n\nx\n") == []


@pytest.mark.parametrize(
    ("front", "found"),
    [
        ("", [(FindingKind.MISSING_FRONTMATTER, None)]),
        ("---\ntitle: a: b\n---\n", [(FindingKind.INVALID_FRONTMATTER, 2)]),
        ("---\ntitle: x\n", [(FindingKind.INVALID_FRONTMATTER, 1)]),
        ("---\n- a list\n---\n", [(FindingKind.INVALID_FRONTMATTER, 2)]),
        ("---\nowner: me\n---\n", [(FindingKind.MISSING_FRONTMATTER_KEY, 1)]),
        ("---\nowner: me\ntitle:\n---\n", [(FindingKind.MISSING_FRONTMATTER_KEY, 3)]),
        ("---\ntitle: Fine\n---\n", []),
    ],
)
def test_frontmatter(front: str, found: Found) -> None:
    assert kinds(front + "# A\n\ntext\n") == found


def test_required_keys_and_the_size_limit_are_rules() -> None:
    rules = Rules(required_keys=("title", "owner"), max_bytes=100)
    assert kinds(FRONT + "# A\n\nx\n", rules, size=101) == [
        (FindingKind.MISSING_FRONTMATTER_KEY, 1),
        (FindingKind.OVERSIZE_FILE, None),
    ]


def test_links_of_every_form() -> None:
    text = (
        '[a](a.md "Title") ![img](i.png) <https://x.test/a> https://x.test/b.\n'
        "[ref]: <b.md>\n"
        '<a href="c.md">c</a> mailto:me@x.test\n'
    )
    assert [(link.target, link.line) for link in parse(text).links] == [
        ("a.md", 1),
        ("i.png", 1),
        ("https://x.test/a", 1),
        ("https://x.test/b", 1),
        ("b.md", 2),
        ("c.md", 3),
    ]


@pytest.mark.parametrize(
    ("target", "kind", "path", "anchor"),
    [
        ("../runbooks/x.md#Step-2", TargetKind.INTERNAL, "runbooks/x.md", "Step-2"),
        ("#top", TargetKind.INTERNAL, "docs/a.md", "top"),
        ("/docs/b.md", TargetKind.INTERNAL, "docs/b.md", None),
        ("my%20page.md?plain=1", TargetKind.INTERNAL, "docs/my page.md", None),
        ("../../etc/passwd", TargetKind.OUTSIDE, None, None),
        ("mailto:me@x.test", TargetKind.OTHER, None, None),
    ],
)
def test_targets_resolve_from_the_page(
    target: str, kind: TargetKind, path: str | None, anchor: str | None
) -> None:
    where = resolve("docs/a.md", target)
    assert (where.kind, where.path, where.anchor) == (kind, path, anchor)


def test_external_urls_are_compared_in_one_form() -> None:
    assert resolve("a.md", "HTTP://Example.TEST:80/x?q=1#frag").url == "http://example.test/x?q=1"
    assert resolve("a.md", "//example.test").url == "https://example.test/"
