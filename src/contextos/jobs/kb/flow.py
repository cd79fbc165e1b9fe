"""The knowledge-base scan as a workflow: durable node by node; a model writes prose and
judges doubted links, and never moves a count.

    plan ─▶ scan (map: one node per top-level directory) ─▶ reduce ─▶ verify (gate per link)
         ─▶ doubts ─▶ judge (map: an agent per doubted page) ─▶ tally ─▶ digest
         ─▶ synthesis (agent) ─▶ report

Each scan node gets its directory, the rules and the previous findings of that directory,
and reads through its own read-only `ReadOnlyDir`. The reduce (code) derives the findings
across pages from the index, where every page's links, anchors and title are kept; the gate
re-verifies every candidate dead link, trying to disprove it; the tally splits findings into
new, still open and fixed and computes every count. A model touches two parts of the report,
neither counted: the judge says yes or no about the few alive pages a pre-filter doubts (soft
404s), and the synthesis agent writes prose from a digest of the gated findings.

Every step notes what it decided in the scan's index (its journal), in the same transaction
as the index changes it made, so a step killed after its work and before the workflow
recorded it gives the same answer again without doing the work again: a link verified once
in a scan is never fetched again by that scan.
"""

from __future__ import annotations

import atexit
import hashlib
import os
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from contextos import Agent, Budget, ModelAdapter, NetworkPolicy, Principal, Subagent, Workflow
from contextos.graph import ClaimCheck, Collected
from contextos.graph import Gated as Checked
from contextos.jobs.kb.checks import Rules
from contextos.jobs.kb.doubts import (
    JUDGE_INSTRUCTIONS,
    MAX_DOUBTS,
    Doubt,
    Judgement,
    Suspect,
    one_line,
)
from contextos.jobs.kb.findings import Finding, FindingKind
from contextos.jobs.kb.fixture import Fixture, reach
from contextos.jobs.kb.gate import RECHECK_LINKS_AFTER_S, carry_links, url_key
from contextos.jobs.kb.index import Index
from contextos.jobs.kb.reduce import Delta, dedupe, reduce
from contextos.jobs.kb.report import Report
from contextos.jobs.kb.scan import ROOT_FILES, Scanner, parts
from contextos.jobs.kb.verify import LinkStatus, LinkVerdict, LinkVerifier
from contextos.middleware import BudgetGate

PAGE_KINDS = frozenset(
    {
        FindingKind.MISSING_FRONTMATTER,
        FindingKind.INVALID_FRONTMATTER,
        FindingKind.MISSING_FRONTMATTER_KEY,
        FindingKind.HEADING_JUMP,
        FindingKind.EMPTY_SECTION,
        FindingKind.OVERSIZE_FILE,
        FindingKind.UNREADABLE_FILE,
    }
)
"""What one page alone shows: found by the scan node of the page's directory."""
LINK_KINDS = frozenset({FindingKind.DEAD_LINK, FindingKind.DEAD_ANCHOR})


class ScanRequest(BaseModel):
    """What one scan is asked to do (the workflow's input)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    root: str
    """The knowledge base's folder (absolute, for runs that a worker elsewhere may resume)."""
    index: str | None = None
    """The scan's state between runs (a SQLite file); by default one per folder under
    `./.contextos/kb/`."""
    full: bool = False
    """Read every page, not only what changed."""
    rules: Rules = Rules()
    allow_hosts: tuple[str, ...] = ()
    """Hosts the link check may fetch (network policy patterns); none by default."""
    sample_site: int | None = None
    """Check the sample's external links against its loopback site instead: 0 serves the
    site in this process, a port uses one serving there."""
    recheck_links_after_s: float = RECHECK_LINKS_AFTER_S
    """An external link found alive or dead is fetched again once that verdict is this old:
    20 hours by default, so a daily scan checks every link again and a second scan the same
    day does not; 0 fetches every link on every scan. An unsure link is always tried again."""


class Where(BaseModel):
    """Where a step works: the scan's number, its folder, its index and its links' reach."""

    model_config = ConfigDict(frozen=True)

    scan: int
    root: str
    index: str
    allow_hosts: tuple[str, ...] = ()
    sample_site: int | None = None


class PartTask(BaseModel):
    """One scan node's whole input: its directory, the rules, its previous findings."""

    at: Where
    part: str
    full: bool
    rules: Rules
    previous: tuple[Finding, ...] = ()
    """The previous run's findings about this directory's pages alone."""


