"""The web pages against the real server on SQLite and PostgreSQL, driven through their real
forms: sign-in (argon2 password, session cookie), CSRF on every form, pages only for a
signed-in approver (never an API key), and the confirmation page — which shows exactly what is
approved and, approved there, lets the requester's run start."""

from __future__ import annotations

import json
import math
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest
from fastapi.testclient import TestClient
from pydantic import SecretStr

from ito.core.manifest import manifest_summary, parse_manifest
from ito.recipes import build_recipe
from ito.server.app import create_app
from ito.server.services.accounts import create_account
from ito.server.services.approvals import approval_figures
from ito.server.services.users import create_user, hash_password
from ito.server.settings import ServerSettings
from ito.server.store.db import Database, migrate
from ito.server.web.pages import render
from tests.server.web_browser import (
    browser,
    csrf_field,
    device_code,
    error_code,
    make_approver,
    poll,
    poll_until_decided,
    signed_in,
)
from tests.support import Server, Tenant

pytestmark = pytest.mark.slow


def _utc(iso: str) -> str:
    """An ISO instant as the pages show it: UTC, to the second."""
    return datetime.fromisoformat(iso).astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _figures(estimate: dict[str, float]) -> dict[str, object]:
    now = datetime.now(UTC)
    return approval_figures(
        estimate,
        cost_bound_usd=1.0,
        created_at=now,
        expires_at=now + timedelta(minutes=15),
        decided_at=None,
        booking=None,
        now=now,
    )


def confirm(tenant: Tenant, manifest: Path, key: str = "requester") -> str:
    result = tenant.ito(
        "confirm",
        "--action",
        "train",
        "--booking",
        tenant.booking_id,
        "--manifest",
        str(manifest),
        key=key,
    )
    assert result.rc == 0, result.stdout + result.stderr
    return str(result.data["confirmation_ref"])


def test_wrong_password_is_401_and_starts_no_session(tenant: Tenant) -> None:
    server = tenant.server
    approver = make_approver(server, tenant.account_id)
    with browser(server.url) as web:
        for email, password in [
            (approver.email, approver.password + "x"),
            ("nobody@example.test", approver.password),
            (approver.email, ""),
        ]:
            refused = web.sign_in(email, password)
            assert refused.status_code == 401 and "invalid_credentials" in refused.text
            assert "ito_session" not in refused.headers.get("set-cookie", "")
            assert web.session_cookie() is None
        assert approver.password not in refused.text
        # Not signed in: the pages send the browser to the sign-in form and back.
        page = web.get("/ui/device", params={"user_code": "BCDF-GHJK"})
        assert page.status_code == 303
        target = urlsplit(page.headers["location"])
        assert target.path == "/ui/login"
        assert parse_qs(target.query)["next"] == ["/ui/device?user_code=BCDF-GHJK"]

        ok = web.sign_in(
            approver.email.upper(), approver.password, next_url="/ui/device?user_code=BCDF-GHJK"
        )
        assert ok.status_code == 303
        assert ok.headers["location"] == "/ui/device?user_code=BCDF-GHJK"
        cookie = ok.headers["set-cookie"].lower()
        assert "ito_session=" in cookie and "httponly" in cookie
        assert "samesite=strict" in cookie and "path=/ui" in cookie
        assert "secure" not in cookie  # public_url is http here; see the https test
        assert web.get("/ui/").status_code == 200


def test_sign_in_redirects_only_to_local_pages(tenant: Tenant) -> None:
    approver = make_approver(tenant.server, tenant.account_id)
    for next_url, expected in [
        ("https://evil.example/", "/ui/"),
        ("//evil.example/x", "/ui/"),
        ("/\\evil.example", "/ui/"),
        ("/v1/me", "/ui/"),
        ("/uievil", "/ui/"),
        ("/ui/../v1/me", "/ui/"),
        ("/ui/confirmations/cfr_x", "/ui/confirmations/cfr_x"),
    ]:
        with browser(tenant.server.url) as web:
            response = web.sign_in(approver.email, approver.password, next_url=next_url)
            assert response.status_code == 303
            assert response.headers["location"] == expected, next_url


