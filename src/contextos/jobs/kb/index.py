"""The scan's index: one summary per file (hash, title, anchors, links), kept in SQLite.

The index is what lets a scan stream: pages are read one at a time and only their summaries
are kept, on disk, so memory does not grow with the knowledge base; the checks across pages
are queries. It is also the previous run's state for an incremental scan. It is a cache: one
written by another version or for another root is discarded and the scan starts over.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from contextos.errors import ConfigError
from contextos.jobs.kb.checks import LinkRow, TitleRow, title_key
from contextos.jobs.kb.findings import Finding
from contextos.jobs.kb.markdown import Page, TargetKind, resolve

KIND = "contextos-kb-index"
"""Marks a SQLite file as a scan index: any other file is refused, never overwritten."""
VERSION = "3"
ROOT_PART = "."
"""How a scan step names the files directly in the root."""

_SCHEMA = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE files (
    path TEXT PRIMARY KEY,
    kind TEXT NOT NULL,           -- page | file | dir
    size INTEGER NOT NULL DEFAULT 0,
    mtime_ns INTEGER NOT NULL DEFAULT 0,
    sha256 TEXT,                  -- pages only
    indexed_ns INTEGER NOT NULL DEFAULT 0,
    title TEXT, title_key TEXT, title_line INTEGER,
    findings TEXT NOT NULL DEFAULT '[]'  -- what the page alone shows, as JSON
);
CREATE INDEX files_by_title ON files (title_key) WHERE title_key IS NOT NULL;
CREATE TABLE anchors (path TEXT NOT NULL, anchor TEXT NOT NULL, PRIMARY KEY (path, anchor))
    WITHOUT ROWID;
CREATE TABLE links (
    path TEXT NOT NULL, line INTEGER NOT NULL, target TEXT NOT NULL,
    kind TEXT NOT NULL,           -- internal | external | outside
    resolved TEXT, anchor TEXT, url TEXT
);
CREATE INDEX links_by_path ON links (path);
CREATE INDEX links_by_resolved ON links (resolved) WHERE resolved IS NOT NULL;
CREATE INDEX links_by_url ON links (url) WHERE url IS NOT NULL;
CREATE TABLE journal (             -- what each step of a scan decided, kept once
    run INTEGER NOT NULL, key TEXT NOT NULL, value TEXT NOT NULL, PRIMARY KEY (run, key)
) WITHOUT ROWID;
"""


@dataclass(frozen=True, kw_only=True, slots=True)
class Entry:
    """What the index remembers of a file."""

    kind: str
    size: int
    mtime_ns: int
    sha256: str | None
    indexed_ns: int
    """When this entry was last checked against the file's content."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Occurrence:
    """One page's use of an external URL (its first line there)."""

    path: str
    line: int


