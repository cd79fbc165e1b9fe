"""The deterministic scan: walk each top-level directory through its own read-only tools,
re-read only what changed (and what links to it), and derive every finding from the index.

Which files are re-read: a file whose size or modification time changed is hashed; one whose
sha256 changed (or that is new) is re-read. A page that links to a changed, new or removed file
is not: its links are in the index, and the checks across pages are queries over the index, so
they see the change without reading the page. `full` re-reads everything. A file whose
timestamps match but that was written within `RACY_NS` of being indexed is hashed anyway:
file-system clocks are coarse, so a quick second edit can keep the same size and time (git
calls these "racily clean").
"""

from __future__ import annotations

import hashlib
import os
import posixpath
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from contextos.errors import ContextOSError
from contextos.jobs.kb.checks import (
    Rules,
    check_links,
    check_page,
    duplicate_titles,
    orphans,
)
from contextos.jobs.kb.findings import Finding, FindingKind
from contextos.jobs.kb.index import ROOT_PART, Entry, Index
from contextos.jobs.kb.markdown import parse
from contextos.jobs.kb.tools import FileInfo, ReadOnlyDir

RACY_NS = 2_000_000_000
"""How recent (before it was indexed) a file's modification must be for its timestamps not to
be trusted."""

ROOT_FILES = ROOT_PART
"""The part of the knowledge base made of the files directly in its root."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Plan:
    """What a scan re-read, and why."""

    full: bool
    """Every page was read (asked for, or there was no usable index). The lists of pages
    stay empty then: a full scan keeps no list that grows with the knowledge base."""
    pages: int
    """Pages in the knowledge base."""
    read: int
    """Pages read and checked by this scan."""
    added: tuple[str, ...] = ()
    """Pages that are new since the last scan."""
    changed: tuple[str, ...] = ()
    """Pages whose content hash changed."""
    linking: tuple[str, ...] = ()
    """Unchanged pages whose links to an added, changed or removed file were checked again
    (from the index: they are not read)."""
    removed: tuple[str, ...] = ()
    """Files (pages or not) that are gone."""

    @property
    def reread(self) -> tuple[str, ...]:
        """The pages an incremental scan read, sorted (empty for a full scan)."""
        return tuple(sorted({*self.added, *self.changed}))


@dataclass(frozen=True, kw_only=True, slots=True)
class Scan:
    """The outcome of a scan: its plan and the candidate findings (links not yet verified)."""

    plan: Plan
    findings: tuple[Finding, ...]


def parts(root: str | os.PathLike[str]) -> list[str]:
    """The independent parts of a knowledge base: its top-level directories, and `.` for the
    pages directly in its root when there are any. Each is scanned through its own tools."""
    base = ReadOnlyDir(root)
    names = [n for n in base.entries() if not n.startswith(".")]
    found = [n.rstrip("/") for n in names if n.endswith("/")]
    if any(not n.endswith("/") for n in names):
        found.insert(0, ROOT_FILES)
    return found


class Scanner:
    """Scans one knowledge base against its index."""

    def __init__(self, root: str | os.PathLike[str], *, index: Index, rules: Rules) -> None:
        self.root = Path(root)
        self.index = index
        self.rules = rules
        self._dirs = {
            part: ReadOnlyDir(self.root / part, prefix="" if part == ROOT_FILES else part)
            for part in parts(self.root)
        }

    def scan(self, *, full: bool = False) -> Scan:
        """Bring the index up to date with the files, then derive every finding from it."""
        full = full or self.index.rebuilt
        self.index.put_other("", kind="dir")  # the root itself, for links to it
        added: list[str] = []
        changed: list[str] = []
        read = 0
        for part in self._dirs:
            surveyed = self.survey(part, full=full)
            read += surveyed.read
            added += surveyed.added
            changed += surveyed.changed
        removed = self.index.drop_unseen()
        linking = [] if full else self.follow([*added, *changed], removed)
        plan = Plan(
            full=full,
            pages=self.index.pages(),
            read=read,
            added=tuple(added),
            changed=tuple(changed),
            linking=tuple(linking),
            removed=tuple(removed),
        )
        self.index.commit()
        return Scan(plan=plan, findings=tuple(sorted(self.findings(), key=Finding.sort_key)))

    def survey(self, part: str, *, full: bool) -> Plan:
        """Bring one part's entries up to date in the index (its removed files are left to
        `drop_unseen`); what it read, as a plan of that part alone."""
        found: dict[str, list[str]] = {"added": [], "changed": []}
        read = 0
        for folder in self._folders(part) if part in self._dirs else ():  # gone since planned
            for path, state in self._update(folder, full=full):
                read += 1
                if not full:
                    found[state].append(path)
        return Plan(
            full=full,
            pages=read,
            read=read,
            added=tuple(found["added"]),
            changed=tuple(found["changed"]),
        )

    def follow(self, touched: list[str], removed: list[str]) -> list[str]:
        """The unchanged pages that link to a `touched` or `removed` file, sorted."""
        seen = set(touched)
        return [p for p in self.index.linking_to([*touched, *removed]) if p not in seen]

    def findings(self) -> Iterator[Finding]:
        """Every candidate finding the index shows now."""
        yield from self.index.own_findings()
        yield from self.across()

    def across(self) -> Iterator[Finding]:
        """The candidate findings across pages: links, shared titles, orphans."""
        yield from check_links(self.index.suspect_links())
        yield from duplicate_titles(self.index.shared_titles())
        yield from orphans(self.index.unlinked_pages(), self.rules)

    def _folders(self, part: str) -> Iterator[list[tuple[str, FileInfo]]]:
        """The files and directories of a part, one folder at a time (KB-relative path, what
        stat says), dot-files left out; the root's own part holds only the root's files."""
        files = self._dirs[part]
        if part != ROOT_FILES:
            yield [(part, files.stat("."))]
        pending = ["."]
        while pending:
            here = pending.pop()
            folder: list[tuple[str, FileInfo]] = []
            for name, info in files.listing(here):
                if name.startswith(".") or (name.endswith("/") and part == ROOT_FILES):
                    continue
                rel = posixpath.normpath(posixpath.join(here, name.rstrip("/")))
                folder.append((rel if part == ROOT_FILES else f"{part}/{rel}", info))
                if name.endswith("/"):
                    pending.append(rel)
            yield folder

    def _update(
        self, folder: list[tuple[str, FileInfo]], *, full: bool
    ) -> Iterator[tuple[str, str]]:
        """Bring one folder's entries up to date in the index; (page, `added` or `changed`)
        for each page read again."""
        known = self.index.entries([path for path, _ in folder])
        unchanged: list[str] = []
        for path, info in folder:
            before = known.get(path)
            if self.rules.is_page(path):
                state = self._survey(path, info, before, full=full)
                if state in ("added", "changed"):
                    yield path, state
                elif state == "same":
                    unchanged.append(path)
            elif before and before.kind == info.kind and _same_stat(before, info):
                unchanged.append(path)
            else:
                self.index.put_other(path, kind=info.kind, size=info.size, mtime_ns=info.mtime_ns)
        self.index.mark_seen(unchanged)

    def _survey(self, path: str, info: FileInfo, before: Entry | None, *, full: bool) -> str:
        """Bring one page up to date. `added` or `changed`: it was read again; `same`: its
        size and time say it did not change; `checked`: its hash says so."""
        if before is None or before.kind != "page":
            self._reread(path, info)
            return "added"
        if full:
            self._reread(path, info)
            return "changed"
        if _same_stat(before, info) and info.mtime_ns < before.indexed_ns - RACY_NS:
            return "same"
        text = self._read(path, info)
        sha256 = None if text is None else _sha256(text)
        if sha256 == before.sha256:  # the same content (or still unreadable)
            self.index.keep(path, size=info.size, mtime_ns=info.mtime_ns)
            return "checked"
        if text is not None:
            self._store(path, info, text)
        return "changed"

    def _reread(self, path: str, info: FileInfo | None = None) -> None:
        files, rel = self._locate(path)
        info = info or files.stat(rel)
        text = self._read(path, info)
        if text is not None:
            self._store(path, info, text)

    def _store(self, path: str, info: FileInfo, text: str) -> None:
        page = parse(text)
        self.index.put_page(
            path,
            page,
            size=info.size,
            mtime_ns=info.mtime_ns,
            sha256=_sha256(text),
            findings=check_page(path, page, size=info.size, rules=self.rules),
        )

    def _read(self, path: str, info: FileInfo) -> str | None:
        """The page's text; None (and an `unreadable_file` finding) when it cannot be read."""
        files, rel = self._locate(path)
        try:
            return files.read(rel)
        except (OSError, ContextOSError) as exc:
            why = exc.message if isinstance(exc, ContextOSError) else exc.strerror or str(exc)
            finding = Finding(kind=FindingKind.UNREADABLE_FILE, path=path, detail=why)
            self.index.put_unreadable(path, finding, size=info.size, mtime_ns=info.mtime_ns)
            return None

    def _locate(self, path: str) -> tuple[ReadOnlyDir, str]:
        part, _, rel = path.partition("/")
        if not rel:
            return self._dirs[ROOT_FILES], path
        return self._dirs[part], rel


def _same_stat(before: Entry, info: FileInfo) -> bool:
    return (before.size, before.mtime_ns) == (info.size, info.mtime_ns)


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()
