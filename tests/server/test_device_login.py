"""Device login (RFC 8628) against the real server on SQLite and PostgreSQL: the device asks
for a code, an approver signs in and decides on the real page (cookie + CSRF form), and the
device's polls get pending, slow_down, denied, expired or — exactly once — a new requester key.
Also: ``ito-server user create``, self-revocation, and no secret in the log or the database."""

from __future__ import annotations

import json
import re
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from sqlalchemy import text

from tests.server.web_browser import (
    device_code,
    error_code,
    make_approver,
    poll,
    poll_until_decided,
    signed_in,
    user_create,
)
from tests.support import ITO_SERVER, Server, Tenant, database_text, extra_server

pytestmark = pytest.mark.slow

USER_CODE = re.compile(r"^[BCDFGHJKLMNPQRSTVWXZ]{4}-[BCDFGHJKLMNPQRSTVWXZ]{4}$")


def me(url: str, token: str) -> httpx.Response:
    return httpx.get(url + "/v1/me", headers={"authorization": f"Bearer {token}"}, timeout=30)


def keys_of(server: Server, account_id: str) -> int:
    with server.engine.connect() as conn:
        return int(
            conn.execute(
                text("SELECT count(*) FROM api_keys WHERE account_id = :a"), {"a": account_id}
            ).scalar_one()
        )


def test_approved_device_login_issues_one_new_requester_key_once(tenant: Tenant) -> None:
    server = tenant.server
    approver = make_approver(server, tenant.account_id)
    grant = device_code(server.url, "ito CLI on build-host")
    assert set(grant) == {
        "device_code",
        "user_code",
        "verification_uri",
        "verification_uri_complete",
        "expires_in",
        "interval",
    }
    assert USER_CODE.match(grant["user_code"])
    assert grant["verification_uri"] == f"{server.url}/ui/device"
    assert (
        grant["verification_uri_complete"]
        == f"{server.url}/ui/device?user_code={grant['user_code']}"
    )
    assert grant["expires_in"] == 600 and grant["interval"] == 1
    assert len(grant["device_code"]) >= 40

    pending = poll(server.url, grant["device_code"])
    assert pending.status_code == 400 and error_code(pending) == "authorization_pending"
    assert pending.json()["error"]["retryable"] is True

    web = signed_in(server, approver)
    page = web.get(grant["verification_uri_complete"].removeprefix(server.url))
    assert page.status_code == 200
    assert grant["user_code"] in page.text and "ito CLI on build-host" in page.text
    assert tenant.account_id in page.text
    decided = web.decide_device(grant["user_code"], "approve")
    assert decided.status_code == 200 and "approved" in decided.text
    web.close()

    issued = poll_until_decided(server.url, grant)
    assert issued.status_code == 200, issued.text
    token = issued.json()["data"]
    assert token["token_type"] == "bearer" and token["role"] == "requester"
    assert token["account_id"] == tenant.account_id
    assert token["key_prefix"].startswith("ito_req_")
    assert token["access_token"].startswith(token["key_prefix"] + "_")

    who = me(server.url, token["access_token"]).json()["data"]
    assert who["role"] == "requester" and who["account_id"] == tenant.account_id
    # A new principal: neither the approver (so it can never approve) nor another key's.
    tenant_requester = me(server.url, tenant.requester_key).json()["data"]
    assert who["principal_id"] not in (approver.principal_id, tenant_requester["principal_id"])
    with server.engine.connect() as conn:
        name = conn.execute(
            text("SELECT name FROM principals WHERE id = :p"), {"p": who["principal_id"]}
        ).scalar_one()
    assert name == f"device login approved by {approver.email}"

    # Exactly once: the code is spent, however often the device asks again.
    for _ in range(2):
        again = poll(server.url, grant["device_code"])
        assert again.status_code == 404 and error_code(again) == "device_code_not_found"
        assert "access_token" not in again.text
    assert (
        tenant.api("POST", "/v1/confirmations/cfr_x/approve", key=token["access_token"])["error"][
            "code"
        ]
        == "forbidden_scope"
    )


