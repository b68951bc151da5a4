"""Rate limits on a real server (both backends): a credential past its rate gets
``rate_limited`` (429, ``Retry-After``) while others go on; a source that keeps presenting
unknown keys is answered ``rate_limited`` for the rest of the minute (a key that verifies still
gets in), and one that keeps trying wrong passwords for an email at the sign-in page is
refused outright for it, the right password included. (On SQLite only: the request rate lives
in the server process; the failure window in the store, the same code on both backends —
tests/server/test_several_processes.py runs it on both, behind several processes.)"""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from tests.server.web_browser import Browser, csrf_field, make_approver
from tests.support import Server, Tenant, extra_server, make_tenant, wait_until

# One backend is enough here (see the module docstring).
pytestmark = [
    pytest.mark.slow,
    pytest.mark.parametrize("backend_url", ["sqlite"], indirect=True),
    pytest.mark.usefixtures("fresh_failure_window"),
]
BURST = 10


def _get(url: str, key: str, path: str = "/v1/runs") -> httpx.Response:
    return httpx.get(url + path, headers={"authorization": f"Bearer {key}"}, timeout=30)


def test_a_credential_past_its_rate_is_refused_and_others_are_not(
    server: Server, tenant: Tenant, tmp_path: Path
) -> None:
    with extra_server(
        server, tmp_path, ITO_RATE_LIMIT_PER_SECOND="0.5", ITO_RATE_LIMIT_BURST=str(BURST)
    ) as url:
        started = time.monotonic()
        answers = [_get(url, tenant.requester_key) for _ in range(BURST + 5)]
        elapsed = time.monotonic() - started
        admitted = [r for r in answers if r.status_code == 200]
        refused = [r for r in answers if r.status_code != 200]
        assert BURST <= len(admitted) <= BURST + 0.5 * elapsed + 1
        assert refused
        for response in refused:
            assert response.status_code == 429
            error = response.json()["error"]
            assert error["code"] == "rate_limited" and error["retryable"] is True
            assert int(response.headers["retry-after"]) >= 1
        # Another credential of the same account is counted on its own.
        assert _get(url, tenant.approver_key, "/v1/me").status_code == 200
        # Backing off is enough: the credential gets through again.
        wait_until(
            lambda: _get(url, tenant.requester_key).status_code == 200, timeout=15, interval=0.5
        )


def test_a_source_guessing_api_keys_is_refused_for_the_minute(
    server: Server, tmp_path: Path
) -> None:
    t = make_tenant(server, tmp_path / "t", "guessed")
    with extra_server(server, tmp_path, ITO_AUTH_FAILURES_PER_MINUTE="3") as url:
        for _ in range(3):
            guess = _get(url, "ito_req_" + "x" * 40)
            assert guess.status_code == 401
            assert guess.json()["error"]["code"] == "not_authenticated"
        # A fourth guess is refused for the rest of the minute, whatever key it tries.
        for key in ("ito_req_" + "y" * 40, "ito_req_AbCdEfGh_" + "z" * 43, "garbage"):
            refused = _get(url, key)
            assert refused.status_code == 429
            assert refused.json()["error"]["code"] == "rate_limited"
            assert 1 <= int(refused.headers["retry-after"]) <= 60
        # A key that verifies still gets in: the guesses cannot lock out a tenant that shares
        # the address (tests/server/test_trusted_addresses.py).
        assert _get(url, t.requester_key).status_code == 200


def test_password_guessing_at_the_sign_in_page_is_refused_for_the_minute(
    server: Server, tenant: Tenant, tmp_path: Path
) -> None:
    approver = make_approver(server, tenant.account_id)
    with extra_server(server, tmp_path, ITO_AUTH_FAILURES_PER_MINUTE="3") as url:
        browser = Browser(url)
        try:
            for _ in range(3):
                wrong = browser.sign_in(approver.email, "not-the-password")
                assert wrong.status_code == 401 and "invalid_credentials" in wrong.text
            # The right password no longer helps from here, and no session is started.
            page = browser.get("/ui/login")
            right = browser.post(
                "/ui/login",
                {
                    "email": approver.email,
                    "password": approver.password,
                    "csrf_token": csrf_field(page.text),
                    "next": "",
                },
            )
            assert right.status_code == 429 and "rate_limited" in right.text
            assert browser.session_cookie() is None
            assert approver.password not in right.text
        finally:
            browser.close()


def test_device_codes_are_bounded_per_source_address(server: Server, tmp_path: Path) -> None:
    with extra_server(
        server, tmp_path, ITO_RATE_LIMIT_PER_SECOND="0.5", ITO_RATE_LIMIT_BURST="3"
    ) as url:
        answers = [httpx.post(url + "/v1/device/code", json={}, timeout=30) for _ in range(6)]
    codes = [r.json()["error"]["code"] if r.status_code != 200 else "ok" for r in answers]
    assert codes[:3] == ["ok"] * 3 and "rate_limited" in codes[3:]
    assert all(c in ("ok", "rate_limited") for c in codes)
