"""The link verifier against a real loopback site, under network containment: each verdict,
retries after failures, and a link to a denied address refused without being fetched."""

from __future__ import annotations

import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from kbsample import SAMPLE, verifier_for

from contextos import NetworkPolicy
from contextos.jobs.kb import Fixture, LinkStatus, LinkVerifier, Reason
from contextos.jobs.kb.fixture import FLAKY, ORIGIN, SITE


@pytest.mark.parametrize(
    ("path", "status", "reason", "http_status"),
    [
        ("/status", LinkStatus.ALIVE, Reason.OK, 200),
        ("/old/pricing", LinkStatus.ALIVE, Reason.OK, 200),
        ("/community/forum", LinkStatus.DEAD, Reason.NOT_FOUND, 404),
        ("/downloads/agent-1.2.tar.gz", LinkStatus.DEAD, Reason.NOT_FOUND, 410),
        ("/docs/legacy-setup", LinkStatus.DEAD, Reason.REDIRECT_TO_MISSING, 404),
        ("/help/retention-faq", LinkStatus.ALIVE, Reason.OK, 200),  # HTTP alone decides
        ("/docs/upgrade-guide", LinkStatus.ALIVE, Reason.OK, 200),
        ("/account/audit-log", LinkStatus.UNSURE, Reason.NEEDS_AUTH, 401),
    ],
)
async def test_verdicts_from_the_site(
    site: Fixture, path: str, status: LinkStatus, reason: Reason, http_status: int
) -> None:
    verdict = await verifier_for(SAMPLE, site).verify_url(ORIGIN + path)
    assert (verdict.status, verdict.reason, verdict.http_status) == (status, reason, http_status)
    assert verdict.attempts == 1


async def test_a_redirect_is_reported_where_it_ends(site: Fixture) -> None:
    moved = await verifier_for(SAMPLE, site).verify_url(f"{ORIGIN}/docs/legacy-setup")
    assert moved.final_url == f"{ORIGIN}/docs/setup-v0"  # in the link's own terms, not the port
    assert "redirected to http://kb-fixture.test/docs/setup-v0, which answered 404" in moved.detail
    assert site.hits["GET /docs/legacy-setup"] == site.hits["GET /docs/setup-v0"] == 1


async def test_a_page_that_says_not_found_is_alive_with_a_doubt(site: Fixture) -> None:
    verdict = await verifier_for(SAMPLE, site).verify_url(f"{ORIGIN}/help/retention-faq")
    assert verdict.status is LinkStatus.ALIVE
    assert verdict.doubt == "the page says 'Page not found'"
    assert verdict.excerpt is not None and verdict.excerpt.startswith("title: Page not found\n")
    assert "could not find the page you were looking for" in verdict.excerpt


async def test_a_redirect_to_the_home_page_is_alive_with_a_doubt(site: Fixture) -> None:
    verdict = await verifier_for(SAMPLE, site).verify_url(f"{ORIGIN}/docs/upgrade-guide")
    assert (verdict.status, verdict.final_url) == (LinkStatus.ALIVE, f"{ORIGIN}/")
    assert verdict.doubt == f"redirected to the site's home page, {ORIGIN}/"


async def test_ordinary_pages_raise_no_doubt(site: Fixture) -> None:
    """The pre-filter picks the few pages worth asking a model about, not every alive one."""
    soft = {"/help/retention-faq", "/docs/upgrade-guide"}
    verifier = verifier_for(SAMPLE, site, backoff_s=0.01)
    for path in SITE:
        verdict = await verifier.verify_url(ORIGIN + path)
        if verdict.status is LinkStatus.ALIVE and path not in soft:
            assert (path, verdict.doubt, verdict.excerpt) == (path, None, None)
    home = await verifier.verify_url(f"{ORIGIN}/")  # the home page itself is not doubted
    assert (home.status, home.doubt) == (LinkStatus.ALIVE, None)


async def test_a_server_error_is_tried_again(site: Fixture) -> None:
    verdict = await verifier_for(SAMPLE, site, backoff_s=0.01).verify_url(ORIGIN + FLAKY)
    assert (verdict.status, verdict.attempts) == (LinkStatus.ALIVE, 2)
    assert site.hits[f"GET {FLAKY}"] == 2


async def test_a_timeout_is_tried_again_then_unsure(site: Fixture) -> None:
    verifier = verifier_for(SAMPLE, site, timeout_s=0.3, backoff_s=0.01)
    verdict = await verifier.verify_url(f"{ORIGIN}/slow")
    assert (verdict.status, verdict.reason, verdict.attempts) == (
        LinkStatus.UNSURE,
        Reason.TIMEOUT,
        2,
    )
    assert site.hits["GET /slow"] == 2


async def test_a_refused_connection_is_tried_again_then_dead(site: Fixture) -> None:
    closed = free_port()
    verifier = LinkVerifier(
        SAMPLE,
        network=NetworkPolicy(allow=(f"127.0.0.1:{closed}",)),
        attempts=3,
        backoff_s=0.01,
    )
    verdict = await verifier.verify_url(f"http://127.0.0.1:{closed}/docs")
    assert (verdict.status, verdict.reason, verdict.attempts) == (
        LinkStatus.DEAD,
        Reason.CONNECTION_FAILED,
        3,
    )


