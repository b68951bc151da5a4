"""The run dashboard in a real headless Chromium (Debian's, through Playwright) against the real
server, with a real ``ito-worker`` training the tiny test recipe: a human signs in, approves the
run's confirmation by clicking, watches the run's page go from ``queued`` to ``succeeded``
without reloading it (the log tail grows, the charts are drawn from exactly the points the API
serves, a gate's numbers show), requests a cancel that then waits for approval, and meets the
same 404 page for another tenant's run as for a missing one. No key, token or secret reaches
a page, a URL or the browser's storage, and the pages fit a 375 px wide phone screen.

With ``ITO_SCREENSHOTS_DIR`` set, the run page (laptop and phone width) and the approval page
are saved there as PNGs (``scripts/screenshots`` writes the README's, under ``docs/``).
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, BrowserContext, Page, expect, sync_playwright

from tests.server.chromium_support import WebPage, launch_chromium
from tests.server.web_browser import make_approver
from tests.support import ITO, Tenant, clean_env, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.parametrize("backend_url", ["sqlite"], indirect=True)]

PACE_S = 0.3
"""Each training step lasts at least this long (the worker's test hook), so the page is seen
while the run trains, not only once it is done."""


@pytest.fixture(scope="module")
def chromium() -> Iterator[Browser]:
    with sync_playwright() as playwright:
        browser = launch_chromium(playwright)
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture
def open_tab(chromium: Browser) -> Iterator[Callable[..., WebPage]]:
    """A tab in a fresh browser profile (``width`` × 900 px), or in ``like``'s profile."""
    contexts: list[BrowserContext] = []

    def open_(url: str, like: WebPage | None = None, width: int = 1280) -> WebPage:
        context = like.page.context if like is not None else None
        if context is None:
            context = chromium.new_context(viewport={"width": width, "height": 900})
            context.set_default_timeout(30_000)
            contexts.append(context)
        page = context.new_page()
        page.set_viewport_size({"width": width, "height": 900})
        return WebPage(page, url)

    yield open_
    for context in contexts:
        context.close()


def screenshot(page: Page, name: str) -> None:
    directory = os.environ.get("ITO_SCREENSHOTS_DIR")
    if directory:
        Path(directory).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(directory) / name), full_page=True)


def secrets_of(tenant: Tenant, *more: str) -> list[str]:
    keys = [tenant.requester_key, tenant.approver_key, tenant.server.desk_key]
    return [*keys, *(k.split("_", 3)[3] for k in keys if k.count("_") >= 3), *more]


