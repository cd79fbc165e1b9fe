"""The network allow/deny setting, matched on normalised names and on real addresses.

A host is compared in one canonical form: names lowercased, IDNA-encoded, with Unicode full
stops read as dots; addresses in every IPv4 spelling (`127.1`, `0x7f000001`, `017700000001`)
and IPv6 form, with IPv4-mapped, IPv4-compatible and NAT64 addresses read as the IPv4 address
they carry. Internal ranges are reachable only through a pattern that names them.
"""

from __future__ import annotations

import fnmatch
import ipaddress
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import idna

from contextos.errors import PolicyLoadError

IP = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network

INTERNAL_RANGES: tuple[Network, ...] = tuple(
    ipaddress.ip_network(n)
    for n in (
        "0.0.0.0/8",  # "this network"; 0.0.0.0 reaches this machine
        "10.0.0.0/8",  # private (RFC 1918)
        "100.64.0.0/10",  # carrier-grade NAT
        "127.0.0.0/8",  # loopback
        "169.254.0.0/16",  # link-local, including cloud metadata at 169.254.169.254
        "172.16.0.0/12",  # private
        "192.0.0.0/24",  # IETF protocol assignments
        "192.0.2.0/24",  # documentation
        "192.168.0.0/16",  # private
        "198.18.0.0/15",  # benchmarking
        "198.51.100.0/24",  # documentation
        "203.0.113.0/24",  # documentation
        "224.0.0.0/4",  # multicast
        "240.0.0.0/4",  # reserved, and the broadcast address
        "::/128",  # unspecified
        "::1/128",  # loopback
        "64:ff9b:1::/48",  # local-use NAT64
        "100::/64",  # discard
        "2001:db8::/32",  # documentation
        "fc00::/7",  # unique local
        "fe80::/10",  # link-local
        "fec0::/10",  # site-local (deprecated)
        "ff00::/8",  # multicast
    )
)
"""Addresses a wildcard pattern never reaches: loopback, private, link-local, metadata, …"""

_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
_COMPATIBLE = ipaddress.IPv6Network("::/96")
_UNICODE_DOTS = re.compile("[\u3002\uff0e\uff61]")
_IPV4_PART = re.compile(r"0[xX][0-9a-fA-F]*|0[0-7]*|[1-9][0-9]*")
_GLOB = re.compile(r"[*?\[]")


def parse_ip(text: str) -> IP | None:
    """The address `text` spells, in any form a resolver accepts; None for a name."""
    text = text.strip()
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    ipv4 = _inet_aton(text)
    if ipv4 is not None:
        return ipv4
    try:
        return ipaddress.IPv6Address(text)
    except ValueError:
        return None


def _inet_aton(text: str) -> ipaddress.IPv4Address | None:
    """IPv4 as inet_aton reads it: 1 to 4 parts, each decimal, 0x-hex or 0-octal; the last
    part fills the bytes that remain (`127.1` is 127.0.0.1, `2130706433` is too)."""
    parts = text.split(".")
    if not 1 <= len(parts) <= 4 or not all(_IPV4_PART.fullmatch(p) for p in parts):
        return None
    *head, last = [_number(p) for p in parts]
    if any(n > 255 for n in head) or last >= 256 ** (4 - len(head)):
        return None
    value = last
    for i, n in enumerate(head):
        value += n << (8 * (3 - i))
    return ipaddress.IPv4Address(value)


def _number(part: str) -> int:
    if part[:2].lower() == "0x":
        return int(part[2:] or "0", 16)  # a bare `0x` is zero to inet_aton
    return int(part, 8) if part.startswith("0") and len(part) > 1 else int(part)


def forms(address: IP) -> tuple[IP, ...]:
    """The address, then the IPv4 address it carries (mapped, compatible or NAT64), if any."""
    if isinstance(address, ipaddress.IPv4Address):
        return (address,)
    plain = ipaddress.IPv6Address(int(address))  # without a scope id, for range checks
    inner = plain.ipv4_mapped
    if inner is None and (plain in _NAT64 or (plain in _COMPATIBLE and int(plain) > 1)):
        inner = ipaddress.IPv4Address(int(plain) & 0xFFFFFFFF)
    return (plain,) if inner is None else (plain, inner)


def is_internal(address: IP) -> bool:
    return any(a in n for a in forms(address) for n in INTERNAL_RANGES if a.version == n.version)


def normalise_name(name: str) -> str:
    """A host name as it is matched: lowercase, IDNA (punycode), no trailing dot.

    Raises ValueError when the name is not a valid internationalised name.
    """
    name = _UNICODE_DOTS.sub(".", name.strip()).rstrip(".")
    if name.isascii():
        return name.lower()
    return idna.encode(name, uts46=True).decode("ascii")


def normalise_host(host: str) -> str:
    """The canonical text of a URL's host: an address's compressed form, or a name's."""
    address = parse_ip(host)
    return str(address) if address is not None else normalise_name(host)