def test_concurrent_polls_of_an_approved_code_get_exactly_one_token(tenant: Tenant) -> None:
    server = tenant.server
    approver = make_approver(server, tenant.account_id)
    before = keys_of(server, tenant.account_id)
    grant = device_code(server.url)
    web = signed_in(server, approver)
    assert web.decide_device(grant["user_code"], "approve").status_code == 200
    web.close()
    time.sleep(grant["interval"])
    with ThreadPoolExecutor(max_workers=8) as pool:
        answers = list(pool.map(lambda _: poll(server.url, grant["device_code"]), range(8)))
    statuses = sorted(a.status_code for a in answers)
    assert statuses == [200] + [404] * 7, [a.text for a in answers]
    assert keys_of(server, tenant.account_id) == before + 1


def test_denied_device_login_gets_access_denied_and_no_key(tenant: Tenant) -> None:
    server = tenant.server
    approver = make_approver(server, tenant.account_id)
    before = keys_of(server, tenant.account_id)
    grant = device_code(server.url)
    web = signed_in(server, approver)
    decided = web.decide_device(grant["user_code"], "deny")
    assert decided.status_code == 200 and "Denied" in decided.text

    denied = poll_until_decided(server.url, grant)
    assert denied.status_code == 403 and error_code(denied) == "access_denied"
    assert error_code(poll(server.url, grant["device_code"])) == "access_denied"
    # Decided once: the page refuses a second decision.
    again = web.get("/ui/device", params={"user_code": grant["user_code"]})
    assert again.status_code == 409 and "device_code_not_pending" in again.text
    web.close()
    assert keys_of(server, tenant.account_id) == before


def test_polling_inside_the_interval_gets_slow_down(server: Server) -> None:
    grant = device_code(server.url)
    first = poll(server.url, grant["device_code"])
    assert error_code(first) == "authorization_pending"
    fast = poll(server.url, grant["device_code"])
    assert fast.status_code == 429 and error_code(fast) == "slow_down"
    assert fast.json()["error"]["details"]["interval"] == 1
    # Waiting the interval (as RFC 8628 asks of the device) is enough to be answered again.
    time.sleep(grant["interval"])
    assert error_code(poll(server.url, grant["device_code"])) == "authorization_pending"


def test_unknown_or_malformed_device_codes_are_refused(server: Server) -> None:
    unknown = poll(server.url, "not-a-device-code")
    assert unknown.status_code == 404 and error_code(unknown) == "device_code_not_found"
    for body in (
        {},
        {"device_code": ""},
        {"device_code": "x", "extra": 1},
        {"device_code": "x", "grant_type": "password"},
    ):
        refused = httpx.post(server.url + "/v1/device/token", json=body, timeout=30)
        assert refused.status_code == 422 and error_code(refused) == "invalid_arguments"
    # The code request's body is optional; a too-long client name is refused.
    bare = httpx.post(server.url + "/v1/device/code", timeout=30)
    assert bare.status_code == 200 and USER_CODE.match(bare.json()["data"]["user_code"])
    long = httpx.post(server.url + "/v1/device/code", json={"client_name": "x" * 101}, timeout=30)
    assert long.status_code == 422


def test_device_code_expires_and_can_then_be_neither_approved_nor_exchanged(
    tenant: Tenant, tmp_path: Path
) -> None:
    approver = make_approver(tenant.server, tenant.account_id)
    with extra_server(tenant.server, tmp_path, ITO_DEVICE_CODE_TTL_SECONDS="2") as url:
        grant = device_code(url)
        assert grant["expires_in"] == 2
        expired = poll_until_decided(url, grant, timeout=15)
        assert expired.status_code == 410 and error_code(expired) == "device_code_expired"

        web = signed_in(tenant.server, approver)
        page = web.get("/ui/device", params={"user_code": grant["user_code"]})
        assert page.status_code == 410 and "device_code_expired" in page.text
        csrf = re.search(r'name="csrf_token" value="([^"]*)"', page.text)
        assert csrf is not None
        refused = web.post(
            "/ui/device",
            {"user_code": grant["user_code"], "decision": "approve", "csrf_token": csrf.group(1)},
        )
        assert refused.status_code == 410
        web.close()
        assert error_code(poll(url, grant["device_code"])) == "device_code_expired"


