"""HTTP tools are checked on the address they connect to, not on the text of the URL.

Every test talks to real HTTP servers on loopback; names are answered by a resolver the test
passes to `http_tools` (the tools' public seam for DNS).
"""

from __future__ import annotations

import json
import re
import socket
import ssl
import threading
from collections.abc import Iterable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
import trustme

from contextos.errors import ContainmentViolation
from contextos.policy import NetworkPolicy
from contextos.tools import http_tools
from contextos.tools.contract import ToolContext

CTX = ToolContext(run_id="run_1", call_id="call_1_0")

DENY_LOOPBACK = NetworkPolicy(allow=("*",), deny=("127.0.0.0/8", "::1", "localhost"))


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        if self.path.startswith("/redirect"):
            self.send_response(302)
            self.send_header("Location", self.path.split("to=", 1)[1])
            self.end_headers()
            return
        body = json.dumps(
            {"server": self.server.server_address[0], "host": self.headers["Host"]}
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


class _Server6(ThreadingHTTPServer):
    address_family = socket.AF_INET6


def _start(address: str, port: int = 0, tls: ssl.SSLContext | None = None) -> ThreadingHTTPServer:
    kind = _Server6 if ":" in address else ThreadingHTTPServer
    server = kind((address, port), _Handler)
    if tls is not None:
        server.socket = tls.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture
def servers() -> Iterator[dict[str, int]]:
    """A server on 127.0.0.1 and one on ::1; their ports by address."""
    made = [_start("127.0.0.1"), _start("::1")]
    yield {str(s.server_address[0]): s.server_address[1] for s in made}
    for s in made:
        s.shutdown()
        s.server_close()


def _answers(table: dict[str, list[list[str]]]) -> Any:
    """A resolver answering each name from `table`, one list of addresses per lookup."""
    asked: list[str] = []

    async def resolve(host: str) -> Iterable[str]:
        asked.append(host)
        if host not in table or not table[host]:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return table[host].pop(0)

    resolve.asked = asked  # type: ignore[attr-defined]
    return resolve


async def test_the_servers_answer_when_allowed_by_address(servers: dict[str, int]) -> None:
    v4, v6 = servers["127.0.0.1"], servers["::1"]
    get, _ = http_tools(NetworkPolicy(allow=("127.0.0.1", "::1")))
    assert (await get.fn(ctx=CTX, url=f"http://127.0.0.1:{v4}/"))["status"] == 200
    assert (await get.fn(ctx=CTX, url=f"http://[::1]:{v6}/"))["status"] == 200


@pytest.mark.parametrize(
    "spelling",
    [
        "127.1",
        "127.0.1",
        "2130706433",
        "0x7f000001",
        "017700000001",
        "0",
        "[::ffff:127.0.0.1]",
        "localhost",
    ],
)
async def test_loopback_by_any_spelling_is_refused(servers: dict[str, int], spelling: str) -> None:
    get, _ = http_tools(DENY_LOOPBACK)
    with pytest.raises(ContainmentViolation):
        await get.fn(ctx=CTX, url=f"http://{spelling}:{servers['127.0.0.1']}/")


@pytest.mark.parametrize("spelling", ["[::]", "[0:0:0:0:0:0:0:1]", "[::1]"])
async def test_ipv6_loopback_by_any_spelling_is_refused(
    servers: dict[str, int], spelling: str
) -> None:
    get, _ = http_tools(DENY_LOOPBACK)
    with pytest.raises(ContainmentViolation):
        await get.fn(ctx=CTX, url=f"http://{spelling}:{servers['::1']}/")


async def test_a_name_is_checked_on_the_addresses_it_resolves_to(
    servers: dict[str, int],
) -> None:
    port = servers["127.0.0.1"]
    # the system resolver: localhost is not on the deny list by name, its addresses are
    get, _ = http_tools(NetworkPolicy(allow=("*",), deny=("127.0.0.0/8", "::1")))
    with pytest.raises(ContainmentViolation, match=r"localhost:\d+ resolves to .* deny list"):
        await get.fn(ctx=CTX, url=f"http://localhost:{port}/")
    # a name of ours that resolves to loopback, under the internal-ranges preset of allow *
    resolver = _answers({"intranet.test": [["127.0.0.1"]]})
    get, _ = http_tools(NetworkPolicy(allow=("*",)), resolver=resolver)
    with pytest.raises(
        ContainmentViolation, match=re.escape("resolves to 127.0.0.1, which is an internal")
    ):
        await get.fn(ctx=CTX, url=f"http://intranet.test:{port}/")
    # and the cloud metadata address
    resolver = _answers({"metadata.test": [["169.254.169.254"]]})
    get, _ = http_tools(NetworkPolicy(allow=("*",)), resolver=resolver)
    with pytest.raises(
        ContainmentViolation, match=re.escape("169.254.169.254, which is an internal")
    ):
        await get.fn(ctx=CTX, url="http://metadata.test/latest/meta-data/")


async def test_every_resolved_address_must_pass(servers: dict[str, int]) -> None:
    port = servers["127.0.0.1"]
    resolver = _answers({"api.test": [["127.0.0.1", "127.0.0.9"]]})
    get, _ = http_tools(
        NetworkPolicy(allow=("api.test", "127.0.0.0/8"), deny=("127.0.0.9",)), resolver=resolver
    )
    with pytest.raises(
        ContainmentViolation, match=re.escape("127.0.0.9, which is on the network deny")
    ):
        await get.fn(ctx=CTX, url=f"http://api.test:{port}/")


async def test_the_checked_address_is_the_one_connected_to(servers: dict[str, int]) -> None:
    port = servers["127.0.0.1"]
    other = _start("127.0.0.2", port)  # same port, a denied address
    try:
        # DNS rebinding: the second answer for the same name points somewhere denied
        resolver = _answers({"rebind.test": [["127.0.0.1"], ["127.0.0.2"], ["127.0.0.2"]]})
        get, _ = http_tools(
            NetworkPolicy(allow=("rebind.test", "127.0.0.1"), deny=("127.0.0.2",)),
            resolver=resolver,
        )
        first = json.loads((await get.fn(ctx=CTX, url=f"http://rebind.test:{port}/"))["body"])
        assert first == {"server": "127.0.0.1", "host": f"rebind.test:{port}"}
        assert resolver.asked == ["rebind.test"]  # one lookup, and that answer was used
        with pytest.raises(
            ContainmentViolation, match=re.escape("127.0.0.2, which is on the network deny")
        ):
            await get.fn(ctx=CTX, url=f"http://rebind.test:{port}/")
    finally:
        other.shutdown()
        other.server_close()


async def test_every_redirect_hop_is_checked_on_its_address(servers: dict[str, int]) -> None:
    good = servers["127.0.0.1"]
    bad = _start("127.0.0.1")
    bad_port = bad.server_address[1]
    try:
        get, _ = http_tools(
            NetworkPolicy(allow=("*", f"127.0.0.1:{good}"), deny=(f"127.0.0.1:{bad_port}",))
        )
        for target in (f"http://127.1:{bad_port}/", f"http://localhost:{bad_port}/"):
            with pytest.raises(ContainmentViolation, match=str(bad_port)):
                await get.fn(ctx=CTX, url=f"http://127.0.0.1:{good}/redirect?to={target}")
        # a redirect from an allowed name to a name that resolves to a denied address
        resolver = _answers({"api.test": [["127.0.0.1"]], "cdn.test": [["127.0.0.1"]]})
        get, _ = http_tools(NetworkPolicy(allow=("*.test", f"127.0.0.1:{good}")), resolver=resolver)
        with pytest.raises(ContainmentViolation, match="internal address"):
            await get.fn(
                ctx=CTX, url=f"http://api.test:{good}/redirect?to=http://cdn.test:{bad_port}/"
            )
        assert resolver.asked == ["api.test", "cdn.test"]
    finally:
        bad.shutdown()
        bad.server_close()


async def test_a_name_that_does_not_resolve_is_refused() -> None:
    get, _ = http_tools(NetworkPolicy(allow=("*",)), resolver=_answers({}))
    with pytest.raises(ContainmentViolation, match=re.escape("nowhere.test does not resolve")):
        await get.fn(ctx=CTX, url="http://nowhere.test/")

    async def empty(host: str) -> list[str]:
        return []

    get, _ = http_tools(NetworkPolicy(allow=("*",)), resolver=empty)
    with pytest.raises(ContainmentViolation, match="resolved to no usable address"):
        await get.fn(ctx=CTX, url="http://nowhere.test/")


async def test_tls_keeps_the_name_while_connecting_to_the_checked_address() -> None:
    ca = trustme.CA()
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("pinned.test").configure_cert(server_tls)
    names: list[str | None] = []
    server_tls.sni_callback = lambda sock, name, ctx: names.append(name)  # type: ignore[assignment,misc]
    server = _start("127.0.0.1", tls=server_tls)
    port = server.server_address[1]
    client_tls = ssl.create_default_context()
    ca.configure_trust(client_tls)
    try:
        resolver = _answers({"pinned.test": [["127.0.0.1"]]})
        get, _ = http_tools(
            NetworkPolicy(allow=("pinned.test", "127.0.0.1")), resolver=resolver, verify=client_tls
        )
        answer = await get.fn(ctx=CTX, url=f"https://pinned.test:{port}/")
        assert json.loads(answer["body"])["host"] == f"pinned.test:{port}"
        assert names == ["pinned.test"]  # the certificate was checked against the name
    finally:
        server.shutdown()
        server.server_close()
