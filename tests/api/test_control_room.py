"""The control room in a real browser (Playwright driving Chromium) against a real server.

A person signs in with a token, approves a pending payment and watches the run complete live;
denies one with a reason; an approver the policy does not name sees the refusal; and a tenant
never sees another tenant's runs. The screenshots in docs/control-room.md come from here.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from api_agents import PAYMENTS_ENV, POLICY
from api_server import GREETER, PAYER, serving, token_for

from contextos.api import ApiConfig

SHOTS_ENV = "CONTEXTOS_SCREENSHOTS"
"""A folder for the screenshots (`docs/images` renews the docs'); else the test's own."""
CHROMIUM = os.environ.get("CONTEXTOS_TEST_CHROMIUM", "/usr/bin/chromium")

playwright_sync = pytest.importorskip("playwright.sync_api") if not os.environ.get("CI") else None
if playwright_sync is None:
    import playwright.sync_api as playwright_sync

expect = playwright_sync.expect


@pytest.fixture(scope="module")
def chromium() -> Iterator[Any]:
    if shutil.which(CHROMIUM) is None:
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the browser tests: no Chromium at {CHROMIUM}")
        pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install chromium)")
    with playwright_sync.sync_playwright() as p:
        launched = p.chromium.launch(executable_path=CHROMIUM)
        yield launched
        launched.close()


@pytest.fixture
def browser(chromium: Any) -> Iterator[Any]:
    """A fresh browser context per test, closed (with its live streams) before the server."""
    context = chromium.new_context()
    yield context
    context.close()


@pytest.fixture
def server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, str]]:
    """(base URL, store URL) of a server with a worker, under the payments policy."""
    monkeypatch.setenv(PAYMENTS_ENV, str(tmp_path / "payments.log"))
    (tmp_path / "payments.log").touch()
    (tmp_path / "policy.toml").write_text(POLICY)
    url = f"sqlite:///{tmp_path}/runs.db"
    config = ApiConfig(
        store=url, agents=(PAYER, GREETER), worker=True, policy=str(tmp_path / "policy.toml")
    )
    with serving(config) as base:
        yield base, url


def token(url: str, tenant: str, user: str, *roles: str) -> str:
    """A token issued on the store (in a thread: Playwright's loop holds this one)."""
    issue = token_for(url, tenant=tenant, user=user, roles=roles)
    with ThreadPoolExecutor(1) as pool:
        headers = pool.submit(asyncio.run, issue).result()
    return headers["Authorization"].removeprefix("Bearer ")


def start(base: str, secret: str, agent: str) -> dict[str, Any]:
    """A run started over the API as the token's user, once it ends or waits for a person."""
    response = httpx.post(
        f"{base}/v1/runs",
        params={"wait": "true", "timeout": "60"},
        json={"agent": agent, "input": "go"},
        headers={"Authorization": f"Bearer {secret}"},
        timeout=60,
    )
    assert response.status_code == 201, response.text
    run: dict[str, Any] = response.json()
    return run


def sign_in(browser: Any, base: str, secret: str, *, width: int = 1100) -> Any:
    page = browser.new_page()
    page.set_viewport_size({"width": width, "height": 900})
    page.goto(base + "/")
    page.get_by_label("API token").fill(secret)
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("heading", name="Runs")).to_be_visible()
    return page


def test_approve_in_the_page_and_watch_the_run_complete(
    browser: Any, server: tuple[str, str], tmp_path: Path
) -> None:
    base, url = server
    shots = Path(os.environ.get(SHOTS_ENV) or tmp_path)
    run = start(base, token(url, "acme", "bob"), "payer")
    assert run["status"] == "input_required"
    page = sign_in(browser, base, token(url, "acme", "alice", "finance"))
    expect(page.locator("#who")).to_have_text("alice @ acme (finance)")
    expect(page.locator("#run-rows")).to_contain_text(run["run_id"])
    page.screenshot(path=str(shots / "control-room-runs.png"))

    page.get_by_role("link", name="Inbox").click()
    card = page.locator("#interrupts li")
    expect(card).to_contain_text("Pay 900.0 EUR to acme")
    expect(card).to_contain_text("finance")
    page.screenshot(path=str(shots / "control-room-inbox.png"))

    card.get_by_role("link", name=run["run_id"]).click()
    expect(page.locator("#run-status")).to_have_text("input_required")
    expect(page.locator("#timeline li[data-type=interrupt_raised]")).to_have_count(1)
    page.locator("#run-interrupts").get_by_role("button", name="Approve").click()
    # Live: the stream brings the approval, the payment and the end without a reload.
    expect(page.locator("#timeline li[data-type=approval_granted]")).to_contain_text("alice")
    expect(page.locator("#timeline li[data-type=run_completed]")).to_have_count(1)
    expect(page.locator("#run-status")).to_have_text("completed")
    page.screenshot(path=str(shots / "control-room-run.png"), full_page=True)
    assert Path(os.environ[PAYMENTS_ENV]).read_text() == f"{run['run_id']} acme 900.0\n"


def test_deny_with_a_reason(browser: Any, server: tuple[str, str]) -> None:
    base, url = server
    run = start(base, token(url, "acme", "bob"), "payer")
    page = sign_in(browser, base, token(url, "acme", "alice", "finance"), width=390)
    page.get_by_role("link", name="Inbox").click()
    card = page.locator("#interrupts li")
    card.get_by_label("Reason (for a denial)").fill("not this supplier")
    card.get_by_role("button", name="Deny").click()
    expect(page.get_by_role("alert")).to_have_text("Denied.")
    page.goto(f"{base}/#/runs/{run['run_id']}")
    expect(page.locator("#timeline li[data-type=approval_denied]")).to_contain_text(
        "not this supplier"
    )
    expect(page.locator("#run-status")).to_have_text("completed")
    assert Path(os.environ[PAYMENTS_ENV]).read_text() == ""  # nothing was paid


def test_an_approver_without_the_role_sees_the_refusal(
    browser: Any, server: tuple[str, str]
) -> None:
    base, url = server
    run = start(base, token(url, "acme", "bob"), "payer")
    # dave's token carries finance, but the policy does not give dave that role in acme.
    page = sign_in(browser, base, token(url, "acme", "dave", "finance"))
    page.get_by_role("link", name="Inbox").click()
    page.locator("#interrupts li").get_by_role("button", name="Approve").click()
    expect(page.get_by_role("alert")).to_contain_text("dave does not hold finance")
    page.goto(f"{base}/#/runs/{run['run_id']}")
    expect(page.locator("#run-status")).to_have_text("input_required")


def test_a_tenant_never_sees_another_tenants_run(browser: Any, server: tuple[str, str]) -> None:
    base, url = server
    theirs = start(base, token(url, "globex", "carol"), "greeter")
    ours = start(base, token(url, "acme", "bob"), "greeter")
    page = sign_in(browser, base, token(url, "acme", "alice", "finance"))
    expect(page.locator("#run-rows")).to_contain_text(ours["run_id"])
    expect(page.locator("#run-rows")).not_to_contain_text(theirs["run_id"])
    page.goto(f"{base}/#/runs/{theirs['run_id']}")
    expect(page.get_by_role("alert")).to_contain_text(f"no run with id '{theirs['run_id']}'")
    expect(page.locator("#timeline li")).to_have_count(0)


def test_a_wrong_token_is_refused_at_sign_in(browser: Any, server: tuple[str, str]) -> None:
    base, _ = server
    page = browser.new_page()
    page.goto(base + "/")
    page.get_by_label("API token").fill("ctx_0000000000000000_" + "A" * 43)
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("alert")).to_contain_text("not one this server issued")
    expect(page.get_by_label("API token")).to_be_visible()


def test_the_interactive_schema_renders_with_no_network_but_the_server(
    browser: Any, server: tuple[str, str]
) -> None:
    base, _ = server
    elsewhere: list[str] = []

    def only_the_server(route: Any) -> None:
        if route.request.url.startswith(base):
            route.continue_()
        else:  # a CDN, or anything not this server: as on a machine offline
            elsewhere.append(route.request.url)
            route.abort()

    page = browser.new_page()
    page.route("**/*", only_the_server)
    page.goto(base + "/v1/docs")
    expect(page.locator(".opblock-summary-path").first).to_be_visible()
    paths = page.locator(".opblock-summary-path").all_inner_texts()
    assert any("/v1/runs/{run_id}/events" in p for p in paths), paths
    assert elsewhere == []