class PartScan(BaseModel):
    """What a scan node found in its directory."""

    part: str
    read: int
    """Pages it read."""
    added: tuple[str, ...] = ()
    changed: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    delta: Delta
    """Its pages' own findings against their previous ones."""


class ScanPlan(BaseModel):
    at: Where
    full: bool
    rules: Rules
    parts: list[PartTask]
    previous: tuple[Finding, ...] = ()
    """The previous run's findings across pages (and those of directories that are gone)."""


class LinkCheck(BaseModel):
    """One candidate dead link for the gate: an internal finding, or an external URL."""

    at: Where
    finding: Finding | None = None
    url: str | None = None

    @property
    def key(self) -> str:
        """Its key in the scan's journal."""
        if self.url is not None:
            return url_key(self.url)
        assert self.finding is not None
        return f"link:{self.finding.fingerprint}"


class Candidates(BaseModel):
    at: Where
    pages: int
    read: int
    links: list[LinkCheck]
    findings: tuple[Finding, ...] = ()
    """Findings across pages that are not links (shared titles, orphans)."""


class Doubts(BaseModel):
    """The alive pages worth a second look, for the judge (at most `MAX_DOUBTS`)."""

    doubts: list[Doubt]
    pages: dict[str, list[str]] = {}
    """The pages linking to each doubted URL."""


class Digest(BaseModel):
    """What the synthesis node is shown: the computed counts and the findings, one line each."""

    headline: str
    new: list[str]
    fixed: list[str]


class Summary(BaseModel):
    """Two or three sentences: what changed since the last scan, and what to fix first."""

    # The synthesis node's answer (its schema's description is what the model is shown):
    # prose for a person, which no code reads.

    text: str


# -- the steps ---------------------------------------------------------------------------------


def plan(request: ScanRequest) -> ScanPlan:
    """Start a scan: its number, whether it reads everything, each directory's task."""
    root = os.path.realpath(request.root)
    index_path = request.index or default_index(root)
    with _lock(index_path), Index(index_path, root) as index:
        full = request.full or index.rebuilt
        at = Where(
            scan=index.run,
            root=root,
            index=os.path.realpath(index_path),
            allow_hosts=request.allow_hosts,
            sample_site=request.sample_site,
        )
        last = index.last("report")
        previous = Report.model_validate_json(last).current() if last else ()
        carry_links(index, older_than=time.time() - request.recheck_links_after_s)
        index.forget_before("report")
        index.put_other("", kind="dir")  # the root itself, for links to it
        index.commit()
    names = parts(root)
    tasks = [
        PartTask(
            at=at,
            part=name,
            full=full,
            rules=request.rules,
            previous=tuple(f for f in previous if f.kind in PAGE_KINDS and _part(f) == name),
        )
        for name in names
    ]
    rest = tuple(f for f in previous if f.kind not in PAGE_KINDS or _part(f) not in names)
    return ScanPlan(at=at, full=full, rules=request.rules, parts=tasks, previous=rest)


def scan_part(task: PartTask) -> PartScan:
    """A scan node: bring one directory up to date in the index, and split its pages' own
    findings against their previous ones."""
    at = task.at
    key = f"part:{task.part}"
    with _lock(at.index), Index(at.index, at.root, run=at.scan) as index:
        done = index.recall(key)
        if done is not None:
            return PartScan.model_validate_json(done)
        surveyed = Scanner(at.root, index=index, rules=task.rules).survey(task.part, full=task.full)
        removed = index.drop_unseen(task.part)
        result = PartScan(
            part=task.part,
            read=surveyed.read,
            added=surveyed.added,
            changed=surveyed.changed,
            removed=tuple(removed),
            delta=reduce(index.own_findings(task.part), task.previous),
        )
        index.note(key, result.model_dump_json())
        index.commit()
    return result


