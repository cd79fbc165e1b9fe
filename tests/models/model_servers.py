"""Scripted HTTP servers on loopback, for the adapters' failure cases and wire formats."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(kw_only=True)
class Reply:
    """One scripted HTTP answer."""

    status: int = 200
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0
    sse: list[tuple[str, Any]] | None = None
    """Server-sent events (event name or "", JSON data or a raw string) instead of a body."""
    drip_s: float = 0.0
    """Pause before each server-sent event (a slow-drip stream)."""
    raw: bytes | None = None
    """The exact body bytes, instead of `body` as JSON."""


@dataclass(kw_only=True)
class Seen:
    """One request the server received."""

    path: str
    headers: dict[str, str]
    body: Any


Handler = Callable[[Seen], Reply]


class LoopbackServer:
    """A real HTTP server on 127.0.0.1 that answers POSTs from a script of replies."""

    def __init__(self, replies: list[Reply] | Handler) -> None:
        self.replies = replies
        self.seen: list[Seen] = []
        outer = self

        class _Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(length)
                seen = Seen(
                    path=self.path,
                    headers={k.lower(): v for k, v in self.headers.items()},
                    body=json.loads(raw) if raw else None,
                )
                outer.seen.append(seen)
                reply = outer.next_reply(seen)
                if reply.delay_s:
                    time.sleep(reply.delay_s)
                try:
                    if reply.sse is not None:
                        self.send_sse(reply)
                    else:
                        self.send_json(reply)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (a timeout test)

            def send_json(self, reply: Reply) -> None:
                payload = json.dumps(reply.body).encode() if reply.body is not None else b""
                if reply.raw is not None:
                    payload = reply.raw
                self.send_response(reply.status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(payload)))
                for k, v in reply.headers.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(payload)

            def send_sse(self, reply: Reply) -> None:
                self.send_response(reply.status)
                self.send_header("content-type", "text/event-stream")
                self.send_header("connection", "close")
                for k, v in reply.headers.items():
                    self.send_header(k, v)
                self.end_headers()
                for event, data in reply.sse or []:
                    time.sleep(reply.drip_s)
                    text = data if isinstance(data, str) else json.dumps(data)
                    frame = (f"event: {event}\n" if event else "") + f"data: {text}\n\n"
                    self.wfile.write(frame.encode())
                    self.wfile.flush()
                self.close_connection = True

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host!s}:{port}"

    def next_reply(self, seen: Seen) -> Reply:
        if callable(self.replies):
            return self.replies(seen)
        if not self.replies:
            return Reply(status=500, body={"error": {"message": "the script ran out"}})
        return self.replies.pop(0)

    def __enter__(self) -> LoopbackServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