async def test_a_name_that_does_not_resolve_is_dead(site: Fixture) -> None:
    verifier = LinkVerifier(
        SAMPLE, network=NetworkPolicy(allow=("gone.test",)), resolver=site.resolver
    )
    verdict = await verifier.verify_url("http://gone.test/page")
    assert (verdict.status, verdict.reason) == (LinkStatus.DEAD, Reason.UNRESOLVABLE)


async def test_a_denied_address_is_refused_not_fetched(site: Fixture) -> None:
    """The name is allowed, but it resolves to loopback at a port the policy does not name:
    the containment checks the address it would connect to, and nothing is sent."""
    with _server() as (other, seen):
        verifier = LinkVerifier(
            SAMPLE,
            network=NetworkPolicy(allow=("kb-fixture.test", f"127.0.0.1:{site.port}")),
            resolver=site.resolver,
        )
        verdict = await verifier.verify_url(f"http://kb-fixture.test:{other}/secret")
    assert (verdict.status, verdict.reason) == (LinkStatus.UNSURE, Reason.REFUSED)
    assert "internal address" in verdict.detail
    assert seen == []


async def test_a_redirect_to_a_denied_address_is_not_followed(site: Fixture) -> None:
    with _server(redirect_to=f"http://127.0.0.1:{site.port}/status") as (other, seen):
        verifier = LinkVerifier(SAMPLE, network=NetworkPolicy(allow=(f"127.0.0.1:{other}",)))
        verdict = await verifier.verify_url(f"http://127.0.0.1:{other}/moved")
    assert (verdict.status, verdict.reason) == (LinkStatus.UNSURE, Reason.REFUSED)
    assert seen == ["/moved"]
    assert site.hits["GET /status"] == 0


async def test_without_a_network_policy_nothing_is_fetched(site: Fixture) -> None:
    verdict = await LinkVerifier(SAMPLE, resolver=site.resolver).verify_url(f"{ORIGIN}/status")
    assert (verdict.status, verdict.reason) == (LinkStatus.UNSURE, Reason.REFUSED)
    assert sum(site.hits.values()) == 0


@pytest.mark.parametrize(
    ("target", "status", "reason"),
    [
        ("oql.md#range-vectors", LinkStatus.ALIVE, Reason.OK),
        ("oql.md#Range-Vectors", LinkStatus.ALIVE, Reason.OK),
        ("oql.md#range-selectors", LinkStatus.DEAD, Reason.NO_SUCH_ANCHOR),
        ("../api/tokens.md#token-scopes", LinkStatus.ALIVE, Reason.OK),  # an HTML anchor
        ("#tier", LinkStatus.ALIVE, Reason.OK),
        ("#tiers", LinkStatus.DEAD, Reason.NO_SUCH_ANCHOR),
        ("oql", LinkStatus.DEAD, Reason.NO_SUCH_FILE),
        ("../../decisions/", LinkStatus.ALIVE, Reason.OK),
        ("/docs/img/architecture.svg", LinkStatus.ALIVE, Reason.OK),
        ("../../../README.md", LinkStatus.DEAD, Reason.OUTSIDE),
    ],
)
def test_internal_links_are_resolved_again_from_the_files(
    target: str, status: LinkStatus, reason: Reason
) -> None:
    verdict = LinkVerifier(SAMPLE).verify_internal("docs/query/functions.md", target)
    assert (verdict.status, verdict.reason) == (status, reason)


def test_a_symlink_out_of_the_knowledge_base_is_not_followed(tmp_path: Path) -> None:
    root = tmp_path / "kb"
    (root / "docs").mkdir(parents=True)
    (tmp_path / "secret.md").write_text("# Secret\n")
    (root / "docs" / "leak.md").symlink_to(tmp_path / "secret.md")
    verdict = LinkVerifier(root).verify_internal("docs/index.md", "leak.md#secret")
    assert verdict.status is LinkStatus.DEAD
    assert "symlink" in verdict.detail


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _server:
    """Another loopback server, recording the paths it is asked for."""

    def __init__(self, redirect_to: str | None = None) -> None:
        self.seen: list[str] = []
        seen, target = self.seen, redirect_to

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                seen.append(self.path)
                self.send_response(302 if target else 200)
                if target:
                    self.send_header("Location", target)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)

    def __enter__(self) -> tuple[int, list[str]]:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return int(self.server.server_address[1]), self.seen

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.parametrize("url", ["http://[::1/", "http://xn--/page"])
async def test_a_url_that_does_not_parse_is_dead(url: str) -> None:
    verifier = LinkVerifier(SAMPLE, network=NetworkPolicy(allow=("*",)))
    verdict = await verifier.verify_url(url)
    assert (verdict.status, verdict.reason) == (LinkStatus.DEAD, Reason.MALFORMED)


async def test_verify_takes_a_link_as_written_in_its_page(site: Fixture) -> None:
    verifier = verifier_for(SAMPLE, site)
    external = await verifier.verify("docs/faq.md", "HTTP://KB-Fixture.test/community/forum#x")
    assert (external.target, external.status) == (
        "HTTP://KB-Fixture.test/community/forum#x",
        LinkStatus.DEAD,
    )
    internal = await verifier.verify("docs/faq.md", "query/oql.md#range-vectors")
    assert internal.status is LinkStatus.ALIVE
