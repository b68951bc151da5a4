"""The web pages in a real headless Chromium (Debian's, driven through Playwright) against the
real server on SQLite and PostgreSQL: the browser keeps the cookies, sends the CSRF field and
follows the redirects itself, and every decision is made by clicking the page's own button.

Device login runs the real ``ito login --no-browser`` process and reads the code it prints;
confirmation approval is checked through the API and the gates of ``ito train``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from playwright.sync_api import Browser, BrowserContext, expect, sync_playwright

from ito.core.human_format import usd
from tests.server.chromium_support import (
    WebPage,
    client_env,
    ito_login,
    launch_chromium,
)
from tests.server.web_browser import make_approver
from tests.support import ITO, Tenant, run_cli

# The browser's behaviour does not depend on the store (the httpx page tests run on both).
pytestmark = [pytest.mark.slow, pytest.mark.parametrize("backend_url", ["sqlite"], indirect=True)]


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
    """Opens a tab on a server: in a fresh browser profile (no cookies), or in ``like``'s."""
    contexts: list[BrowserContext] = []

    def open_(url: str, like: WebPage | None = None) -> WebPage:
        if like is None:
            context = chromium.new_context()
            context.set_default_timeout(30_000)
            contexts.append(context)
        else:
            context = like.page.context
        return WebPage(context.new_page(), url)

    yield open_
    for context in contexts:
        context.close()


def secrets_of(tenant: Tenant, *more: str) -> list[str]:
    """Every credential in play, and each one's secret part (what follows its public prefix)."""
    keys = [tenant.requester_key, tenant.approver_key, tenant.server.desk_key, *more]
    return [*keys, *(key.split("_", 3)[3] for key in keys if key.count("_") >= 3)]


def assert_nothing_secret(served: list[str], secrets: list[str]) -> None:
    assert served
    for html in served:
        for secret in secrets:
            assert secret not in html, "a secret reached a page"


def confirmation_state(tenant: Tenant, ref: str) -> str:
    details = tenant.api("GET", f"/v1/confirmations/{ref}")
    assert details["ok"], details
    return str(details["data"]["state"])


def session_cookie(web: WebPage) -> dict[str, Any]:
    cookies = [c for c in web.page.context.cookies() if c["name"] == "ito_session"]
    assert len(cookies) == 1, cookies
    return dict(cookies[0])


# --- device login -----------------------------------------------------------------------------


def test_device_login_approved_in_chromium_gives_the_cli_a_working_token(
    tenant: Tenant, tmp_path: Path, open_tab: Callable[..., WebPage]
) -> None:
    server = tenant.server
    approver = make_approver(server, tenant.account_id)
    env = client_env(tenant, tmp_path / "home")
    web = open_tab(server.url)

    # Sign in at /ui/login: the browser lands on the start page with an HttpOnly,
    # SameSite=Strict session cookie that the page's scripts cannot read.
    signed = web.sign_in(approver.email, approver.password)
    assert signed.status == 200 and web.path() == "/ui/"
    expect(web.page.locator("header form[action='/ui/logout'] button")).to_be_visible()
    cookie = session_cookie(web)
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and cookie["path"] == "/ui"
    assert web.page.evaluate("document.cookie") == ""

    with ito_login(env, tmp_path / "login") as login:
        code = login.user_code()
        # Open /ui/device and type the code the CLI printed into its form.
        entry = web.goto("/ui/device")
        assert entry.status == 200
        web.page.locator("#user_code").fill(code)
        shown = web.submit(web.page.locator("main form[action='/ui/device'] button[type=submit]"))
        assert shown.status == 200
        assert parse_qs(urlsplit(web.page.url).query)["user_code"] == [code]
        expect(web.page.locator(".usercode")).to_have_text(code)
        expect(web.page.get_by_text(tenant.account_id, exact=True)).to_be_visible()

        decided = web.submit(web.button("approve"))
        assert decided.status == 200
        expect(web.button("approve")).to_have_count(0)
        rc, envelope = login.finish()

    assert rc == 0 and envelope["ok"], envelope
    assert envelope["data"]["stored_in"] == "file"
    token_files = list((tmp_path / "home" / "credentials").glob("*.token"))
    assert len(token_files) == 1
    token = token_files[0].read_text().strip()

    # The stored token works for a later command, as a requester of the approver's account.
    auth = run_cli([ITO, "auth", "--json"], env)
    assert auth.rc == 0, auth.stdout + auth.stderr
    assert auth.data["role"] == "requester" and auth.data["account_id"] == tenant.account_id
    # The browser never saw the token, a key, or the password.
    assert_nothing_secret(web.served, [*secrets_of(tenant, token), approver.password])

    # The code is spent: showing it again is refused, and nothing can be decided.
    again = web.goto(f"/ui/device?user_code={code}")
    assert again.status >= 400
    expect(web.button("approve")).to_have_count(0)