def test_forms_without_the_right_csrf_token_are_refused_and_decide_nothing(tenant: Tenant) -> None:
    server = tenant.server
    approver = make_approver(server, tenant.account_id)
    other = make_approver(server, tenant.account_id)

    # The sign-in form itself: no token, or a token without its cookie.
    with browser(server.url) as web:
        page = web.get("/ui/login")
        for token in ("", "0" * 64):
            refused = web.post(
                "/ui/login",
                {"email": approver.email, "password": approver.password, "csrf_token": token},
            )
            assert refused.status_code == 403 and "csrf_failed" in refused.text
        stolen = csrf_field(page.text)
    with browser(server.url) as web:
        refused = web.post(
            "/ui/login",
            {"email": approver.email, "password": approver.password, "csrf_token": stolen},
        )
        assert refused.status_code == 403 and web.session_cookie() is None

    grant = device_code(server.url)
    ref = confirm(tenant, tenant.manifest())
    web, intruder = signed_in(server, approver), signed_in(server, other)
    foreign = csrf_field(intruder.get("/ui/").text)  # a valid token, of another session
    for presented in (None, "", "0" * 64, foreign):
        fields = {"user_code": grant["user_code"], "decision": "approve"}
        if presented is not None:
            fields["csrf_token"] = presented
        refused = web.post("/ui/device", fields)
        assert refused.status_code == 403 and "csrf_failed" in refused.text
        fields = {"decision": "approve"}
        if presented is not None:
            fields["csrf_token"] = presented
        refused = web.post(f"/ui/confirmations/{ref}", fields)
        assert refused.status_code == 403 and "csrf_failed" in refused.text
        refused = web.post("/ui/logout", {"csrf_token": presented or ""})
        assert refused.status_code == 403
    web.close()
    intruder.close()

    assert error_code(poll(server.url, grant["device_code"])) == "authorization_pending"
    assert tenant.counts()["confirmations"] == {"pending": 1}


def test_pages_need_a_signed_in_user_not_an_api_key(tenant: Tenant) -> None:
    server = tenant.server
    ref = confirm(tenant, tenant.manifest())
    grant = device_code(server.url)
    for key in (tenant.requester_key, tenant.approver_key, server.desk_key):
        headers = {"authorization": f"Bearer {key}"}
        with httpx.Client(base_url=server.url, headers=headers, timeout=30) as client:
            for path in (
                "/ui/",
                f"/ui/device?user_code={grant['user_code']}",
                f"/ui/confirmations/{ref}",
            ):
                page = client.get(path)
                assert page.status_code == 303
                assert page.headers["location"].startswith("/ui/login?next=")
            for path, fields in [
                ("/ui/device", {"user_code": grant["user_code"], "decision": "approve"}),
                (f"/ui/confirmations/{ref}", {"decision": "approve"}),
            ]:
                refused = client.post(path, data=fields | {"csrf_token": "x"})
                assert refused.status_code == 401 and "not_authenticated" in refused.text
    # A made-up session cookie is no better.
    with httpx.Client(base_url=server.url, cookies={"ito_session": "forged"}) as client:
        assert client.get("/ui/").status_code == 303
    assert error_code(poll(server.url, grant["device_code"])) == "authorization_pending"
    assert tenant.counts()["confirmations"] == {"pending": 1}


