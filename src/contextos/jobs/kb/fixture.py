"""A loopback web site for the sample knowledge base's external links, so a scan needs no network.

The sample links to `http://kb-fixture.test/...`; the fixture serves that site on 127.0.0.1 at
a free port, and gives the verifier what it needs to reach it and nothing else: an alias from
the placeholder origin to its port, a resolver that answers the placeholder name, and a
network policy that allows exactly that name and that loopback port.
"""

from __future__ import annotations

import socket
import threading
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

from contextos import NetworkPolicy

HOST = "kb-fixture.test"
"""The placeholder host name the sample's external links use."""
ORIGIN = f"http://{HOST}"
FLAKY = "/releases"
"""The page that answers 503 the first time it is asked."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Route:
    """What the site answers for one path."""

    status: int
    """The HTTP status."""
    title: str = ""
    """The page's title and first heading."""
    text: str = ""
    """Its one paragraph."""
    location: str | None = None
    """Where a redirect points (a path on the same site)."""


def _page(title: str, text: str) -> Route:
    return Route(status=200, title=title, text=text)


SITE: dict[str, Route] = {
    "/": _page("Orrery", "Metrics you can keep. Hosted time series with a query language."),
    "/status": _page("Orrery status", "All systems operational. Ingest, query and alerting."),
    "/pricing": _page("Pricing", "Plans by active series and retention tier."),
    "/docs/api": _page("HTTP API", "Write points, run queries, manage tokens."),
    "/docs/sdk/python": _page("Python SDK", "pip install orrery-client; write and query."),
    "/docs/sdk/go": _page("Go SDK", "go get orrery.dev/client; write and query."),
    "/docs/query-language": _page("OQL", "Selectors, range functions, aggregations."),
    "/blog/retention-tiers": _page("Retention tiers", "Hot, warm and cold storage explained."),
    "/security": _page("Security", "SOC 2 report, encryption at rest and in transit."),
    "/support": _page("Support", "Open a ticket or call the on-call line for P1 issues."),
    "/old/pricing": Route(status=301, location="/pricing"),
    "/docs/v1/ingest": Route(status=404, title="Missing", text="There is nothing here."),
    "/community/forum": Route(status=404, title="Missing", text="There is nothing here."),
    "/downloads/agent-1.2.tar.gz": Route(status=410, title="Gone", text="Removed."),
    "/docs/legacy-setup": Route(status=302, location="/docs/setup-v0"),
    "/help/retention-faq": _page(
        "Page not found", "Sorry, we could not find the page you were looking for."
    ),
    "/docs/upgrade-guide": Route(status=301, location="/"),
    "/account/audit-log": Route(status=401, title="Sign in", text="Sign in to see this page."),
    "/releases": _page("Releases", "Release notes and upgrade guides."),
}
"""The site: alive pages, an alive redirect, 404s, a 410, a redirect to a 404, a page behind a
login, and two soft 404s: a page that answers 200 but says it is missing, and a guide that
redirects to the home page. `/releases` fails once with 503 before it answers
(a verifier must try again), and `/slow` answers only after the fixture's `delay_s`."""


class Fixture:
    """The site on 127.0.0.1, for the length of a `with` block."""

    def __init__(self, *, delay_s: float = 5.0) -> None:
        self.delay_s = delay_s
        self.hits: Counter[str] = Counter()
        """Requests received, by method and path (`GET /status`)."""
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None

    def __enter__(self) -> Fixture:
        self._server = _Server(("127.0.0.1", 0), _handler(self))
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("the fixture is not running: use it in a `with` block")
        return int(self._server.server_address[1])

    @property
    def origin(self) -> str:
        """Where the site really is: the placeholder name, at the fixture's port."""
        return f"{ORIGIN}:{self.port}"

    @property
    def aliases(self) -> dict[str, str]:
        """The sample's origin mapped to the fixture's."""
        return dict(reach(self.port)["aliases"])

    @property
    def network(self) -> NetworkPolicy:
        """The placeholder name, and loopback only at the fixture's port."""
        policy: NetworkPolicy = reach(self.port)["network"]
        return policy

    async def resolver(self, host: str) -> Iterable[str]:
        """Answers the placeholder name with 127.0.0.1; every other name does not resolve."""
        return await resolve(host)

    def hit(self, method: str, path: str) -> int:
        with self._lock:
            self.hits[f"{method} {path}"] += 1
            return self.hits[f"{method} {path}"]


async def resolve(host: str) -> Iterable[str]:
    """The placeholder name is 127.0.0.1; no other name resolves."""
    if host.lower().rstrip(".") == HOST:
        return ["127.0.0.1"]
    raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")


def reach(port: int) -> dict[str, Any]:
    """What a verifier needs to reach a fixture serving at `port` (in this process or
    another) and nothing else: `LinkVerifier(root, **reach(port))`."""
    return {
        "network": NetworkPolicy(allow=(HOST, f"127.0.0.1:{port}")),
        "resolver": resolve,
        "aliases": {ORIGIN: f"{ORIGIN}:{port}"},
    }


class _Server(ThreadingHTTPServer):
    # the default backlog of 5 drops connections a verifier opens in parallel, and a dropped
    # SYN is retried only after a second
    request_queue_size = 128

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that gave up on /slow closed its end: nothing to report


def _handler(fixture: Fixture) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self._answer(body=True)

        def do_HEAD(self) -> None:
            self._answer(body=False)

        def _answer(self, *, body: bool) -> None:
            path = self.path.split("?", 1)[0]
            count = fixture.hit(self.command, path)
            if path == "/slow":
                time.sleep(fixture.delay_s)
                route = _page("Slow", "Eventually.")
            elif path == FLAKY and count == 1:
                route = Route(status=503, title="Unavailable", text="Try again.")
            else:
                route = SITE.get(path, Route(status=404, title="Missing", text="Nothing here."))
            html = (
                f"<!doctype html><html><head><title>{route.title}</title></head>"
                f"<body><h1>{route.title}</h1><p>{route.text}</p></body></html>"
            ).encode()
            self.send_response(route.status)
            if route.location is not None:
                self.send_header("Location", route.location)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(html)))
            self.end_headers()
            if body:
                self.wfile.write(html)

        def log_message(self, *args: Any) -> None:
            pass

    return Handler
