"""Tenancy (another account's object answers exactly like a missing one) and secrets at rest
(no API key in the database or the server log), on SQLite and PostgreSQL."""

from __future__ import annotations

from urllib.parse import quote

import httpx
import pytest

from tests.support import Tenant, database_text

pytestmark = pytest.mark.slow


def _run(tenant: Tenant) -> str:
    manifest = tenant.manifest()
    ref = tenant.approved_confirmation(manifest)
    result = tenant.ito(
        "train",
        "--booking",
        tenant.booking_id,
        "--manifest",
        str(manifest),
        "--confirmation-ref",
        ref,
        "--idempotency-key",
        "owned",
    )
    return str(result.data["run_id"])


def test_another_accounts_objects_look_missing_on_every_read(
    tenant: Tenant, other_tenant: Tenant
) -> None:
    run_id = _run(other_tenant)
    booking = other_tenant.booking_id
    pending = other_tenant.ito("confirm", "--action", "cancel", "--run", run_id).data[
        "confirmation_ref"
    ]

    for args, code in [
        (["bookings", "show", booking], "booking_not_found"),
        (["bookings", "eligibility", booking], "booking_not_found"),
        (["status", "--run", run_id], "run_not_found"),
        (["runs", "show", run_id], "run_not_found"),
        (["status", "--idempotency-key", "owned"], "run_not_found"),
        (["confirm", "--action", "cancel", "--run", run_id], "run_not_found"),
    ]:
        result = tenant.ito(*args)
        assert result.rc == 1 and result.code == code, (args, result.stdout)

    # The same answers, byte for byte in shape, as for ids that never existed.
    missing = tenant.api("GET", "/v1/runs/run_doesnotexist")
    foreign = tenant.api("GET", f"/v1/runs/{run_id}")
    assert missing == foreign
    assert tenant.api("GET", f"/v1/runs/{run_id}/events")["error"]["code"] == "run_not_found"
    assert (
        tenant.api("GET", f"/v1/confirmations/{pending}")["error"]["code"]
        == "confirmation_not_found"
    )
    for key in ("requester", "approver"):
        decided = tenant.api("POST", f"/v1/confirmations/{pending}/approve", key=key)
        assert decided["error"]["code"] in ("confirmation_not_found", "forbidden_scope")
    assert tenant.ito("approve", pending, key="approver").code == "confirmation_not_found"
    assert tenant.ito("runs", "list").data["runs"] == []
    listed = [b["booking_id"] for b in tenant.ito("bookings", "list").data["bookings"]]
    assert listed == [tenant.booking_id]
    assert other_tenant.counts()["confirmations"] == {"consumed": 1, "pending": 1}


def test_no_api_key_is_stored_or_logged(tenant: Tenant) -> None:
    _run(tenant)
    # A client that puts a key in the path, percent-encoded: refused, and not logged either.
    for key in (tenant.requester_key, tenant.approver_key):
        encoded = quote(key, safe="").replace("_", "%5F")
        httpx.get(f"{tenant.server.url}/v1/runs/{encoded}", timeout=30)
        httpx.get(f"{tenant.server.url}/ui/runs/{encoded}", timeout=30)
    keys = [tenant.requester_key, tenant.approver_key, tenant.server.desk_key]
    stored = database_text(tenant.server)
    log = tenant.server.log_path.read_bytes()
    for key in keys:
        secret_part = key.split("_", 3)[3]
        assert key.encode() not in stored and secret_part.encode() not in stored
        assert key.encode() not in log and secret_part.encode() not in log
    # The public prefixes are there, so the search above looked in the right place.
    for key in keys:
        assert "_".join(key.split("_")[:3]).encode() in stored
    pepper = tenant.server.env["ITO_PEPPER"].encode()
    assert pepper not in stored and pepper not in log