def test_self_revoke_makes_the_next_request_credential_revoked(tenant: Tenant) -> None:
    url = tenant.server.url
    key = tenant.server.desk(
        "/v1/desk/keys", {"account_id": tenant.account_id, "role": "requester"}
    )
    assert me(url, key["api_key"]).status_code == 200
    revoked = httpx.post(
        url + "/v1/credentials/self/revoke",
        timeout=30,
        headers={"authorization": f"Bearer {key['api_key']}"},
    )
    assert revoked.status_code == 200
    assert revoked.json()["data"] == {"key_prefix": key["key_prefix"], "revoked": True}
    after = me(url, key["api_key"])
    assert after.status_code == 401 and error_code(after) == "credential_revoked"
    again = httpx.post(
        url + "/v1/credentials/self/revoke",
        timeout=30,
        headers={"authorization": f"Bearer {key['api_key']}"},
    )
    assert error_code(again) == "credential_revoked"
    anonymous = httpx.post(url + "/v1/credentials/self/revoke", timeout=30)
    assert anonymous.status_code == 401 and error_code(anonymous) == "not_authenticated"
    # Other keys of the account are untouched.
    assert me(url, tenant.requester_key).status_code == 200


def test_user_create_accepts_only_approvers_and_never_prints_the_password(tenant: Tenant) -> None:
    server = tenant.server
    password = "a-long-enough-password-123"
    for role in ("requester", "desk", "worker"):
        rc, envelope, output = user_create(
            server, tenant.account_id, "r@example.test", password, role
        )
        assert rc == 1 and envelope["error"]["code"] == "invalid_arguments"
        assert password not in output
    no_terminal = subprocess.run(
        [
            ITO_SERVER,
            "user",
            "create",
            "--account",
            tenant.account_id,
            "--email",
            "tty@example.test",
            "--json",
        ],
        env=server.env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert no_terminal.returncode == 1
    assert json.loads(no_terminal.stdout)["error"]["code"] == "invalid_arguments"
    rc, envelope, _ = user_create(server, tenant.account_id, "short@example.test", "short")
    assert rc == 1 and envelope["error"]["code"] == "invalid_arguments"
    rc, envelope, _ = user_create(server, "acc_missing", "x@example.test", password)
    assert rc == 1 and envelope["error"]["code"] == "account_not_found"

    approver = make_approver(server, tenant.account_id)
    rc, envelope, output = user_create(server, tenant.account_id, approver.email.upper(), password)
    assert rc == 1 and envelope["error"]["code"] == "user_exists" and password not in output
    with server.engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT u.email, u.password_hash, p.role FROM users u JOIN "
                "principals p ON p.id = u.principal_id WHERE u.account_id = :a"
            ),
            {"a": tenant.account_id},
        ).all()
    assert len(rows) == 1
    email, stored, role = rows[0]
    assert email == approver.email and role == "approver"
    assert stored.startswith("$argon2id$") and approver.password not in stored


def test_no_password_session_or_device_secret_is_logged_or_stored(tenant: Tenant) -> None:
    server = tenant.server
    approver = make_approver(server, tenant.account_id)
    grant = device_code(server.url)
    web = signed_in(server, approver)
    session_id = web.session_cookie()
    assert session_id
    assert web.decide_device(grant["user_code"], "approve").status_code == 200
    token = poll_until_decided(server.url, grant).json()["data"]["access_token"]
    web.close()

    stored = database_text(server)
    log = server.log_path.read_bytes()
    secrets = [
        approver.password,
        session_id,
        grant["device_code"],
        token,
        token.split("_", 3)[3],
        server.env["ITO_PEPPER"],
    ]
    for secret in secrets:
        assert secret.encode() not in stored, "a secret is in the database"
        assert secret.encode() not in log, "a secret is in the server log"
    # The search looked in the right places: public names are there.
    assert approver.email.encode() in stored
    assert "_".join(token.split("_")[:3]).encode() in stored
    assert b"/v1/device/token" in log