def converge(scan: ScanPlan, found: list[PartScan]) -> Candidates:
    """The reduce, in code: derive the findings across pages from the index, deduplicate
    them, and list every link the gate must re-verify."""
    at = scan.at
    with _lock(at.index), Index(at.index, at.root, run=at.scan) as index:
        done = index.recall("reduce")
        if done is not None:
            return Candidates.model_validate_json(done)
        scanner = Scanner(at.root, index=index, rules=scan.rules)
        index.drop_parts_but(part.part for part in found)  # directories that are gone
        across = dedupe(scanner.across())
        links = [LinkCheck(at=at, finding=f) for f in across if f.kind in LINK_KINDS]
        links += [LinkCheck(at=at, url=url) for url in index.external_urls()]
        result = Candidates(
            at=at,
            pages=index.pages(),
            read=sum(part.read for part in found),
            links=links,
            findings=tuple(f for f in across if f.kind not in LINK_KINDS),
        )
        index.note("reduce", result.model_dump_json())
        index.commit()
    return result


async def disprove(link: LinkCheck) -> ClaimCheck:
    """The gate: try to show the link alive. The verdict is noted before the gate goes on,
    so a scan never fetches a link twice once its verdict is kept."""
    at = link.at
    kept = _journal(at, link.key)
    if kept is not None:
        verdict = LinkVerdict.model_validate_json(kept)
    else:
        verifier = _verifier(at)
        if link.url is not None:
            verdict = await verifier.verify_url(link.url)
            verdict = verdict.model_copy(update={"checked_s": time.time()})
        else:
            assert link.finding is not None
            verdict = verifier.verify_internal(link.finding.path, link.finding.target or "")
        _journal(at, link.key, verdict.model_dump_json())
    return ClaimCheck(holds=verdict.status is not LinkStatus.ALIVE, reason=verdict.detail)


def tally(
    scan: ScanPlan, found: list[PartScan], candidates: Candidates, gated: Checked[LinkCheck]
) -> Report:
    """Split every gated finding into new, still open and fixed; every count is computed
    here, from the lists, never by a model."""
    return _tally(scan, found, candidates, gated, suspects=())


def tally_judged(
    scan: ScanPlan,
    found: list[PartScan],
    candidates: Candidates,
    gated: Checked[LinkCheck],
    asked: Doubts,
    judged: Collected[Doubt, Judgement],
) -> Report:
    """`tally`, with the links the judge said yes about listed apart (never counted)."""
    return _tally(scan, found, candidates, gated, suspects=suspects(asked, judged))


def _tally(
    scan: ScanPlan,
    found: list[PartScan],
    candidates: Candidates,
    gated: Checked[LinkCheck],
    *,
    suspects: tuple[Suspect, ...],
) -> Report:
    at = scan.at
    with _lock(at.index), Index(at.index, at.root, run=at.scan) as index:
        verified = dict.fromkeys(LinkStatus, 0)
        for link in (*gated.passed, *(r.item for r in gated.rejected)):
            verified[_verdict(index, link).status] += 1
        confirmed: list[Finding] = [*candidates.findings]
        for link in gated.passed:
            verdict = _verdict(index, link)
            if link.finding is not None:
                confirmed.append(link.finding)
                continue
            assert link.url is not None
            confirmed += [
                Finding(
                    kind=FindingKind.DEAD_EXTERNAL_LINK,
                    path=use.path,
                    line=use.line,
                    target=link.url,
                    detail=verdict.detail,
                    unsure=verdict.status is LinkStatus.UNSURE,
                )
                for use in index.uses_of(link.url)
            ]
        across = reduce(confirmed, scan.previous)
        split = [*(part.delta for part in found), across]
        report = Report.of(
            Delta(
                new=_sorted(f for d in split for f in d.new),
                open=_sorted(f for d in split for f in d.open),
                fixed=_sorted(f for d in split for f in d.fixed),
            ),
            pages=candidates.pages,
            reread=candidates.read,
            verified=verified,
            suspects=suspects,
        )
        index.note("report", report.model_dump_json())
        index.commit()
    return report


def doubts(gated: Checked[LinkCheck]) -> Doubts:
    """The alive external links the pre-filter doubts (their page reads "not found", they
    landed on the site's home page), from the verdicts the gate kept: the first by URL."""
    found: list[Doubt] = []
    alive = sorted((r.item for r in gated.rejected if r.item.url), key=lambda link: link.key)
    for link in alive:
        kept = _journal(link.at, link.key)
        if kept is None:
            raise RuntimeError(f"no verdict kept for {link.key}: the gate did not record it")
        verdict = LinkVerdict.model_validate_json(kept)
        if verdict.doubt is not None and link.url is not None and len(found) < MAX_DOUBTS:
            found.append(Doubt(url=link.url, why=verdict.doubt, excerpt=verdict.excerpt or ""))
    if not found:  # the usual case: the index is not opened
        return Doubts(doubts=[])
    at = alive[0].at
    with _lock(at.index), Index(at.index, at.root, run=at.scan) as index:
        pages = {d.url: [use.path for use in index.uses_of(d.url)] for d in found}
    return Doubts(doubts=found, pages=pages)


