"""Exactly one run under concurrent creates, on SQLite and PostgreSQL (DESIGN §5.6): requests
are released together from a barrier against the real server on loopback."""

from __future__ import annotations

import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from tests.support import Tenant

pytestmark = pytest.mark.slow


def _fire(tenant: Tenant, bodies: list[dict[str, Any]]) -> list[dict[str, Any]]:
    barrier = threading.Barrier(len(bodies))

    def create(body: dict[str, Any]) -> dict[str, Any]:
        with httpx.Client(
            base_url=tenant.server.url,
            timeout=60,
            headers={"authorization": f"Bearer {tenant.requester_key}"},
        ) as client:
            barrier.wait(timeout=30)
            envelope: dict[str, Any] = client.post("/v1/runs", json=body).json()
            return envelope

    with ThreadPoolExecutor(max_workers=len(bodies)) as pool:
        return list(pool.map(create, bodies))


def _prepared(tenant: Tenant) -> tuple[str, str]:
    manifest = tenant.manifest()
    ref = tenant.approved_confirmation(manifest)
    digest = tenant.ito("manifest", "validate", str(manifest), key=None).data["manifest_id"]
    return ref, digest


def test_concurrent_identical_creates_give_exactly_one_run(tenant: Tenant) -> None:
    ref, digest = _prepared(tenant)
    body = {
        "booking_id": tenant.booking_id,
        "manifest_id": digest,
        "confirmation_ref": ref,
        "idempotency_key": "one-key",
    }
    answers = _fire(tenant, [body] * 24)

    run_ids = {a["data"]["run_id"] for a in answers if a["ok"]}
    codes = Counter(a["error"]["code"] for a in answers if not a["ok"])
    assert len(run_ids) == 1, answers
    assert set(codes) <= {"idempotency_in_progress"}, codes
    assert sum(1 for a in answers if a["ok"] and not a["data"]["replayed"]) == 1
    counts = tenant.counts()
    assert counts["runs"] == 1 and counts["idempotency"] == 1
    assert counts["confirmations"] == {"consumed": 1}


def test_concurrent_creates_with_distinct_keys_and_one_confirmation_give_one_run(
    tenant: Tenant,
) -> None:
    ref, digest = _prepared(tenant)
    bodies = [
        {
            "booking_id": tenant.booking_id,
            "manifest_id": digest,
            "confirmation_ref": ref,
            "idempotency_key": f"key-{i}",
        }
        for i in range(16)
    ]
    answers = _fire(tenant, bodies)

    winners = [a for a in answers if a["ok"]]
    codes = Counter(a["error"]["code"] for a in answers if not a["ok"])
    assert len(winners) == 1, answers
    assert set(codes) <= {"confirmation_consumed", "idempotency_in_progress"}, codes
    counts = tenant.counts()
    # Losers reserved nothing: their keys rolled back with their transactions.
    assert counts["runs"] == 1 and counts["idempotency"] == 1
    assert counts["confirmations"] == {"consumed": 1}
