"""The checking proxy itself (:mod:`tests.openapi_conformance`): it sees the real answers, and it
would fail a test whose answer does not match the server's OpenAPI document."""

from __future__ import annotations

import json

import httpx

from tests.openapi_conformance import PROXIES
from tests.support import Server, Tenant


def test_the_proxy_checks_real_answers_and_catches_one_that_does_not_match(
    server: Server,
    tenant: Tenant,
) -> None:
    proxy = PROXIES[server.url]
    before = proxy.checked
    health = httpx.get(server.url + "/v1/health", timeout=30)
    assert health.status_code == 200 and health.json()["ok"] is True
    missing = tenant.api("GET", "/v1/runs/run_doesnotexist")
    assert missing["error"]["code"] == "run_not_found"
    assert proxy.checked >= before + 2

    def check(path: str, status: int, body: object, method: str = "GET") -> str | None:
        return proxy.check(method, path, status, "application/json", json.dumps(body).encode())

    assert check("/v1/health", 200, health.json()) is None
    assert check("/v1/runs/run_x", 404, missing) is None
    # Each of these would fail the test that got it.
    assert check("/v1/health", 200, {"ok": True, "notice": "up", "data": {}}) is not None
    assert check("/v1/health", 200, {**health.json(), "surprise": 1}) is not None
    assert check("/v1/runs/run_x", 404, {**missing, "ok": True}) is not None
    assert (
        check("/v1/worker/lease", 200, {**health.json(), "data": {"run_id": "r"}}, method="POST")
        is not None
    )
    assert proxy.check("GET", "/v1/health", 200, "text/html", b"<p>up</p>") is not None
