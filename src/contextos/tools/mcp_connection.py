"""One live connection to an MCP server, held in a task of its own.

The SDK runs a transport in anyio task groups: when the server crashes, the group cancels the
scope it was entered in. Entering it in a dedicated task keeps that cancellation there, and
every request runs in a task of its own too, so a broken server ends the request with
`ConnectionLost` and never cancels a run's task. The connection also notes when the server
says its tool list changed (a legacy notification, or a `subscriptions/listen` stream on
servers of the 2026 protocol), so the tools can be listed again before the next call.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from contextos.errors import ConfigError, McpServerUnavailable

T = TypeVar("T")

CONNECTION_CLOSED = -32000
"""The MCP SDK's error code for a request whose connection closed."""


class ConnectionLost(Exception):
    """The connection ended while a request was in flight: it may or may not have been served."""


class Connection:
    """Connect, send requests, and notice tool-list changes, without leaking the SDK's scopes."""

    def __init__(self, name: str, target: Any, *, timeout_s: float) -> None:
        self.name = name
        self.target = target
        self.timeout_s = timeout_s
        self.tools_changed = False
        """Set when the server said its tool list changed; the owner clears it on re-listing."""
        self.client: Any = None
        self._task: asyncio.Task[None] | None = None
        self._closing = asyncio.Event()
        self._broken = False
        self._lost = ""

    @property
    def why_lost(self) -> str:
        return self._lost or "the connection was closed"

    async def open(self) -> None:
        """Connect and initialise within `timeout_s`, or fail with McpServerUnavailable."""
        try:
            from mcp import Client
        except ImportError as exc:  # pragma: no cover - depends on the install
            raise ConfigError("MCP tools need the MCP SDK: pip install 'contextos[mcp]'") from exc
        ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._task = asyncio.create_task(self._hold(Client, ready), name=f"mcp:{self.name}")
        try:
            async with asyncio.timeout(self.timeout_s):
                await ready
        except BaseException as exc:
            await self._stop()
            if isinstance(exc, TimeoutError):
                raise McpServerUnavailable(
                    f"MCP server {self.name} did not answer the connection and initialisation "
                    f"within {self.timeout_s:g}s; check that the command or URL starts a "
                    "server, or raise connect_timeout_s",
                    server=self.name,
                ) from None
            if isinstance(exc, ConnectionLost):
                raise McpServerUnavailable(
                    f"could not connect to MCP server {self.name}: {exc}", server=self.name
                ) from None
            raise

    async def request(self, send: Callable[[Any], Awaitable[T]]) -> T:
        """`send(client)` in a task of its own.

        Raises McpServerUnavailable when there is no connection to send it on (it was not
        sent), ConnectionLost when the connection ends before the answer (it may have been
        served); the SDK's own errors propagate.
        """
        holder, client = self._task, self.client
        if holder is None or holder.done() or client is None or self._broken:
            raise McpServerUnavailable(
                f"MCP server {self.name} is not connected ({self.why_lost}); the call was not sent",
                server=self.name,
            )
        pending = asyncio.ensure_future(send(client))
        pending.add_done_callback(_observe)
        try:
            await asyncio.wait({pending, holder}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:  # the caller's time limit, or the run is ending
            pending.cancel()
            raise
        if pending.done() and not pending.cancelled():
            error = pending.exception()
            if error is None:
                return pending.result()
            if not _closed(error):
                raise error
            self._broken, self._lost = True, "the SDK reported the connection closed"
        pending.cancel()
        raise ConnectionLost(f"the connection to MCP server {self.name} ended: {self.why_lost}")

    async def close(self) -> None:
        """Close the connection; one that does not close within `timeout_s` is cut."""
        task = self._task
        if task is None:
            return
        self._closing.set()
        await asyncio.wait({task}, timeout=self.timeout_s)
        await self._stop()

    async def _stop(self) -> None:
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            await asyncio.wait({task})

    async def _hold(self, client_type: Any, ready: asyncio.Future[None]) -> None:
        """The connection's whole life, in this task: whatever the transport throws ends here."""
        try:
            async with client_type(self.target, message_handler=self._on_message) as client:
                self.client = client
                await self._serve(client, ready)
        except (Exception, asyncio.CancelledError, BaseExceptionGroup) as exc:
            self._lost = _why_lost(exc)
        finally:
            self.client = None
            if not ready.done():
                ready.set_exception(ConnectionLost(self.why_lost))

    async def _serve(self, client: Any, ready: asyncio.Future[None]) -> None:
        """Follow tool-list changes (on 2026 servers, through a listen stream) until closed."""
        from mcp_types.version import MODERN_PROTOCOL_VERSIONS

        tools = client.server_capabilities.tools
        announces = tools is not None and bool(tools.list_changed)
        async with contextlib.AsyncExitStack() as stack:
            stream = None
            if announces and client.protocol_version in MODERN_PROTOCOL_VERSIONS:
                stream = await stack.enter_async_context(client.listen(tools_list_changed=True))
            if not ready.done():
                ready.set_result(None)
            if stream is None:
                await self._closing.wait()
                return
            following = asyncio.ensure_future(self._follow(stream))
            following.add_done_callback(_observe)
            try:
                await self._closing.wait()
            finally:
                following.cancel()

    async def _follow(self, stream: Any) -> None:
        try:
            async for _event in stream:
                self.tools_changed = True
        finally:
            # The stream ended (or broke): a change may have gone unannounced, so list again.
            if not self._closing.is_set():
                self.tools_changed = True

    async def _on_message(self, message: Any) -> None:
        from mcp_types import ToolListChangedNotification

        if isinstance(message, ToolListChangedNotification):
            self.tools_changed = True


def _closed(error: BaseException) -> bool:
    """The SDK's own error for a connection that closed (its dispatcher fails every request
    in flight, and every later one, with it)."""
    code, message = getattr(error, "code", None), getattr(error, "message", None)
    return code == CONNECTION_CLOSED and message == "Connection closed"


def _observe(task: asyncio.Future[Any]) -> None:
    """Retrieve a finished task's error, so an abandoned request logs no warning."""
    if not task.cancelled():
        task.exception()


def _why_lost(exc: BaseException) -> str:
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    if isinstance(exc, asyncio.CancelledError):
        return "the transport to the server broke"
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
