"""HTTP for the hosted-model adapters: POST with retries, backoff, Retry-After and time limits.

A model request has no side effect, so retrying it is always safe: 408, 409, 429, 5xx,
connection failures and malformed answers are retried with exponential backoff and full
jitter, and a server's `Retry-After` (or `retry-after-ms`) is honoured when it is a plain
number of seconds or an HTTP date. A server is never trusted with time or memory: every call
has a total deadline (retries and waits included, clamped to the run's deadline), and no
response is read past a size cap. Secrets live only in request headers, which are never logged
or copied into errors; provider error text is scrubbed of the key as well.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import logging
import math
import random
import re
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TypeVar

from contextos.errors import ModelError, ModelProtocolError, ModelRateLimited, ModelTimeout
from contextos.models._wire import clip

if TYPE_CHECKING:
    import httpx

log = logging.getLogger("contextos.models")

T = TypeVar("T")

RETRY_STATUSES = frozenset({408, 409, 429, 500, 502, 503, 504, 529})
"""Statuses worth another attempt (529 is Anthropic's 'overloaded')."""

MAX_ANSWER_BYTES = 4 * 1024 * 1024
"""Default cap on one answer's text plus tool-call arguments (UTF-8 bytes)."""

_KEYLIKE = re.compile(r"\b(sk|key|xai|gsk)-[A-Za-z0-9_\-*.]{6,}")
_SECONDS = re.compile(r"\d+(\.\d+)?")


@dataclass(frozen=True, kw_only=True, slots=True)
class HTTPOptions:
    """Time limits, retries and size limits of one adapter."""

    timeout_s: float = 120.0
    """Whole-attempt limit for a request; for a stream, the longest silence between chunks."""
    connect_timeout_s: float = 10.0
    """Limit on opening the connection."""
    call_timeout_s: float = 300.0
    """Limit on the whole call: every attempt, wait and streamed chunk (and never past the
    run's deadline)."""
    max_retries: int = 4
    """Further attempts after the first (0 never retries)."""
    backoff_s: float = 0.5
    """First backoff; doubles each retry, with full jitter."""
    max_backoff_s: float = 20.0
    """Upper bound of one computed backoff."""
    max_retry_after_s: float = 60.0
    """A Retry-After further away than this is not waited for: the call fails as retryable."""
    max_answer_bytes: int = MAX_ANSWER_BYTES
    """A larger answer (text plus tool-call arguments) fails the call; it is never truncated."""

    @property
    def max_body_bytes(self) -> int:
        """Bytes read from one response at most: the answer cap with room for JSON escapes."""
        return 6 * self.max_answer_bytes + 1024 * 1024


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


def retry_after_s(headers: httpx.Headers, *, now: datetime | None = None) -> float | None:
    """Seconds the server asked us to wait, from `retry-after-ms` or `Retry-After`.

    Only a plain non-negative number or an HTTP date counts; anything else (`nan`, `-1`,
    `soon`) is None, and the caller falls back to its own backoff.
    """
    ms = headers.get("retry-after-ms", "").strip()
    if _SECONDS.fullmatch(ms):
        return _finite(float(ms) / 1000)
    value = headers.get("retry-after", "").strip()
    if _SECONDS.fullmatch(value):
        return _finite(float(value))
    if not value[:1].isalpha():
        return None  # nothing, or a number that is not a plain one; an HTTP date names its day
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when.tzinfo is None:  # "-0000": UTC by the HTTP rules
        when = when.replace(tzinfo=UTC)
    return max((when - (now or datetime.now(UTC))).total_seconds(), 0.0)


def _finite(seconds: float) -> float | None:
    return seconds if math.isfinite(seconds) else None


@dataclass(frozen=True, kw_only=True, slots=True)
class _Failed:
    """One attempt that got no usable answer."""

    error: ModelError
    retry_after: float | None = None
    reason: str


@dataclass(frozen=True, kw_only=True, slots=True)
class EventStream:
    """An open server-sent-event stream: its headers and its events, as (name, data)."""

    headers: httpx.Headers
    events: AsyncIterator[tuple[str, str]]


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
        import httpx  # loaded by the first call, not by every process importing the runtime

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

    def deadline(self, deadline_at: datetime | None = None) -> float:
        """The call's deadline in event-loop time: its own limit, or the run's if sooner."""
        now = asyncio.get_running_loop().time()
        deadline = now + self.options.call_timeout_s
        if deadline_at is not None:
            deadline = min(deadline, now + (deadline_at - datetime.now(UTC)).total_seconds())
        return deadline

    # -- one request ----------------------------------------------------------------------

    async def call(
        self,
        path: str,
        body: Mapping[str, Any],
        parse: Callable[[httpx.Headers, bytes], T],
        *,
        deadline_at: datetime | None = None,
    ) -> T:
        """POST JSON and parse the 2xx answer, retrying what is safe to retry.

        `parse` raises ModelProtocolError for an answer that is not a valid one: a retryable
        one is asked for again like a 5xx.
        """
        deadline = self.deadline(deadline_at)
        attempt = 0
        while True:
            outcome = await self._attempt(path, body, deadline)
            if isinstance(outcome, _Failed):
                failed = outcome
            else:
                try:
                    return parse(*outcome)
                except ModelProtocolError as exc:
                    failed = _Failed(error=exc, reason="malformed answer")
            if not failed.error.retryable:
                raise failed.error
            await self._before_retry(failed, attempt, deadline)
            attempt += 1

    async def _attempt(
        self, path: str, body: Mapping[str, Any], deadline: float
    ) -> tuple[httpx.Headers, bytes] | _Failed:
        """One POST, read in full (up to the size cap) within the attempt's time limit."""
        import httpx

        client = self.client()
        request = client.build_request(
            "POST", self.url(path), json=body, headers=dict(self._headers())
        )
        try:
            async with asyncio.timeout_at(self._attempt_deadline(deadline)):
                response = await client.send(request, stream=True)
                try:
                    content = await self._read(response)
                finally:
                    await response.aclose()
        except (TimeoutError, httpx.TransportError) as exc:
            return self._unreachable(exc, deadline)
        if response.is_success:
            return response.headers, content
        return self._status_failure(response.status_code, response.headers, content)

    def _attempt_deadline(self, deadline: float) -> float:
        return min(asyncio.get_running_loop().time() + self.options.timeout_s, deadline)

    async def _read(self, response: httpx.Response) -> bytes:
        limit = self.options.max_body_bytes
        declared = response.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            raise self.too_large(int(declared))
        chunks, size = list[bytes](), 0
        async for chunk in response.aiter_bytes():
            size += len(chunk)
            if size > limit:
                raise self.too_large(size)
            chunks.append(chunk)
        return b"".join(chunks)

    def too_large(self, size: int) -> ModelProtocolError:
        """The (not retryable) error for an answer over the size cap."""
        return ModelProtocolError(
            f"{self.provider}: the answer is larger than the cap of "
            f"{self.options.max_answer_bytes} bytes ({size} bytes or more); raise "
            "HTTPOptions.max_answer_bytes if such answers are expected",
            retryable=False,
            provider=self.provider,
            max_answer_bytes=self.options.max_answer_bytes,
        )

    def out_of_time(self) -> ModelTimeout:
        """The error for a call that reached its deadline (its own limit or the run's)."""
        limit = self.options.call_timeout_s
        return ModelTimeout(
            f"{self.provider}: the call ran out of time (its limit is {limit:g}s, set by "
            "HTTPOptions.call_timeout_s, and never past the run's deadline)",
            retryable=True,
            provider=self.provider,
            timeout_s=limit,
        )

    def _unreachable(self, exc: BaseException, deadline: float) -> _Failed:
        """A request that got no answer, as a retryable error."""
        import httpx

        if isinstance(exc, TimeoutError | httpx.TimeoutException):
            if asyncio.get_running_loop().time() >= deadline:
                return _Failed(error=self.out_of_time(), reason="timeout")
            timeout = ModelTimeout(
                f"{self.provider}: no answer within {self.options.timeout_s:g}s",
                retryable=True,
                provider=self.provider,
                timeout_s=self.options.timeout_s,
            )
            return _Failed(error=timeout, reason="timeout")
        error = ModelError(
            f"{self.provider}: cannot reach {self.base_url}: {type(exc).__name__}",
            retryable=True,
            provider=self.provider,
        )
        return _Failed(error=error, reason=type(exc).__name__)

    @asynccontextmanager
    async def stream(
        self, path: str, body: Mapping[str, Any], *, deadline_at: datetime | None = None
    ) -> AsyncIterator[EventStream]:
        """Open a streaming POST; retries happen only until a 2xx response has started."""
        import httpx

        deadline = self.deadline(deadline_at)
        attempt = 0
        while True:
            client = self.client()
            request = client.build_request(
                "POST", self.url(path), json=body, headers=dict(self._headers())
            )
            try:
                async with asyncio.timeout_at(self._attempt_deadline(deadline)):
                    response = await client.send(request, stream=True)
                    if not response.is_success:
                        try:
                            content = await self._read(response)
                        finally:
                            await response.aclose()
            except (TimeoutError, httpx.TransportError) as exc:
                failed = self._unreachable(exc, deadline)
            else:
                if response.is_success:
                    break
                failed = self._status_failure(response.status_code, response.headers, content)
            if not failed.error.retryable:
                raise failed.error
            await self._before_retry(failed, attempt, deadline)
            attempt += 1
        try:
            yield EventStream(headers=response.headers, events=self._events(response, deadline))
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

    async def _events(
        self, response: httpx.Response, deadline: float
    ) -> AsyncIterator[tuple[str, str]]:
        """The stream's server-sent events, within the call's deadline and size cap."""
        chunks = response.aiter_bytes()
        lines = _Lines(self.options.max_body_bytes, self.too_large)
        event, data = "", list[str]()
        while True:
            try:
                async with asyncio.timeout_at(deadline):
                    chunk = await anext(chunks, None)
            except TimeoutError:
                raise self.out_of_time() from None
            for line in lines.feed(chunk) if chunk is not None else lines.rest():
                if not line:
                    if data:
                        yield event, "\n".join(data)
                    event, data = "", []
                    continue
                if line.startswith(":"):
                    continue
                name, _, value = line.partition(":")
                value = value.removeprefix(" ")
                if name == "event":
                    event = value
                elif name == "data":
                    data.append(value)
            if chunk is None:
                return

    def url(self, path: str) -> str:
        return f"{self.base_url}/{path.lstrip('/')}"

    # -- errors and waiting ---------------------------------------------------------------

    def _status_failure(self, status: int, headers: httpx.Headers, content: bytes) -> _Failed:
        """A clear, secret-free error for a non-2xx response, and the wait it asked for."""
        try:
            payload: Any = json.loads(content)
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
            payload = content.decode("utf-8", errors="replace")
        detail = self._describe_error(status, payload) if self._describe_error else ""
        if not detail:
            detail = content[:2000].decode("utf-8", errors="replace")
        detail = clip(scrub(detail[:2000], self._secret), 500)
        request_id = headers.get("x-request-id") or headers.get("request-id")
        fields: dict[str, Any] = {"provider": self.provider, "status": status}
        if request_id:
            fields["request_id"] = request_id
        wait = retry_after_s(headers)
        error: ModelError
        if status == 429:
            if wait is not None:
                fields["retry_after_s"] = wait
            error = ModelRateLimited(
                f"{self.provider}: rate limited (HTTP 429): {detail}", retryable=True, **fields
            )
        else:
            hint = _HINTS.get(status, "")
            error = ModelError(
                f"{self.provider}: HTTP {status}{hint}: {detail}",
                retryable=status in RETRY_STATUSES or status >= 500,
                **fields,
            )
        return _Failed(error=error, retry_after=wait, reason=f"HTTP {status}")

    async def _before_retry(self, failed: _Failed, attempt: int, deadline: float) -> None:
        """Wait before the next attempt, or raise the error when no attempt (or time) is left."""
        o, error, retry_after = self.options, failed.error, failed.retry_after
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
        if asyncio.get_running_loop().time() + delay >= deadline:
            raise error  # the next attempt could not start before the call's deadline
        log.warning(
            "%s: %s; retry %d of %d in %.2fs (%s)",
            self.provider,
            failed.reason,
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


class _Lines:
    """Splits a byte stream into text lines, refusing to hold more than `limit` bytes."""

    __slots__ = ("_buffer", "_limit", "_scanned", "_seen", "_too_large")

    def __init__(self, limit: int, too_large: Callable[[int], Exception]) -> None:
        self._buffer = bytearray()
        self._scanned = 0
        self._seen = 0
        self._limit = limit
        self._too_large = too_large

    def feed(self, chunk: bytes) -> list[str]:
        self._seen += len(chunk)
        if self._seen > self._limit:
            raise self._too_large(self._seen)
        buffer = self._buffer
        buffer += chunk
        out, start = [], 0
        while (end := buffer.find(b"\n", max(start, self._scanned))) >= 0:
            out.append(_text(buffer[start:end]))
            start = end + 1
        del buffer[:start]
        self._scanned = len(buffer)
        return out

    def rest(self) -> list[str]:
        """The last line when the stream did not end with a newline, then an empty one."""
        last = [_text(self._buffer)] if self._buffer else []
        self._buffer.clear()
        return [*last, ""]


def _text(line: bytes | bytearray) -> str:
    return bytes(line).decode("utf-8", errors="replace").removesuffix("\r")
