"""Built-in file tools (read, write, list) confined to declared roots.

The check happens twice: the policy engine refuses a path before dispatch (so the refusal is a
recorded decision), and the tool resolves the path again at the moment it opens it (so a link
swapped in between is still caught). The final component is opened with O_NOFOLLOW.
"""

from __future__ import annotations

import os
from dataclasses import fields
from pathlib import Path
from typing import Any

from contextos.policy.containment import Containment, confine_path
from contextos.policy.engine import Confine, ConfinedTool
from contextos.tools.contract import Effect, Risk, Tool, tool

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


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
    max_read_bytes: int = 1_000_000,
    max_entries: int = 1000,
) -> tuple[ConfinedTool, ConfinedTool, ConfinedTool]:
    """`read_file`, `write_file` and `list_files`, confined to `roots` (and `read_only`).

    With no roots here, the tools can only reach what the run's own containment grants; with
    both, a path must be inside both.
    """
    own = (
        Containment(roots=tuple(roots), read_only=tuple(read_only)) if roots or read_only else None
    )

    @tool(name="read_file", effect=Effect.READ, risk=Risk.LOW, scopes=("files:read",))
    def read_file(path: str) -> str:
        """Read a UTF-8 text file inside the allowed directories."""
        real = confine_path(path, "read", own)
        fd = os.open(real, os.O_RDONLY | _NOFOLLOW)
        with os.fdopen(fd, "rb") as f:
            data = f.read(max_read_bytes + 1)
        text = data[:max_read_bytes].decode("utf-8", errors="replace")
        if len(data) > max_read_bytes:
            text += f"\n[file longer than {max_read_bytes} bytes; the rest was not read]"
        return text

    @tool(name="write_file", effect=Effect.WRITE, risk=Risk.MEDIUM, scopes=("files:write",))
    def write_file(path: str, content: str) -> str:
        """Create or overwrite a UTF-8 text file inside the writable directories."""
        real = confine_path(path, "write", own)
        real.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(real, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | _NOFOLLOW, 0o644)
        data = content.encode()
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        return f"wrote {len(data)} bytes to {real}"

    @tool(name="list_files", effect=Effect.READ, risk=Risk.LOW, scopes=("files:read",))
    def list_files(path: str = ".") -> list[str]:
        """List a directory inside the allowed directories (directories end with /)."""
        real = confine_path(path, "read", own)
        entries = sorted(os.scandir(real), key=lambda e: e.name)
        names = [e.name + ("/" if e.is_dir(follow_symlinks=False) else "") for e in entries]
        if len(names) > max_entries:
            names = [*names[:max_entries], f"... and {len(names) - max_entries} more"]
        return names

    return (
        confined(read_file, (("path", "read"),), own),
        confined(write_file, (("path", "write"),), own),
        confined(list_files, (("path", "read"),), own),
    )


def describe_paths(paths: list[str] | tuple[str, ...], *, limit: int = 5) -> str:
    """`3 files: a, b, c` for previews and blast radius."""
    shown = ", ".join(str(Path(p)) for p in paths[:limit])
    more = f" and {len(paths) - limit} more" if len(paths) > limit else ""
    return f"{len(paths)} file{'s' if len(paths) != 1 else ''}: {shown}{more}"
