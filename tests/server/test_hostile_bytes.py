"""Hostile bytes get ``invalid_arguments`` at the boundary, the same answer on SQLite and
PostgreSQL, never a 500 (real server): NUL and other C0/C1 controls, DEL, bidi overrides and
isolates, and lone surrogates — in path parameters, query values, the Authorization header,
JSON string fields and keys at any depth, and web form fields; escaped ones inside a manifest
get ``manifest_invalid``. Numbers sent as strings and out-of-range numbers are refused, not
coerced or capped; ``OPTIONS`` answers the real ``Allow``; ``invalid_arguments`` has one status.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote

import httpx
import pytest

from ito.core.errors import REGISTRY, ErrorCode
from tests.support import ITO_SERVER, Server, Tenant, run_cli

pytestmark = pytest.mark.slow

HOSTILE = ["\x00", "\x01", "\n", "\x1b", "\x7f", "\x85", "\u202e", "\u2066"]
"""Single-line text refuses every one of these (TAB/LF/CR are fine only inside JSON and form
text)."""
IN_TEXT = ["\x00", "\x08", "\x1b", "\x7f", "\x9b", "\u202d", "\u2069", "\ud800"]
"""Refused inside JSON strings (which may carry TAB, LF and CR)."""
INVALID = REGISTRY["invalid_arguments"].status


def _send(
    tenant: Tenant, method: str, path: str, key: str = "requester", body: Any = None, **kwargs: Any
) -> httpx.Response:
    token = {
        "requester": tenant.requester_key,
        "approver": tenant.approver_key,
        "desk": tenant.server.desk_key,
    }.get(key, key)
    headers = {"authorization": f"Bearer {token}"}
    if body is not None:
        # ensure_ascii: lone surrogates travel as the \ud800 escapes a hostile client would send
        kwargs["content"] = json.dumps(body).encode()
        headers["content-type"] = "application/json"
    return httpx.request(method, tenant.server.url + path, headers=headers, timeout=30, **kwargs)


def _refused(response: httpx.Response, code: ErrorCode = "invalid_arguments") -> None:
    assert response.status_code == REGISTRY[code].status, (
        response.request.url,
        response.text[:300],
    )
    if response.request.url.path.startswith("/ui"):  # the web pages' error page
        assert response.headers["content-type"].startswith("text/html")
        assert code in response.text
        return
    error = response.json()["error"]
    assert error["code"] == code and error["retryable"] is False


def _worker_key(tenant: Tenant) -> str:
    return str(
        tenant.server.desk(
            "/v1/desk/keys",
            {"account_id": tenant.account_id, "role": "worker", "booking_id": tenant.booking_id},
        )["api_key"]
    )


def test_hostile_characters_in_path_parameters_are_invalid_arguments(tenant: Tenant) -> None:
    worker = _worker_key(tenant)
    before = tenant.counts()
    for char in HOSTILE:
        bad = quote(f"run{char}x", safe="")  # as a client would send it
        for method, path, key, body in [
            ("GET", "/v1/bookings/{}", "requester", None),
            ("GET", "/v1/bookings/{}/eligibility", "requester", None),
            ("GET", "/v1/runs/{}", "requester", None),
            ("GET", "/v1/runs/{}/events", "requester", None),
            ("GET", "/v1/runs/{}/logs", "requester", None),
            ("GET", "/v1/runs/{}/metrics", "requester", None),
            ("GET", "/v1/runs/{}/checkpoints", "requester", None),
            ("GET", "/v1/manifests/{}", "requester", None),
            ("GET", "/v1/confirmations/{}", "requester", None),
            ("POST", "/v1/confirmations/{}/approve", "approver", None),
            (
                "POST",
                "/v1/runs/{}/cancel",
                "requester",
                {"confirmation_ref": "cfr_x", "idempotency_key": "k"},
            ),
            ("POST", "/v1/desk/keys/{}/revoke", "desk", None),
            ("POST", "/v1/desk/bookings/{}/state", "desk", {"state": "revoked"}),
            ("POST", "/v1/worker/runs/{}/heartbeat", worker, {"attempt": 1}),
            ("POST", "/v1/worker/runs/{}/finish", worker, {"attempt": 1, "status": "succeeded"}),
        ]:
            _refused(_send(tenant, method, path.format(bad), key, body))
    assert tenant.counts() == before


def test_hostile_characters_in_query_values_and_headers_are_invalid_arguments(
    tenant: Tenant,
) -> None:
    for char in HOSTILE:
        for path, params in [
            ("/v1/runs", {"idempotency_key": f"k{char}"}),
            ("/v1/runs", {"booking_id": f"bkg{char}"}),
            ("/v1/telemetry", {"booking_id": f"b{char}"}),
            ("/v1/runs", {f"x{char}": "1"}),
            ("/ui/login", {"next": f"/ui/{char}"}),
        ]:
            _refused(_send(tenant, "GET", path, params=params))
    # Our keys are ASCII: a C1 control in the Authorization header is bad input, not a guess.
    response = httpx.get(
        tenant.server.url + "/v1/me",
        timeout=30,
        headers={b"authorization": b"Bearer ito_req_\x85bad_" + b"x" * 40},
    )
    _refused(response)


def test_hostile_characters_in_json_strings_at_any_depth_are_invalid_arguments(
    tenant: Tenant,
) -> None:
    worker = _worker_key(tenant)
    before = tenant.counts()
    for char in IN_TEXT:
        text = f"a{char}b"
        for path, key, body in [
            ("/v1/confirmations", "requester", {"action": text, "booking_id": tenant.booking_id}),
            ("/v1/confirmations", "requester", {"action": "train", "booking_id": text}),
            ("/v1/confirmations", "requester", {"action": "train", text: 1}),
            (
                "/v1/runs",
                "requester",
                {
                    "booking_id": tenant.booking_id,
                    "manifest_id": "m",
                    "confirmation_ref": "cfr_x",
                    "idempotency_key": text,
                },
            ),
            ("/v1/desk/accounts", "desk", {"name": f"tenant {text}"}),
            (
                "/v1/desk/keys",
                "desk",
                {"account_id": tenant.account_id, "role": "requester", "name": text},
            ),
            ("/v1/device/code", "none", {"client_name": text}),
            (
                "/v1/worker/runs/run_x/report",
                worker,
                {"attempt": 1, "events": [{"type": "log", "message": {"deep": [text]}}]},
            ),
            (
                "/v1/worker/runs/run_x/finish",
                worker,
                {"attempt": 1, "status": "failed", "message": text},
            ),
        ]:
            _refused(_send(tenant, "POST", path, key, body))
    assert tenant.counts() == before
    # Multi-line text stays welcome where text is free.
    ok = _send(tenant, "POST", "/v1/device/code", "none", {"client_name": "a\tb"})
    assert ok.status_code == 200, ok.text


@pytest.mark.parametrize(
    "content_types",
    [
        [("content-type", "application/json"), ("content-type", "text/plain")],
        [("Content-Type", "text/plain"), ("content-type", "application/json")],
        [("content-type", "application/json"), ("CONTENT-TYPE", "application/json")],
        [("content-type", "application/json, text/plain")],
    ],
    ids=["json-then-text", "text-then-json", "twice-the-same", "a-list-in-one"],
)
def test_more_than_one_content_type_is_refused_before_the_body_is_read(
    tenant: Tenant, content_types: list[tuple[str, str]]
) -> None:
    """Two media types would let the guard read the body as one and a route parse it as the
    other: a NUL then reached PostgreSQL and answered 500. Refused, whatever the spelling, and
    nothing is created."""
    worker = _worker_key(tenant)
    before = tenant.counts()
    for path, key, body in [
        ("/v1/desk/accounts", tenant.server.desk_key, {"name": "tenant\u0000x"}),
        (
            "/v1/desk/keys",
            tenant.server.desk_key,
            {"account_id": tenant.account_id, "role": "requester", "name": "k\u0000"},
        ),
        ("/v1/device/code", "none", {"client_name": "a\u0000b"}),
        (
            "/v1/worker/runs/run_x/report",
            worker,
            {"attempt": 1, "events": [{"type": "log", "message": "a\u0000b"}]},
        ),
    ]:
        response = httpx.post(
            tenant.server.url + path,
            headers=[("authorization", f"Bearer {key}"), *content_types],
            content=json.dumps(body).encode(),
            timeout=30,
        )
        _refused(response)
    assert tenant.counts() == before


def test_hostile_characters_in_web_form_fields_get_the_error_page(tenant: Tenant) -> None:
    for char in IN_TEXT[:-1]:  # a form cannot even encode a lone surrogate
        response = httpx.post(
            tenant.server.url + "/ui/login",
            timeout=30,
            data={"email": f"a{char}@example.test", "password": "x", "csrf_token": "t", "next": ""},
        )
        assert response.status_code == INVALID
        assert response.headers["content-type"].startswith("text/html")
        assert "invalid_arguments" in response.text


def test_escaped_control_characters_in_a_manifest_are_manifest_invalid(tenant: Tenant) -> None:
    document = json.loads(tenant.manifest("clean").read_bytes())
    before = tenant.counts()
    for char in ["\x00", "\x1b", "\u202e", "\ud800"]:
        for edit in (
            {"name": f"demo{char}"},
            {"data": [dict(document["data"][0], license=f"mit{char}"), *document["data"][1:]]},
        ):
            raw = json.dumps(document | edit).encode()  # the escape, not the raw byte
            response = httpx.post(
                tenant.server.url + "/v1/manifests",
                content=raw,
                timeout=30,
                headers={
                    "authorization": f"Bearer {tenant.requester_key}",
                    "content-type": "application/octet-stream",
                },
            )
            _refused(response, "manifest_invalid")
            plan = httpx.post(
                tenant.server.url + "/v1/plans",
                content=raw,
                timeout=30,
                params={"booking_id": tenant.booking_id},
                headers={"authorization": f"Bearer {tenant.requester_key}"},
            )
            _refused(plan, "manifest_invalid")
    assert tenant.counts() == before


def test_numbers_as_strings_and_out_of_range_numbers_are_refused(tenant: Tenant) -> None:
    before = tenant.counts()
    booking: dict[str, Any] = {
        "account_id": tenant.account_id,
        "gpu": "cpu",
        "nodes": 1,
        "gpus_per_node": 2,
        "region": "local",
        "fabric": "ethernet",
        "start": "2026-01-01T00:00:00Z",
        "end": "2099-01-01T00:00:00Z",
        "rate_usd_per_gpu_hour": 0.5,
        "state": "completed",
    }
    for edit in (
        {"nodes": "2"},
        {"gpus_per_node": "2"},
        {"rate_usd_per_gpu_hour": "0.5"},
        {"gpu_memory_gb": 2**40},
        {"nodes": 2**70},
        {"nodes": True},
    ):
        _refused(_send(tenant, "POST", "/v1/desk/bookings", "desk", booking | edit))
    nan = json.dumps(booking)[:-1] + ', "storage_quota_gb": NaN}'
    _refused(
        httpx.post(
            tenant.server.url + "/v1/desk/bookings",
            content=nan,
            timeout=30,
            headers={
                "authorization": f"Bearer {tenant.server.desk_key}",
                "content-type": "application/json",
            },
        )
    )
    confirm = {"action": "cancel", "run_id": "run_x"}
    for edit in (
        {"ttl_seconds": "60"},
        {"ttl_seconds": 10**6},
        {"ttl_seconds": 0},
        {"checkpoint_step": 10**30},
    ):
        _refused(_send(tenant, "POST", "/v1/confirmations", "requester", confirm | edit))
    for path, params in [
        ("/v1/runs/run_x/events", {"after": str(2**70)}),
        ("/v1/runs/run_x/logs", {"since": str(2**64)}),
        ("/v1/runs", {"limit": "100000"}),
    ]:
        _refused(_send(tenant, "GET", path, params=params))
    assert tenant.counts() == before


def test_options_and_method_not_allowed_answer_the_paths_real_allow(tenant: Tenant) -> None:
    url = tenant.server.url
    for path, methods in [
        ("/v1/runs", {"GET", "POST", "OPTIONS"}),
        ("/v1/health", {"GET", "OPTIONS"}),
        ("/v1/runs/run_x/cancel", {"POST", "OPTIONS"}),
    ]:
        options = httpx.options(url + path, timeout=30)
        assert options.status_code == 200
        assert set(options.headers["allow"].split(", ")) == methods
        assert set(options.json()["data"]["allow"]) == methods
        other = httpx.request("DELETE", url + path, timeout=30)
        assert other.status_code == REGISTRY["method_not_allowed"].status
        assert set(other.headers["allow"].split(", ")) == methods
    missing = httpx.options(url + "/v1/no-such-thing", timeout=30)
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"


def test_invalid_arguments_has_one_status_wherever_it_is_raised(tenant: Tenant) -> None:
    url = tenant.server.url
    answers = [
        # A form the multipart parser cannot read (no boundary): an HTTP-level refusal.
        httpx.post(
            url + "/ui/login",
            content=b"--x\r\n",
            timeout=30,
            headers={"content-type": "multipart/form-data"},
        ),
        # A request model that refuses its body; a body that is not JSON.
        _send(tenant, "POST", "/v1/confirmations", body={"action": 1}),
        httpx.post(
            url + "/v1/confirmations",
            content=b"{nope",
            timeout=30,
            headers={
                "authorization": f"Bearer {tenant.requester_key}",
                "content-type": "application/json",
            },
        ),
        # A service's own check; the text guard.
        _send(tenant, "GET", "/v1/telemetry"),
        _send(tenant, "GET", "/v1/runs/a%00b"),
    ]
    for response in answers:
        assert response.status_code == INVALID, (response.request.url, response.text[:200])
        assert "invalid_arguments" in response.text


def test_an_account_name_from_the_operator_cli_is_held_to_the_same_rules(server: Server) -> None:
    # Account names are shown to approvers; the desk CLI writes them without the API.
    for name in ("evil\u202egnp.exe", "tab\x1b[31mred"):
        result = run_cli([ITO_SERVER, "account", "create", "--name", name, "--json"], server.env)
        assert result.rc == 1 and result.code == "invalid_arguments"
