"""Built-in HTTP tools confined by the network allow/deny setting.

Redirects are followed by hand so every hop is checked against the same setting: an allowed
host cannot bounce a request to a forbidden one.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urljoin

import httpx

from contextos.errors import ContainmentViolation
from contextos.policy.containment import Containment, NetworkPolicy, confine_url
from contextos.policy.engine import ConfinedTool
from contextos.policy.files import confined
from contextos.tools.contract import Effect, Risk, tool

_MAX_REDIRECTS = 5


def http_tools(
    network: NetworkPolicy | None = None,
    *,
    timeout_s: float = 10.0,
    max_bytes: int = 100_000,
    transport: httpx.AsyncBaseTransport | None = None,
) -> tuple[ConfinedTool, ConfinedTool]:
    """`http_get` (read) and `http_post` (write), reaching only hosts the setting allows.

    With no `network` here, the tools reach only what the run's containment allows.
    """
    own = Containment(network=network) if network is not None else None

    async def fetch(method: str, url: str, body: str | None, headers: dict[str, str]) -> Any:
        async with httpx.AsyncClient(
            timeout=timeout_s, follow_redirects=False, transport=transport
        ) as client:
            for _ in range(_MAX_REDIRECTS + 1):
                confine_url(url, own)
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
        effect=Effect.READ,
        risk=Risk.LOW,
        scopes=("net:read",),
        timeout_s=timeout_s + 5,
    )
    async def http_get(url: str, headers: dict[str, str] | None = None) -> Any:
        """Fetch a URL with GET; only hosts on the network allow list are reachable."""
        return await fetch("GET", url, None, headers or {})

    @tool(
        name="http_post",
        effect=Effect.WRITE,
        risk=Risk.MEDIUM,
        scopes=("net:write",),
        timeout_s=timeout_s + 5,
    )
    async def http_post(url: str, body: str = "", headers: dict[str, str] | None = None) -> Any:
        """Send a POST request; only hosts on the network allow list are reachable."""
        return await fetch("POST", url, body, headers or {})

    return (
        confined(http_get, (("url", "url"),), own),
        confined(http_post, (("url", "url"),), own),
    )
