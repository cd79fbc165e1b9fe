"""Built-in HTTP tools confined by the network allow/deny setting.

Each request's host is resolved once, every address it resolves to is checked, and the
connection goes to a checked address (the name stays in the Host header and the TLS server
name), so a second DNS answer cannot redirect it. Redirects are followed by hand, each hop
checked the same way: an allowed host cannot bounce a request to a forbidden one.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import Awaitable, Callable, Iterable
from typing import Any
from urllib.parse import urljoin

from contextos.errors import ContainmentViolation
from contextos.policy.containment import Containment, confine_url
from contextos.policy.network import NetworkPolicy
from contextos.tools.contract import EffectKind, Risk, ToolContext, tool
from contextos.tools.files import ConfinedTool, confined

_MAX_REDIRECTS = 5

Resolver = Callable[[str], Awaitable[Iterable[str]]]
"""Answers the addresses of a host name (an async `getaddrinfo`); raises OSError (such as
`socket.gaierror`) when the name does not resolve."""


async def system_resolver(host: str) -> list[str]:
    """The addresses the operating system's resolver gives for `host`."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, None, type=socket.SOCK_STREAM)
    return [str(info[4][0]) for info in infos]


def http_tools(
    network: NetworkPolicy | None = None,
    *,
    timeout_s: float = 10.0,
    max_bytes: int = 100_000,
    resolver: Resolver = system_resolver,
    verify: ssl.SSLContext | bool = True,
) -> tuple[ConfinedTool, ConfinedTool]:
    """`http_get` (read) and `http_post` (write), reaching only hosts the setting allows.

    With no `network` here, the tools reach only what the run's containment allows.
    `resolver` answers host names (the system's by default); `verify` is httpx's TLS setting.
    """
    own = Containment(network=network) if network is not None else None

    async def fetch(
        method: str, url: str, body: str | None, headers: dict[str, str], run: Containment | None
    ) -> Any:
        # The HTTP client loads with the first request, not with every process that imports
        # the runtime: it and what it imports are a large part of that import.
        import httpx

        from contextos.tools.http_transport import PinnedTransport

        transport = PinnedTransport(own, run, resolver, verify)
        # trust_env=False: a proxy from the environment would connect on the run's behalf.
        async with httpx.AsyncClient(
            timeout=timeout_s, follow_redirects=False, transport=transport, trust_env=False
        ) as client:
            for _ in range(_MAX_REDIRECTS + 1):
                confine_url(url, own, run)
                response = await client.request(method, url, content=body, headers=headers)
                if response.is_redirect and "location" in response.headers:
                    url = urljoin(url, response.headers["location"])
                    if response.status_code in (301, 302, 303):
                        method, body = "GET", None
                    continue
                text = response.text
                return {
                    "status": response.status_code,
                    "url": url,
                    "content_type": response.headers.get("content-type", ""),
                    "body": text[:max_bytes],
                    "truncated": len(text) > max_bytes,
                }
        raise ContainmentViolation(f"more than {_MAX_REDIRECTS} redirects from {url}", url=url)

    @tool(
        name="http_get",
        effect=EffectKind.READ,
        risk=Risk.LOW,
        scopes=("net:read",),
        timeout_s=timeout_s + 5,
    )
    async def http_get(url: str, ctx: ToolContext, headers: dict[str, str] | None = None) -> Any:
        """Fetch a URL with GET; only hosts on the network allow list are reachable."""
        return await fetch("GET", url, None, headers or {}, ctx.containment)

    @tool(
        name="http_post",
        effect=EffectKind.WRITE,
        risk=Risk.MEDIUM,
        scopes=("net:write",),
        timeout_s=timeout_s + 5,
    )
    async def http_post(
        url: str, ctx: ToolContext, body: str = "", headers: dict[str, str] | None = None
    ) -> Any:
        """Send a POST request; only hosts on the network allow list are reachable."""
        return await fetch("POST", url, body, headers or {}, ctx.containment)

    return (
        confined(http_get, (("url", "url"),), own),
        confined(http_post, (("url", "url"),), own),
    )