class Index:
    """The summaries of one knowledge base's files. Use as a context manager; `commit` makes
    a scan's changes durable, leaving (or an error) rolls them back."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        root: str | os.PathLike[str],
        *,
        run: int | None = None,
    ) -> None:
        """Open the index for a new scan, or, with `run`, to carry on with that scan (one
        step of a scan that a workflow runs in several)."""
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(path, isolation_level=None, timeout=60.0)
        self._carry_on = run
        self.root = os.path.realpath(root)
        self.rebuilt = False
        """True when the index was empty or discarded: every file is new to it."""
        self.run = 0
        """The number of the scan in progress."""
        try:
            self._open(path)
        except BaseException:
            self._db.close()
            raise

    def _open(self, path: str | os.PathLike[str]) -> None:
        db = self._db
        try:
            tables = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        except sqlite3.DatabaseError as exc:
            raise ConfigError(
                f"{path} is not a scan index ({exc}): give the scan another file, or delete it"
            ) from None
        meta: dict[str, str] = {}
        if "meta" in tables:
            meta = dict(db.execute("SELECT key, value FROM meta").fetchall())
        if tables and meta.get("kind") != KIND:
            raise ConfigError(
                f"{path} holds other data, not a scan index: give the scan its own file"
            )
        if meta.get("version") != VERSION or meta.get("root") != self.root:
            # a cache for another version or another folder: start over rather than trust it
            db.execute("BEGIN")
            for table in tables:
                db.execute(f'DROP TABLE "{table}"')
            for statement in filter(str.strip, _SCHEMA.split(";")):
                db.execute(statement)
            db.executemany(
                "INSERT INTO meta VALUES (?, ?)",
                [("kind", KIND), ("version", VERSION), ("root", self.root), ("run", "0")],
            )
            db.execute("COMMIT")
            self.rebuilt = True
        else:
            self.rebuilt = db.execute("SELECT count(*) FROM files").fetchone()[0] == 0
        # readers (the workflow's steps) do not wait for a writer, and a commit is one sync
        db.execute("PRAGMA journal_mode=WAL")
        # The files this connection found: in memory, so that an unchanged file costs no write
        # (marking each row would rewrite the whole table on every scan).
        db.execute("CREATE TEMP TABLE seen (path TEXT PRIMARY KEY) WITHOUT ROWID")
        db.execute("BEGIN IMMEDIATE")
        if self._carry_on is not None:
            self.run = self._carry_on
            return
        (run,) = db.execute("SELECT value FROM meta WHERE key='run'").fetchone()
        self.run = int(run) + 1
        db.execute("UPDATE meta SET value=? WHERE key='run'", (str(self.run),))

    def __enter__(self) -> Index:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._db.in_transaction:
            self._db.execute("ROLLBACK")
        self._db.close()

    def commit(self) -> None:
        """Make the scan's changes durable; later changes start a new transaction."""
        self._db.execute("COMMIT")
        self._db.execute("BEGIN IMMEDIATE")

    # -- the journal: one value per scan and key, so that a step done is never done again --

    def recall(self, key: str) -> str | None:
        """What this scan recorded under `key`, if it did."""
        row = self._db.execute(
            "SELECT value FROM journal WHERE run=? AND key=?", (self.run, key)
        ).fetchone()
        return None if row is None else str(row[0])

    def note(self, key: str, value: str) -> None:
        """Record `value` under `key` for this scan (durable with the next `commit`)."""
        self._db.execute("INSERT OR REPLACE INTO journal VALUES (?, ?, ?)", (self.run, key, value))

    def last(self, key: str) -> str | None:
        """The latest value an earlier scan recorded under `key`."""
        row = self._db.execute(
            "SELECT value FROM journal WHERE run<? AND key=? ORDER BY run DESC LIMIT 1",
            (self.run, key),
        ).fetchone()
        return None if row is None else str(row[0])

    def earlier(self, prefix: str) -> Iterator[tuple[str, str]]:
        """The latest value earlier scans recorded under each key starting with `prefix`."""
        rows = self._db.execute(
            "SELECT key, value FROM journal j WHERE run<? AND key>=? AND key<? AND run=("
            "SELECT max(run) FROM journal WHERE key=j.key AND run<?)",
            (self.run, prefix, prefix + "\U0010ffff", self.run),
        )
        for key, value in rows:
            yield str(key), str(value)

    def forget_before(self, keep: str) -> None:
        """Drop what earlier scans recorded, but the latest value under `keep` (call it once
        what is worth carrying over has been `note`d again)."""
        self._db.execute(
            "DELETE FROM journal WHERE run<? AND NOT (key=? AND run=(SELECT max(run) FROM "
            "journal WHERE key=? AND run<?))",
            (self.run, keep, keep, self.run),
        )

    # -- writing -----------------------------------------------------------------------------

    def entries(self, paths: list[str]) -> dict[str, Entry]:
        """What the index remembers of each of `paths` it knows."""
        rows = self._db.execute(
            "SELECT path, kind, size, mtime_ns, sha256, indexed_ns FROM files "
            "WHERE path IN (SELECT value FROM json_each(?))",
            (json.dumps(paths),),
        )
        return {
            path: Entry(kind=kind, size=size, mtime_ns=mtime_ns, sha256=sha, indexed_ns=indexed)
            for path, kind, size, mtime_ns, sha, indexed in rows
        }

    def mark_seen(self, paths: Iterable[str]) -> None:
        """These files are still there (what `drop_unseen` keeps)."""
        self._db.executemany("INSERT OR IGNORE INTO seen VALUES (?)", ((p,) for p in paths))

    def keep(self, path: str, *, size: int, mtime_ns: int) -> None:
        """The file's content was compared just now and is unchanged."""
        self._db.execute(
            "UPDATE files SET size=?, mtime_ns=?, indexed_ns=? WHERE path=?",
            (size, mtime_ns, time.time_ns(), path),
        )
        self.mark_seen((path,))

    def put_other(self, path: str, *, kind: str, size: int = 0, mtime_ns: int = 0) -> None:
        """A directory, or a file that is not a page: a link target, nothing more."""
        self._forget(path)
        self._db.execute(
            "INSERT INTO files (path, kind, size, mtime_ns) VALUES (?, ?, ?, ?)",
            (path, kind, size, mtime_ns),
        )
        self.mark_seen((path,))

    def put_page(
        self,
        path: str,
        page: Page,
        *,
        size: int,
        mtime_ns: int,
        sha256: str,
        findings: Iterable[Finding],
    ) -> None:
        """A page and its summary, replacing what the index had for it."""
        self._forget(path)
        title = page.title
        self._db.execute(
            "INSERT INTO files (path, kind, size, mtime_ns, sha256, indexed_ns, title, "
            "title_key, title_line, findings) VALUES (?, 'page', ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                path,
                size,
                mtime_ns,
                sha256,
                time.time_ns(),
                title,
                title_key(title) if title else None,
                page.title_line,
                _dump(findings),
            ),
        )
        self._db.executemany(
            "INSERT OR IGNORE INTO anchors VALUES (?, ?)",
            ((path, anchor.lower()) for anchor in page.anchors),
        )
        rows = []
        for link in page.links:
            target = resolve(path, link.target)
            if target.kind is TargetKind.OTHER:
                continue
            row = (path, link.line, link.target, target.kind.value, target.path, target.anchor)
            rows.append((*row, target.url))
        self._db.executemany("INSERT INTO links VALUES (?, ?, ?, ?, ?, ?, ?)", rows)
        self.mark_seen((path,))

    def put_unreadable(self, path: str, finding: Finding, *, size: int, mtime_ns: int) -> None:
        """A page the scan could not read: it exists, and that is all that is known."""
        self._forget(path)
        self._db.execute(
            "INSERT INTO files (path, kind, size, mtime_ns, findings) VALUES (?, 'page', ?, ?, ?)",
            (path, size, mtime_ns, _dump([finding])),
        )
        self.mark_seen((path,))

    def _forget(self, path: str) -> None:
        for table in ("files", "anchors", "links"):
            self._db.execute(f"DELETE FROM {table} WHERE path=?", (path,))

    def drop_unseen(self, under: str | None = None) -> list[str]:
        """Forget the files this connection did not find (`under` a top-level directory, or
        the root's own files for `.`); their paths, sorted."""
        query = (
            "SELECT path, kind FROM files WHERE path NOT IN (SELECT path FROM seen) ORDER BY path"
        )
        gone = [
            path
            for path, kind in self._db.execute(query)
            # a top-level directory belongs to its own part, not to the root's files
            if _within(path, under) and not (under == ROOT_PART and kind == "dir")
        ]
        for path in gone:
            self._forget(path)
        return gone

    def drop_parts_but(self, parts: Iterable[str]) -> list[str]:
        """Forget the files of every part but `parts` (top-level directories that are gone,
        or `.` when the root has no files of its own any more); their paths, sorted."""
        part = (
            "CASE WHEN instr(path, '/') > 0 THEN substr(path, 1, instr(path, '/') - 1) "
            "WHEN kind = 'dir' THEN path ELSE '.' END"
        )
        gone = [
            str(path)
            for (path,) in self._db.execute(
                f"SELECT path FROM files WHERE path != '' AND {part} NOT IN "
                "(SELECT value FROM json_each(?)) ORDER BY path",
                (json.dumps(list(parts)),),
            )
        ]
        for path in gone:
            self._forget(path)
        return gone

    def linking_to(self, paths: Iterable[str]) -> list[str]:
        """Pages with a link to any of `paths`, sorted."""
        self._db.execute("CREATE TEMP TABLE IF NOT EXISTS wanted (path TEXT PRIMARY KEY)")
        self._db.execute("DELETE FROM wanted")
        self._db.executemany("INSERT OR IGNORE INTO wanted VALUES (?)", ((p,) for p in paths))
        return [
            r[0]
            for r in self._db.execute(
                "SELECT DISTINCT path FROM links WHERE resolved IN (SELECT path FROM wanted) "
                "ORDER BY path"
            )
        ]

    # -- reading, for the checks across pages -------------------------------------------------

    def pages(self) -> int:
        return int(self._db.execute("SELECT count(*) FROM files WHERE kind='page'").fetchone()[0])

    def own_findings(self, under: str | None = None) -> Iterator[Finding]:
        """What each page alone shows, as recorded when it was last read (`under` a
        top-level directory, or the root's own files for `.`)."""
        for path, data in self._db.execute(
            "SELECT path, findings FROM files WHERE findings != '[]' ORDER BY path"
        ):
            if not _within(path, under):
                continue
            for item in json.loads(data):
                yield Finding.model_validate(item)

    def suspect_links(self) -> Iterator[LinkRow]:
        """Internal links whose target is missing or lacks their anchor, or that climb out
        of the root, with what the index knows of the target (`check_links` decides)."""
        query = """
            SELECT l.path, l.line, l.target, l.kind, l.resolved, l.anchor, f.kind,
                   EXISTS (SELECT 1 FROM anchors a WHERE a.path = l.resolved
                           AND a.anchor = lower(l.anchor)) AS has_anchor
            FROM links l LEFT JOIN files f ON f.path = l.resolved
            WHERE l.kind != 'external'
              AND (f.kind IS NULL OR (f.kind = 'page' AND coalesce(l.anchor, '') != ''
                                      AND NOT has_anchor))
            ORDER BY l.path, l.line"""
        for path, line, target, kind, resolved, anchor, target_kind, has_anchor in self._db.execute(
            query
        ):
            yield LinkRow(
                path=path,
                line=line,
                target=target,
                kind=TargetKind(kind),
                resolved=resolved,
                anchor=anchor,
                target_kind=target_kind,
                has_anchor=bool(has_anchor),
            )

    def shared_titles(self) -> Iterator[TitleRow]:
        """Pages whose title another page has too, sorted by title key, then path."""
        for key, path, title, line in self._db.execute(
            "SELECT title_key, path, title, title_line FROM files WHERE title_key IN "
            "(SELECT title_key FROM files WHERE title_key IS NOT NULL GROUP BY title_key "
            "HAVING count(*) > 1) ORDER BY title_key, path"
        ):
            yield TitleRow(key=key, path=path, title=title, line=line)

    def unlinked_pages(self) -> Iterator[str]:
        """Every page no other page links to."""
        for (path,) in self._db.execute(
            "SELECT f.path FROM files f WHERE f.kind = 'page' AND NOT EXISTS "
            "(SELECT 1 FROM links l WHERE l.resolved = f.path AND l.path != f.path) "
            "ORDER BY f.path"
        ):
            yield path

    def external_urls(self) -> Iterator[str]:
        """Each distinct external URL once (normalised: the unit the verifier checks), sorted."""
        for (url,) in self._db.execute(
            "SELECT DISTINCT url FROM links WHERE kind='external' ORDER BY url"
        ):
            yield url

    def uses_of(self, url: str) -> list[Occurrence]:
        """The pages linking to `url`, each with its first line there."""
        return [
            Occurrence(path=path, line=line)
            for path, line in self._db.execute(
                "SELECT path, min(line) FROM links WHERE url=? GROUP BY path ORDER BY path",
                (url,),
            )
        ]


def _within(path: str, under: str | None) -> bool:
    if under is None:
        return True
    if under == ROOT_PART:
        return "/" not in path and path != ""
    return path == under or path.startswith(under + "/")


def _dump(findings: Iterable[Finding]) -> str:
    return json.dumps([f.model_dump(mode="json", exclude={"fingerprint"}) for f in findings])