def test_confirmation_page_shows_the_bindings_and_approving_there_lets_the_run_start(
    tenant: Tenant,
) -> None:
    """The requester here is a device login approved by the same human: the approver's own
    principal never requests, so approving its device's request is not self-approval."""
    server = tenant.server
    approver = make_approver(server, tenant.account_id)
    web = signed_in(server, approver)
    grant = device_code(server.url, "agent laptop")
    assert web.decide_device(grant["user_code"], "approve").status_code == 200
    device_token = poll_until_decided(server.url, grant).json()["data"]["access_token"]
    device_principal = tenant.api("GET", "/v1/me", key=device_token)["data"]["principal_id"]

    manifest = tenant.manifest()
    ref = confirm(tenant, manifest, key=device_token)
    details = tenant.api("GET", f"/v1/confirmations/{ref}")["data"]

    page = web.get(f"/ui/confirmations/{ref}")
    assert page.status_code == 200
    html = page.text
    booking = details["details"]["booking"]
    summary = details["details"]["manifest_summary"]
    for expected in [
        ref,
        "train.create",
        tenant.booking_id,
        "CPU",
        f"{booking['nodes']} node(s) × {booking['gpus_per_node']} GPU(s)",
        booking["region"],
        booking["fabric"],
        _utc(booking["term_start"]),
        _utc(booking["term_end"]),
        details["manifest_id"],
        summary["name"],
        device_principal,
        _utc(details["expires_at"]),
        "pending",
        "Approve",
        "Reject",
    ]:
        assert expected in html, expected
    # A decision, not a dump: no raw key: value lines, no ISO instants with microseconds.
    estimate = details["details"]["estimate"]
    assert "within_ceiling" not in html and "seconds:" not in html
    assert details["expires_at"] not in html and booking["term_start"] not in html
    assert not re.search(r"\d{2}:\d{2}:\d{2}\.\d", html)
    # The cost with its unit, against the ceiling and the bound approved.
    assert (
        f'<strong class="cost">${estimate["cost_usd"]:.2f} expected, at most '
        f'<span class="upper-cost">${estimate["upper_cost_usd"]:.2f}</span>, of '
        f"${estimate['ceiling_usd']:.2f} ceiling</strong>" in html
    )
    # The default bound is the upper figure (within the manifest's limits).
    assert details["cost_usd"] == pytest.approx(
        min(
            math.ceil(round(estimate["upper_cost_usd"] * 100, 6)) / 100,
            estimate["ceiling_usd"],
            estimate["max_incremental_cost_usd"],
        )
    )
    assert "uncalibrated" in html
    # Time and cost rest on one stated assumption (the accelerator's assumed MFU).
    assumed = re.search(
        r'class="uncalibrated assumed-mfu">\(time and cost both assume (\d+) %', html
    )
    assert assumed is not None and int(assumed[1]) == round(estimate["assumed_mfu"] * 100)
    assert f'<strong class="bound">${details["cost_usd"]:.2f}</strong>' in html
    # The expiry counted down beside the exact time (a fresh confirmation: 15 minutes).
    assert re.search(r'class="expires-in">expires in 1[45] min</strong>', html)
    # Exactly the stages of the run's plan, each with a human duration.
    plan = estimate["stage_plan"]["stages"]
    rows = re.findall(r'<tr class="stage"><td><strong>([a-z_]+)</strong>', html)
    assert rows == [stage["name"] for stage in plan] and "sft" not in rows
    durations = re.findall(r'<td class="duration">([^<]+)</td>', html)
    assert durations and all(
        re.fullmatch(r"\d+ (s|min( \d+ s)?|h( \d+ min)?)", d) for d in durations
    )
    # The layout and predicted MFU of the plan the run would carry, not its raw document.
    planned = estimate["parallelism"]["plan"]
    assert 'id="parallelism"' in html
    assert "dp_shard=2" in html and "tp=1" in html
    assert f'predicted MFU <strong class="mfu">{planned["predicted"]["mfu"] * 100:.1f} %' in html
    # Not the raw document: none of the planner's explanations is dumped into the page.
    assert planned["rules"] and all(rule["why"] not in html for rule in planned["rules"])
    for header in ("content-security-policy", "x-frame-options", "referrer-policy"):
        assert header in page.headers
    assert "no-store" in page.headers["cache-control"]

    before = tenant.counts()
    decided = web.post(
        f"/ui/confirmations/{ref}", {"decision": "approve", "csrf_token": csrf_field(html)}
    )
    assert decided.status_code == 303
    after = web.get(decided.headers["location"])
    assert after.status_code == 200 and "approved" in after.text and "Approve<" not in after.text
    assert tenant.counts()["confirmations"] == {"approved": 1}
    assert before["runs"] == 0
    again = web.post(
        f"/ui/confirmations/{ref}", {"decision": "reject", "csrf_token": csrf_field(html)}
    )
    assert again.status_code == 409 and "confirmation_not_pending" in again.text

    created = tenant.ito(
        "train",
        "--booking",
        tenant.booking_id,
        "--manifest",
        str(manifest),
        "--confirmation-ref",
        ref,
        "--idempotency-key",
        "web-approved",
        key=device_token,
    )
    assert created.rc == 0, created.stdout
    assert created.data["state"] == "queued"
    assert tenant.counts()["confirmations"] == {"consumed": 1}

    # A run action's page names the run instead of a booking.
    run_id = created.data["run_id"]
    cancel = tenant.ito("confirm", "--action", "cancel", "--run", run_id, key=device_token)
    cancel_page = web.get(f"/ui/confirmations/{cancel.data['confirmation_ref']}")
    assert cancel_page.status_code == 200
    assert "run.cancel" in cancel_page.text and run_id in cancel_page.text
    web.close()