def suspects(asked: Doubts, judged: Collected[Doubt, Judgement]) -> tuple[Suspect, ...]:
    """The doubted links the judge said yes about, with its one line. A page whose judge gave
    no valid answer is left out: a model that answers nonsense changes nothing."""
    failed = {failure.item.url for failure in judged.failed}
    answered = [doubt for doubt in asked.doubts if doubt.url not in failed]
    return tuple(
        Suspect(
            url=doubt.url, pages=tuple(asked.pages.get(doubt.url, ())), reason=one_line(j.reason)
        )
        for doubt, j in zip(answered, judged.results, strict=True)
        if j.soft_404
    )


def digest(report: Report, *, limit: int = 20) -> Digest:
    """The report cut to what a small model can read: its headline, one line a finding."""
    headline = report.markdown().splitlines()[2]

    def lines(findings: tuple[Finding, ...]) -> list[str]:
        shown = [f"{f.kind.label}: {f.path} {f.target or ''}".rstrip() for f in findings]
        more = len(shown) - limit
        return shown[:limit] + ([f"... and {more} more"] if more > 0 else [])

    return Digest(headline=headline, new=lines(report.new), fixed=lines(report.fixed))


def publish(report: Report, summary: Summary) -> Report:
    return report.with_summary(summary.text)


# -- the workflow ------------------------------------------------------------------------------

WRITER_INSTRUCTIONS = (
    "You write the daily knowledge-base report for the people who keep it. You are given the "
    "scan's headline and its new and fixed findings. In two or three sentences, say what "
    "changed since the last scan and what to fix first. Do not invent numbers."
)


SCANNER = Principal.service("kb-scan")
"""Who the command's scans run as (`service:kb-scan@default`), bound to each scan at its start:
the scan's daily token budget counts their tokens alone."""


DAILY_TOKENS = 250_000
"""The model tokens a principal's scans may spend in a UTC day by default: tens of scans of a
knowledge base, and a scheduled scan gone wrong cannot spend more."""


def kb_scan_workflow(
    model: str | ModelAdapter = "local",
    *,
    judge: str | ModelAdapter | None = None,
    budget: Budget | None = None,
    daily_tokens: int | None = DAILY_TOKENS,
) -> Workflow:
    """The scan as a workflow; `model` writes the summary, and `judge` (a model, often the
    same one) says which working links a pre-filter doubts look moved: those are listed
    apart in the report, never counted. Without a `judge` no link is judged.

    `budget` caps one scan; `daily_tokens` caps what the run's bound principal (`SCANNER`
    from the command line) spends in a UTC day, counted by the store: a model call that would
    pass it is refused, and the scan stops with that reason recorded. A scan bound to no
    principal stops the same way (`missing_principal`): start it with `principal=`.
    """
    daily = [BudgetGate(daily_tokens=daily_tokens)] if daily_tokens is not None else []
    writer = Agent(
        name="kb-writer",
        model=model,
        instructions=WRITER_INSTRUCTIONS,
        output_type=Summary,
        budget=Budget(max_turns=2, max_tokens=6_000),
        middleware=daily,
    )
    flow = Workflow(
        "kb-scan", input=ScanRequest, budget=budget or Budget(max_turns=10, max_tokens=20_000)
    )
    planned = flow.code("plan", plan)
    scanned = flow.map("scan", scan_part, over="parts", concurrency=4)
    found = flow.code("reduce", converge, after=[planned, scanned])
    gated = flow.gate("verify", disprove, over="links", claim="this link is dead", concurrency=8)
    counted_from = [planned, scanned, found, gated]
    counting: Callable[..., Report] = tally
    if judge is not None:
        judged_by = Agent(
            name="kb-link-judge",
            model=judge,
            instructions=JUDGE_INSTRUCTIONS,
            output_type=Judgement,
            # one answer or none: a page the model cannot judge at once is left to a person
            budget=Budget(max_turns=1, max_tokens=1_500),
            middleware=daily,
        )
        doubted = flow.code("doubts", doubts)
        judged = flow.map(
            "judge",
            Subagent(agent=judged_by, forbidden_effects=("write",)),
            over="doubts",
            objective="Is this linked page an error page, missing, or moved?",
            merge="collect",
            concurrency=1,  # a few pages, one at a time: the local model runs one at a time
        )
        counted_from += [doubted, judged]
        counting = tally_judged
    counted = flow.code("tally", counting, after=counted_from)
    flow.code("digest", digest)
    summary = flow.agent(
        "synthesis",
        Subagent(agent=writer, forbidden_effects=("write",)),
        objective="Write the summary of this knowledge-base scan.",
    )
    flow.code("report", publish, after=[counted, summary])
    return flow


