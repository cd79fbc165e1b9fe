"""The transport of the built-in HTTP tools: it connects only to addresses it checked.

Kept apart from `contextos.tools.http` so that the HTTP client is imported with the first
request a tool makes.
"""

from __future__ import annotations

import ssl
from collections.abc import Awaitable, Callable, Iterable

import httpx

from contextos.errors import ContainmentViolation
from contextos.policy.containment import Containment, confine_reach
from contextos.policy.network import IP, normalise_host, parse_ip


class PinnedTransport(httpx.AsyncBaseTransport):
    """Connects each request to an address it resolved and checked itself."""

    def __init__(
        self,
        own: Containment | None,
        run: Containment | None,
        resolver: Callable[[str], Awaitable[Iterable[str]]],  # a `tools.http.Resolver`
        verify: ssl.SSLContext | bool,
    ) -> None:
        self._own, self._run, self._resolver, self._verify = own, run, resolver, verify
        # One pool per name: a connection made with one TLS server name is never reused for
        # another name that happens to share its address.
        self._pools: dict[str, httpx.AsyncHTTPTransport] = {}

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        name = url.raw_host.decode("ascii")  # what httpx itself would have connected to
        port = url.port or (443 if url.scheme == "https" else 80)
        host = normalise_host(name)
        addresses = await self._resolve(host, str(url))
        confine_reach(str(url), host, port, addresses, self._own, self._run)
        pool = self._pools.get(name)
        if pool is None:
            pool = self._pools[name] = httpx.AsyncHTTPTransport(verify=self._verify)
        refused: httpx.ConnectError | None = None
        for address in addresses:  # every one is checked; the first that answers is used
            pinned = httpx.Request(
                request.method,
                url.copy_with(host=str(address)),
                headers=request.headers,  # keeps the Host header of the name
                stream=request.stream,
                extensions={**request.extensions, "sni_hostname": name},
            )
            try:
                return await pool.handle_async_request(pinned)
            except httpx.ConnectError as exc:
                refused = exc
        assert refused is not None  # _resolve never answers an empty list
        raise refused

    async def _resolve(self, host: str, url: str) -> list[IP]:
        literal = parse_ip(host)
        if literal is not None:
            return [literal]
        try:
            answers = [str(a) for a in await self._resolver(host)]
        except OSError as exc:
            raise ContainmentViolation(
                f"request to {url!r} refused: {host} does not resolve ({exc})", url=url
            ) from exc
        addresses = [parse_ip(a) for a in answers]
        if not answers or None in addresses:
            raise ContainmentViolation(
                f"request to {url!r} refused: {host} resolved to no usable address "
                f"({', '.join(answers) or 'no answer'})",
                url=url,
            )
        return [a for a in addresses if a is not None]

    async def aclose(self) -> None:
        for pool in self._pools.values():
            await pool.aclose()