def test_rejecting_on_the_page_makes_the_confirmation_unusable(tenant: Tenant) -> None:
    approver = make_approver(tenant.server, tenant.account_id)
    manifest = tenant.manifest()
    ref = confirm(tenant, manifest)
    web = signed_in(tenant.server, approver)
    page = web.get(f"/ui/confirmations/{ref}")
    rejected = web.post(
        f"/ui/confirmations/{ref}", {"decision": "reject", "csrf_token": csrf_field(page.text)}
    )
    assert rejected.status_code == 303
    assert "rejected" in web.get(rejected.headers["location"]).text
    bogus = web.post(
        f"/ui/confirmations/{ref}", {"decision": "maybe", "csrf_token": csrf_field(page.text)}
    )
    assert bogus.status_code == 422
    web.close()
    refused = tenant.ito(
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
    assert refused.code == "confirmation_rejected"


def test_another_accounts_confirmation_is_a_404_page_and_cannot_be_decided(
    tenant: Tenant, other_tenant: Tenant
) -> None:
    approver = make_approver(tenant.server, tenant.account_id)
    foreign = confirm(other_tenant, other_tenant.manifest())
    web = signed_in(tenant.server, approver)
    page = web.get(f"/ui/confirmations/{foreign}")
    missing = web.get("/ui/confirmations/cfr_doesnotexist")
    assert page.status_code == missing.status_code == 404
    assert "confirmation_not_found" in page.text
    assert page.text.replace(foreign, "X") == missing.text.replace("cfr_doesnotexist", "X")
    token = csrf_field(web.get("/ui/").text)
    refused = web.post(f"/ui/confirmations/{foreign}", {"decision": "approve", "csrf_token": token})
    assert refused.status_code == 404
    web.close()
    assert other_tenant.counts()["confirmations"] == {"pending": 1}


def test_sign_out_ends_the_session_for_good(tenant: Tenant) -> None:
    approver = make_approver(tenant.server, tenant.account_id)
    web = signed_in(tenant.server, approver)
    old = web.session_cookie()
    assert old
    home = web.get("/ui/")
    assert home.status_code == 200 and approver.email in home.text
    out = web.post("/ui/logout", {"csrf_token": csrf_field(home.text)})
    assert out.status_code == 303 and out.headers["location"] == "/ui/login"
    assert web.get("/ui/").status_code == 303
    web.close()
    with httpx.Client(base_url=tenant.server.url, cookies={"ito_session": old}) as replay:
        assert replay.get("/ui/").status_code == 303


def test_pages_escape_what_they_show_and_answer_html_errors(server: Server) -> None:
    account = server.desk("/v1/desk/accounts", {"name": "<b>acct</b>"})["account_id"]
    approver = make_approver(server, account)
    grant = device_code(server.url, '<script>alert("x")</script>')
    web = signed_in(server, approver)
    page = web.get("/ui/device", params={"user_code": grant["user_code"].lower()})
    assert page.status_code == 200
    assert "<script>" not in page.text and "&lt;script&gt;" in page.text
    assert "<b>acct</b>" not in page.text and "&lt;b&gt;acct&lt;/b&gt;" in page.text
    assert "<script" not in web.get("/ui/").text
    for path, status, code in [
        ("/ui/nowhere", 404, "not_found"),
        ("/ui/device?user_code=BCDF-GHJK", 404, "device_code_not_found"),
        ("/ui/device?user_code=not-a-code", 404, "device_code_not_found"),
    ]:
        refused = web.get(path)
        assert refused.status_code == status and code in refused.text
        assert refused.headers["content-type"].startswith("text/html")
    entry = web.get("/ui/device")
    assert entry.status_code == 200 and 'name="user_code"' in entry.text
    web.close()


def test_the_session_cookie_is_secure_when_the_public_url_is_https(tmp_path: Path) -> None:
    """An in-process app (the real ASGI app, no network) on its own SQLite file, because the
    session server's public URL is plain http."""
    db = Database(f"sqlite:///{tmp_path / 'https.db'}")
    migrate(db)
    settings = ServerSettings(
        database_url=db.url,
        home=tmp_path,
        pepper=SecretStr("https-test-pepper-0123456789"),
        public_url="https://ito.example",
    )
    with db.write() as session:
        account_id = create_account(session, "https").id
        create_user(
            session,
            account_id=account_id,
            role="approver",
            email="h@example.test",
            password_hash=hash_password("a-long-enough-password"),
        )
    with TestClient(
        create_app(settings, db), base_url="https://ito.example", follow_redirects=False
    ) as client:
        page = client.get("/ui/login")
        assert "secure" in page.headers["set-cookie"].lower()
        signed = client.post(
            "/ui/login",
            data={
                "email": "h@example.test",
                "password": "a-long-enough-password",
                "csrf_token": csrf_field(page.text),
            },
        )
        assert signed.status_code == 303
        cookie = signed.headers.get_list("set-cookie")
        session_cookie = next(c for c in cookie if c.startswith("ito_session="))
        assert re.search(r";\s*secure", session_cookie, re.IGNORECASE)
        grant = client.post("/v1/device/code").json()["data"]
        assert grant["verification_uri"] == "https://ito.example/ui/device"
    db.dispose()


def test_a_confirmation_stored_before_plans_were_kept_still_renders_without_a_layout() -> None:
    confirmation = {
        "confirmation_ref": "cfr_old",
        "state": "pending",
        "decided_at": None,
        "action": "train.create",
        "target": {"kind": "booking", "id": "bkg_1"},
        "manifest_id": "sha256:" + "0" * 64,
        "cost_usd": 1.0,
        "created_at": "then",
        "expires_at": "later",
    }
    estimate = {"cost_usd": 0.5, "ceiling_usd": 5.0}
    page = render(
        "confirmation.html",
        c=confirmation,
        notice=None,
        booking=None,
        run=None,
        checkpoint_step=None,
        summary=None,
        estimate=estimate,
        figures=_figures(estimate),
        requester={"id": "prn_1", "name": "agent"},
    )
    html = bytes(page.body).decode()
    # Stored before estimates had an upper bound: the expected figure alone.
    assert page.status_code == 200 and "$0.50 expected, of $5.00 ceiling" in html
    assert 'id="parallelism"' not in html and 'id="stages"' not in html


@pytest.mark.parametrize("named", [True, False])
def test_the_confirmation_page_says_which_tokenizer_the_run_trains_with(named: bool) -> None:
    document = build_recipe("test", "/data").manifest
    if named:
        document["model"]["tokenizer"] = {"uri": "/data/<tok>.json", "sha256": "ab" * 32}
    summary = manifest_summary(parse_manifest(json.dumps(document).encode()))
    page = render(
        "confirmation.html",
        c={
            "confirmation_ref": "cfr_1",
            "state": "pending",
            "decided_at": None,
            "action": "train.create",
            "target": {"kind": "booking", "id": "bkg_1"},
            "manifest_id": "sha256:" + "0" * 64,
            "cost_usd": 1.0,
            "created_at": "then",
            "expires_at": "later",
        },
        notice=None,
        booking=None,
        run=None,
        checkpoint_step=None,
        summary=summary,
        estimate={"cost_usd": 0.5, "ceiling_usd": 5.0},
        figures=_figures({"cost_usd": 0.5, "ceiling_usd": 5.0}),
        requester={"id": "prn_1", "name": "agent"},
    )
    html = bytes(page.body).decode()
    assert page.status_code == 200
    if named:
        assert "tokenizer <code>/data/&lt;tok&gt;.json</code>" in html
        assert f"<code>{'ab' * 32}</code>" in html
    else:
        assert "tokenizer trained on the run" in html
