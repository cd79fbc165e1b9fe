"""The link verifier: the gate's deterministic half, which tries to disprove "this link is dead".

An internal link is resolved again from the files themselves (the file, then its `#anchor`).
An external link is fetched through the project's network-contained HTTP tool: every hop of a
redirect is checked against the network policy on the address it resolves to, so a link to a
denied address is refused, never fetched. Timeouts, refused connections and 5xx/429 answers
are tried again. HTTP alone decides: a page that answers 200 is alive, and one that reads "not
found" or "moved" carries a `doubt` (see `doubts`) for a model or a person to judge apart.
"""

from __future__ import annotations

import asyncio
import functools
import os
import ssl
from collections.abc import Awaitable, Callable, Iterable, Mapping
from enum import StrEnum
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from pydantic import BaseModel, ConfigDict

from contextos import NetworkPolicy, Tool, ToolContext
from contextos.errors import ContainmentViolation
from contextos.jobs.kb.doubts import doubt_of, excerpt
from contextos.jobs.kb.markdown import TargetKind, normalise_url, parse, resolve
from contextos.jobs.kb.tools import ReadOnlyDir
from contextos.tools import http_tools

Resolver = Callable[[str], Awaitable[Iterable[str]]]
"""Answers a host name's addresses (an async getaddrinfo), raising OSError when it has none."""


class LinkStatus(StrEnum):
    ALIVE = "alive"
    """The link works: the verifier disproved "dead"."""
    DEAD = "dead"
    """The verifier tried and failed to show the link works."""
    UNSURE = "unsure"
    """Neither: a person or a model must judge (see the reason)."""


class Reason(StrEnum):
    OK = "ok"
    NO_SUCH_FILE = "no_such_file"
    NO_SUCH_ANCHOR = "no_such_anchor"
    OUTSIDE = "outside"
    """An internal link that climbs out of the knowledge base."""
    NOT_FOUND = "not_found"
    """404 or 410."""
    REDIRECT_TO_MISSING = "redirect_to_missing"
    """A redirect that ends at a 404 or 410."""
    UNRESOLVABLE = "unresolvable"
    """The host name does not resolve."""
    CONNECTION_FAILED = "connection_failed"
    TIMEOUT = "timeout"
    SERVER_ERROR = "server_error"
    RATE_LIMITED = "rate_limited"
    NEEDS_AUTH = "needs_auth"
    CLIENT_ERROR = "client_error"
    PROTOCOL_ERROR = "protocol_error"
    REFUSED = "refused"
    """The network policy does not allow it: not fetched."""
    MALFORMED = "malformed"
    """The URL does not parse (an invalid port, host or IPv6 address)."""


class LinkVerdict(BaseModel):
    """What the verifier found for one link."""

    model_config = ConfigDict(frozen=True)

    target: str
    """The link as given to the verifier."""
    status: LinkStatus
    reason: Reason
    detail: str
    """One sentence for a person."""
    http_status: int | None = None
    """The last HTTP status seen, for external links."""
    final_url: str | None = None
    """Where redirects ended, when they went somewhere else."""
    attempts: int = 1
    """Requests made (more than one when a failure was tried again)."""
    checked_s: float | None = None
    """When the scan that kept this verdict made it (seconds since the epoch)."""
    doubt: str | None = None
    """Why an alive page is worth a second look (it reads "not found", it landed on the
    site's home page), when the pre-filter says so; the page's excerpt is kept with it."""
    excerpt: str | None = None
    """The doubted page's title, first heading and opening text, for the judge."""


_PAGES = (".md", ".markdown")


