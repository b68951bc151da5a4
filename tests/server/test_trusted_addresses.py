"""Who the limiter thinks a request came from, and whom a lockout can hurt (real server).

The client address is the socket's peer unless the operator names trusted proxies
(``ITO_TRUSTED_PROXIES``): a spoofed ``X-Forwarded-For`` changes nothing. Failed API keys count
against the address and against the presented key's public prefix; past the limit, failures
are answered ``rate_limited`` — but a key that verifies always gets in, so one tenant's (or an
attacker's) failures behind a shared NAT cannot lock another tenant out. At the sign-in page
(guessable passwords) failures count per email and per address-and-email, and per address over
all emails at three times the limit: a spray of emails is stopped, one account's guesser behind
a NAT does not reach it. (On SQLite only: the failure window lives in the store, shared by
every server on it, the same code on both backends; each test starts its minute without the
failures other tests' servers counted from this address.)"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from ito.server.state import SIGN_IN_ADDRESS_FACTOR
from tests.server.web_browser import browser, make_approver
from tests.support import Server, extra_server, make_tenant

pytestmark = [
    pytest.mark.slow,
    pytest.mark.parametrize("backend_url", ["sqlite"], indirect=True),
    pytest.mark.usefixtures("fresh_failure_window"),
]
LIMIT = 3


def _get(url: str, key: str, forwarded_for: str | None = None) -> tuple[int, str | None]:
    headers = {"authorization": f"Bearer {key}"}
    if forwarded_for is not None:
        headers["x-forwarded-for"] = forwarded_for
    response = httpx.get(url + "/v1/me", headers=headers, timeout=30)
    envelope = response.json()
    return response.status_code, None if envelope["ok"] else envelope["error"]["code"]


def _wrong_secret(key: str) -> str:
    prefix = "_".join(key.split("_")[:3])
    return prefix + "_" + "x" * 43


def test_a_spoofed_forwarded_for_does_not_change_the_address_the_limiter_sees(
    server: Server, tmp_path: Path
) -> None:
    with extra_server(server, tmp_path, ITO_AUTH_FAILURES_PER_MINUTE=str(LIMIT)) as url:
        for i in range(LIMIT):
            assert _get(url, f"ito_req_{i}" + "x" * 40, f"198.51.100.{i}") == (
                401,
                "not_authenticated",
            )
        # Another "client" by its header, the same socket: still locked.
        assert _get(url, "ito_req_" + "y" * 40, "203.0.113.77") == (429, "rate_limited")
        assert _get(url, "ito_req_" + "y" * 40) == (429, "rate_limited")


def test_a_valid_key_works_while_its_address_is_locked_by_anothers_failures(
    server: Server, tmp_path: Path
) -> None:
    victim = make_tenant(server, tmp_path / "victim", "victim")
    with extra_server(server, tmp_path, ITO_AUTH_FAILURES_PER_MINUTE=str(LIMIT)) as url:
        for _ in range(LIMIT + 2):
            _get(url, "ito_req_" + "x" * 40)
        assert _get(url, "ito_req_" + "z" * 40) == (429, "rate_limited")
        # Same address, the victim's real keys: in, and able to act.
        assert _get(url, victim.requester_key) == (200, None)
        assert _get(url, victim.approver_key) == (200, None)
        booking = httpx.get(
            url + f"/v1/bookings/{victim.booking_id}",
            timeout=30,
            headers={"authorization": f"Bearer {victim.requester_key}"},
        )
        assert booking.status_code == 200 and booking.json()["data"]["state"] == "completed"
        # Guessing the victim's secret behind its public prefix is answered like any failure
        # past the limit; the real key is unaffected.
        assert _get(url, _wrong_secret(victim.requester_key)) == (429, "rate_limited")
        assert _get(url, victim.requester_key) == (200, None)


def test_with_trusted_proxies_each_forwarded_client_counts_and_a_key_prefix_counts_across_them(
    server: Server, tmp_path: Path
) -> None:
    victim = make_tenant(server, tmp_path / "victim", "victim")
    with extra_server(
        server, tmp_path, ITO_AUTH_FAILURES_PER_MINUTE=str(LIMIT), ITO_TRUSTED_PROXIES="127.0.0.1"
    ) as url:
        for _ in range(LIMIT):
            assert _get(url, "ito_req_" + "x" * 40, "198.51.100.1") == (401, "not_authenticated")
        assert _get(url, "ito_req_" + "x" * 40, "198.51.100.1") == (429, "rate_limited")
        # The header is believed from the named proxy: another client is not locked.
        assert _get(url, "ito_req_" + "x" * 40, "198.51.100.2") == (401, "not_authenticated")
        # One key's secret guessed from many addresses: its prefix is locked for failures...
        wrong = _wrong_secret(victim.requester_key)
        for i in range(LIMIT):
            assert _get(url, wrong, f"203.0.113.{i}") == (401, "not_authenticated")
        assert _get(url, wrong, "203.0.113.200") == (429, "rate_limited")
        # ...while the real key, from anywhere, still gets in.
        assert _get(url, victim.requester_key, "203.0.113.201") == (200, None)
        assert _get(url, victim.requester_key, "198.51.100.1") == (200, None)


def test_wrong_passwords_for_one_account_do_not_lock_out_another_behind_the_same_address(
    server: Server, tmp_path: Path
) -> None:
    attacked = make_approver(server, make_tenant(server, tmp_path / "a", "a").account_id)
    neighbour = make_approver(server, make_tenant(server, tmp_path / "b", "b").account_id)
    with (
        extra_server(server, tmp_path, ITO_AUTH_FAILURES_PER_MINUTE=str(LIMIT)) as url,
        browser(url) as web,
    ):
        for _ in range(LIMIT):
            assert web.sign_in(attacked.email, "wrong-password").status_code == 401
        locked = web.sign_in(attacked.email, attacked.password)
        assert locked.status_code == 429 and "rate_limited" in locked.text
        # Same address, another account: signs in.
        assert web.sign_in(neighbour.email, neighbour.password).status_code == 303


def test_a_spray_of_emails_from_one_address_is_stopped_for_the_minute(
    server: Server, tmp_path: Path
) -> None:
    """Thirty emails sprayed from one address went unthrottled: each email's own count stayed
    under the limit. Past three times the limit over all emails, the address is refused —
    a real approver's right password included — and no session starts."""
    neighbour = make_approver(server, make_tenant(server, tmp_path / "b", "b").account_id)
    with (
        extra_server(server, tmp_path, ITO_AUTH_FAILURES_PER_MINUTE=str(LIMIT)) as url,
        browser(url) as web,
    ):
        for i in range(SIGN_IN_ADDRESS_FACTOR * LIMIT):
            assert web.sign_in(f"sprayed-{i}@example.com", "guess").status_code == 401
        refused = web.sign_in(neighbour.email, neighbour.password)
        assert refused.status_code == 429 and "rate_limited" in refused.text
        assert web.session_cookie() is None
