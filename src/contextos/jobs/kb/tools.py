"""Read-only file tools for one directory of a knowledge base: list, read, stat, parse links.

Built on the project's contained file tools, with only read-only roots: a scan node gets its
own directory and nothing else, and there is no tool that writes. The code paths of the scan
use the same tools the model would, so the deterministic scan is contained exactly as tightly.
"""

from __future__ import annotations

import functools
import os
import posixpath
import stat
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from contextos import Containment, EffectKind, Risk, Tool, ToolContext, tool
from contextos.errors import ConfigError, ContainmentViolation
from contextos.jobs.kb.markdown import TargetKind, parse, resolve
from contextos.tools import ConfinedTool, file_tools


@dataclass(frozen=True, kw_only=True, slots=True)
class FileInfo:
    """What `stat` tells about one entry."""

    kind: str
    """`file` or `dir`."""
    size: int
    """Bytes."""
    mtime_ns: int
    """Last modification, nanoseconds since the epoch."""


def _info(st: os.stat_result) -> FileInfo:
    kind = "dir" if stat.S_ISDIR(st.st_mode) else "file"
    return FileInfo(kind=kind, size=st.st_size, mtime_ns=st.st_mtime_ns)


@functools.lru_cache(maxsize=64)
def _file_tools(root: str, max_read_bytes: int, max_entries: int) -> tuple[Tool, Tool]:
    """`read_file` and `list_files` confined to `root`, read-only. Built once per directory:
    each scan step opens the directories again, and building a tool's contract is not free."""
    read, _write, listing = file_tools(
        read_only=(root,), max_read_bytes=max_read_bytes, max_entries=max_entries
    )  # the write tool is dropped, and could not write under a read-only root anyway
    return read, listing


_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class ReadOnlyDir:
    """One directory, readable and nothing more; paths are relative to it.

    `prefix` is where the directory sits in the knowledge base (`docs`), so that link targets
    come back relative to the knowledge base's root, as the other directories name them.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        prefix: str = "",
        max_read_bytes: int = 1_000_000,
        max_entries: int = 100_000,
    ) -> None:
        self.directory = Path(directory)
        if not self.directory.is_dir():
            raise ConfigError(f"{self.directory} is not a directory: give a knowledge base's path")
        self.prefix = prefix.strip("/")
        self.max_entries = max_entries
        root = (str(self.directory),)
        self._walls = Containment(read_only=root)
        self._read, self._list = _file_tools(root[0], max_read_bytes, max_entries)
        # called directly, not by a run: the tools' own walls are the only ones
        self._ctx = ToolContext(run_id="kb-scan", call_id="direct")

    def entries(self, path: str = ".") -> list[str]:
        """The entries of a directory, sorted; directories end with `/`."""
        names = self._list.fn(path=path, ctx=self._ctx)
        assert isinstance(names, list)
        if len(names) > self.max_entries:
            raise ConfigError(
                f"{path} in {self.directory} has more than {self.max_entries} entries: "
                "raise max_entries to scan it"
            )
        return names

    def listing(self, path: str = ".") -> list[tuple[str, FileInfo]]:
        """`entries`, each with what stat says of it (sorted by name; directories end with `/`).

        The directory is read once, from a descriptor of the checked directory, and its
        entries stat'ed from it without following links, so listing a folder costs one
        containment check, not one per file. A symlink, or a file with several hard links,
        goes through the containment like any other path; one it refuses is listed with size
        0, and reading it will say why.
        """
        fd = os.open(self._walls.resolve(path), _DIRECTORY)
        try:
            found = sorted(os.scandir(fd), key=lambda e: e.name)
            if len(found) > self.max_entries:
                raise ConfigError(
                    f"{path} in {self.directory} has more than {self.max_entries} entries: "
                    "raise max_entries to scan it"
                )
            out: list[tuple[str, FileInfo]] = []
            for entry in found:
                st = entry.stat(follow_symlinks=False)
                name = entry.name + ("/" if stat.S_ISDIR(st.st_mode) else "")
                if stat.S_ISLNK(st.st_mode) or (stat.S_ISREG(st.st_mode) and st.st_nlink > 1):
                    try:
                        out.append((name, self.stat(posixpath.join(path, entry.name))))
                    except (OSError, ContainmentViolation):
                        out.append((name, FileInfo(kind="file", size=0, mtime_ns=0)))
                else:
                    out.append((name, _info(st)))
            return out
        finally:
            os.close(fd)

    def read(self, path: str) -> str:
        """A file's text (UTF-8; undecodable bytes replaced), up to `max_read_bytes`."""
        text = self._read.fn(path=path, ctx=self._ctx)
        assert isinstance(text, str)
        return text

    def stat(self, path: str) -> FileInfo:
        """Size, kind and modification time of an entry inside the directory."""
        return _info(os.stat(self._walls.resolve(path)))

    def links(self, path: str) -> list[dict[str, Any]]:
        """The links of a page, each resolved to where it points."""
        page = posixpath.join(self.prefix, path) if self.prefix else path
        out: list[dict[str, Any]] = []
        for link in parse(self.read(path)).links:
            target = resolve(page, link.target)
            entry: dict[str, Any] = {"line": link.line, "target": link.target}
            entry["kind"] = target.kind.value
            if target.kind is TargetKind.INTERNAL:
                entry.update(path=target.path, anchor=target.anchor)
            elif target.kind is TargetKind.EXTERNAL:
                entry["url"] = target.url
            out.append(entry)
        return out

    def tools(self) -> tuple[Tool, ...]:
        """`list_files`, `read_file`, `stat_file` and `parse_links` for a scan agent."""

        @tool(name="stat_file", effect=EffectKind.READ, risk=Risk.LOW, scopes=("files:read",))
        def stat_file(path: str) -> dict[str, Any]:
            """Size in bytes, kind (file or dir) and modification time of a path."""
            info = self.stat(path)
            return {"path": path, "kind": info.kind, "size": info.size, "mtime_ns": info.mtime_ns}

        @tool(name="parse_links", effect=EffectKind.READ, risk=Risk.LOW, scopes=("files:read",))
        def parse_links(path: str) -> list[dict[str, Any]]:
            """The links of a Markdown page: line, target as written, and where it points
            (`internal` with a path from the knowledge base's root, `external` with a URL)."""
            return self.links(path)

        return (self._list, self._read, self._confined(stat_file), self._confined(parse_links))

    def _confined(self, t: Tool) -> ConfinedTool:
        # declared like the built-in file tools, so policy checks the path before dispatch too
        data: dict[str, Any] = {f.name: getattr(t, f.name) for f in fields(t)}
        return ConfinedTool(**data, confine=(("path", "read"),), containment=self._walls)
