"""Request bodies are bounded before anything reads them, and HTTP-level refusals carry their
registered code and status — against the real server on SQLite and PostgreSQL."""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from ito.core.errors import REGISTRY
from ito.core.manifest import MANIFEST_MAX_BYTES
from ito.server.settings import ServerSettings
from tests.support import Server, Tenant

pytestmark = pytest.mark.slow

CAP = int(ServerSettings.model_fields["max_request_bytes"].default)
CHUNK = 64 * 1024


def declared_only(
    server: Server, path: str, length: int, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, Any]]:
    """Declare a ``length``-byte body and send none of it: only a refusal made on the header
    alone can answer (a server that waited for the body would hang until the timeout)."""
    parts = urlsplit(server.url)
    conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=30)
    try:
        conn.putrequest("POST", path)
        for name, value in (headers or {}).items():
            conn.putheader(name, value)
        conn.putheader("Content-Type", "application/json")
        conn.putheader("Content-Length", str(length))
        conn.endheaders()
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


def chunks(total: int) -> Iterator[bytes]:
    """A body of ``total`` bytes without a Content-Length (sent chunked)."""
    sent = 0
    while sent < total:
        piece = min(CHUNK, total - sent)
        sent += piece
        yield b" " * piece


def assert_too_large(status: int, envelope: dict[str, Any]) -> None:
    assert status == 413 == REGISTRY["request_too_large"].status, envelope
    assert envelope["ok"] is False
    assert envelope["error"]["code"] == "request_too_large"
    assert envelope["error"]["details"] == {"max_bytes": CAP}


def test_the_default_bound_holds_the_largest_legitimate_body() -> None:
    # A manifest at its bound travels base64 inside JSON: 4/3 of it, plus the other fields.
    assert CAP >= 2 * MANIFEST_MAX_BYTES


def test_an_oversized_declared_body_is_refused_before_it_is_read(tenant: Tenant) -> None:
    before = tenant.counts()
    auth = {"Authorization": f"Bearer {tenant.requester_key}"}
    for path, headers in [
        ("/v1/runs", auth),
        ("/v1/confirmations", auth),
        ("/v1/device/token", {}),
        ("/v1/device/code", {}),
    ]:
        assert_too_large(*declared_only(tenant.server, path, 10 * 1024**3, headers))
        assert_too_large(*declared_only(tenant.server, path, CAP + 1, headers))
    assert tenant.counts() == before


def test_an_oversized_chunked_body_is_refused_once_it_passes_the_bound(tenant: Tenant) -> None:
    before = tenant.counts()
    auth = {"authorization": f"Bearer {tenant.requester_key}"}
    for path, headers in [("/v1/runs", auth), ("/v1/manifests", auth), ("/v1/device/token", {})]:
        response = httpx.post(
            tenant.server.url + path,
            content=chunks(CAP + CHUNK),
            headers=headers | {"content-type": "application/json"},
            timeout=60,
        )
        assert "content-length" not in response.request.headers
        assert response.request.headers["transfer-encoding"] == "chunked"
        assert_too_large(response.status_code, response.json())
    assert tenant.counts() == before


def test_an_oversized_body_to_a_web_page_gets_the_error_page(server: Server) -> None:
    response = httpx.post(
        server.url + "/ui/login",
        content=chunks(CAP + 1),
        headers={"content-type": "application/x-www-form-urlencoded"},
        timeout=60,
    )
    assert response.status_code == 413
    assert response.headers["content-type"].startswith("text/html")
    assert "request_too_large" in response.text


def test_a_train_with_a_manifest_at_its_bound_still_works(tenant: Tenant) -> None:
    # The largest legitimate bodies: the confirmation request and the train request carry the
    # whole manifest base64 inside JSON. Pad a real manifest with whitespace to the bound.
    path = tenant.manifest("big")
    raw = path.read_bytes()
    path.write_bytes(raw + b" " * (MANIFEST_MAX_BYTES - len(raw)))
    assert path.stat().st_size == MANIFEST_MAX_BYTES
    ref = tenant.approved_confirmation(path)
    # The confirmation stored the manifest; forget it so that train sends the bytes too.
    tenant.server.sql("DELETE FROM manifests WHERE account_id = :a", a=tenant.account_id)
    created = tenant.ito(
        "train",
        "--booking",
        tenant.booking_id,
        "--manifest",
        str(path),
        "--confirmation-ref",
        ref,
        "--idempotency-key",
        "big-1",
    )
    assert created.rc == 0, created.stdout
    assert created.data["state"] == "queued"
    counts = tenant.counts()
    assert counts["runs"] == 1 and counts["manifests"] == 1
    assert counts["confirmations"] == {"consumed": 1}


def test_a_known_route_with_another_method_is_method_not_allowed(server: Server) -> None:
    for method, path in [
        ("DELETE", "/v1/runs"),
        ("PUT", "/v1/health"),
        ("GET", "/v1/device/token"),
    ]:
        response = httpx.request(method, server.url + path, timeout=30)
        assert response.status_code == 405 == REGISTRY["method_not_allowed"].status
        envelope = response.json()
        assert envelope["ok"] is False
        assert envelope["error"]["code"] == "method_not_allowed"
        assert "allow" in response.headers


def test_every_refusal_status_is_its_registered_status(server: Server) -> None:
    for method, path in [("GET", "/v1/no-such-thing"), ("DELETE", "/v1/runs"), ("GET", "/v1/me")]:
        response = httpx.request(method, server.url + path, timeout=30)
        code = response.json()["error"]["code"]
        assert response.status_code == REGISTRY[code].status, (path, code)