class LinkVerifier:
    """Verifies links of one knowledge base: files under `root`, URLs under `network`.

    `aliases` maps a link's origin to the origin actually fetched (`http://kb-fixture.test` to
    a loopback port), for mirrors and test fixtures; `resolver` answers host names (the
    system's by default). With no `network`, no URL is reachable and external links are
    `unsure: refused`.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        network: NetworkPolicy | None = None,
        resolver: Resolver | None = None,
        aliases: Mapping[str, str] | None = None,
        timeout_s: float = 10.0,
        attempts: int = 2,
        backoff_s: float = 0.5,
        max_bytes: int = 65_536,
    ) -> None:
        self.files = ReadOnlyDir(root)
        self.attempts = max(1, attempts)
        self.backoff_s = backoff_s
        self._aliases = {_origin(k): _origin(v) for k, v in (aliases or {}).items()}
        self._back = {v: k for k, v in self._aliases.items()}
        extra: dict[str, Any] = {} if resolver is None else {"resolver": resolver}
        self._get: Tool = http_tools(
            network or NetworkPolicy(),
            timeout_s=timeout_s,
            max_bytes=max_bytes,
            verify=_tls(),
            **extra,
        )[0]

    async def verify(self, page: str, target: str) -> LinkVerdict:
        """Verify `target` as written in `page` (a path relative to the root)."""
        where = resolve(page, target)
        if where.kind is TargetKind.EXTERNAL:
            assert where.url is not None
            return await self.verify_url(where.url, target=target)
        return self.verify_internal(page, target)

    def verify_internal(self, page: str, target: str) -> LinkVerdict:
        """Resolve the file, then the anchor, from the files as they are now."""
        where = resolve(page, target)

        def verdict(status: LinkStatus, reason: Reason, detail: str) -> LinkVerdict:
            return LinkVerdict(target=target, status=status, reason=reason, detail=detail)

        if where.kind is TargetKind.OUTSIDE:
            return verdict(LinkStatus.DEAD, Reason.OUTSIDE, "the path climbs out of the root")
        if where.kind is not TargetKind.INTERNAL or where.path is None:
            return verdict(LinkStatus.ALIVE, Reason.OK, "not a link the scan checks")
        try:
            info = self.files.stat(where.path or ".")
        except (OSError, ContainmentViolation) as exc:
            return verdict(LinkStatus.DEAD, Reason.NO_SUCH_FILE, f"{where.path}: {_why(exc)}")
        if not where.anchor or info.kind == "dir" or not where.path.lower().endswith(_PAGES):
            return verdict(LinkStatus.ALIVE, Reason.OK, f"{where.path} exists")
        anchors = {a.lower() for a in parse(self.files.read(where.path)).anchors}
        if where.anchor.lower() in anchors:
            return verdict(LinkStatus.ALIVE, Reason.OK, f"{where.path}#{where.anchor} exists")
        return verdict(
            LinkStatus.DEAD,
            Reason.NO_SUCH_ANCHOR,
            f"{where.path} has no heading or anchor #{where.anchor}",
        )

    async def verify_url(self, url: str, *, target: str | None = None) -> LinkVerdict:
        """GET the URL (redirects followed and checked hop by hop), trying again after a
        timeout, a failed connection, a 5xx or a 429."""
        import httpx  # loaded with the first link checked, as the tools' transport is

        url = normalise_url(url)
        verdict = functools.partial(LinkVerdict, target=target or url)
        failure: tuple[Reason, str, int | None] = (Reason.PROTOCOL_ERROR, "no answer", None)
        attempt = 0
        while attempt < self.attempts:
            attempt += 1
            if attempt > 1:
                await asyncio.sleep(self.backoff_s * 2 ** (attempt - 2))
            try:
                answer = await self._get.fn(url=self._alias(url), headers=_HEADERS, ctx=_DIRECT)
            except ContainmentViolation as exc:
                unresolvable = isinstance(exc.__cause__, OSError)  # the name did not resolve
                return verdict(
                    status=LinkStatus.DEAD if unresolvable else LinkStatus.UNSURE,
                    reason=Reason.UNRESOLVABLE if unresolvable else Reason.REFUSED,
                    detail=exc.message if unresolvable else f"not fetched: {exc.message}",
                    attempts=attempt,
                )
            except httpx.TimeoutException as exc:
                failure = (Reason.TIMEOUT, f"no answer in time ({type(exc).__name__})", None)
                continue
            except httpx.ConnectError as exc:
                failure = (Reason.CONNECTION_FAILED, f"could not connect ({exc})", None)
                continue
            except httpx.HTTPError as exc:
                failure = (Reason.PROTOCOL_ERROR, f"{type(exc).__name__}: {exc}", None)
                continue
            except (ValueError, httpx.InvalidURL) as exc:  # IDNA errors are ValueErrors too
                detail = f"the URL does not parse: {exc}"
                return verdict(status=LinkStatus.DEAD, reason=Reason.MALFORMED, detail=detail)
            status = int(answer["status"])
            if status == 429 or status >= 500:
                reason = Reason.RATE_LIMITED if status == 429 else Reason.SERVER_ERROR
                failure = (reason, f"answered {status}", status)
                continue
            return self._judge(verdict, url, answer, attempts=attempt)
        reason, detail, last_status = failure
        # nothing listening (or no TLS) is a link a reader cannot follow; slowness is not proof
        return verdict(
            status=LinkStatus.DEAD if reason is Reason.CONNECTION_FAILED else LinkStatus.UNSURE,
            reason=reason,
            detail=f"{detail}, after {attempt} attempts" if attempt > 1 else detail,
            http_status=last_status,
            attempts=attempt,
        )

    def _judge(
        self,
        verdict: Callable[..., LinkVerdict],
        url: str,
        answer: dict[str, Any],
        *,
        attempts: int,
    ) -> LinkVerdict:
        """The verdict on an answer that is not worth asking again."""
        status = int(answer["status"])
        final = self._unalias(str(answer["url"]))
        moved = final if final != url else None
        hops = f"redirected to {moved}, which answered {status}" if moved else f"answered {status}"
        made = functools.partial(verdict, http_status=status, final_url=moved, attempts=attempts)
        if status in (404, 410):
            reason = Reason.REDIRECT_TO_MISSING if moved else Reason.NOT_FOUND
            return made(status=LinkStatus.DEAD, reason=reason, detail=hops)
        if status in (401, 403, 407):
            detail = f"{hops}: it may need a login"
            return made(status=LinkStatus.UNSURE, reason=Reason.NEEDS_AUTH, detail=detail)
        if status >= 400 and status != 416:  # 416: a range past the end of a file that exists
            return made(status=LinkStatus.UNSURE, reason=Reason.CLIENT_ERROR, detail=hops)
        kind = str(answer.get("content_type", "")).lower()
        body = str(answer.get("body", "")) if "html" in kind or "text" in kind else ""
        doubt = doubt_of(url, moved, body)
        if doubt is None:
            return made(status=LinkStatus.ALIVE, reason=Reason.OK, detail=hops)
        return made(
            status=LinkStatus.ALIVE,
            reason=Reason.OK,
            detail=f"{hops}, but {doubt}",
            doubt=doubt,
            excerpt=excerpt(body),
        )

    def _alias(self, url: str) -> str:
        origin = _origin(url)
        if origin in self._aliases:
            return self._aliases[origin] + url[len(origin) :]
        return url

    def _unalias(self, url: str) -> str:
        origin = _origin(url)
        if origin in self._back:
            return self._back[origin] + url[len(origin) :]
        return url


_DIRECT = ToolContext(run_id="kb-scan", call_id="direct")
"""The verifier calls its HTTP tool itself, not for a run: only the tool's own walls apply."""

_HEADERS = {
    "User-Agent": "contextos-kb-scan (link check)",
    "Accept": "text/html,text/plain;q=0.9,*/*;q=0.5",
    # the first bytes are enough to judge a page, and a large download is not fetched whole
    # by servers that honour ranges
    "Range": "bytes=0-65535",
}


@functools.cache
def _tls() -> ssl.SSLContext:
    """One TLS context for every verifier in the process: loading the CA bundle takes ~0.1 s,
    a fixed cost an incremental scan would otherwise pay in full."""
    return ssl.create_default_context()


def _origin(url: str) -> str:
    """`scheme://host[:port]` of a URL, lowercased, as it prefixes the URL's text."""
    parts = urlsplit(url)
    return urlunsplit((parts.scheme.lower(), parts.netloc.lower(), "", "", ""))


def _why(exc: OSError | ContainmentViolation) -> str:
    if isinstance(exc, ContainmentViolation):
        return exc.message
    return exc.strerror or str(exc)