def test_device_login_denied_in_chromium_fails_the_cli_with_access_denied(
    tenant: Tenant, tmp_path: Path, open_tab: Callable[..., WebPage]
) -> None:
    server = tenant.server
    approver = make_approver(server, tenant.account_id)
    env = client_env(tenant, tmp_path / "home")
    web = open_tab(server.url)

    with ito_login(env, tmp_path / "login") as login:
        code = login.user_code()
        link = login.verification_url()
        assert link.startswith(server.url + "/ui/device?")
        # The printed link, opened signed out: sign-in first, then straight back to the code.
        first = web.goto(link.removeprefix(server.url))
        assert first.status == 200
        assert urlsplit(web.page.url).path == "/ui/login"
        expect(web.button("deny")).to_have_count(0)
        back = web.fill_sign_in(approver.email, approver.password)
        assert back.status == 200 and web.page.url == link
        expect(web.page.locator(".usercode")).to_have_text(code)

        decided = web.submit(web.button("deny"))
        assert decided.status == 200
        expect(web.button("approve")).to_have_count(0)
        rc, envelope = login.finish()

    assert rc == 1 and not envelope["ok"]
    assert envelope["error"]["code"] == "access_denied"
    assert not list((tmp_path / "home").rglob("*.token"))
    unauthenticated = run_cli([ITO, "auth", "--json"], env)
    assert unauthenticated.rc == 1 and unauthenticated.code == "not_authenticated"


# --- confirmations ----------------------------------------------------------------------------


def confirm(tenant: Tenant, manifest: Path) -> str:
    result = tenant.ito(
        "confirm", "--action", "train", "--booking", tenant.booking_id, "--manifest", str(manifest)
    )
    assert result.rc == 0, result.stdout + result.stderr
    return str(result.data["confirmation_ref"])


def test_confirmation_approved_in_chromium_is_approved_for_the_api_and_the_run(
    tenant: Tenant, open_tab: Callable[..., WebPage]
) -> None:
    approver = make_approver(tenant.server, tenant.account_id)
    manifest = tenant.manifest()
    ref = confirm(tenant, manifest)
    details = tenant.api("GET", f"/v1/confirmations/{ref}")["data"]
    assert details["state"] == "pending"

    web = open_tab(tenant.server.url)
    assert web.sign_in(approver.email, approver.password).status == 200
    # The start page lists it; its link opens the confirmation page.
    web.submit(web.page.locator(f"a[href='/ui/confirmations/{ref}']"))
    assert web.path() == f"/ui/confirmations/{ref}"

    # What is approved is on the page, visibly: the bound digest and the cost bound.
    expect(web.page.get_by_text(details["manifest_id"], exact=True)).to_be_visible()
    expect(web.page.locator("strong.bound")).to_have_text(usd(details["cost_usd"]))
    expect(web.page.get_by_text(tenant.booking_id, exact=True).first).to_be_visible()
    expect(web.button("approve")).to_be_visible()
    expect(web.button("reject")).to_be_visible()
    assert confirmation_state(tenant, ref) == "pending"  # looking decides nothing

    approved = web.submit(web.button("approve"))
    assert approved.status == 200
    assert web.path() == f"/ui/confirmations/{ref}?decided=approved"
    expect(web.button("approve")).to_have_count(0)
    expect(web.button("reject")).to_have_count(0)
    assert confirmation_state(tenant, ref) == "approved"
    assert tenant.counts()["confirmations"] == {"approved": 1}

    # No API key or token, and not the session cookie, in any HTML the browser was served.
    assert_nothing_secret(
        web.served, [*secrets_of(tenant), approver.password, session_cookie(web)["value"]]
    )

    # The gates accept it: the requester's run is created and the confirmation is spent.
    created = tenant.ito(
        "train",
        "--booking",
        tenant.booking_id,
        "--manifest",
        str(manifest),
        "--confirmation-ref",
        ref,
        "--idempotency-key",
        "chromium-approved",
    )
    assert created.rc == 0, created.stdout + created.stderr
    assert created.data["state"] == "queued"
    assert confirmation_state(tenant, ref) == "consumed"


