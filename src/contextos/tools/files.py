"""Built-in file tools (read, write, list) confined to declared roots.

The check happens twice: the policy engine refuses a path before dispatch (so the refusal is a
recorded decision), and the tool checks the path again at the moment it opens it. It then
opens it one component at a time from a descriptor of the root, never following a symlink
(`openat` with O_NOFOLLOW), so a directory swapped for a link after the check cannot redirect
the access: the walk stops with a ContainmentViolation instead.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from contextos.errors import ContainmentViolation
from contextos.policy.containment import Access, Containment, Placed, place, refuse_hard_link
from contextos.policy.hook import Confine, ProposedCall
from contextos.tools.contract import EffectKind, Risk, Tool, ToolContext, tool

_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE = os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass(frozen=True, kw_only=True)
class ConfinedTool(Tool):
    """A tool whose arguments name paths or URLs that the run's containment must permit."""

    confine: tuple[tuple[str, Confine], ...] = ()
    """(argument, read | write | url) pairs checked before dispatch."""
    containment: Containment | None = None
    """The tool's own walls; the run's containment, when it has one, applies as well."""

    def proposal(self, run_id: str, call_id: str, arguments: dict[str, Any]) -> ProposedCall:
        proposed = super().proposal(run_id, call_id, arguments)
        return replace(proposed, confine=self.confine, containment=self.containment)


def confined(
    t: Tool, confine: tuple[tuple[str, Confine], ...], own: Containment | None
) -> ConfinedTool:
    """The same tool, declared as confined: its path or URL arguments are checked by policy."""
    data: dict[str, Any] = {f.name: getattr(t, f.name) for f in fields(t)}
    data.update(confine=confine, containment=own)
    return ConfinedTool(**data)


def file_tools(
    roots: tuple[str, ...] | list[str] = (),
    *,
    read_only: tuple[str, ...] | list[str] = (),
    allow_hard_links: bool = False,
    max_read_bytes: int = 1_000_000,
    max_entries: int = 1000,
) -> tuple[ConfinedTool, ConfinedTool, ConfinedTool]:
    """`read_file`, `write_file` and `list_files`, confined to `roots` (and `read_only`).

    With no roots here, the tools can only reach what the run's own containment grants; with
    both, a path must be inside both.
    """
    own = (
        Containment(
            roots=tuple(roots), read_only=tuple(read_only), allow_hard_links=allow_hard_links
        )
        if roots or read_only
        else None
    )

    @tool(name="read_file", effect=EffectKind.READ, risk=Risk.LOW, scopes=("files:read",))
    def read_file(path: str, ctx: ToolContext) -> str:
        """Read a UTF-8 text file inside the allowed directories."""
        placed = place(path, "read", own, ctx.containment)
        fd = _open_file(placed, path, "read", os.O_RDONLY)
        with os.fdopen(fd, "rb") as f:
            data = f.read(max_read_bytes + 1)
        text = data[:max_read_bytes].decode("utf-8", errors="replace")
        if len(data) > max_read_bytes:
            text += f"\n[file longer than {max_read_bytes} bytes; the rest was not read]"
        return text

    @tool(name="write_file", effect=EffectKind.WRITE, risk=Risk.MEDIUM, scopes=("files:write",))
    def write_file(path: str, content: str, ctx: ToolContext) -> str:
        """Create or overwrite a UTF-8 text file inside the writable directories."""
        placed = place(path, "write", own, ctx.containment)
        fd = _open_file(placed, path, "write", os.O_WRONLY)
        data = content.encode()
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        return f"wrote {len(data)} bytes to {placed.real}"

    @tool(name="list_files", effect=EffectKind.READ, risk=Risk.LOW, scopes=("files:read",))
    def list_files(ctx: ToolContext, path: str = ".") -> list[str]:
        """List a directory inside the allowed directories (directories end with /)."""
        fd = _walk(place(path, "read", own, ctx.containment), path, "read")
        try:
            entries = sorted(os.scandir(fd), key=lambda e: e.name)
        finally:
            os.close(fd)
        names = [e.name + ("/" if e.is_dir(follow_symlinks=False) else "") for e in entries]
        if len(names) > max_entries:
            names = [*names[:max_entries], f"... and {len(names) - max_entries} more"]
        return names

    return (
        confined(read_file, (("path", "read"),), own),
        confined(write_file, (("path", "write"),), own),
        confined(list_files, (("path", "read"),), own),
    )


def _walk(placed: Placed, path: str, access: Access, *, depth: int | None = None) -> int:
    """A descriptor of the directory `placed.names[:depth]` below the root, each component
    opened without following a symlink (and created first when writing)."""
    fd = os.open(placed.root, _DIRECTORY)
    try:
        for name in placed.names[:depth]:
            try:
                child = _at(name, _DIRECTORY, fd, path, access)
            except FileNotFoundError:
                if access != "write":
                    raise
                with contextlib.suppress(FileExistsError):  # made by someone else meanwhile
                    os.mkdir(name, 0o755, dir_fd=fd)
                child = _at(name, _DIRECTORY, fd, path, access)
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


def _open_file(placed: Placed, path: str, access: Access, flags: int) -> int:
    """The file itself, opened from its directory's descriptor without following a link.

    A write creates the file exclusively, or opens the existing one without truncating it
    until it is known to be a file with a single name (unless hard links are allowed).
    """
    if not placed.names:
        raise IsADirectoryError(errno.EISDIR, "is a directory", str(placed.real))
    parent = _walk(placed, path, access, depth=-1)
    name = placed.names[-1]
    try:
        if access == "write":
            try:
                return _at(name, flags | _FILE | os.O_CREAT | os.O_EXCL, parent, path, access)
            except FileExistsError:
                pass
        fd = _at(name, flags | _FILE, parent, path, access)
    finally:
        os.close(parent)
    try:
        if not placed.hard_links:
            refuse_hard_link(os.fstat(fd), path, access)
        if access == "write":
            os.ftruncate(fd, 0)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _at(name: str, flags: int, dir_fd: int, path: str, access: Access) -> int:
    try:
        return os.open(name, flags, 0o644, dir_fd=dir_fd)
    except OSError as exc:
        # O_NOFOLLOW answers ELOOP for a link, and ENOTDIR with O_DIRECTORY: unless the entry
        # is plainly a file, it is (or was, a moment ago) a link
        if exc.errno != errno.ELOOP and not (
            exc.errno == errno.ENOTDIR and not _plainly_not_a_directory(name, dir_fd)
        ):
            raise
        raise ContainmentViolation(
            f"{access} access to {path!r} refused: {name!r} became a symlink after the path "
            "was checked",
            path=path,
            access=access,
        ) from None


def _plainly_not_a_directory(name: str, dir_fd: int) -> bool:
    try:
        mode = os.lstat(name, dir_fd=dir_fd).st_mode
    except OSError:
        return False
    return not (stat.S_ISDIR(mode) or stat.S_ISLNK(mode))


def describe_paths(paths: list[str] | tuple[str, ...], *, limit: int = 5) -> str:
    """`3 files: a, b, c` for previews and blast radius."""
    shown = ", ".join(str(Path(p)) for p in paths[:limit])
    more = f" and {len(paths) - limit} more" if len(paths) > limit else ""
    return f"{len(paths)} file{'s' if len(paths) != 1 else ''}: {shown}{more}"