def start_worker(tenant: Tenant, home: Path) -> subprocess.Popen[bytes]:
    """``ito-worker --once`` on the tenant's booking, paced by the test hook; not waited for."""
    key = tenant.server.desk(
        "/v1/desk/keys",
        {"account_id": tenant.account_id, "role": "worker", "booking_id": tenant.booking_id},
    )["api_key"]
    env = clean_env(
        ITO_API_URL=tenant.server.url,
        ITO_API_KEY=str(key),
        ITO_HOME=str(home),
        ITO_FAULT_INJECTION=json.dumps({"min_step_seconds": PACE_S}),
    )
    home.mkdir(parents=True, exist_ok=True)
    log = (home / "worker.log").open("wb")
    try:
        return subprocess.Popen(
            [str(Path(ITO).with_name("ito-worker")), "--booking", tenant.booking_id, "--once"],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    finally:
        log.close()


def fits_width(page: Page) -> bool:
    return bool(page.evaluate("document.documentElement.scrollWidth <= window.innerWidth"))


def storage_is_empty(page: Page) -> bool:
    return bool(
        page.evaluate("window.localStorage.length === 0 && window.sessionStorage.length === 0")
    )


def test_a_run_is_watched_to_success_on_its_page_without_a_reload(
    tenant: Tenant, tmp_path: Path, open_tab: Callable[..., WebPage]
) -> None:
    approver = make_approver(tenant.server, tenant.account_id)
    web = open_tab(tenant.server.url)
    requested_urls: list[str] = []
    web.page.on("request", lambda request: requested_urls.append(request.url))
    assert web.sign_in(approver.email, approver.password).status == 200

    # The run's confirmation, approved by clicking on its approval page.
    manifest = tenant.manifest("watched")
    confirm = tenant.ito(
        "confirm", "--action", "train", "--booking", tenant.booking_id, "--manifest", str(manifest)
    )
    assert confirm.rc == 0, confirm.stderr
    ref = str(confirm.data["confirmation_ref"])
    web.goto(f"/ui/confirmations/{ref}")
    expect(web.button("approve")).to_be_visible()
    screenshot(web.page, "approval-page.png")
    web.submit(web.button("approve"))
    assert tenant.api("GET", f"/v1/confirmations/{ref}")["data"]["state"] == "approved"
    created = tenant.ito(
        "train",
        "--booking",
        tenant.booking_id,
        "--manifest",
        str(manifest),
        "--confirmation-ref",
        ref,
        "--idempotency-key",
        "watched",
    )
    assert created.rc == 0, created.stdout
    run_id = str(created.data["run_id"])

    # The runs list links to it; its page shows it queued.
    web.goto("/ui/runs")
    web.submit(web.page.locator(f"a[href='/ui/runs/{run_id}']"))
    assert web.path() == f"/ui/runs/{run_id}"
    state = web.page.locator("#run-state")
    expect(state).to_have_text("queued")
    web.page.evaluate("window.__sameDocument = true")  # gone if the page were reloaded

    worker = start_worker(tenant, tmp_path / "worker")
    try:
        expect(state).to_have_text("running", timeout=120_000)

        def log_cursor() -> int | None:
            value = web.page.locator("#log").get_attribute("data-last-cursor", timeout=1_000)
            return int(value) if value else None

        first = wait_until(lambda: web.page.locator("#log").count() and log_cursor(), 120)
        wait_until(lambda: (log_cursor() or 0) > first, 120)  # the tail grows by itself
        expect(state).to_have_text("succeeded", timeout=600_000)
        assert worker.wait(timeout=120) == 0
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait(timeout=30)
    assert web.page.evaluate("window.__sameDocument === true"), "the page was reloaded"
    assert web.page.locator("[data-terminal='true']").count() == 1

    # The loss chart: exactly the loss points the API serves, every one drawn.
    points = tenant.api("GET", f"/v1/runs/{run_id}/metrics", params={"name": "loss"})["data"]
    served = [p for p in points["points"] if p["value"] is not None]
    assert served
    # The page polls every 2 s; after the final state, its next fragment holds every point.
    wait_until(
        lambda: web.page.locator("#chart-loss").get_attribute("data-points") == str(len(served)),
        30,
    )
    drawn = web.page.evaluate(
        "Array.from(document.querySelectorAll('#chart-loss polyline'))"
        ".reduce((n, l) => n + l.points.numberOfItems, 0)"
    )
    assert drawn == len(served)

    # A gate's numbers, as the API reports them.
    gates = tenant.api("GET", f"/v1/runs/{run_id}/gates")["data"]["gates"]
    assert gates and all(g["passed"] for g in gates)
    first_gate = web.page.locator("#timeline tr.gate").first
    expect(first_gate).to_be_visible()
    expect(first_gate.locator(".gate-value")).to_have_text(f"{gates[0]['value']:.4g}")
    expect(first_gate.locator(".gate-threshold")).to_have_text(f"{gates[0]['threshold']:.4g}")
    expect(web.page.locator("#timeline tr[data-status='completed']").first).to_be_visible()
    expect(web.page.locator("#checkpoints")).to_be_visible()
    screenshot(web.page, "run-page.png")

    # Nothing secret in any page, URL or storage; the session cookie is not readable.
    web.served.append(web.page.content())
    cookie = next(c for c in web.page.context.cookies() if c["name"] == "ito_session")
    secrets = secrets_of(tenant, approver.password, cookie["value"])
    for text in [*web.served, *requested_urls]:
        assert not any(secret in text for secret in secrets), "a secret reached the browser"
    assert storage_is_empty(web.page)
    assert web.page.evaluate("document.cookie") == ""

    # At phone width, the run page, the runs list and the bookings page do not scroll sideways.
    phone = open_tab(tenant.server.url, like=web, width=375)
    for path in (f"/ui/runs/{run_id}", "/ui/runs", "/ui/bookings", f"/ui/confirmations/{ref}"):
        assert phone.goto(path).status == 200
        assert fits_width(phone.page), path
        assert storage_is_empty(phone.page)
        if path == f"/ui/runs/{run_id}":
            screenshot(phone.page, "run-page-phone.png")


def test_a_cancel_requested_on_the_page_waits_for_approval(
    tenant: Tenant, open_tab: Callable[..., WebPage]
) -> None:
    approver = make_approver(tenant.server, tenant.account_id)
    run_id = tenant.train(tenant.manifest("to-cancel"), "to-cancel")
    web = open_tab(tenant.server.url)
    assert web.sign_in(approver.email, approver.password).status == 200
    web.goto(f"/ui/runs/{run_id}")
    expect(web.page.locator("#run-state")).to_have_text("queued")

    web.submit(web.page.locator("main form[action$='/requests'] button[value=cancel]"))
    assert web.path().startswith(f"/ui/runs/{run_id}?requested=cfr_")
    expect(web.page.locator("#requested")).to_be_visible()
    row = web.page.locator("#confirmations tr[data-state='pending']")
    expect(row).to_have_count(1)
    ref = row.get_attribute("data-ref")
    assert ref
    shown = tenant.api("GET", f"/v1/confirmations/{ref}", key="approver")["data"]
    assert (shown["action"], shown["state"]) == ("run.cancel", "pending")
    # Waiting: the run goes on, and the page keeps saying so after its next refreshes.
    assert tenant.api("GET", f"/v1/runs/{run_id}")["data"]["state"] == "queued"
    expect(web.page.locator("#live-status")).to_contain_text("updated", timeout=10_000)
    expect(row).to_contain_text("waiting for approval")
    expect(web.page.locator("#run-state")).to_have_text("queued")

    # Its link opens the approval page, where the one who asked cannot approve it.
    web.submit(row.locator(f"a[href='/ui/confirmations/{ref}']"))
    refused = web.submit(web.button("approve"))
    assert refused.status == 403
    assert tenant.api("GET", f"/v1/confirmations/{ref}")["data"]["state"] == "pending"


def test_another_tenants_run_shows_the_same_404_page_as_a_missing_one(
    tenant: Tenant, other_tenant: Tenant, open_tab: Callable[..., WebPage]
) -> None:
    approver = make_approver(tenant.server, tenant.account_id)
    theirs = other_tenant.train(other_tenant.manifest("theirs"), "theirs")
    missing = theirs[:-1] + ("a" if theirs[-1] != "a" else "b")
    web = open_tab(tenant.server.url)
    assert web.sign_in(approver.email, approver.password).status == 200
    their_page = web.goto(f"/ui/runs/{theirs}")
    their_html = web.page.locator("main").inner_html()
    missing_page = web.goto(f"/ui/runs/{missing}")
    assert their_page.status == missing_page.status == 404
    assert their_html == web.page.locator("main").inner_html()
    assert theirs not in their_html
