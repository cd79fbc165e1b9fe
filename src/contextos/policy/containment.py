"""Containment: the filesystem roots and network destinations a run may touch at all.

Containment is configuration of the run, checked by the runtime and by the built-in tools at the
moment they act; nothing the model writes and no approval can move these walls.
"""

from __future__ import annotations

import fnmatch
import ipaddress
import os
from contextvars import ContextVar, Token
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from contextos.errors import ContainmentViolation

Access = Literal["read", "write"]


@dataclass(frozen=True, kw_only=True, slots=True)
class NetworkPolicy:
    """Which hosts HTTP tools may reach. Deny wins over allow; nothing is reachable by default."""

    allow: tuple[str, ...] = ()
    """Host patterns (`api.example.com`, `*.example.com`, `127.0.0.1:8080`, `10.0.0.0/8`)."""
    deny: tuple[str, ...] = ()
    """Host patterns refused even when an allow pattern matches."""

    def permits(self, url: str) -> bool:
        return self.why_not(url) is None

    def why_not(self, url: str) -> str | None:
        """None when the URL may be fetched, else the reason it may not."""
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https"):
            return f"scheme {parts.scheme or '(none)'!r} is not http or https"
        host = (parts.hostname or "").lower().rstrip(".")
        if not host:
            return "the URL has no host"
        try:
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError:
            return "the URL has an invalid port"
        if any(_host_matches(p, host, port) for p in self.deny):
            return f"{host}:{port} is on the network deny list"
        if not any(_host_matches(p, host, port) for p in self.allow):
            allowed = ", ".join(self.allow) or "nothing"
            return f"{host}:{port} is not on the network allow list (allowed: {allowed})"
        return None

    def narrows(self, parent: NetworkPolicy) -> bool:
        """True when this setting reaches no host the parent's cannot."""
        return set(parent.deny) <= set(self.deny) and all(
            any(_pattern_within(p, q) for q in parent.allow) for p in self.allow
        )

    def to_dict(self) -> dict[str, Any]:
        return {"allow": list(self.allow), "deny": list(self.deny)}


def _host_matches(pattern: str, host: str, port: int) -> bool:
    pattern = pattern.strip().lower()
    if pattern == "*":
        return True
    if "/" in pattern:  # a CIDR range matches IP literals only
        try:
            return ipaddress.ip_address(host) in ipaddress.ip_network(pattern, strict=False)
        except ValueError:
            return False
    want_port: int | None = None
    head, sep, tail = pattern.rpartition(":")
    if sep and tail.isdigit() and not pattern.startswith("["):
        pattern, want_port = head, int(tail)
    if want_port is not None and want_port != port:
        return False
    return fnmatch.fnmatchcase(host, pattern)


def _pattern_within(child: str, parent: str) -> bool:
    """Conservative: a child pattern is within a parent one when equal, or parent is `*`,
    or the parent is a wildcard domain the child falls under."""
    child, parent = child.strip().lower(), parent.strip().lower()
    if parent in ("*", child):
        return True
    if "*" in child or "/" in child or "/" in parent:
        return False
    host, _, port = child.partition(":")
    return _host_matches(parent, host, int(port) if port.isdigit() else 0) and ":" not in parent


@dataclass(frozen=True, kw_only=True, slots=True)
class Containment:
    """Where a run's built-in tools may read, write and connect."""

    roots: tuple[str, ...] = ()
    """Directories the run may read and write below."""
    read_only: tuple[str, ...] = ()
    """Directories the run may only read below."""
    network: NetworkPolicy = field(default_factory=NetworkPolicy)
    """Hosts HTTP tools may reach."""

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
        real = os.path.realpath(candidate)
        if not any(_within(real, root) for root in allowed):
            lexical = os.path.normpath(candidate)
            if any(_within(lexical, root) for root in allowed):
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
        return Path(real)

    def check_url(self, url: str) -> None:
        why = self.network.why_not(url)
        if why is not None:
            raise ContainmentViolation(f"request to {url!r} refused: {why}", url=url)

    def narrows(self, parent: Containment) -> bool:
        """True when everything this containment permits, the parent's permits too."""
        parent_any = parent.roots + parent.read_only
        return (
            all(any(_within(r, p) for p in parent.roots) for r in self.roots)
            and all(any(_within(r, p) for p in parent_any) for r in self.read_only)
            and self.network.narrows(parent.network)
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "roots": list(self.roots),
            "read_only": list(self.read_only),
            "network": self.network.to_dict(),
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
        )


def _real(path: str) -> str:
    return os.path.realpath(os.path.expanduser(path))


def _within(path: str, root: str) -> bool:
    try:
        return os.path.commonpath([path, root]) == root
    except ValueError:  # different drives, or mixing absolute and relative
        return False


_ACTIVE: ContextVar[Containment | None] = ContextVar("contextos_containment", default=None)


def active_containment() -> Containment | None:
    """The containment of the run whose tool call is executing, if the runtime bound one."""
    return _ACTIVE.get()


def activate(containment: Containment | None) -> Token[Containment | None]:
    """Bind the run's containment for the tool calls that follow in this task."""
    return _ACTIVE.set(containment)


def _layers(own: Containment | None) -> list[Containment]:
    # The run's containment first: relative paths are taken from the narrowest roots.
    return [c for c in (active_containment(), own) if c is not None]


def confine_path(path: str, access: Access, own: Containment | None = None) -> Path:
    """Resolve `path` for a built-in tool: every containment in force must permit it."""
    layers = _layers(own)
    if not layers:
        raise ContainmentViolation(
            f"{access} access to {path!r} refused: no filesystem roots are configured",
            path=path,
        )
    real = layers[0].resolve(path, access)
    for other in layers[1:]:
        other.resolve(real, access)
    return real


def confine_url(url: str, own: Containment | None = None) -> None:
    """Refuse a URL unless every containment in force permits it."""
    layers = _layers(own)
    if not layers:
        raise ContainmentViolation(
            f"request to {url!r} refused: no network allow list is configured", url=url
        )
    for c in layers:
        c.check_url(url)