@dataclass(frozen=True, slots=True)
class _Pattern:
    name: str | None
    """A glob over host names (and over the text of addresses)."""
    network: Network | None
    """A range of addresses (a single address is a /32 or /128)."""
    port: int | None

    def matches(self, host: str, address: IP | None, port: int) -> bool:
        if self.port is not None and self.port != port:
            return False
        if self.network is not None:
            return address is not None and any(
                a in self.network for a in forms(address) if a.version == self.network.version
            )
        assert self.name is not None
        texts = [str(a) for a in forms(address)] if address is not None else [host]
        return any(fnmatch.fnmatchcase(t, self.name) for t in texts)

    def within(self, parent: _Pattern) -> bool:
        """Conservative: everything this pattern reaches, `parent` reaches too."""
        if parent.port is not None and parent.port != self.port:
            return False
        net = self.network
        if net is not None:
            if parent.network is not None:
                return net[0] in parent.network and net[-1] in parent.network
            # a wildcard reaches no internal address, so the range must hold none
            return parent.name == "*" and not any(
                n[0] in net or net[0] in n for n in INTERNAL_RANGES
            )
        if parent.network is not None or self.name is None or parent.name is None:
            return False
        return parent.name in ("*", self.name) or (
            parent.name.startswith("*.") and self.name.endswith(parent.name[1:])
        )


def _parse_pattern(raw: str) -> _Pattern:
    text = raw.strip().lower()
    port: int | None = None
    if text.startswith("["):  # [v6] or [v6]:port
        inside, _, rest = text[1:].partition("]")
        if rest:
            if not (rest.startswith(":") and rest[1:].isdigit()):
                raise _bad(raw)
            port = int(rest[1:])
        text = inside
    elif text.count(":") == 1:
        head, _, tail = text.partition(":")
        if not tail.isdigit():
            raise _bad(raw)
        text, port = head, int(tail)
    if port is not None and not 0 < port < 65536:
        raise _bad(raw)
    if not text:
        raise _bad(raw)
    if "/" in text:
        try:
            network = ipaddress.ip_network(text, strict=False)
        except ValueError:
            raise _bad(raw) from None
        return _Pattern(name=None, network=network, port=port)
    address = parse_ip(text)
    if address is not None:
        plain = forms(address)[-1]
        return _Pattern(name=None, network=ipaddress.ip_network(plain), port=port)
    try:
        labels = [lab if _GLOB.search(lab) else normalise_name(lab) for lab in text.split(".")]
    except ValueError:
        raise _bad(raw) from None
    return _Pattern(name=".".join(labels).rstrip("."), network=None, port=port)


def _bad(raw: str) -> PolicyLoadError:
    return PolicyLoadError(
        f"network pattern {raw!r} is not a host, *.domain, IP address, CIDR range "
        "(optionally with :port)"
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class NetworkPolicy:
    """Which hosts HTTP tools may reach. Deny wins over allow; nothing is reachable by default.

    A name must match a name pattern; every address it resolves to is then checked too: deny
    patterns match addresses, and an internal address (`INTERNAL_RANGES`: loopback, private,
    link-local, metadata, …) is reached only through an allow pattern naming its address or
    range, never through a name or a wildcard.
    """

    allow: tuple[str, ...] = ()
    """Host patterns (`api.example.com`, `*.example.com`, `127.0.0.1:8080`, `10.0.0.0/8`)."""
    deny: tuple[str, ...] = ()
    """Host patterns refused even when an allow pattern matches."""

    def __post_init__(self) -> None:
        for raw in (*self.allow, *self.deny):
            _parse_pattern(raw)  # a pattern that matches nothing must not pass silently

    def permits(self, url: str) -> bool:
        return self.why_not(url) is None

    def why_not(self, url: str) -> str | None:
        """None when the URL may be fetched as far as its text shows, else the reason not.

        A name is checked against the patterns; its addresses are checked when it is resolved
        (`why_not_reach`), just before connecting.
        """
        target = split_url(url)
        if isinstance(target, str):
            return target
        host, port = target
        address = parse_ip(host)
        return self.why_not_reach(host, port, [address] if address is not None else [])

    def why_not_reach(self, host: str, port: int, addresses: Iterable[IP]) -> str | None:
        """None when `host` (canonical) may be reached at every one of `addresses`."""
        allow = [_parse_pattern(p) for p in self.allow]
        deny = [_parse_pattern(p) for p in self.deny]
        literal = parse_ip(host)
        where = f"{host}:{port}"
        if any(p.matches(host, literal, port) for p in deny):
            return f"{where} is on the network deny list"
        if not any(p.matches(host, literal, port) for p in allow):
            allowed = ", ".join(self.allow) or "nothing"
            return f"{where} is not on the network allow list (allowed: {allowed})"
        for address in addresses:
            if any(a.is_unspecified for a in forms(address)):
                return f"{where} is the unspecified address {address}, which reaches this machine"
            via = "" if address == literal else f" resolves to {address}, which"
            if any(p.matches(host, address, port) for p in deny):
                return f"{where}{via} is on the network deny list"
            if is_internal(address) and not any(
                p.network is not None and p.matches(host, address, port) for p in allow
            ):
                return (
                    f"{where}{via} is an internal address; only an allow pattern naming that "
                    "address or its range reaches it"
                )
        return None

    def narrows(self, parent: NetworkPolicy) -> bool:
        """True when this setting reaches no host the parent's cannot."""
        theirs = [_parse_pattern(q) for q in parent.allow]
        return set(parent.deny) <= set(self.deny) and all(
            any(_parse_pattern(p).within(q) for q in theirs) for p in self.allow
        )

    def to_dict(self) -> dict[str, Any]:
        return {"allow": list(self.allow), "deny": list(self.deny)}


def split_url(url: str) -> tuple[str, int] | str:
    """(canonical host, port) of an http(s) URL, or the reason it cannot be fetched."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        return f"scheme {parts.scheme or '(none)'!r} is not http or https"
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        return "the URL has an invalid port"
    if not parts.hostname:
        return "the URL has no host"
    try:
        host = normalise_host(parts.hostname)
    except ValueError:
        return f"{parts.hostname!r} is not a valid host name"
    return (host, port) if host else "the URL has no host"