kb_scan = kb_scan_workflow("local", judge="local")
"""The scan with the embedded local model writing its summary and judging the doubted links
(`contextos kb scan`)."""


def default_index(root: str | os.PathLike[str]) -> str:
    """Where a folder's scan keeps its state by default: `./.contextos/kb/NAME-HASH.db`."""
    real = os.path.realpath(root)
    tag = hashlib.sha256(real.encode()).hexdigest()[:8]
    return str(Path(".contextos") / "kb" / f"{Path(real).name or 'root'}-{tag}.db")


# -- helpers -----------------------------------------------------------------------------------

_locks: dict[str, threading.Lock] = {}
_verifiers: dict[Where, LinkVerifier] = {}
_journals: dict[tuple[str, int], sqlite3.Connection] = {}
"""One open connection per index file for the gate's journal (closing one checkpoints)."""
_served: list[Fixture] = []


def _lock(index: str) -> threading.Lock:
    """One writer at a time on an index in this process (the steps run in threads)."""
    return _locks.setdefault(os.path.realpath(index), threading.Lock())


def _verifier(at: Where) -> LinkVerifier:
    key = at.model_copy(update={"scan": 0})
    found = _verifiers.get(key)
    if found is not None:
        return found
    if at.sample_site is None:
        reachable: dict[str, Any] = {"network": NetworkPolicy(allow=at.allow_hosts)}
    else:
        reachable = reach(at.sample_site or _serve_sample())
    made = _verifiers[key] = LinkVerifier(at.root, **reachable)
    return made


def _serve_sample() -> int:
    """The sample's loopback site, served by this process until it exits."""
    if not _served:
        site = Fixture().__enter__()
        atexit.register(site.__exit__, None, None, None)
        _served.append(site)
    return _served[0].port


def _journal(at: Where, key: str, value: str | None = None) -> str | None:
    """Read (or, with `value`, durably write) one entry of the scan's journal: the gate's
    per-link path, on a connection kept open for the index, without the cost of opening the
    whole index (or a connection, whose close checkpoints the WAL) for each link."""
    with _lock(at.index):
        inode = os.stat(at.index).st_ino  # an index deleted and made again is another file
        db = _journals.get((at.index, inode))
        if db is None:
            db = sqlite3.connect(at.index, timeout=60.0, check_same_thread=False)
            # In WAL mode a commit without a sync survives the process being killed; only a
            # power loss can cost the last verdicts, and then those links are fetched again.
            db.execute("PRAGMA synchronous=NORMAL")
            _journals[(at.index, inode)] = db
            atexit.register(db.close)
        if value is not None:
            with db:
                db.execute("INSERT OR REPLACE INTO journal VALUES (?, ?, ?)", (at.scan, key, value))
            return value
        row = db.execute(
            "SELECT value FROM journal WHERE run=? AND key=?", (at.scan, key)
        ).fetchone()
        return None if row is None else str(row[0])


def _verdict(index: Index, link: LinkCheck) -> LinkVerdict:
    kept = index.recall(link.key)
    if kept is None:
        raise RuntimeError(f"no verdict kept for {link.key}: the gate did not record it")
    return LinkVerdict.model_validate_json(kept)


def _part(finding: Finding) -> str:
    head, sep, _ = finding.path.partition("/")
    return head if sep else ROOT_FILES


def _sorted(findings: Any) -> tuple[Finding, ...]:
    return tuple(sorted(findings, key=Finding.sort_key))