def test_signed_out_chromium_is_sent_to_sign_in_and_cannot_approve(
    tenant: Tenant, open_tab: Callable[..., WebPage]
) -> None:
    approver = make_approver(tenant.server, tenant.account_id)
    manifest = tenant.manifest()
    ref = confirm(tenant, manifest)
    digest = tenant.api("GET", f"/v1/confirmations/{ref}")["data"]["manifest_id"]

    # A browser that never signed in: sent to sign-in, shown nothing of the confirmation.
    stranger = open_tab(tenant.server.url)
    page = stranger.goto(f"/ui/confirmations/{ref}")
    assert page.status == 200
    target = urlsplit(stranger.page.url)
    assert target.path == "/ui/login"
    assert parse_qs(target.query)["next"] == [f"/ui/confirmations/{ref}"]
    expect(stranger.button("approve")).to_have_count(0)
    assert all(digest not in html for html in stranger.served)

    # A tab that showed the page while signed in, after signing out in another tab: its
    # Approve button is refused, and the confirmation stays pending.
    web = open_tab(tenant.server.url)
    assert web.sign_in(approver.email, approver.password).status == 200
    web.goto(f"/ui/confirmations/{ref}")
    expect(web.button("approve")).to_be_visible()
    other_tab = open_tab(tenant.server.url, like=web)
    other_tab.goto("/ui/")
    signed_out = other_tab.sign_out()
    assert signed_out.status == 200 and other_tab.path().startswith("/ui/login")
    assert not [c for c in web.page.context.cookies() if c["name"] == "ito_session"]
    refused = web.submit(web.button("approve"))
    assert refused.status == 401
    # Its sign-in link leads back to the confirmation.
    link = web.page.get_attribute('a[href^="/ui/login"]', "href")
    assert link is not None
    assert parse_qs(urlsplit(link).query)["next"] == [f"/ui/confirmations/{ref}"]
    assert confirmation_state(tenant, ref) == "pending"
    assert tenant.counts()["confirmations"] == {"pending": 1}

    # Signing in on the page the stranger was sent to leads back to the confirmation, where
    # the browser can now decide (here: reject, which the gates then refuse to use).
    back = stranger.fill_sign_in(approver.email, approver.password)
    assert back.status == 200 and stranger.path() == f"/ui/confirmations/{ref}"
    stranger.submit(stranger.button("reject"))
    assert stranger.path() == f"/ui/confirmations/{ref}?decided=rejected"
    assert confirmation_state(tenant, ref) == "rejected"
    refused_run = tenant.ito(
        "train",
        "--booking",
        tenant.booking_id,
        "--manifest",
        str(manifest),
        "--confirmation-ref",
        ref,
        "--idempotency-key",
        "k",
    )
    assert refused_run.code == "confirmation_rejected"
    assert_nothing_secret(
        [*stranger.served, *web.served, *other_tab.served], [*secrets_of(tenant), approver.password]
    )
