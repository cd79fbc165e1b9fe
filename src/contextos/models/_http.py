"""HTTP for the hosted-model adapters: POST with retries, backoff, Retry-After and timeouts.

A model request has no side effect, so retrying it is always safe: 408, 409, 429, 5xx and
connection failures are retried with exponential backoff and full jitter, and a server's
`Retry-After` (or `retry-after-ms`) is honoured. Secrets live only in request headers, which
are never logged or copied into errors; provider error text is scrubbed of the key as well.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import logging
import random
import re
import time
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx

from contextos.errors import ModelError, ModelRateLimited, ModelTimeout

log = logging.getLogger("contextos.models")

RETRY_STATUSES = frozenset({408, 409, 429, 500, 502, 503, 504, 529})
"""Statuses worth another attempt (529 is Anthropic's 'overloaded')."""

_KEYLIKE = re.compile(r"\b(sk|key|xai|gsk)-[A-Za-z0-9_\-*.]{6,}")


@dataclass(frozen=True, kw_only=True, slots=True)
class HTTPOptions:
    """Timeouts and retries of one adapter."""

    timeout_s: float = 120.0
    """Whole-attempt limit for a request; for a stream, the longest silence between chunks."""
    connect_timeout_s: float = 10.0
    """Limit on opening the connection."""
    max_retries: int = 4
    """Further attempts after the first (0 never retries)."""
    backoff_s: float = 0.5
    """First backoff; doubles each retry, with full jitter."""
    max_backoff_s: float = 20.0
    """Upper bound of one computed backoff."""
    max_retry_after_s: float = 60.0
    """A Retry-After further away than this is not waited for: the call fails as retryable."""


class Secret:
    """A credential that never shows itself in a repr, a log line or an error."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "Secret('***')"

    __str__ = __repr__

    def __bool__(self) -> bool:
        return bool(self._value)


def scrub(text: str, *secrets: Secret | None) -> str:
    """Remove secrets, and anything shaped like an API key, from provider text."""
    for s in secrets:
        if s is not None and s.reveal():
            text = text.replace(s.reveal(), "***")
    return _KEYLIKE.sub("***", text)


def retry_after_s(headers: httpx.Headers) -> float | None:
    """Seconds the server asked us to wait, from `retry-after-ms` or `Retry-After`."""
    ms = headers.get("retry-after-ms")
    if ms is not None:
        try:
            return max(float(ms) / 1000, 0.0)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(float(value), 0.0)
    except ValueError:
        pass
    when = email.utils.parsedate_to_datetime(value) if value.strip() else None
    if when is None:
        return None
    return max(when.timestamp() - time.time(), 0.0)


class Transport:
    """One provider endpoint: a per-event-loop httpx client plus the retry policy."""

    def __init__(
        self,
        *,
        provider: str,
        base_url: str,
        headers: Callable[[], Mapping[str, str]],
        options: HTTPOptions,
        secret: Secret | None = None,
        describe_error: Callable[[int, Any], str] | None = None,
    ) -> None:
        self.provider = provider
        self.base_url = base_url.rstrip("/")
        self._headers = headers
        self.options = options
        self._secret = secret
        self._describe_error = describe_error
        self._client: httpx.AsyncClient | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def __repr__(self) -> str:
        return f"Transport({self.provider!r}, {self.base_url!r})"

    def client(self) -> httpx.AsyncClient:
        # An httpx client belongs to the event loop that first used it; a sync facade that
        # calls asyncio.run() twice must not reuse a client bound to a closed loop.
        loop = asyncio.get_running_loop()
        if self._client is None or self._loop is not loop or self._client.is_closed:
            o = self.options
            self._client = httpx.AsyncClient(
                timeout=httpx.Timeout(o.timeout_s, connect=o.connect_timeout_s),
                follow_redirects=False,
            )
            self._loop = loop
        return self._client

    async def aclose(self) -> None:
        if self._client is not None and self._loop is asyncio.get_running_loop():
            await self._client.aclose()
        self._client = None

    # -- one request ----------------------------------------------------------------------

    async def post(self, path: str, body: Mapping[str, Any]) -> httpx.Response:
        """POST JSON and return the 2xx response, retrying what is safe to retry."""
        attempt = 0
        while True:
            try:
                async with asyncio.timeout(self.options.timeout_s):
                    response = await self.client().post(
                        self.url(path), json=body, headers=dict(self._headers())
                    )
                    await response.aread()
            except (TimeoutError, httpx.TransportError) as exc:
                error, reason = self.unreachable(exc)
                await self._before_retry(error, attempt, None, reason=reason)
            else:
                if response.is_success:
                    return response
                error = self.status_error(response)
                if not error.retryable:
                    raise error
                await self._before_retry(
                    error,
                    attempt,
                    retry_after_s(response.headers),
                    reason=f"HTTP {response.status_code}",
                )
            attempt += 1

    def unreachable(self, exc: BaseException) -> tuple[ModelError, str]:
        """The retryable error for a request that got no answer, and a short reason."""
        if isinstance(exc, TimeoutError | httpx.TimeoutException):
            timeout = ModelTimeout(
                f"{self.provider}: no answer within {self.options.timeout_s:g}s",
                retryable=True,
                provider=self.provider,
                timeout_s=self.options.timeout_s,
            )
            return timeout, "timeout"
        error = ModelError(
            f"{self.provider}: cannot reach {self.base_url}: {type(exc).__name__}",
            retryable=True,
            provider=self.provider,
        )
        return error, type(exc).__name__

    @asynccontextmanager
    async def stream(self, path: str, body: Mapping[str, Any]) -> AsyncIterator[httpx.Response]:
        """Open a streaming POST; retries happen only until a 2xx response has started."""
        attempt = 0
        while True:
            request = self.client().build_request(
                "POST", self.url(path), json=body, headers=dict(self._headers())
            )
            try:
                response = await self.client().send(request, stream=True)
            except httpx.TransportError as exc:
                error, reason = self.unreachable(exc)
                await self._before_retry(error, attempt, None, reason=reason)
            else:
                if response.is_success:
                    break
                try:
                    await response.aread()
                finally:
                    await response.aclose()
                error = self.status_error(response)
                if not error.retryable:
                    raise error
                await self._before_retry(
                    error,
                    attempt,
                    retry_after_s(response.headers),
                    reason=f"HTTP {response.status_code}",
                )
            attempt += 1
        try:
            yield response
        except httpx.TimeoutException:
            raise ModelTimeout(
                f"{self.provider}: the stream went silent for {self.options.timeout_s:g}s",
                retryable=True,
                provider=self.provider,
                timeout_s=self.options.timeout_s,
            ) from None
        except httpx.TransportError as exc:
            raise ModelError(
                f"{self.provider}: the stream broke: {type(exc).__name__}",
                retryable=True,
                provider=self.provider,
            ) from None
        finally:
            await response.aclose()

    def url(self, path: str) -> str:
        return f"{self.base_url}/{path.lstrip('/')}"

    # -- errors and waiting ---------------------------------------------------------------

    def status_error(self, response: httpx.Response) -> ModelError:
        """A clear, secret-free error for a non-2xx response."""
        status = response.status_code
        try:
            payload: Any = response.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            payload = response.text
        detail = self._describe_error(status, payload) if self._describe_error else ""
        if not detail:
            detail = payload if isinstance(payload, str) else json.dumps(payload)
        detail = scrub(detail, self._secret)[:500]
        request_id = response.headers.get("x-request-id") or response.headers.get("request-id")
        fields: dict[str, Any] = {"provider": self.provider, "status": status}
        if request_id:
            fields["request_id"] = request_id
        if status == 429:
            wait = retry_after_s(response.headers)
            if wait is not None:
                fields["retry_after_s"] = wait
            return ModelRateLimited(
                f"{self.provider}: rate limited (HTTP 429): {detail}", retryable=True, **fields
            )
        hint = _HINTS.get(status, "")
        return ModelError(
            f"{self.provider}: HTTP {status}{hint}: {detail}",
            retryable=status in RETRY_STATUSES or status >= 500,
            **fields,
        )

    async def _before_retry(
        self, error: ModelError, attempt: int, retry_after: float | None, *, reason: str
    ) -> None:
        """Wait before the next attempt, or raise `error` when no attempt is left."""
        o = self.options
        if attempt >= o.max_retries:
            raise error
        if retry_after is not None:
            if retry_after > o.max_retry_after_s:
                error.fields["retry_after_s"] = retry_after
                raise error
            delay, source = retry_after, "Retry-After"
        else:
            delay, source = (
                random.uniform(0, min(o.backoff_s * 2**attempt, o.max_backoff_s)),
                "backoff",
            )
        log.warning(
            "%s: %s; retry %d of %d in %.2fs (%s)",
            self.provider,
            reason,
            attempt + 1,
            o.max_retries,
            delay,
            source,
        )
        await asyncio.sleep(delay)


_HINTS = {
    400: " (bad request)",
    401: " (authentication failed: check the API key)",
    403: " (forbidden: the key lacks access to this model or endpoint)",
    404: " (not found: check the model name and base URL)",
    413: " (request too large)",
    422: " (the server could not process the request)",
}


async def sse_events(response: httpx.Response) -> AsyncIterator[tuple[str, str]]:
    """Server-sent events as (event name, data) pairs; the name is "" when not given."""
    event, data = "", list[str]()
    async for line in response.aiter_lines():
        if not line:
            if data:
                yield event, "\n".join(data)
            event, data = "", list[str]()
            continue
        if line.startswith(":"):
            continue
        field, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if field == "event":
            event = value
        elif field == "data":
            data.append(value)
    if data:
        yield event, "\n".join(data)
