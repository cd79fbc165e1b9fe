"""A synthetic knowledge base of any size, with faults planted at a given rate, for benchmarks.

Pages are written one at a time (nothing is held but a counter), and whether a page carries a
fault is a pure function of the seed and the page's number, so a page knows whether the page
it would link to is meant to be an orphan without anything being kept in memory.
"""

from __future__ import annotations

import os
import random
from collections import Counter
from pathlib import Path

from contextos.jobs.kb.findings import FindingKind
from contextos.jobs.kb.fixture import ORIGIN

DIRECTORIES = ("docs", "runbooks", "decisions")
PAGES_PER_FOLDER = 100

PLANTED = (
    FindingKind.DEAD_LINK,
    FindingKind.DEAD_ANCHOR,
    FindingKind.DEAD_EXTERNAL_LINK,
    FindingKind.MISSING_FRONTMATTER,
    FindingKind.INVALID_FRONTMATTER,
    FindingKind.MISSING_FRONTMATTER_KEY,
    FindingKind.HEADING_JUMP,
    FindingKind.DUPLICATE_TITLE,
    FindingKind.EMPTY_SECTION,
    FindingKind.ORPHAN_PAGE,
    FindingKind.OVERSIZE_FILE,
)
"""The kinds planted, in turn."""

_ALIVE = ("/status", "/pricing", "/docs/api", "/docs/sdk/python", "/docs/query-language")
_WORDS = (
    "ingest", "series", "tenant", "retention", "query", "shard", "replica", "compaction",
    "token", "label", "alert", "rule", "dashboard", "backlog", "writer", "partition",
    "latency", "budget", "region", "cache", "block", "tier", "rollout", "failover",
)  # fmt: skip


def fault_of(i: int, *, seed: int, rate: float) -> FindingKind | None:
    """The fault page `i` carries, if any (a pure function: no state between pages)."""
    rng = random.Random(seed * 1_000_003 + i)
    if rng.random() >= rate:
        return None
    return PLANTED[rng.randrange(len(PLANTED))]


def page_path(i: int) -> str:
    folder = DIRECTORIES[i % len(DIRECTORIES)]
    return f"{folder}/part-{i // PAGES_PER_FOLDER:03d}/page-{i:06d}.md"


def generate(
    dest: str | os.PathLike[str],
    *,
    pages: int,
    rate: float = 0.05,
    seed: int = 0,
    max_bytes: int = 65_536,
) -> Counter[FindingKind]:
    """Write `pages` pages under `dest`; the findings a scan must report, by kind.

    Every page links to the next one (so none is an orphan unless planted so), to a page
    further on by its anchor, and to an alive page of the loopback fixture.
    """
    root = Path(dest)
    expected: Counter[FindingKind] = Counter()
    shared_titles = 0
    for i in range(pages):
        fault = fault_of(i, seed=seed, rate=rate)
        text = _page(i, pages, fault, seed=seed, rate=rate, max_bytes=max_bytes)
        path = root / page_path(i)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        if fault is FindingKind.DUPLICATE_TITLE:
            shared_titles += 1
        elif fault is not None:
            expected[fault] += 1
    if shared_titles > 1:  # every page sharing the title is reported; one alone is not
        expected[FindingKind.DUPLICATE_TITLE] = shared_titles
    return expected


def _page(
    i: int, pages: int, fault: FindingKind | None, *, seed: int, rate: float, max_bytes: int
) -> str:
    rng = random.Random(seed * 7919 + i)
    here = page_path(i)
    title = "Shared title" if fault is FindingKind.DUPLICATE_TITLE else f"Page {i}"
    if fault is FindingKind.MISSING_FRONTMATTER:
        front = ""
    elif fault is FindingKind.INVALID_FRONTMATTER:
        front = f"---\ntitle: {title}: draft\nowner: team-{i % 7}\n---\n\n"
    elif fault is FindingKind.MISSING_FRONTMATTER_KEY:
        front = f"---\nowner: team-{i % 7}\n---\n\n"
    else:
        front = f"---\ntitle: {title}\nowner: team-{i % 7}\n---\n\n"
    links = []
    for j in ((i + 1) % pages, (i * 7 + 3) % pages):
        if j != i and fault_of(j, seed=seed, rate=rate) is not FindingKind.ORPHAN_PAGE:
            links.append(f"[page {j}]({_relative(here, page_path(j))}#overview)")
    links.append(f"[{_ALIVE[i % len(_ALIVE)]}]({ORIGIN}{_ALIVE[i % len(_ALIVE)]})")
    if fault is FindingKind.DEAD_LINK:
        links.append(f"[gone](missing-{i}.md)")
    elif fault is FindingKind.DEAD_ANCHOR:
        links.append("[nowhere](#no-such-section)")
    elif fault is FindingKind.DEAD_EXTERNAL_LINK:
        links.append(f"[old guide]({ORIGIN}/docs/v1/ingest?page={i})")
    body = [
        f"# {title}",
        "",
        "## Overview",
        "",
        _paragraph(rng),
        "",
        "See " + ", ".join(links) + ".",
        "",
    ]
    if fault is FindingKind.HEADING_JUMP:
        body += ["#### Details", "", _paragraph(rng), ""]
    if fault is FindingKind.EMPTY_SECTION:
        body += ["## Notes", "## More notes", "", _paragraph(rng), ""]
    body += ["## Procedure", "", *(_paragraph(rng) + "\n" for _ in range(rng.randint(2, 6)))]
    text = front + "\n".join(body)
    if fault is FindingKind.OVERSIZE_FILE:
        text += "\n".join(_paragraph(rng) for _ in range(max_bytes // 300 + 10)) + "\n"
    return text


def _paragraph(rng: random.Random) -> str:
    words = [rng.choice(_WORDS) for _ in range(rng.randint(25, 60))]
    return " ".join(words).capitalize() + "."


def _relative(source: str, target: str) -> str:
    return os.path.relpath(target, os.path.dirname(source)).replace(os.sep, "/")
