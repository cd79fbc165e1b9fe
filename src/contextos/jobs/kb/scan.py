"""The deterministic scan: walk each top-level directory through its own read-only tools,
re-read only what changed (and what links to it), and derive every finding from the index.

Which files are re-read: a file whose size or modification time changed is hashed; one whose
sha256 changed (or that is new) is re-read, and so is every page that links to a changed, new
or removed file. `full` re-reads everything. A file whose timestamps match but that was written
within `RACY_NS` of being indexed is hashed anyway: file-system clocks are coarse, so a quick
second edit can keep the same size and time (git calls these "racily clean").
"""

from __future__ import annotations

import hashlib
import os
import posixpath
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from contextos.errors import ConfigError, ContextOSError
from contextos.jobs.kb.checks import (
    Rules,
    check_links,
    check_page,
    duplicate_titles,
    orphans,
)
from contextos.jobs.kb.findings import Finding, FindingKind
from contextos.jobs.kb.index import Index
from contextos.jobs.kb.markdown import parse
from contextos.jobs.kb.tools import FileInfo, ReadOnlyDir

RACY_NS = 2_000_000_000
"""How recent (before it was indexed) a file's modification must be for its timestamps not to
be trusted."""

ROOT_FILES = "."
"""The part of the knowledge base made of the files directly in its root."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Plan:
    """What a scan re-read, and why."""

    full: bool
    """Everything was re-read (asked for, or there was no usable index)."""
    added: tuple[str, ...]
    """Pages that are new since the last scan."""
    changed: tuple[str, ...]
    """Pages whose content hash changed."""
    removed: tuple[str, ...]
    """Files (pages or not) that are gone."""
    linking: tuple[str, ...]
    """Unchanged pages re-read because they link to an added, changed or removed file."""
    pages: int
    """Pages in the knowledge base."""

    @property
    def reread(self) -> tuple[str, ...]:
        """Every page read and checked again, sorted."""
        return tuple(sorted({*self.added, *self.changed, *self.linking}))


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
        if not self.root.is_dir():
            raise ConfigError(f"{root} is not a directory: give the knowledge base's path")
        self.index = index
        self.rules = rules
        self._dirs = {
            part: ReadOnlyDir(
                self.root / part,
                prefix="" if part == ROOT_FILES else part,
                max_read_bytes=rules.max_bytes,
            )
            for part in parts(self.root)
        }

    def scan(self, *, full: bool = False) -> Scan:
        """Bring the index up to date with the files, then derive every finding from it."""
        full = full or self.index.rebuilt
        added: list[str] = []
        changed: list[str] = []
        self.index.put_other("", kind="dir")  # the root itself, for links to it
        for part in self._dirs:
            for path, info in self._walk(part):
                if not self.rules.is_page(path):
                    self._put_other(path, info)
                elif (state := self._survey(path, info, full=full)) is not None:
                    (added if state == "added" else changed).append(path)
        removed = self.index.drop_unseen()
        linking: list[str] = []
        if not full:
            touched = {*added, *changed}
            linking = [p for p in self.index.linking_to([*touched, *removed]) if p not in touched]
            for path in linking:
                self._reread(path)
        plan = Plan(
            full=full,
            added=tuple(added),
            changed=tuple(changed),
            removed=tuple(removed),
            linking=tuple(linking),
            pages=self.index.pages(),
        )
        self.index.commit()
        return Scan(plan=plan, findings=tuple(sorted(self.findings(), key=Finding.sort_key)))

    def findings(self) -> Iterator[Finding]:
        """Every candidate finding the index shows now."""
        yield from self.index.own_findings()
        yield from check_links(self.index.internal_links())
        yield from duplicate_titles(self.index.titles())
        yield from orphans(self.index.inbound(), self.rules)

    def _walk(self, part: str) -> Iterator[tuple[str, FileInfo]]:
        """Every file and directory of a part (KB-relative path, what stat says), dot-files
        left out; the root's own part holds only the files directly in the root."""
        files = self._dirs[part]
        pending = ["."]
        while pending:
            here = pending.pop()
            for name in files.entries(here):
                if name.startswith("."):
                    continue
                rel = posixpath.normpath(posixpath.join(here, name.rstrip("/")))
                path = rel if part == ROOT_FILES else f"{part}/{rel}"
                if name.endswith("/"):
                    if part != ROOT_FILES:
                        pending.append(rel)
                        yield path, FileInfo(kind="dir", size=0, mtime_ns=0)
                    continue
                yield path, files.stat(rel)
        if part != ROOT_FILES:
            yield part, FileInfo(kind="dir", size=0, mtime_ns=0)

    def _put_other(self, path: str, info: FileInfo) -> None:
        self.index.put_other(path, kind=info.kind, size=info.size, mtime_ns=info.mtime_ns)

    def _survey(self, path: str, info: FileInfo, *, full: bool) -> str | None:
        """Bring one page up to date: `added` or `changed` when it was re-read, else None."""
        before = self.index.entry(path)
        if before is None or before.kind != "page":
            self._reread(path, info)
            return "added"
        if full:
            self._reread(path, info)
            return "changed"
        same_stat = (before.size, before.mtime_ns) == (info.size, info.mtime_ns)
        if same_stat and info.mtime_ns < before.indexed_ns - RACY_NS:
            self.index.keep(path, size=info.size, mtime_ns=info.mtime_ns, checked=False)
            return None
        text = self._read(path, info)
        sha256 = None if text is None else _sha256(text)
        if sha256 == before.sha256:  # the same content (or still unreadable)
            self.index.keep(path, size=info.size, mtime_ns=info.mtime_ns, checked=True)
            return None
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


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()
