"""Containment: the filesystem roots and network destinations a run may touch at all.

Containment is configuration of the run, checked by the runtime and by the built-in tools at the
moment they act; nothing the model writes and no approval can move these walls.
"""

from __future__ import annotations

import contextlib
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from contextos.errors import ContainmentViolation
from contextos.policy.network import IP, NetworkPolicy

Access = Literal["read", "write"]


@dataclass(frozen=True, kw_only=True, slots=True)
class Containment:
    """Where a run's built-in tools may read, write and connect.

    Where roots nest, the most specific one decides: a `read_only` directory inside a writable
    root is read-only, a root inside a `read_only` directory is writable.
    """

    roots: tuple[str, ...] = ()
    """Directories the run may read and write below."""
    read_only: tuple[str, ...] = ()
    """Directories the run may only read below."""
    network: NetworkPolicy = field(default_factory=NetworkPolicy)
    """Hosts HTTP tools may reach."""
    allow_hard_links: bool = False
    """Let tools use a regular file that has more than one hard link. Off by default: a link
    inside a root can be another name for a file outside it."""

    def __post_init__(self) -> None:
        # Roots are stored resolved, so a symlinked root cannot be swapped for another later.
        object.__setattr__(self, "roots", tuple(_real(r) for r in self.roots))
        object.__setattr__(self, "read_only", tuple(_real(r) for r in self.read_only))

    def resolve(self, path: str | os.PathLike[str], access: Access = "read") -> Path:
        """The real path a tool may use for `path`, or ContainmentViolation saying why not.

        Relative paths are taken from the first root. Every symlink on the way is followed
        before the check, so a link pointing outside a root is refused like a `..` would be.
        """
        raw = os.fspath(path)
        if "\x00" in raw:
            raise ContainmentViolation("the path contains a NUL byte", path=raw)
        allowed = self.roots if access == "write" else self.roots + self.read_only
        if not allowed:
            raise ContainmentViolation(
                f"no {access} access to {raw!r}: the run has no filesystem roots",
                path=raw,
                access=access,
            )
        base = self.roots[0] if self.roots else self.read_only[0]
        candidate = raw if os.path.isabs(raw) else os.path.join(base, raw)
        try:
            real = os.path.realpath(candidate)
        except OSError as exc:  # a link changed between realpath's own steps
            raise ContainmentViolation(
                f"{access} access to {raw!r} refused: the path changed while it was being "
                f"checked ({exc.strerror})",
                path=raw,
                access=access,
            ) from None
        holder = self.root_of(real)
        if holder is None:
            lexical = os.path.normpath(candidate)
            if self.root_of(lexical) is not None:
                why = "it is a symlink (or goes through one) that leads outside the run's roots"
            elif not os.path.isabs(raw):
                why = "the relative path climbs out of the run's roots"
            else:
                why = "the absolute path is outside the run's roots"
            raise ContainmentViolation(
                f"{access} access to {raw!r} refused: {why} ({', '.join(allowed)})",
                path=raw,
                resolved=real,
                access=access,
            )
        if access == "write" and holder[1] == "read":
            raise ContainmentViolation(
                f"write access to {raw!r} refused: it is inside {holder[0]}, which is read-only",
                path=raw,
                resolved=real,
                access=access,
            )
        if not self.allow_hard_links:
            with contextlib.suppress(OSError):  # a file not there yet has no other name
                refuse_hard_link(os.lstat(real), raw, access)
        return Path(real)

    def root_of(self, path: str) -> tuple[str, Access] | None:
        """The most specific root holding `path` and what it grants (read-only wins a tie)."""
        holders: list[tuple[str, Access]] = [
            (r, "read") for r in self.read_only if _within(path, r)
        ]
        holders += [(r, "write") for r in self.roots if _within(path, r)]
        return max(holders, key=lambda h: len(h[0]), default=None)

    def check_url(self, url: str) -> None:
        why = self.network.why_not(url)
        if why is not None:
            raise ContainmentViolation(f"request to {url!r} refused: {why}", url=url)

    def narrows(self, parent: Containment) -> bool:
        """True when everything this containment permits, the parent's permits too."""
        # Access changes only at a root, so comparing the two at every root of either is enough.
        points = self.roots + self.read_only + parent.roots + parent.read_only
        return (
            all(parent.root_of(r) is not None for r in self.roots + self.read_only)
            and all(_grants(parent, p) == "write" for p in points if _grants(self, p) == "write")
            and (parent.allow_hard_links or not self.allow_hard_links)
            and self.network.narrows(parent.network)
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "roots": list(self.roots),
            "read_only": list(self.read_only),
            "network": self.network.to_dict(),
            "allow_hard_links": self.allow_hard_links,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Containment:
        net = data.get("network") or {}
        return cls(
            roots=tuple(data.get("roots", ())),
            read_only=tuple(data.get("read_only", ())),
            network=NetworkPolicy(
                allow=tuple(net.get("allow", ())), deny=tuple(net.get("deny", ()))
            ),
            allow_hard_links=bool(data.get("allow_hard_links", False)),
        )


def _grants(containment: Containment, path: str) -> Access | None:
    holder = containment.root_of(path)
    return holder[1] if holder else None


def refuse_hard_link(st: os.stat_result, path: str, access: Access) -> None:
    """ContainmentViolation when `st` is a regular file reachable under more than one name."""
    if stat.S_ISREG(st.st_mode) and st.st_nlink > 1:
        raise ContainmentViolation(
            f"{access} access to {path!r} refused: the file has {st.st_nlink} hard links, and "
            "another could be outside the run's roots (set allow_hard_links to permit it)",
            path=path,
            access=access,
        )


def _real(path: str) -> str:
    return os.path.realpath(os.path.expanduser(path))


def _within(path: str, root: str) -> bool:
    try:
        return os.path.commonpath([path, root]) == root
    except ValueError:  # different drives, or mixing absolute and relative
        return False


def _layers(run: Containment | None, own: Containment | None) -> list[Containment]:
    # The run's containment first: relative paths are taken from the narrowest roots.
    return [c for c in (run, own) if c is not None]


def confine_path(
    path: str, access: Access, own: Containment | None = None, run: Containment | None = None
) -> Path:
    """Resolve `path` for a built-in tool: every containment in force (the tool's own, and the
    run's) must permit it."""
    layers = _layers(run, own)
    if not layers:
        raise ContainmentViolation(
            f"{access} access to {path!r} refused: no filesystem roots are configured",
            path=path,
        )
    real = layers[0].resolve(path, access)
    for other in layers[1:]:
        other.resolve(real, access)
    return real


@dataclass(frozen=True, kw_only=True, slots=True)
class Placed:
    """A path every containment in force permits, in the form an fd walk opens it."""

    real: Path
    """The path with every symlink resolved, as checked."""
    root: str
    """The outermost root holding it: nothing above it is the run's to change."""
    names: tuple[str, ...]
    """The components from `root` down to the path (none for the root itself)."""
    hard_links: bool
    """Whether every containment in force allows files with several hard links."""


def place(
    path: str, access: Access, own: Containment | None = None, run: Containment | None = None
) -> Placed:
    """Check `path` like `confine_path`, and say where a walk that opens it starts."""
    real = confine_path(path, access, own, run)
    layers = _layers(run, own)
    first = layers[0]
    root = min((r for r in first.roots + first.read_only if _within(str(real), r)), key=len)
    return Placed(
        real=real,
        root=root,
        names=real.relative_to(root).parts,
        hard_links=all(c.allow_hard_links for c in layers),
    )


def confine_url(url: str, own: Containment | None = None, run: Containment | None = None) -> None:
    """Refuse a URL unless every containment in force permits it."""
    layers = _layers(run, own)
    if not layers:
        raise ContainmentViolation(
            f"request to {url!r} refused: no network allow list is configured", url=url
        )
    for c in layers:
        c.check_url(url)


def confine_reach(
    url: str,
    host: str,
    port: int,
    addresses: list[IP],
    own: Containment | None,
    run: Containment | None = None,
) -> None:
    """Refuse to connect to `host` at `addresses` unless every containment in force permits
    each of them (the resolved half of `confine_url`)."""
    for c in _layers(run, own):
        why = c.network.why_not_reach(host, port, addresses)
        if why is not None:
            raise ContainmentViolation(f"request to {url!r} refused: {why}", url=url)
