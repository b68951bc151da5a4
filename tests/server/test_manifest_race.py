"""Storing the same new manifest twice at once is idempotent (DESIGN §5.3: re-uploading the same
bytes is a no-op), on SQLite and PostgreSQL: no request fails on the unique constraint."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.orm import Session

from ito.core.manifest import manifest_digest, manifest_summary, parse_manifest
from ito.server.store.tables import ManifestRow
from tests.support import Tenant, wait_until

pytestmark = pytest.mark.slow


def upload(t: Tenant, raw: bytes) -> httpx.Response:
    return httpx.post(
        t.server.url + "/v1/manifests",
        content=raw,
        timeout=60,
        headers={
            "authorization": f"Bearer {t.requester_key}",
            "content-type": "application/octet-stream",
        },
    )


def test_concurrent_uploads_of_one_new_manifest_all_succeed(tenant: Tenant) -> None:
    threads = 8
    for round_ in range(3):
        # A new digest each round: the same document, a different amount of trailing space.
        raw = tenant.manifest(f"m{round_}").read_bytes() + b" " * (round_ + 1)
        barrier = threading.Barrier(threads)

        def one(raw: bytes = raw, barrier: threading.Barrier = barrier) -> dict[str, Any]:
            barrier.wait()
            response = upload(tenant, raw)
            envelope: dict[str, Any] = response.json()
            assert response.status_code == 200, envelope
            return envelope

        with ThreadPoolExecutor(threads) as pool:
            envelopes = list(pool.map(lambda _: one(), range(threads)))
        assert all(e["ok"] for e in envelopes), envelopes
        assert {e["data"]["digest"] for e in envelopes} == {manifest_digest(raw)}
        assert sum(e["data"]["created"] for e in envelopes) == 1
        assert tenant.counts()["manifests"] == round_ + 1


def test_an_upload_that_loses_the_insert_race_returns_the_winners_row(tenant: Tenant) -> None:
    """Deterministic on PostgreSQL: the test's own transaction holds an uncommitted row for the
    same (account, digest); the server's upload misses it, inserts, and waits on the unique
    index; the test commits; the server's insert then meets the constraint."""
    server = tenant.server
    if server.backend != "postgres":
        pytest.skip("SQLite serialises writers: the loser never misses the winner's row")
    raw = tenant.manifest("m").read_bytes()
    with Session(server.engine) as session:
        session.add(
            ManifestRow(
                account_id=tenant.account_id,
                digest=manifest_digest(raw),
                content=raw,
                size_bytes=len(raw),
                summary=manifest_summary(parse_manifest(raw)),
            )
        )
        session.flush()
        with ThreadPoolExecutor(1) as pool:
            pending = pool.submit(upload, tenant, raw)

            def inserter_waits() -> bool:
                with server.engine.connect() as conn:
                    return bool(
                        conn.execute(
                            text(
                                "SELECT count(*) FROM pg_stat_activity WHERE datname = "
                                "current_database() AND wait_event_type = 'Lock' "
                                "AND query ILIKE 'INSERT INTO manifests%'"
                            )
                        ).scalar_one()
                    )

            wait_until(inserter_waits, timeout=8)
            session.commit()
            response = pending.result(timeout=60)
    envelope = response.json()
    assert response.status_code == 200 and envelope["ok"], envelope
    assert envelope["data"]["created"] is False
    assert envelope["data"]["digest"] == manifest_digest(raw)
    assert tenant.counts()["manifests"] == 1
