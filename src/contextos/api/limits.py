"""Request bodies past the server's limit are refused (413) before they are read whole.

A Content-Length over the limit is refused before a byte of the body is read; a body sent
without one (chunked) is read only until it passes the limit. Below the limit the body is
handed on as it came.
"""

from __future__ import annotations

from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from contextos.api.errors import error_body


class BodyLimit:
    """ASGI middleware: at most `max_bytes` of request body."""

    def __init__(self, app: ASGIApp, *, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = Headers(scope=scope).get("content-length", "")
        if declared.isascii() and declared.isdigit() and int(declared) > self.max_bytes:
            await self._refuse(scope, receive, send)
            return
        body = bytearray()
        more = True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away
            body += message.get("body", b"")
            if len(body) > self.max_bytes:
                await self._refuse(scope, receive, send)
                return
            more = message.get("more_body", False)
        whole: Message | None = {"type": "http.request", "body": bytes(body), "more_body": False}

        async def replay() -> Message:
            nonlocal whole
            if whole is None:
                return await receive()  # after the body: the disconnect, when it comes
            message, whole = whole, None
            return message

        await self.app(scope, replay, send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = JSONResponse(
            error_body(
                "body_too_large",
                f"the request body is larger than this server accepts ({self.max_bytes} bytes)",
                "Send less, or a reference to large data instead of the data; the server's "
                "limit is `contextos serve --max-body-bytes`.",
                max_body_bytes=self.max_bytes,
            ),
            status_code=413,
        )
        await response(scope, receive, send)


__all__ = ["BodyLimit"]
